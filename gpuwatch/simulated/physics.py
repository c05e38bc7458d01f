"""How one simulated GPU behaves over time: readings as pure functions of the seconds since the node started.

Pure functions of (profile, plan, seed, t) keep every scenario reproducible under a fake clock: the same elapsed
time always gives the same readings, however often or rarely something looked. Jitter is a seeded, smoothly
interpolated hash of time, so values look alive without a random-number generator whose state depends on reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gpuwatch.core.model import Vendor

# Fault kinds a GpuPlan can carry (one per GPU). Scenario names map onto these in scenarios.py.
FAULT_KINDS: tuple[str, ...] = (
    "overheating",
    "memory_overheating",
    "thermal_throttling",
    "power_brake",
    "psu_undervoltage",
    "pcie_degraded",
    "xid",
    "ecc_uncorrectable",
    "row_remap_failure",
    "gpu_lost",
    "underperforming",
)


@dataclass(frozen=True, slots=True)
class VendorProfile:
    """The numbers one GPU model shows; the NVIDIA one is taken from the H100 fixtures."""

    vendor: Vendor
    model: str
    driver_version: str
    vbios_version: str
    board_part_number: str
    memory_total_bytes: int
    memory_reserved_bytes: int  # the driver's own share, counted in NVML's v1 `used`
    busy_memory_used_bytes: int  # what a training process holds
    power_limit_default_watts: float
    power_limit_min_watts: float
    power_limit_max_watts: float
    temp_slowdown_celsius: float
    temp_shutdown_celsius: float
    temp_gpu_max_celsius: float  # max operating (NVML GPU_MAX; sw thermal slowdown above it)
    temp_memory_max_celsius: float
    clock_max_mhz: dict[str, int]  # graphics, sm, memory, video
    clock_idle_mhz: dict[str, int]
    clock_busy_mhz: dict[str, int]  # at the power cap
    idle_power_watts: float
    idle_temp_celsius: float
    idle_memory_temp_offset: float
    busy_temp_start_celsius: float
    busy_temp_end_celsius: float
    busy_memory_temp_offset: float
    pcie_max_generation: int
    pcie_max_width: int
    nvlink_links: int
    compute_capability: tuple[int, int]
    # The InfoROM (NVIDIA only): its image version and the versions of its objects by nvmlInforomObject_t name;
    # an object left out is one the board does not have (NVML: NotSupported). "" / empty: no InfoROM at all.
    inforom_image_version: str = ""
    inforom_object_versions: dict[str, str] = field(default_factory=dict)


NVIDIA_H100 = VendorProfile(
    vendor="nvidia",
    model="NVIDIA H100 80GB HBM3",
    driver_version="580.159.04",
    vbios_version="96.00.DA.00.0C",
    board_part_number="695-2G520-0200-000",
    memory_total_bytes=85520809984,
    memory_reserved_bytes=503316480,
    busy_memory_used_bytes=77309411328,  # 72 GiB
    power_limit_default_watts=700.0,
    power_limit_min_watts=200.0,
    power_limit_max_watts=700.0,
    temp_slowdown_celsius=89.0,
    temp_shutdown_celsius=95.0,
    temp_gpu_max_celsius=87.0,
    temp_memory_max_celsius=95.0,
    clock_max_mhz={"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1545},
    clock_idle_mhz={"graphics": 345, "sm": 345, "memory": 2619, "video": 765},
    clock_busy_mhz={"graphics": 1365, "sm": 1365, "memory": 2619, "video": 1305},
    idle_power_watts=72.0,
    idle_temp_celsius=31.0,
    idle_memory_temp_offset=3.0,
    busy_temp_start_celsius=54.0,
    busy_temp_end_celsius=62.0,
    busy_memory_temp_offset=6.0,
    pcie_max_generation=5,
    pcie_max_width=16,
    nvlink_links=18,
    compute_capability=(9, 0),
    # tests/fixtures/h100/nvidia-smi-q.txt: "Power Management Object : N/A" (and no DRAM Encryption object)
    inforom_image_version="G520.0200.00.05",
    inforom_object_versions={"oem": "2.1", "ecc": "7.16"},
)

# Plausible MI300X numbers for the AMD simulated library; AMD reports hotspot (junction) as the core sensor, which
# runs hotter than an H100's core (80s-90s °C under load) against higher limits: hotspot critical 100 °C (slowdown),
# emergency 110 °C (shutdown), VRAM critical 105 °C; 750 W cap, 192 GiB HBM3, 1300 MHz memory clock.
AMD_MI300X = VendorProfile(
    vendor="amd",
    model="AMD Instinct MI300X",
    driver_version="6.10.5",
    vbios_version="113-M3000100-102",
    board_part_number="102-G30211-0C",
    memory_total_bytes=206158430208,
    memory_reserved_bytes=301989888,
    busy_memory_used_bytes=180388626432,
    power_limit_default_watts=750.0,
    power_limit_min_watts=0.0,
    power_limit_max_watts=750.0,
    temp_slowdown_celsius=100.0,
    temp_shutdown_celsius=110.0,
    temp_gpu_max_celsius=95.0,
    temp_memory_max_celsius=105.0,
    clock_max_mhz={"graphics": 2100, "sm": 2100, "memory": 1300, "video": 1580},
    clock_idle_mhz={"graphics": 132, "sm": 132, "memory": 900, "video": 29},
    clock_busy_mhz={"graphics": 1900, "sm": 1900, "memory": 1300, "video": 1580},
    idle_power_watts=140.0,
    idle_temp_celsius=38.0,
    idle_memory_temp_offset=2.0,
    busy_temp_start_celsius=80.0,
    busy_temp_end_celsius=90.0,
    busy_memory_temp_offset=-12.0,
    pcie_max_generation=5,
    pcie_max_width=16,
    nvlink_links=7,
    compute_capability=(9, 4),
)

PROFILES: dict[str, VendorProfile] = {"nvidia": NVIDIA_H100, "amd": AMD_MI300X}


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What a scenario makes of one GPU: its workload, its one fault and when that fault starts."""

    busy: bool = False
    fault: str | None = None
    power_limit_watts: float | None = None  # operator-set limit below the default (None = default)
    idle_pcie_generation: int | None = None  # an idle GPU may drop its link to save power (None = max)
    onset_s: float = 1.0  # when the fault starts, in seconds after the node started
    lost_after_s: float | None = None
    events: tuple[tuple[float, int], ...] = ()  # (seconds after start, XID) on this GPU
    probe_slowdown: float = 0.0  # share of throughput a probe loses on this GPU (0.2 = 20 % slow)
    probe_corrupt: int = 0  # elements of each probe's matmul this GPU gets wrong (silent data corruption)
    hang_after_s: float | None = None  # from then on, a vendor library call on this GPU never returns
    # What the GPU's job does with it (activity.py): training, dataloader_starved (busy, few SMs working),
    # idle_allocated (not busy, a process holds memory); None: by `busy`.
    work: str | None = None
    # The probe's matmul, from its worker's start until it ended (None: still running): the GPU runs at its power
    # cap meanwhile, as under any full load, and cools down after. Only the last probe's window is kept (by then an
    # older one has long cooled).
    probe_load: tuple[float, float | None] | None = None
    probe_area_before: float = 0.0  # the earlier probes' share of the activity counters (activity.probe_area)


