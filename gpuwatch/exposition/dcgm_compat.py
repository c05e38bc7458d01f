"""`[compat] dcgm = true`: dcgm-exporter's names and labels beside gpuwatch's own, so a fleet moving from
dcgm-exporter keeps its dashboards and rules.

The DCGM families are computed from the families gpuwatch renders anyway (gpuwatch.exposition.exporter.families),
through the table in gpuwatch/exposition/dcgm_fields.py: never a vendor call, and like the rest off the scrape's hot
path (the exposition cache renders once per store state, these families included). A source gpuwatch does not have
leaves its DCGM field absent, never 0.

Labels as dcgm-exporter writes them (NVIDIA/dcgm-exporter 4.5.3-4.8.2, internal/pkg/rendermetrics/render_metrics.go:47;
values from internal/pkg/collector/gpu_collector.go:316-344): gpu (the index), UUID, pci_bus_id (NVML's busId,
00000000:07:00.0), device ("nvidia" + index), modelName, Hostname (internal/pkg/hostname/hostname.go: $NODE_NAME,
else the machine's name), and DCGM_FI_DRIVER_VERSION, which etc/default-counters.csv:77 makes a label of every field.

MIG (docs/mig.md): dcgm-exporter's default device option (`-d f`, flex: pkg/cmd/app.go:204-210) watches each GPU
instance of a MIG-enabled GPU instead of the GPU (internal/pkg/devicemonitoring/device_monitoring.go:97-129; a GPU
with MIG but no instance is watched as a GPU), so every family has one series per GPU instance, under the parent's
labels plus GPU_I_PROFILE (the instance's profile, "1g.10gb") and GPU_I_ID (NVML's GPU instance ID in decimal), right
after modelName (render_metrics.go:47, values from internal/pkg/collector/gpu_collector.go:350-356); a GPU without
MIG carries neither label. DCGM answers the framebuffer and the profiling fields for the instance and the rest (clocks,
temperatures, power, ...) with the GPU's value on each instance (NVIDIA/dcgm-exporter issues #50, #317, #736 show
them so). Here: DCGM_FI_DEV_FB_* from gpuwatch_mig_memory_*, DCGM_FI_PROF_SM_ACTIVE, _PIPE_TENSOR_ACTIVE and
_DRAM_ACTIVE from the instance's GPM; the other profiling fields have no per-instance source and are absent there.

Counters: dcgm-exporter declares them `counter` with names that do not end in _total, which OpenMetrics (the format
Prometheus asks for first) does not allow; they are declared `unknown` here (`untyped` in the text format), which
both formats accept and PromQL treats alike: rate() and increase() work as before.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from functools import partial

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from gpuwatch.config.settings import CompatSection
from gpuwatch.core.thresholds import xid_meaning
from gpuwatch.exposition.dcgm_fields import CLOCK_EVENT_BITS, DERIVED, FIELDS, MIB, NAMES, DcgmField, DcgmType
from gpuwatch.exposition.exporter import Extension

GpuKey = tuple[str, str]  # (gpu, uuid), as on every gpuwatch_gpu_* sample

__all__ = ["NAMES", "dcgm_extension", "dcgm_families"]


def dcgm_extension(
    compat: CompatSection,
    environ: Mapping[str, str] = os.environ,
    gethostname: Callable[[], str] = socket.gethostname,
) -> Extension | None:
    """The DCGM families for `[compat]`, or None when `dcgm` is off. The host name is resolved once, at start-up, as
    dcgm-exporter does: the configured one, else $NODE_NAME (a Kubernetes DaemonSet's spec.nodeName), else the
    machine's name."""
    if not compat.dcgm:
        return None
    hostname = compat.dcgm_hostname or environ.get("NODE_NAME") or gethostname()
    return partial(dcgm_families, hostname=hostname, hostname_label=compat.dcgm_hostname_label)


def dcgm_families(families: Iterable[Metric], hostname: str, hostname_label: str = "Hostname") -> list[Metric]:
    """dcgm-exporter's families for gpuwatch's `families`: one sample per GPU that has the field's source."""
    samples: dict[str, list[Sample]] = {}
    for family in families:
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    gpus = _gpu_labels(samples.get("gpuwatch_gpu_info", []), hostname, hostname_label)
    mig = _MigInstances(samples)
    out: list[Metric] = []
    for field in FIELDS:
        _emit(out, field.name, field.type, field.help, gpus, _values(field, samples.get(field.source, [])), mig)
    _emit(out, "DCGM_FI_DEV_FB_FREE", *DERIVED["DCGM_FI_DEV_FB_FREE"], gpus, _fb_free(samples), mig)
    reasons = _clock_event_reasons(samples.get("gpuwatch_gpu_throttle_active", []))
    for name in ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"):
        _emit(out, name, *DERIVED[name], gpus, reasons, mig)
    _emit_xids(out, gpus, samples.get("gpuwatch_gpu_xid_last_timestamp_seconds", []), mig)
    return out


def _gpu_labels(info: list[Sample], hostname: str, hostname_label: str) -> dict[GpuKey, dict[str, str]]:
    gpus: dict[GpuKey, dict[str, str]] = {}
    for sample in info:
        labels = sample.labels
        dcgm = {
            "gpu": labels["gpu"],
            "UUID": labels["uuid"],
            "pci_bus_id": labels["pci_bus_id"],
            "device": f"{labels['vendor']}{labels['gpu']}",
            "modelName": labels["model"],
            "DCGM_FI_DRIVER_VERSION": labels["driver_version"],
        }
        if hostname_label:
            dcgm[hostname_label] = hostname
        gpus[(labels["gpu"], labels["uuid"])] = dcgm
    return gpus


def _values(field: DcgmField, source: list[Sample]) -> dict[GpuKey, float]:
    """The field's value per GPU: the source samples with the field's labels, scaled (summed over `sum_over`)."""
    values: dict[GpuKey, float] = {}
    for sample in source:
        labels = sample.labels
        if any(labels.get(key) != value for key, value in field.select):
            continue
        key = (labels["gpu"], labels["uuid"])
        value = sample.value * field.scale
        if field.sum_over:
            values[key] = values.get(key, 0.0) + value
        else:
            values.setdefault(key, value)
    if not field.whole:
        return values
    return {key: _whole(value, floor=field.scale == 1 / MIB) for key, value in values.items()}


def _whole(value: float, floor: bool = False) -> float:
    """DCGM's int64 fields are whole numbers: MiB are whole MiB (floor: DCGM shifts bytes right by 20; bytes / 2**20
    is exact in a float), the rest the nearest whole number (scaling a float leaves ...0.9999999995)."""
    if not math.isfinite(value):
        return value
    return float(math.floor(value) if floor else round(value))


def _fb_free(samples: dict[str, list[Sample]]) -> dict[GpuKey, float]:
    used = {_key(s): s.value for s in samples.get("gpuwatch_gpu_memory_used_bytes", [])}
    return {
        key: _whole((s.value - used[key]) / MIB, floor=True)
        for s in samples.get("gpuwatch_gpu_memory_total_bytes", [])
        if (key := _key(s)) in used
    }


def _clock_event_reasons(active: list[Sample]) -> dict[GpuKey, float]:
    """The DCGM_CLOCKS_EVENT_REASON_* bitmask of the reasons active now, for every GPU that reports any reason."""
    masks: dict[GpuKey, int] = {}
    for sample in active:
        key = _key(sample)
        bit = CLOCK_EVENT_BITS.get(sample.labels["reason"], 0) if sample.value == 1 else 0
        masks[key] = masks.get(key, 0) | bit
    return {key: float(mask) for key, mask in masks.items()}


def _emit_xids(
    out: list[Metric], gpus: dict[GpuKey, dict[str, str]], last_seen: list[Sample], mig: _MigInstances | None = None
) -> None:
    """DCGM_FI_DEV_XID_ERRORS: each GPU's most recent XID (by its own time), its code as value and err_code."""
    latest: dict[GpuKey, tuple[float, int]] = {}
    for sample in last_seen:
        code = sample.labels["xid"]
        if code.isdigit():  # "other" (a code outside 1..999) has no number to report
            latest[_key(sample)] = max(latest.get(_key(sample), (-1.0, 0)), (sample.value, int(code)))
    type_, help_ = DERIVED["DCGM_FI_DEV_XID_ERRORS"]
    family = Metric("DCGM_FI_DEV_XID_ERRORS", help_, type_)
    for key, (_, xid) in sorted(latest.items()):
        for labels in _labels_of(key, gpus, mig) if key in gpus else ():
            labels = {**labels, "err_code": str(xid), "err_msg": xid_meaning(xid)}
            family.samples.append(Sample("DCGM_FI_DEV_XID_ERRORS", labels, float(xid)))
    if family.samples:
        out.append(family)


def _emit(
    out: list[Metric],
    name: str,
    type_: DcgmType,
    help_: str,
    gpus: dict[GpuKey, dict[str, str]],
    values: dict[GpuKey, float],
    mig: _MigInstances | None = None,
) -> None:
    family = Metric(name, help_, "gauge" if type_ == "gauge" else "unknown")
    if mig is None or not mig.instances:
        family.samples = [Sample(name, gpus[key], value) for key, value in values.items() if key in gpus]
    else:
        keys = [key for key in values if key in gpus] + [key for key in mig.instances if key not in values]
        family.samples = [sample for key in keys if key in gpus for sample in mig.samples(name, key, gpus[key], values)]
    if family.samples:
        out.append(family)


def _key(sample: Sample) -> GpuKey:
    return sample.labels["gpu"], sample.labels["uuid"]


# ----- MIG: one series per GPU instance, as dcgm-exporter's flex mode watches a MIG-enabled GPU -----

# DCGM field -> the gpuwatch family that holds it per MIG device, and its scale (FB_FREE: total - used).
_PER_INSTANCE: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_FB_USED": ("gpuwatch_mig_memory_used_bytes", 1 / MIB),
    "DCGM_FI_DEV_FB_TOTAL": ("gpuwatch_mig_memory_total_bytes", 1 / MIB),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpuwatch_mig_sm_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpuwatch_mig_tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpuwatch_mig_dram_active_ratio", 1.0),
}
# What DCGM reads for the instance itself: without a per-instance source here, absent on a MIG GPU's instances.
_INSTANCE_SCOPED = ("DCGM_FI_DEV_FB_", "DCGM_FI_PROF_")


