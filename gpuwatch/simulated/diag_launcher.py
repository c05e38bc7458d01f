"""The simulated node's diag launcher: `gpuwatch diag --backend simulated` starts gpuwatch/simulated/diag_worker.py
as a real child per GPU, in the production child's isolated mode, on torch's CPU device with a small buffer, and with
what the simulated GPU is: the link it trains under load, the SM clock its physics gives the load (the node runs the
load while the child lives, as the probe's does: its readings show it), its scenario's slowdown, and faulty memory
for a memory scenario's GPU."""

from __future__ import annotations

import itertools
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch.core.model import GpuIdentity
from gpuwatch.probe.diag_launch import DiagLauncher
from gpuwatch.probe.launch import worker_argv
from gpuwatch.simulated.probe_launcher import WorkerAlive

if TYPE_CHECKING:
    from gpuwatch.simulated.scenarios import SimulatedNode

MODULE = "gpuwatch.simulated.diag_worker"
HBM_BYTES = 16 * 2**20  # the CPU's share of a simulated GPU's memory test: real patterns, small
MEMORY_FAULTS = ("ecc_uncorrectable", "row_remap_failure")
STUCK_BIT = 8


@dataclass(slots=True, weakref_slot=True)
class SimulatedDiagCommand:
    """One GPU's simulated diag child: starts the node's load on the GPU and reads what it is under it."""

    node: SimulatedNode
    _pid_dir: Path | None = field(default=None, init=False)
    _spawns: itertools.count[int] = field(default_factory=itertools.count, init=False)

    def __call__(self, identity: GpuIdentity) -> list[str]:
        index = identity.index
        pid_file = self._pid_directory() / f"diag{index}-{next(self._spawns)}.pid"
        share = self.node.start_probe_load(index, WorkerAlive(pid_file))
        state = self.node.state(index)  # the link as it trains under the load
        plan = self.node.plan(index)
        stuck = ["--stuck-bit", str(STUCK_BIT)] if plan.fault in MEMORY_FAULTS else []
        return [
            *worker_argv(MODULE),
            "--link-generation", str(state.pcie_generation),
            "--link-width", str(state.pcie_width),
            "--clock-share", f"{share:.6f}",
            "--slowdown", str(plan.probe_slowdown),
            "--pid-file", str(pid_file),
            *stuck,
        ]  # fmt: skip

    def _pid_directory(self) -> Path:
        if self._pid_dir is None:
            self._pid_dir = Path(tempfile.mkdtemp(prefix="gpuwatch-sim-diag-"))
            weakref.finalize(self, shutil.rmtree, self._pid_dir, ignore_errors=True)
        return self._pid_dir


def simulated_diag_launcher(node: SimulatedNode) -> DiagLauncher:
    return DiagLauncher(SimulatedDiagCommand(node), ("--device", "cpu", "--bytes", str(HBM_BYTES)))
