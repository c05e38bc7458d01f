"""The nvidia-ml-py releases the simulated libnvidia-ml is tested under: the installed one (the newest allowed)
and the oldest pyproject allows, unpacked by scripts/test.sh into .venv/bindings/ (never installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.simulated.bindings import installed_pynvml_path

REPO = Path(__file__).resolve().parents[1]
OLDEST = "12.570.86"


def oldest_pynvml_path() -> Path:
    path = REPO / ".venv" / "bindings" / f"nvidia-ml-py-{OLDEST}" / "pynvml.py"
    if not path.is_file():
        pytest.skip(f"nvidia-ml-py {OLDEST} is not unpacked in .venv/bindings: run scripts/test.sh")
    return path


def binding_path(release: str) -> Path:
    return installed_pynvml_path() if release == "installed" else oldest_pynvml_path()


RELEASES = ["installed", OLDEST]
