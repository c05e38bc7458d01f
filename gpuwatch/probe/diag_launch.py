"""What `gpuwatch diag` starts as a GPU's diag child: the production child (gpuwatch/probe/diag_worker.py, PyTorch on
the GPU) in the probe worker's isolated mode, or what the composition layer gives instead (the simulated node's,
gpuwatch/simulated/diag_worker.py, on torch's CPU device over the simulated GPU's link and physics)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuwatch.core.model import GpuIdentity
from gpuwatch.probe.launch import worker_argv

DIAG_WORKER_MODULE = "gpuwatch.probe.diag_worker"


def _production_command(_identity: GpuIdentity) -> list[str]:
    return worker_argv(DIAG_WORKER_MODULE)


@dataclass(frozen=True, slots=True)
class DiagLauncher:
    """How a GPU's diag child starts: its command (gpuwatch/probe/diag.py appends the level's arguments, the contract
    of diag_worker.py), and the arguments this node adds (the simulated node's: torch's CPU device, a small buffer)."""

    command: Callable[[GpuIdentity], Sequence[str]] = _production_command
    extra_arguments: tuple[str, ...] = ()
