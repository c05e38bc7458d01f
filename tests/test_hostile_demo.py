"""`gpuwatch demo` is for the machine it runs on: it listens on loopback only and keeps its state in the user's own
private cache, never under a guessable name in a shared /tmp."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from gpuwatch.config.settings import DEFAULT_PORT
from gpuwatch.files.statedir import demo_state_dir, make_private_dir, state_dir_problem


def test_the_demo_keeps_its_state_out_of_shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    path = demo_state_dir("nvidia")
    assert path == tmp_path / "home" / ".cache" / "gpuwatch" / "demo-nvidia"
    assert not str(path).startswith(tempfile.gettempdir() + "/gpuwatch-demo")
    make_private_dir(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert state_dir_problem(path) is None


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@pytest.mark.skipif(not _port_free(DEFAULT_PORT), reason=f"port {DEFAULT_PORT} is in use here")
def test_the_demo_listens_on_loopback_only(tmp_path: Path) -> None:
    """It printed 127.0.0.1 URLs while listening on every interface."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "demo", "--gpus", "1", "--probe-interval", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert demo.stdout is not None
        deadline = time.monotonic() + 30
        while "metrics:" not in demo.stdout.readline():
            assert demo.poll() is None and time.monotonic() < deadline, "the demo did not start"
        listening = [c.laddr for c in psutil.Process(demo.pid).net_connections("inet") if c.status == "LISTEN"]
        assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", DEFAULT_PORT)]
        assert (tmp_path / "cache" / "gpuwatch" / "demo-nvidia").is_dir()
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=30)
