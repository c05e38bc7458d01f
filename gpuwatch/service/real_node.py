"""A real node's sources: the vendor backends its GPUs need (by what is on the PCI bus, or configured), the kernel
log, the host sensors and the real probe worker.

AMD specifics live here too: AMD GPUs are numbered after the NVIDIA ones, and ``import amdsmi`` happens at each
(re)open of the backend so ROCm installed after start-up is found.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from gpuwatch.backends.base import Backend, BackendUnavailable
from gpuwatch.collectors.fabric import FabricSection
from gpuwatch.collectors.host import build_host_sources
from gpuwatch.collectors.sources import BackendSlot, FabricSource, NodeSources, RdmaSource
from gpuwatch.collectors.workloads import WorkloadsSection
from gpuwatch.config.settings import Config
from gpuwatch.readers.fabric_manager import ManagerWatch
from gpuwatch.readers.kmsg import KernelLogXidReader
from gpuwatch.readers.pci import count_nvswitches, count_pci_gpus
from gpuwatch.readers.procfs import Procfs

log = logging.getLogger(__name__)


def build_real_sources(config: Config, *, sysfs_root: Path = Path("/sys")) -> NodeSources:
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
    # The daemon is looked for where GPU processes are (workloads.procfs_root: the host's /proc in a container), and
    # by the API socket its configuration names; both are read as configured at start.
    manager = ManagerWatch(
        Procfs(Path(config.section(WorkloadsSection).procfs_root)), Path(config.section(FabricSection).manager_config)
    )
    fabric = FabricSource(lambda: count_nvswitches(sysfs_root), manager)
    rdma = RdmaSource(Path(config.host.sysfs_root))  # the host's /sys/class/infiniband, as hwmon reads class/hwmon
    return NodeSources(
        slots, lambda: count_pci_gpus(sysfs_root), kernel_log, build_host_sources(config), fabric=fabric, rdma=rdma
    )


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
