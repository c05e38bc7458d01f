"""The systemd notification protocol (sd_notify), spoken directly: one AF_UNIX datagram per message, no dependency.

systemd passes `$NOTIFY_SOCKET` (a filesystem path, or an abstract socket written with a leading `@`) to a
`Type=notify` service, and `$WATCHDOG_USEC` / `$WATCHDOG_PID` when `WatchdogSec=` is set. `ServiceNotifier` turns the
agent's life cycle into messages:

- `READY=1` once the HTTP port is bound *and* the first poll finished, so `systemctl start` returns when `/metrics`
  is complete;
- `WATCHDOG=1` after every poll that finished (rate-limited to a quarter of the watchdog interval). It is sent from
  the poll loop, not a free-running thread: a vendor call that hangs stops the pings and systemd restarts the agent.
  A poll that ends with the driver missing still counts: a missing driver is retried with backoff, never restarted;
- `RELOADING=1` (with `MONOTONIC_USEC`, as `Type=notify-reload` wants) then `READY=1` around a SIGHUP reload;
- `STOPPING=1` on shutdown; `STATUS=` lines that `systemctl status` shows.

Outside systemd (no `$NOTIFY_SOCKET`) every call is a no-op. Sending never raises: a notification lost is better than
an agent that stops polling because the service manager went away.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from gpuwatch.core.latch import Latch

log = logging.getLogger(__name__)


class SdNotifier:
    """Sends sd_notify messages to one socket; `None` socket means "not under systemd" and makes every call a no-op."""

    def __init__(self, socket_path: str | None, *, watchdog_seconds: float | None = None) -> None:
        self.socket_path = socket_path or None
        self.watchdog_seconds = watchdog_seconds
        self._unreachable = Latch(log)  # said once: a service manager that is busy now and then is no news

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, pid: int | None = None) -> SdNotifier:
        """Read `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID` as sd_notify(3) and sd_watchdog_enabled(3) do."""
        env = os.environ if environ is None else environ
        return cls(
            env.get("NOTIFY_SOCKET"), watchdog_seconds=watchdog_seconds(env, os.getpid() if pid is None else pid)
        )

    @property
    def enabled(self) -> bool:
        return self.socket_path is not None

    def notify(self, *assignments: str) -> bool:
        """Send `KEY=VALUE` lines as one datagram; False if not under systemd or the send failed (logged once)."""
        if self.socket_path is None:
            return False
        message = "\n".join(assignments).encode()
        address = "\0" + self.socket_path[1:] if self.socket_path.startswith("@") else self.socket_path
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Never block the poll loop on a busy service manager: a ping dropped is better than a poll stalled.
                sock.sendto(message, socket.MSG_DONTWAIT, address)
        except OSError as exc:
            self._unreachable.fail("cannot notify systemd at %s: %s", self.socket_path, exc)
            return False
        return True


def watchdog_seconds(environ: Mapping[str, str], pid: int) -> float | None:
    """The watchdog interval systemd expects pings within, or None when the watchdog is off or meant for another pid."""
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    watchdog_pid = environ.get("WATCHDOG_PID", "")
    try:
        if watchdog_pid and int(watchdog_pid) != pid:
            return None
        value = int(usec)
    except ValueError:
        log.warning("ignoring malformed WATCHDOG_USEC=%r / WATCHDOG_PID=%r", usec, watchdog_pid)
        return None
    return value / 1_000_000 if value > 0 else None


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds: the clock `MONOTONIC_USEC=` is read against."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class ServiceNotifier:
    """The agent's side of the protocol: readiness once serving and polled, pings from the poll loop, reload, stop.

    Thread-safe: the poll job, the HTTP start and the signal loop call in from different threads.
    """

    def __init__(self, notifier: SdNotifier, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._notifier = notifier
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._serving = False
        self._polled = False
        self._ready_sent = False
        self._stopping = False
        self._last_ping = -float("inf")
        self._last_status = ""
        self._poll_status = ""

    @classmethod
    def from_environment(cls) -> ServiceNotifier:
        return cls(SdNotifier.from_environment())

    @property
    def watchdog_seconds(self) -> float | None:
        return self._notifier.watchdog_seconds

    def serving(self) -> None:
        """The HTTP port is bound and served; READY=1 follows as soon as the first poll has finished too."""
        with self._lock:
            self._serving = True
            self._maybe_ready(self._poll_status)

    def poll_finished(self, status: str) -> None:
        """Called by the poll loop after each poll that returned: the proof of life the watchdog waits for."""
        with self._lock:
            if self._stopping:
                return
            self._polled = True
            self._poll_status = status
            self._maybe_ready(status)
            if not self._ready_sent:
                return
            lines = []
            interval = self._notifier.watchdog_seconds
            now = self._monotonic()
            if interval is not None and now - self._last_ping >= interval / 4:
                lines.append("WATCHDOG=1")
                self._last_ping = now
            if status != self._last_status:
                lines.append(f"STATUS={status}")
                self._last_status = status
            if lines:
                self._notifier.notify(*lines)

    def _maybe_ready(self, status: str) -> None:
        if self._ready_sent or not (self._serving and self._polled):
            return
        lines = ["READY=1", f"STATUS={status}"]
        if self._notifier.watchdog_seconds is not None:
            lines.append("WATCHDOG=1")
            self._last_ping = self._monotonic()
        self._notifier.notify(*lines)
        self._ready_sent = True
        self._last_status = status

    def reloading(self) -> None:
        with self._lock:
            self._notifier.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}", "STATUS=reloading configuration")
            self._last_status = "reloading configuration"

    def reloaded(self, status: str) -> None:
        with self._lock:
            self._notifier.notify("READY=1", f"STATUS={status}")
            self._last_status = status

    def stopping(self) -> None:
        with self._lock:
            if not self._stopping:
                self._stopping = True
                self._notifier.notify("STOPPING=1", "STATUS=stopping")
