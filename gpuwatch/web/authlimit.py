"""What a client may spend on password checks before it is authenticated: a budget of checks per address, and a
bound on the checks that may wait for the one bcrypt check that runs at a time.

The budget per address is a token bucket, taken *before* the bcrypt check and given back when the credentials pass
(or no check ran): 60 guesses sent at once from one address got a check each while failures were counted only
after the check. Each address may try BURST wrong credentials in a row, then one every REFILL_SECONDS: a person
mistyping a password is never stopped, and an address out of budget is answered 429 at once. The table is bounded:
past MAX_ADDRESSES the address seen least recently is forgotten.

The bound on waiting checks (CheckQueue) is what rotating addresses cannot get round: checks run one at a time, so
every request beyond MAX_PENDING_CHECKS would only queue behind the others, holding a connection slot and a thread
(40 wrong passwords a second at cost 12 queued up until every one of the 256 slots was taken and the real scraper
got 503). Beyond the bound a request is answered 429 at once, so a check never waits longer than MAX_PENDING_CHECKS
checks (about 1 s at cost 12), and at most MAX_PENDING_CHECKS connections are ever waiting for one. Credentials that
passed before skip both (see webconfig.BasicAuth): the real scraper, behind a NAT or on loopback, keeps working.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

BURST = 10
REFILL_SECONDS = 1.0
MAX_ADDRESSES = 4096
# A handful of scrapers (two Prometheus replicas, a browser) right after a restart; at cost 12 (~0.25 s a check) the
# last of them is answered within ~1 s, at the highest cost allowed (14, ~0.8 s) within ~3 s: inside Prometheus'
# default 10 s scrape timeout.
MAX_PENDING_CHECKS = 4

T = TypeVar("T")


class FailureLimiter:
    """Budget of password checks per client address; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, as of)
        self._lock = threading.Lock()

    def _tokens(self, address: str, now: float) -> float:
        tokens, since = self._buckets.get(address, (float(BURST), now))
        return min(float(BURST), tokens + (now - since) / REFILL_SECONDS)

    def take(self, address: str) -> bool:
        """Spend one check of the address's budget; False (and nothing spent) when it has none left."""
        now = self._clock()
        with self._lock:
            tokens = self._tokens(address, now)
            if tokens < 1.0:
                return False
            self._buckets[address] = (tokens - 1.0, now)
            self._buckets.move_to_end(address)
            while len(self._buckets) > MAX_ADDRESSES:
                self._buckets.popitem(last=False)
            return True

    def refund(self, address: str) -> None:
        """Give back a check taken by `take`: the credentials passed, or no check ran."""
        now = self._clock()
        with self._lock:
            if address in self._buckets:
                self._buckets[address] = (min(float(BURST), self._tokens(address, now) + 1.0), now)

    def retry_after_seconds(self) -> int:
        return math.ceil(REFILL_SECONDS)


class CheckQueue:
    """Runs checks one at a time, with at most `limit` running or waiting: any more are turned away at once."""

    def __init__(self, limit: int = MAX_PENDING_CHECKS) -> None:
        self._limit = limit
        self._pending = 0
        self._count_lock = threading.Lock()
        self._turn = threading.Lock()  # one check at a time: wrong passwords cost one core at most

    def run(self, check: Callable[[], T]) -> T | None:
        """check()'s result in its turn; None at once when `limit` checks are already running or waiting."""
        with self._count_lock:
            if self._pending >= self._limit:
                return None
            self._pending += 1
        try:
            with self._turn:
                return check()
        finally:
            with self._count_lock:
                self._pending -= 1

    def pending(self) -> int:
        with self._count_lock:
            return self._pending
