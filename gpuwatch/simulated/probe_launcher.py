"""The simulated node's probe launcher: the runner starts gpuwatch/simulated/probe_worker.py as a real child, in the
same isolated mode as the production worker, with each GPU's scenario slowdown.

A simulated GPU computes healthy until its baseline is learnt (the node's baselines file says so), then shows its
scenario's slowdown, as a real GPU degrades after its baseline was taken. The simulated node needs no engine, and
its library reports PIDs of this process's own namespace, so neither check of the production launcher applies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.core.model import GpuIdentity
from gpuwatch.probe.baseline import Baselines
from gpuwatch.probe.children import PROC_PID_INIT_INO
from gpuwatch.probe.launch import WorkerLauncher, worker_argv

MODULE = "gpuwatch.simulated.probe_worker"


@dataclass(slots=True)
class SimulatedWorkerCommand:
    """The simulated worker's command line for one GPU: its slowdown once its baseline is known, a noise seed from
    the clock (deterministic under a test's clock), and how long and how badly it runs."""

    slowdown: Mapping[int, float]
    state_dir: Path
    clock: Callable[[], float] = time.time
    seconds: float = 0.2
    fault: str = "none"
    _baselines: Baselines | None = field(default=None, init=False)

    def __call__(self, identity: GpuIdentity) -> list[str]:
        if self._baselines is None:
            self._baselines = Baselines(self.state_dir)
        known = self._baselines.peek().get(identity.uuid) if self.slowdown.get(identity.index) else None
        slowdown = self.slowdown.get(identity.index, 0.0) if known is not None and known.flops else 0.0
        return [
            *worker_argv(MODULE),
            "--slowdown", str(slowdown),
            "--seed", str(int(self.clock() * 1000) + identity.index),
            "--seconds", str(self.seconds),
            "--fault", self.fault,
        ]  # fmt: skip


def simulated_probe_launcher(
    slowdown: Mapping[int, float],
    state_dir: Path,
    *,
    clock: Callable[[], float] = time.time,
    seconds: float = 0.2,
    fault: str = "none",
) -> WorkerLauncher:
    """The launcher of the simulated node's probe worker (`slowdown`: GPU index -> share of throughput lost)."""
    command = SimulatedWorkerCommand(dict(slowdown), state_dir, clock, seconds, fault)
    return WorkerLauncher(command, engines=lambda: ["simulated worker"], pid_namespace_inode=lambda: PROC_PID_INIT_INO)
