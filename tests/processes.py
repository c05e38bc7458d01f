"""The real processes an end-to-end test starts (Prometheus, gpuwatch, a fleet): waiting for them to answer, and
stopping them however they behave."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request


def wait_until_ready(url: str, proc: subprocess.Popen[bytes], what: str, seconds: float = 60.0) -> None:
    """Until `url` answers; fails at once, naming `what`, if the process exits first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{what} did not answer {url} in time")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s: a test never leaves a process behind."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
