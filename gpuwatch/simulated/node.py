"""The one way into the simulator: the simulated node's sources (its vendor library under the vendor's real Python
binding, its host sensors, its probe worker), for the agent (through gpuwatch/service/nodes.py), ``simulate-fleet``,
the tests and the benchmarks. Nothing below the service imports ``gpuwatch.simulated`` (pyproject.toml,
[tool.importlinter]).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuwatch.backends.base import Backend
from gpuwatch.collectors.sources import BackendSlot, FabricSource, NodeSources, RdmaSource
from gpuwatch.config.settings import Config
from gpuwatch.readers.kmsg import KernelLogXidReader
from gpuwatch.readers.procfs import Procfs

# The simulator and the AMD backend are imported where used: an agent on real GPUs loads no simulated module, and a
# simulated NVIDIA node no AMD one (each a few MiB of RSS).
if TYPE_CHECKING:
    from gpuwatch.backends.amdsmi import AmdSmiBackend
    from gpuwatch.simulated.scenarios import SimulatedNode

__all__ = [
    "VERSION_ENV",
    "SimulatedNode",
    "simulated_amd_backend",
    "simulated_amd_slot",
    "simulated_procfs",
    "simulated_release",
    "simulated_slot",
    "simulated_sources",
]

# The amdsmi release ("7.0.2", "6.4.3") the simulated node runs, over its simulated libamd_smi.so: for trying the
# backend against an older ROCm's package; one other than the installed one must be under .venv/bindings.
VERSION_ENV = "GPUWATCH_SIM_AMDSMI_VERSION"


def simulated_sources(
    config: Config,
    node: SimulatedNode | None = None,
    *,
    kernel_log: KernelLogXidReader | None = None,
    host: bool = True,
    clock: Callable[[], float] | None = None,
) -> NodeSources:
    """The simulated node's sources: one vendor slot, its PCI counts, its host sensors, its probe worker."""
    from gpuwatch.simulated.diag_launcher import simulated_diag_launcher
    from gpuwatch.simulated.host_sensors import simulated_host_sources
    from gpuwatch.simulated.probe_launcher import simulated_probe_launcher
    from gpuwatch.simulated.scenarios import SimulatedNode

    sim = config.simulated
    node = node or SimulatedNode(scenario=sim.scenario, gpus=sim.gpus, vendor=sim.vendor)
    slot = simulated_slot(node, clock=clock)
    sensors = (
        (simulated_host_sources(node, config) if clock is None else simulated_host_sources(node, config, clock=clock))
        if host
        else []
    )
    launcher = simulated_probe_launcher(
        node.probe_slowdown, config.state_dir, clock=clock or time.time, node=node, corrupt=node.probe_corrupt
    )
    procfs = simulated_procfs(node, sim.boot)
    diag = simulated_diag_launcher(node)
    fabric = FabricSource(node.nvswitch_count, node.fabric_manager_running)
    rdma = RdmaSource()  # no NICs: never this machine's own /sys/class/infiniband
    if node.nvlink and host:  # an HGX node: a NIC per GPU (gpuwatch/simulated/rdma_ports.py)
        from gpuwatch.simulated.rdma_ports import SimulatedRdma

        nics = SimulatedRdma(node)
        rdma = RdmaSource(nics.root, nics.refresh)
    return NodeSources(
        [slot],
        node.pci_gpu_counts,
        kernel_log,
        sensors,
        launcher,
        procfs,
        diag_launcher=diag,
        fabric=fabric,
        rdma=rdma,
    )


def simulated_procfs(node: SimulatedNode, boot: int = 0) -> Procfs:
    """The node's GPU processes in a temporary procfs (Slurm jobs, pods, a container, a unit, a process), read as
    the host's PID namespace, with the boot id of its `boot`-th boot; the view holds the directory for as long as
    it is used."""
    from gpuwatch.simulated.procfs import SimulatedProcfs

    sim = SimulatedProcfs(node, boot)
    return Procfs(sim.root, host_pids=True, keep=sim)


def simulated_slot(node: SimulatedNode, *, clock: Callable[[], float] | None = None) -> BackendSlot:
    """The node's vendor backend: NVML over the simulated libnvml, or AMD SMI over the simulated libamd_smi.so."""
    if node.vendor == "amd":
        return simulated_amd_slot(node, clock=clock)
    from gpuwatch.backends.nvml import NvmlBackend
    from gpuwatch.simulated.bindings import simulated_pynvml

    lib = simulated_pynvml(node)
    if clock is None:
        return BackendSlot("nvml", "nvidia", lambda: NvmlBackend(lib))
    return BackendSlot("nvml", "nvidia", lambda: NvmlBackend(lib, clock=clock))


def simulated_release() -> str | None:
    """The amdsmi release the simulated node runs (GPUWATCH_SIM_AMDSMI_VERSION), None for the installed one."""
    return os.environ.get(VERSION_ENV) or None


def simulated_amd_backend(node: SimulatedNode, *, clock: Callable[[], float] | None = None) -> AmdSmiBackend:
    """AMD's amdsmi package over the node's simulated libamd_smi.so, of the release the agent would pick; without
    the amdsmi package: BackendUnavailable saying how to install it."""
    from gpuwatch.backends.amdsmi import AmdSmiBackend, load_amdsmi
    from gpuwatch.simulated.amdsmi_sim import simulated_amdsmi

    lib = load_amdsmi(lambda: simulated_amdsmi(node, binding=simulated_release()))
    return AmdSmiBackend(lib) if clock is None else AmdSmiBackend(lib, clock=clock)


def simulated_amd_slot(node: SimulatedNode, *, clock: Callable[[], float] | None = None) -> BackendSlot:
    """The real AMD SMI backend over AMD's ``amdsmi`` package on this node's simulated libamd_smi.so."""
    release = simulated_release()
    if release is not None:  # a release asked for by name must be there at start-up
        from gpuwatch.simulated.amdsmi_binding import binding_package

        try:
            binding_package(release)
        except (FileNotFoundError, ModuleNotFoundError) as exc:
            raise ValueError(f"{VERSION_ENV}={release!r}: {exc}") from exc

    def factory() -> Backend:
        return simulated_amd_backend(node, clock=clock)

    return BackendSlot("amdsmi", "amd", factory)


def __getattr__(name: str) -> Any:
    """``SimulatedNode`` (in __all__), imported only when asked for."""
    if name == "SimulatedNode":
        from gpuwatch.simulated.scenarios import SimulatedNode

        return SimulatedNode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
