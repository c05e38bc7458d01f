"""The simulated node's probe launcher: the runner starts gpuwatch/simulated/probe_worker.py as a real child, in the
same isolated mode as the production worker, with each GPU's scenario slowdown and the clock its physics gives it.

A simulated GPU computes healthy until its baseline is learnt (the node's baselines file says so), then shows its
scenario's slowdown, as a real GPU degrades after its baseline was taken. The simulated node needs no engine, and
its library reports PIDs of this process's own namespace, so neither check of the production launcher applies.

The probe's load is the node's physics, as any load is: from the worker's start until it is gone, the GPU runs at
its power cap (the clocks, power and temperature the agent reads meanwhile show it), and the worker computes at the
SM clock that load runs at (a GPU capped at 500 W of 700 W: sqrt(500/700) of its peers). The worker is another
process, so it writes its PID to a file this launcher names; the load ends when that process no longer exists (the
runner has reaped it, which also ends the child's telemetry), so no reading between its exit and its reaping shows
an idle GPU in the probe's telemetry.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch.core.model import GpuIdentity
from gpuwatch.probe.baseline import Baselines
from gpuwatch.probe.children import PROC_PID_INIT_INO
from gpuwatch.probe.launch import WorkerLauncher, worker_argv

if TYPE_CHECKING:
    from gpuwatch.simulated.scenarios import SimulatedNode

MODULE = "gpuwatch.simulated.probe_worker"
# A worker that never wrote its PID (it failed before its first line ran) loads its GPU no longer than this.
START_BOUND_S = 20.0


class WorkerAlive:
    """Whether one simulated worker still exists: it writes its PID to `pid_file` as it starts; from then on, while
    /proc/PID is a child of this process (a zombie counts: the runner has not reaped it yet)."""

    def __init__(self, pid_file: Path, *, started: float | None = None) -> None:
        self.pid_file = pid_file
        self.pid: int | None = None
        self._started = time.monotonic() if started is None else started

    def __call__(self) -> bool:
        if self.pid is None:
            try:
                text = self.pid_file.read_text()
            except FileNotFoundError:
                return time.monotonic() - self._started < START_BOUND_S
            self.pid_file.unlink(missing_ok=True)
            self.pid = int(text)
        return _parent_of(self.pid) == os.getpid()


def _parent_of(pid: int) -> int | None:
    """The parent PID of `pid` (proc(5), /proc/PID/stat's 4th field, after the parenthesised comm); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass(slots=True, weakref_slot=True)  # weakref: its PID directory is removed with it
class SimulatedWorkerCommand:
    """The simulated worker's command line for one GPU: its slowdown once its baseline is known, the SM clock share
    its load runs at (with `node`, which then shows the load), a noise seed from the clock (deterministic under a
    test's clock), and how long and how badly it runs."""

    slowdown: Mapping[int, float]
    state_dir: Path
    clock: Callable[[], float] = time.time
    seconds: float = 0.2
    fault: str = "none"
    node: SimulatedNode | None = None
    corrupt: Mapping[int, int] = field(default_factory=dict)  # GPU index -> elements its matmul gets wrong
    _baselines: Baselines | None = field(default=None, init=False)
    _pid_dir: Path | None = field(default=None, init=False)
    _spawns: itertools.count[int] = field(default_factory=itertools.count, init=False)

    def __call__(self, identity: GpuIdentity) -> list[str]:
        if self._baselines is None:
            self._baselines = Baselines(self.state_dir)
        known = self._baselines.peek().get(identity.uuid) if self.slowdown.get(identity.index) else None
        slowdown = self.slowdown.get(identity.index, 0.0) if known is not None and known.flops else 0.0
        load: list[str] = []
        if self.node is not None:
            pid_file = self._pid_directory() / f"gpu{identity.index}-{next(self._spawns)}.pid"
            share = self.node.start_probe_load(identity.index, WorkerAlive(pid_file))
            load = ["--clock-share", f"{share:.6f}", "--pid-file", str(pid_file)]
        return [
            *worker_argv(MODULE),
            "--slowdown", str(slowdown),
            "--seed", str(int(self.clock() * 1000) + identity.index),
            "--seconds", str(self.seconds),
            "--fault", self.fault,
            *load,
            *self._check(identity.index),
        ]  # fmt: skip

    def _check(self, index: int) -> list[str]:
        """On a node with a corrupt GPU, that GPU's worker checks a real matmul on the CPU with its elements corrupted,
        and the lowest healthy GPU's the same matmul uncorrupted (the control); the others, and every GPU of other
        scenarios, report the check as not run: importing torch costs each worker about a second of CPU, too much
        for every probe of every GPU of a demo."""
        if not self.corrupt:
            return []
        if index in self.corrupt:
            return ["--check-on-cpu", "--corrupt-elements", str(self.corrupt[index])]
        control = min(i for i in range(len(self.corrupt) + 1) if i not in self.corrupt)
        return ["--check-on-cpu"] if index == control else []

    def _pid_directory(self) -> Path:
        """A private directory for the workers' PID files, removed when this command goes or the process exits."""
        if self._pid_dir is None:
            self._pid_dir = Path(tempfile.mkdtemp(prefix="gpuwatch-sim-probe-"))
            weakref.finalize(self, shutil.rmtree, self._pid_dir, ignore_errors=True)
        return self._pid_dir


def simulated_probe_launcher(
    slowdown: Mapping[int, float],
    state_dir: Path,
    *,
    clock: Callable[[], float] = time.time,
    seconds: float = 0.2,
    fault: str = "none",
    node: SimulatedNode | None = None,
    corrupt: Mapping[int, int] | None = None,
) -> WorkerLauncher:
    """The launcher of the simulated node's probe worker (`slowdown`: GPU index -> share of throughput lost; `node`:
    the node whose physics the probe's load runs on, None for a worker that loads no GPU; `corrupt`: GPU index ->
    elements of its matmul the checked result finds wrong)."""
    command = SimulatedWorkerCommand(dict(slowdown), state_dir, clock, seconds, fault, node, dict(corrupt or {}))
    return WorkerLauncher(command, engines=lambda: ["simulated worker"], pid_namespace_inode=lambda: PROC_PID_INIT_INO)