class _MigInstances:
    """The GPU instances of each MIG-enabled GPU (gpuwatch_mig_device_info) and their own values."""

    def __init__(self, samples: dict[str, list[Sample]]) -> None:
        self.instances: dict[GpuKey, dict[str, str]] = {}  # GPU instance ID -> its profile, in ID order
        for sample in sorted(samples.get("gpuwatch_mig_device_info", []), key=_instance_order):
            self.instances.setdefault(_key(sample), {}).setdefault(
                sample.labels["gpu_instance_id"], _gpu_instance_profile(sample.labels["mig_profile"])
            )
        self.values: dict[str, dict[tuple[GpuKey, str], float]] = {}  # DCGM field -> (gpu, GPU instance) -> value
        for name, (source, scale) in _PER_INSTANCE.items():
            found = self.values[name] = {}
            for sample in sorted(samples.get(source, []), key=_instance_order):
                found.setdefault((_key(sample), sample.labels["gpu_instance_id"]), sample.value * scale)
        used, total = self.values["DCGM_FI_DEV_FB_USED"], self.values["DCGM_FI_DEV_FB_TOTAL"]
        self.values["DCGM_FI_DEV_FB_FREE"] = {at: total[at] - used[at] for at in total if at in used}
        for key in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_FREE"):  # whole MiB, as _fb_free
            self.values[key] = {at: _whole(value, floor=True) for at, value in self.values[key].items()}

    def samples(self, name: str, key: GpuKey, labels: dict[str, str], values: dict[GpuKey, float]) -> list[Sample]:
        """The field's series of one GPU: its own, or one per GPU instance with the instance's or the GPU's value."""
        instances = self.instances.get(key)
        if not instances:
            return [Sample(name, labels, values[key])] if key in values else []
        own = self.values.get(name)
        found = []
        for gi, instance_labels in zip(instances, _instance_labels(labels, instances), strict=True):
            if own is not None:
                value = own.get((key, gi))
            else:
                value = None if name.startswith(_INSTANCE_SCOPED) else values.get(key)
            if value is not None:
                found.append(Sample(name, instance_labels, value))
        return found


