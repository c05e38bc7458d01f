"""Whose job is on each GPU: the procfs reader against fixture trees and this machine's real /proc and child
processes, the per-GPU bound, and the collector through the agent over the simulated node's NVML and procfs."""

from __future__ import annotations

import logging
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from simnode import SimAgent

from gpuwatch.collectors.configuration import load_config
from gpuwatch.collectors.workloads import HIDDEN, NOT_HOST_PIDS, GpuWorkload, attribute
from gpuwatch.config.settings import ConfigError
from gpuwatch.core.model import GpuSample
from gpuwatch.readers.cgroup import Workload
from gpuwatch.readers.procfs import PROC_PID_INIT_INO, ProcessOwner, Procfs, UserNames, user_name
from gpuwatch.simulated.procfs import stat_line
from gpuwatch.simulated.scenarios import process_pid

FIXTURES = Path(__file__).parent / "fixtures" / "cgroups"
UNKNOWN_UID = 3_999_999  # no passwd entry on any sane test machine


def _proc(
    root: Path, pid: int, cgroup: str, uid: int, comm: str = "python3", started_ticks: int = 1000, ppid: int = 1
) -> None:
    entry = root / str(pid)
    entry.mkdir(parents=True)
    (entry / "stat").write_text(stat_line(pid, comm, started_ticks))
    (entry / "cgroup").write_text((FIXTURES / cgroup).read_text() if cgroup.endswith(".cgroup") else cgroup)
    (entry / "comm").write_text(comm + "\n")
    (entry / "status").write_text(f"Name:\t{comm}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{pid}\n")


def _self(root: Path, nspid: str = "1", mount_options: str = "rw") -> None:
    (root / "self").mkdir(parents=True)
    (root / "self" / "status").write_text(f"Name:\tgpuwatch\nNSpid:\t{nspid}\n")
    (root / "self" / "mountinfo").write_text(
        f"22 1 0:21 / {root} rw,nosuid,nodev,noexec shared:12 - proc proc {mount_options}\n"
    )


def _sample(pids: dict[int, int | None]) -> GpuSample:
    return GpuSample(
        uuid="GPU-1",
        timestamp=0.0,
        process_pids=tuple(pids),
        process_memory_bytes={p: m for p, m in pids.items() if m is not None},
    )


def test_the_reader_names_workload_and_user_from_a_procfs_tree(tmp_path: Path) -> None:
    """The real uid is the first field of status's Uid: line (proc(5)); a uid without a passwd entry stays a number."""
    _proc(tmp_path, 101, "slurm-v2.cgroup", 0)
    _proc(tmp_path, 102, "login-session-v2.cgroup", UNKNOWN_UID, comm="jupyter-lab")
    procfs = Procfs(tmp_path)
    assert procfs.owner(101) == ProcessOwner(Workload("slurm_job", "4242"), "root")
    assert procfs.owner(102) == ProcessOwner(Workload("process", "jupyter-lab"), str(UNKNOWN_UID))
    assert procfs.owner(103) == "missing"


def test_the_reader_reads_this_machines_real_proc_for_a_real_child() -> None:
    """A real child process, read from the real /proc: its comm names it when its cgroup names no workload."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        owner = Procfs(Path("/proc")).owner(child.pid)
        assert isinstance(owner, ProcessOwner)
        assert owner.user == pwd.getpwuid(os.getuid()).pw_name
        with open(f"/proc/{child.pid}/cgroup") as f:
            named = Procfs(Path("/proc")).owner(os.getpid())
            assert isinstance(named, ProcessOwner)
            if named.workload.kind == "process":  # this test runs in no job, pod, container or unit
                assert owner.workload == Workload("process", Path(sys.executable).name[:15])
            assert f.read()
    finally:
        child.kill()
        child.wait()
    assert Procfs(Path("/proc")).owner(child.pid) == "missing"  # reaped: exited between two reads


def test_pids_are_host_follows_nspid_and_the_namespace_inode(tmp_path: Path) -> None:
    """NSpid lists a task's PIDs from the procfs's namespace down to its own (fs/proc/array.c): two entries mean
    the host's /proc mounted into a container; one entry is the host's procfs only in the initial namespace."""
    ancestor, own = tmp_path / "ancestor", tmp_path / "own"
    _self(ancestor, nspid="81234\t7")
    _self(own, nspid="7")
    assert Procfs(ancestor).pids_are_host()
    (own / "self" / "ns").mkdir()
    (own / "self" / "ns" / "pid").write_text("")  # a regular file: never the initial namespace's inode
    assert not Procfs(own).pids_are_host()
    real = Procfs(Path("/proc")).pids_are_host()
    in_host_namespace = os.stat("/proc/self/ns/pid").st_ino == PROC_PID_INIT_INO
    assert real == in_host_namespace  # this machine's /proc is mounted for the namespace this test runs in


def test_hidepid_is_read_from_the_proc_mount_options(tmp_path: Path) -> None:
    """fs/proc/root.c accepts hidepid=0/1/2/4 or off/noaccess/invisible/ptraceable; systemd's ProtectProc= sets it."""
    for options, expected in (("rw", None), ("rw,hidepid=invisible", "invisible"), ("rw,hidepid=2,gid=27", "2")):
        root = tmp_path / (options.replace(",", "_").replace("=", "-"))
        _self(root, mount_options=options)
        assert Procfs(root).hidepid() == expected
    stacked = tmp_path / "stacked"  # systemd's ProtectProc mounts a fresh procfs over the host's: the top one counts
    _self(stacked, mount_options="rw")
    with open(stacked / "self" / "mountinfo", "a") as f:
        f.write(f"90 22 0:50 / {stacked} rw,nosuid,nodev,noexec - proc proc rw,hidepid=invisible\n")
    assert Procfs(stacked).hidepid() == "invisible"


