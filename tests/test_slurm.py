"""`gpuwatch slurm health-check` and `gpuwatch slurm epilog` against a real Slurm on loopback (docs/slurm.md).

Debian's slurmctld, slurmd, slurm-client and munge (22.05): a one-node cluster generated in a temp dir, run as root
with `ProctrackType=proctrack/linuxproc` and `TaskPlugin=task/none` (no cgroup setup), munged with a generated key
on its own socket (`AuthInfo=socket=`), every daemon on 127.0.0.1 (`CommunicationParameters=NoInAddrAny,
NoCtldInAddrAny`: src/common/slurm_protocol_api.c:3190-3219 binds the address this host's name resolves to) on
free ports. The agents are real `gpuwatch run --backend simulated` processes.

The node's 8 GPUs are a `gpu` GRES whose `File=` entries are links to /dev/null: slurmd wants a character or
block device behind each (src/plugins/gres/common/gres_common.c:77-104 stats it), allocates them as it allocates
real GPUs and gives the epilog their indices, in gres.conf's order (gres_common.c:147-225 numbers the files,
:683-708 writes SLURM_JOB_GPUS) — the order of /dev/nvidia0..7, which is the simulated node's GPU index. Nothing
of Slurm's GPU handling is simulated: only the device files are not GPUs.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ports import free_port
from processes import stop, wait_until_ready

from gpuwatch.probe.locks import lock_path

NODE = "gwnode"
DAEMONS = ("munged", "slurmctld", "slurmd", "scontrol", "srun", "sinfo")


def _missing() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]

    def scontrol(self, *args: str) -> str:
        done = subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"scontrol {args}: {done.stderr}"
        return done.stdout

    def node(self) -> tuple[str, str]:
        """(State=... less NOT_RESPONDING, Reason without its [user@time] stamp). slurmctld flags a node it has just
        resumed NOT_RESPONDING until its next ping is answered: its ping state, not the drain these tests are about."""
        text = self.scontrol("show", "node", NODE)
        state = re.search(r"\bState=(\S+)", text)
        reason = re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*@[^\]]*\])?$", text, re.M)
        assert state is not None, text
        return state.group(1).replace("+NOT_RESPONDING", ""), reason.group(1) if reason else ""

    def set_node(self, state: str, reason: str = "") -> None:
        self.scontrol("update", f"NodeName={NODE}", f"State={state}", *([f"Reason={reason}"] if reason else []))

    def reset(self) -> None:
        """The node back to IDLE, with no reason, whatever a test left."""
        if "DRAIN" in self.node()[0] or "DOWN" in self.node()[0]:
            self.set_node("RESUME")
        _until(lambda: self.node() == ("IDLE", ""), "the node back to IDLE", 30)


def _until(ok: Any, what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = _missing()
    if missing or os.geteuid() != 0:
        why = f"missing {', '.join(missing)}" if missing else "not root (slurmd runs jobs as root here)"
        if os.environ.get("CI"):
            raise RuntimeError(f"the Slurm test needs Debian's slurmctld slurmd slurm-client munge as root: {why}")
        pytest.skip(f"Slurm test: {why} (apt-get install slurmctld slurmd slurm-client munge; run as root)")
    host = socket.gethostname().split(".")[0]
    address = socket.gethostbyname(host)
    assert address.startswith("127."), (
        f"this host's name {host} resolves to {address}: slurmctld would listen there; map it to 127.0.0.1 in "
        "/etc/hosts for this test"
    )
    d = tmp_path_factory.mktemp("slurm")
    d.chmod(0o700)
    for sub in ("state", "spool", "dev"):
        (d / sub).mkdir()
    for i in range(8):
        (d / "dev" / f"nvidia{i}").symlink_to("/dev/null")
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (d / "slurm.conf").write_text(
        f"""ClusterName=gpuwatchtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# 1: a node an admin set DOWN stays down (2 returns any DOWN node to service when its slurmd next registers)
