"""Name the workload a process belongs to from the text of its /proc/PID/cgroup: parsing only, no I/O.

The file has one line per hierarchy, ``hierarchy-ID:controller-list:cgroup-path`` (man 7 cgroups, "/proc/[pid]/
cgroup"); cgroup v2 has the single line ``0::PATH``, a v1 or hybrid host one line per mounted hierarchy. Every path
is judged and the most specific workload wins (Slurm job > Kubernetes pod > container > systemd unit), because on v1
the names differ by controller: Slurm's task/cgroup places a task in cpuset/memory/devices/freezer only, while
``name=systemd`` still shows slurmd.service.

The names each manager gives its cgroups (docs/workloads.md has the sources):
- Slurm cgroup/v2 (src/plugins/cgroup/v2/cgroup_v2.c): ``<CgroupSlice>/[<node>_]slurmstepd.scope/job_<id>/
  step_<s>/user/task_<n>``; from Slurm 26.05 the job directory is the job's SLUID (``s`` + 13 Crockford base32
  characters, src/common/sluid.c print_sluid) unless ``CgroupJobIdPaths=yes``.
- Slurm cgroup/v1 (src/plugins/cgroup/v1/xcgroup.c): ``<CgroupPrepend, default /slurm>/uid_<u>/job_<id>/step_<s>``.
- kubelet (pkg/kubelet/cm/pod_container_manager_linux.go, cgroup_manager_linux.go): pod cgroup ``pod<UID>`` under
  ``kubepods[/besteffort|/burstable]`` (cgroupfs driver); the systemd driver joins the parts with ``-``, turns the
  UID's ``-`` into ``_`` (escapeSystemdCgroupName) and adds ``.slice``.
- Container runtimes through runc/crun's systemd driver: ``<prefix>-<64 hex id>.scope`` with prefix docker,
  cri-containerd, crio, libpod (podman), nerdctl; cgroupfs driver: ``/docker/<id>``, ``.../pod<UID>/<id>``,
  ``/libpod_parent/libpod-<id>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

WorkloadKind = Literal["slurm_job", "k8s_pod", "container", "systemd_unit", "process", "unknown", "other"]

# Most specific first: the first kind any line of the file names wins.
PRECEDENCE: tuple[WorkloadKind, ...] = ("slurm_job", "k8s_pod", "container", "systemd_unit")

_JOB_ID = re.compile(r"^job_(\d+)$")
_SLUID = re.compile(r"^s[0-9A-HJKMNP-TV-Z]{13}$")  # cb32map in src/common/sluid.c: no I, L, O, U
_UID_DIR = re.compile(r"^uid_\d+$")
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"  # static pods: a hash
_POD_CGROUPFS = re.compile(rf"^pod({_UID})$")
_POD_SYSTEMD = re.compile(rf"^kubepods(?:-besteffort|-burstable)?-pod({_UID})\.slice$")
_HEX_ID = r"[0-9a-f]{64}"
_SCOPE = re.compile(rf"^(docker|cri-containerd|crio|libpod|nerdctl)-({_HEX_ID})\.scope$")
_BARE_ID = re.compile(rf"^({_HEX_ID})$")
_LIBPOD_CGROUPFS = re.compile(rf"^libpod-({_HEX_ID})$")  # podman --cgroup-manager=cgroupfs: /libpod_parent/libpod-<id>
# The Kubernetes containerID scheme (pod status containerStatuses[].containerID): runtime://id.
_RUNTIME = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o", "libpod": "podman",
            "nerdctl": "containerd"}  # fmt: skip
_UNIT = re.compile(r"^[^/]+\.(service|scope)$")
_NOT_A_WORKLOAD_UNIT = re.compile(r"^(session-[^/]+\.scope|init\.scope|user@\d+\.service)$")


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
    """The most specific workload one cgroup path names, None when it names none (a login session, the root)."""
    parts = [p for p in path.split("/") if p and p != ".."]
    # Read from inside a cgroup namespace, a process outside it shows as "/../.." relative to the reader's root
    # (cgroup-v2.rst, "Namespace"): the ancestors climbed over, kubelet's cgroupfs `kubepods` among them, are hidden.
    climbed = path.startswith("/../") or path == "/.."
    found: dict[WorkloadKind, str] = {}
    for i, part in enumerate(parts):
        before = parts[i - 1] if i else ""
        if "slurm_job" not in found and (job := _slurm_job(before, part)) is not None:
            found["slurm_job"] = job
        under_kubepods = climbed or "kubepods" in parts[:i]
        if match := _POD_SYSTEMD.match(part) or (_POD_CGROUPFS.match(part) if under_kubepods else None):
            found.setdefault("k8s_pod", match.group(1).replace("_", "-"))
        if match := _SCOPE.match(part):
            found["container"] = f"{_RUNTIME[match.group(1)]}://{match.group(2)}"
        elif match := _LIBPOD_CGROUPFS.match(part):
            found["container"] = f"podman://{match.group(1)}"
        elif (match := _BARE_ID.match(part)) and (before == "docker" or "k8s_pod" in found):
            found["container"] = f"{'docker' if before == 'docker' else 'container'}://{match.group(1)}"
        if _UNIT.match(part) and not _NOT_A_WORKLOAD_UNIT.match(part) and not _SCOPE.match(part):
            found["systemd_unit"] = part  # the innermost unit wins
    for kind in PRECEDENCE:
        if kind in found:
            return Workload(kind, found[kind])
    return None


def _slurm_job(before: str, part: str) -> str | None:
    """A job directory: under slurmstepd's scope (cgroup/v2) or a uid_<u> directory (cgroup/v1)."""
    if before.endswith("slurmstepd.scope"):
        if match := _JOB_ID.match(part):
            return match.group(1)
        if _SLUID.match(part):
            return part
    if _UID_DIR.match(before) and (match := _JOB_ID.match(part)):
        return match.group(1)
    return None


def workload_of_cgroup(text: str) -> Workload | None:
    """The most specific workload any line of a /proc/PID/cgroup file names; None: the process is its own."""
    named = [w for path in cgroup_paths(text) if (w := workload_of_path(path)) is not None]
    for kind in PRECEDENCE:
        for workload in named:
            if workload.kind == kind:
                return workload
    return None
