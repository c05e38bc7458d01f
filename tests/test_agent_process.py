"""The agent as operators run it: a real `gpuwatch run` child process over the simulated node, scraped over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families


def gpuwatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwatch", *args]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


class Agent:
    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.state_dir = tmp_path / "state"
        cmd = gpuwatch(
            "run",
            "--backend",
            "simulated",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--state-dir",
            str(self.state_dir),
            "--poll-interval",
            "0.2",
            *args,
        )
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[0]
            try:
                status, _ = get(self.base + "/healthz")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("agent did not become healthy")

    def metrics(self) -> str:
        status, text = get(self.base + "/metrics")
        assert status == 200
        return text

    def stop(self) -> tuple[int, float, str]:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        return self.proc.returncode, time.monotonic() - started, out


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path, "--scenario", "healthy")
    yield a
    if a.proc.poll() is None:
        a.proc.kill()
        a.proc.communicate()


def test_serves_every_gpu_and_stops_cleanly_within_two_seconds(agent: Agent) -> None:
    agent.wait_ready()
    text = agent.metrics()
    for gpu in range(8):
        ups = [v for (n, labels), v in samples(text).items() if n == "gpuwatch_gpu_up" and ("gpu", str(gpu)) in labels]
        assert ups == [1.0]
    assert value(text, "gpuwatch_backend_up", backend="nvml") == 1.0
    assert value(text, "gpuwatch_gpus_detected") == 8.0
    assert value(text, "gpuwatch_gpus_expected", vendor="nvidia") == 8.0
    assert value(text, "gpuwatch_collector_success", collector="nvml") == 1.0
    status, page = get(agent.base + "/")
    assert status == 200 and "/metrics" in page and "H100" in page
    assert get(agent.base + "/nope")[0] == 404
    code, elapsed, out = agent.stop()
    assert code == 0, out
    assert elapsed < 2.0
    assert "Traceback" not in out


def test_sigint_also_stops_cleanly(agent: Agent) -> None:
    agent.wait_ready()
    agent.proc.send_signal(signal.SIGINT)
    out, _ = agent.proc.communicate(timeout=5)
    assert agent.proc.returncode == 0, out


def run_simulated_once(listen: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    """`gpuwatch run` expected to exit at start-up: its status and messages."""
    args = ("run", "--backend", "simulated", "--listen", listen, "--state-dir", str(state_dir))
    return subprocess.run(gpuwatch(*args), capture_output=True, text=True, timeout=30)


def test_port_in_use_exits_69_naming_the_port(agent: Agent, tmp_path: Path) -> None:
    agent.wait_ready()
    result = run_simulated_once(f"127.0.0.1:{agent.port}", tmp_path / "other")
    assert result.returncode == 69
    assert str(agent.port) in result.stderr and "in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_unwritable_state_dir_exits_69(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_simulated_once(f"127.0.0.1:{free_port()}", blocker / "state")
    assert result.returncode == 69
    assert "state dir" in result.stderr and "not writable" in result.stderr


def test_bad_config_exits_78_naming_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[agent]\npoll_intervall_seconds = 1\n")
    result = subprocess.run(gpuwatch("run", "--config", str(config)), capture_output=True, text=True, timeout=30)
    assert result.returncode == 78
    assert str(config) in result.stderr and "agent.poll_intervall_seconds" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_usage_exits_2() -> None:
    result = subprocess.run(gpuwatch("run", "--poll-interval", "soon"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2


@pytest.mark.parametrize("command", [["snapshot", "--backend", "simulated", "--json"], ["version"]])
def test_a_reader_that_leaves_early_ends_the_command_quietly(command: list[str]) -> None:
    """`gpuwatch snapshot | head`: the pipe closes before the output is written; no traceback, SIGPIPE's status —
    for long output (written while the command runs) and short (still buffered when it returns)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe's stdout is block-buffered
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    proc.stdout.close()  # long before the interpreter has started and polled
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_missing_driver_is_never_an_exit(tmp_path: Path) -> None:
    a = Agent(tmp_path, "--scenario", "backend_down")
    try:
        a.wait_ready()
        time.sleep(1.0)
        text = a.metrics()
        assert value(text, "gpuwatch_backend_up", backend="nvml") == 0.0
        assert value(text, "gpuwatch_gpus_expected", vendor="nvidia") == 8.0
        assert value(text, "gpuwatch_gpus_detected") == 0.0
        assert a.proc.poll() is None
        code, _, out = a.stop()
        assert code == 0
        assert out.count("nvml unavailable") == 1, out  # said once, not every retry
    finally:
        if a.proc.poll() is None:
            a.proc.kill()


def test_sighup_rereads_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[gpus]\npower_limit_watts = 700\n")
    a = Agent(tmp_path, "--scenario", "healthy", "--config", str(config))
    try:
        a.wait_ready()
        gpu0 = next(dict(labels) for (n, labels), _ in samples(a.metrics()).items() if n == "gpuwatch_gpu_up")
        labels = {"gpu": gpu0["gpu"], "uuid": gpu0["uuid"], "limit": "configured"}
        assert value(a.metrics(), "gpuwatch_gpu_power_limit_watts", **labels) == 700.0
        config.write_text("[gpus]\npower_limit_watts = 650\n")
        a.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while value(a.metrics(), "gpuwatch_gpu_power_limit_watts", **labels) != 650.0:
            assert time.monotonic() < deadline, "SIGHUP did not reload the config"
            time.sleep(0.1)
        config.write_text("[gpus]\npower_limit_wats = 1\n")  # a broken edit keeps the running config
        a.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert a.proc.poll() is None
        assert value(a.metrics(), "gpuwatch_gpu_power_limit_watts", **labels) == 650.0
        code, _, out = a.stop()
        assert code == 0 and "configuration not reloaded" in out
    finally:
        if a.proc.poll() is None:
            a.proc.kill()


def test_gpu_lost_before_a_restart_is_still_reported_lost(tmp_path: Path) -> None:
    first = Agent(tmp_path, "--scenario", "healthy", "--gpus", "8")
    first.wait_ready()
    uuids = {dict(labels)["uuid"] for (n, labels), _ in samples(first.metrics()).items() if n == "gpuwatch_gpu_up"}
    assert first.stop()[0] == 0
    second = Agent(tmp_path, "--scenario", "healthy", "--gpus", "7")  # one GPU is gone after the restart
    try:
        second.wait_ready()
        up = {dict(labels)["uuid"]: v for (n, labels), v in samples(second.metrics()).items() if n == "gpuwatch_gpu_up"}
        assert set(up) == uuids
        assert sorted(up.values()) == [0.0] + [1.0] * 7
    finally:
        second.stop()


def test_python_dash_m_and_console_script_agree() -> None:
    out = subprocess.run(gpuwatch("version"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("gpuwatch ")
    assert os.environ.get("PATH") is not None


def test_the_agent_does_not_log_every_scheduled_run(tmp_path: Path) -> None:
    """A healthy agent at INFO is quiet: APScheduler's per-run lines (one a second) once filled the journal and,
    with stderr a pipe nobody reads, blocked the agent on a full pipe."""
    argv = [sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--gpus", "1", "--listen", "127.0.0.1:0"]
    agent = subprocess.Popen([*argv, "--state-dir", str(tmp_path / "state")], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(6)
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=30)
    assert "apscheduler" not in err and "Running job" not in err, err
