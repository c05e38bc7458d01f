"""What the collectors read on a node: the vendor backends it needs (one slot each), the PCI view, the kernel log,
the host sensors, the probe's worker and /proc. A real node's are built by gpuwatch/service/real_node.py, the
simulated node's by gpuwatch/simulated/node.py.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuwatch.backends.base import Backend
from gpuwatch.core.model import HostSample, HostSourceName, Vendor
from gpuwatch.probe.diag_launch import DiagLauncher
from gpuwatch.probe.launch import WorkerLauncher
from gpuwatch.readers.kmsg import KernelLogXidReader
from gpuwatch.readers.procfs import Procfs

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BackendSlot:
    """One vendor library and its retry state: opened lazily, reopened with backoff after it fails."""

    name: str
    vendor: Vendor
    factory: Callable[[], Backend]
    backend: Backend | None = None
    next_attempt: float = 0.0
    backoff: float = 1.0
    last_slow_poll: float = -math.inf
    lock: threading.Lock = field(default_factory=threading.Lock)


class HostReader(Protocol):
    source: str

    def read(self) -> HostSample: ...


@dataclass(slots=True)
class HostSource:
    """One host collector: its reader, how often it runs, and whether it is there at all on this machine."""

    name: HostSourceName  # the collector label and the --disable-collector name
    reader: HostReader
    interval_seconds: float
    usable: Callable[[], tuple[bool, str]]  # (found, what was found or why not)
    required: bool = False  # a run where the source is not usable is a failure, not an empty success


@dataclass(frozen=True, slots=True)
class FabricSource:
    """The node's NVLink fabric as the `fabric` collector reads it: NVSwitches on the PCI bus, the fabric manager
    (None: this agent cannot tell whether it runs; gpuwatch/readers/fabric_manager.py)."""

    nvswitches: Callable[[], int]
    manager_running: Callable[[], bool | None]


@dataclass(frozen=True, slots=True)
class RdmaSource:
    """Where the `network` collector reads /sys/class/infiniband: the host's sysfs root on a real node, a tree a
    simulated node renders before each read (refresh), or nowhere (root None: a node without RDMA ports)."""

    root: Path | None = None
    refresh: Callable[[], None] = lambda: None


def _no_fabric() -> FabricSource:
    return FabricSource(lambda: 0, lambda: False)


@dataclass(slots=True)
class NodeSources:
    """What the agent reads on this node: the backends it needs and the PCI view that sets expectations."""

    slots: list[BackendSlot]
    pci_gpu_counts: Callable[[], dict[str, int]]
    kernel_log: KernelLogXidReader | None
    host: list[HostSource] = field(default_factory=list)  # hwmon, ipmi (gpuwatch/collectors/host.py)
    probe_launcher: WorkerLauncher = field(default_factory=WorkerLauncher)  # the probe worker (probe/launch.py)
    procfs: Procfs | None = None  # where GPU processes are looked up; None: the config's workloads.procfs_root
    diag_launcher: DiagLauncher = field(default_factory=DiagLauncher)  # `gpuwatch diag`'s child (probe/diag_launch.py)
    fabric: FabricSource = field(default_factory=_no_fabric)  # NVSwitches and the fabric manager (collectors/fabric.py)
    rdma: RdmaSource = field(default_factory=RdmaSource)  # InfiniBand and RoCE ports (collectors/network.py)
