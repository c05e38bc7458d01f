"""Free TCP ports for the tests that start real servers (the agent, Prometheus, Alertmanager, VictoriaMetrics)."""

from __future__ import annotations

import socket
import time

_RANGE_START, _RANGE_END = 20000, 32000  # below Linux's ephemeral ports, which client sockets take at random


def free_port() -> int:
    """A free port outside the ranges free_port_range hands out."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port >= _RANGE_END:
            return port


def free_port_range(n: int) -> int:
    """The first port of n consecutive free ports, below the ephemeral range (where a scraper's own client sockets
    could take one of them between this check and the bind), starting at a time-dependent place so parallel runs
    rarely meet."""
    start = _RANGE_START + (int(time.time() * 1000) % 400) * 25
    for base in [*range(start, _RANGE_END - n, 97), *range(_RANGE_START, start, 97)]:
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports between {_RANGE_START} and {_RANGE_END}")
