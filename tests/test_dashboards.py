"""The Grafana dashboards: regenerated from code without a diff, valid for the SDK's model, every query parsed by
promtool, reading only metrics of the spec and recording rules that exist, with the datasource a variable and a unit
on every panel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboard_queries import (
    DASHBOARD_DIR,
    PROMETHEUS_BUILTINS,
    REPO,
    dashboards,
    metric_names,
    panels,
    queries,
    recorded_rules,
    substitute,
)
from promrules import threshold_records
from test_metrics_spec import spec_metrics

DS_UID = "${datasource}"


def test_committed_json_is_what_the_generator_makes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(DASHBOARD_DIR / "generate.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"dashboards/*.json are stale: {done.stderr}"
    # and the generator writes exactly the committed files
    subprocess.run([sys.executable, str(DASHBOARD_DIR / "generate.py"), "--out", str(tmp_path)], check=True)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(dashboards())


def test_both_dashboards_exist_with_distinct_uids() -> None:
    boards = dashboards()
    assert {"gpuwatch-fleet.json", "gpuwatch-node.json"} <= set(boards)
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_dashboard_loads_into_the_sdk_model(name: str) -> None:
    """The JSON round-trips through grafana-foundation-sdk's Dashboard type (the schema Grafana 10.1 imports)."""
    from grafana_foundation_sdk.models.dashboard import Dashboard

    board = dashboards()[name]
    model = Dashboard.from_json(board)
    assert model.title == board["title"]
    assert board["schemaVersion"] >= 36
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(board):
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, f"{p['title']} overflows the grid"


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_datasource_is_a_variable(name: str) -> None:
    board = dashboards()[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == DS_UID
    for p in panels(board):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == DS_UID, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DS_UID, f"{p['title']} {t['refId']}"


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_node_and_gpu_variables(name: str) -> None:
    variables = {v["name"]: v for v in dashboards()[name]["templating"]["list"]}
    assert "node" in variables["node"]["query"]["query"]
    if name == "gpuwatch-node.json":
        assert variables["node"]["multi"] is False
        assert "gpu" in variables


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_panel_has_a_unit(name: str) -> None:
    for p in panels(dashboards()[name]):
        if p["type"] == "row":
            continue
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']} has no unit"
        assert p["targets"], f"{p['title']} has no query"


def test_units_match_what_is_plotted() -> None:
    """Temperatures in celsius, power in watts, clocks in hertz, FLOP/s and bytes/s where those are plotted."""
    expected = {
        "Core temperature and slowdown threshold": "celsius",
        "Power against limits": "watt",
        "SM clock against max": "hertz",
        "Probe throughput against baseline": "flops",
        "Host ↔ device bandwidth": "Bps",
        "Supply rails": "volt",
    }
    node = {p["title"]: p for p in panels(dashboards()["gpuwatch-node.json"])}
    for title, unit in expected.items():
        assert node[title]["fieldConfig"]["defaults"]["unit"] == unit, title


def test_every_query_parses_with_promtool(promtool: str, tmp_path: Path) -> None:
    """Each expression, variables substituted, becomes a recording rule that `promtool check rules` parses."""
    all_queries = queries()
    assert len(all_queries) > 40
    rules = {
        "groups": [
            {
                "name": "dashboard-queries",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": substitute(q.expr)} for i, q in enumerate(all_queries)
                ],
            }
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False, allow_unicode=True), encoding="utf-8")
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_most_throttled_leaves_out_the_normal_reasons() -> None:
    """An idle GPU accrues gpu_idle and NVML's low_utilization policy time all the time: neither is throttling."""
    fleet = [q for q in queries() if q.dashboard == "gpuwatch-fleet.json"]
    most = [q for q in fleet if q.panel == "Most throttled (top $topn)"]
    assert most
    for q in most:
        excluded = q.expr.split('reason!~"', 1)[1].split('"', 1)[0].split("|")
        assert {"gpu_idle", "low_utilization", "sw_power_cap"} <= set(excluded), q.expr


