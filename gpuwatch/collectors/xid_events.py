"""The xid_events collector: a thread per vendor backend waits for its events (NVML XIDs, AMD resets) and reads
the kernel log's NVIDIA XIDs, mapped to GPUs by PCI address."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from gpuwatch.collectors.base import CheckLine, CollectorContext, Threads
from gpuwatch.collectors.sources import BackendSlot, NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.model import GpuEvent
from gpuwatch.readers.kmsg import KernelLogXidReader, KernelXid, normalize_pci_bus_id
from gpuwatch.state.store import SampleStore

log = logging.getLogger(__name__)

EVENT_WAIT_SECONDS = 1.0
# How often a quiet event thread records its run (gpuwatch_collector_last_run_timestamp_seconds), not how often it
# wakes: recording every wake would change the exposition every second, between polls (gpuwatch.collectors.base._loop).
HEARTBEAT_SECONDS = 15.0
MAX_UNMATCHED_XIDS = 1024  # kernel-log XIDs kept while no GPU with their PCI address is known


class EventCollector:
    """The `xid_events` collector: a thread per vendor backend, each run waiting up to EVENT_WAIT_SECONDS; its
    runs are recorded every HEARTBEAT_SECONDS, or at once when one fails."""

    name = "xid_events"
    interval_seconds = HEARTBEAT_SECONDS

    def __init__(
        self,
        store: SampleStore,
        kernel_log: KernelLogXidReader | None,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        stopping: threading.Event,
    ) -> None:
        self._store = store
        self._kernel_log = kernel_log
        self._clock = clock
        self._monotonic = monotonic
        self._stopping = stopping
        self._unmatched_xids: list[KernelXid] = []
        self.schedule = Threads({})

    def watch(self, slots: list[BackendSlot]) -> EventCollector:
        self.schedule = Threads({f"events-{slot.name}": self._runner(slot) for slot in slots})
        return self

    def _runner(self, slot: BackendSlot) -> Callable[[], bool]:
        return lambda: self._run(slot)

    def _run(self, slot: BackendSlot) -> bool:
        try:
            self.read_once(slot, EVENT_WAIT_SECONDS)
        except Exception:
            log.exception("event reader for %s failed", slot.name)
            self._stopping.wait(EVENT_WAIT_SECONDS)
            return False
        return True

    def update(self) -> bool:
        """Runs are its threads' (schedule); an update of its own reads nothing."""
        return True

    def read_once(self, slot: BackendSlot, timeout_s: float) -> None:
        """Wait up to timeout_s for the backend's events, then read the kernel log (NVIDIA XIDs)."""
        backend = slot.backend
        if backend is None:
            self._stopping.wait(timeout_s)
            events: list[GpuEvent] = []
        else:
            events = backend.wait_events(timeout_s)
        reader = self._kernel_log if slot.vendor == "nvidia" else None
        if reader is not None:
            events.extend(self._kernel_xids(reader))
        self._store.add_events(events)

    def _kernel_xids(self, reader: KernelLogXidReader) -> list[GpuEvent]:
        """Kernel-log XIDs mapped to GPUs; those of a GPU not known yet (NVML still opening, or down) wait for it."""
        events = []
        waiting: list[KernelXid] = []
        for xid in [*self._unmatched_xids, *reader.read_new(now=self._clock())]:
            identity = self._store.identity_by_pci(normalize_pci_bus_id(xid.pci_bus_id), normalize_pci_bus_id)
            if identity is None:
                waiting.append(xid)
            else:
                events.append(GpuEvent(identity.uuid, "xid", xid.timestamp, code=xid.xid, source="kmsg"))
        self._unmatched_xids = waiting[-MAX_UNMATCHED_XIDS:]
        self._store.add_sxids(reader.drain_sxids())
        return events


def collectors(context: CollectorContext, name: str) -> list[EventCollector]:
    collector = EventCollector(
        context.store, context.sources.kernel_log, context.clock, context.monotonic, context.stopping
    )
    return [collector.watch(context.slots)]


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """Where XIDs come from here: the vendor libraries' events always, the kernel log where it can be read."""
    path = config.xid.kernel_log
    if config.agent.backend == "simulated" or not path:
        why = "a simulated node" if path else "xid.kernel_log is empty"
        return [CheckLine("ok", "XID events", f"from the vendor library's events; the kernel log is not read ({why})")]
    with KernelLogXidReader(Path(path)) as reader:
        if reader.available:
            return [CheckLine("ok", "XID events", f"from the vendor library's events and the kernel log {path}")]
        return [
            CheckLine(
                "warn",
                f"XID events from {path}",
                reader.reason or "unreadable",
                "give the agent CAP_SYSLOG (the unit's AmbientCapabilities=CAP_SYSLOG) or run it as root, or set "
                'xid.kernel_log = "" to use the vendor library\'s events alone',
            )
        ]
