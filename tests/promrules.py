"""Helpers for the rule tests: the shipped rule files, annotation-free copies for promtool, and /metrics recorded
from the real agent over time turned into promtool `input_series`."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
PROM_DIR = ROOT / "deploy" / "prometheus"
RULE_FILES = ("gpuwatch-rules.yml", "gpuwatch-alerts.yml")
SPEC_NAMES = ROOT / "tests" / "fixtures" / "spec-names.json"


def threshold_records(path: Path = PROM_DIR / "gpuwatch-rules.yml") -> dict[str, float]:
    """The rules' gpuwatch:threshold:<name> records and their numbers (each a `vector(N)`), by <name>."""
    out = {}
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            name = rule.get("record", "")
            if name.startswith("gpuwatch:threshold:"):
                found = re.fullmatch(r"vector\(([-0-9.e]+)\)", rule["expr"].strip())
                assert found, rule
                out[name.removeprefix("gpuwatch:threshold:")] = float(found.group(1))
    return out


def spec_alerts(path: Path = SPEC_NAMES) -> dict[str, str]:
    """Alert name -> severity, as first agreed (the names only grow; none is renamed)."""
    alerts: dict[str, str] = json.loads(path.read_text())["alerts"]
    return alerts


def shipped_alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROM_DIR / "gpuwatch-alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def every_alert_rule() -> list[tuple[Path, dict[str, Any]]]:
    """(file, rule) for every alert gpuwatch ships: the default file and the opt-in ones of optional/."""
    files = [PROM_DIR / "gpuwatch-alerts.yml", *sorted((PROM_DIR / "optional").glob("*.yml"))]
    return [
        (path, rule)
        for path in files
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def runbook_sections(path: Path = ROOT / "docs" / "runbooks.md") -> dict[str, str]:
    """Alert name -> the text of its `## Name` section of docs/runbooks.md."""
    sections = re.split(r"^## ", path.read_text(), flags=re.M)[1:]
    return {section.split("\n", 1)[0].strip(): section for section in sections}


def first_step(section: str) -> str | None:
    """The first sentence of a runbook section's "**What to do.**" paragraph, on one line: what every alert's
    description ends with. A sentence ends at a full stop followed by a space or the paragraph's end, outside `code`
    and parentheses (`nvidia-smi -r -i N`, "(RMA).")."""
    found = re.search(r"^\*\*What to do\.\*\* (.+?)(?:\n\n|\Z)", section, re.M | re.S)
    if found is None:
        return None
    paragraph = " ".join(found[1].split())
    in_code, depth = False, 0
    for i, char in enumerate(paragraph):
        if char == "`":
            in_code = not in_code
        elif in_code:
            continue
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "." and depth == 0 and (i + 1 == len(paragraph) or paragraph[i + 1] == " "):
            return paragraph[: i + 1]
    return paragraph


def write_rules_without_annotations(dest: Path) -> None:
    """promtool compares annotations exactly; the logic is what these tests hold, so drop them in a copy."""
    for name in RULE_FILES:
        doc = yaml.safe_load((PROM_DIR / name).read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        (dest / name).write_text(yaml.safe_dump(doc, sort_keys=False))


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


class Recorder:
    """Scrapes an agent's text exposition at moments of a test's choosing; renders promtool input_series.

    Unix-time gauges (`*_timestamp_seconds`) are moved onto promtool's clock, which starts at 0 at `wall_zero`."""

    def __init__(self, wall_zero: float, labels: dict[str, str]) -> None:
        self.wall_zero = wall_zero
        self.labels = labels
        self.scrapes: list[dict[str, float]] = []

    def scrape(self, text: str) -> None:
        sample: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                value = s.value - self.wall_zero if s.name.endswith("_timestamp_seconds") else s.value
                labels = {**s.labels, **self.labels}
                body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                sample[f"{s.name}{{{body}}}"] = value
        self.scrapes.append(sample)

    def input_series(self) -> list[dict[str, str]]:
        names = sorted({n for s in self.scrapes for n in s})
        return [{"series": n, "values": " ".join(_fmt(s.get(n)) for s in self.scrapes)} for n in names]


def _fmt(value: float | None) -> str:
    return "_" if value is None else repr(float(value))
