"""The scaffolding every vendor backend shares: the per-GPU record, the tiers, the poll, the event wait.

A backend reads each GPU in three tiers: static (identity, declared limits; re-read after a driver change or a GPU
that stopped answering), slow (health counters, every ``slow_poll_interval_seconds``) and fast (every poll). The
static and slow readings are kept and merged into every fast sample. A vendor module (nvml.py, amdsmi.py) holds
only its library's calls and error tables: the hooks below (`_invoke`, `_check_driver`, `_read_static`,
`_begin`, `_read_slow`, `_read_fast`, `_events_ready`, `_wait_locked`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.core.model import GpuEvent, GpuIdentity, GpuReading, GpuSample, copy_sample


class Unavailable(Exception):
    """The library cannot give this value now (not supported, busy, no permission, no such function)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class GpuFailed(Exception):
    """One GPU stopped answering: its reading has no sample, the other GPUs are read on."""


@dataclass
class TieredGpu:
    """What a backend keeps about one GPU (one processor handle) between polls."""

    handle: Any
    identity: GpuIdentity
    # Calls that answered NotSupported and the like; forgotten at the next static read.
    unsupported: set[Hashable] = field(default_factory=set)
    unsupported_calls: set[Hashable] = field(default_factory=set)  # the functions with a key in `unsupported`
    static: GpuSample = field(default_factory=lambda: GpuSample("", 0.0))  # thresholds and max clocks
    kept: GpuSample = field(default_factory=lambda: GpuSample("", 0.0))  # static + slow, merged into every sample
    needs_static: bool = True
    needs_slow: bool = True


G = TypeVar("G", bound=TieredGpu)


