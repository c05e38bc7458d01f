"""What the vendor collectors nvml and amdsmi (gpuwatch/collectors/nvml.py, amdsmi.py) share: one poll of every backend
slot, each timed and isolated, opened lazily and reopened with exponential backoff after it fails. Runs on the
scheduler's poll job, never on the scrape path."""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.backends.base import Backend, BackendUnavailable
from gpuwatch.collectors.base import POLL, CheckLine, CollectorContext, Every, collector_logger
from gpuwatch.collectors.sources import BackendSlot, NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.latch import Latch
from gpuwatch.core.model import GpuReading, StuckCall
from gpuwatch.state.store import STALE_AFTER_POLLS, SampleStore

MAX_BACKOFF_SECONDS = 60.0
# A read lasts milliseconds; one still running after this many poll intervals (and at least this many seconds) is a
# call hung in the driver (stuck_calls). One interval less than readings take to go stale (STALE_AFTER_POLLS): the
# hung poll began an interval after the last readings, so the hang is known as soon as they are stale.
STUCK_AFTER_POLLS = STALE_AFTER_POLLS - 1
STUCK_MIN_SECONDS = 1.0


class VendorCollectors:
    """The backend slots of a node, polled together; `config` is asked each poll (a reload changes it)."""

    def __init__(
        self,
        slots: list[BackendSlot],
        store: SampleStore,
        config: Callable[[], Config],
        monotonic: Callable[[], float],
        stopping: threading.Event,
    ) -> None:
        self.slots = slots
        self._store = store
        self._config = config
        self._monotonic = monotonic
        self._stopping = stopping
        # A backend down is said once, and once when it is back, by its own collector's logger.
        self._down = {slot.name: Latch(collector_logger(slot.name)) for slot in slots}

    def poll_interval_seconds(self) -> float:
        return self._config().agent.poll_interval_seconds

    def active(self) -> list[BackendSlot]:
        disabled = self._config().agent.disable_collectors
        return [slot for slot in self.slots if slot.name not in disabled]

    def poll(self, slot: BackendSlot) -> bool:
        """One poll of one backend (the registry times it); a failure is reported, never raised."""
        try:
            return self._poll_slot(slot)
        except Exception:
            collector_logger(slot.name).exception("%s poll failed unexpectedly", slot.name)
            return False

    def stuck_calls(self, wall_now: float) -> tuple[StuckCall, ...]:
        """The vendor calls the poll has been in for STUCK_AFTER_POLLS poll intervals or more (at least
        STUCK_MIN_SECONDS): asked from the HTTP threads, so a hung poll is seen while it hangs."""
        min_seconds = max(STUCK_MIN_SECONDS, STUCK_AFTER_POLLS * self.poll_interval_seconds())
        out = []
        for slot in self.slots:
            backend = slot.backend
            stuck = getattr(backend, "stuck_read", None)
            found = stuck(min_seconds) if stuck is not None else None
            if found is None:
                continue
            identity, call, seconds = found
            gpu, uuid = ("", "") if identity is None else (str(identity.index), identity.uuid)
            out.append(StuckCall(slot.name, call or "unknown", gpu, uuid, round(wall_now - seconds, 3)))
        return tuple(out)

    def close(self) -> None:
        for slot in self.slots:
            with slot.lock:
                if slot.backend is not None:
                    slot.backend.close()
                    slot.backend = None

    def _poll_slot(self, slot: BackendSlot) -> bool:
        now = self._monotonic()
        backend = slot.backend
        if backend is None:
            if now < slot.next_attempt:
                return False
            backend = self._open(slot, now)
            if backend is None:
                return False
        slow = now - slot.last_slow_poll >= self._config().agent.slow_poll_interval_seconds
        try:
            readings = backend.poll(slow=slow)
        except Exception as exc:  # BackendUnavailable, or a bug: reopen with backoff rather than fail every poll
            if not isinstance(exc, BackendUnavailable):
                collector_logger(slot.name).exception("%s poll failed unexpectedly; reopening the library", slot.name)
            self._failed(slot, now, str(exc))
            with slot.lock:
                backend.close()
                slot.backend = None
            return False
        if slow:
            slot.last_slow_poll = now
        self._store.record_poll(readings)
        self._store.set_unusable(slot.name, backend.unusable())
        for uuid in backend.reset_uuids():  # AMD: reset counters exist from start-up at 0
            self._store.ensure_resets_counter(uuid)
        return True

    def _open(self, slot: BackendSlot, now: float) -> Backend | None:
        try:
            backend = slot.factory()
            backend.open()
        except Exception as exc:  # a bug in a backend is a library that cannot be used: backoff, never a loop
            expected = isinstance(exc, BackendUnavailable)
            self._failed(slot, now, str(exc) if expected else repr(exc), traceback=not expected)
            return None
        with slot.lock:
            slot.backend = backend
        slot.backoff = 1.0
        slot.last_slow_poll = -math.inf
        self._store.set_backend(slot.name, True)
        self._down[slot.name].recover("%s is available again", slot.name)
        return backend

    def _failed(self, slot: BackendSlot, now: float, message: str, traceback: bool = False) -> None:
        """Say it once, then retry with exponential backoff: drivers load late, and a restart loop helps no one."""
        self._store.set_backend(slot.name, False, message)
        self._store.set_unusable(slot.name, ())
        if not self._stopping.is_set():  # closing the library under a hung call is ours
            self._down[slot.name].fail(
                "%s unavailable: %s (retrying with backoff up to %.0f s)",
                slot.name,
                message,
                MAX_BACKOFF_SECONDS,
                level=logging.ERROR,
                exc_info=traceback,
            )
        slot.next_attempt = now + slot.backoff
        slot.backoff = min(slot.backoff * 2, MAX_BACKOFF_SECONDS)


