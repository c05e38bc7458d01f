"""The alert rules and the GPU's verdict agree (issue 32; docs/verdicts.md, "How the alerts and the verdicts agree").

The rule, per alert of the shipped rules, with the verdict's actions for its condition read from
gpuwatch/judge/gpu_verdict.py's own tables and functions (not written out again here):
- an action beyond restart_app alerts a person: severity warning or critical;
- restart_app, with nothing beyond it, is at most a notice: severity info;
- none alone never pages at night: warning (a person acts within the day, off the GPU) or info;
- a critical condition of the agent's judge (a "bad" finding: the verdict's unhealthy) is a critical alert, a
  warning's ("warn": degraded) a warning, so an alert and the verdict's own alert for the same GPU never differ in
  severity;
- GpuActionRequired (unhealthy) and GpuActionRecommended (degraded) alert on exactly the actions beyond restart_app;
  Alertmanager inhibits them while an alert of the same GPU that asks for an action fires, and their `for:` outlasts
  every such alert's delay, so that alert is the one page.
Each runbook section of docs/runbooks.md starts with the action, checked against the same tables. A real
Alertmanager with the shipped routing shows the inhibitions and receivers as its own semantics apply them."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from promrules import ROOT, every_alert_rule, runbook_sections

from gpuwatch.config.settings import ProbeSection
from gpuwatch.core.model import UnusableGpu
from gpuwatch.core.thresholds import threshold, xid_class
from gpuwatch.judge import gpu_verdict
from gpuwatch.judge.gpu_verdict import ACTIONS, unusable_step, xid_step

AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

# Alerts about the node, the agent, a switch or a fleet, not one GPU: no GPU verdict (their runbooks say so).
NO_GPU_VERDICT = {
    "HostPsuRailUndervoltage",
    "HostPsuFailed",
    "HostPsuRedundancyLost",
    "GpuBackendDown",
    "GpuwatchDown",
    "GpuwatchCollectorFailing",
    "GpuwatchStateDirNotWritable",
    "GpuProbeRegressionFleetwide",
    "NvswitchSxidErrors",
    "NvidiaFabricManagerDown",  # the node's daemon; its GPUs' own fabric state says the rest
    "HostNetworkPortDown",  # the node's NICs: node findings (/health/gpus 503), no one GPU's verdict
    "HostNetworkPortRateLow",
    "HostNetworkPortFlapping",
    "HostNetworkPortErrors",
    "GpuAllocatedButIdle",  # opt-in: a workload's use of a healthy GPU
}
VERDICT_ALERTS = {"GpuActionRequired": "unhealthy", "GpuActionRecommended": "degraded"}
XID_ALERTS = {"critical": "GpuXidCritical", "warning": "GpuXidWarning", "notice": "GpuXidNotice"}
# Where the agent's judge and the rule judge different conditions of one signal, so their levels differ on purpose.
LEVEL_EXCEPTIONS = {
    ("warn", "GpuEccUncorrectable"): "the judge sees the lifetime count (degraded); the rule its growth (critical)",
    ("warn", "GpuwatchVendorCallHung"): "another GPU's hung call freezes this one's readings (degraded, none)",
}
NEEDS_ACTION = {a for a in ACTIONS if ACTIONS.index(a) > ACTIONS.index("restart_app")}


def _rules() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for _, rule in every_alert_rule()}


def _xid_actions() -> dict[str, set[str]]:
    """Each XID alert's actions: every code the kernel-log reader exports (1-999, and -1: xid="other"), judged
    alone by the verdict's own xid_step."""
    out: dict[str, set[str]] = {name: set() for name in XID_ALERTS.values()}
    for code in [*range(1, 1000), -1]:
        cls = xid_class(code)
        if cls in XID_ALERTS:
            out[XID_ALERTS[cls]].add(xid_step(code, 1, 0.0, cls).action)
    return out


def verdict_actions(alert: str) -> set[str]:
    """The actions the GPU's verdict gives the alert's condition; empty for an alert with no GPU verdict."""
    table = gpu_verdict._ACTION_OF_ALERT
    if alert in NO_GPU_VERDICT:
        return set()
    if alert in VERDICT_ALERTS:
        return set(NEEDS_ACTION)
    if alert in XID_ALERTS.values():
        return _xid_actions()[alert]
    if alert == "GpuRecoveryActionRequired":  # by the driver's value; a value the table does not know: reset_gpu
        return {*gpu_verdict._ACTION_OF_RECOVERY.values(), "reset_gpu"}
    if alert == "GpuCountBelowExpected":  # each GPU the library counts but cannot open
        return {unusable_step(UnusableGpu(3, "gpu_is_lost")).action}
    assert alert in table, f"{alert}: add it to gpu_verdict._ACTION_OF_ALERT (what it asks of a GPU) or NO_GPU_VERDICT"
    actions: set[str] = {table[alert][0]}
    if alert == "GpuwatchVendorCallHung":
        actions.add("none")  # the node's other GPUs, frozen by the call
    return actions


