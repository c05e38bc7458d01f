"""The fleet path beyond one Prometheus, end to end with real processes on loopback (issue 18):

    gpuwatch simulate-fleet -> two vmagent shards (-promscrape.cluster.membersCount=2) -> remote_write
    -> victoria-metrics (single node) -> vmalert with the shipped recording and alert rules (only `for:` and range
    windows scaled down, as tests/test_alerts_e2e.py does) -> Alertmanager (the shipped routes and inhibitions)
    -> a webhook receiver run here;

and beside it, on the same fleet, Prometheus in agent mode -> remote_write -> a Prometheus remote-write receiver
that evaluates the same rules.

The first six nodes carry test_alerts_e2e's faults and must raise exactly its alerts, with its inhibitions; two more
carry the dashboard test's faults so that every dashboard query (tests/dashboard_queries.py) has data to return from
VictoriaMetrics' query API; the rest are healthy. Last, each store goes down in turn for OUTAGE_S seconds (the issue's
"5 minutes", shortened here; benchmarks/vm_scale.py --outage 300 runs the full one for either path): vmagent buffers on
disk, the Prometheus agent keeps its WAL, each replays when its store is back, no sample is lost (counted against
the scrapes), and the alerts resume. The processes themselves are tests/vmstack.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboard_queries import ALLOWED_EMPTY, queries, substitute
from promrules import PROM_DIR, first_step, runbook_sections
from test_alerts_e2e import (
    EXPECTED,
    INHIBITED,
    SLOW_GPU,
    SUMMARIES,
    _get,
    _poll,
    assert_summaries,
)
from vmstack import (
    AGENT_SCRAPES,
    ALERT_NODES,
    ALERTMANAGER,
    GPUS,
    NODES,
    SHARDS,
    VM_DEPLOY,
    Outage,
    Stack,
    _metric,
    _scrapes,
    edge_allowance,
    run_stack,
    shipped_args,
    take_down,
)

VM_TOOLS = ("victoria-metrics", "vmagent", "vmalert")
_missing = [t for t in (*VM_TOOLS, "prometheus") if shutil.which(t) is None] + (
    [] if ALERTMANAGER else ["alertmanager"]
)
if _missing and os.environ.get("CI"):
    raise RuntimeError(f"{_missing} missing: scripts/test.sh installs victoria-metrics, prometheus, alertmanager")
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"{_missing} missing: run scripts/test.sh (Debian victoria-metrics, prometheus, ...)"
)

HEALTHY = {"node-000", "node-005", "node-009", "node-010", "node-011"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from run_stack(tmp_path_factory.mktemp("vm-e2e"))


@pytest.fixture(scope="module")
def vm_outage(stack: Stack) -> Outage:
    return take_down(stack, "victoria-metrics")


@pytest.fixture(scope="module")
def receiver_outage(stack: Stack) -> Outage:
    return take_down(stack, "prometheus-receiver")


def test_shipped_vmagent_job_is_the_prometheus_job() -> None:
    """deploy/victoriametrics/vmagent.yml scrapes as deploy/prometheus/prometheus.yml does: the rules and dashboards
    need the same job name and `node` label. vmagent accepts it (-dryRun), and the flags files name what they must."""
    vm_job = yaml.safe_load((VM_DEPLOY / "vmagent.yml").read_text())["scrape_configs"][0]
    prom_job = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())["scrape_configs"][0]
    for sd in prom_job["file_sd_configs"]:
        sd.pop("refresh_interval")  # vmagent: -promscrape.fileSDCheckInterval
    assert vm_job == prom_job
    checked = subprocess.run(
        ["vmagent", "-dryRun", f"-promscrape.config={VM_DEPLOY / 'vmagent.yml'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"-promscrape.cluster.membersCount={SHARDS}" in shipped_args("vmagent.env")
    rules = [a.split("=", 1)[1] for a in shipped_args("vmalert.env") if a.startswith("-rule=")]
    assert [Path(r).name for r in rules] == ["gpuwatch-rules.yml", "gpuwatch-alerts.yml"]


def test_shipped_units_verify() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze missing")
    for unit in ("vmagent@.service", "vmalert.service"):
        done = subprocess.run([analyze, "verify", str(VM_DEPLOY / unit)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and not done.stderr.strip(), (unit, done.stderr)


def _on_alert_nodes(alerts: set[tuple[str, str, str, str]]) -> set[tuple[str, str, str, str]]:
    return {a for a in alerts if int(a[1].removeprefix("node-")) < ALERT_NODES}


def test_shards_split_the_targets(stack: Stack) -> None:
    """Each vmagent scrapes its own share of the fleet, together all of it, none twice."""
    shares = []
    for url in stack.vmagents:
        targets = _get(f"{url}/api/v1/targets")["data"]["activeTargets"]
        shares.append({t["labels"]["node"] for t in targets})
    assert all(shares), shares
    assert not shares[0] & shares[1]
    assert shares[0] | shares[1] == {f"node-{i:03d}" for i in range(NODES)}
    assert len(stack.query(f"count by (node) (gpuwatch_gpu_info) == {GPUS}")) == NODES  # each GPU once, not twice


def test_same_alerts_as_prometheus_delivered(stack: Stack) -> None:
    """test_alerts_e2e's faults raise test_alerts_e2e's alerts, at the same receivers."""
    delivered = stack.hook.alerts()
    assert {a[:3] for a in _on_alert_nodes(delivered)} == EXPECTED | {SLOW_GPU}
    severity = {"GpuOverheating": "critical", "GpuPowerBrakeSlowdown": "critical", "GpuLost": "critical"}
    severity |= {"GpuCountBelowExpected": "critical", "GpuUnderperforming": "warning"}
    severity |= {"GpuMemoryTemperatureHigh": "warning"}
    for name, _node, _gpu, receiver in _on_alert_nodes(delivered):
        assert receiver == f"gpuwatch-{severity[name]}", (name, receiver)


def test_same_inhibitions(stack: Stack) -> None:
    assert stack.vmalert_firing_at_start >= INHIBITED
    assert not INHIBITED & {a[:3] for a in stack.hook.alerts()}


def test_healthy_nodes_raise_nothing(stack: Stack) -> None:
    assert not {a for a in stack.vmalert_firing_at_start if a[1] in HEALTHY}
    assert not {a for a in stack.hook.alerts() if a[1] in HEALTHY}


def test_descriptions_rendered_by_vmalert(stack: Stack) -> None:
    """vmalert renders the shipped annotations (humanize, humanizePercentage, the `query` template function)."""
    steps = {name: first_step(section) for name, section in runbook_sections().items()}
    seen = set()
    for notification in stack.hook.received:
        for alert in notification["alerts"]:
            annotations, name = alert["annotations"], alert["labels"]["alertname"]
            seen.add(name)
            # no gpuwatch_runbook_base label (vmalert.env leaves it commented): the alert's own agent's /runbooks
            assert annotations["runbook_url"] == f"http://{alert['labels']['instance']}/runbooks#{name.lower()}"
            assert annotations["description"].endswith(f" What to do: {steps[name]}"), annotations["description"]
            assert "{{" not in annotations["description"] and "<no value>" not in annotations["description"]
            if name == "GpuCountBelowExpected":  # the `query` function: "fewer than the 8 it is expected to have"
                assert f"fewer than the {GPUS} it is" in " ".join(annotations["description"].split())
    assert "GpuCountBelowExpected" in seen
    # The summaries read as on Prometheus: vmalert 1.79 renders the same `query`, `first`, `label` and printf.
    assert assert_summaries(stack.hook.received, GPUS) == set(SUMMARIES)


def test_recording_rules_written_back(stack: Stack) -> None:
    """vmalert's recording rules land in the store (the alert rules read the thresholds from there)."""
    assert stack.query("gpuwatch:threshold:xid_window_seconds")
    # Written at each evaluation, flushed each second (-remoteWrite.flushInterval), queryable after the store's
    # -search.latencyOffset: on a loaded machine that can take a few seconds more.
    try:
        _poll(
            "GpuLost in the store's ALERTS",
            lambda: bool(stack.query('ALERTS{alertname="GpuLost", alertstate="firing"}')),
            time.monotonic() + 30,
        )
    except AssertionError as e:
        raise AssertionError(f"{e}; vmalert fires {sorted(stack.vmalert_firing())}") from None


