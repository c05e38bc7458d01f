"""The real processes an end-to-end test starts (Prometheus, gpuwatch, a fleet): waiting for them to answer, and
stopping them however they behave."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


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


def stop_all(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every process at once, then each stopped as `stop` does: a fixture's agents exit together."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        stop(proc)


def until(
    what: str, test: Callable[[], T], timeout: float, *, every: float = 0.5, context: Callable[[], str] = str
) -> T:
    """`test()`'s first truthy answer within `timeout` seconds; else fails naming `what`, the last answer and
    `context()` (a log tail, say)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = test()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: never held; last {last!r}{context()}")
