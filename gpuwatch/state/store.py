"""SampleStore: the latest readings, the counters the agent accumulates, and the events it has seen.

Writers are the poll job, the host jobs, the event threads, the probe runner (through its ProbeBook, which has a lock
of its own) and a reload; every write takes the store's lock. The readers take an immutable snapshot, so a scrape
never waits on a vendor call and never sees a half-written poll or a half-applied reload.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuwatch.core.metric_spec import ExportDetail
from gpuwatch.core.model import (
    GpuEvent,
    GpuIdentity,
    GpuReading,
    GpuSample,
    HostSample,
    StuckCall,
    UnusableGpu,
)
from gpuwatch.core.xid import fold_xid
from gpuwatch.state.ledger import LedgerView
from gpuwatch.state.nvlinks import LinkWatch, NvlinkTotals
from gpuwatch.state.probebook import ProbeBook, ProbeView

if TYPE_CHECKING:
    from gpuwatch.readers.kmsg import KernelSxid

# Two reports of the same XID on the same GPU from different sources (NVML event, kernel log) this close in time
# are one event.
XID_DEDUP_WINDOW_SECONDS = 5.0
MAX_XID_SEEN_KEYS = 4096  # de-duplication memory: (GPU, raw code) pairs, the oldest forgotten first
MAX_SXID_KEYS = 4096  # (NVSwitch, SXid) series: an HGX node has up to 12 switches and a few dozen codes
STALE_AFTER_POLLS = 3


@dataclass(slots=True)
class CollectorStatus:
    interval_seconds: float
    success: bool | None = None  # None: not run yet
    duration_seconds: float = 0.0
    last_run_timestamp: float | None = None
    errors_total: int = 0
    registered_timestamp: float | None = None  # when the agent started it: the age of a first run that never ends


@dataclass(slots=True)
class XidCount:
    total: int = 0
    last_timestamp: float = 0.0


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """A consistent, read-only view for one scrape."""

    now: float
    poll_interval_seconds: float
    identities: dict[str, GpuIdentity]
    samples: dict[str, GpuSample]  # only GPUs whose last poll succeeded (freshness judged by fresh())
    gpu_errors: dict[str, str]
    throttle_seconds: dict[str, dict[str, float]]
    xids: dict[tuple[str, int], XidCount]
    resets: dict[str, int]
    backends: dict[str, tuple[bool, str]]
    collectors: dict[str, CollectorStatus]
    gpus_expected: dict[str, int]
    configured_power_limit_watts: float | None
    unusable: tuple[UnusableGpu, ...] = ()  # GPUs a library counts but cannot open
    sxids: dict[tuple[str, int], XidCount] = field(default_factory=dict)  # (NVSwitch, SXid) from the kernel log
    host: tuple[HostSample, ...] = ()  # the host sources' last reads, only those fresher than 3 of their intervals
    probe: ProbeView = field(default_factory=ProbeView)  # the probe's counters, last results and baselines
    parts: dict[str, Any] = field(default_factory=dict)  # collector -> what it stored (its module's own type)
    stuck_calls: tuple[StuckCall, ...] = ()  # vendor calls a poll hangs in (VendorCollectors.stuck_calls)
    # The calls that hung until moments ago: the GPUs they froze are not read yet, so for STALE_AFTER_POLLS poll
    # intervals after the last one returned their stale readings are still the hang's, not a lost GPU's.
    thawing_calls: tuple[StuckCall, ...] = ()
    state_dir_writable: bool | None = None  # False: state files cannot be written (full disk), state kept in memory
    ledger: LedgerView = field(default_factory=LedgerView)  # the faults held until repaired (gpuwatch.state.ledger)
    nvlinks: dict[str, NvlinkTotals] = field(default_factory=dict)  # uuid -> its links summed (gpuwatch.state.nvlinks)
    detail: ExportDetail = field(default_factory=ExportDetail)  # what the exposition serves beyond its default

    def fresh(self, uuid: str) -> GpuSample | None:
        """The GPU's sample if it may be served: polled successfully within 3 poll intervals."""
        sample = self.samples.get(uuid)
        if sample is None or uuid in self.gpu_errors:
            return None
        if self.now - sample.timestamp > STALE_AFTER_POLLS * self.poll_interval_seconds:
            return None
        return sample


