"""A rotated TLS certificate takes effect without a restart: cert-manager, certbot and Vault rewrite the files in
place (or swap a symlink), and an agent that kept the old one served an expired certificate until restarted.

Before a handshake, the certificate, key and CA files are stat()ed (at most once a second); when any changed, the
context is built again from the same web config. A half-rotated pair (the new certificate beside the old key)
fails to load: the working context is kept and the failure is logged once per change, and the next change is
tried again.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 1.0

Signature = tuple[tuple[int, int, int], ...]


def _signature(files: Sequence[str]) -> Signature:
    out = []
    for path in files:
        try:
            info = os.stat(path)
            out.append((info.st_mtime_ns, info.st_size, info.st_ino))
        except OSError:
            out.append((-1, -1, -1))
    return tuple(out)


class TlsReloader:
    """The current TLS context, rebuilt when its files change."""

    def __init__(
        self,
        context: ssl.SSLContext,
        files: Sequence[str],
        build: Callable[[], ssl.SSLContext],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._context = context
        self._files = tuple(files)
        self._build = build
        self._clock = clock
        self._signature = _signature(self._files)
        self._checked = clock()
        self._lock = threading.Lock()

    def context(self) -> ssl.SSLContext:
        """The context to use for the next handshake."""
        now = self._clock()
        if now - self._checked < CHECK_INTERVAL_SECONDS:
            return self._context
        with self._lock:
            if now - self._checked < CHECK_INTERVAL_SECONDS:
                return self._context
            self._checked = now
            signature = _signature(self._files)
            if signature != self._signature:
                self._signature = signature
                try:
                    self._context = self._build()
                except Exception as exc:  # ConfigError naming the file: keep serving with the last good context
                    log.warning("TLS files changed but cannot be loaded, keeping the previous certificate: %s", exc)
                else:
                    log.info("TLS certificate reloaded from %s", ", ".join(self._files))
            return self._context
