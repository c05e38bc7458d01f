"""A probe worker that eats memory without bound is killed at the runner's memory limit, and one that hangs at the
timeout; both end as a probe result, the agent's store and other GPUs untouched."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from simnode import SimAgent
from test_probe_runner import fixed

from gpuwatch.config.settings import ProbeSection
from gpuwatch.probe.runner import ProbeRunner

QUICK = ProbeSection(
    interval_seconds=60.0, timeout_seconds=20.0, warmup_min_seconds=0.0, warmup_max_seconds=0.0, measure_seconds=0.1
)
LIMIT = 200 * 2**20


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimAgent]:
    agent = SimAgent(tmp_path, scenario="healthy", gpus=2, probe={"interval_seconds": 60.0})
    agent.run(2.0)
    yield agent
    agent.close()


def runner(sim: SimAgent, tmp_path: Path, command: list[str], settings: ProbeSection = QUICK) -> ProbeRunner:
    return ProbeRunner(
        settings,
        sim.agent.store,
        tmp_path,
        clock=sim.clock.wall,
        launcher=fixed(command),
        memory_limit_bytes=LIMIT,
    )


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_a_worker_eating_memory_is_killed_at_the_limit(sim: SimAgent, tmp_path: Path) -> None:
    pidfile = tmp_path / "hog.pid"
    hog = script(
        tmp_path,
        "hog.py",
        f"""
        import os, time
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        chunks = []
        while True:  # 20 MiB more every 10 ms, touched so it is resident
            chunks.append(bytearray(20 * 2**20))
            time.sleep(0.01)
        """,
    )
    started = time.monotonic()
    outcomes = runner(sim, tmp_path, hog).run(gpus={0})
    assert time.monotonic() - started < QUICK.timeout_seconds  # killed for memory, not at the timeout
    assert [o.result for o in outcomes] == ["failed"]
    assert "MiB of host memory, over the 200 MiB limit; killed" in outcomes[0].reason
    pid = int(pidfile.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    sim._scraped = None
    assert sim.value("gpuwatch_probe_runs_total", 0, result="failed") == 1.0
    assert sim.value("gpuwatch_gpu_up", 0) == 1.0


def test_a_hanging_worker_is_killed_at_the_timeout(sim: SimAgent, tmp_path: Path) -> None:
    hang = script(tmp_path, "hang.py", "import time\ntime.sleep(300)\n")
    settings = dataclasses.replace(QUICK, timeout_seconds=1.0)
    started = time.monotonic()
    outcomes = runner(sim, tmp_path, hang, settings).run(gpus={0, 1})
    assert time.monotonic() - started < 15.0
    assert [o.result for o in outcomes] == ["timeout", "timeout"]
    sim._scraped = None
    assert sim.value("gpuwatch_probe_runs_total", 1, result="timeout") == 1.0