def test_the_bound_keeps_the_largest_workloads_and_sums_the_rest() -> None:
    owners = {
        1: ProcessOwner(Workload("slurm_job", "7"), "ana"),
        2: ProcessOwner(Workload("slurm_job", "7"), "ana"),
        3: ProcessOwner(Workload("k8s_pod", "u-1"), "bob"),
        4: ProcessOwner(Workload("process", "python3"), "cy"),
        5: ProcessOwner(Workload("process", "a.out"), "dee"),
    }
    sample = _sample({1: 10, 2: 20, 3: 25, 4: 5, 5: None})
    workloads = attribute(sample, owners.get, max_per_gpu=2)
    assert workloads == (
        GpuWorkload("slurm_job", "7", "ana", 30, 2),
        GpuWorkload("k8s_pod", "u-1", "bob", 25, 1),
        GpuWorkload("other", "other", "", None, 2),  # a.out's memory was not reported: the sum is unknown
    )
    assert len(attribute(_sample({p: 1 for p in range(1, 500)}), lambda p: owners[1 + p % 5], 8)) <= 9


def test_gone_processes_are_left_out_and_unreadable_ones_are_unknown() -> None:
    sample = _sample({1: 100, 2: 50, 3: 70})
    found = {1: ProcessOwner(Workload("k8s_pod", "u"), "ana"), 2: None, 3: HIDDEN}
    assert attribute(sample, found.get, 8) == (
        GpuWorkload("k8s_pod", "u", "ana", 100, 1),
        GpuWorkload("unknown", "hidden", "", 70, 1),
    )


def test_the_simulated_node_attributes_each_busy_gpu_through_nvml_and_its_procfs(tmp_path: Path) -> None:
    """The real pynvml over the simulated libnvml reports each busy GPU's process (nvmlProcessInfo_t pid and
    usedGpuMemory); the simulated procfs holds its cgroup file; one Slurm job spans GPUs 0 and 1."""
    sim = SimAgent(tmp_path, scenario="busy", gpus=8)
    try:
        sim.run(3)
        info = {
            dict(labels)["gpu"]: (dict(labels)["kind"], dict(labels)["id"], dict(labels)["user"])
            for name, labels in sim.samples()
            if name == "gpuwatch_gpu_workload_info"
        }
        assert info["0"] == info["1"] == ("slurm_job", "4242", "2001")
        assert info["2"] == ("k8s_pod", "7c1e2b9a-3d4f-4e6a-8b2c-9f0d1e2a3b4c", user_name(2000))
        assert info["3"][0:2] == (
            "container",
            "docker://" + "5b1d3c8e9f0a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c",
        )
        assert info["4"][0:2] == ("systemd_unit", "vllm-inference.service")
        assert info["5"][0:2] == ("process", "jupyter-lab")
        assert info["6"][0:2] == ("slurm_job", "4250")
        for gpu in range(8):
            used = sim.value("gpuwatch_gpu_memory_used_bytes", gpu)
            kind, id_, _user = info[str(gpu)]
            held = sim.value("gpuwatch_gpu_workload_memory_bytes", gpu, kind=kind, id=id_, gpu_instance_id="")
            assert used is not None and held == used  # one process holds all of it in the simulated node
        assert sim.value("gpuwatch_collector_success", collector="workloads") == 1
    finally:
        sim.close()


