"""Named scenarios and the simulated node they run on: a vendor-neutral model of a GPU server over time.

`SimulatedNode` is what the simulated vendor libraries (`libnvml.py`, `amdsmi_clib.py`) read from: per-GPU identity,
the readings at the current moment, counters that the node integrates as time passes (energy, throttle time),
events (XID, resets) and the PCI bus. Time comes from injectable clocks, so tests drive it with a fake clock and
get the same numbers every run. Fault injection for tests lives on ``node.faults`` (see faults.py).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid as uuid_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpuwatch.core.model import THROTTLE_REASONS, Vendor
from gpuwatch.core.scenario_catalogue import FAULT_GPU, SCENARIOS
from gpuwatch.simulated import mig as mig_model
from gpuwatch.simulated.activity import BOOT_UPTIME_S, CHANNELS, ActivityTotals, job_totals, probe_area, totals
from gpuwatch.simulated.faults import FaultInjector
from gpuwatch.simulated.mig import MigDevice, MigInstanceSpec, MigLayout, MigState, MigView
from gpuwatch.simulated.physics import (
    PROFILES,
    Counters,
    GpuPlan,
    Jitter,
    Rates,
    VendorProfile,
    counters,
    probe_clock_share,
    rates,
    reading,
)
from gpuwatch.simulated.plans import NODE_ONLY_SCENARIOS, plans_for, with_gpu_scenarios

__all__ = ["NODE_ONLY_SCENARIOS", "GpuSpec", "GpuState", "SimEvent", "SimulatedNode", "plans_for"]


# nvml_hang: the call that hangs, as the simulated libraries name it: each poll's temperature read, on either vendor.
# Scenarios about an HGX node's fabric or network: their node has NVLinks, NVSwitches and a NIC per GPU (an HGX
# baseboard) whatever `nvlink` says.
HGX_SCENARIOS = frozenset({"fabric_degraded", "ib_port_down", "ib_flapping"})
HGX_NVSWITCHES = 4
HANG_CALLS = {"nvidia": "nvmlDeviceGetTemperature*", "amd": "amdsmi_get_temp_metric"}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What a GPU is and what it can do: fixed for the life of the node."""

    index: int
    vendor: Vendor
    uuid: str
    model: str
    serial: str
    pci_bus_id: str  # NVML form 00000000:18:00.0 on NVIDIA, BDF 0000:05:00.0 on AMD
    pci_domain: int
    pci_bus: int
    board_part_number: str
    vbios_version: str
    driver_version: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_default_watts: float
    power_limit_min_watts: float
    power_limit_max_watts: float
    temp_slowdown_celsius: float
    temp_shutdown_celsius: float
    temp_gpu_max_celsius: float
    temp_memory_max_celsius: float
    clock_max_mhz: dict[str, int]
    pcie_max_generation: int  # what this GPU reaches in this slot
    pcie_gpu_max_generation: int  # the GPU's own maximum
    pcie_max_width: int
    nvlink_links: int  # 0 when the node has no NVLink
    compute_capability: tuple[int, int]


def process_pid(seed: int, index: int) -> int:
    """The PID of the compute process a busy GPU shows (the simulated procfs gives each one its workload)."""
    return 40000 + 1013 * index + seed % 997


def mig_job_pid(seed: int, index: int, gpu_instance_id: int) -> int:
    """The PID of the job running in MIG GPU instance `gpu_instance_id` of GPU `index` (the procfs gives it the GPU's
    workload)."""
    return process_pid(seed, index) + 1 + gpu_instance_id


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    used_memory_bytes: int
    # The MIG GPU and compute instance it runs in; None on a GPU without MIG.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class GpuState:
    """Everything one GPU shows at one moment, in base units (°C, W, J, MHz, bytes, seconds, ratios 0-1)."""

    index: int
    elapsed: float  # seconds since the node started
    timestamp: float  # unix time of this reading
    lost: bool
    busy: bool
    temperature_core_celsius: float
    temperature_memory_celsius: float
    power_watts: float
    energy_joules: float  # since the driver loaded
    power_limit_watts: float  # the limit the operator set (NVML management limit)
    power_limit_enforced_watts: float
    power_source_undersized: bool
    performance_state: int
    clocks_mhz: dict[str, float]  # graphics, sm, memory, video
    utilization: float
    memory_utilization: float
    memory_used_bytes: int  # by processes, excluding the driver's reserved share
    processes: tuple[SimProcess, ...]
    throttle_active: frozenset[str]
    throttle_seconds: dict[str, float]  # every reason of THROTTLE_REASONS, cumulative
    policy_seconds: dict[str, float]  # NVML violation policies: power, thermal, sync_boost, board_limit, …
    counters: Counters
    pcie_generation: int
    pcie_width: int
    pcie_tx_kbps: int
    pcie_rx_kbps: int
    pcie_tx_bytes: int  # cumulative since the driver loaded
    pcie_rx_bytes: int
    nvlink_up: tuple[bool, ...]  # one per link; empty without NVLink
    activity: ActivityTotals  # SM / tensor / pipe / DRAM activity and NVLink/XGMI bytes since boot (activity.py)


