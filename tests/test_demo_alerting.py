"""`gpuwatch demo --alerting` as a user runs it: the real command, the real Prometheus and Alertmanager from PATH
(Debian's prometheus, prometheus-alertmanager; scripts/test.sh installs them), the shipped rules and routing. The
first alert fires within 120 s and is the one Alertmanager holds; SIGTERM leaves no process and no temp dir behind;
a dead server is reported with its log; a missing one is named, with the packages, before anything starts."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from ports import free_port
from processes import stop

from gpuwatch.cli.promstack import ServerStartError, StopFlag, start_server

ROOT = Path(__file__).resolve().parent.parent
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_servers = pytest.mark.skipif(
    shutil.which("prometheus") is None or ALERTMANAGER is None,
    reason="prometheus / alertmanager missing: run scripts/test.sh (Debian prometheus, prometheus-alertmanager)",
)
FIRST_ALERT_DEADLINE_S = 120.0  # issue 28: the first alert within two minutes on a 2-core machine
FIRING = re.compile(r"firing after (?P<seconds>\d+) s: (?P<name>\w+) \((?P<severity>\w+)\): (?P<summary>.+)")
INSTALL = "sudo apt-get install prometheus prometheus-alertmanager"


@dataclass
class Demo:
    process: subprocess.Popen[str]
    lines: queue.Queue[str]
    tmpdir: Path  # its TMPDIR: the demo's private dir is made here
    stderr_path: Path
    started: float

    def expect(self, pattern: str | re.Pattern[str], deadline: float) -> re.Match[str]:
        """The next stdout line that matches, before `deadline` (monotonic)."""
        seen = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} in time; stdout so far: {seen}\n{self.stderr()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            seen.append(line)
            match = re.fullmatch(pattern, line)
            if match is not None:
                return match

    def stderr(self) -> str:
        return "stderr (tail): " + "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-30:])

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)


def _start(tmp_path: Path, *, path: str | None = None) -> Demo:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}  # stdout is a pipe: the demo must flush it itself
    if path is not None:
        env["PATH"] = path
    stderr_path = tmp_path / "demo.stderr"
    started = time.monotonic()
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "demo", "--alerting"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=tmp_path,
            env=env,
        )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return Demo(process, lines, tmpdir, stderr_path, started)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = _start(tmp_path)
    try:
        yield running
    finally:
        leftovers = running.children() if running.process.poll() is None else []
        stop(running.process)  # type: ignore[arg-type]
        for child in leftovers:
            if child.is_running():
                child.kill()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read()) if answer.status == 200 else answer.status


def _ready(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}-/ready", timeout=5) as answer:
        return int(answer.status)


def _servers(demo: Demo, prometheus_url: str, alertmanager_url: str) -> list[psutil.Process]:
    """The demo's Prometheus and Alertmanager children, each found by the port it was told to listen on."""
    found = []
    for url in (prometheus_url, alertmanager_url):
        flag = f"--web.listen-address={url.removeprefix('http://').rstrip('/')}"
        matching = [c for c in demo.children() if flag in c.cmdline()]
        assert len(matching) == 1, (flag, [c.cmdline() for c in demo.children()])
        found.append(matching[0])
    return found


def _urls(demo: Demo) -> tuple[str, str]:
    deadline = demo.started + 60
    prometheus = demo.expect(r"Prometheus: (http://127\.0\.0\.1:\d+/)", deadline)[1]
    alertmanager = demo.expect(r"Alertmanager: (http://127\.0\.0\.1:\d+/)", deadline)[1]
    return prometheus, alertmanager


