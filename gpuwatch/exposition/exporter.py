"""The Prometheus collector: fresh metric families from a store snapshot on every scrape.

Nothing here touches a vendor library or the disk, so a scrape costs microseconds per series and cannot hang.
"""

from __future__ import annotations

import functools
import importlib
import platform
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwatch import __version__
from gpuwatch.collectors.amdsmi import AmdsmiSection
from gpuwatch.collectors.nvml import NvmlSection
from gpuwatch.config.settings import Config
from gpuwatch.core.metric_spec import ExportDetail, SampleSink
from gpuwatch.core.model import GpuIdentity, GpuSample
from gpuwatch.core.xid import xid_label
from gpuwatch.exposition.catalogue import CATALOGUE
from gpuwatch.exposition.fast import Row
from gpuwatch.judge.gpu_verdict import gpu_verdicts
from gpuwatch.registry import REGISTRY
from gpuwatch.state.nvlinks import LinkWatch, NvlinkTotals
from gpuwatch.state.probebook import RESULTS, ProbeView
from gpuwatch.state.store import SampleStore, StoreSnapshot


class _Out(Protocol):
    def add(self, name: str, labels: tuple[str, ...], value: float | int | bool | None) -> None: ...

    def add_each(self, name: str, head: tuple[str, ...], values: dict[Any, Any]) -> None: ...

    def add_row(self, row: Row, labels: tuple[str, ...], values: tuple[float | int | bool | None, ...]) -> None: ...