@dataclass(frozen=True, slots=True)
class MigActivity:
    """A MIG instance's activity counters since boot: seconds each channel was active (share-weighted), seconds a
    job ran in it (utilization's meaning), at `elapsed` node seconds."""

    elapsed: float
    uptime_s: float
    active_s: dict[str, float]
    busy_s: float


@dataclass(frozen=True, slots=True)
class SimEvent:
    """Something that happened to a GPU at a moment: an XID (NVIDIA) or a reset (AMD)."""

    seq: int
    elapsed: float
    timestamp: float
    gpu: int
    kind: str  # xid, reset
    code: int | None


POLICIES: tuple[str, ...] = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
    "total_app_clocks",
    "total_base_clocks",
)
# Since the driver loaded, before the node started (the H100 fixture's idle readings).
_POLICY_BASE_S = {"low_utilization": 27.6, "total_app_clocks": 18.26, "total_base_clocks": 18.26}
# A GPU's readings are computed once per SENSOR_PERIOD_S: the driver, too, answers from readings it samples in the
# background (NVML API Reference, nvmlUtilization_t: "each sample period may be between 1 second and 1/6 second";
# nvmlDeviceGetPowerUsage: averaged over 1 s on Ampere and newer), so the calls of one poll agree with each other, and
# a call costs a look-up instead of the physics (both exporters of benchmarks/peer.py pay the simulation per call).
SENSOR_PERIOD_S = 0.01
STEP_S = 0.2  # integration step: readings are held for STEP_S when the node integrates energy and throttle time


@dataclass(slots=True)
class _Integral:
    """Per-GPU running sums over whole steps; the current step is added pro rata when read."""

    steps: int = 0
    energy_j: float = 0.0
    reasons: dict[str, float] = field(default_factory=lambda: dict.fromkeys(THROTTLE_REASONS, 0.0))
    policies: dict[str, float] = field(default_factory=lambda: dict(dict.fromkeys(POLICIES, 0.0), **_POLICY_BASE_S))
    pcie_tx_bytes: float = 0.0
    pcie_rx_bytes: float = 0.0