def _keys(table: Iterable[tuple[str, str, str]]) -> set[str]:
    return {" / ".join(key) for key in table}


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    """Every query but those test_dashboards_prometheus.py allows to be empty. The workloads group is evaluated once
    a minute and chains its rules three deep (gpuwatch:gpu_workload:share, then gpuwatch:gpu_workload:
    tensor_active_ratio, then gpuwatch:workload_tensor_active_ratio:mean): vmalert reads each rule's input back from
    the store, so each level answers one evaluation later than on Prometheus, which sees the group's earlier results
    at once. With a first evaluation that comes before the first scrapes land, that is up to four minutes."""
    skip = _keys(ALLOWED_EMPTY)
    pending = {q.key: substitute(q.expr) for q in queries() if q.key not in skip}
    deadline = time.monotonic() + 270
    while pending and time.monotonic() < deadline:
        for key, expr in list(pending.items()):
            if stack.query(expr):
                del pending[key]
        if pending:
            time.sleep(2)
    assert not pending, "queries without data from VictoriaMetrics:\n" + "\n".join(
        f"{k}: {e}" for k, e in pending.items()
    )


def _gpu_lost_fires(receiver: str) -> bool:
    """The Prometheus receiver's own rules fire GpuLost on node-003 (test_alerts_e2e's lost GPU)."""
    alerts = _get(f"{receiver}/api/v1/alerts")["data"]["alerts"]
    return any(
        a["state"] == "firing" and a["labels"]["alertname"] == "GpuLost" and a["labels"].get("node") == "node-003"
        for a in alerts
    )