def test_an_idle_gpu_has_no_workload_series(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="healthy", gpus=2)
    try:
        sim.run(2)
        assert not [n for n, _ in sim.samples() if n.startswith("gpuwatch_gpu_workload_")]
    finally:
        sim.close()


def test_a_container_without_the_host_pid_namespace_exports_unknown_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = SimAgent(tmp_path / "state", scenario="busy", gpus=2)
    own = tmp_path / "own"
    _self(own, nspid="7")
    (own / "self" / "ns").mkdir()
    (own / "self" / "ns" / "pid").write_text("")
    sim.agent._sources.procfs = Procfs(own)
    try:
        with caplog.at_level(logging.WARNING, logger="gpuwatch.collectors.workloads"):
            sim.run(3)
        kinds = {(dict(lab)["kind"], dict(lab)["id"]) for n, lab in sim.samples() if n == "gpuwatch_gpu_workload_info"}
        assert kinds == {(NOT_HOST_PIDS.kind, NOT_HOST_PIDS.id)}
        said = [r for r in caplog.records if r.name == "gpuwatch.collectors.workloads"]
        assert len(said) == 1 and "hostPID" in said[0].getMessage() and "pid_namespace" in said[0].getMessage()
    finally:
        sim.close()


def test_hidepid_invisible_makes_other_users_processes_unknown_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """hidepid=invisible: other users' /proc/PID do not exist for the agent (proc(5)), as under systemd's
    ProtectProc=invisible; the agent says so once rather than dropping them as exited."""
    sim = SimAgent(tmp_path / "state", scenario="busy", gpus=2)
    hidden = tmp_path / "hidden"
    _self(hidden, mount_options="rw,hidepid=invisible")
    sim.agent._sources.procfs = Procfs(hidden, host_pids=True)
    try:
        with caplog.at_level(logging.WARNING, logger="gpuwatch.collectors.workloads"):
            sim.run(3)
        kinds = {(dict(lab)["kind"], dict(lab)["id"]) for n, lab in sim.samples() if n == "gpuwatch_gpu_workload_info"}
        assert kinds == {(HIDDEN.kind, HIDDEN.id)}
        said = [r.getMessage() for r in caplog.records if r.name == "gpuwatch.collectors.workloads"]
        assert len(said) == 1 and "hidepid=invisible" in said[0] and "ProtectProc" in said[0]
    finally:
        sim.close()


@pytest.mark.parametrize("mount_options", ["rw", "rw,hidepid=invisible"])
def test_processes_that_exit_between_the_nvml_read_and_the_proc_read_are_left_out(
    tmp_path: Path, mount_options: str
) -> None:
    """No /proc entry for the GPU processes: gone. Under hidepid=invisible too when this reader sees PID 1 (root's
    init): it is exempt (root, CAP_SYS_PTRACE or the mount's gid=), so nothing is hidden from it."""
    sim = SimAgent(tmp_path / "state", scenario="busy", gpus=2)
    empty = tmp_path / "empty"
    _self(empty, mount_options=mount_options)
    _proc(empty, 1, "0::/init.scope\n", 0, comm="systemd")
    sim.agent._sources.procfs = Procfs(empty, host_pids=True)
    try:
        sim.run(2)
        assert sim.value("gpuwatch_gpu_processes", 0) == 1
        assert not [n for n, _ in sim.samples() if n == "gpuwatch_gpu_workload_info"]
    finally:
        sim.close()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_per_gpu": 0}, "workloads.max_per_gpu: must be between 1 and 256"),
        ({"procfs_root": "host/proc"}, "workloads.procfs_root: must be an absolute path"),
        ({"max_per_gpus": 3}, "workloads.max_per_gpus: unknown key; did you mean 'max_per_gpu'?"),
    ],
)
def test_the_workloads_section_is_validated(tmp_path: Path, values: dict[str, object], message: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[workloads]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in values.items()))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert message in str(raised.value)


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_each_process_memory_comes_from_the_vendor_library(tmp_path: Path, vendor: str) -> None:
    """NVML: nvmlProcessInfo_t.usedGpuMemory (nvml.h; pynvml turns NVML_VALUE_NOT_AVAILABLE into None). AMD SMI:
    amdsmi_proc_info_t.memory_usage.vram_mem in bytes (amdsmi.h), as amdsmi_get_gpu_process_list returns it."""
    sim = SimAgent(tmp_path, scenario="busy", gpus=2, vendor=vendor)
    try:
        sim.run(2)
        process = sim.node.state(0).processes[0]
        held = sim.value("gpuwatch_gpu_workload_memory_bytes", 0, kind="slurm_job", id="4242", gpu_instance_id="")
        assert held == process.used_memory_bytes > 0
    finally:
        sim.close()


