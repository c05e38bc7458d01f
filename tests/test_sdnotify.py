"""sd_notify against a real AF_UNIX datagram socket, as systemd listens: readiness, watchdog pings from the poll loop
(and none while a vendor call hangs), reload and stop, in-process and from a real `gpuwatch run` child."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from simnode import SimAgent

from gpuwatch.service.sdnotify import SdNotifier, ServiceNotifier, watchdog_seconds


class NotifySocket:
    """The service manager's end: a bound datagram socket that collects messages as dicts."""

    def __init__(self, path: str, address: str | bytes) -> None:
        self.path = path  # what goes into $NOTIFY_SOCKET
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)

    def receive(self, timeout: float = 20.0) -> dict[str, str]:
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines())

    def wait_for(self, key: str, timeout: float = 20.0) -> list[dict[str, str]]:
        """Messages received until one carries `key` (that one included)."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(max(0.01, deadline - time.monotonic()))
            seen.append(message)
            if key in message:
                return seen

    def drain(self) -> list[dict[str, str]]:
        out = []
        self.sock.setblocking(False)
        try:
            while True:
                data = self.sock.recv(4096).decode()
                out.append(dict(line.split("=", 1) for line in data.splitlines()))
        except BlockingIOError:
            return out
        finally:
            self.sock.setblocking(True)


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    path = str(tmp_path / "notify")
    sock = NotifySocket(path, path)
    yield sock
    sock.sock.close()


def test_abstract_socket_and_multi_line_message() -> None:
    name = f"gpuwatch-test-{os.getpid()}"
    listener = NotifySocket("@" + name, b"\0" + name.encode())
    try:
        assert SdNotifier("@" + name).notify("READY=1", "STATUS=hello world")
        assert listener.receive() == {"READY": "1", "STATUS": "hello world"}
    finally:
        listener.sock.close()


def test_outside_systemd_every_call_is_a_no_op() -> None:
    notifier = SdNotifier.from_environment({})
    assert not notifier.enabled
    assert not notifier.notify("READY=1")
    service = ServiceNotifier(notifier)
    service.serving()
    service.poll_finished("ok")
    service.stopping()


def test_a_vanished_socket_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = SdNotifier(str(tmp_path / "gone"))
    assert not notifier.notify("WATCHDOG=1")
    assert not notifier.notify("WATCHDOG=1")
    assert sum("cannot notify systemd" in r.message for r in caplog.records) == 1


def test_watchdog_environment_is_honoured() -> None:
    assert watchdog_seconds({"WATCHDOG_USEC": "30000000"}, pid=42) == 30.0
    assert watchdog_seconds({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, pid=42) == 30.0
    assert watchdog_seconds({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "41"}, pid=42) is None  # another process's
    assert watchdog_seconds({}, pid=42) is None
    assert watchdog_seconds({"WATCHDOG_USEC": "0"}, pid=42) is None
    assert watchdog_seconds({"WATCHDOG_USEC": "soon"}, pid=42) is None


def test_ready_waits_for_both_the_port_and_the_first_poll(notify_socket: NotifySocket) -> None:
    service = ServiceNotifier(SdNotifier(notify_socket.path, watchdog_seconds=8.0))
    service.poll_finished("first poll")
    assert notify_socket.drain() == []  # polled, but the port is not served yet
    service.serving()
    ready = notify_socket.receive()
    assert ready["READY"] == "1" and ready["WATCHDOG"] == "1" and ready["STATUS"] == "first poll"


def test_pings_are_rate_limited_to_a_quarter_of_the_interval(notify_socket: NotifySocket) -> None:
    now = [100.0]
    service = ServiceNotifier(SdNotifier(notify_socket.path, watchdog_seconds=8.0), monotonic=lambda: now[0])
    service.serving()
    service.poll_finished("ok")
    assert "READY" in notify_socket.receive()
    for _ in range(3):  # three polls within 2 s of the last ping: no datagram
        now[0] += 0.5
        service.poll_finished("ok")
    assert notify_socket.drain() == []
    now[0] += 0.6
    service.poll_finished("ok")
    assert notify_socket.receive() == {"WATCHDOG": "1"}
    service.poll_finished("GPU 2 lost")  # a new status goes out at once, without a ping
    assert notify_socket.receive() == {"STATUS": "GPU 2 lost"}


def test_watchdog_pings_come_from_the_poll_loop_and_stop_while_a_vendor_call_hangs(
    tmp_path: Path, notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.path)
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # ping at most every 50 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    sim = SimAgent(tmp_path / "state", listen=f"127.0.0.1:{free_port()}", poll_interval_seconds=0.05)
    sim.agent.start()
    try:
        ready = notify_socket.wait_for("READY")[-1]
        assert ready["READY"] == "1" and "WATCHDOG" in ready
        assert "WATCHDOG" in notify_socket.wait_for("WATCHDOG")[-1]  # and again from a later poll

        sim.node.faults.hang("nvmlDeviceGetTemperature", gpu=2)
        assert sim.node.faults.wait_until_blocked(timeout=20), "the poll never reached the hung call"
        notify_socket.drain()  # anything sent before the poll got stuck
        time.sleep(1.0)  # 20 watchdog quarters: a free-running pinger would have sent several
        assert [m for m in notify_socket.drain() if "WATCHDOG" in m] == []

        sim.node.faults.release()
        assert "WATCHDOG" in notify_socket.wait_for("WATCHDOG")[-1]  # the loop is alive again
    finally:
        sim.node.faults.release()
        sim.close()
    assert "STOPPING" in notify_socket.wait_for("STOPPING")[-1]


def test_a_real_agent_process_speaks_the_protocol(tmp_path: Path, notify_socket: NotifySocket) -> None:
    env = {
        **os.environ,
        "NOTIFY_SOCKET": notify_socket.path,
        "WATCHDOG_USEC": "2000000",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    env.pop("WATCHDOG_PID", None)
    config = tmp_path / "config.toml"
    config.write_text('[agent]\nlog_level = "info"\n')
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--config", str(config), "--backend", "simulated"]
    cmd += ["--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state"), "--poll-interval", "0.1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = notify_socket.wait_for("READY")[-1]
        assert ready["READY"] == "1" and ready["WATCHDOG"] == "1" and "polled 8 GPUs" in ready["STATUS"]
        assert "WATCHDOG" in notify_socket.wait_for("WATCHDOG")[-1]

        proc.send_signal(signal.SIGHUP)
        reloading = notify_socket.wait_for("RELOADING")[-1]
        assert int(reloading["MONOTONIC_USEC"]) > 0
        assert notify_socket.wait_for("READY")[-1]["STATUS"] == f"configuration from {config}"

        proc.send_signal(signal.SIGTERM)
        assert "STOPPING" in notify_socket.wait_for("STOPPING")[-1]
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert "Traceback" not in output, output


def test_a_full_socket_never_blocks_the_poll_loop(notify_socket: NotifySocket) -> None:
    """Nobody reads the socket (the kernel queues ~10 datagrams): polls from four threads still all finish."""
    service = ServiceNotifier(SdNotifier(notify_socket.path, watchdog_seconds=1e-9))
    service.serving()
    threads = [threading.Thread(target=lambda: [service.poll_finished("ok") for _ in range(100)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    messages = notify_socket.drain()
    assert sum("READY" in m for m in messages) == 1
    assert 0 < len(messages) < 400


def test_a_poll_interval_the_watchdog_cannot_wait_for_exits_78_naming_both_settings(tmp_path: Path) -> None:
    """Pings follow each poll: a poll interval over half of WatchdogSec= meant a restart loop with no hint."""
    env = {**os.environ, "WATCHDOG_USEC": "2000000", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("WATCHDOG_PID", None)
    env.pop("NOTIFY_SOCKET", None)
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--listen", f"127.0.0.1:{free_port()}"]
    cmd += ["--state-dir", str(tmp_path / "state"), "--poll-interval", "1.5"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 78, done.stderr
    assert "agent.poll_interval_seconds: 1.5 s exceeds" in done.stderr and "WatchdogSec=2s" in done.stderr
    assert "Traceback" not in done.stderr
    cmd[-1] = "1"  # exactly half the period is fine
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(3)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
