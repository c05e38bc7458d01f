"""The probe runner with real child processes: timeouts, crashes, busy GPUs, locks, and the simulated scenarios
driving the exported metrics through the real agent."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from simnode import SimAgent

from gpuwatch.config.settings import ProbeSection
from gpuwatch.probe.children import PROC_PID_INIT_INO, _pids_of, pid_namespace_inode
from gpuwatch.probe.launch import WorkerLauncher
from gpuwatch.probe.locks import try_lock, unlock
from gpuwatch.probe.runner import ProbeRunner
from gpuwatch.simulated.probe_launcher import simulated_probe_launcher
from gpuwatch.state.probebook import RESULTS

QUICK = ProbeSection(
    interval_seconds=60.0, timeout_seconds=30.0, warmup_min_seconds=0.0, warmup_max_seconds=0.0, measure_seconds=0.1
)


def host_namespace() -> int:
    return PROC_PID_INIT_INO  # the host's, even where CI runs in a container


def fixed(
    command: list[str],
    engines: Callable[[], list[str]] = lambda: ["script"],
    inode: Callable[[], int | None] = host_namespace,
) -> WorkerLauncher:
    """A script standing in for the worker on every GPU, with these engines, in this PID namespace."""
    return WorkerLauncher(lambda _identity: command, engines, inode)


def runner(
    sim: SimAgent,
    tmp_path: Path,
    settings: ProbeSection = QUICK,
    *,
    command: list[str] | None = None,
    launcher: WorkerLauncher | None = None,
    **kw: object,
) -> ProbeRunner:
    """A runner over the SimAgent's store, starting the simulated node's worker (its launcher, as the agent's), or
    `command` standing in for the worker, or what `launcher` starts."""
    if launcher is None and command is not None:
        launcher = fixed(command)
    launcher = launcher or sim.sources.probe_launcher
    return ProbeRunner(settings, sim.agent.store, tmp_path, clock=sim.clock.wall, launcher=launcher, **kw)  # type: ignore[arg-type]


def production(
    engines: list[str], inode: int | None = PROC_PID_INIT_INO, command: list[str] | None = None
) -> WorkerLauncher:
    """The production launcher (the real worker, unless `command`), with these engines in this PID namespace."""
    if command is None:
        return WorkerLauncher(engines=lambda: engines, pid_namespace_inode=lambda: inode)
    return fixed(command, lambda: engines, lambda: inode)


def faulty(tmp_path: Path, fault: str = "none", seconds: float = 0.2) -> WorkerLauncher:
    """The simulated worker, misbehaving (a real child that crashes, hangs or answers garbage) or slow."""
    return simulated_probe_launcher({}, tmp_path, fault=fault, seconds=seconds)


@pytest.fixture
def sim(tmp_path: Path):  # type: ignore[no-untyped-def]
    agent = SimAgent(tmp_path, scenario="healthy", gpus=2, probe={"interval_seconds": 60.0})
    agent.run(2.0)
    yield agent
    agent.close()


def test_the_results_the_rules_read_are_exported_at_zero_from_start_up(sim: SimAgent) -> None:
    """ok, failed and timeout from 0 (GpuProbeFailing's increase() sees a first failure); the skips and compute errors
    from their first (a compute error is counted from 0 in gpuwatch_probe_compute_errors_total):
    docs/cost-and-sizing.md, "The series budget"."""
    for gpu in (0, 1):
        for result in RESULTS:
            expected = 0.0 if result in ("ok", "failed", "timeout") else None
            assert sim.value("gpuwatch_probe_runs_total", gpu, result=result) == expected, result
        assert sim.value("gpuwatch_probe_compute_errors_total", gpu) == 0.0
    assert sim.value("gpuwatch_probe_interval_seconds") == 60.0
    assert sim.value("gpuwatch_collector_interval_seconds", collector="probe") == 60.0
    assert sim.value("gpuwatch_probe_flops", 0, dtype="bf16") is None  # nothing measured yet


def test_a_probe_off_exports_no_probe_series(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="healthy", gpus=1, probe={"interval_seconds": 0.0})
    try:
        sim.run(2.0)
        assert sim.agent.probe is None
        assert "gpuwatch_probe_" not in sim.text()
    finally:
        sim.close()


def test_a_hanging_worker_is_killed_with_its_process_group_at_the_timeout(sim: SimAgent, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        time.sleep(300)
        """)
    )
    settings = dataclasses.replace(QUICK, timeout_seconds=2.0)
    outcomes = runner(sim, tmp_path, settings, command=[sys.executable, str(script)]).run(gpus={0})
    assert [o.result for o in outcomes] == ["timeout"]
    grandchild = int(pidfile.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    sim._scraped = None
    assert sim.value("gpuwatch_probe_runs_total", 0, result="timeout") == 1.0


def test_a_crashing_worker_is_failed_with_the_reason(sim: SimAgent, tmp_path: Path) -> None:
    outcomes = runner(sim, tmp_path, launcher=faulty(tmp_path, "crash")).run(gpus={0})
    assert outcomes[0].result == "failed" and "SIGABRT" in outcomes[0].reason


def test_a_worker_with_a_malformed_result_is_failed(sim: SimAgent, tmp_path: Path) -> None:
    outcomes = runner(sim, tmp_path, launcher=faulty(tmp_path, "garbage")).run(gpus={0})
    assert outcomes[0].result == "failed" and "malformed" in outcomes[0].reason


def test_no_engine_is_skipped_unsupported_never_failed(sim: SimAgent, tmp_path: Path) -> None:
    # The agent's cheap look (nothing importable) ...
    outcomes = runner(sim, tmp_path, launcher=production(engines=[])).run()
    assert {o.result for o in outcomes} == {"skipped_unsupported"}
    assert "pip install" in outcomes[0].reason
    # ... and the worker's own answer when the engine it was told to use is missing.
    engine = dataclasses.replace(QUICK, engine="cupy")
    outcomes = runner(sim, tmp_path, engine, launcher=production(engines=["cupy"])).run(gpus={0})
    assert outcomes[0].result == "skipped_unsupported", outcomes[0].reason


def test_a_container_pid_namespace_is_skipped_unsupported_and_says_why(
    sim: SimAgent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NVML reports host PIDs; in a PID namespace of its own the runner cannot tell its children from others."""
    other = tmp_path / "not-a-pid-namespace"
    other.write_text("")
    assert pid_namespace_inode(other) == other.stat().st_ino != PROC_PID_INIT_INO
    assert pid_namespace_inode(tmp_path / "missing") is None
    command = [sys.executable, "-c", "print('not a result')"]  # a worker that ran is `failed`, never skipped
    probe = runner(sim, tmp_path, launcher=production(["cupy"], pid_namespace_inode(other), command))
    with caplog.at_level("WARNING", logger="gpuwatch.probe"):
        first, second = probe.run(), probe.run()
    assert {o.result for o in first + second} == {"skipped_unsupported"}  # the worker never ran (it would fail)
    assert "own PID namespace" in first[0].reason and "hostPID: true" in first[0].reason
    assert sum("own PID namespace" in r.getMessage() for r in caplog.records) == 1  # logged once, not every round
    # The host's namespace, or one that cannot be read (no /proc/self/ns): the probe runs (and its worker fails).
    for inode in (PROC_PID_INIT_INO, None):
        ran = runner(sim, tmp_path, launcher=production(["cupy"], inode, command)).run(gpus={0})
        assert ran[0].result == "failed", ran[0].reason


def test_mig_and_exclusive_compute_mode_are_skipped_unsupported(sim: SimAgent, tmp_path: Path) -> None:
    snap = sim.agent.store.snapshot()
    readings = []
    for uuid, sample in snap.samples.items():
        identity = snap.identities[uuid]
        changed = {"mig_enabled": True} if identity.index == 0 else {"compute_mode": "exclusive_process"}
        readings.append(type(_reading(identity, sample))(identity, dataclasses.replace(sample, **changed)))
    sim.agent.store.record_poll(readings)
    outcomes = runner(sim, tmp_path).run()
    assert [(o.result, o.reason) for o in outcomes] == [
        ("skipped_unsupported", "MIG mode is enabled"),
        ("skipped_unsupported", "compute mode is exclusive_process"),
    ]


def _reading(identity, sample):  # type: ignore[no-untyped-def]
    from gpuwatch.core.model import GpuReading

    return GpuReading(identity, sample)


def test_a_busy_node_is_skipped_and_counted(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="busy", gpus=2, probe={"interval_seconds": 60.0})
    try:
        sim.run(2.0)
        sim.probe_round()
        for gpu in (0, 1):
            assert sim.value("gpuwatch_probe_runs_total", gpu, result="skipped_busy") == 1.0
            assert sim.value("gpuwatch_probe_runs_total", gpu, result="ok") == 0.0
        assert sim.value("gpuwatch_collector_success", collector="probe") == 1.0
    finally:
        sim.close()


def test_one_busy_gpu_keeps_the_whole_node_from_being_probed(sim: SimAgent, tmp_path: Path) -> None:
    snap = sim.agent.store.snapshot()
    busy = [
        _reading(snap.identities[u], dataclasses.replace(s, process_pids=(4242,)))
        for u, s in snap.samples.items()
        if snap.identities[u].index == 1
    ]
    sim.agent.store.record_poll(busy)
    outcomes = runner(sim, tmp_path).run()
    assert [o.result for o in outcomes] == ["skipped_busy", "skipped_busy"]
    assert "GPU 1" in outcomes[0].reason
    relaxed = dataclasses.replace(QUICK, require_idle_node=False)
    assert [o.result for o in runner(sim, tmp_path, relaxed).run()] == ["ok", "skipped_busy"]


def test_a_result_is_discarded_when_a_process_appears_meanwhile(sim: SimAgent, tmp_path: Path) -> None:
    probe = runner(sim, tmp_path, launcher=faulty(tmp_path, seconds=3.0))
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(probe.run(gpus={0})))
    thread.start()
    snap = sim.agent.store.snapshot()
    uuid = next(u for u in snap.identities if snap.identities[u].index == 0)
    deadline = time.monotonic() + 10
    while not probe.workers.running and time.monotonic() < deadline:  # the child is running
        time.sleep(0.01)
    sample = snap.samples[uuid]
    later = dataclasses.replace(sample, timestamp=sample.timestamp + 0.5, process_pids=(987654,))
    sim.agent.store.record_poll([_reading(snap.identities[uuid], later)])
    thread.join(30)
    (outcome,) = done[0]  # type: ignore[misc]
    assert outcome.result == "skipped_busy" and "987654" in outcome.reason


def test_our_own_children_are_recognised_by_every_pid_of_their_namespaces() -> None:
    pids = _pids_of(os.getpid(), recursive=True)
    assert os.getpid() in pids
    nspid = Path(f"/proc/{os.getpid()}/status").read_text().split("NSpid:")[1].splitlines()[0].split()
    assert {int(p) for p in nspid} <= pids


def test_an_agent_probe_skips_a_gpu_whose_lock_is_held(sim: SimAgent, tmp_path: Path) -> None:
    uuid0 = next(i.uuid for i in sim.agent.store.identities().values() if i.index == 0)
    fd = try_lock(tmp_path, uuid0, wait=False)
    assert fd is not None
    try:
        relaxed = dataclasses.replace(QUICK, require_idle_node=False)
        outcomes = runner(sim, tmp_path, relaxed).run()
        assert [o.result for o in outcomes] == ["skipped_busy", "ok"]
        assert "lock" in outcomes[0].reason
    finally:
        unlock(fd)


def test_a_cli_probe_waits_for_the_running_probe_and_never_overlaps(sim: SimAgent, tmp_path: Path) -> None:
    uuid0 = next(i.uuid for i in sim.agent.store.identities().values() if i.index == 0)
    fd = try_lock(tmp_path, uuid0, wait=False)
    assert fd is not None
    said: list[str] = []
    cli = runner(sim, tmp_path, progress=said.append)
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(cli.run(gpus={0}, explicit=True, wait_for_locks=True)))
    thread.start()
    thread.join(1.0)
    assert thread.is_alive() and not done, "the CLI probe ran while another probe held the GPU"
    assert any("waiting" in s for s in said)
    unlock(fd)
    thread.join(30)
    assert [o.result for o in done[0]] == ["ok"]  # type: ignore[attr-defined]


def test_two_runners_at_once_never_run_a_gpu_twice(sim: SimAgent, tmp_path: Path) -> None:
    """Whichever takes the lock first runs; the other either waited (CLI) or skipped (agent) — never both at once."""
    log = tmp_path / "spans.log"
    script = tmp_path / "span.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys, time
        start = time.time(); time.sleep(0.5)
        open({str(log)!r}, "a").write(f"{{start}} {{time.time()}}\\n")
        sys.exit(3)
        """)
    )
    a = runner(sim, tmp_path, command=[sys.executable, str(script)])
    b = runner(sim, tmp_path, command=[sys.executable, str(script)])
    threads = [threading.Thread(target=lambda r=r: r.run(gpus={0}, explicit=True, wait_for_locks=True)) for r in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) == 2
    assert spans[0][1] <= spans[1][0], f"two probes overlapped on one GPU: {spans}"