def test_xid_panel_counts_the_first_xid_of_a_code(promtool: str, tmp_path: Path) -> None:
    """A code's counter appears with its first XID, at 1: increase() sees nothing there, the panel counts 1."""
    (expr,) = [q.expr for q in queries() if q.dashboard == "gpuwatch-node.json" and q.panel == "XID errors"]
    labels = 'node="n1",instance="n1:9845",job="gpuwatch",gpu="0",uuid="U0"'
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # XID 79 first seen at 5 m; XID 48 counted from 0, once at 6 m and once at 7 m.
                    {"series": f'gpuwatch_gpu_xid_errors_total{{{labels},xid="79"}}', "values": "_x5 1x10"},
                    {"series": f'gpuwatch_gpu_xid_errors_total{{{labels},xid="48"}}', "values": "0x5 1 2x9"},
                ],
                "promql_expr_test": [
                    {
                        "expr": substitute(expr),  # $__rate_interval = 1m
                        "eval_time": at,
                        "exp_samples": [
                            {"labels": '{gpu="0",xid="79"}', "value": xid79},
                            {"labels": '{gpu="0",xid="48"}', "value": xid48},
                        ],
                    }
                    for at, xid79, xid48 in (("5m", 1, 0), ("6m", 0, 1), ("7m", 0, 1), ("9m", 0, 0))
                ],
            }
        ],
    }
    (tmp_path / "xid-panel.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", "xid-panel.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_queries_read_only_spec_metrics_and_existing_rules() -> None:
    spec = set(spec_metrics())
    rules = recorded_rules()
    unknown = {}
    for q in queries():
        for name in metric_names(q.expr):
            if name not in spec and name not in rules and name not in PROMETHEUS_BUILTINS:
                unknown.setdefault(name, []).append(q.key)
    assert not unknown, f"queries read metrics that are neither in docs/metrics.md nor recorded: {unknown}"


def test_joins_are_on_uuid() -> None:
    """Every binary operation between two GPU metrics matches on uuid (within its instance), never on all labels."""
    for q in queries():
        if "group_left" in q.expr and "gpuwatch_gpu" in q.expr:
            assert "on(instance, uuid" in q.expr or "on(model)" in q.expr or "on(instance, chip" in q.expr, q.key


def test_metric_name_extraction() -> None:
    names = metric_names('max by (gpu) (gpuwatch_gpu_power_watts{node=~"$node"}) / on(instance, uuid) ALERTS{a="b:c"}')
    assert names == {"gpuwatch_gpu_power_watts", "ALERTS"}
    assert metric_names("rate(gpuwatch:x:y[5m])") == {"gpuwatch:x:y"}


def test_provisioning_files() -> None:
    provider = yaml.safe_load((REPO / "dashboards/provisioning/dashboards.yml").read_text())
    assert provider["apiVersion"] == 1 and provider["providers"][0]["type"] == "file"
    datasource = yaml.safe_load((REPO / "dashboards/provisioning/datasource.yml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus"


def _steps(thresholds: dict[str, Any]) -> list[float]:
    """The values of a Grafana thresholds object's steps (the first, the base, has none)."""
    return [s["value"] for s in thresholds.get("steps", []) if s.get("value") is not None]


FLEET, GPUS = "gpuwatch-fleet.json", "GPUs: temperature, power, clocks, throttling, probe"
# Panel (or table column) -> the threshold record its colour change stands for.
PANEL_THRESHOLDS = {
    (FLEET, "Hottest GPU headroom", None): "core_temperature_margin_celsius",
    (FLEET, GPUS, "Headroom to slowdown"): "core_temperature_margin_celsius",
    (FLEET, GPUS, "Limit / default"): "power_limit_ratio",
    (FLEET, GPUS, "Probe / baseline"): "probe_baseline_ratio",
    (FLEET, GPUS, "Probe / fleet"): "probe_fleet_ratio",
    (FLEET, "Closest to slowdown (top $topn)", "Headroom to slowdown"): "core_temperature_margin_celsius",
    (FLEET, "Slowest against the fleet (top $topn)", "Probe / fleet"): "probe_fleet_ratio",
}


def test_the_dashboards_colour_where_the_alerts_fire() -> None:
    """Every threshold a dashboard draws is the number of the rules' record it stands for (issue 30: the dashboards
    had 0.95 and 5 °C written in while the recording rules hold the thresholds), and no query multiplies by a literal
    ratio where a gpuwatch:threshold:* record exists."""
    records = threshold_records()
    boards = dashboards()
    for (board, title, column), record in PANEL_THRESHOLDS.items():
        panel = next(p for p in panels(boards[board]) if p["title"] == title)
        if column is None:
            drawn = _steps(panel["fieldConfig"]["defaults"].get("thresholds", {}))
        else:
            overrides = panel["fieldConfig"].get("overrides", [])
            found = [o for o in overrides if o.get("matcher", {}).get("options") == column]
            assert found, (title, column)
            drawn = [v for o in found for p in o["properties"] if p["id"] == "thresholds" for v in _steps(p["value"])]
        assert records[record] in drawn, (board, title, column, drawn, record, records[record])
    for query in queries():
        for literal in ("0.95 *", "0.9 *", "* 0.95", "* 0.9"):
            assert literal not in query.expr, query
