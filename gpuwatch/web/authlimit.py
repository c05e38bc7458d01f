"""Failed logins per client address, as a token bucket: a wrong password costs a bcrypt check only while the
address still has budget; after that it is answered 429 at once.

Each address may fail BURST times in a row, then once every REFILL_SECONDS: a person mistyping a password is never
stopped, 32 machines guessing in parallel get ~1 check a second each instead of ~5 (bcrypt cost 12) and no CPU
beyond the single check that runs at a time. Credentials that passed before skip this (see webconfig.BasicAuth),
so a scraper behind the same address (a NAT, loopback) keeps working while the bucket is empty. The table is
bounded: past MAX_ADDRESSES the address seen least recently is forgotten.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

BURST = 10
REFILL_SECONDS = 1.0
MAX_ADDRESSES = 4096


class FailureLimiter:
    """Budget of failed logins per client address; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, as of)
        self._lock = threading.Lock()

    def _tokens(self, address: str, now: float) -> float:
        tokens, since = self._buckets.get(address, (float(BURST), now))
        return min(float(BURST), tokens + (now - since) / REFILL_SECONDS)

    def allowed(self, address: str) -> bool:
        """Whether this address may try credentials that are not known good now."""
        with self._lock:
            return self._tokens(address, self._clock()) >= 1.0

    def failed(self, address: str) -> None:
        """Spend one token of the address's budget."""
        now = self._clock()
        with self._lock:
            tokens = self._tokens(address, now)
            self._buckets[address] = (max(0.0, tokens - 1.0), now)
            self._buckets.move_to_end(address)
            while len(self._buckets) > MAX_ADDRESSES:
                self._buckets.popitem(last=False)

    def retry_after_seconds(self) -> int:
        return math.ceil(REFILL_SECONDS)