@pytest.mark.parametrize(("scenario", "slow_gpu"), [("underperforming", 2), ("mixed", 6)])
def test_probe_scenarios_show_the_slow_gpu_within_a_few_probe_intervals(
    tmp_path: Path, scenario: str, slow_gpu: int
) -> None:
    sim = SimAgent(tmp_path, scenario=scenario, probe={"interval_seconds": 10.0})
    try:
        sim.run(2.0)
        for _ in range(6):  # 5 healthy probes learn the baselines, then the fault shows
            sim.probe_round()
            sim.run(10.0)
        held_down = 2 if scenario == "mixed" else None  # mixed's GPU 2 overheats at idle: never probed
        capped = 5 if scenario == "mixed" else None  # mixed's GPU 5 runs at 500 W of 700 W: its baseline is learnt so
        for gpu in range(8):
            flops = sim.value("gpuwatch_probe_flops", gpu, dtype="bf16")
            baseline = sim.value("gpuwatch_probe_baseline_flops", gpu, dtype="bf16")
            if gpu == held_down:  # probed before it heats up, then skipped: never 5 probes for a baseline
                assert baseline is None
                assert (sim.value("gpuwatch_probe_runs_total", gpu, result="skipped_busy") or 0) >= 4
                continue
            assert flops is not None and baseline is not None
            # the median of healthy H100 probes at the power cap; at a lower cap, at the clock the physics gives it
            share = math.sqrt(500 / 700) if gpu == capped else 1.0
            assert 650e12 * share < baseline < 730e12 * share, (gpu, baseline)
            ratio = flops / baseline
            assert (ratio < 0.85) == (gpu == slow_gpu), (gpu, ratio)
            assert sim.value("gpuwatch_probe_runs_total", gpu, result="ok") == 6.0
            assert sim.value("gpuwatch_probe_power_capped", gpu) == 1.0
    finally:
        sim.close()


