"""What the agent reads on this node: the vendor backends it needs (one slot each), the PCI view, the kernel log and
the host sensors. Real hardware only; the simulated node's sources come from gpuwatch/simulation.py.

AMD specifics live here too: AMD GPUs are numbered after the NVIDIA ones, and ``import amdsmi`` happens at each
(re)open of the backend so ROCm installed after start-up is found.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.backends.base import Backend, BackendUnavailable
from gpuwatch.config import Config
from gpuwatch.host.collectors import HostSource, build_host_sources
from gpuwatch.kmsg import KernelLogXidReader
from gpuwatch.model import Vendor
from gpuwatch.pci import count_pci_gpus
from gpuwatch.probe.launch import WorkerLauncher
from gpuwatch.workloads.procfs import Procfs

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


@dataclass(slots=True)
class NodeSources:
    """What the agent reads on this node: the backends it needs and the PCI view that sets expectations."""

    slots: list[BackendSlot]
    pci_gpu_counts: Callable[[], dict[str, int]]
    kernel_log: KernelLogXidReader | None
    host: list[HostSource] = field(default_factory=list)  # hwmon, ipmi (gpuwatch/host/collectors.py)
    probe_launcher: WorkerLauncher = field(default_factory=WorkerLauncher)  # the probe worker (probe/launch.py)
    procfs: Procfs | None = None  # where GPU processes are looked up; None: the config's workloads.procfs_root


def build_node_sources(config: Config, *, sysfs_root: Path = Path("/sys")) -> NodeSources:
    """Choose the backends this node needs (spec: only those whose GPUs are on the bus or that are configured)."""
    backend = config.agent.backend
    counts = count_pci_gpus(sysfs_root)
    slots: list[BackendSlot] = []
    wants_nvidia = backend == "nvml" or (
        backend == "auto" and (counts.get("nvidia", 0) > 0 or config.gpus.expected_nvidia)
    )
    if wants_nvidia:
        slots.append(BackendSlot("nvml", "nvidia", _nvml_factory))
    if backend == "amdsmi" or (backend == "auto" and (counts.get("amd", 0) > 0 or config.gpus.expected_amd)):
        nvml = slots[0] if slots else None
        slots.append(amd_slot(nvidia_offset(lambda: count_pci_gpus(sysfs_root).get("nvidia", 0), nvml)))
    if not slots:
        log.warning("no NVIDIA or AMD GPU on the PCI bus; pass --backend nvml or set gpus.expected_nvidia to force")
    kernel_log = KernelLogXidReader(Path(config.xid.kernel_log)) if config.xid.kernel_log and wants_nvidia else None
    return NodeSources(slots, lambda: count_pci_gpus(sysfs_root), kernel_log, build_host_sources(config))


def _nvml_factory() -> Backend:
    from gpuwatch.backends.nvml import NvmlBackend, load_pynvml

    return NvmlBackend(load_pynvml())


def nvidia_offset(pci_nvidia: Callable[[], int], nvml_slot: BackendSlot | None) -> Callable[[], int]:
    """AMD GPUs are numbered after the NVIDIA ones (docs/metrics.md). Asked at every open of the AMD backend:
    the NVIDIA GPUs on the PCI bus, or NVML's count when it sees more; both are known before AMD SMI opens, and
    the PCI count does not change when NVML is down or a GPU is lost, so numbers stay put."""

    def offset() -> int:
        seen = 0
        backend = nvml_slot.backend if nvml_slot is not None else None
        if backend is not None:
            seen = len(backend.gpus())
        return max(pci_nvidia(), seen)

    return offset


def amd_slot(offset: Callable[[], int]) -> BackendSlot:
    """The real AMD SMI backend; importing amdsmi happens at each (re)open, so ROCm installed later is found."""

    def factory() -> Backend:
        from gpuwatch.backends.amdsmi import AmdSmiBackend, load_amdsmi  # only on a node with AMD GPUs

        return AmdSmiBackend(load_amdsmi(), index_offset=offset)

    return BackendSlot("amdsmi", "amd", factory)


def amd_versions() -> dict[str, str]:
    """For ``gpuwatch version``: the amdsmi package and, where ROCm is installed, the host library's versions and
    whether the two belong together; a missing library is said, never raised."""
    from gpuwatch.backends.amdsmi import AmdSmiBackend, load_amdsmi

    try:
        backend = AmdSmiBackend(load_amdsmi())
    except BackendUnavailable as exc:
        return {"AMD SMI": str(exc)}
    try:
        backend.open()
    except BackendUnavailable as exc:
        return {"AMD SMI": str(exc)}
    try:
        found = backend.versions()
        if (problem := backend.version_problem()) is not None:
            found["amdsmi version mismatch"] = problem
        return found
    finally:
        backend.close()
