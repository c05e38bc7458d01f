"""The amdsmi releases the AMD tests run over: the installed 7.0.2 and 6.4.3 from .venv/bindings (scripts/test.sh
extracts its wheel there). A test over a release that is not there is skipped, saying where it should be."""

from __future__ import annotations

import pytest

from gpuwatch.simulated.amdsmi_binding import binding_package
from gpuwatch.simulated.amdsmi_sim import BINDINGS


def _release(release: str) -> object:
    try:
        binding_package(release)
        missing = ""
    except FileNotFoundError as exc:
        missing = str(exc)
    return pytest.param(release, id=release, marks=pytest.mark.skipif(bool(missing), reason=missing))


RELEASES = [_release(release) for release in BINDINGS]
over_releases = pytest.mark.parametrize("release", RELEASES)
