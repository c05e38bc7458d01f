"""This node's sources, real or simulated: the one place the service chooses between them, so an agent on real GPUs
imports no simulated module at all."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.service.real_node import build_real_sources

if TYPE_CHECKING:
    from gpuwatch.simulated.scenarios import SimulatedNode


def build_sources(
    config: Config, *, sysfs_root: Path = Path("/sys"), simulated_node: SimulatedNode | None = None
) -> NodeSources:
    """The simulated node's sources with ``--backend simulated``, else the real ones.

    `simulated_node`: with the simulated backend, serve this node instead of one built from [simulated]
    (simulate-fleet gives every node its own seed and per-GPU faults)."""
    if config.agent.backend == "simulated":
        from gpuwatch.simulated.node import simulated_sources

        return simulated_sources(config, simulated_node)
    return build_real_sources(config, sysfs_root=sysfs_root)
