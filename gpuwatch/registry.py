"""The one registry of collectors (node_exporter's registerCollector): a collector is one module in
gpuwatch/collectors/, named as it is registered, plus one line here.

A registration names the collector — the `collector` label of `gpuwatch_collector_*`, the `--disable-collector`
choice, the names the config's `agent.disable_collectors` accepts and the list in docs/metrics.md — and its module.
The module defines ``collectors(context, name) -> list[Collector]`` and ``check(config, sources, name) ->
list[CheckLine]`` (gpuwatch/collectors/base.py), and declares what else it adds: SETTINGS (its section), FAMILIES,
``export_gpu`` or ``export_node`` (docs/development.md, "Adding a collector"). The module is named, not imported,
here: this table sits at the bottom, and the layers above import a module when they read its declarations.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COLLECTORS", "REGISTRY", "Registration"]


@dataclass(frozen=True, slots=True)
class Registration:
    name: str
    module: str  # defines collectors(context, name) -> list[Collector] and check(config, sources, name)


REGISTRY: tuple[Registration, ...] = (
    Registration("nvml", "gpuwatch.collectors.nvml"),
    Registration("amdsmi", "gpuwatch.collectors.amdsmi"),
    Registration("xid_events", "gpuwatch.collectors.xid_events"),
    Registration("hwmon", "gpuwatch.collectors.hwmon"),
    Registration("ipmi", "gpuwatch.collectors.ipmi"),
    Registration("probe", "gpuwatch.collectors.probe"),
    Registration("workloads", "gpuwatch.collectors.workloads"),
    Registration("probe_results", "gpuwatch.collectors.probe_results"),
    Registration("diag_results", "gpuwatch.collectors.diag_results"),
    Registration("fabric", "gpuwatch.collectors.fabric"),
    Registration("network", "gpuwatch.collectors.network"),
)

COLLECTORS: tuple[str, ...] = tuple(registration.name for registration in REGISTRY)
