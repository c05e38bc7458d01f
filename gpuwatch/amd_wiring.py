"""How the agent gets its AMD backend: the real ``amdsmi`` module or the simulated one, numbered after NVIDIA.

Kept apart from agent.py so the AMD specifics (the import that fails with KeyError, the index offset, which
amdsmi release the simulated node runs) live in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuwatch.backends.amdsmi import AmdSmiBackend, load_amdsmi
from gpuwatch.backends.base import Backend

if TYPE_CHECKING:
    from gpuwatch.agent import BackendSlot
    from gpuwatch.simulated.scenarios import SimulatedNode

# The amdsmi release ("7.0.2", "6.4.3") the simulated node runs, over its simulated libamd_smi.so: for trying the
# backend against an older ROCm's package; one other than the installed one must be under .venv/bindings.
VERSION_ENV = "GPUWATCH_SIM_AMDSMI_VERSION"


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
    from gpuwatch.agent import BackendSlot

    def factory() -> Backend:
        return AmdSmiBackend(load_amdsmi(), index_offset=offset)

    return BackendSlot("amdsmi", "amd", factory)


def simulated_release() -> str | None:
    """The amdsmi release the simulated node runs (GPUWATCH_SIM_AMDSMI_VERSION), None for the installed one."""
    return os.environ.get(VERSION_ENV) or None


def simulated_amd_slot(node: SimulatedNode) -> BackendSlot:
    """The real AMD SMI backend over AMD's ``amdsmi`` package on this node's simulated libamd_smi.so."""
    from gpuwatch.agent import BackendSlot
    from gpuwatch.simulated.amdsmi_binding import binding_package
    from gpuwatch.simulated.amdsmi_sim import simulated_amdsmi

    release = simulated_release()
    if release is not None:  # a release asked for by name must be there at start-up
        try:
            binding_package(release)
        except (FileNotFoundError, ModuleNotFoundError) as exc:
            raise ValueError(f"{VERSION_ENV}={release!r}: {exc}") from exc

    def factory() -> Backend:  # without the amdsmi package: BackendUnavailable saying how to install it
        return AmdSmiBackend(load_amdsmi(lambda: simulated_amdsmi(node, binding=release)))

    return BackendSlot("amdsmi", "amd", factory)


def amd_versions() -> dict[str, str]:
    """For ``gpuwatch version``: the amdsmi package and, where ROCm is installed, the host library's versions and
    whether the two belong together; a missing library is said, never raised."""
    from gpuwatch.backends.base import BackendUnavailable

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
