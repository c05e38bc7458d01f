"""The committed Grafana dashboards as data: their panels, queries, and the metric names those queries use.

Shared by the static dashboard tests and the end-to-end test against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = REPO / "dashboards"
RULES_FILE = REPO / "deploy" / "prometheus" / "gpuwatch-rules.yml"

# Grafana's built-in and dashboard variables, replaced by values Prometheus accepts.
DEFAULT_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$__range_s": "3600",
    "$topn": "5",
    "$node": ".+",
    "$gpu": ".*",
    "$kind": ".+",
}
# Every panel must answer on the simulated fleet (tests/test_dashboards_prometheus.py, and VictoriaMetrics in
# tests/test_victoriametrics_e2e.py); a query listed here may stay empty, with the reason why.
ALLOWED_EMPTY: dict[tuple[str, str, str], str] = {
    ("gpuwatch-node.json", "NVLink / XGMI traffic", "A"): "simulate-fleet's NVIDIA nodes have no NVLink",
    ("gpuwatch-workloads.json", "GPUs allocated but idle for an hour", "A"): (
        "a workload must hold an idle GPU for an hour first (promtool tests it: gpuwatch-workloads-test.yml)"
    ),
}
PROMETHEUS_BUILTINS = {"ALERTS", "up"}  # series Prometheus itself makes: alert state, scrape health
_TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_DURATION = re.compile(r"\[[^\]]*\]")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    @property
    def key(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries() -> list[PanelQuery]:
    out = []
    for name, board in dashboards().items():
        for panel in panels(board):
            for target in panel.get("targets", []):
                out.append(PanelQuery(name, panel["title"], target["refId"], target["expr"]))
    return out


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    values = {**DEFAULT_VARIABLES, **(values or {})}
    for var in sorted(values, key=len, reverse=True):  # $__rate_interval before $__range
        expr = expr.replace(var, values[var])
    if "$" in expr:
        raise AssertionError(f"unsubstituted variable in {expr!r}")
    return expr


def metric_names(expr: str) -> set[str]:
    """Names a query reads: identifiers that are gpuwatch metrics, recording rules (with ':') or Prometheus' own."""
    bare = _DURATION.sub("", _STRING.sub('""', expr))
    names = set()
    for match in _TOKEN.finditer(bare):
        token = match.group()
        followed_by_brace = bare[match.end() : match.end() + 1] == "{"
        if token.startswith("gpuwatch") or ":" in token or token in PROMETHEUS_BUILTINS or followed_by_brace:
            names.add(token)
    return names


def recorded_rules() -> set[str]:
    data = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    return {rule["record"] for group in data["groups"] for rule in group["rules"] if "record" in rule}
