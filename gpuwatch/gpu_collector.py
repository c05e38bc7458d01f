"""The vendor collectors (nvml, amdsmi): one poll of every backend slot, each timed and isolated, opened lazily and
reopened with exponential backoff after it fails. Runs on the scheduler's poll job, never on the scrape path."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatch.backends.base import Backend, BackendUnavailable
from gpuwatch.collector import CollectorContext, Every
from gpuwatch.config import Config
from gpuwatch.latch import Latch
from gpuwatch.sources import BackendSlot
from gpuwatch.store import SampleStore

log = logging.getLogger("gpuwatch.agent")  # the lines operators know, under the agent's logger

MAX_BACKOFF_SECONDS = 60.0
POLL_JOB = Every("poll")  # the agent's poll job: the vendors in turn, then the known-GPU file and the watchdog


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
        self._down = Latch(log)  # by slot name: a backend down is said once, and once when it is back

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
            log.exception("%s poll failed unexpectedly", slot.name)
            return False

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
                log.exception("%s poll failed unexpectedly; reopening the library", slot.name)
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
        self._down.recover("%s is available again", slot.name, key=slot.name)
        return backend

    def _failed(self, slot: BackendSlot, now: float, message: str, traceback: bool = False) -> None:
        """Say it once, then retry with exponential backoff: drivers load late, and a restart loop helps no one."""
        self._store.set_backend(slot.name, False, message)
        self._store.set_unusable(slot.name, ())
        if not self._stopping.is_set():  # closing the library under a hung call is ours
            self._down.fail(
                "%s unavailable: %s (retrying with backoff up to %.0f s)",
                slot.name,
                message,
                MAX_BACKOFF_SECONDS,
                key=slot.name,
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
    schedule: Every = POLL_JOB

    @property
    def name(self) -> str:
        return self.slot.name

    @property
    def interval_seconds(self) -> float:
        return self.vendors.poll_interval_seconds()

    def update(self) -> bool:
        return self.vendors.poll(self.slot)


def collectors(context: CollectorContext, name: str) -> list[VendorCollector]:
    vendors = VendorCollectors(context.slots, context.store, context.config, context.monotonic, context.stopping)
    return [VendorCollector(slot, vendors) for slot in context.slots if slot.name == name]