def test_prometheus_agent_mode_to_a_receiver(stack: Stack) -> None:
    """Prometheus --enable-feature=agent (the shipped agent-remote-write.yml) -> remote_write -> a Prometheus
    remote-write receiver: every node's series arrive, and the receiver's rules fire GpuLost on node-003."""
    recv = stack.prom_receiver + "/api/v1"
    deadline = time.monotonic() + 60

    def series_arrived() -> bool:
        reply = _get(f"{recv}/query?" + urllib.parse.urlencode({"query": 'count by (node) (up{job="gpuwatch"})'}))
        return len(reply["data"]["result"]) == NODES

    _poll("every node's series at the remote-write receiver", series_arrived, deadline)

    _poll("GpuLost on node-003 from the receiver's rules", lambda: _gpu_lost_fires(stack.prom_receiver), deadline)
    site = _get(f"{recv}/query?" + urllib.parse.urlencode({"query": 'up{node="node-000"}'}))["data"]["result"]
    assert site[0]["metric"]["site"] == "dc1"  # the agent's external label travels with every series


def _assert_every_scrape_stored(
    store: str, stored: Callable[[], float], scraped: float, allowance: int, deadline: float
) -> None:
    """`stored()` (the store's count of `up` samples over the window) reaches the scrapes counted, less the
    allowance, by the deadline (samples still on their way arrive meanwhile), and holds no more than the scrapes
    counted plus the allowance: not a sample lost, none twice."""
    counts: dict[str, float] = {}

    def all_stored() -> bool:
        counts["stored"] = stored()
        return counts["stored"] >= scraped - allowance

    try:
        _poll(f"every scrape counted in {store}", all_stored, deadline)
    except AssertionError as e:
        raise AssertionError(f"{e}: {counts.get('stored')} stored, {scraped} scraped ± {allowance}") from None
    assert counts["stored"] <= scraped + allowance, (counts, scraped, allowance)