@needs_servers
def test_first_alert_fires_within_two_minutes_and_sigterm_leaves_nothing(demo: Demo) -> None:
    prometheus_url, alertmanager_url = _urls(demo)
    assert _ready(prometheus_url) == 200 and _ready(alertmanager_url) == 200
    servers = _servers(demo, prometheus_url, alertmanager_url)
    workdirs = list(demo.tmpdir.glob("gpuwatch-demo-*"))  # (the simulated node keeps its own beside it)
    assert len(workdirs) == 1, workdirs
    assert {p.name for p in workdirs[0].iterdir()} >= {"prometheus.log", "alertmanager.log", "prometheus.yml"}

    first = demo.expect(FIRING, demo.started + FIRST_ALERT_DEADLINE_S)
    took = time.monotonic() - demo.started
    print(f"first alert {first['name']} printed {took:.0f} s after the command started")
    # The mixed scenario's GPU 2 passes its slowdown temperature within seconds; GpuOverheating's `for: 1m` is the
    # shortest wait of the shipped rules that the scenario meets.
    assert (first["name"], first["severity"]) == ("GpuOverheating", "critical"), first[0]
    held = [a for a in _get(f"{alertmanager_url}api/v2/alerts") if a["labels"]["alertname"] == first["name"]]
    assert len(held) == 1, held
    assert held[0]["status"]["state"] == "active", held[0]
    assert held[0]["labels"]["gpu"] == "2" and held[0]["labels"]["node"] == "demo-node", held[0]["labels"]
    assert " ".join(held[0]["annotations"]["summary"].split()) == first["summary"]

    everything = [psutil.Process(demo.process.pid), *demo.children()]
    demo.process.send_signal(signal.SIGTERM)
    assert demo.process.wait(timeout=40) == 0, demo.stderr()
    gone, alive = psutil.wait_procs(everything, timeout=5)
    assert not alive, [p.cmdline() for p in alive]
    assert {s.pid for s in servers} <= {p.pid for p in gone}
    assert not workdirs[0].exists(), list(workdirs[0].rglob("*"))
    assert not list(demo.tmpdir.iterdir())  # the simulated node's temp dirs went too


@needs_servers
def test_a_dead_server_is_reported_with_its_log_and_everything_stops(demo: Demo) -> None:
    prometheus_url, alertmanager_url = _urls(demo)
    prometheus, alertmanager = _servers(demo, prometheus_url, alertmanager_url)
    prometheus.kill()
    assert demo.process.wait(timeout=40) == 69
    err = demo.stderr_path.read_text()
    assert "Prometheus was killed by SIGKILL; the last lines of " in err, err
    assert re.search(r"prometheus\.log:\n.*(Server is ready|TSDB started)", err, re.DOTALL), err
    kept = re.search(r"the logs and data are kept in (\S+)", err)
    assert kept is not None and (Path(kept[1]) / "prometheus.log").is_file(), err
    assert not alertmanager.is_running() or alertmanager.status() == psutil.STATUS_ZOMBIE


def test_missing_servers_are_named_with_the_packages_before_anything_starts(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    demo = _start(tmp_path, path=str(empty))
    assert demo.process.wait(timeout=30) == 69
    err = demo.stderr_path.read_text()
    assert "prometheus and prometheus-alertmanager or alertmanager are not on PATH" in err, err
    assert INSTALL in err, err
    time.sleep(0.3)  # the reader thread's last lines
    assert not any("http://" in line for line in list(demo.lines.queue))
    assert not list(demo.tmpdir.iterdir())


def test_missing_alertmanager_starts_not_even_prometheus(tmp_path: Path) -> None:
    """Prometheus is there (a stand-in that records being run), Alertmanager is not: exit 69, nothing run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "prometheus-ran"
    fake = bin_dir / "prometheus"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\nsleep 60\n")
    fake.chmod(0o755)
    demo = _start(tmp_path, path=str(bin_dir))
    assert demo.process.wait(timeout=30) == 69
    err = demo.stderr_path.read_text()
    assert "prometheus-alertmanager or alertmanager is not on PATH" in err and INSTALL in err, err
    time.sleep(0.5)
    assert not ran.exists()
    assert not list(demo.tmpdir.iterdir())


@needs_servers
def test_a_taken_port_is_retried_on_another(tmp_path: Path) -> None:
    """A port free when drawn may be taken before the server binds it: the server is started again elsewhere."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        free = free_port()
        server = start_server(
            "Alertmanager",
            lambda port: [
                ALERTMANAGER or "alertmanager",
                f"--config.file={ROOT / 'deploy' / 'alertmanager' / 'alertmanager.yml'}",
                f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            tmp_path / "am.log",
            StopFlag(),
            ports=iter([taken, free]),
        )
        try:
            assert server.port == free and _ready(server.url) == 200
        finally:
            server.stop()
    assert server.exited() is not None


@needs_servers
def test_a_server_that_fails_for_another_reason_is_not_retried(tmp_path: Path) -> None:
    bad = tmp_path / "alertmanager.yml"
    bad.write_text("route: [this is not a route]\n")
    ports = iter([free_port(), free_port()])
    with pytest.raises(
        ServerStartError,
        match=r"(?s)Alertmanager exited with status \d+; the last lines of .*Loading configuration file failed",
    ):
        start_server(
            "Alertmanager",
            lambda port: [
                ALERTMANAGER or "alertmanager",
                f"--config.file={bad}",
                f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            tmp_path / "am.log",
            StopFlag(),
            ports=ports,
        )
    assert next(ports, None) is not None  # the second port was never drawn
