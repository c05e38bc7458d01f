"""Signals as an attacker (or a careless loop of `systemctl reload`) sends them: a real `gpuwatch run` child on the
simulated node takes bursts of back-to-back SIGHUPs while its config file is being edited, then SIGTERM. It must stop
promptly every time and still reload after the burst. A handler that took a lock (threading.Event.set) deadlocked
the main thread under such a burst: the polls went on, SIGTERM and SIGHUP were never acted on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ports import free_port
from test_agent_process import get, samples, value

ROUNDS = 4
BURST = 1000  # back-to-back SIGHUPs
STEADY_SECONDS = 2.0  # then SIGHUPs at about STEADY_RATE a second with an edit each, as the tester's second attack
STEADY_RATE = 40
STOP_WITHIN_SECONDS = 10.0


class AgentProcess:
    """`gpuwatch run` on the simulated node with a config file, its log in a file (a pipe nobody reads would fill
    up under a thousand reloads and block the agent's logging)."""

    def __init__(self, tmp_path: Path, config: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "agent.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwatch",
                "run",
                "--backend",
                "simulated",
                "--scenario",
                "healthy",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--state-dir",
                str(tmp_path / "state"),
                "--poll-interval",
                "0.2",
                "--probe-interval",
                "0",
                "--log-level",
                "info",
                "--config",
                str(config),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if get(self.base + "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the agent did not become healthy:\n{self.log()}")

    def power_limit(self) -> float | None:
        status, text = get(self.base + "/metrics")
        assert status == 200
        gpu0 = next(dict(labels) for (name, labels), _ in samples(text).items() if name == "gpuwatch_gpu_up")
        return value(text, "gpuwatch_gpu_power_limit_watts", gpu=gpu0["gpu"], uuid=gpu0["uuid"], limit="configured")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _limit(watts: int) -> str:
    return f"[gpus]\npower_limit_watts = {watts}\n"


def _edit(config: Path, text: str) -> None:
    """As an editor saves: a new file renamed over the old (a reload never reads half a file)."""
    tmp = config.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, config)


def test_sighup_bursts_with_config_edits_never_keep_sigterm_from_stopping_the_agent(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        workdir = tmp_path / f"round{round_}"
        workdir.mkdir()
        config = workdir / "config.toml"
        config.write_text(_limit(700))
        agent = AgentProcess(workdir, config)
        try:
            agent.wait_ready()
            for n in range(BURST):
                if n % 50 == 0:
                    _edit(config, _limit(600 + n // 50))
                os.kill(agent.proc.pid, signal.SIGHUP)
            end = time.monotonic() + STEADY_SECONDS
            while time.monotonic() < end:
                _edit(config, _limit(500 + int(end - time.monotonic())))
                os.kill(agent.proc.pid, signal.SIGHUP)
                time.sleep(1 / STEADY_RATE)
            assert agent.proc.poll() is None, f"round {round_}: the agent died under the burst:\n{agent.log()}"

            # after the burst a SIGHUP still reloads: the main thread is alive, not stuck in a handler
            _edit(config, _limit(650))
            os.kill(agent.proc.pid, signal.SIGHUP)
            deadline = time.monotonic() + 5.0
            while agent.power_limit() != 650.0:
                assert time.monotonic() < deadline, f"round {round_}: SIGHUP no longer reloads:\n{agent.log()[-3000:]}"
                time.sleep(0.1)

            started = time.monotonic()
            os.kill(agent.proc.pid, signal.SIGTERM)
            try:
                code = agent.proc.wait(timeout=STOP_WITHIN_SECONDS)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"round {round_}: still running {STOP_WITHIN_SECONDS:.0f} s after SIGTERM:\n{agent.log()[-3000:]}"
                ) from None
            log = agent.log()
            assert code == 0, log
            assert time.monotonic() - started < STOP_WITHIN_SECONDS
            assert log.count("received SIGTERM, stopping") == 1, log[-3000:]
            reloads = log.count("configuration reloaded from")
            # each wake coalesces every SIGHUP that came meanwhile: far fewer reloads than signals, but some
            assert 1 <= reloads < BURST, f"{reloads} reloads for {BURST} SIGHUPs"
            assert "Traceback" not in log, log
        finally:
            agent.kill()


def test_sigint_during_a_sighup_burst_stops_the_agent_too(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(_limit(700))
    agent = AgentProcess(tmp_path, config)
    try:
        agent.wait_ready()
        for n in range(BURST):
            os.kill(agent.proc.pid, signal.SIGHUP)
            if n == BURST // 2:
                os.kill(agent.proc.pid, signal.SIGINT)  # in the middle of the burst
        try:
            code = agent.proc.wait(timeout=STOP_WITHIN_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after SIGINT amid SIGHUPs:\n{agent.log()[-3000:]}") from None
        assert code == 0 and "received SIGINT, stopping" in agent.log(), agent.log()
        assert "Traceback" not in agent.log()
    finally:
        agent.kill()


def test_simulate_fleet_stops_under_a_burst_of_stop_signals(tmp_path: Path) -> None:
    """`gpuwatch simulate-fleet` had the same defect: its handlers set a threading.Event, so a second signal landing
    inside the first handler's set() could hang it (about one round in three)."""
    for round_ in range(ROUNDS):
        targets = tmp_path / f"targets{round_}.json"
        log_path = tmp_path / f"fleet{round_}.log"
        cmd = [sys.executable, "-m", "gpuwatch", "simulate-fleet", "--nodes", "1", "--gpus", "1"]
        cmd += ["--port-base", str(free_port()), "--targets", str(targets)]
        cmd += ["--state-dir", str(tmp_path / f"state{round_}")]
        with log_path.open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not targets.exists():
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "no targets file within 60 s"
                time.sleep(0.2)
            for n in range(BURST):
                os.kill(proc.pid, signal.SIGINT if n % 2 else signal.SIGTERM)
            try:
                code = proc.wait(timeout=STOP_WITHIN_SECONDS)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"round {round_}: simulate-fleet runs on after {BURST} stop signals") from None
            assert code == 0, log_path.read_text()
            assert "Traceback" not in log_path.read_text()
            assert not targets.exists()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
