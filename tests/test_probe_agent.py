"""The agent process runs the probe on its own schedule (APScheduler job) and serves the results."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_agent_process import Agent, value


def wait_for(agent: Agent, name: str, minimum: float, timeout: float = 60.0, **labels: str) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = agent.metrics()
        got = value(text, name, **labels)
        if got is not None and got >= minimum:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{name}{labels} never reached {minimum}")


@pytest.mark.parametrize(("scenario", "result"), [("healthy", "ok"), ("busy", "skipped_busy")])
def test_the_agent_probes_on_its_schedule(tmp_path: Path, scenario: str, result: str) -> None:
    agent = Agent(tmp_path, "--scenario", scenario, "--probe-interval", "1")
    try:
        agent.wait_ready()
        first = agent.metrics()
        labels = {"gpu": "0"}
        uuid = next(
            line.split('uuid="')[1].split('"')[0]
            for line in first.splitlines()
            if line.startswith("gpuwatch_gpu_up{") and 'gpu="0"' in line
        )
        labels["uuid"] = uuid
        assert value(first, "gpuwatch_probe_interval_seconds") == 1.0
        text = wait_for(agent, "gpuwatch_probe_runs_total", 2.0, result=result, **labels)
        assert value(text, "gpuwatch_collector_success", collector="probe") == 1.0
        assert value(text, "gpuwatch_collector_interval_seconds", collector="probe") == 1.0
        if result == "ok":
            assert 650e12 < (value(text, "gpuwatch_probe_flops", dtype="bf16", **labels) or 0) < 730e12
        code, elapsed, _out = agent.stop()
        assert code == 0 and elapsed < 5.0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.communicate()


def test_persisted_baselines_are_exported_from_start_up_not_after_the_first_probe(tmp_path: Path) -> None:
    """A restart must not blank gpuwatch_probe_baseline_flops for a whole probe interval."""
    from gpuwatch.probe.baseline import PROBES_TO_ESTABLISH, BaselineKey, Baselines

    agent = Agent(tmp_path, "--probe-interval", "3600")
    try:
        agent.wait_ready()
        text = agent.metrics()
        gpu0 = {
            "gpu": "0",
            "uuid": next(
                line.split('uuid="')[1].split('"')[0]
                for line in text.splitlines()
                if line.startswith("gpuwatch_gpu_up{") and 'gpu="0"' in line
            ),
        }
        assert "gpuwatch_probe_baseline_flops{" not in text
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.communicate()
    key = BaselineKey("bf16", "8192x8192x8192", "simulated", "1", "simulated", "580.1", 700.0)
    for _ in range(PROBES_TO_ESTABLISH):
        Baselines(agent.state_dir).observe(gpu0["uuid"], key, 690e12, steady=True, mode="agent", timestamp=1.0)
    restarted = Agent(tmp_path, "--probe-interval", "3600")  # the first probe round is an hour away
    try:
        restarted.wait_ready()
        text = restarted.metrics()
        assert value(text, "gpuwatch_probe_baseline_flops", dtype="bf16", **gpu0) == 690e12
        assert value(text, "gpuwatch_probe_runs_total", result="ok", **gpu0) == 0.0  # no probe ran yet
        assert restarted.stop()[0] == 0
    finally:
        if restarted.proc.poll() is None:
            restarted.proc.kill()
            restarted.proc.communicate()


def test_stop_during_a_probe_round_leaves_no_thread_or_worker_of_the_agent(tmp_path: Path) -> None:
    """An in-process agent (scheduler, event thread, HTTP server, probe round with a real worker child) stopped while
    its probe worker runs: when stop() returns, the round has recorded its result and every thread the agent
    started, and every worker process, has ended."""
    import dataclasses
    import threading

    import psutil
    from ports import free_port

    from gpuwatch.config.settings import load_config
    from gpuwatch.service.agent import Agent as InProcessAgent
    from gpuwatch.service.nodes import build_sources
    from gpuwatch.simulated.probe_launcher import simulated_probe_launcher

    before = set(threading.enumerate())
    agent_config = {"backend": "simulated", "state_dir": str(tmp_path), "listen": f"127.0.0.1:{free_port()}"}
    config = load_config(None, {"agent": agent_config, "probe": {"interval_seconds": 1.0, "timeout_seconds": 60.0}})
    slow = simulated_probe_launcher({}, tmp_path, seconds=60.0)
    agent = InProcessAgent(config, dataclasses.replace(build_sources(config), probe_launcher=slow))
    agent.start()
    try:
        deadline = time.monotonic() + 30
        while not (agent.probe is not None and agent.probe.workers.running) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.probe is not None and agent.probe.workers.running, "no probe round started"
        workers = [child.proc.pid for child in agent.probe.workers.running]
    finally:
        started = time.monotonic()
        agent.stop()
    assert time.monotonic() - started < 2.5
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], f"threads of the agent alive after stop(): {left}"
    assert not [pid for pid in workers if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    runs = agent.store.probe.view().runs
    assert sum(counts["failed"] for counts in runs.values()) == len(workers)
