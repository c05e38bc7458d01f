"""The metric catalogue: every name, type, help text and label set that gpuwatch exports, in one table.

The families of the agent itself and of its vendor readings are listed here; a registered collector's own families
are declared in its module (FAMILIES, gpuwatch/registry.py names the modules) and joined to these, in registry order.
docs/metrics.md is generated from the result (python docs/generate.py); a test holds it to the names first agreed
(tests/fixtures/spec-names.json): add metrics, never rename one. Code refers to metrics through ``CATALOGUE[name]`` so
a typo is a KeyError at start-up, not a silently missing series.
"""

from __future__ import annotations

import importlib

from gpuwatch.core.metric_spec import GPU, MetricSpec, MetricType
from gpuwatch.registry import COLLECTORS, REGISTRY

__all__ = ["CATALOGUE", "COLLECTORS", "MetricSpec"]


def _m(name: str, type_: MetricType, labels: tuple[str, ...], help_: str) -> MetricSpec:
    return MetricSpec(name, type_, labels, help_)


_SPECS: tuple[MetricSpec, ...] = (
    # Identity and self-health
    _m("gpuwatch_build_info", "gauge", ("version", "python_version"), "gpuwatch build; always 1."),
    _m(
        "gpuwatch_gpu_info",
        "gauge",
        (*GPU, "vendor", "model", "serial", "pci_bus_id", "driver_version", "vbios_version"),
        "Identity of a GPU; always 1, also for a GPU that was lost.",
    ),
    _m(
        "gpuwatch_gpu_health",
        "gauge",
        (*GPU, "state"),
        "The GPU's verdict: its state (healthy, degraded, unhealthy), always 1; only the current state has a series "
        "(docs/verdicts.md).",
    ),
    _m(
        "gpuwatch_gpu_recommended_action",
        "gauge",
        (*GPU, "action"),
        "The one action the GPU's verdict recommends (none, restart_app, reset_gpu, reboot_node, inspect_hardware, "
        "replace_gpu), always 1; only the current action has a series (docs/verdicts.md).",
    ),
    _m("gpuwatch_backend_up", "gauge", ("backend",), "1 when the vendor library is initialised, 0 while it fails."),
    _m("gpuwatch_gpu_up", "gauge", GPU, "1 when this GPU's last poll succeeded and is fresh; 0 when lost or stale."),
    _m(
        "gpuwatch_gpus_detected",
        "gauge",
        (),
        "GPUs the vendor libraries see now (while a poll hangs in a call, the ones they last answered for).",
    ),
    _m(
        "gpuwatch_state_dir_writable",
        "gauge",
        (),
        "1 while the agent's state files (known GPUs, probe baselines, supplies seen) can be written; 0 while they "
        "cannot (its filesystem or quota full, or read-only): state is then kept in memory only, lost at a restart.",
    ),
    _m(
        "gpuwatch_vendor_call_stuck_since_timestamp_seconds",
        "gauge",
        ("backend", "call", "gpu", "uuid"),
        "Present while a poll hangs in a vendor library call (2 poll intervals, at least 1 s): when the read of the "
        "GPU it is in began (gpu and uuid empty for a library-wide call).",
    ),
    _m(
        "gpuwatch_gpu_insufficient_power",
        "gauge",
        ("gpu", "pci_bus_id"),
        "1 for a GPU the library counts but cannot open: its external power cables are not properly attached.",
    ),
    _m(
        "gpuwatch_gpus_expected", "gauge", ("vendor",), "GPUs expected: from config, else that vendor's on the PCI bus."
    ),
    _m("gpuwatch_collector_success", "gauge", ("collector",), "1 when the collector's last run succeeded."),
    _m("gpuwatch_collector_duration_seconds", "gauge", ("collector",), "How long the collector's last run took."),
    _m(
        "gpuwatch_collector_errors_total",
        "counter",
        ("collector",),
        "Failed collector runs, from the first (gpuwatch_collector_success is each run's outcome).",
    ),
    _m(
        "gpuwatch_collector_last_run_timestamp_seconds",
        "gauge",
        ("collector",),
        "Unix time the collector's last run finished.",
    ),
    _m("gpuwatch_collector_interval_seconds", "gauge", ("collector",), "How often the collector is meant to run."),
    # Thermal
    _m("gpuwatch_gpu_temperature_celsius", "gauge", (*GPU, "sensor"), "GPU temperature (core = die/hotspot)."),
    _m(
        "gpuwatch_gpu_temperature_threshold_celsius",
        "gauge",
        (*GPU, "sensor", "threshold"),
        "The device's own temperature limits the rules compare against: core slowdown, memory max_operating; every "
        "limit the device declares (shutdown, core max_operating) with [compat] dcgm.",
    ),
    _m("gpuwatch_gpu_fan_speed_ratio", "gauge", (*GPU, "fan"), "Fan speed as a share of its maximum."),
    # Clocks
    _m(
        "gpuwatch_gpu_clock_hertz",
        "gauge",
        (*GPU, "clock"),
        "Current clock: sm, memory; graphics where it differs from sm (NVIDIA's are one clock); video with [nvml] "
        "video_clock.",
    ),
    _m(
        "gpuwatch_gpu_clock_max_hertz",
        "gauge",
        (*GPU, "clock"),
        "Maximum clock the device allows: sm; every clock's with [compat] dcgm.",
    ),
    # Power
    _m("gpuwatch_gpu_power_watts", "gauge", GPU, "Board power draw."),
    _m(
        "gpuwatch_gpu_power_limit_watts",
        "gauge",
        (*GPU, "limit"),
        "Power limits: enforced, default, and configured (the operator's intent, from the config); the range the "
        "driver allows, min and max, with [compat] dcgm.",
    ),
    _m("gpuwatch_gpu_energy_joules_total", "counter", GPU, "Energy since the driver loaded."),
    _m("gpuwatch_gpu_performance_state", "gauge", GPU, "NVIDIA P-state (0 = fastest)."),
    _m(
        "gpuwatch_gpu_power_supply_undersized",
        "gauge",
        GPU,
        "1 when the driver reports the GPU's power source as undersized.",
    ),
    # Throttling
    _m(
        "gpuwatch_gpu_throttle_active",
        "gauge",
        (*GPU, "reason"),
        "1 while the reason holds clocks down; served only while it does (how long it held: "
        "gpuwatch_gpu_throttle_seconds_total), every reason the GPU reports with [compat] dcgm.",
    ),
    _m(
        "gpuwatch_gpu_throttle_seconds_total",
        "counter",
        (*GPU, "reason"),
        "Time clocks were held down, from the device's counters where it keeps them, else accumulated per poll. "
        "The reasons the rules read (hw_power_brake, hw_slowdown, hw_thermal, sw_thermal) from 0, the others from "
        "their first second (every reason with [compat] dcgm).",
    ),
    _m(
        "gpuwatch_gpu_thermal_violation_seconds_total",
        "counter",
        GPU,
        "NVIDIA: time thermal constraints held clocks down since the driver loaded, as NVML counts it "
        "(NVML_FI_DEV_PERF_POLICY_THERMAL: software and hardware thermal slowdown as one counter); from its first "
        "second, or from 0 with [compat] dcgm.",
    ),
    # Utilization, memory, modes
    _m("gpuwatch_gpu_utilization_ratio", "gauge", GPU, "Compute busy share 0-1."),
    _m("gpuwatch_gpu_memory_utilization_ratio", "gauge", GPU, "Memory controller busy share 0-1."),
    _m("gpuwatch_gpu_memory_used_bytes", "gauge", GPU, "Device memory in use."),
    _m("gpuwatch_gpu_memory_total_bytes", "gauge", GPU, "Device memory in total."),
    _m("gpuwatch_gpu_processes", "gauge", GPU, "Compute processes on the GPU."),
    _m(
        "gpuwatch_gpu_mig_enabled",
        "gauge",
        GPU,
        "1 when MIG (or a non-default AMD compute partition) is active; served with [compat] dcgm (else "
        "gpuwatch_gpu_modes_info).",
    ),
    _m(
        "gpuwatch_gpu_partitions",
        "gauge",
        GPU,
        "AMD: compute partitions the GPU is split into (1 in SPX, 8 in CPX on an MI300X), on partition 0, whose gpu "
        "label names the GPU; each partition is a gpu of its own, and gpuwatch_gpus_detected counts the GPU once.",
    ),
    _m(
        "gpuwatch_gpu_ecc_enabled",
        "gauge",
        GPU,
        "Current ECC mode; served with [compat] dcgm (else gpuwatch_gpu_modes_info).",
    ),
    _m(
        "gpuwatch_gpu_persistence_mode_enabled",
        "gauge",
        GPU,
        "NVIDIA persistence mode; served with [compat] dcgm (else gpuwatch_gpu_modes_info).",
    ),
    _m(
        "gpuwatch_gpu_modes_info",
        "gauge",
        (*GPU, "ecc", "persistence_mode", "mig"),
        "The GPU's modes, always 1: ecc, persistence_mode and mig each 1 (enabled), 0 (disabled) or empty (not "
        "reported); a mode change is a new series. MIG: also a non-default AMD compute partition.",
    ),
    # MIG (docs/mig.md): a MIG-enabled GPU's MIG devices, labelled by the parent's gpu and uuid so that sums by
    # (gpu, uuid) add instances back up to their GPU.
    _m(
        "gpuwatch_mig_device_info",
        "gauge",
        (*GPU, "gpu_instance_id", "compute_instance_id", "mig_profile", "mig_uuid"),
        "1 per MIG device (a compute instance in a GPU instance) of a MIG-enabled GPU: its instance IDs, its profile "
        "as nvidia-smi names it (3g.40gb; 1c.3g.40gb for a compute instance smaller than its GPU instance) and its "
        "MIG-… UUID.",
    ),
    _m(
        "gpuwatch_mig_memory_used_bytes",
        "gauge",
        (*GPU, "gpu_instance_id", "compute_instance_id", "mig_profile"),
        "Memory used in the MIG device's GPU instance (compute instances of one GPU instance share it).",
    ),
    _m(
        "gpuwatch_mig_memory_total_bytes",
        "gauge",
        (*GPU, "gpu_instance_id", "compute_instance_id", "mig_profile"),
        "Memory of the MIG device's GPU instance.",
    ),
    _m(
        "gpuwatch_mig_sm_active_ratio",
        "gauge",
        (*GPU, "gpu_instance_id", "compute_instance_id", "mig_profile"),
        "Share 0-1 of its GPU instance's SM time with at least one warp resident, over the last poll interval "
        "(NVML GPM SM_UTIL of nvmlGpmMigSampleGet; compute instances of one GPU instance share it).",
    ),
    _m(
        "gpuwatch_mig_tensor_active_ratio",
        "gauge",
        (*GPU, "gpu_instance_id", "compute_instance_id", "mig_profile"),
        "Share 0-1 of time any tensor pipe of its GPU instance was active, over the last poll interval (NVML GPM "
        "ANY_TENSOR_UTIL of nvmlGpmMigSampleGet).",
    ),
    _m(
        "gpuwatch_mig_dram_active_ratio",
        "gauge",
        (*GPU, "gpu_instance_id", "compute_instance_id", "mig_profile"),
        "DRAM bandwidth its GPU instance used as a share 0-1 of the peak, over the last poll interval (NVML GPM "
        "DRAM_BW_UTIL of nvmlGpmMigSampleGet).",
    ),
    # Real utilization (docs/reading-the-metrics.md): what the silicon did, where utilization_ratio says only that a
    # kernel ran. NVIDIA: NVML GPM (Hopper and newer); absent, never 0, on GPUs that cannot measure it.
    _m(
        "gpuwatch_gpu_sm_active_ratio",
        "gauge",
        GPU,
        "Share 0-1 of SM time with at least one warp resident, averaged over all SMs, over the last poll interval "
        "(NVML GPM SM_UTIL).",
    ),
    _m(
        "gpuwatch_gpu_sm_occupancy_ratio",
        "gauge",
        GPU,
        "Resident warps as a share 0-1 of the SMs' maximum, over the last poll interval (NVML GPM SM_OCCUPANCY).",
    ),
    _m(
        "gpuwatch_gpu_tensor_active_ratio",
        "gauge",
        GPU,
        "Share 0-1 of time any tensor pipe was active, over the last poll interval (NVML GPM ANY_TENSOR_UTIL).",
    ),
    _m(
        "gpuwatch_gpu_dram_active_ratio",
        "gauge",
        GPU,
        "DRAM bandwidth used as a share 0-1 of its peak, over the last poll interval (NVML GPM DRAM_BW_UTIL).",
    ),
    _m(
        "gpuwatch_gpu_pipe_active_ratio",
        "gauge",
        (*GPU, "pipe"),
        "Share 0-1 of time each SM pipe was active over the last poll interval: hmma, dmma, imma, dfma (tensor), "
        "fp64, fp32, fp16 (non-tensor), integer. Opt-in: [nvml] gpm_per_pipe (or [compat] dcgm).",
    ),
    _m(
        "gpuwatch_gpu_sm_active_seconds_total",
        "counter",
        GPU,
        "SM-active time: each poll interval times its SM active share, summed; rate() is the SM active share over "
        "any window.",
    ),
    _m(
        "gpuwatch_gpu_tensor_active_seconds_total",
        "counter",
        GPU,
        "Tensor-active time: each poll interval times its any-tensor share, summed; rate() is the tensor share.",
    ),
    _m(
        "gpuwatch_gpu_sm_cycles_total",
        "counter",
        GPU,
        "SM cycles elapsed since the GPU booted, the device's own counter (NVML 13.2+ GPM SM_CYCLES_ELAPSED).",
    ),
    _m(
        "gpuwatch_gpu_active_cycles_total",
        "counter",
        (*GPU, "pipe"),
        "Active SM cycles since boot by pipe (sm, tensor, hmma, dmma, imma, dfma, fp64, fp32, fp16, integer), the "
        "device's own counters (NVML 13.2+); rate() over rate(gpuwatch_gpu_sm_cycles_total) is the exact share. "
        "sm and tensor always, the other pipes with [nvml] gpm_per_pipe (or [compat] dcgm).",
    ),
    _m(
        "gpuwatch_gpu_pcie_bytes_total",
        "counter",
        (*GPU, "direction"),
        "PCIe traffic: rx into the GPU, tx out of it (the device's counter since boot where it has one, else its "
        "per-interval rate summed).",
    ),
    _m(
        "gpuwatch_gpu_nvlink_bytes_total",
        "counter",
        (*GPU, "link", "direction"),
        "NVLink/XGMI traffic per link: rx read by this GPU, tx written by it. Only for a link that misbehaved since "
        "the agent started, or every link with [nvml] nvlink_per_link; gpuwatch_gpu_nvlinks_bytes_total sums them.",
    ),
    # Errors and memory health
    _m(
        "gpuwatch_gpu_ecc_errors_total",
        "counter",
        (*GPU, "type"),
        "Lifetime ECC errors (aggregate): uncorrected and deferred from 0, corrected from its first (or from 0 with "
        "[compat] dcgm).",
    ),
    _m(
        "gpuwatch_gpu_remapped_rows_total",
        "counter",
        (*GPU, "cause"),
        "Remapped memory rows, from the first (or from 0 with [compat] dcgm).",
    ),
    _m("gpuwatch_gpu_row_remap_pending", "gauge", GPU, "1 when a GPU reset is needed to apply a row remap."),
    _m("gpuwatch_gpu_row_remap_failed", "gauge", GPU, "1 when a row remap failed."),
    _m("gpuwatch_gpu_retired_pages", "gauge", GPU, "Retired or bad memory pages."),
    _m(
        "gpuwatch_gpu_retired_pages_limit",
        "gauge",
        GPU,
        "AMD: bad pages past which the driver marks the GPU bad and refuses it at the next boot (its threshold).",
    ),
    _m(
        "gpuwatch_gpu_row_remap_banks",
        "gauge",
        (*GPU, "availability"),
        "Memory banks by spare rows left for remapping: max, high, partial, low, none; only the availabilities that "
        "hold banks.",
    ),
    _m(
        "gpuwatch_gpu_sram_ecc_threshold_exceeded",
        "gauge",
        GPU,
        "1 when on-die SRAM ECC errors passed the driver's threshold (NVIDIA: drain and reset, RMA if it repeats).",
    ),
    _m("gpuwatch_gpu_inforom_valid", "gauge", GPU, "1 when the InfoROM's checksums hold; 0 when it is corrupted."),
    _m(
        "gpuwatch_gpu_fabric_healthy",
        "gauge",
        GPU,
        "NVSwitch systems: 1 when the GPU completed fabric registration, 0 while it has not or failed.",
    ),
    _m(
        "gpuwatch_gpu_fabric_health",
        "gauge",
        (*GPU, "condition"),
        "NVSwitch systems: 1 while a fabric health condition holds (nvmlGpuFabricInfo health mask and summary): "
        "degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery, incorrect_configuration, "
        "unhealthy, limited_capacity; served only while it holds.",
    ),
    _m(
        "gpuwatch_gpu_recovery_action",
        "gauge",
        GPU,
        "Driver's requested recovery: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, 5 IMEX.",
    ),
    _m("gpuwatch_gpu_xid_errors_total", "counter", (*GPU, "xid"), "XID errors seen (NVML events and kernel log)."),
    _m(
        "gpuwatch_gpu_xid_last_timestamp_seconds",
        "gauge",
        (*GPU, "xid"),
        "Unix time that XID last happened (the event's own time).",
    ),
    _m("gpuwatch_gpu_reset_events_total", "counter", GPU, "GPU resets seen (AMD pre-reset events)."),
    _m(
        "gpuwatch_nvswitch_sxid_errors_total",
        "counter",
        ("pci_bus_id", "sxid"),
        "NVSwitch SXid errors in the kernel log since boot, by switch (PCI address) and code.",
    ),
    _m(
        "gpuwatch_nvswitch_sxid_last_timestamp_seconds",
        "gauge",
        ("pci_bus_id", "sxid"),
        "Unix time that SXid last happened (kernel time for the backlog read at start): a restart moves it not.",
    ),
    # PCIe and interconnect
    _m("gpuwatch_gpu_pcie_link_generation", "gauge", (*GPU, "link"), "PCIe generation: current, max."),
    _m("gpuwatch_gpu_pcie_link_width", "gauge", (*GPU, "link"), "PCIe lanes: current, max."),
    _m("gpuwatch_gpu_pcie_replays_total", "counter", GPU, "PCIe replays."),
    _m("gpuwatch_gpu_pcie_link_recoveries_total", "counter", GPU, "PCIe link retraining events."),
    _m(
        "gpuwatch_gpu_pcie_errors_total",
        "counter",
        (*GPU, "type"),
        "PCIe errors the GPU counted: fatal, non_fatal (from 0), correctable (from its first) (AER classes).",
    ),
    _m(
        "gpuwatch_gpu_nvlink_up",
        "gauge",
        (*GPU, "link"),
        "1 when the NVLink/XGMI link is up. Only for a link that misbehaved since the agent started (down while the "
        "GPU expects it up, or an error counter grown), or every link with [nvml] nvlink_per_link.",
    ),
    _m(
        "gpuwatch_gpu_nvlink_errors_total",
        "counter",
        (*GPU, "link", "type"),
        "NVLink/XGMI link errors: replay, recovery, crc, ecc (DL counters); Blackwell's link fields add "
        "recovery_failed, effective (left after FEC) and symbol. Only for a link that misbehaved since the agent "
        "started, or every link with [nvml] nvlink_per_link; gpuwatch_gpu_nvlinks_errors_total sums them.",
    ),
    # NVLink per GPU (issue #34): what every GPU with links serves; the per-link families above only on demand.
    _m(
        "gpuwatch_gpu_nvlinks_up",
        "gauge",
        GPU,
        "The GPU's NVLink/XGMI links up now; below gpuwatch_gpu_nvlinks_expected while one is down.",
    ),
    _m(
        "gpuwatch_gpu_nvlinks_expected",
        "gauge",
        GPU,
        "The NVLink/XGMI links the GPU has: NVIDIA, the links whose state NVML answered for at start "
        "(nvmlDeviceGetNvLinkState); AMD, the XGMI links seen up or down since the agent started.",
    ),
    _m(
        "gpuwatch_gpu_nvlinks_errors_total",
        "counter",
        (*GPU, "type"),
        "NVLink/XGMI link errors summed over the GPU's links, by type (as gpuwatch_gpu_nvlink_errors_total): replay, "
        "recovery and recovery_failed from the agent's start, so increase() sees a first error; the others from "
        "their first.",
    ),
    _m(
        "gpuwatch_gpu_nvlinks_bytes_total",
        "counter",
        (*GPU, "direction"),
        "NVLink/XGMI traffic summed over the GPU's links: rx read by this GPU, tx written by it.",
    ),
    # Matmul probe
    _m(
        "gpuwatch_probe_info",
        "gauge",
        (*GPU, "engine", "engine_version", "blas_version", "dtype", "shape"),
        "What the probe ran with; always 1.",
    ),
    _m("gpuwatch_probe_flops", "gauge", (*GPU, "dtype"), "Median throughput of the last successful probe."),
    _m("gpuwatch_probe_baseline_flops", "gauge", (*GPU, "dtype"), "This GPU's own healthy probe throughput."),
    _m(
        "gpuwatch_probe_baseline_previous_flops",
        "gauge",
        (*GPU, "dtype"),
        "The GPU's baseline before its current one (a new driver, engine, BLAS or power limit started a new one).",
    ),
    _m("gpuwatch_probe_spread_ratio", "gauge", (*GPU, "dtype"), "(p90 - p10) / median of the last probe."),
    _m("gpuwatch_probe_h2d_bytes_per_second", "gauge", GPU, "Pinned host-to-device copy bandwidth."),
    _m("gpuwatch_probe_d2h_bytes_per_second", "gauge", GPU, "Pinned device-to-host copy bandwidth."),
    _m(
        "gpuwatch_probe_runs_total",
        "counter",
        (*GPU, "result"),
        "Probe runs by result: ok, failed and timeout from 0, the others from their first.",
    ),
    _m(
        "gpuwatch_probe_compute_errors_total",
        "counter",
        GPU,
        "Probes whose result was wrong: the last matmul's column checksums disagreed beyond rounding (from 0 for every "
        "GPU the probe runs on).",
    ),
    _m("gpuwatch_probe_last_success_timestamp_seconds", "gauge", GPU, "Unix time of the last successful probe."),
    _m("gpuwatch_probe_interval_seconds", "gauge", (), "The configured probe interval."),
    _m("gpuwatch_probe_duration_seconds", "gauge", GPU, "GPU time the last probe measured."),
    _m("gpuwatch_probe_power_capped", "gauge", GPU, "1 when the last probe reached the power limit."),
    _m("gpuwatch_probe_sm_clock_hertz", "gauge", GPU, "Mean SM clock during the last probe."),
    _m("gpuwatch_probe_power_watts", "gauge", GPU, "Mean power during the last probe."),
    _m("gpuwatch_probe_temperature_celsius", "gauge", GPU, "Peak core temperature during the last probe."),
    # Host power delivery and sensors
    _m("gpuwatch_host_voltage_volts", "gauge", ("chip", "sensor"), "Supply rail voltage."),
    _m(
        "gpuwatch_host_voltage_nominal_volts",
        "gauge",
        ("chip", "sensor"),
        "The rail's nominal voltage: from its name or sensor map; for a PMBus output (vout1), the standard rail "
        "(12, 54, 48, 5, 3.3 V) within 20 % of its reading.",
    ),
    _m(
        "gpuwatch_host_voltage_min_volts",
        "gauge",
        ("chip", "sensor"),
        "The rail's lower limit, signed like the rail (judge by magnitude): the warning limit the chip, BMC or "
        "sensor map declares (PMBus VOUT_UV_WARN_LIMIT, IPMI lower non-critical), else its critical one, else the "
        "nominal less its ATX tolerance (5 %, 10 % on negative rails).",
    ),
    _m(
        "gpuwatch_host_voltage_alarm",
        "gauge",
        ("chip", "sensor", "limit"),
        "1 while the chip's alarm flag for the rail is raised (hwmon inX_<limit>_alarm: min, lcrit, max, crit; any: "
        "a single inX_alarm), else 0; only for alarm flags the chip has.",
    ),
    _m("gpuwatch_host_psu_up", "gauge", ("psu",), "1 = power supply present and OK."),
    _m(
        "gpuwatch_host_psu_power_watts",
        "gauge",
        ("psu",),
        "Power the supply draws from its feed (a BMC's PSU input-power sensor, PMBus READ_PIN), else the power it "
        "delivers where that is all the BMC or chip reports; psu as on gpuwatch_host_psu_up for a BMC's supplies, "
        "the chip label for a PMBus supply read through hwmon.",
    ),
    _m(
        "gpuwatch_host_psu_redundancy_lost",
        "gauge",
        (),
        "1 when power-supply redundancy is lost: the BMC's redundancy sensor (Redundancy Lost, Non-redundant), "
        "else two or more supplies known and one not up; 0 when redundant; absent when neither tells.",
    ),
    _m("gpuwatch_host_temperature_celsius", "gauge", ("chip", "sensor"), "Host temperature sensor."),
    _m("gpuwatch_host_fan_rpm", "gauge", ("chip", "sensor"), "Host fan speed."),
)


def _collector_families() -> tuple[MetricSpec, ...]:
    """The families the registered collectors declare in their modules, in registry order."""
    found: list[MetricSpec] = []
    for registration in REGISTRY:
        for spec in getattr(importlib.import_module(registration.module), "FAMILIES", ()):
            if spec not in found:  # siblings may share a module
                found.append(spec)
    return tuple(found)


CATALOGUE: dict[str, MetricSpec] = {spec.name: spec for spec in (*_SPECS, *_collector_families())}