@dataclass(slots=True)
class VendorCollector:
    """The `nvml` or `amdsmi` collector: one backend slot, polled on the agent's `poll` job."""

    slot: BackendSlot
    vendors: VendorCollectors
    schedule: Every = POLL

    @property
    def name(self) -> str:
        return self.slot.name

    def update(self) -> bool:
        return self.vendors.poll(self.slot)


def collectors(context: CollectorContext, name: str) -> list[VendorCollector]:
    vendors = VendorCollectors(context.slots, context.store, context.config, context.monotonic, context.stopping)
    return [VendorCollector(slot, vendors) for slot in context.slots if slot.name == name]


# `gpuwatch check`: the library opens and reads, or what to do so that it does.
_VENDOR = {"nvml": ("NVIDIA", "nvidia-smi"), "amdsmi": ("AMD", "amd-smi")}


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """The backend's line (and, for NVML on a real node, its device files'), or why this node does not use it."""
    label, smi = _VENDOR[name]
    slots = [slot for slot in sources.slots if slot.name == name]
    if not slots:
        backend = config.agent.backend
        why = f"agent.backend = {backend}" if backend != "auto" else f"no {label} GPU on the PCI bus, none expected"
        return [CheckLine("ok", f"backend {name}", f"not used ({why})")]
    fix = (
        f"make {smi} work for this user: install or reload the {label} driver; the agent retries the library every "
        f"{MAX_BACKOFF_SECONDS:g} s and never exits for it"
    )
    lines = [line for slot in slots for line in _check_backend(slot, fix)]
    if name == "nvml" and config.agent.backend != "simulated":
        lines.extend(_check_device(device) for device in sorted(Path("/dev").glob("nvidia*")))
    return lines


def _check_backend(slot: BackendSlot, fix: str) -> list[CheckLine]:
    """The backend's line, and the real-utilization lines under it."""
    what = f"backend {slot.name}"
    try:
        backend = slot.factory()
        backend.open()
    except BackendUnavailable as exc:
        return [CheckLine("FAIL", what, str(exc), fix)]
    try:
        readings = backend.poll(slow=True)  # the slow tier holds the MIG devices
        gpus = len(readings)
        versions = ", ".join(f"{k} {v}" for k, v in backend.versions().items())
        mismatch = backend.version_problem()  # AMD: package vs host ROCm
        activity = _activity_lines(backend, gpus, f"real utilization ({slot.name})")
        activity += _mig_lines(readings, f"MIG ({slot.name})")
    except Exception as exc:  # the driver failed between open and poll: a FAIL line, never a traceback
        return [CheckLine("FAIL", what, f"opened, then failed: {exc}", fix)]
    finally:
        backend.close()
    if mismatch:
        return [CheckLine("FAIL", what, f"{gpus} GPU(s); {versions}; {mismatch}", fix), *activity]
    return [CheckLine("ok", what, f"{gpus} GPU(s); {versions}"), *activity]


_NO_ACTIVITY_FIX = (
    "nothing to fix on such a GPU: it exports gpuwatch_gpu_utilization_ratio only (docs/reading-the-metrics.md, "
    "Real utilization); an old nvidia-ml-py: pip install -U nvidia-ml-py"
)


def _activity_lines(backend: Backend, gpus: int, what: str) -> list[CheckLine]:
    """ok with how many GPUs have SM/tensor/DRAM activity, a warn line for the GPUs without it and why."""
    if not gpus:
        return []
    able, missing = backend.activity_support()
    lines = [CheckLine("ok", what, f"SM, tensor and DRAM activity on {able} of {gpus} GPU(s)")] if able else []
    by_reason: dict[str, list[str]] = {}
    for index, reason in missing:
        by_reason.setdefault(reason, []).append(str(index))
    return lines + [
        CheckLine("warn", what, f"GPU {', '.join(indices)}: {reason}", _NO_ACTIVITY_FIX)
        for reason, indices in by_reason.items()
    ]


_NO_INSTANCE_FIX = (
    "create its GPU and compute instances (nvidia-smi mig -i N -cgi PROFILES -C, or the node's MIG manager, such as "
    "nvidia-mig-parted), or disable MIG on it (nvidia-smi -i N -mig 0)"
)


def _mig_lines(readings: list[GpuReading], what: str) -> list[CheckLine]:
    """Each MIG-enabled NVIDIA GPU's MIG devices as the agent finds them (docs/mig.md), and a warning for one with
    none: with MIG enabled, CUDA runs only in an instance, so such a GPU takes no job at all. An AMD GPU's mig_enabled
    is a compute partition, which has no instances: no line."""
    lines = []
    for reading in readings:
        sample = reading.sample
        if sample is None or not sample.mig_enabled or reading.identity.vendor != "nvidia":
            continue
        index, devices = reading.identity.index, sample.mig_devices
        if devices:
            found = ", ".join(f"{d.profile or '?'} (GPU instance {d.gpu_instance_id})" for d in devices)
            lines.append(CheckLine("ok", what, f"GPU {index}: {len(devices)} MIG device(s): {found}"))
        else:
            lines.append(
                CheckLine(
                    "warn", what, f"GPU {index}: MIG enabled, no instance: no job can run on it", _NO_INSTANCE_FIX
                )
            )
    return lines


def _check_device(device: Path) -> CheckLine:
    readable = os.access(device, os.R_OK | os.W_OK)
    return CheckLine(
        "ok" if readable else "FAIL",
        f"device {device}",
        "read/write" if readable else "no read/write access for this user",
        ""
        if readable
        else f"run the agent as a user with read/write access to {device} (ls -l {device}), as the unit does",
    )