ReturnToService=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
Epilog={d}/epilog.sh
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={NODE} CPUs=2 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""
    )
    (d / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={d}/dev/nvidia[0-7]\n")
    # Slurm runs the epilog with an environment of its own (no PATH, no SLURM_CONF); a test says what it runs in
    # epilog.args, and it logs what it got.
    epilog = d / "epilog.sh"
    epilog.write_text(
        f"""#!/bin/bash
set -uo pipefail
export SLURM_CONF={d}/slurm.conf
[ -f {d}/epilog.args ] || exit 0
echo "job=$SLURM_JOB_ID gpus=${{SLURM_JOB_GPUS:-}} node=$SLURMD_NODENAME" >> {d}/epilog.log
start=$(date +%s%N)
{sys.executable} -m gpuwatch slurm epilog $(cat {d}/epilog.args) >> {d}/epilog.log 2>&1
code=$?
echo "exit=$code ms=$(( ($(date +%s%N) - start) / 1000000 ))" >> {d}/epilog.log
exit $code
"""
    )
    epilog.chmod(0o755)
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    env.pop("SLURMD_NODENAME", None)
    output = (d / "daemons.out").open("ab")  # what they say in the foreground, beside their log files
    procs = [
        subprocess.Popen(
            [
                _which("munged"),
                "-F",
                "-f",
                f"--socket={d}/munge.sock",
                f"--key-file={key}",
                f"--pid-file={d}/munged.pid",
                f"--log-file={d}/munged.log",
                f"--seed-file={d}/munged.seed",
            ],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        ),
    ]
    try:
        _until(lambda: (d / "munge.sock").exists(), "munged's socket", 20)
        for argv in ([_which("slurmctld"), "-D", "-i"], [_which("slurmd"), "-D", "-N", NODE]):
            procs.append(
                subprocess.Popen([*argv, "-f", str(d / "slurm.conf")], env=env, stdout=output, stderr=subprocess.STDOUT)
            )
        cluster = Cluster(d, env)

        def node_up() -> bool:
            done = subprocess.run(
                ["scontrol", "show", "node", NODE], env=env, capture_output=True, text=True, timeout=30
            )
            return done.returncode == 0 and "State=IDLE " in done.stdout

        _until(node_up, f"slurmd's node {NODE} IDLE (logs in {d})", 60)
        yield cluster
    finally:
        for proc in reversed(procs):
            stop(proc)
        output.close()


@pytest.fixture
def node(cluster: Cluster) -> Iterator[Cluster]:
    cluster.reset()
    (cluster.dir / "epilog.args").unlink(missing_ok=True)
    yield cluster
    cluster.reset()


@dataclass
class Agent:
    url: str
    state_dir: Path
    proc: subprocess.Popen[bytes]


def _agent(tmp: Path, scenario: str) -> Iterator[Agent]:
    port = free_port()
    state = tmp / f"state-{scenario}"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", scenario),
            *("--listen", f"127.0.0.1:{port}", "--state-dir", str(state), "--poll-interval", "1"),
            *("--probe-interval", "3600"),  # its own probe never runs in the test: every result here is the epilog's
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/metrics", proc, f"gpuwatch run ({scenario})")
        yield Agent(url, state, proc)
    finally:
        os.kill(proc.pid, signal.SIGCONT)  # a test may have stopped it
        stop(proc)


@pytest.fixture
def xid_agent(tmp_path: Path) -> Iterator[Agent]:
    yield from _agent(tmp_path, "xid")


@pytest.fixture
def healthy_agent(tmp_path: Path) -> Iterator[Agent]:
    yield from _agent(tmp_path, "healthy")


@pytest.fixture
def slow_agent(tmp_path: Path) -> Iterator[Agent]:
    yield from _agent(tmp_path, "underperforming")


def _document(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url + "/health/gpus?format=json", timeout=5) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    document: dict[str, Any] = json.loads(body)
    return document


def _gpu(document: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in document["gpus"] if g["index"] == index)


def _health_check(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "slurm", "health-check", "--node", NODE, *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_gpu_that_needs_action_drains_the_node_with_a_gpuwatch_reason(node: Cluster, xid_agent: Agent) -> None:
    _until(lambda: _gpu(_document(xid_agent.url), 2)["action"] == "reboot_node", "GPU 2's XID 79 verdict", 30)
    uuid = _gpu(_document(xid_agent.url), 2)["uuid"]
    done = _health_check(node, "--url", xid_agent.url)
    assert done.returncode == 0, done.stderr
    want = f"gpuwatch: GPU 2 ({uuid}) reboot_node"
    state, reason = node.node()
    assert "DRAIN" in state.split("+") and reason == want, (state, reason)
    assert f"{NODE}: drained: {want}" in done.stdout
    listed = subprocess.run(["sinfo", "-R", "-h", "-o", "%n|%E"], env=node.env, capture_output=True, text=True)
    assert f"{NODE}|{want}" in listed.stdout.splitlines(), listed.stdout  # whole in sinfo -R

    # Run again: nothing changes; gpuwatch's own drain for another reason is brought up to date.
    again = _health_check(node, "--url", xid_agent.url)
    assert again.returncode == 0 and "already drained" in again.stdout, again.stdout + again.stderr
    node.set_node("DRAIN", "gpuwatch: GPU 5 (GPU-old) reset_gpu")
    updated = _health_check(node, "--url", xid_agent.url)
    assert updated.returncode == 0 and node.node()[1] == want, updated.stdout + updated.stderr

    # The GPU still needs a reboot, but an admin drained the node for a reason of their own: theirs stays.
    node.set_node("RESUME")
    node.set_node("DRAIN", "admin: fan swap")
    theirs = _health_check(node, "--url", xid_agent.url)
    assert theirs.returncode == 0, theirs.stderr
    assert node.node()[1] == "admin: fan swap"
    assert "drained by someone else (admin: fan swap): left alone; gpuwatch would drain it" in theirs.stdout


def test_resume_only_its_own_drain_once_every_verdict_is_clean(node: Cluster, healthy_agent: Agent) -> None:
    _until(lambda: _document(healthy_agent.url)["healthy"], "a healthy agent", 30)
    node.set_node("DRAIN", "gpuwatch: GPU 2 (GPU-x) reboot_node")
    done = _health_check(node, "--url", healthy_agent.url)
    assert done.returncode == 0, done.stderr
    assert node.node() == ("IDLE", ""), node.node()
    assert "resumed (was: gpuwatch: GPU 2 (GPU-x) reboot_node)" in done.stdout

    for state, reason in (("DRAIN", "admin: memory test"), ("DOWN", "admin: rack power work")):
        node.set_node(state, reason)
        before = node.node()
        kept = _health_check(node, "--url", healthy_agent.url)
        assert kept.returncode == 0, kept.stderr
        assert node.node() == before and before[1] == reason, (state, node.node())
        assert "by someone else" in kept.stdout and "left alone" in kept.stdout
        node.set_node("RESUME")
        _until(lambda: node.node() == ("IDLE", ""), "the node resumed", 20)

    # Healthy and not drained: nothing to do, and the node stays as it is.
    calm = _health_check(node, "--url", healthy_agent.url)
    assert calm.returncode == 0 and calm.stdout.strip() == f"{NODE}: healthy", calm.stdout
    assert node.node() == ("IDLE", "")


def test_the_budget_holds_when_the_agent_or_slurm_does_not_answer(node: Cluster, healthy_agent: Agent) -> None:
    node.set_node("DRAIN", "gpuwatch: GPU 2 (GPU-x) reboot_node")
    os.kill(healthy_agent.proc.pid, signal.SIGSTOP)  # the agent hangs: it accepts, never answers
    try:
        started = time.monotonic()
        hung = _health_check(node, "--url", healthy_agent.url, "--budget", "2")
        took = time.monotonic() - started
    finally:
        os.kill(healthy_agent.proc.pid, signal.SIGCONT)
    assert hung.returncode == 69, hung.stdout + hung.stderr
    assert took < 2 + 1.5, took  # the budget, plus the interpreter's start
    assert f"the agent at {healthy_agent.url}/health/gpus did not answer within the budget" in hung.stderr
    assert node.node()[1] == "gpuwatch: GPU 2 (GPU-x) reboot_node"  # cannot tell: the node is left as it is

    gone = _health_check(node, "--url", f"http://127.0.0.1:{free_port()}", "--budget", "2")
    assert gone.returncode == 69 and "cannot reach the agent" in gone.stderr, gone.stderr

    ctld = int((node.dir / "slurmctld.pid").read_text())
    os.kill(ctld, signal.SIGSTOP)  # slurmctld hangs: scontrol waits on it until it is killed at the budget
    try:
        started = time.monotonic()
        stuck = _health_check(node, "--url", healthy_agent.url, "--budget", "2")
        took = time.monotonic() - started
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert stuck.returncode == 69, stuck.stdout + stuck.stderr
    assert took < 2 + 1.5, took
    assert f"cannot reach Slurm for node {NODE}" in stuck.stderr and "did not answer within" in stuck.stderr

    unknown = _health_check(node, "--url", healthy_agent.url, "--node", "no-such-node")
    assert unknown.returncode == 69 and "no-such-node" in unknown.stderr, unknown.stderr


def _metric(url: str, name: str) -> dict[str, float]:
    """{GPU index: value} of a gpuwatch_probe_* family with a `gpu` label."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.search(r'\bgpu="(\d+)"', line) if line.startswith(name + "{") else None
        if m and (name != "gpuwatch_probe_runs_total" or 'result="ok"' in line):
            out[m.group(1)] = float(line.rsplit(" ", 1)[1])
    return {k: v for k, v in out.items() if v}


def _job_with_epilog(node: Cluster, gpus: int) -> str:
    """Run a trivial job on `gpus` GPUs and wait for its epilog to finish; what the epilog logged for it."""
    log = node.dir / "epilog.log"
    before = log.read_text() if log.exists() else ""
    job = subprocess.run(
        ["srun", f"--gres=gpu:{gpus}", "-N1", "true"], env=node.env, capture_output=True, text=True, timeout=60
    )
    assert job.returncode == 0, job.stderr
    _until(lambda: log.exists() and log.read_text().count("exit=") > before.count("exit="), f"the epilog ({log})", 30)
    # The epilog has written its last line, but the node stays COMPLETING until slurmd has told slurmctld it ended
    # (a moment, longer on a loaded machine): the node's state is judged after that.
    _until(lambda: "COMPLETING" not in node.node()[0].split("+"), "slurmctld to see the epilog end", 30)
    return log.read_text()[len(before) :]


def test_the_epilog_probes_the_released_gpus_and_the_agent_takes_the_results(node: Cluster, slow_agent: Agent) -> None:
    """Slurm's epilog after real jobs on GPUs 0-3 of the `underperforming` node, whose agent never probes on its own
    here: every probe result and baseline the agent shows is the epilog's. GPU 2 probes 20 % slow once it has a
    baseline (as a GPU that degrades after its baseline was taken): five jobs teach the agent the baselines, the
    sixth job's epilog finds GPU 2 slow and drains the node for it. During the first job, GPU 0's probe lock is held
    (as an agent's own round holds it): the epilog skips GPU 0 rather than overlap."""
    _until(lambda: _document(slow_agent.url)["healthy"], "a healthy agent before any probe", 30)
    (node.dir / "epilog.args").write_text(
        f"--url {slow_agent.url} --state-dir {slow_agent.state_dir} --backend simulated "
        "--scenario underperforming --budget 10"
    )
    uuid0 = _gpu(_document(slow_agent.url), 0)["uuid"]
    held = os.open(lock_path(slow_agent.state_dir, uuid0), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        said = _job_with_epilog(node, 4)
    finally:
        os.close(held)
    assert re.search(r"^job=\d+ gpus=0,1,2,3 node=gwnode$", said, re.M), said  # what Slurm gave the epilog
    took = re.search(r"^exit=0 ms=(\d+)$", said, re.M)
    assert took is not None and int(took.group(1)) < (10 + 1.5) * 1000, said  # exit 0, within its budget
    assert "probed GPU 0 skipped_busy (another probe holds this GPU's lock), 1 ok" in said, said
    assert not list(slow_agent.state_dir.glob("probe-results-*")), "the agent took the hand-over file"
    runs = _metric(slow_agent.url, "gpuwatch_probe_runs_total")
    assert runs == {"1": 1.0, "2": 1.0, "3": 1.0}, runs  # the released GPUs that were free, nothing else
    assert set(_metric(slow_agent.url, "gpuwatch_probe_flops")) == {"1", "2", "3"}

    for _ in range(4):  # the agent's baselines take 5 probes (docs/probe.md)
        said = _job_with_epilog(node, 4)
        assert re.search(r"^exit=0 ms=\d+$", said, re.M) and f"{NODE}: healthy" in said, said
    assert _metric(slow_agent.url, "gpuwatch_probe_runs_total") == {"0": 4.0, "1": 5.0, "2": 5.0, "3": 5.0}
    baselines = _metric(slow_agent.url, "gpuwatch_probe_baseline_flops")
    assert set(baselines) == {"1", "2", "3"}, baselines  # GPU 0 has had 4 probes: no baseline yet
    assert node.node() == ("IDLE", "")

    said = _job_with_epilog(node, 4)
    gpu2 = _gpu(_document(slow_agent.url), 2)
    assert gpu2["action"] == "reset_gpu" and any("slow probe" in e for e in gpu2["evidence"]), gpu2
    flops = _metric(slow_agent.url, "gpuwatch_probe_flops")
    assert flops["2"] < 0.85 * baselines["2"], (flops, baselines)
    want = f"gpuwatch: GPU 2 ({gpu2['uuid']}) reset_gpu"
    assert f"{NODE}: drained: {want}" in said and re.search(r"^exit=0 ms=\d+$", said, re.M), said
    assert node.node() == ("IDLE+DRAIN", want), node.node()


def _epilog(cluster: Cluster, agent: Agent, gpus: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuwatch slurm epilog` run as Slurm runs it, with the environment Slurm gives it (as the test above shows)."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "gpuwatch", "slurm", "epilog", "--url", agent.url, "--node", NODE),
            *("--state-dir", str(agent.state_dir), "--backend", "simulated", "--scenario", "healthy", *args),
        ],
        env={**cluster.env, "SLURM_JOB_GPUS": gpus, "SLURM_JOB_ID": "77"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _workers_of(state_dir: Path) -> list[str]:
    """The simulated probe workers still running for this agent's state dir."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpuwatch.simulated.probe_worker" in argv and any(str(state_dir).encode() in a for a in argv):
            found.append(proc.name)
    return found


def test_the_epilog_kills_its_probe_at_the_budget_and_still_exits_0(node: Cluster, healthy_agent: Agent) -> None:
    """A budget shorter than a probe: the workers are killed at its end (results `timeout`, which drain nothing), the
    agent still gets them, and the epilog exits 0 in time; an unreachable agent or a malformed SLURM_JOB_GPUS is said
    on stderr, never an exit status that would drain the node."""
    _until(lambda: _document(healthy_agent.url)["healthy"], "a healthy agent", 30)
    started = time.monotonic()
    short = _epilog(node, healthy_agent, "4,5", "--budget", "1")  # the probe gets 0.6 s, opening the GPUs included
    took = time.monotonic() - started
    assert short.returncode == 0, short.stdout + short.stderr
    assert took < 1 + 1.5, took
    assert "job 77: probed GPU 4 timeout" in short.stdout and ", 5 timeout" in short.stdout, short.stdout
    assert not _workers_of(healthy_agent.state_dir)
    _until(lambda: not list(healthy_agent.state_dir.glob("probe-results-*")), "the agent to take the results", 5)
    metrics = _text(healthy_agent.url + "/metrics")
    assert (
        _runs(metrics, "4", "timeout") == 1 and _runs(metrics, "5", "timeout") == 1 and _runs(metrics, "3", "ok") == 0
    )
    assert node.node() == ("IDLE", "")

    gone = Agent(f"http://127.0.0.1:{free_port()}", healthy_agent.state_dir, healthy_agent.proc)
    unreachable = _epilog(node, gone, "not-a-list", "--budget", "3")
    assert unreachable.returncode == 0, unreachable.stderr
    assert "SLURM_JOB_GPUS='not-a-list' is not a comma-separated list of GPU indices" in unreachable.stderr
    assert "cannot reach the agent" in unreachable.stderr
    bad = _epilog(node, healthy_agent, "1", "--budget", "0")
    assert bad.returncode == 2 and "--budget 0 must be between" in bad.stderr, bad.stderr
    wrong = _epilog(node, Agent("127.0.0.1:9845", healthy_agent.state_dir, healthy_agent.proc), "1")
    assert wrong.returncode == 2 and "is not an http:// or https:// base URL" in wrong.stderr, wrong.stderr
    assert "probed" not in wrong.stdout  # said before any probe


def _runs(metrics: str, gpu: str, result: str) -> float:
    """gpuwatch_probe_runs_total of one GPU and result (0 when absent)."""
    for line in metrics.splitlines():
        if line.startswith("gpuwatch_probe_runs_total{") and f'gpu="{gpu}"' in line and f'result="{result}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_the_agent_takes_what_it_understands_and_moves_aside_what_it_does_not(healthy_agent: Agent) -> None:
    """Hand-over files are state files: one that is not JSON is moved aside (the agent runs on), a GPU the agent
    does not know is ignored, and a good one is recorded and removed."""
    from gpuwatch.probe.handoff import hand_over
    from gpuwatch.state.probebook import ProbeOutcome

    uuid1 = _gpu(_document(healthy_agent.url), 1)["uuid"]
    garbage = healthy_agent.state_dir / "probe-results-1-1.json"
    garbage.write_text('{"kind": "probe_results", "version": 1, "outcomes": [{"uuid": 7}]}')
    outcomes = [
        ProbeOutcome(uuid1, 1, "skipped_busy", "2 compute process(es)", time.time()),
        ProbeOutcome("GPU-not-here", 3, "failed", "x", time.time()),
    ]
    good = hand_over(healthy_agent.state_dir, outcomes, "a test")
    _until(lambda: not good.exists() and not garbage.exists(), "both files taken", 10)
    assert list(healthy_agent.state_dir.glob("probe-results-1-1.json.corrupt-*"))
    metrics = _text(healthy_agent.url + "/metrics")
    assert _runs(metrics, "1", "skipped_busy") == 1
    assert "GPU-not-here" not in metrics
    assert healthy_agent.proc.poll() is None


@pytest.fixture
def no_driver_agent(tmp_path: Path) -> Iterator[Agent]:
    yield from _agent(tmp_path, "backend_down")


def test_node_findings_alone_neither_drain_nor_resume(node: Cluster, no_driver_agent: Agent) -> None:
    """The vendor library down: /health/gpus is 503 with only node findings (no GPU has a verdict). The health check
    drains nothing for them, and keeps its own drain until the node is wholly clean (docs/slurm.md, "The rule")."""
    _until(lambda: _document(no_driver_agent.url)["node_findings"], "the agent's node findings", 30)
    document = _document(no_driver_agent.url)
    assert not document["healthy"] and not any(g["action"] not in ("none", "restart_app") for g in document["gpus"])
    calm = _health_check(node, "--url", no_driver_agent.url)
    assert calm.returncode == 0, calm.stderr
    assert f"{NODE}: not drained: no GPU needs draining, but the node is not clean (GpuBackendDown" in calm.stdout
    assert node.node() == ("IDLE", "")
    node.set_node("DRAIN", "gpuwatch: GPU 2 (GPU-x) reboot_node")
    kept = _health_check(node, "--url", no_driver_agent.url)
    assert kept.returncode == 0 and f"{NODE}: stays drained" in kept.stdout, kept.stdout + kept.stderr
    assert node.node() == ("IDLE+DRAIN", "gpuwatch: GPU 2 (GPU-x) reboot_node")


def test_diag_before_resume_resumes_only_after_gpuwatch_diag_passed(node: Cluster, healthy_agent: Agent) -> None:
    """--diag-before-resume (docs/diag.md, "Slurm"): level 1 on the drained node's GPUs, its real children, before
    the resume; a failed test or a budget too small for it leaves the node drained, saying why."""
    pytest.importorskip("torch")  # the simulated node's diag children run on torch's CPU device (scripts/test.sh)
    _until(lambda: _document(healthy_agent.url)["healthy"], "a healthy agent", 30)
    diag = ("--diag-before-resume", "--backend", "simulated", "--state-dir", str(healthy_agent.state_dir))
    healthy = ("--scenario", "healthy")  # the agent's (the default, mixed, would fail three of its GPUs' tests)

    node.set_node("DRAIN", "gpuwatch: GPU 2 (GPU-x) reboot_node")
    short = _health_check(node, "--url", healthy_agent.url, "--budget", "20", *diag)
    assert short.returncode == 0, short.stderr
    assert "DRAIN" in node.node()[0].split("+"), node.node()
    assert "left drained: --diag-before-resume needs 45 s of the budget" in short.stdout

    done = _health_check(node, "--url", healthy_agent.url, "--budget", "58", *diag, *healthy)
    assert done.returncode == 0, done.stderr
    assert node.node() == ("IDLE", ""), (node.node(), done.stdout, done.stderr[-3000:])
    assert (
        "resumed (was: gpuwatch: GPU 2 (GPU-x) reboot_node); every GPU is healthy "
        "(after gpuwatch diag --level 1 passed)" in done.stdout
    )
    written = json.loads((healthy_agent.state_dir / "diag_results.json").read_text())
    assert len(written["gpus"]) == 8

    # The diag's node has a GPU with faulty memory (the agent's verdicts are clean so far): the diag decides, and its
    # results reach the agent, whose verdict then holds the failure.
    node.set_node("DRAIN", "gpuwatch: GPU 2 (GPU-x) reboot_node")
    faulty = _health_check(node, "--url", healthy_agent.url, "--budget", "58", *diag, "--scenario", "ecc_uncorrectable")
    assert faulty.returncode == 0, faulty.stderr
    assert "DRAIN" in node.node()[0].split("+"), node.node()
    assert "left drained: gpuwatch diag --level 1 failed: GPU 2 hbm:" in faulty.stdout, faulty.stdout
    _until(lambda: _gpu(_document(healthy_agent.url), 2)["state"] == "unhealthy", "GPU 2 judged", 20)
    gpu = _gpu(_document(healthy_agent.url), 2)
    assert gpu["action"] == "reset_gpu" and any(e.startswith("GpuDiagFailed: diag hbm") for e in gpu["evidence"])
