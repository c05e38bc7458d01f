"""The `workloads` collector: whose job runs on each GPU, from the compute processes the vendor backends reported.

It runs in the `poll` job right after the vendor collectors (registry order), so the /proc read follows the NVML or
AMD SMI read as closely as the agent can make it. Each GPU's processes are grouped by workload (a Slurm job,
Kubernetes pod, container, systemd unit or the process itself, gpuwatch/readers/cgroup.py) and exported as
gpuwatch_gpu_workload_info and _memory_bytes; PIDs never become labels, and past `workloads.max_per_gpu` workloads
on one GPU the smallest are summed into kind="other", so the series per GPU stay bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from gpuwatch.collectors.base import CheckLine, CollectorContext, Every
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.latch import Latch
from gpuwatch.core.model import GpuSample, GpuWorkload
from gpuwatch.readers.cgroup import Workload
from gpuwatch.readers.procfs import ProcessOwner, Procfs, Unreadable, UserNames

log = logging.getLogger(__name__)

NOT_HOST_PIDS = Workload("unknown", "pid_namespace")
HIDDEN = Workload("unknown", "hidden")


@dataclass(slots=True)
class _Group:
    memory: int | None = 0
    processes: int = 0
    users: dict[str, int] = field(default_factory=dict)  # user -> GPU memory of their processes

    def add(self, user: str, memory: int | None) -> None:
        self.processes += 1
        self.memory = None if memory is None or self.memory is None else self.memory + memory
        self.users[user] = self.users.get(user, 0) + (memory or 0)

    def merge(self, other: _Group) -> None:
        self.processes += other.processes
        self.memory = None if other.memory is None or self.memory is None else self.memory + other.memory


def attribute(
    sample: GpuSample, owner: Callable[[int], ProcessOwner | Workload | None], max_per_gpu: int
) -> tuple[GpuWorkload, ...]:
    """A GPU's workloads: its processes grouped by `owner` (a workload and user, a workload without a user —
    ``unknown`` —, or None for a process that is gone), the largest `max_per_gpu` by memory, the rest as "other"."""
    groups: dict[Workload, _Group] = {}
    for pid in sample.process_pids or ():
        found = owner(pid)
        if found is None:
            continue
        workload, user = (found.workload, found.user) if isinstance(found, ProcessOwner) else (found, "")
        groups.setdefault(workload, _Group()).add(user, sample.process_memory_bytes.get(pid))
    ranked = sorted(groups.items(), key=lambda item: (-(item[1].memory or 0), item[0].kind, item[0].id))
    out = [_workload(w, g, max(g.users, key=lambda u: (g.users[u], u))) for w, g in ranked[:max_per_gpu]]
    if len(ranked) > max_per_gpu:
        rest = _Group()
        for _w, group in ranked[max_per_gpu:]:
            rest.merge(group)
        out.append(_workload(Workload("other", "other"), rest, ""))
    return tuple(out)


def _workload(workload: Workload, group: _Group, user: str) -> GpuWorkload:
    return GpuWorkload(workload.kind, workload.id, user, group.memory, group.processes)


class WorkloadsCollector:
    """Attributes every fresh GPU's compute processes to workloads, each run, into the store."""

    name = "workloads"
    schedule = Every("poll")

    def __init__(self, context: CollectorContext) -> None:
        self._context = context
        self._checked: Path | None = None  # the procfs root whose namespace and hidepid were looked at
        self._host_pids = False
        self._hidepid: str | bool | None = False  # False: not looked up yet
        self._boot_time: float | None = None  # the host's, for telling a reused PID from the GPU's process
        self._own_pid: int | None = None  # the agent's PID as the procfs numbers it: its children are probe workers
        self._said = Latch(log)  # each problem said once: it holds until the agent's mounts change
        self._users = UserNames(clock=context.monotonic)

    @property
    def interval_seconds(self) -> float:
        return self._context.config().agent.poll_interval_seconds

    def _procfs(self) -> Procfs:
        given = self._context.sources.procfs
        return given if given is not None else Procfs(Path(self._context.config().workloads.procfs_root))

    def update(self) -> bool:
        procfs = self._procfs()
        if self._checked != procfs.root:  # the first run, or a reload that moved workloads.procfs_root
            self._checked, self._hidepid = procfs.root, False
            self._host_pids = procfs.pids_are_host()
            self._boot_time = procfs.boot_time()
            self._own_pid = procfs.own_pid()
            if not self._host_pids:
                self._say_once(
                    "pid_namespace",
                    f"{procfs.root} is not the host's PID namespace (a container without hostPID?): the GPU "
                    "processes' PIDs come from the driver and name other processes or none here, so their workloads "
                    'are exported as kind="unknown" id="pid_namespace". Run the agent with the host PID namespace '
                    "(hostPID: true, --pid=host) or set workloads.procfs_root to a mount of the host's /proc.",
                )
        snap = self._context.store.snapshot()
        max_per_gpu = self._context.config().workloads.max_per_gpu
        found: dict[str, tuple[GpuWorkload, ...]] = {}
        for uuid in snap.samples:
            sample = snap.fresh(uuid)
            if sample is not None and sample.process_pids:
                owner = partial(self._owner, procfs, listed_at=sample.timestamp)
                found[uuid] = attribute(sample, owner, max_per_gpu)
        self._context.store.set_workloads(found)
        return True

    def _owner(self, procfs: Procfs, pid: int, *, listed_at: float) -> ProcessOwner | Workload | None:
        if not self._host_pids:
            return NOT_HOST_PIDS
        owner: ProcessOwner | Unreadable = procfs.owner(pid, self._users, listed_at, self._boot_time)
        if owner == "missing":
            if self._hidepid is False:
                self._hidepid = procfs.hides_others()
            if self._hidepid is None:
                return None  # exited between the vendor's read and this one
            owner = "hidden"
        if owner == "hidden":
            self._say_once(
                "hidden",
                f"cannot read {procfs.root}/<pid> of other users' GPU processes ({procfs.root} is mounted "
                f"hidepid={self._hidepid or 'noaccess'}; systemd's ProtectProc=invisible does this): their workloads "
                'are exported as kind="unknown" id="hidden". Under systemd, install the drop-in '
                "systemd/drop-ins/workloads.conf (ProtectProc=default); docs/workloads.md, Permissions.",
            )
            return HIDDEN
        if not isinstance(owner, ProcessOwner):
            return None
        if self._own_pid is not None and owner.parent == self._own_pid:
            return None  # the agent's own probe worker, on a GPU the probe found idle: no one's workload
        return owner

    def _say_once(self, key: str, message: str) -> None:
        self._said.fail("workloads: %s", message, key=key)


