"""Shared fixtures: the names first agreed and the promtool binary. Helpers tests import live in modules beside this
one (ports.py, repofiles.py, simnode.py, ...), never here."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
from repofiles import spec_names


@pytest.fixture(name="spec_names")
def spec_names_fixture() -> dict[str, Any]:
    return spec_names()


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path
