"""The `fabric` collector: the node's NVSwitches and whether NVIDIA's fabric manager runs where they need it.

On an NVSwitch system (HGX) CUDA cannot use the GPUs until nvidia-fabricmanager has configured the switches and
registered every GPU with the fabric (NVIDIA Fabric Manager User Guide): a node whose daemon died keeps its GPUs
readable, and every job fails. The GPUs' own fabric state and health are read by the vendor backend
(gpuwatch_gpu_fabric_healthy, gpuwatch_gpu_fabric_health); this collector adds the node's side. NVSwitches are
counted on the PCI bus (gpuwatch/readers/pci.py): only a node that has them needs the daemon, so
gpuwatch_host_fabric_manager_running exists only there. The GPUs of an NVL72-style rack report a fabric too, but its
switches and their manager live in switch trays, off the compute node. Every 30 s on its own job: a listing of the
PCI bus and one pass over the process table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from gpuwatch.collectors.base import CheckLine, CollectorContext, Every
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.metric_spec import MetricSpec, SampleSink

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FabricSection:
    """[fabric]: how often the node's NVSwitches and fabric manager are looked at (docs/configuration.md)."""

    SECTION: ClassVar[str] = "fabric"

    interval_seconds: float = 30.0
    # Where the daemon's configuration names its API socket: the agent looks for that socket where it cannot see
    # the daemon's process (hidepid, a PID namespace of its own).
    manager_config: str = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"

    def problems(self) -> Iterator[tuple[str, str]]:
        if not 1.0 <= self.interval_seconds <= 3600.0:
            yield "interval_seconds", f"must be between 1 and 3600 seconds, got {self.interval_seconds:g}"
        if not self.manager_config.startswith("/"):
            yield "manager_config", f"must be an absolute path such as the package's, got {self.manager_config!r}"


SETTINGS = FabricSection

FAMILIES = (
    MetricSpec(
        "gpuwatch_host_nvswitches",
        "gauge",
        (),
        "NVSwitches on the node's PCI bus (NVIDIA bridges, class 0x0680): an NVSwitch system needs the fabric manager.",
    ),
    MetricSpec(
        "gpuwatch_host_fabric_manager_running",
        "gauge",
        (),
        "1 while nvidia-fabricmanager (nv-fabricmanager) runs, 0 when not; only on a node with NVSwitches, and only "
        "where the agent can tell (its process, or its API socket).",
    ),
)


@dataclass(frozen=True, slots=True)
class Fabric:
    """What a run stores: the NVSwitches counted, and the daemon's state where they need it (None elsewhere, and where
    the agent cannot see it: no series then, rather than a guess that pages)."""

    nvswitches: int
    manager_running: bool | None


def export_node(part: Fabric | None, out: SampleSink) -> None:
    if part is None:
        return
    out.add("gpuwatch_host_nvswitches", (), part.nvswitches)
    if part.manager_running is not None:
        out.add("gpuwatch_host_fabric_manager_running", (), part.manager_running)


def read(sources: NodeSources) -> Fabric:
    switches = sources.fabric.nvswitches()
    return Fabric(switches, sources.fabric.manager_running() if switches else None)


class FabricCollector:
    name = "fabric"
    schedule = Every("host-fabric", lambda config: config.section(FabricSection).interval_seconds)

    def __init__(self, context: CollectorContext) -> None:
        self._context = context

    def update(self) -> bool:
        self._context.store.set_part(self.name, read(self._context.sources))
        return True


def collectors(context: CollectorContext, name: str) -> list[FabricCollector]:
    return [FabricCollector(context)]


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """`gpuwatch check`: an NVSwitch node without its fabric manager cannot run CUDA work."""
    fabric = read(sources)
    if not fabric.nvswitches:
        return [CheckLine("ok", "NVLink fabric", "no NVSwitch on the PCI bus: no fabric manager needed")]
    if fabric.manager_running:
        return [CheckLine("ok", "NVLink fabric", f"{fabric.nvswitches} NVSwitch(es); nv-fabricmanager runs")]
    if fabric.manager_running is None:
        return [
            CheckLine(
                "warn",
                "NVLink fabric",
                f"{fabric.nvswitches} NVSwitch(es) on the PCI bus; whether nv-fabricmanager runs cannot be seen here",
                "run the agent in the host PID namespace (hostPID: true, --pid=host) or set workloads.procfs_root to "
                "a mount of the host's /proc",
            )
        ]
    return [
        CheckLine(
            "warn",
            "NVLink fabric",
            f"{fabric.nvswitches} NVSwitch(es) on the PCI bus, but no nv-fabricmanager process: CUDA work fails",
            "systemctl enable --now nvidia-fabricmanager (its version must equal the driver's)",
        )
    ]
