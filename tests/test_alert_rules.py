"""The shipped alert rules, Alertmanager and Prometheus configs: checked by promtool/amtool, tested with promtool on
synthetic series (deploy/prometheus/tests/) and on /metrics recorded from the real agent over simulated scenarios, so
the exporter and the rules cannot drift apart unnoticed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from promrules import (
    PROM_DIR,
    ROOT,
    Recorder,
    promtool,
    shipped_alert_rules,
    spec_alerts,
    write_rules_without_annotations,
)
from simnode import START_WALL, SimAgent

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: run scripts/test.sh")


def test_rule_files_pass_promtool_check() -> None:
    result = promtool("check", "rules", *(str(PROM_DIR / f) for f in ("gpuwatch-rules.yml", "gpuwatch-alerts.yml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_config_passes_promtool_check() -> None:
    result = promtool("check", "config", str(PROM_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool missing")
def test_alertmanager_config_passes_amtool_check() -> None:
    import subprocess

    path = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_spec_alert_exists_with_its_severity_and_annotations() -> None:
    spec = spec_alerts()
    assert len(spec) >= 28, "the spec's alert table did not parse"
    rules = {r["alert"]: r for r in shipped_alert_rules()}
    assert sorted(rules) == sorted(spec)
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {line[3:].strip().lower() for line in runbooks.splitlines() if line.startswith("## ")}
    for name, severity in spec.items():
        rule = rules[name]
        assert rule["labels"]["severity"] == severity, name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        assert "{{ $value" in annotations["description"] or "$labels" in annotations["description"], name
        anchor = annotations["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section {anchor} in docs/runbooks.md"


def _without_queries(template: str) -> str:
    """A template less its `query` look-ups (whose arguments name the instance to look the value up for)."""
    import re

    return re.sub(r"\{\{ with printf `[^`]*`[^|}]*\| query \}\}", "", template)


def test_summaries_name_the_node_not_the_scrape_address() -> None:
    """A page says which machine: the `node` label (deploy/prometheus/prometheus.yml sets it from the targets file or
    the target's host), falling back to `instance` where a scrape config has no node label. Only the fleet-wide
    alert, about a GPU model rather than a machine, names none."""
    for rule in shipped_alert_rules():
        summary = rule["annotations"]["summary"]
        if rule["alert"] == "GpuProbeRegressionFleetwide":
            continue
        assert "{{ or $labels.node $labels.instance }}" in summary, rule["alert"]
        assert _without_queries(summary).count("$labels.instance") == 1, rule["alert"]


# Alerts on a state, not a quantity: their summary names the state; there is no number with a unit to give.
STATE_ALERTS = {
    "GpuPowerCablesNotAttached",
    "GpuRecoveryActionRequired",
    "GpuRowRemapFailure",
    "GpuRowRemapPending",
    "GpuSramEccThresholdExceeded",
    "GpuInforomCorrupted",
    "GpuFabricNotRegistered",
    "GpuFabricDegraded",  # the conditions are its state
    "GpuMigWithoutInstances",  # MIG enabled, no instance
    "NvidiaFabricManagerDown",
    "HostNetworkPortDown",
    "GpuLost",
    "GpuwatchDown",
    "GpuwatchStateDirNotWritable",
    "GpuBackendDown",
    "HostPsuRedundancyLost",
    "GpuActionRequired",  # the verdict's state and action
    "GpuActionRecommended",
    "GpuDiagFailed",  # the last diag run's result; its detail is in `gpuwatch health`
    "GpuDiagBandwidthLow",
}
# Events (an XID, an SXID, a failed run): the value is how long ago; there is no limit to compare with.
EVENT_ALERTS = {"GpuXidCritical", "GpuXidWarning", "GpuXidNotice", "NvswitchSxidErrors", "GpuwatchCollectorFailing"}
# Alerts whose limit is "none at all": their summaries say so in words, not as "limit 0".
NO_LIMIT_ALERTS = {"GpuPowerBrakeSlowdown": "which a healthy node never applies"}
MODEL_LOOKUP = (
    "last_over_time(gpuwatch_gpu_info{instance=%[1]q,uuid=%[2]q}[1h])` $labels.instance $labels.uuid | query }}"
)


def test_summaries_name_the_gpu_its_model_the_value_and_the_limit() -> None:
    """Issue 16: a page names the node, the GPU and its model, and the value with its unit and its limit. The model
    is looked up in gpuwatch_gpu_info by the `query` template function (Prometheus and vmalert alike) rather than
    joined into the alert: the alert's labels, so Alertmanager's grouping and inhibitions, stay as they were, and an
    alert never waits on a second series. The rendered text is held in deploy/prometheus/tests/
    gpuwatch-annotations-test.yml (promtool, below) and end to end in tests/test_alerts_e2e.py."""
    for rule in shipped_alert_rules():
        name, summary = rule["alert"], rule["annotations"]["summary"]
        if "$labels.gpu " in summary:
            assert "$labels.model" in summary or MODEL_LOOKUP in summary or "pci_bus_id=%[2]q" in summary, name
        if name in STATE_ALERTS:
            continue
        assert "$value" in _without_queries(summary) or "| first | value |" in summary, name  # its own, or looked up
        if name in NO_LIMIT_ALERTS:
            assert NO_LIMIT_ALERTS[name] in summary and "limit 0" not in summary, name
        elif name not in EVENT_ALERTS:
            assert any(w in summary for w in ("limit", ", max ", " expected", " of {{ with")), name  # N of M up


def test_rendered_annotations() -> None:
    """promtool renders the shipped annotations (the shipped rule files unchanged) and compares them exactly."""
    result = promtool("test", "rules", str(PROM_DIR / "tests" / "gpuwatch-annotations-test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load((PROM_DIR / "tests" / "gpuwatch-annotations-test.yml").read_text())["tests"]
    checked = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    groups = yaml.safe_load((PROM_DIR / "gpuwatch-alerts.yml").read_text())["groups"]
    group_of = {r["alert"]: g["name"] for g in groups for r in g["rules"]}
    assert {group_of[name] for name in checked} == {g["name"] for g in groups}, "a kind of alert left unrendered"
    assert {"HostPsuRailUndervoltage", "HostPsuFailed", "GpuPowerCablesNotAttached"} <= checked


def test_inhibition_targets_carry_the_labels_they_are_matched_on() -> None:
    """An inhibition whose target lacks an `equal` label can never match (GpuProbeRegressionFleetwide has only
    `model`): the labels of each alert are read from what the synthetic rule tests expect it to carry."""
    import re

    tests = yaml.safe_load((PROM_DIR / "tests" / "gpuwatch-alerts-test.yml").read_text())["tests"]
    labels: dict[str, set[str]] = {}
    for case in (c for t in tests for c in t["alert_rule_test"]):
        for alert in case.get("exp_alerts") or []:
            labels.setdefault(case["alertname"], set()).update(alert["exp_labels"])
    am = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    checked = 0
    for rule in am["inhibit_rules"]:
        for matcher in rule["target_matchers"]:
            found = re.fullmatch(r'alertname=~?"([A-Za-z|]+)"', matcher)
            if found is None:
                continue
            for name in found.group(1).split("|"):
                assert name in labels, f"{name}: no synthetic test expects it to fire"
                missing = set(rule["equal"]) - labels[name]
                assert not missing, f"{name} lacks {missing}: the inhibition {rule} can never silence it"
                checked += 1
    assert checked >= 5


# NVIDIA's XID catalogue ("Analyzing Xid Errors with the Xid Catalog", docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html, its spreadsheet as of 2025-10-29), column "Resolution Bucket (Immediate Action)", written
# out here by bucket as the catalogue lists them (not from gpuwatch's own table):
def _codes(*spans: int | tuple[int, int]) -> set[str]:
    return {str(c) for s in spans for c in ((s,) if isinstance(s, int) else range(s[0], s[1] + 1))}


RESTART_APP = _codes(8, 11, 13, 25, 31, 32, (39, 41), 60, 68, (69, 72), (75, 77), 80, (82, 86), 88, 89, 94, (96, 105))
RESTART_APP |= _codes((126, 135), 139)
IGNORE = _codes(14, 37, 38, 43, 44, 63, 66, 67, 92, 93, (106, 108), 121, 137, 141, 152, 153, 157, 160, 161)
APPLICATION_XIDS = RESTART_APP | IGNORE
# CHECK_UVM (159), and 45 (WORKFLOW_XID_45, "Solo: RESTART_FM / Not Solo: IGNORE (follow other Xid)") when it comes
# alone (GpuXidNotice's second arm; its promtool cases): the verdict's restart_app, a notice.
NOTICE_XIDS = {"159", "45"}
# RESET_GPU, RESTART_BM (79), RESTART_VM (151), CHECK_MECHANICALS (54), WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR (74),
# WORKFLOW_NVLINK5_ERR (144-150); and by gpuwatch's decision 61, 167 and 169 (gpuwatch/core/thresholds.py says why).
RESET_OR_REBOOT_XIDS = _codes(46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, (144, 151))
RESET_OR_REBOOT_XIDS |= _codes(155, 156, 158, 61, 167, 169)


def _xid_matcher(expr: str) -> tuple[str, str]:
    import re

    found = re.search(r'gpuwatch_gpu_xid_last_timestamp_seconds\{xid(=~|!~)"([^"]+)"\}', expr)
    assert found is not None, expr
    return found.group(1), found.group(2)


def test_every_xid_but_the_application_ones_alerts_exactly_once() -> None:
    """A deny-list, not an allow-list: every code the kernel-log reader can export (1-999, and "other" for the rest)
    raises exactly one of GpuXidCritical, GpuXidWarning and GpuXidNotice, except the catalogue's RESTART_APP and
    IGNORE codes, which raise none; the codes NVIDIA resets or reboots for are critical, CHECK_UVM and 45 (alone) a
    notice, and every other (a CONTACT_SUPPORT, a code without a bucket, one past the catalogue) is a warning."""
    import re

    rules = {r["alert"]: r for r in shipped_alert_rules()}
    (crit_op, crit), (warn_op, warn) = (_xid_matcher(rules[n]["expr"]) for n in ("GpuXidCritical", "GpuXidWarning"))
    assert (crit_op, warn_op) == ("=~", "!~"), "GpuXidWarning must select by exclusion"
    notice = set(re.findall(r'xid="([0-9]+)"', rules["GpuXidNotice"]["expr"]))
    silent = set()
    for xid in [str(code) for code in range(1, 1000)] + ["other"]:
        raised = [re.fullmatch(crit, xid) is not None, re.fullmatch(warn, xid) is None, xid in notice]
        assert sum(raised) <= 1, f"XID {xid} raises more than one alert"
        if not any(raised):
            silent.add(xid)
    assert silent == APPLICATION_XIDS
    assert notice == NOTICE_XIDS
    critical_codes = {xid for xid in [str(code) for code in range(1, 1000)] if re.fullmatch(crit, xid)}
    assert critical_codes == RESET_OR_REBOOT_XIDS
    assert not any(re.fullmatch(crit, xid) for xid in ("78", "154", "159", "173", "other"))


def test_synthetic_rule_tests(tmp_path: Path) -> None:
    write_rules_without_annotations(tmp_path)
    shutil.copy(PROM_DIR / "tests" / "gpuwatch-alerts-test.yml", tmp_path / "test.yml")
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the real agent, recorded -----------------------------------------------------------------------------------

SCRAPE_S = 5
RUN_S = 190  # past every 1-2 m `for:` of the alerts these scenarios raise


def _record(state_dir: Path, scenario: str, seconds: int, restart_after: int | None = None) -> Recorder:
    """Poll every simulated second, scrape every SCRAPE_S; optionally restart the agent (a new one, same node
    identity and state dir) midway, as systemd would."""
    recorder = Recorder(START_WALL, {"instance": "sim:9845", "job": "gpuwatch"})
    agent = SimAgent(state_dir, scenario)
    try:
        for t in range(0, seconds + 1):
            if restart_after is not None and t == restart_after:
                elapsed = agent.clock.elapsed
                agent.close()
                agent = SimAgent(state_dir, scenario)
                agent.clock.elapsed = elapsed  # the node's time goes on; the agent starts from scratch
            agent.clock.elapsed = float(t)
            agent.agent.poll_once()
            agent.agent.read_events_once(agent.slot, 0.0)
            if t % SCRAPE_S == 0:
                recorder.scrape(agent.text())
    finally:
        agent.close()
    return recorder


def _gpu2(state_dir: Path, scenario: str) -> dict[str, str]:
    agent = SimAgent(state_dir, scenario)
    try:
        agent.run(1)
        return agent.gpu(2)
    finally:
        agent.close()


# scenario -> the alerts (name, extra labels) firing after RUN_S seconds; every other spec alert must be silent.
RECORDED: dict[str, list[tuple[str, dict[str, str]]]] = {
    "healthy": [],
    "busy": [],
    # a GPU in thermal slowdown is thermally throttled too (Alertmanager inhibits that one under GpuOverheating)
    "overheating": [("GpuOverheating", {}), ("GpuThermalThrottling", {})],
    "power_brake": [("GpuPowerBrakeSlowdown", {})],
    "gpu_lost": [("GpuLost", {})],
    "xid": [("GpuXidCritical", {"xid": "79"})],
    "ecc_uncorrectable": [("GpuEccUncorrectable", {"type": "uncorrected"})],
    # a failed remap leaves a bank with no spare row (the row remapper's histogram: availability none)
    "row_remap_failure": [
        ("GpuRowRemapFailure", {}),
        ("GpuRowRemapPending", {}),
        ("GpuRecoveryActionRequired", {}),
        ("GpuRowRemapBanksLow", {}),
    ],
}


def _test_case(recorder: Recorder, expected: list[tuple[str, dict[str, str]]], gpu: dict[str, str]) -> dict[str, Any]:
    severities = spec_alerts()
    cases = []
    for name, severity in sorted(severities.items()):
        exp = [
            {"exp_labels": {"severity": severity, "instance": "sim:9845", "job": "gpuwatch", **gpu, **extra}}
            for alert, extra in expected
            if alert == name
        ]
        cases.append({"eval_time": f"{RUN_S}s", "alertname": name, "exp_alerts": exp})
    return {"interval": f"{SCRAPE_S}s", "input_series": recorder.input_series(), "alert_rule_test": cases}


@pytest.mark.parametrize("scenario", sorted(RECORDED))
def test_recorded_scenario_raises_exactly_its_alerts(tmp_path: Path, scenario: str) -> None:
    recorder = _record(tmp_path / "state", scenario, RUN_S)
    gpu = _gpu2(tmp_path / "state2", scenario)
    _run_promtool(tmp_path, [_test_case(recorder, RECORDED[scenario], gpu)])


@pytest.mark.parametrize("scenario", ["busy", "healthy"])
def test_agent_restart_resets_counters_without_alerts(tmp_path: Path, scenario: str) -> None:
    """Counters start again from zero after a restart (throttle seconds of a GPU at its power cap, idle time):
    nothing may fire from the reset itself."""
    recorder = _record(tmp_path / "state", scenario, RUN_S, restart_after=100)
    dropped = [
        name
        for name in recorder.scrapes[-1]
        if name in recorder.scrapes[19]
        and recorder.scrapes[-1][name] < recorder.scrapes[19][name] - 1
        and "_total" in name
    ]
    assert dropped, "the restart did not reset any counter: this test would prove nothing"
    _run_promtool(tmp_path, [_test_case(recorder, [], {})])


def _run_promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    write_rules_without_annotations(tmp_path)
    doc: dict[str, Any] = {
        "rule_files": ["gpuwatch-rules.yml", "gpuwatch-alerts.yml"],
        "evaluation_interval": f"{SCRAPE_S}s",
    }
    doc["tests"] = tests
    (tmp_path / "recorded-test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = promtool("test", "rules", "recorded-test.yml", cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