def collectors(context: CollectorContext, name: str) -> list[WorkloadsCollector]:
    return [WorkloadsCollector(context)]


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """`gpuwatch check`: whether the GPU processes' /proc entries can be read here (docs/workloads.md)."""
    procfs = sources.procfs if sources.procfs is not None else Procfs(Path(config.workloads.procfs_root))
    what = f"workloads {procfs.root}" if sources.procfs is None else "workloads"
    if not (procfs.root / "self" / "status").exists():
        return [
            CheckLine(
                "warn",
                what,
                "no procfs there: every GPU process's workload is exported as unknown",
                "set workloads.procfs_root to the host's /proc (or a mount of it)",
            )
        ]
    if not procfs.pids_are_host():
        return [
            CheckLine(
                "warn",
                what,
                "not the host's PID namespace: workloads are exported as unknown (pid_namespace)",
                "run the agent with the host PID namespace (hostPID: true, --pid=host) or set workloads.procfs_root "
                "to a mount of the host's /proc",
            )
        ]
    hidden = procfs.hides_others()
    if hidden is not None:
        return [
            CheckLine(
                "warn",
                what,
                f"mounted hidepid={hidden}: other users' GPU processes are exported as unknown (hidden)",
                "under systemd install systemd/drop-ins/workloads.conf (ProtectProc=default); docs/workloads.md",
            )
        ]
    limit = config.workloads.max_per_gpu
    return [CheckLine("ok", what, f"the host's PID namespace, readable; at most {limit} workloads per GPU")]
