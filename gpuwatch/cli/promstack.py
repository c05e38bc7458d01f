"""Real Prometheus and Alertmanager servers run as children on loopback (`gpuwatch demo --alerting`): each on a free
port, its output in a log file, watched while it runs and stopped however it behaves.

A port found free is only free until someone binds it: a client socket or another program may take it before the
server does. So ports are drawn below Linux's ephemeral range (where client sockets land), and a server that exits
saying its address is in use is started again on another port.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
PORT_RANGE = (20000, 32000)  # below the ephemeral ports (32768+), where client sockets take ports at random
START_TRIES = 5
READY_TIMEOUT_SECONDS = 60.0
STOP_GRACE_SECONDS = 10.0
_IN_USE = "address already in use"


class StopFlag:
    """Set by a signal handler, read by the loops that wait on it. A handler may only set a flag: a
    threading.Event's set() takes a lock, which deadlocks when the signal lands while the main thread holds it (in
    its own wait). A wait here is a sleep, which a signal interrupts and Python resumes for what is left (PEP 475),
    so a flag set by a handler is seen within one wait."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self, *_: object) -> None:
        """Usable as the signal handler itself."""
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds in short steps; whether the flag is set."""
        deadline = time.monotonic() + timeout
        while not self._set and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
        return self._set


class ServerStartError(Exception):
    """A server exited or never answered while starting: the message names it and quotes its log."""


class Interrupted(Exception):
    """The stop flag was set while a server was starting."""


def free_ports() -> Iterator[int]:
    """Endless loopback ports free at the moment they are drawn, from PORT_RANGE, in random order."""
    while True:
        port = random.randrange(*PORT_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        yield port


def log_tail(path: Path, lines: int = 12) -> str:
    """The last lines of a log, for a message; never raises."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.rstrip("\n").splitlines()[-lines:]) or "(the log is empty)"


@dataclass(slots=True)
class LocalServer:
    """A running server: its name as people say it, its process, port and log."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def exited(self) -> int | None:
        """Its exit status once it has exited, else None."""
        return self.process.poll()

    def death_notice(self) -> str:
        code = self.process.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        return f"{self.name} {how}; the last lines of {self.log_path}:\n{log_tail(self.log_path)}"

    def stop(self) -> None:
        terminate(self.process)


def terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after STOP_GRACE_SECONDS: nothing is left behind."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


def start_server(
    name: str,
    command: Callable[[int], list[str]],
    log_path: Path,
    stop: StopFlag,
    *,
    ports: Iterator[int] | None = None,
    ready_timeout: float = READY_TIMEOUT_SECONDS,
) -> LocalServer:
    """Start `command(port)` and wait until it answers /-/ready on that port. A server that exits because its port
    was taken is started again on the next port (START_TRIES in all); any other exit, or no answer in time, is a
    ServerStartError quoting its log. The child has its own process group: a Ctrl-C at the terminal reaches only
    gpuwatch, which stops the servers in order."""
    ports = ports if ports is not None else free_ports()
    for _ in range(START_TRIES):
        port = next(ports)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command(port), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, process_group=0
            )
        server = LocalServer(name, process, port, log_path)
        try:
            if _wait_ready(server, stop, ready_timeout):
                return server
        except BaseException:
            terminate(process)
            raise
        if _IN_USE not in log_tail(log_path, lines=1000).lower():
            raise ServerStartError(server.death_notice())
    raise ServerStartError(
        f"{name} found its port taken {START_TRIES} times in a row; the last lines of {log_path}:\n{log_tail(log_path)}"
    )


def _wait_ready(server: LocalServer, stop: StopFlag, timeout: float) -> bool:
    """True once it answers /-/ready while still running; False if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stop.is_set():
            raise Interrupted
        if server.exited() is not None:
            return False
        # not listening yet, or 503 while it loads
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{server.url}-/ready", timeout=2) as answer:
            if answer.status == 200 and server.exited() is None:
                return True
        stop.wait(0.2)
    terminate(server.process)
    raise ServerStartError(
        f"{server.name} did not answer {server.url}-/ready within {timeout:g} s; the last lines of "
        f"{server.log_path}:\n{log_tail(server.log_path)}"
    )


def which_first(names: tuple[str, ...]) -> str | None:
    """The first of `names` found on PATH."""
    return next((found for found in map(shutil.which, names) if found is not None), None)
