"""docs/metrics.md and docs/alerts.md are generated (docs/generate.py): from the metric catalogue, and from the alert
rules, their thresholds and the inhibitions. The committed files must be what the generator writes now."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from repofiles import REPO, load_script

from gpuwatch.cli import build_parser
from gpuwatch.exitcodes import MEANINGS
from gpuwatch.metrics import CATALOGUE

GENERATOR = REPO / "docs" / "generate.py"


def _generator() -> ModuleType:
    return load_script(GENERATOR, "docs_generate")


@pytest.mark.parametrize("name", ["metrics.md", "alerts.md"])
def test_committed_reference_is_what_the_generator_writes(name: str) -> None:
    expected = _generator().DOCUMENTS[name]()
    committed = (REPO / "docs" / name).read_text()
    assert committed == expected, f"docs/{name} is out of date: run `python docs/generate.py` to update it"


def test_check_mode_passes_on_the_committed_files() -> None:
    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_mode_says_how_to_update(tmp_path: Path) -> None:
    (tmp_path / "metrics.md").write_text("stale\n")
    args = [sys.executable, str(GENERATOR), "--check", "--out", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "docs/metrics.md is out of date: run `python docs/generate.py` to update it" in done.stderr
    assert "docs/alerts.md is out of date" in done.stderr  # missing counts as stale too


def test_every_metric_and_alert_is_in_its_reference() -> None:
    metrics = (REPO / "docs" / "metrics.md").read_text()
    assert all(f"| `{name}` |" in metrics for name in CATALOGUE)
    alerts = (REPO / "docs" / "alerts.md").read_text()
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "gpuwatch-alerts.yml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(names) >= 28 and all(f"| `{name}` |" in alerts for name in names)


def test_readme_and_help_give_every_exit_status() -> None:
    """The exit statuses are defined once (gpuwatch/exitcodes.py); the README's list and `gpuwatch --help` name each."""
    readme = (REPO / "README.md").read_text()
    listed = readme.split("Exit status:", 1)[1].split("A missing or broken GPU driver", 1)[0]
    assert {int(n) for n in re.findall(r"(?<![\w`-])(\d+) ", listed)} == set(MEANINGS), listed
    epilog = build_parser().epilog or ""
    for code, meaning in MEANINGS.items():
        assert f"{code} {meaning}" in epilog
