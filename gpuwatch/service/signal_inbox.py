"""Signals as data: a handler records what came and writes a byte to a pipe; the main thread waits on that pipe.

A signal handler must not take a lock. `threading.Event.set` takes the Event's condition lock, which is not
reentrant: a SIGHUP that lands while the main thread is inside that lock (in its own `set`, or a handler already
running) waits for it forever, and the main thread stops answering SIGTERM and SIGHUP while the poll threads go on,
so the watchdog never notices. Here a handler only assigns an attribute and writes to a non-blocking pipe (the
wakeup fd). `signal.set_wakeup_fd` makes Python's C-level handler write to the same pipe, which wakes a main
thread blocked in `poll` when the signal was delivered to another thread (Python runs the handler itself only in
the main thread, at its next bytecode); the handler's own byte, written after its flag, wakes it again if the flag
was checked a moment too early. The main thread waits without a timeout, so an idle agent never wakes.

A burst of signals costs one wakeup and coalesces: a thousand SIGHUPs while a reload runs give one more reload.
A full pipe (64 KiB of unread signals) drops bytes, never the flags.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Protocol


class StopRequest(Protocol):
    """What a loop that runs until stopped reads: a threading.Event, or a SignalInbox."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True, slots=True)
class Received:
    """What the signals since the last `receive` asked for."""

    stop: int | None  # the first stop signal's number (it stays set), or None
    reload: bool  # a reload signal came since the last receive (any number of them)


class SignalInbox:
    """Stop and reload signals recorded by handlers that only set attributes, read by the main thread."""

    def __init__(self) -> None:
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._stop_signal: int | None = None  # written only by the handler
        self._reloads = 0  # counted only by the handler
        self._reloads_seen = 0  # only the main thread's
        self._poller: select.poll | None = None

    def install(self, *, stop: Iterable[int], reload: Iterable[int] = ()) -> None:
        """Make the pipe, point Python's wakeup fd at it and install the handlers; again: nothing new. Main thread
        only (Python's rule for signal handlers)."""
        if self._read_fd is None:
            self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._poller = select.poll()
            self._poller.register(self._read_fd, select.POLLIN)
            signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in stop:
            signal.signal(signum, self._on_stop)
        for signum in reload:
            signal.signal(signum, self._on_reload)

    # --- the handlers: an attribute and a byte, nothing that takes a lock ----------------------------------------

    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum
        self.wake()

    def _on_reload(self, _signum: int, _frame: FrameType | None) -> None:
        self._reloads += 1
        self.wake()

    def wake(self) -> None:
        """Wake the main thread's `receive` (from a handler or any thread); a no-op before `install`."""
        if self._write_fd is not None:
            with contextlib.suppress(BlockingIOError):  # full: the main thread has bytes to read anyway
                os.write(self._write_fd, b"\0")

    # --- the main thread -----------------------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Received:
        """Wait until a signal or `wake` came (None: without a timeout), then say what was asked for since the
        last call. Returns at once when something is already pending."""
        if not self._pending():
            self._wait_readable(timeout)
        self._drain()
        reloads = self._reloads
        reload, self._reloads_seen = reloads != self._reloads_seen, reloads
        return Received(self._stop_signal, reload)

    def is_set(self) -> bool:
        """Whether a stop signal came (threading.Event's reader side, for loops that take either)."""
        return self._stop_signal is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Until a stop signal came or `timeout` passed; whether one came (threading.Event's `wait`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._stop_signal is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.receive(left)
        return self._stop_signal is not None

    def _pending(self) -> bool:
        return self._stop_signal is not None or self._reloads != self._reloads_seen

    def _wait_readable(self, timeout: float | None) -> None:
        if self._poller is None:  # never installed: nothing can wake us but the timeout
            if timeout is not None:
                time.sleep(timeout)
            return
        self._poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))  # PEP 475: EINTR retried

    def _drain(self) -> None:
        if self._read_fd is None:
            return
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass
