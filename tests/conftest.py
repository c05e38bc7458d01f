"""Shared test helpers: where the project's contracts live, free ports, and the promtool binary."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    """The contracts and fixtures beside the checkout (../shared), or $GPUWATCH_SHARED."""
    path = Path(os.environ.get("GPUWATCH_SHARED", REPO.parent / "shared"))
    if not (path / "spec" / "metrics.md").exists():
        raise RuntimeError(f"{path} has no spec/metrics.md: set GPUWATCH_SHARED to the shared/ folder")
    return path


@pytest.fixture
def shared() -> Path:
    return shared_dir()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path
