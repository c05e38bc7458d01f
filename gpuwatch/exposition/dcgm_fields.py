"""dcgm-exporter's metric names, one line per DCGM field, each read from one of gpuwatch's own metric families.

The compatibility exposition (`[compat] dcgm = true`, gpuwatch/exposition/dcgm_compat.py) applies this table to the
families gpuwatch renders anyway, so it follows whatever the backends read; a source that is absent leaves its field
absent.

Sources (learnt from, not copied):
- names, types and help texts as dcgm-exporter writes them: NVIDIA/dcgm-exporter tag 4.5.3-4.8.2 (commit 691c927),
  etc/default-counters.csv (lines cited per field as ``csv:N``) and etc/dcp-metrics-included.csv (``dcp:N``);
- units and meaning of each field: DCGM's dcgm_fields.h as vendored by NVIDIA/go-dcgm (commit b7fa315),
  pkg/dcgm/dcgm_fields.h (``h:N``), whose help text is used for fields the CSVs do not list.
Units: dcgm-exporter writes DCGM's values as they are: clocks in MHz, framebuffer in MiB, energy in mJ, violation
times in ns, GPU_UTIL and MEM_COPY_UTIL in percent 0-100, the DCGM_FI_PROF_* fields as ratios 0-1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DcgmType = Literal["gauge", "counter"]

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DcgmField:
    """One DCGM field: its value is `scale` x the gpuwatch `source` sample of the same GPU whose labels include
    `select`; `sum_over` adds up the samples that differ only in that label (per-link counters to a total).
    `whole`: DCGM keeps the field as an int64 (dcgm_fields.h's DCGM_FT_INT64 fields), so the value is rounded to one:
    joules x 1000 gives 4129100.9999999995, DCGM's mJ are 4129101."""

    name: str
    type: DcgmType
    help: str
    source: str
    select: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    sum_over: str = ""
    whole: bool = True


def _f(
    name: str,
    type_: DcgmType,
    help_: str,
    source: str,
    select: dict[str, str] | None = None,
    scale: float = 1.0,
    sum_over: str = "",
) -> DcgmField:
    # DCGM_FT_DOUBLE fields: power and its limits (W), the profiling ratios; every other one here is an int64.
    whole = not (name.startswith("DCGM_FI_PROF_") or ("POWER" in name and "VIOLATION" not in name))
    return DcgmField(name, type_, help_, source, tuple(sorted((select or {}).items())), scale, sum_over, whole)


_TEMP = "gpuwatch_gpu_temperature_celsius"
_THRESHOLD = "gpuwatch_gpu_temperature_threshold_celsius"
_CLOCK = "gpuwatch_gpu_clock_hertz"
_CLOCK_MAX = "gpuwatch_gpu_clock_max_hertz"
_LIMIT = "gpuwatch_gpu_power_limit_watts"
_THROTTLE = "gpuwatch_gpu_throttle_seconds_total"
_NVLINK = "gpuwatch_gpu_nvlinks_errors_total"  # already summed over the GPU's links (gpuwatch/state/nvlinks.py)
_PIPE = "gpuwatch_gpu_pipe_active_ratio"  # GPM (issue 17, branch gpm): absent on GPUs and agents without it

FIELDS: tuple[DcgmField, ...] = (
    # Clocks (csv:6-7, h:558 h:564: MHz; h:598 h:604 the maxima)
    _f("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _CLOCK, {"clock": "sm"}, 1e-6),
    _f("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", _CLOCK, {"clock": "memory"}, 1e-6),
    _f(
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        "gauge",
        "Maximum supported SM clock for the device",
        _CLOCK_MAX,
        {"clock": "sm"},
        1e-6,
    ),
    _f(
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
        "gauge",
        "Maximum supported Memory clock for the device",
        _CLOCK_MAX,
        {"clock": "memory"},
        1e-6,
    ),
    # Temperature (csv:10-11, degrees C; h:3733-3734 thresholds)
    _f("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", _TEMP, {"sensor": "memory"}),
    _f("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _TEMP, {"sensor": "core"}),
    _f(
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "gauge",
        "Slowdown temperature for the device",
        _THRESHOLD,
        {"sensor": "core", "threshold": "slowdown"},
    ),
    _f(
        "DCGM_FI_DEV_SHUTDOWN_TEMP",
        "gauge",
        "Shutdown temperature for the device",
        _THRESHOLD,
        {"sensor": "core", "threshold": "shutdown"},
    ),
    # Power (csv:14 W; csv:15 and h:656 mJ since the driver loaded; h:3735-3739 limits in W)
    _f("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "gpuwatch_gpu_power_watts"),
    _f(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "gpuwatch_gpu_energy_joules_total",
        scale=1000,
    ),
    _f(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Effective power limit that the driver enforces after taking into account all limiters",
        _LIMIT,
        {"limit": "enforced"},
    ),
    _f(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
        "gauge",
        "Default power management limit for the device",
        _LIMIT,
        {"limit": "default"},
    ),
    _f(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN",
        "gauge",
        "Minimum power management limit for the device",
        _LIMIT,
        {"limit": "min"},
    ),
    _f(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",
        "gauge",
        "Maximum power management limit for the device",
        _LIMIT,
        {"limit": "max"},
    ),
    _f(
        "DCGM_FI_DEV_PSTATE",
        "gauge",
        "Performance state (P-State) 0-15. 0=highest",
        "gpuwatch_gpu_performance_state",
    ),
    # PCIe (csv:20; h:824-839)
    _f(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries.",
        "gpuwatch_gpu_pcie_replays_total",
    ),
    _f(
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "gauge",
        "PCIe Current Link Generation",
        "gpuwatch_gpu_pcie_link_generation",
        {"link": "current"},
    ),
    _f(
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "gauge",
        "PCIe Current Link Width",
        "gpuwatch_gpu_pcie_link_width",
        {"link": "current"},
    ),
    _f(
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "gauge",
        "PCIe Max Link Generation",
        "gpuwatch_gpu_pcie_link_generation",
        {"link": "max"},
    ),
    _f(
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "gauge",
        "PCIe Max Link Width",
        "gpuwatch_gpu_pcie_link_width",
        {"link": "max"},
    ),
    # Utilization (csv:23-24: percent 0-100; NVML's rates, the same call gpuwatch divides by 100)
    _f("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "gpuwatch_gpu_utilization_ratio", scale=100),
    _f(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        "gpuwatch_gpu_memory_utilization_ratio",
        scale=100,
    ),
    # Violations (csv:30-35, h:844-869: ns; the same NVML counters gpuwatch reads as seconds, per reason)
    _f(
        "DCGM_FI_DEV_POWER_VIOLATION",
        "counter",
        "Throttling duration due to power constraints (in ns).",
        _THROTTLE,
        {"reason": "sw_power_cap"},
        1e9,
    ),
    # DCGM reads NVML_FI_DEV_PERF_POLICY_THERMAL (75) for it (dcgmlib/src/dcgm_fields.cpp 2383-2388, DCGM 4.6.0):
    # the combined thermal counter, not the software-thermal reason (whose own field is 269 from R580.82).
    _f(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
        "gpuwatch_gpu_thermal_violation_seconds_total",
        None,
        1e9,
    ),
    _f(
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        "counter",
        "Throttling duration due to sync-boost constraints (in ns).",
        _THROTTLE,
        {"reason": "sync_boost"},
        1e9,
    ),
    _f(
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "counter",
        "Throttling duration due to board limit constraints (in ns).",
        _THROTTLE,
        {"reason": "board_limit"},
        1e9,
    ),
    _f(
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        "counter",
        "Throttling duration due to low utilization (in ns).",
        _THROTTLE,
        {"reason": "low_utilization"},
        1e9,
    ),
    _f(
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "counter",
        "Throttling duration due to reliability constraints (in ns).",
        _THROTTLE,
        {"reason": "reliability"},
        1e9,
    ),
    # Memory usage (csv:45-46, h:884-899: MiB)
    _f(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        "gpuwatch_gpu_memory_used_bytes",
        scale=1 / MIB,
    ),
    _f(
        "DCGM_FI_DEV_FB_TOTAL",
        "gauge",
        "Total Frame Buffer of the GPU in MB",
        "gpuwatch_gpu_memory_total_bytes",
        scale=1 / MIB,
    ),
    # ECC, aggregate (persistent) counts (csv:52-53, h:948-954): SBE = corrected, DBE = uncorrected
    _f(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
        "gpuwatch_gpu_ecc_errors_total",
        {"type": "corrected"},
    ),
    _f(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
        "gpuwatch_gpu_ecc_errors_total",
        {"type": "uncorrected"},
    ),
    # NVLink, totals over every link (csv:63-64, h:3844-3845)
    _f(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        _NVLINK,
        {"type": "replay"},
    ),
    _f(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink recovery errors.",
        _NVLINK,
        {"type": "recovery"},
    ),
    # Remapped rows (csv:72-74; h:1286 pending)
    _f(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "gpuwatch_gpu_remapped_rows_total",
        {"cause": "uncorrectable"},
    ),
    _f(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "gpuwatch_gpu_remapped_rows_total",
        {"cause": "correctable"},
    ),
    _f(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        "gpuwatch_gpu_row_remap_failed",
    ),
    _f(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "Whether remapping of rows is pending",
        "gpuwatch_gpu_row_remap_pending",
    ),
    # Modes (h:415-421, h:3751): booleans 0/1
    _f(
        "DCGM_FI_DEV_PERSISTENCE_MODE",
        "gauge",
        "Persistence mode for the device",
        "gpuwatch_gpu_persistence_mode_enabled",
    ),
    _f("DCGM_FI_DEV_ECC_CURRENT", "gauge", "Current ECC mode for the device", "gpuwatch_gpu_ecc_enabled"),
    _f("DCGM_FI_DEV_MIG_MODE", "gauge", "MIG mode for the device", "gpuwatch_gpu_mig_enabled"),
    # Profiling (dcp:82-88, h:2551-2639): ratios 0-1, from NVML GPM (the gpm branch's names)
    _f(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        "gpuwatch_gpu_sm_active_ratio",
    ),
    _f(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        "gpuwatch_gpu_sm_occupancy_ratio",
    ),
    _f(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "gpuwatch_gpu_tensor_active_ratio",
    ),
    _f(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "gpuwatch_gpu_dram_active_ratio",
    ),
    _f("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.", _PIPE, {"pipe": "fp64"}),
    _f("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.", _PIPE, {"pipe": "fp32"}),
    _f("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.", _PIPE, {"pipe": "fp16"}),
    _f(
        "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
        "gauge",
        "The ratio of cycles the tensor (HMMA) pipe is active (off the peak sustained elapsed cycles)",
        _PIPE,
        {"pipe": "hmma"},
    ),
    _f(
        "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
        "gauge",
        "The ratio of cycles the tensor (IMMA) pipe is active (off the peak sustained elapsed cycles)",
        _PIPE,
        {"pipe": "imma"},
    ),
    _f(
        "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
        "gauge",
        "The ratio of cycles the tensor (DFMA) pipe is active (off the peak sustained elapsed cycles)",
        _PIPE,
        {"pipe": "dfma"},
    ),
    _f(
        "DCGM_FI_PROF_PIPE_INT_ACTIVE",
        "gauge",
        "Ratio of cycles the integer pipe is active.",
        _PIPE,
        {"pipe": "integer"},
    ),
)

# Fields computed from more than one sample (gpuwatch/exposition/dcgm_compat.py): name -> (type, help as dcgm-exporter
# writes it).
DERIVED: dict[str, tuple[DcgmType, str]] = {
    # csv:45, h:889: total - used. Where NVML reports reserved memory (nvmlMemory_v2), DCGM's free leaves it out too,
    # so this reads higher than dcgm-exporter's by DCGM_FI_DEV_FB_RESERVED, which gpuwatch does not read.
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    # csv:29, h:819: the value is the code of the last XID (not a count), with err_code and err_msg labels
    # (dcgm-exporter internal/pkg/collector/gpu_collector.go:324-332); absent until the GPU's first XID.
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    # h:587-592: the bitmask of DCGM_CLOCKS_EVENT_REASON_* (h:107-154) now active; the older name is the same field.
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)",
    ),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)",
    ),
}

# DCGM_CLOCKS_EVENT_REASON_* bits (h:107-154), by gpuwatch's throttle reason (gpuwatch/backends/nvml_tables.py).
CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock": 0x100,
}

NAMES: frozenset[str] = frozenset({f.name for f in FIELDS} | set(DERIVED))