def test_user_names_are_looked_up_once_per_ttl() -> None:
    """A uid's name may come from LDAP or SSSD: the poll job asks the user database once per TTL, not per poll."""
    now = [0.0]
    names = UserNames(ttl_seconds=600, clock=lambda: now[0])
    assert names(0) == pwd.getpwuid(0).pw_name
    assert names(UNKNOWN_UID) == str(UNKNOWN_UID)
    assert names(None) == ""
    names._names[0] = ("cached", 600.0)  # what a lookup at t=0 left; a lookup would say "root"
    now[0] = 599.0
    assert names(0) == "cached"
    now[0] = 600.0
    assert names(0) == pwd.getpwuid(0).pw_name


NODES = {  # a node of each kind: its GPU processes' cgroup files (tests/fixtures/cgroups/README.md cites each format)
    "slurm": ("slurm-v2.cgroup", "slurm-v2-sluid.cgroup", "slurm-v1.cgroup"),
    "kubernetes": (
        "k8s-systemd-containerd-burstable.cgroup",
        "k8s-systemd-crio-guaranteed.cgroup",
        "k8s-cgroupfs-docker-besteffort.cgroup",
    ),
    "docker": ("docker-v2-systemd.cgroup", "docker-v1-cgroupfs.cgroup", "docker-rootless-v2.cgroup"),
    "systemd": ("systemd-service-v2.cgroup", "hybrid-systemd-service.cgroup", "login-session-v2.cgroup"),
    # a login node where users hold delegated subtrees (user@UID.service) and name them like a job or a pod (#31)
    "tenant": ("tenant-forged-slurm-v2.cgroup", "tenant-forged-pod-v2.cgroup", "systemd-user-service-v2.cgroup"),
}


@pytest.mark.parametrize("node", sorted(NODES))
def test_each_kind_of_node_attributes_its_gpus(tmp_path: Path, node: str) -> None:
    """A procfs tree per node kind, one GPU process per fixture, read through the reader and the bound as the
    collector reads them."""
    from test_workloads_cgroup import EXPECTED

    procfs = Procfs(tmp_path, host_pids=True)
    for offset, fixture in enumerate(NODES[node]):
        pid = 1000 + offset
        _proc(tmp_path, pid, fixture, 0, comm="train")
        (workload,) = attribute(_sample({pid: 2**30}), lambda p: procfs.owner(p), 8)
        expected = EXPECTED[fixture] or Workload("process", "train")
        assert (workload.kind, workload.id, workload.user, workload.memory_bytes) == (
            expected.kind,
            expected.id,
            "root",
            2**30,
        ), fixture


_READ = (
    "import sys; from pathlib import Path; from gpuwatch.readers.procfs import Procfs; "
    "p = Procfs(Path(sys.argv[1])); o = p.owner(int(sys.argv[2])); "
    "print(o if isinstance(o, str) else o.workload.kind + ':' + o.user, p.hides_others())"
)


_PYCACHE = shutil.ignore_patterns("__pycache__")