def test_a_probe_runs_on_the_simulated_gpus_physics(tmp_path: Path) -> None:
    """Issue #30 (9): mixed's GPU 5, at 500 W of 700 W, probed at 100 % of its peers with the idle clock and 70 W in
    its telemetry. A probe's load is the node's physics: every GPU runs at its power cap while probed, GPU 5 at the
    SM clock its cap gives (sqrt(500/700) of its peers', physics.py), so it computes clearly slower, and a probe that
    says it reached the power limit shows a mean power near that limit and a temperature that rose."""
    sim = SimAgent(tmp_path, scenario="mixed", probe={"interval_seconds": 10.0})
    try:
        sim.run(1.0)  # (GPU 2, whose cooling fails from 1 s, is probed before it heats up)
        before = {gpu: sim.value("gpuwatch_gpu_temperature_celsius", gpu, sensor="core") for gpu in range(8)}
        sim.probe_round()
        probed = [gpu for gpu in range(8) if sim.value("gpuwatch_probe_runs_total", gpu, result="ok") == 1.0]
        assert 5 in probed and len(probed) >= 6, probed
        peers = [gpu for gpu in probed if gpu != 5]
        flops = {gpu: sim.value("gpuwatch_probe_flops", gpu, dtype="bf16") or 0.0 for gpu in probed}
        clock = {gpu: sim.value("gpuwatch_probe_sm_clock_hertz", gpu) or 0.0 for gpu in probed}
        assert flops[5] < 0.95 * statistics.median(flops[g] for g in peers), flops
        assert flops[5] == pytest.approx(math.sqrt(500 / 700) * statistics.median(flops[g] for g in peers), rel=0.03)
        idle_clock = sim.node.profile.clock_idle_mhz["sm"] * 1e6
        assert idle_clock < clock[5] < min(clock[g] for g in peers), clock
        for gpu in probed:
            limit = sim.value("gpuwatch_gpu_power_limit_watts", gpu, limit="enforced")
            assert limit == (500.0 if gpu == 5 else 700.0)
            assert sim.value("gpuwatch_probe_power_capped", gpu) == 1.0, gpu
            assert (sim.value("gpuwatch_probe_power_watts", gpu) or 0.0) >= 0.85 * limit, gpu
            assert (sim.value("gpuwatch_probe_temperature_celsius", gpu) or 0.0) >= (before[gpu] or 0.0), gpu
        # The core warms with the load's 12 s time constant (physics.py) and NVML reports whole degrees: the peak of
        # a GPU whose polls in its window came early (a loaded machine polls less often) may not show a degree yet.
        rose = [g for g in probed if (sim.value("gpuwatch_probe_temperature_celsius", g) or 0.0) > (before[g] or 0.0)]
        assert len(rose) >= len(probed) // 2, (rose, before)
        sim.run(2.0)  # the workers are gone: the GPUs are idle again
        for gpu in probed:
            assert sim.value("gpuwatch_gpu_utilization_ratio", gpu) == 0.0
            assert sim.value("gpuwatch_gpu_clock_hertz", gpu, clock="sm") == idle_clock
    finally:
        sim.close()


