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

from gpuwatch.cli.main import build_parser
from gpuwatch.core.exitcodes import MEANINGS
from gpuwatch.exposition.catalogue import CATALOGUE

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
    """The exit statuses are defined once (gpuwatch/core/exitcodes.py); the README's list and `gpuwatch --help` name
    each."""
    readme = (REPO / "README.md").read_text()
    listed = readme.split("Exit status:", 1)[1].split("A missing or broken GPU driver", 1)[0]
    assert {int(n) for n in re.findall(r"(?<![\w`-])(\d+) ", listed)} == set(MEANINGS), listed
    epilog = build_parser().epilog or ""
    for code, meaning in MEANINGS.items():
        assert f"{code} {meaning}" in epilog


def test_the_alert_table_states_the_rules_own_thresholds() -> None:
    """Every percentage and °C figure in docs/alerting.md's table of alerts is a threshold its alert's rule reads
    (a gpuwatch:threshold:* record, as a share or as what is left of one: 95 % limit, 5 % tolerance) or a number the
    expression holds: the table said 90 % for the probe while the rules said 95 % (issue 30)."""
    import re

    import yaml

    repo = Path(__file__).resolve().parent.parent
    recorded = {
        rule["record"]: str(rule["expr"])
        for group in yaml.safe_load((repo / "deploy/prometheus/gpuwatch-rules.yml").read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    records = {
        name.removeprefix("gpuwatch:threshold:"): float(expr.strip()[7:-1])
        for name, expr in recorded.items()
        if name.startswith("gpuwatch:threshold:")
    }

    def expanded(expr: str, seen: frozenset[str] = frozenset()) -> str:
        """The expression with the recording rules it reads, and theirs, appended (their thresholds count too)."""
        used = set(re.findall(r"gpuwatch:[a-z_]+:[a-z_0-9:]+", expr)) - seen
        return expr + "".join(expanded(recorded[n], seen | used) for n in sorted(used) if n in recorded)

    alerts = {
        rule["alert"]: rule["expr"]
        for group in yaml.safe_load((repo / "deploy/prometheus/gpuwatch-alerts.yml").read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    rows = re.findall(r"^\| `(\w+)` \| \w+ \| (.*) \|$", (repo / "docs/alerting.md").read_text(), re.M)
    assert len(rows) >= 20, "the table of alerts moved: follow it here"
    for alert, text in rows:
        expr = expanded(alerts[alert])
        allowed: set[float] = set()
        for name in re.findall(r"gpuwatch:threshold:(\w+)", expr):
            value = records[name]
            allowed |= {round(value, 6), round(value * 100, 6), round((1 - value) * 100, 6)}
        for figure in re.findall(r"(\d+(?:\.\d+)?) ?(?:%|°C)", text):
            assert float(figure) in allowed, (alert, figure, sorted(allowed), text)
