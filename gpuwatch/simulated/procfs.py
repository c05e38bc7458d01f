"""The simulated node's procfs: a /proc/PID entry (cgroup, status, comm) for the compute process each GPU shows
while busy, so `gpuwatch demo` attributes GPUs to workloads as a mixed node would: Slurm jobs (cgroup v2, one job
over two GPUs, and a cgroup v1 job), Kubernetes pods (systemd and cgroupfs drivers), a Docker container, a systemd
service and a bare process in a login session. The files are written as the kernel prints them (man 7 cgroups,
proc(5)); gpuwatch/readers/procfs.py reads them as it reads /proc.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
import weakref
from pathlib import Path

from gpuwatch.simulated.scenarios import SimulatedNode, process_pid

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # what the kernel counts /proc/PID/stat's times in (USER_HZ)
_UPTIME_AT_START_S = 3600

# GPU index (mod the table's length) -> (cgroup file, uid, comm)
_WORKLOADS: tuple[tuple[str, int, str], ...] = (
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", 2001, "python3"),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_1\n", 2001, "python3"),
    (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c1e2b9a_3d4f_4e6a_8b2c_9f0d1e2a3b4c"
        ".slice/cri-containerd-3f2a9c0d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a19.scope\n",
        2000,
        "pt_main_thread",
    ),
    (
        "0::/system.slice/docker-5b1d3c8e9f0a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c.scope\n",
        0,
        "tritonserver",
    ),
    ("0::/system.slice/vllm-inference.service\n", 2998, "vllm"),
    ("0::/user.slice/user-2002.slice/session-4.scope\n", 2002, "jupyter-lab"),
    (
        "5:cpuset:/slurm/uid_2003/job_4250/step_0\n4:memory:/slurm/uid_2003/job_4250/step_0/task_0\n"
        "1:name=systemd:/system.slice/slurmd.service\n",
        2003,
        "lmp",
    ),
    (
        "0::/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/"
        "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376\n",
        2000,
        "python",
    ),
)


def stat_line(pid: int, comm: str, started_ticks: int) -> str:
    """/proc/PID/stat as fs/proc/array.c (do_task_stat) prints it: 52 fields, the 22nd the start time in clock ticks
    after boot; the rest are a running process's plausible values."""
    fields = ["R", "1", str(pid), str(pid), "0", "-1", "4194560", *["0"] * 8, "20", "0", "1", "0", str(started_ticks)]
    fields += ["0"] * (52 - 2 - len(fields))
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def boot_id(seed: int, boot: int) -> str:
    """The simulated node's boot id for its `boot`-th boot: the same for every agent started on that boot, another
    after a "reboot" (simulated.boot), formatted as the kernel's (a random UUID, random(4))."""
    digest = hashlib.sha256(f"gpuwatch-sim-boot:{seed}:{boot}".encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


class SimulatedProcfs:
    """A temporary procfs root with an entry for every GPU's compute process; removed with this object."""

    def __init__(self, node: SimulatedNode, boot: int = 0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="gpuwatch-simproc-")
        weakref.finalize(self, self._dir.cleanup)
        self.root = Path(self._dir.name)
        self._write_self()
        # The node booted an hour before it started, and its jobs a minute before that: every process the driver
        # lists started before the listing, as a real GPU process did.
        boot_time = int(node.wall_time(0.0)) - _UPTIME_AT_START_S
        (self.root / "stat").write_text(f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {boot_time}\nprocesses 1\n")
        random = self.root / "sys" / "kernel" / "random"
        random.mkdir(parents=True)
        (random / "boot_id").write_text(boot_id(node.seed, boot) + "\n")
        started_ticks = (_UPTIME_AT_START_S - 60) * CLOCK_TICKS
        for index in range(node.gpu_count):
            cgroup, uid, comm = _WORKLOADS[index % len(_WORKLOADS)]
            self._write_process(process_pid(node.seed, index), cgroup, uid, comm, started_ticks)
            for pid in node.mig_job_pids(index):  # a MIG GPU's jobs run in its instances, as the GPU's workload
                self._write_process(pid, cgroup, uid, comm, started_ticks)

    def _write_self(self) -> None:
        """The reader's own entry, as in the host's PID namespace: one NSpid, /proc without hidepid."""
        own = self.root / "self"
        own.mkdir()
        (own / "status").write_text("Name:\tgpuwatch\nUid:\t0\t0\t0\t0\nNSpid:\t1\n")
        (own / "mountinfo").write_text(f"22 1 0:21 / {self.root} rw,nosuid,nodev,noexec shared:12 - proc proc rw\n")

    def _write_process(self, pid: int, cgroup: str, uid: int, comm: str, started_ticks: int) -> None:
        entry = self.root / str(pid)
        entry.mkdir()
        (entry / "stat").write_text(stat_line(pid, comm, started_ticks))
        (entry / "cgroup").write_text(cgroup)
        (entry / "comm").write_text(comm + "\n")
        (entry / "status").write_text(
            f"Name:\t{comm}\nState:\tR (running)\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\n"
            f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{pid}\n"
        )