def test_a_probe_of_a_healthy_node_raises_no_finding_while_it_runs(tmp_path: Path) -> None:
    """The probe's load raises the GPUs' utilization to 100 % while the PCIe link the agent knows was read (slow tier)
    at idle, where GPUs 3 and 7 of the simulated node rest at gen 1: the status page must not call their link
    downtrained "while busy" for the probe's own load, during the round or from a sample it took."""
    from gpuwatch.judge.findings import health_flags, views

    sim = SimAgent(tmp_path, scenario="healthy", probe={"interval_seconds": 10.0})
    try:
        sim.run(1.0)
        seen: set[tuple[int, str]] = set()
        busy_polls = 0
        round_ = threading.Thread(target=sim.probe_round)
        round_.start()
        while round_.is_alive():
            snap = sim.agent.store.snapshot()
            busy_polls += any((s.utilization_ratio or 0) > 0.5 for s in snap.samples.values())
            seen |= {(v.identity.index, f.alert) for v in views(snap) for f in health_flags(v)}
            time.sleep(0.01)
        round_.join()
        snap = sim.agent.store.snapshot()
        seen |= {(v.identity.index, f.alert) for v in views(snap) for f in health_flags(v)}
        assert busy_polls > 0  # the round's polls showed the load
        assert seen == set()
        assert sim.value("gpuwatch_probe_runs_total", 3, result="ok") == 1.0
    finally:
        sim.close()


