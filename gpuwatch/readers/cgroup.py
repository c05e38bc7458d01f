"""Name the workload a process belongs to from the text of its /proc/PID/cgroup: parsing only, no I/O.

The file has one line per hierarchy, ``hierarchy-ID:controller-list:cgroup-path`` (man 7 cgroups, "/proc/[pid]/
cgroup"); cgroup v2 has the single line ``0::PATH``, a v1 or hybrid host one line per mounted hierarchy. Every path
is judged and the most specific workload wins (Slurm job > Kubernetes pod > container > systemd unit), because on v1
the names differ by controller: Slurm's task/cgroup places a task in cpuset/memory/devices/freezer only, while
``name=systemd`` still shows slurmd.service.

The names each manager gives its cgroups (docs/workloads.md has the sources):
- Slurm cgroup/v2 (src/plugins/cgroup/v2/cgroup_v2.c): ``/<CgroupSlice>/[<node>_]slurmstepd.scope/job_<id>/
  step_<s>/user/task_<n>``, the slice right under the root (default system.slice); from Slurm 26.05 the job
  directory is the job's SLUID (``s`` + 13 Crockford base32 characters, src/common/sluid.c print_sluid) unless
  ``CgroupJobIdPaths=yes``.
- Slurm cgroup/v1 (src/plugins/cgroup/v1/xcgroup.c): ``/slurm[_<node>]/uid_<u>/job_<id>/step_<s>`` (CgroupPrepend).
- kubelet (pkg/kubelet/cm/pod_container_manager_linux.go, cgroup_manager_linux.go): pod cgroup ``pod<UID>`` under
  ``/kubepods[/besteffort|/burstable]`` (cgroupfs driver); the systemd driver joins the parts with ``-``, turns the
  UID's ``-`` into ``_`` (escapeSystemdCgroupName) and adds ``.slice``.
- Container runtimes through runc/crun's systemd driver: ``<prefix>-<64 hex id>.scope`` with prefix docker,
  cri-containerd, crio, libpod (podman), nerdctl; cgroupfs driver: ``/docker/<id>``, ``.../pod<UID>/<id>``,
  ``/libpod_parent/libpod-<id>``.

A job or pod counts only at the place its daemon makes it, from the root down; a user with a delegated subtree
(``user@UID.service``) can name directories below it anything, and must not pose as someone's job or pod (#31).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

WorkloadKind = Literal["slurm_job", "k8s_pod", "container", "systemd_unit", "process", "unknown", "other"]

# Most specific first: the first kind any line of the file names wins.
PRECEDENCE: tuple[WorkloadKind, ...] = ("slurm_job", "k8s_pod", "container", "systemd_unit")

_JOB_ID = re.compile(r"^job_(\d+)$")
_SLUID = re.compile(r"^s[0-9A-HJKMNP-TV-Z]{13}$")  # cb32map in src/common/sluid.c: no I, L, O, U
_STEPD_SCOPE = re.compile(r"^(?:[^/]+_)?slurmstepd\.scope$")  # cgroup_v2.c: "%s.scope" or "%s_%s.scope" (node name)
_SLURM_V1_ROOT = re.compile(r"^slurm(?:_[^/]+)?$")  # CgroupPrepend: "/slurm", "/slurm_%n" with multiple slurmd
_UID_DIR = re.compile(r"^uid_\d+$")
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"  # static pods: a hash
_QOS = ("besteffort", "burstable")  # Guaranteed pods have no QoS level (qos_container_manager_linux.go)
_POD_CGROUPFS = re.compile(rf"^pod({_UID})$")
_POD_SYSTEMD = re.compile(rf"^kubepods(?:-(besteffort|burstable))?-pod({_UID})\.slice$")
_HEX_ID = r"[0-9a-f]{64}"
_SCOPE = re.compile(rf"^(docker|cri-containerd|crio|libpod|nerdctl)-({_HEX_ID})\.scope$")
_BARE_ID = re.compile(rf"^({_HEX_ID})$")
_LIBPOD_CGROUPFS = re.compile(rf"^libpod-({_HEX_ID})$")  # podman --cgroup-manager=cgroupfs: /libpod_parent/libpod-<id>
# The Kubernetes containerID scheme (pod status containerStatuses[].containerID): runtime://id.
_RUNTIME = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o", "libpod": "podman",
            "nerdctl": "containerd"}  # fmt: skip
_UNIT = re.compile(r"^[^/]+\.(service|scope)$")
_USER_MANAGER = re.compile(r"^user@\d+\.service$")
_NOT_A_WORKLOAD_UNIT = re.compile(r"^(session-[^/]+\.scope|init\.scope)$")


@dataclass(frozen=True, slots=True)
class Workload:
    """What a process belongs to: its kind and the id that names it among workloads of that kind."""

    kind: WorkloadKind
    id: str


def cgroup_paths(text: str) -> list[str]:
    """The cgroup paths of a /proc/PID/cgroup file, v2's ``0::`` line first; malformed lines are skipped."""
    unified: list[str] = []
    legacy: list[str] = []
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        _controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and path.startswith("/")):
            continue
        (unified if hierarchy == "0" else legacy).append(path)
    return unified + legacy