def test_store_down_buffers_replay_and_alerts_resume(stack: Stack, vm_outage: Outage) -> None:
    """victoria-metrics stopped for OUTAGE_S s while the fleet runs: the vmagent shards buffer on disk and replay
    after it restarts. Not a sample lost: the store holds one `up` sample for every scrape the shards counted
    (vm_promscrape_scrapes_total) over the whole time, outage included; each node's `up` covers the outage; vmagent
    dropped nothing. Then vmalert evaluates without errors and fires what it fired before."""
    outage = vm_outage
    before, down_at, up_at = outage.before, outage.down_at, outage.up_at
    deadline = time.monotonic() + 90  # replay, then each alert's `for:` again
    assert outage.held > 0, "vmagent buffered nothing while the store was down"

    def replayed() -> bool:
        backlog = sum(_metric(url, "vmagent_remotewrite_pending_data_bytes") for url in stack.vmagents)
        return backlog == 0 and len(stack.query('count_over_time(up{job="gpuwatch"}[5s])', at=up_at - 2)) == NODES

    _poll("the shards' buffers replayed into the store", replayed, deadline)
    end = time.time()
    scraped = _scrapes(stack) - outage.scrapes_before
    allowance = edge_allowance(outage.read_seconds, time.time() - end)
    # The newest samples reach the store after their flush (1 s) and -search.latencyOffset (1 s), or later on a
    # loaded machine: wait until the window holds every scrape counted, then see that it holds no more.
    window = f'sum(count_over_time(up{{job="gpuwatch"}}[{end - before:.3f}s]))'
    _assert_every_scrape_stored(
        "the store", lambda: float(stack.query(window, at=end)[0]["value"][1]), scraped, allowance, deadline
    )
    assert sum(_metric(url, "vmagent_remotewrite_packets_dropped_total") for url in stack.vmagents) == 0
    during = stack.query(f'count_over_time(up{{job="gpuwatch"}}[{up_at - down_at:.3f}s])', at=up_at)
    assert len(during) == NODES
    assert all(float(r["value"][1]) >= 0.8 * (up_at - down_at) for r in during), during  # 1 s scrapes

    state: dict[str, Any] = {}

    def alerts_resume() -> bool:
        groups = _get(f"{stack.vmalert}/api/v1/rules")["data"]["groups"]
        state["errors"] = {r["name"]: r["lastError"] for g in groups for r in g["rules"] if r.get("lastError")}
        state["missing"] = (EXPECTED | {SLOW_GPU}) - stack.vmalert_firing()
        return not state["errors"] and not state["missing"]

    try:
        _poll("vmalert evaluating without errors and firing again", alerts_resume, deadline)
    except AssertionError as e:
        raise AssertionError(f"{e}: {state}") from None
    # vmalert's own ALERTS series reach the store after its remote write and -search.latencyOffset: later than its API
    # says an alert fires, on a loaded machine by seconds.
    _poll(
        "GpuLost's ALERTS series in the store",
        lambda: bool(stack.query('ALERTS{alertname="GpuLost", alertstate="firing"}', at=time.time() - 1)),
        time.monotonic() + 30,
    )


def test_receiver_down_agent_wal_replays_and_alerts_resume(stack: Stack, receiver_outage: Outage) -> None:
    """The Prometheus receiver stopped for OUTAGE_S s: the agent-mode Prometheus keeps scraping into
    its WAL, retries, and resends from the WAL once the receiver is back (the shipped agent-remote-write.yml, its
    queue_config as shipped but for a 1 s batch deadline). Not a sample lost: each node has an `up` sample for every
    second of the outage, and the receiver holds one `up` sample for every scrape the agent counted over the whole
    time; the agent failed and dropped none. Then the receiver's rules fire GpuLost on node-003 again."""
    recv = stack.prom_receiver
    outage = receiver_outage
    assert outage.held > 0, "the agent never retried: the receiver was not down, or nothing was sent"
    deadline = time.monotonic() + 90  # replay, then each alert's `for:` again

    def caught_up() -> bool:  # the agent sends in order: the newest sample sent is the newest it read
        sent = _metric(stack.prom_agent, "prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
        newest = _metric(stack.prom_agent, "prometheus_remote_storage_highest_timestamp_in_seconds")
        return sent >= newest - 1 and sent > outage.up_at

    _poll("the agent's WAL resent to the receiver", caught_up, deadline)
    end = time.time()
    scrapes = _metric(stack.prom_agent, AGENT_SCRAPES) - outage.scrapes_before
    allowance = edge_allowance(outage.read_seconds, time.time() - end)

    def receiver_query(expr: str, at: float) -> list[Any]:
        params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        result: list[Any] = _get(f"{recv}/api/v1/query?{params}")["data"]["result"]
        return result

    window = outage.up_at - outage.down_at  # PromQL ranges take whole units: milliseconds
    during = receiver_query(f'count_over_time(up{{job="gpuwatch"}}[{window * 1000:.0f}ms])', outage.up_at)
    assert len(during) == NODES
    assert all(float(r["value"][1]) >= window - 2 for r in during), (window, during)  # 1 s scrapes, ± the edges
    # The agent's remote-write shards send on their own: the newest samples may still be on their way.
    whole = f'sum(count_over_time(up{{job="gpuwatch"}}[{(end - outage.before) * 1000:.0f}ms]))'
    _assert_every_scrape_stored(
        "the receiver", lambda: float(receiver_query(whole, end)[0]["value"][1]), scrapes, allowance, deadline
    )
    for counter in ("samples_failed_total", "samples_dropped_total"):
        assert _metric(stack.prom_agent, f"prometheus_remote_storage_{counter}") == 0, counter

    _poll("GpuLost on node-003 from the restarted receiver's rules", lambda: _gpu_lost_fires(recv), deadline)
