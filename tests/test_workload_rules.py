"""The gpuwatch-workloads recording rules and the opt-in GpuAllocatedButIdle, under the real promtool: the rule tests
of deploy/prometheus/tests/gpuwatch-workloads-test.yml (fires / stays silent, GPU-hours, joules, tensor means),
and the opt-in file kept apart from the default alerts with its severity, annotations and runbook section."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from promrules import PROM_DIR, ROOT, SPEC_NAMES, promtool, shipped_alert_rules, write_rules_without_annotations

OPTIONAL = PROM_DIR / "optional" / "gpuwatch-allocated-idle.yml"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: run scripts/test.sh")


def _optional_rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(OPTIONAL.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _run_rule_tests(tmp_path: Path, optional: Path = OPTIONAL) -> str:
    write_rules_without_annotations(tmp_path)
    doc = yaml.safe_load(optional.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "gpuwatch-allocated-idle.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(PROM_DIR / "tests" / "gpuwatch-workloads-test.yml", tmp_path / "test.yml")
    done = promtool("test", "rules", "test.yml", cwd=tmp_path)
    return done.stdout + done.stderr if done.returncode else ""


@needs_promtool
def test_the_optional_rule_file_passes_promtool_check() -> None:
    done = promtool("check", "rules", str(PROM_DIR / "gpuwatch-rules.yml"), str(OPTIONAL))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_workload_rule_tests_pass(tmp_path: Path) -> None:
    assert _run_rule_tests(tmp_path) == ""


@needs_promtool
def test_the_rule_tests_catch_an_alert_that_fires_on_busy_gpus(tmp_path: Path) -> None:
    """The tests can fail: an alert that ignores SM activity fires for the busy pod, and promtool says so."""
    broken = tmp_path / "broken.yml"
    doc = yaml.safe_load(OPTIONAL.read_text())
    doc["groups"][0]["rules"][0]["expr"] = "gpuwatch_gpu_workload_info == 1"
    broken.write_text(yaml.safe_dump(doc))
    (tmp_path / "run").mkdir()
    assert "GpuAllocatedButIdle" in _run_rule_tests(tmp_path / "run", broken)


def test_the_opt_in_alert_is_apart_from_the_default_alerts_with_severity_annotations_and_runbook() -> None:
    optional = json.loads(SPEC_NAMES.read_text())["optional_alerts"]
    rules = {r["alert"]: r for r in _optional_rules()}
    assert sorted(rules) == sorted(optional)
    assert not set(optional) & {r["alert"] for r in shipped_alert_rules()}, "an opt-in alert is in the default file"
    anchors = {line[3:].strip().lower() for line in (ROOT / "docs" / "runbooks.md").read_text().splitlines()}
    for name, severity in optional.items():
        rule = rules[name]
        assert rule["labels"] == {"severity": severity}
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert "{{ or $labels.node $labels.instance }}" in annotations["summary"]
        assert "$value" in annotations["description"]
        anchor = annotations["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower() and anchor in anchors
    assert "optional/gpuwatch-allocated-idle.yml" in (ROOT / "docs" / "alerting.md").read_text()