class TieredBackend(Generic[G]):
    """The Backend protocol's poll, event wait and GPU list over a vendor's choke point (`_invoke`)."""

    label: ClassVar[str]  # the library as operators know it: "NVML", "AMD SMI"
    gpu_label: ClassVar[str]  # how log lines name a GPU by index: "NVML GPU 3", "AMD GPU 3"
    log: ClassVar[logging.Logger]  # the vendor module's logger

    def __init__(self, lib: Any, clock: Callable[[], float]) -> None:
        self._lib = lib
        self._clock = clock
        self._open = False
        self._driver = ""
        self._gpus: list[G] = []
        # The event thread and the poll thread share only the event state; the lock is held across the event wait
        # so close() never frees it under a waiting thread.
        self._events_lock = threading.Lock()
        self._uuid_by_handle: dict[Hashable, str] = {}
        # What the poll thread is doing, for a watcher in another thread (stuck_read): the GPU being read (None: the
        # driver check) and when that began on the monotonic clock, and the library call the choke point is in.
        # Plain attribute stores, atomic in CPython: the poll's hot path pays one per call, and takes no lock.
        self.reading: tuple[GpuIdentity | None, float] | None = None
        self.calling = ""

    # ----- the choke point -----

    def _invoke(self, gpu: G | None, names: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Every library call of the backend passes here; raises Unavailable, GpuFailed or BackendUnavailable."""
        raise NotImplementedError

    def _call(self, gpu: G | None, names: Any, *args: Any, **kwargs: Any) -> Any:
        """A value, or None where the library cannot give it."""
        try:
            return self._invoke(gpu, names, args, kwargs)
        except Unavailable as exc:
            self.log.debug("not available: %s", exc)
            return None

    # ----- Backend protocol -----

    def case_identity(self, uuid: str) -> dict[str, str | None]:
        """What a vendor's RMA desk asks for beyond the agent's identity (board part number, firmware versions),
        read now: only `gpuwatch report` asks, the agent keeps none of it. None for what the library cannot give;
        {} for a GPU it does not know; a GPU that stops answering gives every key None and `unavailable` why."""
        gpu = next((g for g in self._gpus if g.identity.uuid == uuid), None)
        if gpu is None:
            return {}
        try:
            return self._read_case_identity(gpu)
        except GpuFailed as exc:
            return {**dict.fromkeys(self._read_case_identity_keys()), "unavailable": str(exc)}

    def gpus(self) -> list[GpuIdentity]:
        """The GPUs found at open, in index order."""
        return [gpu.identity for gpu in self._gpus]

    def poll(self, *, slow: bool) -> list[GpuReading]:
        """Read every GPU: fast tier always, slow tier when asked (and on the first poll of each GPU)."""
        if not self._open:
            raise BackendUnavailable(f"the {self.label} backend is not open")
        try:
            if slow:
                self.reading, self.calling = (None, time.monotonic()), "driver_check"
                self._check_driver()
            return [self._poll_gpu(gpu, slow) for gpu in self._gpus]
        finally:
            self.reading = None

    def stuck_read(self, min_seconds: float) -> tuple[GpuIdentity | None, str, float] | None:
        """The poll's read in progress when it has gone on for `min_seconds` or more: (the GPU, or None for a
        library-wide call; the call it is in; seconds since the GPU's read began). A read is a few milliseconds;
        one that lasts seconds is a call hung in the driver."""
        reading, call = self.reading, self.calling  # read once: the poll thread moves on meanwhile
        if reading is None or (elapsed := time.monotonic() - reading[1]) < min_seconds:
            return None
        return reading[0], call, elapsed

    def wait_events(self, timeout_s: float) -> list[GpuEvent]:
        """Block up to timeout_s for events; [] on timeout, on a lost GPU and without event support."""
        deadline = time.monotonic() + timeout_s
        with self._events_lock:
            events = self._wait_locked(timeout_s) if self._events_ready() else None
        if events is None:
            # Nothing to wait on, or the wait failed early: keep the caller's loop from spinning. After a whole
            # wait there is nothing left, and a sleep(0) would still give up the GIL: a thread wake for nothing.
            left = deadline - time.monotonic()
            if left > 0:
                time.sleep(left)
            return []
        return events

    # ----- the tiers -----

    def _first_read(self, gpu: G, index: int, *, keep_failed: bool) -> G | None:
        """A GPU found at open with its static tier read, or None to skip it (the state dir knows it as lost):
        one without a UUID, or one that failed its first read (unless `keep_failed` and its UUID is known)."""
        try:
            self._read_static(gpu)
        except GpuFailed as exc:
            if not (keep_failed and gpu.identity.uuid):
                self.log.warning("%s %d: %s; skipped", self.gpu_label, index, exc)
                return None
        if not gpu.identity.uuid:
            self.log.warning("%s %d: no UUID; skipped", self.gpu_label, index)
            return None
        return gpu

    def _poll_gpu(self, gpu: G, slow: bool) -> GpuReading:
        self.reading = (gpu.identity, time.monotonic())
        try:
            sample = self._read(gpu, slow)  # may re-read the identity
            return GpuReading(gpu.identity, sample)
        except GpuFailed as exc:
            gpu.needs_static = True  # when it answers again, read it afresh
            self._forget(gpu)
            return GpuReading(gpu.identity, None, error=str(exc))

    def _read(self, gpu: G, slow: bool) -> GpuSample:
        if gpu.needs_static:
            self._read_static(gpu)
        slow = slow or gpu.needs_slow
        tick = self._begin(gpu, slow)
        if slow:
            kept = copy_sample(gpu.static)
            self._read_slow(gpu, kept, tick)
            gpu.kept, gpu.needs_slow = kept, False
        sample = copy_sample(gpu.kept)
        sample.timestamp = self._stamp(tick)
        self._read_fast(gpu, sample, tick)
        return sample

    # ----- vendor hooks -----

    def _check_driver(self) -> None:
        """A new driver means new capabilities: mark every GPU's static tier to be re-read."""
        raise NotImplementedError

    def _read_static(self, gpu: G) -> None:
        raise NotImplementedError

    def _begin(self, gpu: G, slow: bool) -> Any:
        """What one poll of a GPU reads first and hands to both tiers (NVML: the batched fields; AMD: the time)."""
        raise NotImplementedError

    def _stamp(self, tick: Any) -> float:
        """The sample's timestamp."""
        return self._clock()

    def _read_slow(self, gpu: G, sample: GpuSample, tick: Any) -> None:
        raise NotImplementedError

    def _read_fast(self, gpu: G, sample: GpuSample, tick: Any) -> None:
        raise NotImplementedError

    def _read_case_identity(self, gpu: G) -> dict[str, str | None]:
        raise NotImplementedError

    def _read_case_identity_keys(self) -> tuple[str, ...]:
        """The keys `_read_case_identity` answers."""
        raise NotImplementedError

    def _forget(self, gpu: G) -> None:
        """What a GPU that stopped answering loses besides its static tier."""

    def _events_ready(self) -> bool:
        raise NotImplementedError

    def _wait_locked(self, timeout_s: float) -> list[GpuEvent] | None:
        """One wait for events under the events lock; None when it timed out or failed."""
        raise NotImplementedError