def _real_hidepid(option: str) -> list[str]:
    """In a private mount namespace: a procfs mounted hidepid=`option`, a process of uid 65534, and the reader run
    as uid 65533 (another user) and as root; each prints what it read of that process."""
    root = Path(tempfile.mkdtemp(prefix=f"gpuwatch-hidepid-{option}-"))  # pytest's tmp_path is root's alone (0700)
    root.chmod(0o755)
    # The other user imports gpuwatch from a world-readable copy (the checkout may sit in a 0700 directory, as CI's
    # clone does) with the interpreter itself, not the virtualenv's link to it (the reader needs only the stdlib).
    code = Path(tempfile.mkdtemp(prefix="gpuwatch-hidepid-code-"))
    shutil.copytree(Path(__file__).resolve().parent.parent / "gpuwatch", code / "gpuwatch", ignore=_PYCACHE)
    for path in [code, *code.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    python = os.path.realpath(sys.executable)
    read = f"{python} -c {shlex.quote(_READ)} {root} $S"
    shell = (
        f"mount -t proc -o hidepid={option} proc {root} || exit 3; export PYTHONPATH={code}; "
        "setpriv --reuid=65534 --regid=65534 --clear-groups sleep 30 & S=$!; sleep 0.3; "
        f"setpriv --reuid=65533 --regid=65533 --clear-groups {read}; {read}; kill $S"
    )
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=60)
    finally:
        root.rmdir()
        shutil.rmtree(code)
    if done.returncode == 3:
        pytest.skip(f"cannot mount a procfs here: {done.stderr.strip()}")
    assert done.returncode in (0, 143) and len(done.stdout.splitlines()) == 2, done.stdout + done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv")),
    reason="needs root, unshare and setpriv to mount a procfs with hidepid= and run as two users",
)
@pytest.mark.parametrize(
    ("option", "other_user"),
    [("invisible", "missing invisible"), ("noaccess", "hidden None")],
)
def test_a_real_hidepid_mount_is_read_as_the_kernel_means_it(option: str, other_user: str) -> None:
    """proc(5), hidepid: "invisible" (2) hides other users' /proc/PID (ENOENT, as for an exited process, so the
    mount option tells them apart), "noaccess" (1) denies access (EACCES); root is exempt and reads everything."""
    assert _real_hidepid(option) == [other_user, "process:nobody None"]


def test_check_says_when_workloads_would_be_unknown(tmp_path: Path) -> None:
    """`gpuwatch check` warns, with the remedy, for a procfs root with no procfs, and for a container's own /proc;
    a procfs of the host's namespace (NSpid with the ancestor's PID first) is ok."""
    from gpuwatch.collectors.sources import NodeSources
    from gpuwatch.collectors.workloads import check

    sources = NodeSources([], lambda: {}, None)
    own, ancestor = tmp_path / "own", tmp_path / "ancestor"
    _self(own, nspid="7")
    (own / "self" / "ns").mkdir()
    (own / "self" / "ns" / "pid").write_text("")
    _self(ancestor, nspid="81234\t7")
    lines = {
        name: check(load_config(None, {"workloads": {"procfs_root": str(root)}}), sources, "workloads")
        for name, root in (("none", tmp_path / "empty"), ("own", own), ("ancestor", ancestor))
    }
    assert [line.level for line in lines["none"]] == ["warn"] and "procfs_root" in lines["none"][0].fix
    assert [line.level for line in lines["own"]] == ["warn"] and "hostPID" in lines["own"][0].fix
    assert [line.level for line in lines["ancestor"]] == ["ok"]


def test_a_pid_reused_after_the_vendor_listed_it_is_not_the_gpus_process(tmp_path: Path) -> None:
    """The driver lists PIDs; by the time /proc is read the process may have exited and the kernel given its PID to
    another. /proc/PID/stat's 22nd field is the start time in clock ticks after boot and /proc/stat's btime the boot
    in unix seconds (proc(5)): a process that started after the listing is not the one listed."""
    ticks = os.sysconf("SC_CLK_TCK")
    (tmp_path / "stat").write_text("cpu  1 2 3 4\nbtime 1800000000\nprocesses 9\n")
    _proc(tmp_path, 101, "slurm-v2.cgroup", 0, comm="weird (name) x", started_ticks=100 * ticks)  # 100 s after boot
    procfs = Procfs(tmp_path, host_pids=True)
    assert procfs.boot_time() == 1_800_000_000.0
    listed_after_start = 1_800_000_000.0 + 150
    listed_before_start = 1_800_000_000.0 + 50
    assert procfs.owner(101, listed_at=listed_after_start, boot_time=procfs.boot_time()) == ProcessOwner(
        Workload("slurm_job", "4242"), "root"
    )
    assert procfs.owner(101, listed_at=listed_before_start, boot_time=procfs.boot_time()) == "missing"
    (workload,) = attribute(_sample({101: 1}), lambda p: procfs.owner(p, None, 1_800_000_150.0, 1_800_000_000.0), 8)
    assert workload.kind == "slurm_job"


def test_a_real_process_started_after_the_listing_is_left_out() -> None:
    """The same against the real /proc: a child started after the moment the 'vendor' listed its PID is refused,
    and accepted for a listing after its start."""
    procfs = Procfs(Path("/proc"))
    boot = procfs.boot_time()
    assert boot is not None
    before = time.time() - 2.0  # btime is whole seconds: the check allows one, so list clearly before the start
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        assert procfs.owner(child.pid, listed_at=before, boot_time=boot) == "missing"
        owner = procfs.owner(child.pid, listed_at=time.time(), boot_time=boot)
        assert isinstance(owner, ProcessOwner)
    finally:
        child.kill()
        child.wait()


