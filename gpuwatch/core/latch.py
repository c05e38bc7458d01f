"""The one way gpuwatch logs a problem that persists: a line when it starts, silence while it holds, a line when it
clears, and a line again when it comes back.

A failing disk, a missing driver or a slow GPU is seen at every poll; logging each time buries the one line the
operator needs, and never logging the recovery leaves them guessing whether the fix worked. Each condition is a
`Latch`; `key` tells apart the things one latch watches (a GPU's UUID, a chip, a file), so GPU 3 failing never
silences GPU 5. A warn-once notice (a hint that stays true until restart) is a latch nobody clears.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import Any


class Latch:
    """Log a condition's start once per episode, and its end once; thread-safe (pollers and scrapes share them)."""

    def __init__(self, logger: logging.Logger, *, repeat_when_changed: bool = False) -> None:
        """repeat_when_changed: a different message while failing is a new problem and is logged too (the host
        collectors: `ipmitool` timing out, then the BMC device vanishing)."""
        self._log = logger
        self._repeat_when_changed = repeat_when_changed
        self._failing: dict[Hashable, str] = {}  # key -> the message logged for its current episode
        self._lock = threading.Lock()

    def fail(
        self,
        message: str,
        *args: Any,
        key: Hashable = None,
        level: int = logging.WARNING,
        exc_info: bool = False,
    ) -> bool:
        """The condition holds for `key`: log it if it did not already (True when this call logged)."""
        text = message % args if args else message
        with self._lock:
            logged = self._failing.get(key)
            if logged is not None and (logged == text or not self._repeat_when_changed):
                return False
            self._failing[key] = text
        self._log.log(level, message, *args, exc_info=exc_info)
        return True

    def recover(self, message: str = "", *args: Any, key: Hashable = None, level: int = logging.INFO) -> bool:
        """The condition cleared for `key`: log `message` if it was failing (True when it was); "" clears silently."""
        with self._lock:
            if self._failing.pop(key, None) is None:
                return False
        if message:
            self._log.log(level, message, *args)
        return True

    def failing(self, key: Hashable = None) -> bool:
        """Whether `key`'s condition was logged and has not cleared since."""
        with self._lock:
            return key in self._failing
