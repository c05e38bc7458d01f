"""The `workloads` collector: whose job runs on each GPU, from the compute processes the vendor backends reported.

It runs in the `poll` job right after the vendor collectors (registry order), so the /proc read follows the NVML or
AMD SMI read as closely as the agent can make it. Each GPU's processes are grouped by workload (a Slurm job,
Kubernetes pod, container, systemd unit or the process itself, gpuwatch/readers/cgroup.py) and exported as
gpuwatch_gpu_workload_info and _memory_bytes; PIDs never become labels, and past `workloads.max_per_gpu` workloads
on one GPU the smallest are summed into kind="other", so the series per GPU stay bounded.

Everything it adds is declared here: its section [workloads] (SETTINGS), its families (FAMILIES), what it stores
(`Workloads`, through SampleStore.set_part) and how that is exported (export_gpu), its schedule and its check lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import ClassVar

from gpuwatch.collectors.base import POLL, CheckLine, CollectorContext
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.latch import Latch
from gpuwatch.core.metric_spec import GPU, MetricSpec, SampleSink
from gpuwatch.core.model import GpuSample
from gpuwatch.readers.cgroup import Workload
from gpuwatch.readers.procfs import ProcessOwner, Procfs, Unreadable, UserNames

log = logging.getLogger(__name__)

NOT_HOST_PIDS = Workload("unknown", "pid_namespace")
HIDDEN = Workload("unknown", "hidden")


@dataclass(frozen=True, slots=True)
class WorkloadsSection:
    """[workloads]: how many workloads a GPU exports, and where the GPU processes are looked up (docs/workloads.md)."""

    SECTION: ClassVar[str] = "workloads"

    max_per_gpu: int = 8  # workloads exported per GPU; the rest are summed into kind="other"
    procfs_root: str = "/proc"  # a container without the host's PID namespace: a mount of the host's /proc

    def problems(self) -> Iterator[tuple[str, str]]:
        if not 1 <= self.max_per_gpu <= 256:
            yield (
                "max_per_gpu",
                f"must be between 1 and 256 (got {self.max_per_gpu}); each is a series per GPU, the rest are summed",
            )
        if not self.procfs_root.startswith("/"):
            yield "procfs_root", f"must be an absolute path such as /proc or /host/proc, got {self.procfs_root!r}"


SETTINGS = WorkloadsSection

FAMILIES = (
    MetricSpec(
        "gpuwatch_gpu_workload_info",
        "gauge",
        (*GPU, "kind", "id", "user", "gpu_instance_id"),
        "A workload holding the GPU (kind: slurm_job, k8s_pod, container, systemd_unit, process, unknown, other); 1. "
        "gpu_instance_id: the MIG GPU instance its processes run in, empty on a GPU without MIG.",
    ),
    MetricSpec(
        "gpuwatch_gpu_workload_memory_bytes",
        "gauge",
        (*GPU, "kind", "id", "gpu_instance_id"),
        "GPU memory the workload's compute processes hold, where the vendor reports it for each of them.",
    ),
)


@dataclass(frozen=True, slots=True)
class GpuWorkload:
    """One workload on one GPU: a Slurm job, Kubernetes pod, container, systemd unit, process, ``unknown`` (its
    processes could not be read) or ``other`` (those past the per-GPU bound, summed)."""

    kind: str
    id: str
    user: str  # the user holding most of its GPU memory; "" where unknown or several summed
    memory_bytes: int | None  # None: the vendor did not report every one of its processes' memory
    processes: int
    gpu_instance_id: str = ""  # the MIG GPU instance its processes run in; "" on a GPU without MIG


Workloads = Mapping[str, tuple[GpuWorkload, ...]]  # what a run stores: GPU uuid -> its workloads, largest first


def export_gpu(part: Workloads | None, gpu: tuple[str, str], out: SampleSink) -> None:
    """The GPU's workloads as of the last run (none before the first)."""
    for w in (part or {}).get(gpu[1], ()):
        out.add("gpuwatch_gpu_workload_info", (*gpu, w.kind, w.id, w.user, w.gpu_instance_id), 1)
        out.add("gpuwatch_gpu_workload_memory_bytes", (*gpu, w.kind, w.id, w.gpu_instance_id), w.memory_bytes)


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
    ``unknown`` —, or None for a process that is gone) and the MIG GPU instance they run in, the largest
    `max_per_gpu` by memory, the rest as "other"."""
    groups: dict[tuple[Workload, str], _Group] = {}
    instances = sample.process_gpu_instance
    for pid in sample.process_pids or ():
        found = owner(pid)
        if found is None:
            continue
        workload, user = (found.workload, found.user) if isinstance(found, ProcessOwner) else (found, "")
        instance = str(instances[pid]) if pid in instances else ""
        groups.setdefault((workload, instance), _Group()).add(user, sample.process_memory_bytes.get(pid))
    ranked = sorted(
        groups.items(), key=lambda item: (-(item[1].memory or 0), item[0][0].kind, item[0][0].id, item[0][1])
    )
    out = [_workload(w, g, max(g.users, key=lambda u: (g.users[u], u)), i) for (w, i), g in ranked[:max_per_gpu]]
    if len(ranked) > max_per_gpu:
        rest = _Group()
        for _w, group in ranked[max_per_gpu:]:
            rest.merge(group)
        out.append(_workload(Workload("other", "other"), rest, ""))
    return tuple(out)


def _workload(workload: Workload, group: _Group, user: str, gpu_instance_id: str = "") -> GpuWorkload:
    return GpuWorkload(workload.kind, workload.id, user, group.memory, group.processes, gpu_instance_id)


class WorkloadsCollector:
    """Attributes every fresh GPU's compute processes to workloads, each run, into the store."""

    name = "workloads"
    schedule = POLL

    def __init__(self, context: CollectorContext) -> None:
        self._context = context
        self._checked: Path | None = None  # the procfs root whose namespace and hidepid were looked at
        self._host_pids = False
        self._hidepid: str | bool | None = False  # False: not looked up yet
        self._boot_time: float | None = None  # the host's, for telling a reused PID from the GPU's process
        self._own_pid: int | None = None  # the agent's PID as the procfs numbers it: its children are probe workers
        self._said = Latch(log)  # each problem said once: it holds until the agent's mounts change
        self._users = UserNames(clock=context.monotonic)

    def _procfs(self) -> Procfs:
        given = self._context.sources.procfs
        return (
            given if given is not None else Procfs(Path(self._context.config().section(WorkloadsSection).procfs_root))
        )

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
        max_per_gpu = self._context.config().section(WorkloadsSection).max_per_gpu
        found: dict[str, tuple[GpuWorkload, ...]] = {}
        for uuid in snap.samples:
            sample = snap.fresh(uuid)
            if sample is not None and sample.process_pids:
                owner = partial(self._owner, procfs, listed_at=sample.timestamp)
                found[uuid] = attribute(sample, owner, max_per_gpu)
        self._context.store.set_part(self.name, found)
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
    root = config.section(WorkloadsSection).procfs_root
    procfs = sources.procfs if sources.procfs is not None else Procfs(Path(root))
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
    limit = config.section(WorkloadsSection).max_per_gpu
    return [CheckLine("ok", what, f"the host's PID namespace, readable; at most {limit} workloads per GPU")]