def workload_of_path(path: str) -> Workload | None:
    """The most specific workload one cgroup path names, None when it names none (a login session, the root).

    A Slurm job or a pod is believed only where slurmstepd or kubelet make it: at the root of the hierarchy, every
    component before the job or pod being the daemon's (_anchored). Anyone holding a delegated subtree (a user's
    ``user@UID.service``, a service with Delegate=yes, a container with a writable cgroupfs) can name directories
    below it as they like, so a ``job_4242`` or ``kubepods-pod<uid>.slice`` there is their own unit's or process's."""
    parts = [p for p in path.split("/") if p]
    # Read from inside a cgroup namespace, a process outside it shows as "/../.." relative to the reader's root
    # (cgroup-v2.rst, "Namespace"): the climb ends at the lowest ancestor the two share, so what follows starts at
    # some level of the daemon's hierarchy (kubepods, hidden, among the ancestors climbed over).
    climbed = 0
    while climbed < len(parts) and parts[climbed] == "..":
        climbed += 1
    parts = parts[climbed:]
    if ".." in parts or "." in parts:
        return None  # the kernel writes ".." only before the path (cgroup_path_ns): this is no cgroup file's
    if (job := _slurm_job(parts, climbed > 0)) is not None:
        return Workload("slurm_job", job)
    if (pod := _pod(parts, climbed > 0)) is not None:
        return Workload("k8s_pod", pod)
    if (container := _container(parts)) is not None:
        return Workload("container", container)
    if (unit := _unit(parts)) is not None:
        return Workload("systemd_unit", unit)
    return None


Component = Callable[[str], "str | bool | None"]  # a test of one path component; a str names the workload


def _anchored(parts: list[str], chains: tuple[tuple[Component, ...], ...], climbed: bool) -> str | None:
    """What the last component of a chain names, where `parts` begin with that whole chain (from the root), or,
    after a namespace climb, with its tail (the climb ended at one of the chain's own levels)."""
    for chain in chains:
        for start in range(len(chain) if climbed else 1):
            tail = chain[start:]
            if len(parts) < len(tail):
                continue
            results = [test(part) for test, part in zip(tail, parts, strict=False)]
            if all(results) and isinstance(results[-1], str):
                return results[-1]
    return None


def _is(name: str) -> Component:
    return lambda part: part == name


def _matches(pattern: re.Pattern[str]) -> Component:
    return lambda part: pattern.match(part) is not None


def _job_v2(part: str) -> str | None:
    """cgroup_v2.c cgroup_p_step_create: "/job_%u", or the SLUID unless CgroupJobIdPaths=yes."""
    if match := _JOB_ID.match(part):
        return match.group(1)
    return part if _SLUID.match(part) else None


def _job_v1(part: str) -> str | None:
    return match.group(1) if (match := _JOB_ID.match(part)) else None


def _slice(part: str) -> bool:
    """CgroupSlice (default system.slice): one path component, right under the root (cgroup_v2.c, _set_int_cg_ns)."""
    return part.endswith(".slice")


_SLURM_CHAINS: tuple[tuple[Component, ...], ...] = (
    (_slice, _matches(_STEPD_SCOPE), _job_v2),  # cgroup/v2: /<CgroupSlice>/[<node>_]slurmstepd.scope/<job>
    (_matches(_SLURM_V1_ROOT), _matches(_UID_DIR), _job_v1),  # cgroup/v1: /slurm[_<node>]/uid_<u>/job_<id>
)


def _slurm_job(parts: list[str], climbed: bool) -> str | None:
    return _anchored(parts, _SLURM_CHAINS, climbed)


def _pod_systemd(qos: str | None) -> Component:
    def test(part: str) -> str | None:
        match = _POD_SYSTEMD.match(part)
        return match.group(2).replace("_", "-") if match and match.group(1) == qos else None

    return test


def _pod_cgroupfs(part: str) -> str | None:
    return match.group(1) if (match := _POD_CGROUPFS.match(part)) else None


_POD_CHAINS: tuple[tuple[Component, ...], ...] = (
    # systemd driver: CgroupName{kubepods, <qos>, pod<uid>}.ToSystemd(), each level a slice named for its parents
    (_is("kubepods.slice"), _pod_systemd(None)),
    *((_is("kubepods.slice"), _is(f"kubepods-{q}.slice"), _pod_systemd(q)) for q in _QOS),
    # cgroupfs driver: CgroupName{kubepods, <qos>, pod<uid>}.ToCgroupfs()
    (_is("kubepods"), _pod_cgroupfs),
    *((_is("kubepods"), _is(q), _pod_cgroupfs) for q in _QOS),
)


def _pod(parts: list[str], climbed: bool) -> str | None:
    return _anchored(parts, _POD_CHAINS, climbed)


def _container(parts: list[str]) -> str | None:
    """A container runtime's scope or directory, the innermost one."""
    found = None
    for i, part in enumerate(parts):
        if match := _SCOPE.match(part):
            found = f"{_RUNTIME[match.group(1)]}://{match.group(2)}"
        elif match := _LIBPOD_CGROUPFS.match(part):
            found = f"podman://{match.group(1)}"
        elif (match := _BARE_ID.match(part)) and i and parts[i - 1] == "docker":
            found = f"docker://{match.group(1)}"
    return found


def _unit(parts: list[str]) -> str | None:
    """The unit systemd placed the process in: the first .service or .scope after the slices it sits in. What a
    unit with Delegate=yes makes below itself is its own, never another unit. A user's own units, below their
    ``user@UID.service``, are named with it (``user@1000.service/app.service``): never the system's unit of that
    name."""
    manager = ""
    for part in parts:
        if part.endswith(".slice"):
            continue
        if _USER_MANAGER.match(part) and not manager:
            manager = part + "/"
            continue
        if _UNIT.match(part) and not _NOT_A_WORKLOAD_UNIT.match(part) and not _SCOPE.match(part):
            return manager + part
        return None
    return None


def workload_of_cgroup(text: str) -> Workload | None:
    """The most specific workload any line of a /proc/PID/cgroup file names; None: the process is its own."""
    named = [w for path in cgroup_paths(text) if (w := workload_of_path(path)) is not None]
    for kind in PRECEDENCE:
        for workload in named:
            if workload.kind == kind:
                return workload
    return None
