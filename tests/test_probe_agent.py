"""The agent process runs the probe on its own schedule (a gpuwatch.schedule job) and serves the results."""

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
