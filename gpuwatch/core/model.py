"""Vendor-neutral value types that flow from the backends through the store to the exporter.

Every field carries its unit in its name, and ``None`` (or a missing dict key) means "the device cannot give this",
which the exporter turns into a missing series — never into 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

Vendor = Literal["nvidia", "amd"]
EventKind = Literal["xid", "reset"]
EventSource = Literal["nvml", "kmsg", "amdsmi"]  # who reported a GpuEvent: the vendor library or the kernel log
HostSourceName = Literal["hwmon", "ipmi"]  # the host collector a HostSample comes from
# The probe's choices, shared by the [probe] config section, the worker's flags and its engines.
ProbeEngineChoice = Literal["auto", "cupy", "torch"]
ProbeDtype = Literal["bf16", "fp16", "fp32"]

# NVLink fabric health conditions (nvml.h's healthMask fields, then healthSummary's two bad values), as
# gpuwatch_gpu_fabric_health{condition} names them; each 1 while it holds (docs/metrics.md, "NVLink fabric").
FABRIC_CONDITIONS: tuple[str, ...] = (
    "degraded_bandwidth",
    "route_recovery",
    "route_unhealthy",
    "access_timeout_recovery",
    "incorrect_configuration",
    "unhealthy",
    "limited_capacity",
)

# The one vocabulary of throttle reasons (docs/metrics.md, "Throttling").
THROTTLE_REASONS: tuple[str, ...] = (
    "gpu_idle",
    "applications_clocks",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
    "display_clock",
    "board_limit",
    "low_utilization",
    "reliability",
)

# NVML's nvmlComputeMode_t, in its order (the index is the library's value).
ComputeMode = Literal["default", "exclusive_thread", "prohibited", "exclusive_process"]
COMPUTE_MODES: tuple[ComputeMode, ...] = get_args(ComputeMode)


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What a GPU is; read once (static tier) and remembered in the state dir after it is lost."""

    uuid: str
    vendor: Vendor
    index: int  # the exported `gpu` label: the vendor's index, AMD offset after NVIDIA on mixed nodes
    model: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    driver_version: str = ""
    vbios_version: str = ""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device of a MIG-enabled NVIDIA GPU: a compute instance within a GPU instance, with the memory of its
    GPU instance (docs/mig.md)."""

    uuid: str  # MIG-…
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # as nvidia-smi names it: 3g.40gb, or 1c.3g.40gb for a compute instance smaller than its GPU instance
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    # Its GPU instance's GPM over the last poll interval, 0-1 (nvmlGpmMigSampleGet: nvml_gpm_mig.py); None unread.
    sm_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None


@dataclass(slots=True)
class GpuSample:
    """One complete reading of one GPU: the fast tier of this poll merged with the last slow and static tiers."""

    uuid: str
    timestamp: float  # unix time of the poll that produced the fast-tier values
    temperature_celsius: dict[str, float] = field(default_factory=dict)  # sensor -> °C
    temperature_threshold_celsius: dict[tuple[str, str], float] = field(default_factory=dict)  # (sensor, threshold)
    fan_speed_ratio: dict[str, float] = field(default_factory=dict)  # fan index -> 0..1(+)
    clock_hertz: dict[str, float] = field(default_factory=dict)  # sm, memory, graphics, video
    clock_max_hertz: dict[str, float] = field(default_factory=dict)
    power_watts: float | None = None
    power_limit_watts: dict[str, float] = field(default_factory=dict)  # enforced, default, min, max
    energy_joules: float | None = None
    performance_state: int | None = None
    power_supply_undersized: bool | None = None
    # Every reason the device can report, True while it holds clocks down at this poll.
    throttle_active: dict[str, bool] = field(default_factory=dict)
    # The device's own cumulative throttle time per reason, where it keeps one (NVML counters, AMD residency).
    throttle_counter_seconds: dict[str, float] = field(default_factory=dict)
    # NVIDIA's thermal violation counter (NVML_FI_DEV_PERF_POLICY_THERMAL / NVML_PERF_POLICY_THERMAL): every thermal
    # reason as one, since the driver loaded; what DCGM reads for DCGM_FI_DEV_THERMAL_VIOLATION.
    thermal_violation_seconds: float | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    process_pids: tuple[int, ...] | None = None  # host PIDs of compute processes
    process_memory_bytes: dict[int, int] = field(default_factory=dict)  # host PID -> GPU memory, where reported
    process_gpu_instance: dict[int, int] = field(default_factory=dict)  # host PID -> its MIG GPU instance's ID
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()  # a MIG-enabled GPU's MIG devices, by GPU and compute instance ID
    compute_partitions: int | None = None  # AMD: partitions its GPU is split into (SPX 1, CPX 8), on partition 0
    ecc_enabled: bool | None = None
    persistence_mode_enabled: bool | None = None
    compute_mode: ComputeMode | None = None
    ecc_errors_total: dict[str, int] = field(default_factory=dict)  # corrected, uncorrected, deferred
    remapped_rows_total: dict[str, int] = field(default_factory=dict)  # correctable, uncorrectable
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    retired_pages: int | None = None
    retired_pages_limit: int | None = None  # retired pages past which the driver gives the GPU up (AMD)
    row_remap_banks: dict[str, int] = field(default_factory=dict)  # spare-row availability -> memory banks
    sram_ecc_threshold_exceeded: bool | None = None  # on-die SRAM ECC errors passed the driver's threshold
    recovery_action: int | None = None
    inforom_valid: bool | None = None  # the InfoROM's checksums hold (NVIDIA)
    fabric_healthy: bool | None = None  # NVSwitch systems: the GPU completed fabric registration
    # NVSwitch systems: each fabric health condition the driver reports (nvmlGpuFabricInfo_v2/_v3 healthMask and
    # healthSummary) -> whether it holds; absent where the driver does not report it (see FABRIC_CONDITIONS).
    fabric_health: dict[str, bool] = field(default_factory=dict)
    fabric_misconfiguration: str | None = None  # what the incorrect_configuration condition names, while it holds
    pcie_link_generation: dict[str, int] = field(default_factory=dict)  # current, max
    pcie_link_width: dict[str, int] = field(default_factory=dict)
    pcie_replays_total: int | None = None
    pcie_link_recoveries_total: int | None = None
    pcie_errors_total: dict[str, int] = field(default_factory=dict)  # fatal, non_fatal, correctable
    nvlink_up: dict[str, bool] = field(default_factory=dict)  # link -> up
    nvlink_errors_total: dict[tuple[str, str], int] = field(default_factory=dict)  # (link, type)
    # The links the GPU has (NVIDIA: those whose nvmlDeviceGetNvLinkState answered at open); None: not known, so the
    # links seen answering count (gpuwatch/state/nvlinks.py).
    nvlink_expected: int | None = None
    # Real utilization (NVIDIA GPM on Hopper and newer; AMD activity): shares 0-1 over the last poll interval, absent
    # where the device cannot measure them (docs/reading-the-metrics.md, "Real utilization").
    sm_active_ratio: float | None = None  # SMs busy (at least one warp resident), averaged over SMs and time
    sm_occupancy_ratio: float | None = None  # resident warps / the SMs' maximum
    tensor_active_ratio: float | None = None  # any tensor pipe
    dram_active_ratio: float | None = None  # DRAM bandwidth used / peak
    pipe_active_ratio: dict[str, float] = field(default_factory=dict)  # hmma, dmma, imma, dfma, fp64, fp32, fp16, …
    active_seconds_total: dict[str, float] = field(default_factory=dict)  # sm, tensor: share x interval, summed
    sm_cycles_total: float | None = None  # SM cycles elapsed since boot (NVML 13.2+ GPM counters)
    active_cycles_total: dict[str, float] = field(default_factory=dict)  # pipe -> active cycles since boot
    pcie_bytes_total: dict[str, float] = field(default_factory=dict)  # rx, tx
    nvlink_bytes_total: dict[tuple[str, str], float] = field(default_factory=dict)  # (link, rx|tx)
    # The token the vendor's compute runtime selects this GPU by, where it is not the UUID (AMD: ROCR_VISIBLE_DEVICES
    # takes GPU-<unique id> or an index); None: the UUID. Not exported; the probe pins its worker with it.
    runtime_device: str | None = None


_SAMPLE_FIELDS = fields(GpuSample)
_SAMPLE_DICTS = tuple(f.name for f in _SAMPLE_FIELDS if f.default_factory is dict)
_SAMPLE_PLAIN = tuple(f.name for f in _SAMPLE_FIELDS if f.default_factory is not dict)


def _sample_copier() -> Callable[[GpuSample], GpuSample]:
    """copy_sample: a copy that shares nothing mutable with its sample. Every field of GpuSample is immutable (str,
    number, bool, tuple, None) or a dict of immutable keys and values (tests/test_model.py holds it to that), so
    copying the dicts is a deep copy. It runs once per GPU per poll, so its body is written out field by field, as
    dataclasses writes __init__: copy.deepcopy took 34 µs, a getattr/setattr loop over the fields 8.7 µs, this 2.2."""
    lines = [f"    new.{name} = sample.{name}" for name in _SAMPLE_PLAIN]
    lines += [f"    new.{name} = sample.{name}.copy()" for name in _SAMPLE_DICTS]
    source = "def copy_sample(sample):\n    new = _new(GpuSample)\n" + "\n".join(lines) + "\n    return new\n"
    namespace: dict[str, Any] = {"_new": object.__new__, "GpuSample": GpuSample}
    exec(source, namespace)  # the source holds GpuSample's own field names, nothing from outside
    copier: Callable[[GpuSample], GpuSample] = namespace["copy_sample"]
    copier.__doc__ = _sample_copier.__doc__
    return copier


copy_sample = _sample_copier()


@dataclass(frozen=True, slots=True)
class GpuReading:
    """The outcome of polling one GPU: a sample, or the reason there is none (lost, unreadable)."""

    identity: GpuIdentity
    sample: GpuSample | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class UnusableGpu:
    """A GPU the vendor library counts but cannot open, so it has no identity beyond its index."""

    index: int  # the gpu label: the library's index plus the backend's offset
    reason: str  # why: insufficient_power (NVML: external power cables not properly attached)
    pci_bus_id: str = ""  # where it can be read


@dataclass(frozen=True, slots=True)
class StuckCall:
    """A vendor library call the poll has been in for far longer than a read takes: hung in the driver. `gpu` and
    `uuid` name the GPU being read ("" for a library-wide call); `since` is the unix time its read began."""

    backend: str
    call: str
    gpu: str
    uuid: str
    since: float


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """Something that happened to a GPU at a moment: an XID error (NVIDIA) or a reset (AMD)."""

    uuid: str
    kind: EventKind
    timestamp: float  # unix time the event happened (kernel log time for XIDs read from the log)
    code: int | None = None  # the XID number
    source: EventSource = "nvml"


@dataclass(frozen=True, slots=True)
class HostVoltage:
    """One supply rail of the host (BMC sensor, PMBus output, mapped Super-I/O input), already in volts."""

    chip: str  # unique on the node: nct6798-isa-0290, pmbus-i2c-7-58, ipmi
    sensor: str
    volts: float
    nominal_volts: float | None = None
    # The limit to alert on, signed like the rail (judged by magnitude): the chip's, BMC's or mapping's warning
    # limit, else its critical one, else nominal × (1 - the rail's ATX tolerance) (gpuwatch/readers/rails.py).
    min_volts: float | None = None
    alarm: bool | None = None  # any of the chip's alarm flags for this input raised, where it has them
    # Each alarm flag the chip has, as (limit, raised): min, lcrit, max, crit as hwmon names the inX_<limit>_alarm
    # attribute, any for a chip's single inX_alarm.
    alarms: tuple[tuple[str, bool], ...] = ()


@dataclass(frozen=True, slots=True)
class HostReadingValue:
    """A host temperature (°C) or fan speed (RPM) of one chip."""

    chip: str
    sensor: str
    value: float


@dataclass(frozen=True, slots=True)
class HostPsu:
    """A power supply bay that was populated at least once: up = present and reporting no fault."""

    psu: str
    up: bool
    states: str = ""  # the BMC's event states as it words them, for the snapshot and the logs


@dataclass(frozen=True, slots=True)
class HostPsuPower:
    """The power one supply draws from its feed, or delivers where that is all its BMC or PMBus chip reports."""

    psu: str  # the name gpuwatch_host_psu_up has for the same supply (BMC), or the PMBus chip's label
    watts: float
    sensor: str = ""  # what it was read from: the BMC's sensor name, or the chip's pin/poutN


@dataclass(frozen=True, slots=True)
class HostSample:
    """One read of one host source (hwmon or ipmi); empty on a machine without that source (VMs, cloud nodes)."""

    source: HostSourceName
    timestamp: float
    voltages: tuple[HostVoltage, ...] = ()
    psus: tuple[HostPsu, ...] = ()
    temperatures: tuple[HostReadingValue, ...] = ()
    fans: tuple[HostReadingValue, ...] = ()
    psu_power: tuple[HostPsuPower, ...] = ()
    # True: the supplies left cannot carry the node if one more fails (the BMC's redundancy sensor, else two or more
    # supplies known and one not up); None: this source cannot tell.
    psu_redundancy_lost: bool | None = None