class SampleStore:
    def __init__(self, *, poll_interval_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._poll_interval_seconds = poll_interval_seconds
        self._configured_power_limit_watts: float | None = None  # [gpus] power_limit_watts: configure()
        self._identities: dict[str, GpuIdentity] = {}
        self._samples: dict[str, GpuSample] = {}
        self._errors: dict[str, str] = {}
        self._stuck_calls: tuple[StuckCall, ...] = ()
        self._thawing: tuple[tuple[StuckCall, ...], float] = ((), 0.0)  # the calls that last hung, when they returned
        self._throttle: dict[str, dict[str, float]] = {}
        self._xids: dict[tuple[str, int], XidCount] = {}
        self._xid_seen: dict[tuple[str, int], list[tuple[float, str]]] = {}
        self._resets: dict[str, int] = {}
        self._backends: dict[str, tuple[bool, str]] = {}
        self._collectors: dict[str, CollectorStatus] = {}
        self._expected: dict[str, int] = {}
        self._unusable: dict[str, tuple[UnusableGpu, ...]] = {}  # backend -> GPUs it counts but cannot open
        self._sxids: dict[tuple[str, int], XidCount] = {}  # (NVSwitch PCI address, SXid) -> count
        self.probe = ProbeBook()  # written by the probe runner (gpuwatch/probe/runner.py)
        self._host: dict[str, tuple[HostSample, float]] = {}
        self._parts: dict[str, Any] = {}  # collector -> its last run's result
        self._state_dir_writable: bool | None = None  # None: not known (an agent sets it at start)
        self._ledger = LedgerView()
        self._links: dict[str, LinkWatch] = {}  # uuid -> its NVLink/XGMI links across polls
        self._nvlinks: dict[str, NvlinkTotals] = {}
        self._detail = ExportDetail()

    @property
    def poll_interval_seconds(self) -> float:
        return self._poll_interval_seconds  # read-only: configure() changes it, under the lock

    @property
    def configured_power_limit_watts(self) -> float | None:
        return self._configured_power_limit_watts

    # --- writers -------------------------------------------------------------------------------------------

    def configure(
        self,
        poll_interval_seconds: float,
        configured_power_limit_watts: float | None,
        detail: ExportDetail | None = None,
    ) -> None:
        """A reload's settings, all at once: a poll or a scrape sees the old ones or the new ones."""
        with self._lock:
            self._poll_interval_seconds = poll_interval_seconds
            self._configured_power_limit_watts = configured_power_limit_watts
            self._detail = detail if detail is not None else ExportDetail()

    def add_known(self, identities: Iterable[GpuIdentity]) -> None:
        """GPUs remembered from earlier runs: exported as lost until a poll finds them."""
        with self._lock:
            for identity in identities:
                self._identities.setdefault(identity.uuid, identity)

    def register_collector(self, name: str, interval_seconds: float) -> None:
        with self._lock:
            status = self._collectors.setdefault(name, CollectorStatus(interval_seconds))
            status.interval_seconds = interval_seconds
            if status.registered_timestamp is None:
                status.registered_timestamp = self._clock()

    def record_collector_run(self, name: str, *, success: bool, duration_seconds: float) -> None:
        with self._lock:
            status = self._collectors.setdefault(name, CollectorStatus(self._poll_interval_seconds))
            status.success = success
            status.duration_seconds = duration_seconds
            status.last_run_timestamp = self._clock()
            if not success:
                status.errors_total += 1

    def record_host(self, sample: HostSample, interval_seconds: float) -> None:
        """The latest read of a host source (hwmon, ipmi); served while younger than 3 of its intervals."""
        with self._lock:
            self._host[sample.source] = (sample, interval_seconds)

    def set_part(self, collector: str, part: Any) -> None:
        """A collector's last result, replacing its previous one, in the type its module declares: the store keeps
        it and the exposition hands it back to the module's export, so a new collector adds no field here. It must
        be immutable (a frozen dataclass, tuples, a mapping that is never changed after): snapshots share it."""
        with self._lock:
            self._parts[collector] = part

    def set_backend(self, name: str, up: bool, message: str = "") -> None:
        with self._lock:
            self._backends[name] = (up, message)

    def set_unusable(self, backend: str, gpus: Iterable[UnusableGpu]) -> None:
        with self._lock:
            self._unusable[backend] = tuple(gpus)

    def set_expected(self, vendor: str, count: int) -> None:
        with self._lock:
            self._expected[vendor] = count

    def record_poll(self, readings: Iterable[GpuReading]) -> None:
        """Store one poll's readings, accumulating throttle time between this sample and the previous one."""
        with self._lock:
            for reading in readings:
                uuid = reading.identity.uuid
                self._identities[uuid] = reading.identity
                if reading.sample is None:
                    self._errors[uuid] = reading.error or "unreadable"
                    self._samples.pop(uuid, None)
                    continue
                self._errors.pop(uuid, None)
                self._accumulate_throttle(uuid, self._samples.get(uuid), reading.sample)
                self._samples[uuid] = reading.sample
                totals = self._links.setdefault(uuid, LinkWatch()).update(reading.sample)
                if totals is not None:
                    self._nvlinks[uuid] = totals

    def _accumulate_throttle(self, uuid: str, previous: GpuSample | None, current: GpuSample) -> None:
        """Grow each reason's counter by the device's own counter delta where both polls have one, else by the
        poll interval while the reason is active — so a short event between two scrapes is still counted."""
        totals = self._throttle.setdefault(uuid, {})
        for reason in (*current.throttle_active, *current.throttle_counter_seconds):
            totals.setdefault(reason, 0.0)
        if previous is None or current.timestamp <= previous.timestamp:
            return
        elapsed = current.timestamp - previous.timestamp
        # Never attribute a gap the agent did not watch (a hung call, a suspended host) to a throttle reason.
        watched = min(elapsed, STALE_AFTER_POLLS * self._poll_interval_seconds)
        for reason in totals:
            now_counter = current.throttle_counter_seconds.get(reason)
            before_counter = previous.throttle_counter_seconds.get(reason)
            if now_counter is not None and before_counter is not None and now_counter >= before_counter:
                totals[reason] += min(now_counter - before_counter, elapsed)
            elif current.throttle_active.get(reason):
                totals[reason] += watched

    def add_events(self, events: Iterable[GpuEvent]) -> None:
        with self._lock:
            for event in events:
                if event.kind == "reset":
                    self._resets[event.uuid] = self._resets.get(event.uuid, 0) + 1
                elif event.kind == "xid" and event.code is not None:
                    self._add_xid(event)

    def _add_xid(self, event: GpuEvent) -> None:
        assert event.code is not None
        key = (event.uuid, event.code)
        seen = self._xid_seen.setdefault(key, [])
        for when, source in seen:
            same_report = source == event.source and when == event.timestamp
            other_source_twin = source != event.source and abs(when - event.timestamp) <= XID_DEDUP_WINDOW_SECONDS
            if same_report or other_source_twin:
                return
        seen.append((event.timestamp, event.source))
        del seen[:-32]
        if len(self._xid_seen) > MAX_XID_SEEN_KEYS:  # odd codes, each its own key: keep the newest only
            del self._xid_seen[next(iter(self._xid_seen))]
        count = self._xids.setdefault((event.uuid, fold_xid(event.code)), XidCount())  # bounded label
        count.total += 1
        count.last_timestamp = max(count.last_timestamp, event.timestamp)

    def add_sxids(self, sxids: Iterable[KernelSxid]) -> None:
        """NVSwitch SXids from the kernel log (each record once: the reader de-duplicates by sequence)."""
        with self._lock:
            for sxid in sxids:
                count = self._sxids.get((sxid.pci_bus_id, sxid.sxid))
                if count is None:
                    if len(self._sxids) >= MAX_SXID_KEYS:  # switches x codes: far below this on a real node
                        continue
                    count = self._sxids[(sxid.pci_bus_id, sxid.sxid)] = XidCount()
                count.total += 1
                count.last_timestamp = max(count.last_timestamp, sxid.timestamp)

    def ensure_resets_counter(self, uuid: str) -> None:
        """Reset counters exist from start-up at 0 for GPUs whose backend reports resets."""
        with self._lock:
            self._resets.setdefault(uuid, 0)

    # --- readers -------------------------------------------------------------------------------------------

    def identity_by_pci(self, normalized_bus_id: str, normalize: Callable[[str], str]) -> GpuIdentity | None:
        with self._lock:
            for identity in self._identities.values():
                if identity.pci_bus_id and normalize(identity.pci_bus_id) == normalized_bus_id:
                    return identity
        return None

    def identities(self) -> dict[str, GpuIdentity]:
        with self._lock:
            return dict(self._identities)

    def snapshot(self) -> StoreSnapshot:
        with self._lock:
            now = self._clock()
            return StoreSnapshot(
                now=now,
                poll_interval_seconds=self._poll_interval_seconds,
                identities=dict(self._identities),
                samples=dict(self._samples),
                gpu_errors=dict(self._errors),
                throttle_seconds={uuid: dict(totals) for uuid, totals in self._throttle.items()},
                xids={key: XidCount(c.total, c.last_timestamp) for key, c in self._xids.items()},
                resets=dict(self._resets),
                backends=dict(self._backends),
                collectors={
                    name: CollectorStatus(
                        s.interval_seconds,
                        s.success,
                        s.duration_seconds,
                        s.last_run_timestamp,
                        s.errors_total,
                        s.registered_timestamp,
                    )
                    for name, s in self._collectors.items()
                },
                gpus_expected=dict(self._expected),
                configured_power_limit_watts=self._configured_power_limit_watts,
                unusable=tuple(gpu for gpus in self._unusable.values() for gpu in gpus),
                sxids={key: XidCount(c.total, c.last_timestamp) for key, c in self._sxids.items()},
                host=tuple(
                    sample
                    for _name, (sample, interval) in sorted(self._host.items())
                    if now - sample.timestamp <= STALE_AFTER_POLLS * interval
                ),
                probe=self.probe.view(),
                parts=dict(self._parts),
                stuck_calls=self._stuck_calls,
                thawing_calls=(
                    self._thawing[0]
                    if now - self._thawing[1] <= STALE_AFTER_POLLS * self._poll_interval_seconds
                    else ()
                ),
                state_dir_writable=self._state_dir_writable,
                ledger=self._ledger,
                nvlinks=dict(self._nvlinks),
                detail=self._detail,
            )

    def set_state_dir_writable(self, writable: bool) -> None:
        """Whether the state dir takes writes now (False: the agent keeps its state in memory)."""
        with self._lock:
            self._state_dir_writable = writable

    def set_ledger(self, ledger: LedgerView) -> None:
        """The fault ledger as the agent last read or changed it."""
        with self._lock:
            self._ledger = ledger

    def set_stuck_calls(self, calls: tuple[StuckCall, ...]) -> None:
        """The vendor calls a poll hangs in now (none once it returns)."""
        with self._lock:
            if self._stuck_calls and not calls:
                self._thawing = (self._stuck_calls, self._clock())
            self._stuck_calls = calls
