"""The one registry of collectors (node_exporter's registerCollector): a collector is one file in the collectors
layer plus one line here.

A registration names the collector — the `collector` label of `gpuwatch_collector_*`, the `--disable-collector`
choice, the names the config's `agent.disable_collectors` accepts and the list in docs/metrics.md — and the module
that builds it. That module defines ``collectors(context, name) -> list[Collector]`` and its `gpuwatch check` lines,
``check(config, sources, name) -> list[CheckLine]`` (the protocol, the schedules, the check lines and the one place
every run is timed into the meta-metrics are in `gpuwatch/collectors/base.py`). The module is named, not
imported, here: this table sits below the configuration, and the service imports a collector only when it builds it.
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
)

COLLECTORS: tuple[str, ...] = tuple(registration.name for registration in REGISTRY)
