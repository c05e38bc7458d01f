"""What the README's first command installs is enough for what it runs: `pip install -e .` (core dependencies only)
then `gpuwatch demo`, whose simulated node runs NVIDIA's real binding over a simulated libnvidia-ml."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_needs_nothing_beyond_the_core_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {spec.split(">")[0].split("=")[0].split("<")[0].strip().lower() for spec in project["dependencies"]}
    assert "nvidia-ml-py" in names, "gpuwatch demo imports pynvml: keep nvidia-ml-py a core dependency"