def test_a_simulated_workers_load_lasts_until_the_runner_has_reaped_it(tmp_path: Path) -> None:
    """The node runs a probe's load while its worker exists: from before it wrote its PID (starting up), while it
    runs, and as a zombie (exited, not yet reaped: the runner still takes samples into its telemetry), but not once
    reaped; a worker that never wrote its PID loads its GPU no longer than START_BOUND_S."""
    from gpuwatch.simulated.probe_launcher import START_BOUND_S, WorkerAlive

    pid_file = tmp_path / "gpu0.pid"
    alive = WorkerAlive(pid_file)
    assert alive()  # starting up
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    pid_file.write_text(str(child.pid))
    assert alive() and not pid_file.exists()  # read once, then gone
    assert child.stdin is not None
    child.stdin.close()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert alive()  # exited, not reaped
    child.wait()
    assert not alive()
    assert not WorkerAlive(tmp_path / "never.pid", started=time.monotonic() - START_BOUND_S - 1)()


def test_a_worker_that_survives_sigkill_never_blocks_the_round_or_its_locks(
    sim: SimAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker stuck in the driver (uninterruptible) does not die of SIGKILL; the round must still end, release the
    GPU's lock, say so, and reap the worker with poll() once it finally exits. Simulated by a real worker process that
    SIGKILL does not reach (killpg patched to do nothing), so an unbounded wait() would hang this test for 300 s."""
    from gpuwatch.probe import children

    script = tmp_path / "stuck.py"
    script.write_text("import time; time.sleep(300)\n")
    monkeypatch.setattr(children, "KILL_WAIT_SECONDS", 0.3)
    monkeypatch.setattr(children.os, "killpg", lambda pid, sig: None)
    settings = dataclasses.replace(QUICK, timeout_seconds=1.0)
    probe = runner(sim, tmp_path, settings, command=[sys.executable, str(script)])
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="gpuwatch.probe"):
        outcomes = probe.run(gpus={0})
    assert time.monotonic() - started < 10
    assert [(o.result, "could not be killed" in o.reason) for o in outcomes] == [("timeout", True)]
    assert "could not be killed" in caplog.text
    gpu0 = next(u for u, i in sim.agent.store.snapshot().identities.items() if i.index == 0)
    fd = try_lock(tmp_path, gpu0, wait=False)  # the lock was released although the worker lives on
    assert fd is not None
    unlock(fd)
    (stuck,) = probe.workers.stuck
    assert stuck.proc.poll() is None
    # While it is still alive, the next round does not start another worker on that GPU.
    sim.run(1.0)
    assert [o.result for o in probe.run(gpus={0})] == ["failed"]
    os.kill(stuck.proc.pid, 9)  # the driver lets go at last
    time.sleep(0.5)
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpuwatch.probe"):
        assert [o.result for o in probe.run(gpus={0})] == ["timeout"]
    assert "survived SIGKILL has exited" in caplog.text
    assert stuck.proc.returncode is not None
    for child in probe.workers.stuck:  # the second round's worker is stuck too (killpg still patched): end it for real
        os.kill(child.proc.pid, 9)
        child.proc.wait(timeout=5)


def test_a_gpu_that_never_reaches_its_power_limit_still_gets_a_baseline_and_says_so(
    sim: SimAgent, tmp_path: Path
) -> None:
    """Real worker children that report power_capped false (warm-up ended at warmup_max, never at the cap)."""
    from gpuwatch.collectors.configuration import load_config
    from gpuwatch.collectors.probe import uncapped_baselines
    from gpuwatch.probe.baseline import UNCAPPED_PROBES_TO_ESTABLISH

    script = tmp_path / "uncapped.py"
    script.write_text(
        textwrap.dedent("""
        import json, subprocess, sys
        worker = [sys.executable, "-m", "gpuwatch.simulated.probe_worker", *sys.argv[1:]]
        out = subprocess.run(worker, capture_output=True)
        doc = json.loads(out.stdout.decode().strip().splitlines()[-1])
        doc["power_capped"] = False
        print(json.dumps(doc))
        """)
    )
    probe = runner(sim, tmp_path, command=[sys.executable, str(script)])
    for _ in range(UNCAPPED_PROBES_TO_ESTABLISH - 1):
        (outcome,) = probe.run(gpus={0})
        assert outcome.result == "ok" and outcome.baseline_flops is None
    (outcome,) = probe.run(gpus={0})
    assert outcome.baseline_flops is not None and "never reached the power limit" in outcome.baseline_note
    sim._scraped = None
    assert sim.value("gpuwatch_probe_baseline_flops", 0, dtype="bf16") == outcome.baseline_flops
    (again,) = probe.run(gpus={0})  # compared with the uncapped baseline from now on
    assert again.baseline_flops == outcome.baseline_flops and again.ratio is not None
    config = load_config(None, {"agent": {"state_dir": str(tmp_path)}})
    (line,) = uncapped_baselines(config)  # `gpuwatch check` says it, with what to do
    assert (line.level, line.what) == ("warn", f"probe baseline of GPU {outcome.uuid}")
    assert "never reached the power limit" in line.detail and "--reset-baseline" in line.fix


def test_an_engine_fallback_is_noted_on_every_result_and_logged_once(
    sim: SimAgent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker ran on torch because CuPy could not run: a result, but never a silent one."""
    script = tmp_path / "fell_back.py"
    script.write_text(
        textwrap.dedent("""
        import json, subprocess, sys
        worker = [sys.executable, "-m", "gpuwatch.simulated.probe_worker", *sys.argv[1:]]
        out = subprocess.run(worker, capture_output=True)
        doc = json.loads(out.stdout.decode().strip().splitlines()[-1])
        doc["engines_passed_over"] = ["cupy: CuPy 13.9.9 cannot reach a GPU: cudaErrorInsufficientDriver"]
        print(json.dumps(doc))
        """)
    )
    probe = runner(sim, tmp_path, command=[sys.executable, str(script)])
    with caplog.at_level(logging.WARNING, logger="gpuwatch"):
        first, second = probe.run(gpus={0})[0], probe.run(gpus={0})[0]
    for outcome in (first, second):
        assert outcome.result == "ok" and outcome.measured is not None
        assert outcome.reason.startswith(f"ran on {outcome.measured.engine}, passed over cupy: CuPy 13.9.9 cannot")
    warnings = [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()]
    assert len(warnings) == 1 and "cudaErrorInsufficientDriver" in warnings[0]


def test_an_amd_worker_is_pinned_with_a_token_rocr_takes(tmp_path: Path) -> None:
    """ROCr takes an index or GPU-<16 hex of the KFD unique id> in ROCR_VISIBLE_DEVICES (ROCR-Runtime
    amd_filter_device.cpp, RvdFilter::BuildRvdTokenList / ProcessUuidToken; ROCm's environment-variable reference:
    "A list of device indices or UUIDs", e.g. `0,GPU-DEADBEEFDEADBEEF`). amdsmi's UUID (RFC 4122 form) is neither, so
    ROCr saw no GPU: the worker gets the token the AMD backend read (asic_serial, amdsmi_interface.py:2076-2081), and
    no CUDA or HIP selection of the agent's own environment."""
    sim = SimAgent(tmp_path, scenario="healthy", gpus=2, vendor="amd", probe={"interval_seconds": 60.0})
    try:
        sim.run(2.0)
        seen = tmp_path / "seen"
        script = tmp_path / "pinned.py"
        script.write_text(
            "import json, os, sys\n"
            f"open({str(seen)!r}, 'w').write(json.dumps({{k: v for k, v in os.environ.items() if 'VISIBLE' in k}}))\n"
            "sys.exit(3)\n"
        )
        runner(sim, tmp_path, command=[sys.executable, str(script)]).run(gpus={1})
        unique_id = int(sim.node.spec(1).serial, 16)
        assert json.loads(seen.read_text()) == {"ROCR_VISIBLE_DEVICES": f"GPU-{unique_id:016X}"}
    finally:
        sim.close()


def test_a_gpu_whose_clocks_are_held_down_is_not_probed_and_teaches_no_baseline(sim: SimAgent, tmp_path: Path) -> None:
    """A GPU in thermal slowdown (or power brake) at idle would measure the slowdown, not itself (nvml.h clock event
    reasons SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80, HwSlowdown 0x8): it is
    skipped with the reason, its peers are probed, and its baseline never learns from a throttled run."""
    snap = sim.agent.store.snapshot()
    hot = [
        _reading(snap.identities[u], dataclasses.replace(s, throttle_active={**s.throttle_active, "sw_thermal": True}))
        for u, s in snap.samples.items()
        if snap.identities[u].index == 1
    ]
    sim.agent.store.record_poll(hot)
    outcomes = runner(sim, tmp_path).run()
    assert [o.result for o in outcomes] == ["ok", "skipped_busy"]
    assert "clocks held down (sw_thermal)" in outcomes[1].reason


def test_a_slow_gpu_is_a_warning_once_and_its_recovery_a_line(caplog: pytest.LogCaptureFixture) -> None:
    """An operator acts on a GPU below its baseline (GpuUnderperforming's 0.95): one WARNING, not one per probe, and
    an INFO line when it is back."""
    from gpuwatch.probe.readings import SpeedLog

    speed = SpeedLog()
    with caplog.at_level(logging.INFO, logger="gpuwatch.probe"):
        for ratio in (0.99, 0.80, 0.81, 0.82, 0.99, 0.99):
            speed.judge(6, "GPU-6", ratio)
    levels = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels == [
        ("WARNING", "probe on GPU 6 computes 80 % of its own baseline"),
        ("INFO", "probe on GPU 6 is back at 99 % of its baseline"),
    ]


def test_stop_returns_once_the_round_has_recorded_its_results_and_released_its_locks(
    sim: SimAgent, tmp_path: Path
) -> None:
    """The agent's stop() must leave no probe bookkeeping behind it: the round whose worker it killed has recorded
    its result, joined its output readers and released the GPU's lock by the time stop() returns (it returned as
    soon as the children were killed, and the round wrote to the store ~50 ms later, after the agent had stopped)."""
    probe = runner(sim, tmp_path, launcher=faulty(tmp_path, seconds=30.0))
    thread = threading.Thread(target=lambda: probe.run(gpus={0}), name="round")
    thread.start()
    deadline = time.monotonic() + 10
    while not probe.workers.running and time.monotonic() < deadline:
        time.sleep(0.01)
    (child,) = probe.workers.running
    gpu0 = child.identity.uuid
    started = time.monotonic()
    assert probe.stop()
    assert time.monotonic() - started < 2.0
    assert sim.agent.store.probe.view().runs[gpu0]["failed"] == 1  # recorded before stop() returned
    assert sim.agent.store.probe.view().last_any[gpu0].reason == "the agent stopped while the probe ran"
    assert child.proc.poll() is not None and not any(reader.is_alive() for reader in child.readers)
    fd = try_lock(tmp_path, gpu0, wait=False)
    assert fd is not None, "the GPU's probe lock outlived stop()"
    unlock(fd)
    thread.join(5)