@dataclass(frozen=True, slots=True)
class Rates:
    """The noiseless part of a reading: what the node integrates (energy, throttle time) and decides on."""

    busy: bool
    power_watts: float
    reasons: frozenset[str]
    temp_core: float
    temp_memory: float
    sm_mhz: float
    video_mhz: float
    undersized: bool
    pcie_generation: int
    pcie_width: int


@dataclass(frozen=True, slots=True)
class Counters:
    """Event counts that are step functions of time (monotonic by construction)."""

    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    recovery_action: int = 0
    pcie_replays: int = 0
    pcie_l0_recoveries: int = 0


# A poll needs the two knots around `t` of about a dozen channels; time only moves forward, so older knots are dead
# weight. A small cap keeps a simulated fleet (1,600 GPUs at 200 nodes) from holding ~1 GiB of them after hours.
_JITTER_CACHE_ENTRIES = 256


@dataclass(frozen=True, slots=True)
class Jitter:
    """Seeded smooth noise in [-1, 1] for one GPU; `channel` keeps quantities independent."""

    seed: int
    gpu: int
    _cache: dict[tuple[int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def at(self, channel: int, t: float, period: float = 1.0) -> float:
        x = t / period
        k = math.floor(x)
        f = x - k
        s = f * f * (3.0 - 2.0 * f)
        a = self.point(channel, k)
        b = self.point(channel, k + 1)
        return a + (b - a) * s

    def point(self, channel: int, k: int) -> float:
        key = (channel, k)
        value = self._cache.get(key)
        if value is None:
            h = _mix(_mix(_mix(self.seed & _MASK) ^ (self.gpu * 0x10001 + channel)) ^ (k & _MASK))
            value = (h >> 11) * (2.0 / (1 << 53)) - 1.0
            if len(self._cache) >= _JITTER_CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = value
        return value

    def constant(self, channel: int) -> float:
        """A per-GPU offset that never changes (each board runs a little warmer or cooler)."""
        return self.point(1000 + channel, 0)


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64: a fast, well-spread integer hash (same output on every platform and Python version)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


# Channels of Jitter.
CH_TEMP, CH_MEM_TEMP, CH_POWER, CH_SM, CH_UTIL, CH_VIDEO, CH_PCIE = range(7)

RAMP_S = 8.0  # how long a temperature fault takes to climb from normal to its plateau
TEMP_TIME_CONSTANT_S = 12.0  # a loaded GPU's core temperature approaches its plateau with this time constant
THROTTLE_PERIOD_S = 10.0  # thermal_throttling: sw_thermal holds clocks down 7 s of every 10
THROTTLE_ACTIVE_S = 7.0


def probing(plan: GpuPlan, t: float) -> bool:
    """Whether the probe's load runs on this GPU at `t`."""
    if plan.probe_load is None:
        return False
    since, until = plan.probe_load
    return since <= t and (until is None or t < until)


def _loaded_temp(profile: VendorProfile, idle_temp: float, share: float, u: float) -> float:
    """The core temperature `u` seconds into a full load from idle: toward the busy plateau, lower at a lower power
    limit, with the busy workload's time constant."""
    end = idle_temp + (profile.busy_temp_end_celsius - idle_temp) * share
    return end - (end - idle_temp) * math.exp(-max(0.0, u) / TEMP_TIME_CONSTANT_S)


def probe_clock_share(profile: VendorProfile, plan: GpuPlan, jitter: Jitter, t: float) -> float:
    """The SM clock a probe starting at `t` runs at, as a share of a healthy GPU's under the same load at its
    default power limit: the probe's throughput follows its clock (a matmul at the power cap is clock-bound)."""
    loaded = replace(plan, probe_load=(t, None))
    return rates(profile, loaded, jitter, t).sm_mhz / profile.clock_busy_mhz["sm"]


def rates(profile: VendorProfile, plan: GpuPlan, jitter: Jitter, t: float) -> Rates:
    """The noiseless state of one GPU at `t` seconds after the node started."""
    limit = plan.power_limit_watts or profile.power_limit_default_watts
    share = limit / profile.power_limit_default_watts
    idle_temp = profile.idle_temp_celsius + 2.0 * jitter.constant(CH_TEMP)
    probe = probing(plan, t)
    busy = plan.busy or probe
    if busy:
        end = idle_temp + (profile.busy_temp_end_celsius - idle_temp) * share
        start = end - (profile.busy_temp_end_celsius - profile.busy_temp_start_celsius)
        temp = end - (end - start) * math.exp(-t / TEMP_TIME_CONSTANT_S)
        if probe and not plan.busy and plan.probe_load is not None:  # from idle, since the probe started
            temp = _loaded_temp(profile, idle_temp, share, t - plan.probe_load[0])
        mem_temp = temp + profile.busy_memory_temp_offset
        power = limit - 2.0
        sm = profile.clock_busy_mhz["sm"] * math.sqrt(share)
        video = float(profile.clock_busy_mhz["video"])
        reasons = {"sw_power_cap"}
        gen, width = profile.pcie_max_generation, profile.pcie_max_width
        if plan.work == "dataloader_starved":  # a kernel always in flight on few SMs: far below the power cap
            end = idle_temp + 0.3 * (end - idle_temp)
            temp = end - (end - idle_temp) * math.exp(-t / TEMP_TIME_CONSTANT_S)
            mem_temp = temp + profile.busy_memory_temp_offset
            power = profile.idle_power_watts + 0.25 * (limit - profile.idle_power_watts)
            sm = float(profile.clock_max_mhz["sm"] - 30)  # boost clock, its jitter kept under the maximum
            reasons = set()
    else:
        temp = idle_temp
        since, until = plan.probe_load or (0.0, None)
        if until is not None and t >= until:  # cooling down after the probe, with the same time constant
            hot = _loaded_temp(profile, idle_temp, share, until - since)
            temp = idle_temp + (hot - idle_temp) * math.exp(-(t - until) / TEMP_TIME_CONSTANT_S)
        mem_temp = temp + profile.idle_memory_temp_offset
        power = profile.idle_power_watts + 3.0 * jitter.constant(CH_POWER)
        sm = float(profile.clock_idle_mhz["sm"])
        video = float(profile.clock_idle_mhz["video"])
        reasons = {"gpu_idle"}
        gen = plan.idle_pcie_generation or profile.pcie_max_generation
        width = profile.pcie_max_width
    undersized = False
    u = t - plan.onset_s  # seconds since the fault started (negative before)
    fault = plan.fault
    if fault == "pcie_degraded":
        gen, width = min(3, gen), min(8, width)
    elif u >= 0 and fault == "overheating":
        peak = profile.temp_slowdown_celsius + 3.0
        temp = temp + (peak - temp) * min(1.0, u / RAMP_S)
        mem_temp = temp + 4.0
        if temp >= profile.temp_gpu_max_celsius:
            reasons.add("sw_thermal")
            reasons.discard("sw_power_cap")
            if busy:
                sm, power = 1200.0 * math.sqrt(share), 0.85 * limit
        if temp >= profile.temp_slowdown_celsius:
            reasons.update(("hw_thermal", "hw_slowdown"))
            if busy:
                sm, power = 690.0, 0.5 * limit
            else:
                power += 25.0  # leakage of a hot die
    elif u >= 0 and fault == "memory_overheating":
        peak = profile.temp_memory_max_celsius - 0.5
        mem_temp = mem_temp + (peak - mem_temp) * min(1.0, u / RAMP_S)
    elif u >= 0 and fault == "thermal_throttling":
        active = (u % THROTTLE_PERIOD_S) < THROTTLE_ACTIVE_S
        if active:
            temp = profile.temp_gpu_max_celsius + 0.7
            reasons = {"sw_thermal"}
            sm, power = 1150.0 * math.sqrt(share), 0.88 * limit
        else:
            temp = profile.temp_gpu_max_celsius - 1.5
        mem_temp = temp + profile.busy_memory_temp_offset
    elif u >= 0 and fault in ("power_brake", "psu_undervoltage"):
        reasons = {"hw_power_brake", "hw_slowdown"} | ({"gpu_idle"} if not busy else set())
        if busy:
            cool = min(1.0, u / 10.0)
            temp = temp + (48.0 - temp) * cool
            mem_temp = temp + profile.busy_memory_temp_offset
            sm, power = 480.0, 0.33 * limit
        undersized = fault == "psu_undervoltage"
    return Rates(
        busy=busy,
        power_watts=power,
        reasons=frozenset(reasons),
        temp_core=temp,
        temp_memory=mem_temp,
        sm_mhz=sm,
        video_mhz=video,
        undersized=undersized,
        pcie_generation=gen,
        pcie_width=width,
    )


@dataclass(frozen=True, slots=True)
class Reading:
    """What a sensor shows at one moment: the noiseless rates plus seeded jitter."""

    rates: Rates
    temp_core: float
    temp_memory: float
    power_watts: float
    clocks_mhz: dict[str, float]
    utilization: float
    memory_utilization: float
    pcie_tx_kbps: int
    pcie_rx_kbps: int


def reading(profile: VendorProfile, plan: GpuPlan, jitter: Jitter, t: float) -> Reading:
    """The jittered reading at `t`; jitter never pushes a value across the threshold its rates decided on."""
    r = rates(profile, plan, jitter, t)
    temp = r.temp_core + 0.5 * jitter.at(CH_TEMP, t, 2.0)
    if plan.fault == "overheating" and "hw_thermal" in r.reasons:
        temp = r.temp_core + 1.2 * jitter.at(CH_TEMP, t, 2.0)
    if plan.fault == "thermal_throttling":
        temp = r.temp_core + 0.4 * jitter.at(CH_TEMP, t, 2.0)
    mem_temp = r.temp_memory + 0.4 * jitter.at(CH_MEM_TEMP, t, 3.0)
    if plan.fault == "memory_overheating" and t - plan.onset_s > RAMP_S:
        mem_temp = r.temp_memory + 2.0 * jitter.at(CH_MEM_TEMP, t, 3.0)
    if r.busy:
        power = r.power_watts + 2.5 * jitter.at(CH_POWER, t, 0.5)
        sm = r.sm_mhz + 15.0 * jitter.at(CH_SM, t, 0.5)
        sm = round(sm / 15.0) * 15.0  # the H100 steps its clocks in 15 MHz bins
        util = 1.0
        mem_util = 0.55 + 0.05 * jitter.at(CH_UTIL, t, 1.0)
        tx = 180_000 + int(40_000 * jitter.at(CH_PCIE, t, 1.0))
        rx = 950_000 + int(200_000 * jitter.at(CH_PCIE + 100, t, 1.0))
    else:
        power = r.power_watts + 1.2 * jitter.at(CH_POWER, t, 1.0)
        sm = r.sm_mhz
        util = 0.0
        mem_util = 0.0
        tx = 750 + int(250 * jitter.at(CH_PCIE, t, 1.0))
        rx = 560 + int(150 * jitter.at(CH_PCIE + 100, t, 1.0))
    clocks = {
        "graphics": sm,
        "sm": sm,
        "memory": float(profile.clock_busy_mhz["memory"] if r.busy else profile.clock_idle_mhz["memory"]),
        "video": r.video_mhz,
    }
    return Reading(
        rates=r,
        temp_core=temp,
        temp_memory=mem_temp,
        power_watts=max(0.0, power),
        clocks_mhz=clocks,
        utilization=util,
        memory_utilization=max(0.0, min(1.0, mem_util)),
        pcie_tx_kbps=max(0, tx),
        pcie_rx_kbps=max(0, rx),
    )


def counters(plan: GpuPlan, jitter: Jitter, t: float) -> Counters:
    """Error and link counters at `t`: zero on a healthy GPU, growing steps after a fault's onset."""
    u = t - plan.onset_s
    l0_base = 100 + int(21 * (1.0 + jitter.constant(CH_PCIE)))  # a healthy H100 read 106-142 since boot
    if u < 0:
        return Counters(pcie_l0_recoveries=l0_base)
    if plan.fault == "pcie_degraded":
        return Counters(pcie_replays=int(4 * u), pcie_l0_recoveries=l0_base + int(u / 2.0))
    if plan.fault == "ecc_uncorrectable":
        unc = 1 + int(u / 5.0)
        return Counters(ecc_corrected=3 * unc, ecc_uncorrected=unc, pcie_l0_recoveries=l0_base)
    if plan.fault == "row_remap_failure":
        return Counters(
            remapped_uncorrectable=1,
            remap_pending=True,
            remap_failed=True,
            recovery_action=1,  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
            pcie_l0_recoveries=l0_base,
        )
    return Counters(pcie_l0_recoveries=l0_base)
