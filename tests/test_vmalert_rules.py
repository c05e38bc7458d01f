"""The shipped rule files on a real vmalert and victoria-metrics, without a fleet (issue 18, issue 16): vmalert
accepts them unchanged, the counter alerts mean on VictoriaMetrics what they mean on Prometheus (MetricsQL's
increase() counts a series new in its window from 0), and vmalert renders the summaries word for word as promtool
does. The fleet end to end is tests/test_victoriametrics_e2e.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from promrules import PROM_DIR, first_step, runbook_sections
from test_alerts_e2e import _get, _poll, _stop, scale_durations

_missing = [t for t in ("victoria-metrics", "vmalert") if shutil.which(t) is None]
if _missing and os.environ.get("CI"):
    raise RuntimeError(f"{_missing} missing: scripts/test.sh installs victoria-metrics")
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"{_missing} missing: run scripts/test.sh (Debian victoria-metrics)"
)


def test_vmalert_accepts_the_shipped_rules_unchanged() -> None:
    """The shipped files as they are (durations unscaled): vmalert parses every expression as MetricsQL and every
    annotation template, and deploy/victoriametrics/vmalert.flags' -rule paths are those files."""
    rules = [f"-rule={PROM_DIR / name}" for name in ("gpuwatch-rules.yml", "gpuwatch-alerts.yml")]
    done = subprocess.run(["vmalert", "-dryRun", *rules], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


RUNBOOK_BASE = "https://wiki.example.com/gpu-runbooks"

# (metric, labels) of the counters the increase()-based alerts read; `and rate(...) > 0` guards each of them.
COUNTER_ALERTS = {
    "GpuPowerBrakeSlowdown": ("gpuwatch_gpu_throttle_seconds_total", 'reason="hw_power_brake"'),
    "GpuPcieFatalErrors": ("gpuwatch_gpu_pcie_errors_total", 'type="fatal"'),
    "GpuPcieNonFatalErrors": ("gpuwatch_gpu_pcie_errors_total", 'type="non_fatal"'),
    "GpuEccUncorrectable": ("gpuwatch_gpu_ecc_errors_total", 'type="uncorrected"'),
    "GpuReset": ("gpuwatch_gpu_reset_events_total", ""),
    "GpuComputeErrors": ("gpuwatch_probe_compute_errors_total", ""),
}
# Counter alerts whose threshold is not "> 0", or that join two of them: every increase(x[w]) in them has its
# `rate(x[w]) > 0` beside it.
THRESHOLD_COUNTER_ALERTS = {"HostNetworkPortFlapping", "HostNetworkPortErrors"}
# GpuProbeFailing compares floor(increase over 6 h) with a threshold: the probe counters exist from the agent's start,
# so no new series is counted from 0 there; the others alert on "> 0", where that would fire at a node's first scrapes.
INCREASE_UNGUARDED = {"GpuProbeFailing"}


def test_every_increase_alert_is_guarded_by_rate() -> None:
    """`increase(x[w]) > 0` alone fires on VictoriaMetrics for a node seen for the first time whose counters are
    already above 0 (MetricsQL counts a series new in the window from 0): each such rule also asks `rate(x[w]) > 0`,
    which means the same on Prometheus (increase = rate x window) and is 0 there on VictoriaMetrics."""
    alerts = yaml.safe_load((PROM_DIR / "gpuwatch-alerts.yml").read_text())
    by_name = {r["alert"]: r["expr"] for g in alerts["groups"] for r in g["rules"] if "alert" in r}
    with_increase = {name for name, expr in by_name.items() if "increase(" in expr}
    assert with_increase - INCREASE_UNGUARDED == set(COUNTER_ALERTS) | THRESHOLD_COUNTER_ALERTS
    for name in THRESHOLD_COUNTER_ALERTS:
        expr = " ".join(by_name[name].split())
        for argument in re.findall(r"increase\((.*?\[\w+\])\)", expr):
            assert f"and rate({argument}) > 0" in expr, (name, argument)
    for name in COUNTER_ALERTS:
        expr = " ".join(by_name[name].split())
        increase, _, guard = expr.partition(" and ")
        assert guard == increase.replace("increase(", "rate(") and increase.endswith("> 0"), (name, expr)


def test_counter_alerts_quiet_on_a_new_node_with_lifetime_counts(tmp_path: Path) -> None:
    """On a real victoria-metrics: a node first scraped 5 minutes ago, its counters constant at their lifetime counts
    (5), raises none of the counter alerts; a counter that grows does; and the unguarded `increase() > 0` would have
    fired on the constant one (the difference the guard is there for)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *("victoria-metrics", f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}"),
            *("-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=ERROR"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _poll(
            "victoria-metrics up",
            lambda: urllib.request.urlopen(f"{url}/health", timeout=2).status == 200,
            time.monotonic() + 30,
        )
        now = int(time.time())
        lines = []
        for metric, labels in COUNTER_ALERTS.values():
            for node, start, step in (("node-new", 5, 0), ("node-erring", 5, 1)):
                base = f'instance="{node}:9845",node="{node}",gpu="0",uuid="GPU-{node}"' + (
                    f",{labels}" if labels else ""
                )
                lines += [f"{metric}{{{base}}} {start + i * step} {(now - 300 + 15 * i) * 1000}" for i in range(21)]
        request = urllib.request.Request(f"{url}/api/v1/import/prometheus", data="\n".join(lines).encode())
        urllib.request.urlopen(request, timeout=10).close()
        urllib.request.urlopen(f"{url}/internal/force_flush", timeout=10).close()
        alerts = yaml.safe_load((PROM_DIR / "gpuwatch-alerts.yml").read_text())
        by_name = {r["alert"]: r["expr"] for g in alerts["groups"] for r in g["rules"] if "alert" in r}

        def nodes(expr: str) -> set[str]:
            params = urllib.parse.urlencode({"query": expr, "time": str(now)})
            return {r["metric"].get("node", "") for r in _get(f"{url}/api/v1/query?{params}")["data"]["result"]}

        _poll("the imported samples", lambda: bool(nodes("gpuwatch_gpu_reset_events_total")), time.monotonic() + 30)
        for name, (metric, labels) in COUNTER_ALERTS.items():
            assert nodes(by_name[name]) == {"node-erring"}, name
            assert nodes(f"increase({metric}{{{labels}}}[10m]) > 0") == {"node-new", "node-erring"}, name
    finally:
        _stop(proc)


def _promtool_values(values: str) -> list[str]:
    """promtool's expanding notation as far as gpuwatch-annotations-test.yml uses it: `a`, `axN` (a, N more times)."""
    out: list[str] = []
    for term in values.split():
        value, _, times = term.partition("x")
        out += [value] * (int(times) + 1 if times else 1)
    return out


def test_vmalert_renders_the_summaries_promtool_holds(tmp_path: Path) -> None:
    """vmalert 1.79 renders the shipped summaries (the `query` look-ups of the model and the limits, `first`,
    `label`, printf) word for word as promtool does: the input series of deploy/prometheus/tests/
    gpuwatch-annotations-test.yml, imported into a real victoria-metrics (the last 10 minutes, `for:` scaled down),
    give vmalert's alerts the summaries that file expects. Those that read the time (an XID's age) or a 6 h window
    are left out. With `-external.label=gpuwatch_runbook_base=...` (which vmalert also puts on what its recording
    rules write: the summaries and the alerts are the same for it), every runbook_url is built from that base."""
    spec = yaml.safe_load((PROM_DIR / "tests" / "gpuwatch-annotations-test.yml").read_text())["tests"][0]
    expected = {
        (case["alertname"], alert["exp_annotations"]["summary"])
        for case in spec["alert_rule_test"]
        for alert in case["exp_alerts"]
        if case["alertname"] not in ("GpuXidCritical", "GpuProbeFailing")
    }
    now = int(time.time())
    lines = []
    for series in spec["input_series"]:
        for i, value in enumerate(_promtool_values(series["values"])[-10:]):
            if value not in ("_", "stale") and "_timestamp_seconds" not in series["series"]:
                lines.append(f"{series['series']} {value} {(now - 540 + 60 * i) * 1000}")
    for name in ("gpuwatch-rules.yml", "gpuwatch-alerts.yml"):
        (tmp_path / name).write_text(scale_durations((PROM_DIR / name).read_text(), 0.01))
    vm_port, alert_port = free_port(), free_port()
    url, alert_url = f"http://127.0.0.1:{vm_port}", f"http://127.0.0.1:{alert_port}"
    procs = [
        subprocess.Popen(
            [
                *("victoria-metrics", f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{vm_port}"),
                *("-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=ERROR"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        _poll(
            "victoria-metrics up",
            lambda: urllib.request.urlopen(f"{url}/health", timeout=2).status == 200,
            time.monotonic() + 30,
        )
        request = urllib.request.Request(f"{url}/api/v1/import/prometheus", data="\n".join(lines).encode())
        urllib.request.urlopen(request, timeout=10).close()
        urllib.request.urlopen(f"{url}/internal/force_flush", timeout=10).close()
        rules = [f"-rule={tmp_path / name}" for name in ("gpuwatch-rules.yml", "gpuwatch-alerts.yml")]
        procs.append(
            subprocess.Popen(
                [
                    *("vmalert", *rules, f"-datasource.url={url}", f"-remoteWrite.url={url}"),
                    *("-notifier.url=http://127.0.0.1:1", "-evaluationInterval=2s", "-loggerLevel=ERROR"),
                    f"-httpListenAddr=127.0.0.1:{alert_port}",
                    f"-external.label=gpuwatch_runbook_base={RUNBOOK_BASE}",  # the operator's (docs/alerting.md)
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        rendered: set[tuple[str, str]] = set()
        firing: list[dict[str, Any]] = []

        def all_rendered() -> bool:
            alerts = _get(f"{alert_url}/api/v1/alerts")["data"]["alerts"] or []  # null before the first
            firing[:] = [a for a in alerts if a["state"] == "firing"]
            rendered.clear()
            rendered.update((a["name"], a["annotations"].get("summary", "")) for a in firing)
            return rendered >= expected

        try:
            _poll("vmalert firing the annotation tests' alerts", all_rendered, time.monotonic() + 60)
        except AssertionError:
            raise AssertionError(f"missing: {sorted(expected - rendered)}\nrendered: {sorted(rendered)}") from None
        assert len(expected) >= 10
        # runbook_url from the external label, as on Prometheus; the description ends with the runbook's first step
        steps = {name: first_step(section) for name, section in runbook_sections().items()}
        for alert in firing:
            annotations = alert["annotations"]
            assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{alert['name'].lower()}", alert
            assert annotations["description"].endswith(f" What to do: {steps[alert['name']]}"), alert
    finally:
        for proc in reversed(procs):
            _stop(proc)