def _duration_s(text: str | None) -> float:
    if not text:
        return 0.0
    total = 0.0
    for number, unit in re.findall(r"(\d+)([smhd])", text):
        total += int(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    return total


def _delay_s(name: str, rule: dict[str, Any]) -> float:
    """How long after its condition begins an alert fires, at the shipped defaults."""
    if name == "GpuUnderperforming":  # at the Nth slow probe in a row: N - 1.5 probe intervals after the first
        return (threshold("probe_slow_probes") - 1.5) * ProbeSection().interval_seconds
    return _duration_s(rule.get("for"))


def _finding_levels() -> set[tuple[str, str]]:
    """(level, alert) of every Finding the agent's judge (gpuwatch/judge/) builds with literal arguments."""
    out = set()
    for path in (ROOT / "gpuwatch" / "judge").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Finding" and len(node.args) >= 2:
                level, alert = node.args[0], node.args[1]
                if isinstance(level, ast.Constant) and isinstance(alert, ast.Constant):
                    out.add((str(level.value), str(alert.value)))
    return out


# --- the rules ---------------------------------------------------------------------------------------------------


def test_every_alert_has_a_decided_verdict_and_a_severity_that_agrees_with_it() -> None:
    rules = _rules()
    assert {"GpuActionRequired", "GpuActionRecommended", "GpuXidNotice", "GpuXidCritical"} <= set(rules)
    problems = []
    for name, rule in sorted(rules.items()):
        severity = rule["labels"]["severity"]
        actions = verdict_actions(name)
        assert actions <= set(ACTIONS), (name, actions)
        if actions & NEEDS_ACTION:
            allowed = {"warning", "critical"}
        elif "restart_app" in actions:
            allowed = {"info"}
        elif actions == {"none"}:
            allowed = {"warning", "info"}
        else:
            continue  # no GPU verdict: the node's, the agent's or a fleet's own severity
        if severity not in allowed:
            problems.append(f"{name}: severity {severity}, verdict {sorted(actions)}: allowed {sorted(allowed)}")
    assert not problems, "\n".join(problems)


def test_the_judges_levels_are_the_alerts_severities() -> None:
    """A finding's level is the verdict's state (bad: unhealthy, warn: degraded): its alert has the same severity,
    so an alert of a signal and the verdict's own alert for that GPU never differ (the inhibitions rely on it)."""
    rules = _rules()
    levels = _finding_levels()
    assert ("bad", "GpuOverheating") in levels and ("warn", "GpuRowRemapPending") in levels, levels
    problems = []
    for level, name in sorted(levels):
        if level == "info" or (level, name) in LEVEL_EXCEPTIONS:
            continue
        expected = {"bad": "critical", "warn": "warning"}[level]
        if rules[name]["labels"]["severity"] != expected:
            problems.append(f"{name}: the judge says {level}, the rule {rules[name]['labels']['severity']}")
    assert not problems, "\n".join(problems)


def test_the_verdicts_alerts_select_exactly_the_actions_beyond_restart_app() -> None:
    rules = _rules()
    for name, state in VERDICT_ALERTS.items():
        expr = rules[name]["expr"]
        selected = re.search(r'gpuwatch_gpu_recommended_action\{action=~"([a-z_|]+)"\} == 1', expr)
        assert selected is not None, expr
        assert set(selected.group(1).split("|")) == NEEDS_ACTION, name
        assert re.search(rf'gpuwatch_gpu_health\{{state="{state}"\}} == 1', expr), name
        assert rules[name]["labels"]["severity"] == {"unhealthy": "critical", "degraded": "warning"}[state]


def _inhibit_sources(target: str) -> tuple[set[str], dict[str, Any]]:
    am = yaml.safe_load(AM_CONFIG.read_text())
    found = [r for r in am["inhibit_rules"] if r["target_matchers"] == [f'alertname="{target}"']]
    assert len(found) == 1, f"one inhibition whose only target is {target}: {found}"
    names = next(m for m in found[0]["source_matchers"] if m.startswith("alertname=~"))
    return set(names.removeprefix('alertname=~"').removesuffix('"').split("|")), found[0]


def test_every_alert_that_asks_for_an_action_inhibits_the_verdicts_alert_of_its_gpu() -> None:
    rules = _rules()
    per_gpu_action_alerts = {
        name
        for name in rules
        if verdict_actions(name) & NEEDS_ACTION and name not in VERDICT_ALERTS and name != "GpuCountBelowExpected"
    }
    for target in VERDICT_ALERTS:
        sources, rule = _inhibit_sources(target)
        assert sources == per_gpu_action_alerts, (target, sources ^ per_gpu_action_alerts)
        assert rule["equal"] == ["instance", "gpu", "uuid"]
        # a warning never silences the critical one, which may carry a worse fault of the same GPU
        assert ('severity="critical"' in rule["source_matchers"]) == (target == "GpuActionRequired")


def test_the_verdicts_alerts_wait_until_the_alerts_of_their_gpus_signals_have_fired() -> None:
    """Their `for:` outlasts the delay of every alert that inhibits them, so that alert fires first and is the page:
    the verdict never pages before the words of the signal itself."""
    rules = _rules()
    for target in VERDICT_ALERTS:
        sources, rule = _inhibit_sources(target)
        critical_only = 'severity="critical"' in rule["source_matchers"]
        delays = {
            name: _delay_s(name, rules[name])
            for name in sources
            if not critical_only or rules[name]["labels"]["severity"] == "critical"
        }
        slowest = max(delays, key=delays.__getitem__)
        assert _duration_s(rules[target]["for"]) > delays[slowest], (target, slowest, delays[slowest])


# --- the runbooks ------------------------------------------------------------------------------------------------


def test_each_runbook_starts_with_its_verdicts_action() -> None:
    """The first line of each alert's section: `**Action:** ` and the verdict's actions in backticks (every action
    of its condition, nothing else in backticks), with what to inspect for inspect_hardware; "no GPU verdict" for the
    alerts about the node, the agent or a fleet."""
    sections = runbook_sections()
    problems = []
    for name in sorted(_rules()):
        first = sections[name].split("\n", 1)[1].strip().split("\n", 1)[0]
        found = re.fullmatch(r"\*\*Action:\*\* (.+)", first)
        if found is None:
            problems.append(f"{name}: its first line is {first!r}, not **Action:** ...")
            continue
        line, expected = found.group(1), verdict_actions(name)
        if not expected:
            if not line.startswith("no GPU verdict"):
                problems.append(f"{name}: no GPU verdict, but its runbook says {line!r}")
            continue
        named = set(re.findall(r"`([^`]+)`", line))
        if named != expected:
            problems.append(f"{name}: the runbook names {sorted(named)}, the verdict {sorted(expected)}")
        action, part = gpu_verdict._ACTION_OF_ALERT.get(name, ("", ""))
        if part and f"`{action}`: the {part}" not in line:
            problems.append(f"{name}: the runbook must say `{action}`: the {part}")
    assert not problems, "\n".join(problems)


# --- a real Alertmanager -----------------------------------------------------------------------------------------


def _alert(name: str, severity: str, instance: str, gpu: str, uuid: str = "", **extra: str) -> dict[str, Any]:
    labels = {"alertname": name, "severity": severity, "instance": instance, "job": "gpuwatch", "gpu": gpu, **extra}
    if uuid:
        labels["uuid"] = uuid
    now = datetime.now(UTC)
    return {
        "labels": labels,
        "annotations": {"summary": name},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
    }


@pytest.mark.skipif(ALERTMANAGER is None, reason="alertmanager missing: run scripts/test.sh (prometheus-alertmanager)")
def test_alertmanager_sends_one_page_per_fault_and_restart_app_as_a_notice(tmp_path: Path) -> None:
    """The shipped routing and inhibitions, applied by a real Alertmanager to alerts as the rules raise them."""
    port = free_port()
    proc = subprocess.Popen(
        [
            str(ALERTMANAGER),
            f"--config.file={AM_CONFIG}",
            f"--storage.path={tmp_path / 'am'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=(tmp_path / "am.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/api/v2"
    alerts = [
        # n1 GPU 0: XID 79 fires, and the verdict's alert too (its `for:` would have passed): one page, the XID's
        _alert("GpuXidCritical", "critical", "n1", "0", "U0", xid="79"),
        _alert("GpuActionRequired", "critical", "n1", "0", "U0", action="reboot_node"),
        # n1 GPU 1: a fault the agent holds after its signal cleared: the verdict's alert is the page
        _alert("GpuActionRequired", "critical", "n1", "1", "U1", action="reboot_node"),
        # n2 GPU 1: an XID on a GPU of the same index on another node silences nothing on n1
        _alert("GpuXidCritical", "critical", "n2", "1", "W1", xid="79"),
        # n1 GPU 2: a warning (runs hot) does not silence a critical verdict of the same GPU (a held XID 79)
        _alert("GpuTemperatureHigh", "warning", "n1", "2", "U2"),
        _alert("GpuActionRequired", "critical", "n1", "2", "U2", action="inspect_hardware"),
        # n1 GPU 3: a warning that asks for an action silences the degraded verdict's warning
        _alert("GpuRowRemapPending", "warning", "n1", "3", "U3"),
        _alert("GpuActionRecommended", "warning", "n1", "3", "U3", action="reset_gpu"),
        # n1 GPU 4: a warning whose action is none (a power limit) leaves the verdict's own warning alone
        _alert("GpuPowerLimitBelowDefault", "warning", "n1", "4", "U4"),
        _alert("GpuActionRecommended", "warning", "n1", "4", "U4", action="reset_gpu"),
        # n3: a GPU the library cannot open (no uuid) is GpuCountBelowExpected's; on n4 nothing says so
        _alert("GpuCountBelowExpected", "critical", "n3", ""),
        _alert("GpuActionRequired", "critical", "n3", "6", action="reboot_node"),
        _alert("GpuActionRequired", "critical", "n4", "6", action="reboot_node"),
        # n1 GPU 5: XID 45 alone, restart_app: a notice
        _alert("GpuXidNotice", "info", "n1", "5", "U5", xid="45"),
    ]
    for a in alerts:
        if not a["labels"]["gpu"]:
            del a["labels"]["gpu"]
    expected = {
        ("GpuXidCritical", "n1", "0"): ("active", "gpuwatch-critical"),
        ("GpuActionRequired", "n1", "0"): ("suppressed", "gpuwatch-critical"),
        ("GpuActionRequired", "n1", "1"): ("active", "gpuwatch-critical"),
        ("GpuXidCritical", "n2", "1"): ("active", "gpuwatch-critical"),
        ("GpuTemperatureHigh", "n1", "2"): ("active", "gpuwatch-warning"),
        ("GpuActionRequired", "n1", "2"): ("active", "gpuwatch-critical"),
        ("GpuRowRemapPending", "n1", "3"): ("active", "gpuwatch-warning"),
        ("GpuActionRecommended", "n1", "3"): ("suppressed", "gpuwatch-warning"),
        ("GpuPowerLimitBelowDefault", "n1", "4"): ("active", "gpuwatch-warning"),
        ("GpuActionRecommended", "n1", "4"): ("active", "gpuwatch-warning"),
        ("GpuCountBelowExpected", "n3", ""): ("active", "gpuwatch-critical"),
        ("GpuActionRequired", "n3", "6"): ("suppressed", "gpuwatch-critical"),
        ("GpuActionRequired", "n4", "6"): ("active", "gpuwatch-critical"),
        ("GpuXidNotice", "n1", "5"): ("active", "gpuwatch-info"),
    }
    try:
        deadline = time.monotonic() + 60
        seen: dict[tuple[str, str, str], tuple[str, str]] = {}
        while time.monotonic() < deadline:
            try:
                request = urllib.request.Request(
                    f"{base}/alerts", json.dumps(alerts).encode(), {"Content-Type": "application/json"}
                )
                urllib.request.urlopen(request, timeout=5).close()
                with urllib.request.urlopen(f"{base}/alerts", timeout=5) as reply:
                    got = json.loads(reply.read())
            except OSError:
                time.sleep(0.5)
                continue
            seen = {
                (a["labels"]["alertname"], a["labels"]["instance"], a["labels"].get("gpu", "")): (
                    a["status"]["state"],
                    ",".join(r["name"] for r in a["receivers"]),
                )
                for a in got
            }
            if seen == expected:
                break
            time.sleep(0.5)
        assert seen == expected, (
            "\n".join(f"{k}: {seen.get(k)} != {v}" for k, v in expected.items() if seen.get(k) != v)
            + (tmp_path / "am.log").read_text()[-2000:]
        )
    finally:
        proc.terminate()
        proc.wait(15)