class _Families:
    """Creates each family from the catalogue on first use and yields only those that got samples."""

    def __init__(self) -> None:
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, name: str, labels: tuple[str, ...], value: float | int | bool | None) -> None:
        if value is None:
            return
        family = self._families.get(name)
        if family is None:
            spec = CATALOGUE[name]
            cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
            family = cls(name, spec.help, labels=list(spec.labels))
            self._families[name] = family
        family.add_metric(list(labels), float(value))

    def add_each(self, name: str, head: tuple[str, ...], values: dict[Any, Any]) -> None:
        """A sample per item, in key order: labels `head` + the key (a label value, or a tuple of them)."""
        for key, value in sorted(values.items()):
            self.add(name, head + (key if isinstance(key, tuple) else (key,)), value)

    def add_row(self, row: Row, labels: tuple[str, ...], values: tuple[float | int | bool | None, ...]) -> None:
        for name, value in zip(row.names, values, strict=True):
            self.add(name, labels, value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def export_detail(config: Config) -> ExportDetail:
    """What the configuration asks the exposition to serve beyond its default (docs/cost-and-sizing.md)."""
    per_link = {
        vendor
        for vendor, asked in (
            ("nvidia", config.section(NvmlSection).nvlink_per_link),
            ("amd", config.section(AmdsmiSection).xgmi_per_link),
        )
        if asked
    }
    return ExportDetail(
        nvlink_per_link=frozenset(per_link),
        per_pipe=config.section(NvmlSection).gpm_per_pipe or config.compat.dcgm,
        video_clock=config.section(NvmlSection).video_clock or config.compat.dcgm,
        dcgm=config.compat.dcgm,
    )


# Families derived from gpuwatch's own (gpuwatch.exposition.dcgm_compat: dcgm-exporter's names), rendered after them.
Extension = Callable[[list[Metric]], list[Metric]]


class SnapshotExporter(Collector):
    """prometheus_client's custom collector: every family of a fresh store snapshot at each collect()."""

    def __init__(self, store: SampleStore, extension: Extension | None = None) -> None:
        self._store = store
        self._extension = extension

    def collect(self) -> Iterator[Metric]:
        yield from families(self._store.snapshot(), self._extension)


def families(snap: StoreSnapshot, extension: Extension | None = None) -> Iterator[Metric]:
    """Every family of one store snapshot as prometheus_client objects (for the library's encoders), and the
    `extension`'s made of them ([compat])."""
    out = _Families()
    export(snap, out)
    own = list(out)
    yield from own
    if extension is not None:
        yield from extension(own)


def export(snap: StoreSnapshot, out: _Out) -> None:
    """Every sample of one store snapshot into `out`, family by family in a fixed order (the exposition's order)."""
    out.add("gpuwatch_build_info", (__version__, platform.python_version()), 1)
    _self_health(snap, out)
    _verdicts(snap, out)
    for identity in sorted(snap.identities.values(), key=lambda i: (i.index, i.uuid)):
        gpu = (str(identity.index), identity.uuid)
        _info(identity, out)
        sample = snap.fresh(identity.uuid)
        out.add("gpuwatch_gpu_up", gpu, sample is not None)
        # Events, not readings: an XID 79 or a reset usually comes with the GPU going lost, and must stay seen.
        for (uuid, xid), count in sorted(snap.xids.items()):
            if uuid == identity.uuid:
                out.add("gpuwatch_gpu_xid_errors_total", (*gpu, xid_label(xid)), count.total)
                out.add("gpuwatch_gpu_xid_last_timestamp_seconds", (*gpu, xid_label(xid)), count.last_timestamp)
        resets = snap.resets.get(identity.uuid)
        if resets is not None and (sample is not None or resets > 0):  # a lost GPU keeps only real events
            out.add("gpuwatch_gpu_reset_events_total", gpu, resets)
        if sample is None:
            continue
        links = snap.nvlinks.get(identity.uuid) or LinkWatch().update(sample)  # a snapshot no store's poll made
        every_link = identity.vendor in snap.detail.nvlink_per_link
        _readings(gpu, sample, snap.configured_power_limit_watts, snap.detail, out)
        _nvlinks(gpu, sample, links, every_link, out)
        _mig(gpu, sample, out)
        whole = snap.detail.dcgm
        throttled = snap.throttle_seconds.get(identity.uuid, {})
        out.add_each("gpuwatch_gpu_throttle_seconds_total", gpu, _counted(throttled, _RULES_THROTTLE, whole))
        violation = sample.thermal_violation_seconds
        out.add_row(_THERMAL_VIOLATION, gpu, (violation if whole or violation else None,))
        export_probe(gpu, identity.uuid, snap.probe, out, whole)
        for name, export_gpu in _collector_exports("export_gpu"):
            export_gpu(snap.parts.get(name), gpu, out)
    export_interval(snap.probe, out)
    _host(snap, out)
    for name, export_node in _collector_exports("export_node"):
        export_node(snap.parts.get(name), out)


@functools.cache
def _collector_exports(hook: str) -> tuple[tuple[str, Callable[..., None]], ...]:
    """(collector, its module's `hook`) for each registered collector whose module exports families of its own:
    ``export_gpu(part, gpu_labels, out)`` for each fresh GPU, after its readings, or ``export_node(part, out)`` once,
    last; `part` is what the collector stored (SampleStore.set_part), None before its first run."""
    found = []
    for registration in REGISTRY:
        export = getattr(importlib.import_module(registration.module), hook, None)
        if export is not None:
            found.append((registration.name, export))
    return tuple(found)


GpuExport = Callable[[Any, tuple[str, str], SampleSink], None]
NodeExport = Callable[[Any, SampleSink], None]


def _self_health(snap: StoreSnapshot, out: _Out) -> None:
    for backend, (up, _message) in sorted(snap.backends.items()):
        out.add("gpuwatch_backend_up", (backend,), up)
    # While a poll hangs in a vendor call its GPUs' readings go stale, but the library has not lost them: the GPUs it
    # last answered for stay detected, so a hang never reads as missing GPUs (GpuwatchVendorCallHung names it), nor
    # does the moment after it returns, before the next poll has read them.
    hung = bool(snap.stuck_calls or snap.thawing_calls)
    detected = {
        _physical_gpu(identity)
        for uuid, identity in snap.identities.items()
        if snap.fresh(uuid) is not None or (hung and uuid in snap.samples and uuid not in snap.gpu_errors)
    }
    out.add("gpuwatch_gpus_detected", (), len(detected) + len(snap.unusable))  # present, if unusable
    out.add("gpuwatch_state_dir_writable", (), snap.state_dir_writable)  # None (not an agent's store): no series
    for call in snap.stuck_calls:
        labels = (call.backend, call.call, call.gpu, call.uuid)
        out.add("gpuwatch_vendor_call_stuck_since_timestamp_seconds", labels, call.since)
    for (switch, sxid), count in sorted(snap.sxids.items()):
        out.add("gpuwatch_nvswitch_sxid_errors_total", (switch, xid_label(sxid)), count.total)
        out.add("gpuwatch_nvswitch_sxid_last_timestamp_seconds", (switch, xid_label(sxid)), count.last_timestamp)
    for gpu in snap.unusable:
        if gpu.reason == "insufficient_power":
            out.add("gpuwatch_gpu_insufficient_power", (str(gpu.index), gpu.pci_bus_id), 1)
    for vendor, expected in sorted(snap.gpus_expected.items()):
        out.add("gpuwatch_gpus_expected", (vendor,), expected)
    for name, status in sorted(snap.collectors.items()):
        ran = status.success is not None
        # Before its first run finishes, the time it was started: a first run that hangs ages like any other.
        last_run = status.last_run_timestamp if status.last_run_timestamp is not None else status.registered_timestamp
        # Failures are counted from the first: no rule reads the count (gpuwatch_collector_success is each run's
        # outcome, GpuwatchCollectorFailing's), so a healthy node serves no zeros for it (the series budget).
        out.add_row(
            _COLLECTOR,
            (name,),
            (
                status.interval_seconds,
                status.errors_total or None,
                status.success,
                status.duration_seconds if ran else None,
                last_run,
            ),
        )


def _verdicts(snap: StoreSnapshot, out: _Out) -> None:
    """Each GPU's verdict: its state and its action, each one series at 1 (docs/verdicts.md). The states and the
    actions are exclusive sets, so the others' zeros say nothing a rule's `== 1` or a `max by (state)` needs: 7 series
    a GPU saved (docs/cost-and-sizing.md, "The series budget"). A state change ends one series and starts another."""
    for verdict in gpu_verdicts(snap):
        gpu = (str(verdict.index), verdict.uuid)
        out.add("gpuwatch_gpu_health", (*gpu, verdict.state), 1)
        out.add("gpuwatch_gpu_recommended_action", (*gpu, verdict.action), 1)


_COLLECTOR = Row(
    "gpuwatch_collector_interval_seconds",
    "gpuwatch_collector_errors_total",
    "gpuwatch_collector_success",
    "gpuwatch_collector_duration_seconds",
    "gpuwatch_collector_last_run_timestamp_seconds",
)


def _physical_gpu(identity: GpuIdentity) -> tuple[str, str]:
    """The GPU a `gpu` is part of: its PCI device. AMD compute partitions (CPX: 8 per MI300X) are a `gpu` each, at
    their GPU's PCI address with the partition in the function bits (kfd_topology.c: location_id |= node_id)."""
    device = identity.pci_bus_id.lower().rpartition(".")[0]
    return (identity.vendor, device) if device else (identity.vendor, identity.uuid)


_RAIL = Row("gpuwatch_host_voltage_volts", "gpuwatch_host_voltage_nominal_volts", "gpuwatch_host_voltage_min_volts")


def _host(snap: StoreSnapshot, out: _Out) -> None:
    """Host rails, supplies, temperatures and fans of every fresh host source (hwmon, ipmi)."""
    powered: set[str] = set()
    for sample in snap.host:
        for v in sample.voltages:
            out.add_row(_RAIL, (v.chip, v.sensor), (v.volts, v.nominal_volts, v.min_volts))
            for limit, raised in v.alarms:
                out.add("gpuwatch_host_voltage_alarm", (v.chip, v.sensor, limit), raised)
        for psu in sample.psus:
            out.add("gpuwatch_host_psu_up", (psu.psu,), psu.up)
        for power in sample.psu_power:
            if power.psu not in powered:  # one series per supply, whichever source named it first
                powered.add(power.psu)
                out.add("gpuwatch_host_psu_power_watts", (power.psu,), power.watts)
        for t in sample.temperatures:
            out.add("gpuwatch_host_temperature_celsius", (t.chip, t.sensor), t.value)
        for f in sample.fans:
            out.add("gpuwatch_host_fan_rpm", (f.chip, f.sensor), f.value)
    verdicts = [s.psu_redundancy_lost for s in snap.host if s.psu_redundancy_lost is not None]
    out.add("gpuwatch_host_psu_redundancy_lost", (), any(verdicts) if verdicts else None)


def _info(identity: GpuIdentity, out: _Out) -> None:
    labels = (
        str(identity.index),
        identity.uuid,
        identity.vendor,
        identity.model,
        identity.serial,
        identity.pci_bus_id,
        identity.driver_version,
        identity.vbios_version,
    )
    out.add("gpuwatch_gpu_info", labels, 1)


# A GPU's scalar readings, in the exposition's order between its dict-shaped ones (`_readings`).
_POWER = Row("gpuwatch_gpu_power_watts")
_ENERGY = Row(
    "gpuwatch_gpu_energy_joules_total", "gpuwatch_gpu_performance_state", "gpuwatch_gpu_power_supply_undersized"
)
_USAGE = Row(
    "gpuwatch_gpu_utilization_ratio",
    "gpuwatch_gpu_memory_utilization_ratio",
    "gpuwatch_gpu_memory_used_bytes",
    "gpuwatch_gpu_memory_total_bytes",
    "gpuwatch_gpu_processes",
    "gpuwatch_gpu_mig_enabled",
    "gpuwatch_gpu_partitions",
    "gpuwatch_gpu_ecc_enabled",
    "gpuwatch_gpu_persistence_mode_enabled",
)
_ROW_REMAP = Row(
    "gpuwatch_gpu_row_remap_pending",
    "gpuwatch_gpu_row_remap_failed",
    "gpuwatch_gpu_retired_pages",
    "gpuwatch_gpu_retired_pages_limit",
)
_HEALTH = Row(
    "gpuwatch_gpu_sram_ecc_threshold_exceeded",
    "gpuwatch_gpu_recovery_action",
    "gpuwatch_gpu_inforom_valid",
    "gpuwatch_gpu_fabric_healthy",
)
_PCIE = Row("gpuwatch_gpu_pcie_replays_total", "gpuwatch_gpu_pcie_link_recoveries_total")
_THERMAL_VIOLATION = Row("gpuwatch_gpu_thermal_violation_seconds_total")
_ACTIVE = Row(
    "gpuwatch_gpu_sm_active_ratio",
    "gpuwatch_gpu_sm_occupancy_ratio",
    "gpuwatch_gpu_tensor_active_ratio",
    "gpuwatch_gpu_dram_active_ratio",
)
_ACTIVE_TOTALS = Row(
    "gpuwatch_gpu_sm_active_seconds_total", "gpuwatch_gpu_tensor_active_seconds_total", "gpuwatch_gpu_sm_cycles_total"
)


# Constants no rule, dashboard or page reads, served only with [compat] dcgm (whose mapping reads some of them): a
# GPU's own temperature limits but the two the rules compare against, its maximum clocks but the SM's (the boards'
# clock share), the power limits' range. docs/cost-and-sizing.md, "The series budget".
_READ_THRESHOLDS = frozenset({("core", "slowdown"), ("memory", "max_operating")})
_READ_MAX_CLOCKS = frozenset({"sm"})
_UNREAD_LIMITS = frozenset({"min", "max"})


def _readings(
    gpu: tuple[str, str], s: GpuSample, configured_limit: float | None, detail: ExportDetail, out: _Out
) -> None:
    each, row = out.add_each, out.add_row
    whole = detail.dcgm
    each("gpuwatch_gpu_temperature_celsius", gpu, s.temperature_celsius)
    thresholds = s.temperature_threshold_celsius
    each(
        "gpuwatch_gpu_temperature_threshold_celsius",
        gpu,
        thresholds if whole else {k: v for k, v in thresholds.items() if k in _READ_THRESHOLDS},
    )
    each("gpuwatch_gpu_fan_speed_ratio", gpu, s.fan_speed_ratio)
    clocks = s.clock_hertz
    if not whole and "graphics" in clocks and clocks.get("graphics") == clocks.get("sm"):  # NVIDIA: one clock
        clocks = {k: v for k, v in clocks.items() if k != "graphics"}
    if not detail.video_clock and "video" in clocks:  # opt-in: [nvml] video_clock
        clocks = {k: v for k, v in clocks.items() if k != "video"}
    each("gpuwatch_gpu_clock_hertz", gpu, clocks)
    maxima = s.clock_max_hertz
    each(
        "gpuwatch_gpu_clock_max_hertz",
        gpu,
        maxima if whole else {k: v for k, v in maxima.items() if k in _READ_MAX_CLOCKS},
    )
    row(_POWER, gpu, (s.power_watts,))
    limits = s.power_limit_watts
    if not whole:
        limits = {k: v for k, v in limits.items() if k not in _UNREAD_LIMITS}
    if configured_limit is not None:
        limits = {**limits, "configured": configured_limit}
    each("gpuwatch_gpu_power_limit_watts", gpu, limits)
    row(_ENERGY, gpu, (s.energy_joules, s.performance_state, s.power_supply_undersized))
    # Only the reasons holding the clocks down now: the time each held is gpuwatch_gpu_throttle_seconds_total's, and
    # the rules and dashboards read `== 1` (docs/cost-and-sizing.md, "The series budget"). DCGM's clock event reasons
    # bitmask is 0, not absent, for a GPU that reports reasons and has none active: [compat] dcgm keeps the zeros.
    each("gpuwatch_gpu_throttle_active", gpu, s.throttle_active if detail.dcgm else _holding(s.throttle_active))
    pids = s.process_pids
    row(
        _USAGE,
        gpu,
        (
            s.utilization_ratio,
            s.memory_utilization_ratio,
            s.memory_used_bytes,
            s.memory_total_bytes,
            None if pids is None else len(pids),
            s.mig_enabled if whole else None,
            s.compute_partitions,
            s.ecc_enabled if whole else None,
            s.persistence_mode_enabled if whole else None,
        ),
    )
    # The modes, constants an operator sets, folded into one info series (a change is a new series): 3 -> 1.
    modes = (s.ecc_enabled, s.persistence_mode_enabled, s.mig_enabled)
    if any(mode is not None for mode in modes):
        out.add("gpuwatch_gpu_modes_info", (*gpu, *("" if m is None else str(int(m)) for m in modes)), 1)
    each("gpuwatch_gpu_ecc_errors_total", gpu, _counted(s.ecc_errors_total, _RULES_ECC, whole))
    each("gpuwatch_gpu_remapped_rows_total", gpu, _counted(s.remapped_rows_total, frozenset(), whole))
    row(_ROW_REMAP, gpu, (s.row_remap_pending, s.row_remap_failed, s.retired_pages, s.retired_pages_limit))
    # A histogram gauge (banks by spare rows left): only the buckets that hold banks. GpuRowRemapBanksLow sums
    # low|none > 0, which an empty bucket never adds to; a healthy GPU serves its one bucket, max.
    each("gpuwatch_gpu_row_remap_banks", gpu, {k: v for k, v in s.row_remap_banks.items() if v})
    row(_HEALTH, gpu, (s.sram_ecc_threshold_exceeded, s.recovery_action, s.inforom_valid, s.fabric_healthy))
    # A set of conditions that may hold together: only those that hold, at 1 (GpuFabricDegraded and the node board
    # read `== 1`); whether the fabric is read at all is gpuwatch_gpu_fabric_healthy's.
    each("gpuwatch_gpu_fabric_health", gpu, _holding(s.fabric_health))
    each("gpuwatch_gpu_pcie_link_generation", gpu, s.pcie_link_generation)
    each("gpuwatch_gpu_pcie_link_width", gpu, s.pcie_link_width)
    row(_PCIE, gpu, (s.pcie_replays_total, s.pcie_link_recoveries_total))
    each("gpuwatch_gpu_pcie_errors_total", gpu, _counted(s.pcie_errors_total, _RULES_PCIE, whole))
    _activity(gpu, s, detail.per_pipe, out)


# The per-type counters the rules read from 0, so that increase() and rate() see a first error: every other type is
# served from its first count (docs/cost-and-sizing.md, "The series budget"), or whole with [compat] dcgm.
_RULES_THROTTLE = frozenset({"hw_power_brake", "hw_slowdown", "hw_thermal", "sw_thermal"})  # GpuPowerBrakeSlowdown…
_RULES_ECC = frozenset({"uncorrected", "deferred"})  # GpuEccUncorrectable
_RULES_PCIE = frozenset({"fatal", "non_fatal"})  # GpuPcieFatalErrors, GpuPcieUncorrectableErrors
_RULES_NVLINK = frozenset({"replay", "recovery", "recovery_failed"})  # GpuNvlinkErrors (CRC: per link)
_RULES_PROBE = frozenset({"ok", "failed", "timeout"})  # GpuProbeFailing; compute errors: their own counter


def _counted(values: dict[Any, Any], from_zero: frozenset[str], whole: bool = False) -> dict[Any, Any]:
    """The per-type counters a rule reads from 0, and the others once they count something."""
    if whole:
        return values
    return {key: value for key, value in values.items() if value or key in from_zero}


def _holding(flags: dict[str, bool]) -> dict[str, bool]:
    """The flags that hold; a dict with none is served as no series at all."""
    return {key: True for key, on in flags.items() if on}


def _nvlinks(gpu: tuple[str, str], s: GpuSample, links: NvlinkTotals | None, every_link: bool, out: _Out) -> None:
    """NVLink/XGMI per GPU; per link only for the links that misbehaved since the agent started, or every link when
    the vendor's section asks (gpuwatch/state/nvlinks.py)."""
    if links is None:
        return
    out.add("gpuwatch_gpu_nvlinks_up", gpu, links.up)
    out.add("gpuwatch_gpu_nvlinks_expected", gpu, links.expected)
    out.add_each("gpuwatch_gpu_nvlinks_errors_total", gpu, _counted(links.errors_total, _RULES_NVLINK))
    out.add_each("gpuwatch_gpu_nvlinks_bytes_total", gpu, links.bytes_total)
    if not every_link and not links.misbehaved:
        return
    shown = links.misbehaved
    for link, up in sorted(s.nvlink_up.items(), key=_link_order):
        if every_link or link in shown:
            out.add("gpuwatch_gpu_nvlink_up", (*gpu, link), up)
    for (link, kind), count in sorted(s.nvlink_errors_total.items(), key=_link_order):
        if every_link or link in shown:
            out.add("gpuwatch_gpu_nvlink_errors_total", (*gpu, link, kind), count)
    for (link, direction), total in sorted(s.nvlink_bytes_total.items(), key=_link_order):
        if every_link or link in shown:
            out.add("gpuwatch_gpu_nvlink_bytes_total", (*gpu, link, direction), total)


def _mig(gpu: tuple[str, str], s: GpuSample, out: _Out) -> None:
    """A MIG-enabled GPU's MIG devices (docs/mig.md); nothing for a GPU without MIG."""
    for device in s.mig_devices:
        instance = (*gpu, str(device.gpu_instance_id), str(device.compute_instance_id), device.profile)
        out.add("gpuwatch_mig_device_info", (*instance, device.uuid), 1)
        out.add("gpuwatch_mig_memory_used_bytes", instance, device.memory_used_bytes)
        out.add("gpuwatch_mig_memory_total_bytes", instance, device.memory_total_bytes)
        out.add("gpuwatch_mig_sm_active_ratio", instance, device.sm_active_ratio)
        out.add("gpuwatch_mig_tensor_active_ratio", instance, device.tensor_active_ratio)
        out.add("gpuwatch_mig_dram_active_ratio", instance, device.dram_active_ratio)


def _link_order(item: tuple[Any, Any]) -> tuple[int, Any]:
    """Links in number order (2 before 10), whatever else the key holds."""
    key = item[0]
    link = key[0] if isinstance(key, tuple) else key
    return (len(link), key)


# Opt-in detail ([nvml] gpm_per_pipe): each SM pipe's activity. sm and tensor, the two shares the rules read, are
# served either way (gpuwatch_gpu_sm_active_ratio, _tensor_active_ratio and their cycle counters).
_PIPES_SERVED = frozenset({"sm", "tensor"})


def _activity(gpu: tuple[str, str], s: GpuSample, per_pipe: bool, out: _Out) -> None:
    """Real utilization: absent where the device cannot measure it (the backend leaves None and empty dicts)."""
    out.add_row(_ACTIVE, gpu, (s.sm_active_ratio, s.sm_occupancy_ratio, s.tensor_active_ratio, s.dram_active_ratio))
    if per_pipe:
        out.add_each("gpuwatch_gpu_pipe_active_ratio", gpu, s.pipe_active_ratio)
    seconds = s.active_seconds_total
    out.add_row(_ACTIVE_TOTALS, gpu, (seconds.get("sm"), seconds.get("tensor"), s.sm_cycles_total))
    cycles = s.active_cycles_total
    out.add_each(
        "gpuwatch_gpu_active_cycles_total",
        gpu,
        cycles if per_pipe else {k: v for k, v in cycles.items() if k in _PIPES_SERVED},
    )
    out.add_each("gpuwatch_gpu_pcie_bytes_total", gpu, s.pcie_bytes_total)


_PROBE_SPEED = Row("gpuwatch_probe_flops", "gpuwatch_probe_spread_ratio")
_PROBE_RUN = Row(
    "gpuwatch_probe_h2d_bytes_per_second",
    "gpuwatch_probe_d2h_bytes_per_second",
    "gpuwatch_probe_last_success_timestamp_seconds",
    "gpuwatch_probe_duration_seconds",
    "gpuwatch_probe_power_capped",
    "gpuwatch_probe_sm_clock_hertz",
    "gpuwatch_probe_power_watts",
    "gpuwatch_probe_temperature_celsius",
)


def export_interval(view: ProbeView, out: _Out) -> None:
    if view.enabled:
        out.add("gpuwatch_probe_interval_seconds", (), view.interval_seconds)


def export_probe(gpu: tuple[str, str], uuid: str, view: ProbeView, out: _Out, whole: bool = False) -> None:
    """The `gpuwatch_probe_*` samples of one (fresh) GPU; the run counters the rules read exist from start-up, the
    others from their first run (every one with `whole`)."""
    if not view.enabled:
        return
    counts = view.runs.get(uuid, {})
    for result in RESULTS:
        count = counts.get(result, 0)
        if count or whole or result in _RULES_PROBE:
            out.add("gpuwatch_probe_runs_total", (*gpu, result), count)
    out.add("gpuwatch_probe_compute_errors_total", gpu, counts.get("compute_error", 0))
    baseline = view.baselines.get(uuid)
    if baseline is not None:
        out.add("gpuwatch_probe_baseline_flops", (*gpu, baseline[0]), baseline[1])
    previous = view.previous_baselines.get(uuid)
    if previous is not None:
        out.add("gpuwatch_probe_baseline_previous_flops", (*gpu, previous[0]), previous[1])
    last = view.last_ok.get(uuid)
    if last is None or last.measured is None:
        return
    m, t = last.measured, last.telemetry
    out.add("gpuwatch_probe_info", (*gpu, m.engine, m.engine_version, m.blas_version, m.dtype, m.shape), 1)
    out.add_row(_PROBE_SPEED, (*gpu, m.dtype), (m.flops_median, m.spread_ratio))
    out.add_row(
        _PROBE_RUN,
        gpu,
        (
            m.h2d_bytes_per_second,
            m.d2h_bytes_per_second,
            last.timestamp,
            m.gpu_time_seconds,
            m.power_capped,
            t.sm_clock_hertz,
            t.power_watts,
            t.temperature_celsius,
        ),
    )