class SimulatedNode:
    """A simulated GPU server running one scenario; thread-safe, deterministic under a fake clock.

    `clock` gives elapsed time (monotonic seconds); `wall_clock` is read once at start, and unix timestamps are
    that start plus the elapsed time, so a fake `clock` drives both. `nvlink=True` gives every GPU NVLinks (the
    H100 fixture's GPU had none usable: NVLink calls raise NotSupported by default). `gpu_scenarios` gives single
    GPUs a scenario's fault on top of `scenario` (see with_gpu_scenarios). `mig` gives GPUs a MIG mode and instances
    (mig.py; mig.SCENARIO_LAYOUT is the issue's `mig` scenario's); a GPU without one has MIG disabled, as the H100
    fixture's.
    """

    def __init__(
        self,
        scenario: str = "healthy",
        gpus: int = 8,
        vendor: str = "nvidia",
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        *,
        nvlink: bool = False,
        gpu_scenarios: Mapping[int, str] | None = None,
        mig: Mapping[int, MigLayout] | None = None,
    ) -> None:
        if vendor not in PROFILES:
            raise ValueError(f"unknown vendor {vendor!r}; known: {', '.join(PROFILES)}")
        if gpus < 0:
            raise ValueError("gpus must be >= 0")
        self._plans = with_gpu_scenarios(plans_for(scenario, gpus), gpu_scenarios or {})
        self.scenario = scenario
        self.info = SCENARIOS[scenario]
        self.vendor: Vendor = "nvidia" if vendor == "nvidia" else "amd"
        self.profile: VendorProfile = PROFILES[vendor]
        self.gpu_count = gpus
        self.seed = seed
        # An NVSwitch fabric's scenario needs one: its GPUs get their NVLinks and register with the fabric.
        self.nvlink = nvlink or bool({scenario, *(gpu_scenarios or {}).values()} & HGX_SCENARIOS)
        self._clock = clock
        self._start = clock()
        self._wall_start = wall_clock()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._jitter = [Jitter(seed, i) for i in range(gpus)]
        self._integrals = [_Integral() for _ in range(gpus)]
        self._energy_base_j = [2899.27 + 1500.0 * (1.0 + j.constant(7)) for j in self._jitter]
        self._specs = [self._make_spec(i) for i in range(gpus)]
        self._events: list[SimEvent] = []
        for i, plan in enumerate(self._plans):
            for at, xid in plan.events:
                kind = "xid" if self.vendor == "nvidia" else "reset"
                self._events.append(SimEvent(0, at, self._wall_start + at, i, kind, xid if kind == "xid" else None))
        self._events.sort(key=lambda e: (e.elapsed, e.gpu))
        self._events = [replace(e, seq=n) for n, e in enumerate(self._events)]
        self._cache: dict[int, tuple[float, GpuState]] = {}
        self._probe_running: dict[int, Callable[[], bool]] = {}  # GPU -> whether its probe's worker still runs
        self.faults = FaultInjector(seed, gpus, self._notify, self._emit, elapsed=self.elapsed)
        for index, plan in enumerate(self._plans):
            if plan.hang_after_s is not None:  # a driver call that never returns on this GPU (scenario nvml_hang)
                self.faults.hang(HANG_CALLS[vendor], gpu=index, after=plan.hang_after_s)
        self.clock_is_real = clock is time.monotonic
        self._mig: dict[int, MigState] = {}
        if mig is None and scenario == "mig" and gpus:  # the scenario's GPU split as mig.SCENARIO_LAYOUT says
            if self.vendor != "nvidia":
                raise ValueError("scenario 'mig' splits an NVIDIA GPU with MIG: run it with --vendor nvidia")
            mig = {min(FAULT_GPU, gpus - 1): mig_model.SCENARIO_LAYOUT}
        for index, layout in (mig or {}).items():
            if self.vendor != "nvidia":
                raise ValueError("MIG layouts are for NVIDIA GPUs; this node's are AMD's")
            if not 0 <= index < gpus:
                raise ValueError(f"MIG layout for GPU {index}, but the node has GPUs 0-{gpus - 1}")
            try:
                state = mig_model.new_state(layout)
            except ValueError as exc:
                raise ValueError(f"MIG layout of GPU {index}: {exc}") from exc
            self._mig[index] = state
            for gi in state.instances.values():  # jobs of the layout run from the start, with their PIDs
                for ci in gi.compute_instances:
                    if ci.job:
                        mig_model.set_job(state, gi.id, ci.job, now=0.0, pid=mig_job_pid(seed, index, gi.id))

    # --- scenario facts ------------------------------------------------------------------------------------------
    @property
    def library_missing(self) -> bool:
        """The vendor library cannot be loaded: the backend_down scenario, unless a test decided otherwise."""
        override = self.faults.library_missing
        return self.scenario == "backend_down" if override is None else override

    @property
    def probe_slowdown(self) -> dict[int, float]:
        """GPU -> share of probe throughput it loses (0.2 = computes 20 % slower); for the simulated probe."""
        return {i: p.probe_slowdown for i, p in enumerate(self._plans) if p.probe_slowdown}

    @property
    def probe_corrupt(self) -> dict[int, int]:
        """GPU -> elements of each probe's matmul it gets wrong; for the simulated probe."""
        return {i: p.probe_corrupt for i, p in enumerate(self._plans) if p.probe_corrupt}

    @property
    def fault_gpus(self) -> tuple[int, ...]:
        """The GPUs of this node that show a fault (or a power limit below default)."""
        return tuple(
            i
            for i, p in enumerate(self._plans)
            if p.fault or p.power_limit_watts or p.probe_slowdown or p.probe_corrupt or p.events
        )

    def plan(self, index: int) -> GpuPlan:
        return self._plans[index]

    def nvswitch_count(self) -> int:
        """NVSwitches on the PCI bus: an HGX baseboard's four (H100/H200: third-generation NVSwitch) where the GPUs
        are NVLinked through switches, none elsewhere."""
        return HGX_NVSWITCHES if self.vendor == "nvidia" and self.nvlink else 0

    def fabric_manager_running(self) -> bool:
        """nv-fabricmanager runs on an NVSwitch node unless a test stopped it (faults.stop_fabric_manager)."""
        return self.nvswitch_count() > 0 and self.faults.fabric_manager_running

    def fabric_degraded(self, index: int) -> bool:
        """GPU `index`'s NVLink fabric runs with less bandwidth than it should (scenario fabric_degraded), or a test
        made it so (faults.set_fabric_degraded)."""
        override = self.faults.fabric_degraded_override(index)
        if override is not None:
            return override
        plan = self._plans[index]
        return plan.fault == "fabric_degraded" and self.elapsed() >= plan.onset_s

    def spec(self, index: int) -> GpuSpec:
        return self._specs[index]

    # --- MIG ----------------------------------------------------------------------------------------------------
    def mig(self, index: int) -> MigView | None:
        """GPU `index`'s MIG mode and instances now; None for a GPU given no MIG layout (MIG disabled)."""
        with self._lock:
            state = self._mig.get(index)
            return None if state is None else mig_model.view(state)

    def mig_devices(self, index: int) -> tuple[MigDevice, ...]:
        """GPU `index`'s MIG devices now, in index order (none while MIG is disabled)."""
        return mig_model.devices(self.seed, index, self.mig(index))

    def mig_job_pids(self, index: int) -> tuple[int, ...]:
        """The PIDs of the jobs running in GPU `index`'s MIG instances now."""
        return tuple(d.compute_instance.pid for d in self.mig_devices(index) if d.compute_instance.job)

    def create_gpu_instance(self, index: int, spec: MigInstanceSpec) -> int:
        """Create a GPU instance (and its compute instances) on GPU `index` while the node runs, as `nvidia-smi mig
        -cgi ... -C` would; returns its ID. ValueError when the driver would refuse."""
        with self._lock:
            state = self._mig_state(index)
            now = self.elapsed()
            gi = mig_model.create(state, replace(spec, job=None), now=now, pid=0)
            if spec.job:
                mig_model.set_job(state, gi.id, spec.job, now=now, pid=mig_job_pid(self.seed, index, gi.id))
            self._cache.pop(index, None)
            return gi.id

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        """Destroy a GPU instance of GPU `index` (`nvidia-smi mig -dci -gi ID; -dgi -gi ID`); ValueError when a job
        still runs in it."""
        with self._lock:
            mig_model.destroy(self._mig_state(index), gpu_instance_id)
            self._cache.pop(index, None)

    def set_mig_job(self, index: int, gpu_instance_id: int, job: str | None) -> None:
        """Start a job (an activity.py workload: busy, training, ...) in a GPU instance of GPU `index`, or end it
        (None)."""
        with self._lock:
            pid = mig_job_pid(self.seed, index, gpu_instance_id)
            mig_model.set_job(self._mig_state(index), gpu_instance_id, job, now=self.elapsed(), pid=pid)
            self._cache.pop(index, None)

    def mig_activity(self, index: int, gpu_instance_id: int, compute_instance_id: int | None = None) -> MigActivity:
        """The activity counters since boot of a GPU instance (or one of its compute instances) of GPU `index`: its
        jobs' workloads since each started (activity.job_totals), a GPU instance's compute instances weighted by their
        share of its SMs; ValueError when it has none of that ID."""
        view = self.mig(index)
        gi = None if view is None else view.gpu_instance(gpu_instance_id)
        if gi is None:
            raise ValueError(f"GPU {index} has no MIG GPU instance {gpu_instance_id}")
        cis = [ci for ci in gi.compute_instances if compute_instance_id in (None, ci.id)]
        if not cis:
            raise ValueError(
                f"GPU instance {gpu_instance_id} of GPU {index} has no compute instance {compute_instance_id}"
            )
        t = round(self.elapsed(), 6)
        active = dict.fromkeys(CHANNELS, 0.0)
        busy = 0.0
        for ci in cis:
            weight = (
                1.0
                if compute_instance_id is not None
                else mig_model.compute_multiprocessors(gi, ci.slices) / gi.profile.multiprocessors
            )
            done = job_totals(ci.job, self._jitter[index], ci.job_since, t)
            for channel, seconds in done.active_s.items():
                active[channel] += weight * seconds
            busy += weight * (max(0.0, t - ci.job_since) if ci.job else 0.0)
        return MigActivity(elapsed=t, uptime_s=BOOT_UPTIME_S + t, active_s=active, busy_s=busy)

    def _mig_state(self, index: int) -> MigState:
        state = self._mig.get(index)
        if state is None or not state.enabled:
            raise ValueError(f"MIG is not enabled on GPU {index}: give it a MigLayout when creating the node")
        return state

    def pci_gpu_counts(self) -> dict[str, int]:
        """GPUs of each vendor on the PCI bus, as pci.count_pci_gpus() reads it: a lost GPU stays on the bus."""
        counts = {"nvidia": 0, "amd": 0}
        counts[self.vendor] = self.gpu_count
        return counts

    # --- time -----------------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return max(0.0, self._clock() - self._start)

    def wall_time(self, elapsed: float | None = None) -> float:
        return self._wall_start + (self.elapsed() if elapsed is None else elapsed)

    # --- readings ---------------------------------------------------------------------------------------------
    def is_lost(self, index: int) -> bool:
        """The GPU stopped answering: the scenario says so by now, or a test made it so."""
        return self._lost_at(index, self.elapsed())

    def _lost_at(self, index: int, elapsed: float) -> bool:
        override = self.faults.lost_override(index)
        if override is not None:
            return override
        after = self._plans[index].lost_after_s
        return after is not None and elapsed >= after

    def state(self, index: int) -> GpuState:
        """What GPU `index` shows now (computed even when lost: the libraries decide what a lost GPU answers)."""
        if not 0 <= index < self.gpu_count:
            raise IndexError(f"no GPU {index} on this node ({self.gpu_count} GPUs)")
        with self._lock:
            running = self._probe_running.get(index)
            if running is not None and not running():
                self._end_probe_load(index)
            t = round(self.elapsed(), 6)
            cached = self._cache.get(index)
            if cached is not None and 0.0 <= t - cached[0] < SENSOR_PERIOD_S:
                return cached[1]
            state = self._compute(index, t)
            self._cache[index] = (t, state)
            return state

    def start_probe_load(self, index: int, running: Callable[[], bool]) -> float:
        """A probe's matmul starts on GPU `index` now and lasts while `running()` says so (the worker process lives):
        the GPU's readings show the load meanwhile. Returns the SM clock it runs at as a share of a healthy GPU's
        under the same load (physics.probe_clock_share), which its throughput follows."""
        with self._lock:
            t = round(self.elapsed(), 6)  # as state() reads it
            self._integrate(index, t)
            plan, jitter = self._plans[index], self._jitter[index]
            share = probe_clock_share(self.profile, plan, jitter, t)
            before = probe_area(plan, jitter, t)  # the activity counters keep what earlier probes added
            self._plans[index] = replace(plan, probe_load=(t, None), probe_area_before=before)
            self._probe_running[index] = running
            self._cache.pop(index, None)
            return share

    def _end_probe_load(self, index: int) -> None:
        t = round(self.elapsed(), 6)  # as state() reads it: the reading that noticed shows the GPU idle
        self._integrate(index, t)
        plan = self._plans[index]
        if plan.probe_load is not None:
            self._plans[index] = replace(plan, probe_load=(plan.probe_load[0], max(t, plan.probe_load[0])))
        self._probe_running.pop(index, None)
        self._cache.pop(index, None)

    def set_power_limit(self, index: int, watts: float | None) -> None:
        """Change a GPU's power limit from now on (as `nvidia-smi -pl` would); None restores the default."""
        with self._lock:
            self._integrate(index, self.elapsed())
            self._plans[index] = replace(self._plans[index], power_limit_watts=watts)
            self._cache.pop(index, None)

    def _compute(self, index: int, t: float) -> GpuState:
        spec, plan, jitter = self._specs[index], self._plans[index], self._jitter[index]
        acc = self._integrate(index, t)
        now = reading(self.profile, plan, jitter, t)
        r = now.rates
        # The current, partial step at the rates it will be integrated with.
        step_rates = rates(self.profile, plan, jitter, acc.steps * STEP_S)
        part = t - acc.steps * STEP_S
        reasons = dict(acc.reasons)
        for reason in step_rates.reasons:
            reasons[reason] += part
        policies = dict(acc.policies)
        for policy in _policies_of(step_rates.reasons):
            policies[policy] += part
        limit = plan.power_limit_watts or spec.power_limit_default_watts
        processes: tuple[SimProcess, ...] = ()
        used = 0
        mig = self._mig.get(index)
        if mig is not None and mig.enabled:  # in MIG mode every process runs in an instance: the jobs of the layout
            processes = tuple(
                SimProcess(ci.pid, int(gi.profile.memory_bytes * mig_model.JOB_MEMORY_SHARE), gi.id, ci.id)
                for gi in sorted(mig.instances.values(), key=lambda g: g.id)
                for ci in gi.compute_instances
                if ci.job
            )
            used = sum(p.used_memory_bytes for p in processes)
        elif plan.busy or plan.work == "idle_allocated":  # idle_allocated: a process holds memory, runs nothing
            used = self.profile.busy_memory_used_bytes + int(64 * 2**20 * (1.0 + jitter.constant(8)))
            processes = (SimProcess(pid=process_pid(self.seed, index), used_memory_bytes=used),)
        links = spec.nvlink_links
        nvlink_up = tuple(not self.faults.nvlink_down(index, link) for link in range(links))
        return GpuState(
            index=index,
            elapsed=t,
            timestamp=self._wall_start + t,
            lost=self._lost_at(index, t),
            busy=r.busy,
            temperature_core_celsius=now.temp_core,
            temperature_memory_celsius=now.temp_memory,
            power_watts=now.power_watts,
            energy_joules=self._energy_base_j[index] + acc.energy_j + part * step_rates.power_watts,
            power_limit_watts=limit,
            power_limit_enforced_watts=limit,
            power_source_undersized=r.undersized,
            performance_state=0,
            clocks_mhz=now.clocks_mhz,
            utilization=now.utilization,
            memory_utilization=now.memory_utilization,
            memory_used_bytes=used,
            processes=processes,
            throttle_active=r.reasons,
            throttle_seconds=reasons,
            policy_seconds=policies,
            counters=counters(plan, jitter, t),
            pcie_generation=r.pcie_generation,
            pcie_width=r.pcie_width,
            pcie_tx_kbps=now.pcie_tx_kbps,
            pcie_rx_kbps=now.pcie_rx_kbps,
            pcie_tx_bytes=3_343_922_664 + int(acc.pcie_tx_bytes),
            pcie_rx_bytes=584_259_464 + int(acc.pcie_rx_bytes),
            nvlink_up=nvlink_up,
            activity=totals(plan, jitter, t, links),
        )

    def _integrate(self, index: int, t: float) -> _Integral:
        """Add every whole step before `t`: counters grow only while their reason was active."""
        acc = self._integrals[index]
        plan, jitter = self._plans[index], self._jitter[index]
        while (acc.steps + 1) * STEP_S <= t:
            r: Rates = rates(self.profile, plan, jitter, acc.steps * STEP_S)
            acc.energy_j += STEP_S * r.power_watts
            for reason in r.reasons:
                acc.reasons[reason] += STEP_S
            for policy in _policies_of(r.reasons):
                acc.policies[policy] += STEP_S
            kbps = (180_000, 950_000) if r.busy else (750, 560)
            acc.pcie_tx_bytes += STEP_S * kbps[0] * 1000
            acc.pcie_rx_bytes += STEP_S * kbps[1] * 1000
            acc.steps += 1
        return acc

    # --- events -----------------------------------------------------------------------------------------------
    def events_until(self, elapsed: float) -> list[SimEvent]:
        """Every event that has happened by `elapsed` seconds, oldest first."""
        with self._lock:
            return [e for e in self._events if e.elapsed <= elapsed]

    def next_event_after(self, elapsed: float) -> float | None:
        """When the next scheduled event after `elapsed` happens, for waiters that want to wake on time."""
        with self._lock:
            return next((e.elapsed for e in self._events if e.elapsed > elapsed), None)

    def wait_for_change(self, timeout: float) -> None:
        """Sleep up to `timeout` real seconds, waking early when an event is emitted or a fault changes."""
        with self._changed:
            self._changed.wait(timeout)

    def _emit(self, index: int, kind: str, code: int | None) -> None:
        with self._lock:
            t = self.elapsed()
            self._events.append(SimEvent(len(self._events), t, self._wall_start + t, index, kind, code))
            self._events.sort(key=lambda e: (e.elapsed, e.seq))
        self._notify()

    def _notify(self) -> None:
        with self._changed:
            self._cache.clear()
            self._changed.notify_all()

    # --- identity ---------------------------------------------------------------------------------------------
    def _links(self) -> int:
        """NVLinks when asked for; an MI300X platform always wires its GPUs together with XGMI (one per peer)."""
        if self.nvlink:
            return self.profile.nvlink_links
        return min(self.profile.nvlink_links, self.gpu_count - 1) if self.vendor == "amd" else 0

    def _make_spec(self, index: int) -> GpuSpec:
        profile = self.profile
        digest = hashlib.sha256(f"gpuwatch-sim:{self.seed}:{self.vendor}:{index}".encode()).digest()
        raw_uuid = str(uuid_module.UUID(bytes=digest[:16]))
        bus = _PCI_BUSES[self.vendor][index] if index < 8 else 0x01 + 0x08 * index
        if self.vendor == "nvidia":
            uuid = "GPU-" + raw_uuid
            serial = str(1_653_000_000_000 + int.from_bytes(digest[16:24], "big") % 100_000_000_000)
            bus_id = f"00000000:{bus:02X}:00.0"
        else:
            uuid = raw_uuid
            serial = f"{int.from_bytes(digest[16:24], 'big'):016X}"
            bus_id = f"0000:{bus:02x}:00.0"
        return GpuSpec(
            index=index,
            vendor=self.vendor,
            uuid=uuid,
            model=profile.model,
            serial=serial,
            pci_bus_id=bus_id,
            pci_domain=0,
            pci_bus=bus,
            board_part_number=profile.board_part_number,
            vbios_version=profile.vbios_version,
            driver_version=profile.driver_version,
            memory_total_bytes=profile.memory_total_bytes,
            memory_reserved_bytes=profile.memory_reserved_bytes,
            power_limit_default_watts=profile.power_limit_default_watts,
            power_limit_min_watts=profile.power_limit_min_watts,
            power_limit_max_watts=profile.power_limit_max_watts,
            temp_slowdown_celsius=profile.temp_slowdown_celsius,
            temp_shutdown_celsius=profile.temp_shutdown_celsius,
            temp_gpu_max_celsius=profile.temp_gpu_max_celsius,
            temp_memory_max_celsius=profile.temp_memory_max_celsius,
            clock_max_mhz=dict(profile.clock_max_mhz),
            pcie_max_generation=profile.pcie_max_generation,
            pcie_gpu_max_generation=profile.pcie_max_generation,
            pcie_max_width=profile.pcie_max_width,
            nvlink_links=self._links(),
            compute_capability=profile.compute_capability,
        )


# PCI buses of the GPUs of an 8-GPU HGX H100 board and an 8-GPU MI300X platform.
_PCI_BUSES: dict[str, tuple[int, ...]] = {
    "nvidia": (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB),
    "amd": (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5),
}


def _policies_of(reasons: frozenset[str]) -> list[str]:
    """NVML violation policies that count while these reasons hold (THERMAL counts sw and hw alike)."""
    out: list[str] = []
    if "sw_power_cap" in reasons:
        out.append("power")
    if "sw_thermal" in reasons or "hw_thermal" in reasons:
        out.append("thermal")
    if "sync_boost" in reasons:
        out.append("sync_boost")
    if "gpu_idle" in reasons:
        out.append("low_utilization")
    if reasons:
        out.extend(("total_app_clocks", "total_base_clocks"))
    return out
