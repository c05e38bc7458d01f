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