def test_a_stat_that_is_not_a_process_s_is_distrusted(tmp_path: Path) -> None:
    _proc(tmp_path, 7, "slurm-v2.cgroup", 0)
    (tmp_path / "7" / "stat").write_text("garbage without the command's parentheses\n")
    assert Procfs(tmp_path, host_pids=True).owner(7) == "missing"


def test_the_agents_own_probe_worker_is_no_ones_workload(tmp_path: Path) -> None:
    """The probe's worker is the agent's child (gpuwatch/probe/supervisor.py spawns it) and holds a context on the
    GPU while it probes, so the driver lists it: it is left out, not shown as the agent's unit. The agent's PID is
    what ``<root>/self`` links to (proc(5)): the host's PID when the host's /proc is mounted into a container."""
    sim = SimAgent(tmp_path / "state", scenario="busy", gpus=2)
    tree = tmp_path / "proc"
    agent_pid = 4000
    (tree / str(agent_pid)).mkdir(parents=True)
    (tree / "self").symlink_to(str(agent_pid))
    (tree / str(agent_pid) / "status").write_text(f"Name:\tgpuwatch\nNSpid:\t{agent_pid}\n")
    worker, job = (process_pid(sim.node.seed, gpu) for gpu in (0, 1))
    _proc(tree, worker, "systemd-service-v2.cgroup", 0, comm="python3", ppid=agent_pid)
    _proc(tree, job, "slurm-v2.cgroup", 0, comm="python3", ppid=1)
    sim.agent._sources.procfs = Procfs(tree, host_pids=True)
    try:
        sim.run(2)
        info = {dict(lab)["gpu"]: dict(lab)["kind"] for n, lab in sim.samples() if n == "gpuwatch_gpu_workload_info"}
        assert info == {"1": "slurm_job"}
        assert sim.value("gpuwatch_gpu_processes", 0) == 1  # still counted as a process on the GPU
    finally:
        sim.close()


def test_a_tenant_posing_as_a_slurm_job_or_pod_adds_nothing_to_it(tmp_path: Path) -> None:
    """#31 (3), through the agent: the simulated node's NVML lists a process on each GPU; on GPU 1 it is Slurm job
    4242's, on GPUs 0 and 2 a user's, in directories of their own user@1000.service named
    ``evil_slurmstepd.scope/job_4242/…`` and ``kubepods-pod<uid>.slice/x`` (tests/fixtures/cgroups/README.md).
    Job 4242 holds GPU 1 alone, so its GPU-hours, energy and GpuAllocatedButIdle (summed by kind and id) are its
    own; the user's processes are their scope and themselves."""
    from test_workloads_cgroup import UID

    sim = SimAgent(tmp_path / "state", scenario="busy", gpus=3)
    tree = tmp_path / "proc"
    forged_job, real_job, forged_pod = (process_pid(sim.node.seed, gpu) for gpu in range(3))
    _proc(tree, forged_job, "tenant-forged-slurm-v2.cgroup", 1000, comm="python3")
    _proc(tree, real_job, "slurm-v2.cgroup", 2001, comm="python3")
    _proc(tree, forged_pod, "tenant-forged-pod-v2.cgroup", 1000, comm="train")
    sim.agent._sources.procfs = Procfs(tree, host_pids=True)
    try:
        sim.run(2)
        info = {
            dict(lab)["gpu"]: (dict(lab)["kind"], dict(lab)["id"])
            for n, lab in sim.samples()
            if n == "gpuwatch_gpu_workload_info"
        }
        assert info == {
            "0": ("systemd_unit", "user@1000.service/evil_slurmstepd.scope"),
            "1": ("slurm_job", "4242"),
            "2": ("process", "train"),
        }
        assert not any(id_ == UID for _kind, id_ in info.values())
        held = [
            value
            for gpu in range(3)
            if (
                value := sim.value(
                    "gpuwatch_gpu_workload_memory_bytes", gpu, kind="slurm_job", id="4242", gpu_instance_id=""
                )
            )
            is not None
        ]
        assert held == [sim.value("gpuwatch_gpu_memory_used_bytes", 1)]
    finally:
        sim.close()
