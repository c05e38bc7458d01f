"""Shared test helpers: the names first agreed, free ports, and the promtool binary."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SPEC_NAMES = REPO / "tests" / "fixtures" / "spec-names.json"


def spec_names() -> dict[str, Any]:
    """The names first agreed (metrics, collectors, alerts, commands, scenarios), kept in the repository: the list only
    grows, and no name on it is ever renamed or removed."""
    names: dict[str, Any] = json.loads(SPEC_NAMES.read_text())
    return names


@pytest.fixture(name="spec_names")
def spec_names_fixture() -> dict[str, Any]:
    return spec_names()


def free_port() -> int:
    """A free port outside the ranges free_port_range hands out."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port >= _RANGE_END:
            return port


_RANGE_START, _RANGE_END = 20000, 32000  # below Linux's ephemeral ports, which client sockets take at random


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


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path
