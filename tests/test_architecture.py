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


def test_the_layers_name_packages_and_few_modules_sit_at_the_top() -> None:
    """The contract states the tree: packages (and the two top-level modules that must be there), not a module
    list; at most one module beside __init__ and __main__ sits directly under gpuwatch/."""
    layered = _layers()
    assert len(layered) <= 20, layered
    for entry in layered:
        path = ROOT / entry.replace(".", "/")
        assert path.is_dir() or entry in ("gpuwatch.__main__", "gpuwatch.registry"), f"{entry} is not a package"
    top = sorted(p.name for p in (ROOT / "gpuwatch").glob("*.py"))
    assert set(top) <= {"__init__.py", "__main__.py", "registry.py"}, top


def test_every_registered_collector_is_its_own_module_of_the_collectors_package() -> None:
    """gpuwatch/registry.py names each collector's module as a string: it must exist, build collectors and say its
    check lines, and be gpuwatch/collectors/<name>.py, named as it is registered (node_exporter's one file each)."""
    import importlib

    from gpuwatch.registry import REGISTRY

    for registration in REGISTRY:
        assert registration.module == f"gpuwatch.collectors.{registration.name}", registration
        module = importlib.import_module(registration.module)
        assert callable(getattr(module, "collectors", None)), registration
        assert callable(getattr(module, "check", None)), registration


def _layers_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layers.py"), *args], capture_output=True, text=True, timeout=60
    )


def test_no_cycle_and_no_import_up_the_layers_counting_every_import() -> None:
    done = _layers_script()
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("package cycles: 0", "imports up the layers: 0", "module cycles: 0", "modules outside every layer: 0"):
        assert line in done.stdout, done.stdout


def test_the_layer_script_sees_imports_in_functions_and_under_type_checking(tmp_path: Path) -> None:
    """A tree that breaks the layers where import-linter's defaults may not look: the script names each break."""
    (tmp_path / "pyproject.toml").write_text(
        '[[tool.importlinter.contracts]]\ntype = "layers"\nlayers = ["gpuwatch.top", "gpuwatch.low"]\n'
    )
    for package in ("gpuwatch", "gpuwatch/top", "gpuwatch/low", "gpuwatch/stray"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "gpuwatch/top/a.py").write_text("from gpuwatch.low import b\n")
    (tmp_path / "gpuwatch/low/b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuwatch.top.a import x\n"
    )
    (tmp_path / "gpuwatch/low/c.py").write_text("def f():\n    from gpuwatch.top import a\n")
    (tmp_path / "gpuwatch/stray/d.py").write_text("")
    done = _layers_script("--root", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "package cycles: 1" in done.stdout and "gpuwatch.low <-> gpuwatch.top" in done.stdout, done.stdout
    # c's `from gpuwatch.top import a` imports the package and its module: two imports up
    assert "imports up the layers: 3" in done.stdout, done.stdout
    for line in (
        "gpuwatch.low.b -> gpuwatch.top.a (up",
        "gpuwatch.low.c -> gpuwatch.top (up",
        "gpuwatch.low.c -> gpuwatch.top.a (up",
    ):
        assert line in done.stdout, done.stdout
    assert "module cycles: 1" in done.stdout and "gpuwatch.low.b <-> gpuwatch.top.a" in done.stdout, done.stdout
    assert "modules outside every layer: 2" in done.stdout and "  gpuwatch.stray.d" in done.stdout, done.stdout
