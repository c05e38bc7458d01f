"""The layers hold (pyproject.toml, [tool.importlinter]) and every module is in one of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    return [module.strip() for layer in layers for module in layer.split(":")]


def test_every_module_is_in_a_layer() -> None:
    layered = _layers()
    missing = []
    for path in sorted((ROOT / "gpuwatch").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            continue  # a package: its modules are placed, not it
        name = ".".join(parts)
        if not any(name == m or name.startswith(m + ".") for m in layered):
            missing.append(name)
    assert not missing, f"modules in no layer of [tool.importlinter]: {missing}"


def test_the_import_contracts_are_kept() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_registered_collector_is_a_module_of_the_collectors_layer() -> None:
    """gpuwatch/registry.py names each collector's module as a string: it must exist, build collectors, and sit in
    the collectors layer (the service imports it, and it may import only what is below)."""
    import importlib

    from gpuwatch.registry import REGISTRY

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = next(c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    collectors_layer = [m.strip() for m in next(layer for layer in layers if "gpuwatch.collector " in layer).split(":")]
    for registration in REGISTRY:
        module = importlib.import_module(registration.module)
        assert callable(getattr(module, "collectors", None)), registration
        assert any(registration.module == m or registration.module.startswith(m + ".") for m in collectors_layer)