def _labels_of(key: GpuKey, gpus: dict[GpuKey, dict[str, str]], mig: _MigInstances | None) -> list[dict[str, str]]:
    """The label sets a GPU's series carry: its own, or one per GPU instance of a MIG-enabled GPU."""
    instances = mig.instances.get(key) if mig is not None else None
    return _instance_labels(gpus[key], instances) if instances else [gpus[key]]


def _instance_labels(labels: dict[str, str], instances: dict[str, str]) -> list[dict[str, str]]:
    """The GPU's labels with GPU_I_PROFILE and GPU_I_ID after modelName (render_metrics.go:47), per GPU instance."""
    found = []
    for gi, profile in instances.items():
        instance: dict[str, str] = {}
        for name, value in labels.items():
            instance[name] = value
            if name == "modelName":
                instance["GPU_I_PROFILE"], instance["GPU_I_ID"] = profile, gi
        found.append(instance)
    return found


def _gpu_instance_profile(mig_profile: str) -> str:
    """The GPU instance's profile of a MIG device's: 3g.40gb for 3g.40gb and for a compute instance 1c.3g.40gb."""
    first, _, rest = mig_profile.partition(".")
    return rest if first.endswith("c") and rest else mig_profile


def _instance_order(sample: Sample) -> tuple[int, int]:
    """GPU instance then compute instance, as numbers: the first compute instance stands for its GPU instance."""
    labels = sample.labels
    return int(labels["gpu_instance_id"]), int(labels["compute_instance_id"])
