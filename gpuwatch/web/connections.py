"""The HTTP server's bounds on what clients can hold before they are authenticated: connections, time and bytes.

Every connection gets a thread (a scrape never waits on another), so clients that connect and then trickle bytes
— or never finish their request — would otherwise hold threads, file descriptors and header buffers without limit
(1,000 trickling clients held 1,007 threads; 300 sending 98 × 65 KB headers took 1.8 GiB). Here:

- at most MAX_CONNECTIONS at once. When full, a new connection evicts the connection that has been sending its
  request head longest (a real scraper sends its ~300-byte request in one packet, so it is never the oldest
  incomplete one); when every connection is already being answered, the new one gets a 503 and is closed.
- a request head (request line and headers) must arrive within HEAD_DEADLINE_SECONDS in total, not per read;
  a whole exchange within CONNECTION_DEADLINE_SECONDS.
- at most MAX_LINE_BYTES per line and MAX_HEAD_BYTES per head, so all connections together buffer at most
  MAX_CONNECTIONS × MAX_HEAD_BYTES (16 MiB).
- out of file descriptors (EMFILE) in accept(): evict the oldest incomplete connection, or pause accepting for a
  moment; said at most once a minute, never a traceback, never a busy loop.

The numbers: Prometheus sends a request head of ~300 bytes; Apache's LimitRequestFieldSize is 8,190 bytes, Go's
net/http allows 1 MiB per head (DefaultMaxHeaderBytes) but serves far more than three read-only paths. 64 KiB is 200
times what a scraper sends. 256 connections is far above any scrape fan-out (a few Prometheus replicas, a status-page
reader) and, with LimitNOFILE=1024 in the unit, leaves room for the vendor libraries' descriptors.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
HEAD_DEADLINE_SECONDS = 10.0
CONNECTION_DEADLINE_SECONDS = 60.0
MAX_LINE_BYTES = 8 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADER_LINES = 100
LISTEN_BACKLOG = 1024  # the kernel caps it at net.core.somaxconn (4096 on current kernels)
EMFILE_PAUSE_SECONDS = 0.1
REPORT_INTERVAL_SECONDS = 60.0
REAP_SLACK_SECONDS = 0.05  # the reaper wakes this late past a deadline, so one wake finds it passed


@dataclass(eq=False, slots=True)
class Connection:
    sock: socket.socket
    started: float
    head_done: bool = False
    closed: bool = False


@dataclass(slots=True)
class _Report:
    """A warning said at most once per REPORT_INTERVAL_SECONDS, with how often it happened meanwhile."""

    text: str
    last: float = float("-inf")
    count: int = 0

    def say(self, now: float) -> None:
        self.count += 1
        if now - self.last >= REPORT_INTERVAL_SECONDS:
            log.warning("%s (%d time(s) since the last report)", self.text, self.count)
            self.last, self.count = now, 0


@dataclass
class ConnectionTable:
    """The open connections, oldest first; the accept thread admits, a reaper thread enforces deadlines.

    The reaper sleeps until the earliest deadline, and without a timeout while no connection is open: an idle
    agent's HTTP side never wakes (each wake of a thread costs ~0.1 ms of CPU on a small VM)."""

    limit: int = MAX_CONNECTIONS
    clock: object = time.monotonic
    _open: dict[int, Connection] = field(default_factory=dict)  # by id(sock), in admission order
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _reports: dict[str, _Report] = field(default_factory=dict)
    _changed: threading.Condition = field(init=False)
    _reaper_asleep: bool = False  # waiting without a timeout: a newcomer must wake it
    _stopping: bool = False

    def __post_init__(self) -> None:
        self._changed = threading.Condition(self._lock)

    def now(self) -> float:
        return self.clock()  # type: ignore[operator,no-any-return]

    def admit(self, sock: socket.socket) -> Connection | None:
        """Register a new connection; None when it must be refused (every slot is answering a request)."""
        with self._lock:
            if len(self._open) >= self.limit and not self._evict_oldest_incomplete_locked():
                self.report("busy", f"{self.limit} connections are being answered; refusing new ones with 503")
                return None
            conn = Connection(sock, self.now())
            self._open[id(sock)] = conn
            if self._reaper_asleep:  # otherwise it wakes at an earlier deadline than this one's anyway
                self._changed.notify()
            return conn

    def release(self, conn: Connection) -> None:
        with self._lock:
            self._open.pop(id(conn.sock), None)

    def head_done(self, conn: Connection) -> None:
        with self._lock:
            conn.head_done = True

    def evict_oldest_incomplete(self) -> bool:
        """Close the connection that has been sending its request head longest; False when there is none."""
        with self._lock:
            return self._evict_oldest_incomplete_locked()

    def _evict_oldest_incomplete_locked(self) -> bool:
        for conn in self._open.values():
            if not conn.head_done and not conn.closed:
                _shut(conn)
                del self._open[id(conn.sock)]
                return True
        return False

    def reap_until_stopped(self) -> None:
        """The reaper thread: close each connection at its deadline until `stop_reaping`."""
        with self._changed:
            while not self._stopping:
                now = self.now()
                self._close_past_deadline_locked(now)
                earliest = min(map(_deadline, self._open.values()), default=None)
                self._reaper_asleep = earliest is None
                self._changed.wait(None if earliest is None else earliest - now + REAP_SLACK_SECONDS)
                self._reaper_asleep = False

    def stop_reaping(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def _close_past_deadline_locked(self, now: float) -> None:
        for key, conn in list(self._open.items()):
            if now > _deadline(conn):
                _shut(conn)
                del self._open[key]

    def count(self) -> int:
        with self._lock:
            return len(self._open)

    def report(self, key: str, text: str) -> None:
        """A rate-limited warning (no traceback): floods must not fill the journal."""
        self._reports.setdefault(key, _Report(text)).say(self.now())


def _deadline(conn: Connection) -> float:
    """When the connection is closed: a request head must be in within its deadline, a whole exchange within its
    own. A deadline only moves later (when the head is in), so a reaper asleep until the old one merely wakes early."""
    return conn.started + (CONNECTION_DEADLINE_SECONDS if conn.head_done else HEAD_DEADLINE_SECONDS)


def _shut(conn: Connection) -> None:
    """Wake the connection's thread out of its read (it then ends); the thread closes the socket itself."""
    conn.closed = True
    with contextlib.suppress(OSError):
        conn.sock.shutdown(socket.SHUT_RDWR)


class HeadTooLarge(Exception):
    """The request head broke a byte or line limit: answered 431 (or 414 for the request line)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def read_head(rfile: object) -> bytes | None:
    """The request head (request line to blank line) from a buffered reader, bounded; None if the client left.

    Raises HeadTooLarge for a line over MAX_LINE_BYTES, a head over MAX_HEAD_BYTES or MAX_HEADER_LINES lines."""
    readline = rfile.readline  # type: ignore[attr-defined]
    lines: list[bytes] = []
    total = 0
    while True:
        line: bytes = readline(MAX_LINE_BYTES + 1)
        if not line:
            return None
        if len(line) > MAX_LINE_BYTES:
            raise HeadTooLarge("414 URI Too Long" if not lines else "431 Request Header Fields Too Large")
        total += len(line)
        if total > MAX_HEAD_BYTES or len(lines) > MAX_HEADER_LINES:
            raise HeadTooLarge("431 Request Header Fields Too Large")
        if not lines and line in (b"\r\n", b"\n"):  # RFC 9112 2.2: ignore an empty line before the request line
            continue
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def simple_response(status: str, body: str) -> bytes:
    """A whole HTTP/1.0 response (as wsgiref answers) that closes the connection, sent instead of the app's."""
    payload = body.encode()
    return (
        f"HTTP/1.0 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + payload


def looks_like_plain_http(first: bytes) -> bool:
    """Whether the first bytes on a TLS port are a plain HTTP request (as Go's net/http tells them apart)."""
    return first[:5] in (b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO", b"DELET", b"PATCH", b"CONNE", b"TRACE")
