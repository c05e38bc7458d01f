"""The fleet path beyond one Prometheus, end to end with real processes on loopback (issue 18):

    gpuwatch simulate-fleet -> two vmagent shards (-promscrape.cluster.membersCount=2) -> remote_write
    -> victoria-metrics (single node) -> vmalert with the shipped recording and alert rules (only `for:` and range
    windows scaled down, as tests/test_alerts_e2e.py does) -> Alertmanager (the shipped routes and inhibitions)
    -> a webhook receiver run here;

and beside it, on the same fleet, Prometheus in agent mode -> remote_write -> a Prometheus remote-write receiver
that evaluates the same rules.

The first six nodes carry test_alerts_e2e's faults and must raise exactly its alerts, with its inhibitions; two more
carry the dashboard test's faults so that every dashboard query (tests/dashboard_queries.py) has data to return from
VictoriaMetrics' query API; the rest are healthy. Last, the store goes down for OUTAGE_S seconds (the issue's "5
minutes", shortened here; benchmarks/vm_scale.py --outage 300 runs the full one): vmagent buffers on disk and
replays, no sample is lost, and the alerts resume.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import free_port, free_port_range
from dashboard_queries import queries, substitute
from promrules import PROM_DIR, ROOT
from test_alerts_e2e import (
    EXPECTED,
    FAULTS,
    INHIBITED,
    SCALE,
    SLOW_GPU,
    SUMMARIES,
    Webhook,
    _get,
    _poll,
    _serve_webhook,
    _stop,
    assert_summaries,
    scale_durations,
)

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
VM_TOOLS = ("victoria-metrics", "vmagent", "vmalert")
_missing = [t for t in (*VM_TOOLS, "prometheus") if shutil.which(t) is None] + (
    [] if ALERTMANAGER else ["alertmanager"]
)
if _missing and os.environ.get("CI"):
    raise RuntimeError(f"{_missing} missing: scripts/test.sh installs victoria-metrics, prometheus, alertmanager")
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"{_missing} missing: run scripts/test.sh (Debian victoria-metrics, prometheus, ...)"
)

GPUS = 8  # the dashboard test's mixed node needs GPUs 2, 5 and 6
ALERT_NODES = 6  # nodes 0-5: test_alerts_e2e's fleet and faults, unchanged
DASHBOARD_FAULTS = ["6=mixed", "7/3=xid"]  # tests/test_dashboards_prometheus.py's faults, moved to nodes 6 and 7
NODES = 12  # 8-11 healthy
HEALTHY = {"node-000", "node-005", "node-008", "node-009", "node-010", "node-011"}
SHARDS = 2  # deploy/victoriametrics/vmagent.env's -promscrape.cluster.membersCount
VM_DEPLOY = ROOT / "deploy" / "victoriametrics"
DEADLINE_S = 150.0
OUTAGE_S = 30  # the store down this long while the fleet runs


def _vm_scrape_config(targets: Path) -> dict[str, Any]:
    """The shipped vmagent.yml, scraping every second the targets simulate-fleet writes."""
    config: dict[str, Any] = yaml.safe_load((VM_DEPLOY / "vmagent.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    job = config["scrape_configs"][0]
    job["scrape_interval"], job["scrape_timeout"] = "1s", "1s"
    job["file_sd_configs"] = [{"files": [str(targets)]}]  # vmagent: -promscrape.fileSDCheckInterval
    return config


def shipped_args(env_file: str, **overrides: str | list[str]) -> list[str]:
    """The flags of a shipped deploy/victoriametrics/*.env (ARGS="..."), each flag named in overrides (dots as
    underscores) replaced by the value(s) given there, or added."""
    text = (VM_DEPLOY / env_file).read_text().replace("\\\n", "")
    [assignment] = shlex.split(text, comments=True)
    args = shlex.split(assignment.removeprefix("ARGS="))
    wanted = {name.replace("_", "."): [v] if isinstance(v, str) else v for name, v in overrides.items()}
    out: list[str] = []
    for arg in args:
        name = arg.lstrip("-").split("=", 1)[0]
        if name not in wanted:
            out.append(arg)
        elif not any(a.startswith(f"-{name}=") for a in out):
            out += [f"-{name}={v}" for v in wanted[name]]
    return out + [
        f"-{name}={v}" for name, values in wanted.items() if f"-{name}=" not in arg_names(out) for v in values
    ]


def arg_names(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] + "=" for a in args}


@dataclass
class Stack:
    tmp: Path
    hook: Webhook
    vm: str
    vmalert: str
    vmagents: list[str]
    prom_receiver: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Any] = field(default_factory=dict)
    vm_port: int = 0
    vmalert_firing_at_start: set[tuple[str, str, str]] = field(default_factory=set)

    def start(self, name: str, cmd: list[str]) -> None:
        if name not in self.logs:
            self.logs[name] = (self.tmp / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=self.logs[name], stderr=subprocess.STDOUT, cwd=ROOT)

    def vm_cmd(self) -> list[str]:
        return [
            "victoria-metrics",
            *shipped_args(
                "victoria-metrics.env",
                storageDataPath=str(self.tmp / "vmdata"),
                httpListenAddr=f"127.0.0.1:{self.vm_port}",
                search_latencyOffset="1s",  # shipped 30 s: the newest samples hidden that long
                search_disableCache="true",
                loggerLevel="WARN",
            ),
        ]

    def query(self, expr: str, at: float | None = None) -> list[Any]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        reply = _get(f"{self.vm}/api/v1/query?" + urllib.parse.urlencode(params))
        assert reply["status"] == "success", (expr, reply)
        result: list[Any] = reply["data"]["result"]
        return result

    def vmalert_firing(self) -> set[tuple[str, str, str]]:
        alerts = _get(f"{self.vmalert}/api/v1/alerts")["data"]["alerts"]
        return {
            (a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("gpu", ""))
            for a in alerts
            if a["state"] == "firing"
        }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("vm-e2e")
    vm_port, am_port, hook_port, vmalert_port, recv_port, agent_port = (free_port() for _ in range(6))
    vmagent_ports = [free_port() for _ in range(SHARDS)]
    base = free_port_range(NODES)
    hook = Webhook()
    server = _serve_webhook(hook, hook_port)
    s = Stack(
        tmp,
        hook,
        vm=f"http://127.0.0.1:{vm_port}",
        vmalert=f"http://127.0.0.1:{vmalert_port}",
        vmagents=[f"http://127.0.0.1:{p}" for p in vmagent_ports],
        prom_receiver=f"http://127.0.0.1:{recv_port}",
        vm_port=vm_port,
    )

    for name in ("gpuwatch-rules.yml", "gpuwatch-alerts.yml"):
        (tmp / name).write_text(scale_durations((PROM_DIR / name).read_text(), SCALE))
    targets = tmp / "targets.json"
    (tmp / "vmagent.yml").write_text(yaml.safe_dump(_vm_scrape_config(targets), sort_keys=False))

    am = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    am["route"].update(group_wait="1s", group_interval="2s", repeat_interval="1h")
    for receiver in am["receivers"]:
        receiver["webhook_configs"] = [{"url": f"http://127.0.0.1:{hook_port}/", "send_resolved": False}]
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(am, sort_keys=False))

    # Prometheus in agent mode: the shipped remote-write config, pointed at the receiver here.
    agent = yaml.safe_load((PROM_DIR / "remote-write" / "agent-remote-write.yml").read_text())
    agent["global"]["scrape_interval"] = "1s"
    job = agent["scrape_configs"][0]
    job["scrape_timeout"] = "1s"
    job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
    shipped_job = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())["scrape_configs"][0]
    job["relabel_configs"] = shipped_job["relabel_configs"]  # the node label, as the rules and dashboards want it
    rw = agent["remote_write"][0]
    for key in ("headers", "basic_auth"):
        rw.pop(key, None)
    rw["url"] = f"http://127.0.0.1:{recv_port}/api/v1/write"
    rw["queue_config"] |= {"batch_send_deadline": "1s"}
    (tmp / "agent.yml").write_text(yaml.safe_dump(agent, sort_keys=False))
    receiver = {
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(tmp / "gpuwatch-rules.yml"), str(tmp / "gpuwatch-alerts.yml")],
    }
    (tmp / "receiver.yml").write_text(yaml.safe_dump(receiver, sort_keys=False))

    (tmp / "fleet.toml").write_text("[probe]\ninterval_seconds = 3.0\n[gpus]\npower_limit_watts = 700\n")
    fleet_cmd = [sys.executable, "-m", "gpuwatch", "simulate-fleet", "--nodes", str(NODES), "--gpus", str(GPUS)]
    fleet_cmd += ["--port-base", str(base), "--targets", str(targets), "--poll-interval", "1"]
    fleet_cmd += ["--state-dir", str(tmp / "state"), "--config", str(tmp / "fleet.toml")]
    fleet_cmd += [arg for fault in FAULTS + DASHBOARD_FAULTS for arg in ("--fault", fault)]
    try:
        s.start("fleet", fleet_cmd)
        s.start("victoria-metrics", s.vm_cmd())
        for shard, port in enumerate(vmagent_ports):
            s.start(
                f"vmagent-{shard}",
                [
                    "vmagent",
                    *shipped_args(
                        "vmagent.env",
                        promscrape_config=str(tmp / "vmagent.yml"),
                        promscrape_fileSDCheckInterval="1s",
                        promscrape_cluster_memberNum=str(shard),  # vmagent@.service's instance
                        remoteWrite_url=f"{s.vm}/api/v1/write",
                        remoteWrite_tmpDataPath=str(tmp / f"vmagent-{shard}-buffer"),
                        httpListenAddr=f"127.0.0.1:{port}",
                        loggerLevel="WARN",
                    ),
                ],
            )
        s.start(
            "alertmanager",
            [
                ALERTMANAGER or "alertmanager",
                f"--config.file={tmp / 'alertmanager.yml'}",
                f"--storage.path={tmp / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
        )
        s.start(
            "vmalert",
            [
                "vmalert",
                *shipped_args(
                    "vmalert.env",
                    rule=[str(tmp / "gpuwatch-rules.yml"), str(tmp / "gpuwatch-alerts.yml")],  # durations scaled
                    datasource_url=s.vm,
                    remoteWrite_url=s.vm,
                    remoteRead_url=s.vm,
                    notifier_url=f"http://127.0.0.1:{am_port}",
                    evaluationInterval="1s",
                    remoteWrite_flushInterval="1s",
                    httpListenAddr=f"127.0.0.1:{vmalert_port}",
                    external_url=f"http://127.0.0.1:{vmalert_port}",
                    loggerLevel="WARN",
                ),
            ],
        )
        s.start(
            "prometheus-receiver",
            [
                "prometheus",
                f"--config.file={tmp / 'receiver.yml'}",
                f"--storage.tsdb.path={tmp / 'receiver-tsdb'}",
                f"--web.listen-address=127.0.0.1:{recv_port}",
                "--web.enable-remote-write-receiver",
                "--log.level=warn",
            ],
        )
        s.start(
            "prometheus-agent",
            [
                "prometheus",
                "--enable-feature=agent",
                f"--config.file={tmp / 'agent.yml'}",
                f"--storage.agent.path={tmp / 'agent-wal'}",
                f"--web.listen-address=127.0.0.1:{agent_port}",
                "--log.level=warn",
            ],
        )
        deadline = time.monotonic() + DEADLINE_S

        def every_node_up_once() -> bool:
            result = s.query('up{job="gpuwatch"}')
            return len(result) == NODES and all(r["value"][1] == "1" for r in result)

        _poll("every simulated node in VictoriaMetrics, scraped by the two shards", every_node_up_once, deadline)
        _poll(
            "the expected alerts delivered and the inhibited ones firing in vmalert",
            lambda: {a[:3] for a in hook.alerts()} >= EXPECTED and s.vmalert_firing() >= INHIBITED,
            deadline,
        )
        _poll("the slow GPU's GpuUnderperforming", lambda: SLOW_GPU in {a[:3] for a in hook.alerts()}, deadline)
        time.sleep(5)  # Alertmanager sends a group again after group_interval: the inhibited ones' chance to leak
        s.vmalert_firing_at_start = s.vmalert_firing()
        yield s
    finally:
        for proc in reversed(list(s.procs.values())):
            _stop(proc)
        server.shutdown()
        for f in s.logs.values():
            f.close()


def test_vmalert_accepts_the_shipped_rules_unchanged() -> None:
    """The shipped files as they are (durations unscaled): vmalert parses every expression as MetricsQL and every
    annotation template, and deploy/victoriametrics/vmalert.flags' -rule paths are those files."""
    rules = [f"-rule={PROM_DIR / name}" for name in ("gpuwatch-rules.yml", "gpuwatch-alerts.yml")]
    done = subprocess.run(["vmalert", "-dryRun", *rules], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


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


# (metric, labels) of the counters the increase()-based alerts read; `and rate(...) > 0` guards each of them.
COUNTER_ALERTS = {
    "GpuPowerBrakeSlowdown": ("gpuwatch_gpu_throttle_seconds_total", 'reason="hw_power_brake"'),
    "GpuPcieFatalErrors": ("gpuwatch_gpu_pcie_errors_total", 'type="fatal"'),
    "GpuPcieNonFatalErrors": ("gpuwatch_gpu_pcie_errors_total", 'type="non_fatal"'),
    "GpuEccUncorrectable": ("gpuwatch_gpu_ecc_errors_total", 'type="uncorrected"'),
    "GpuReset": ("gpuwatch_gpu_reset_events_total", ""),
}
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
    assert with_increase - INCREASE_UNGUARDED == set(COUNTER_ALERTS)
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
    seen = set()
    for notification in stack.hook.received:
        for alert in notification["alerts"]:
            annotations, name = alert["annotations"], alert["labels"]["alertname"]
            seen.add(name)
            assert annotations["runbook_url"].endswith("#" + name.lower())
            assert "{{" not in annotations["description"] and "<no value>" not in annotations["description"]
            if name == "GpuCountBelowExpected":  # the `query` function: "fewer than the 8 it is expected to have"
                assert f"fewer than the {GPUS} it is" in " ".join(annotations["description"].split())
    assert "GpuCountBelowExpected" in seen
    # The summaries read as on Prometheus: vmalert 1.79 renders the same `query`, `first`, `label` and printf.
    assert assert_summaries(stack.hook.received, GPUS) == set(SUMMARIES)


def test_recording_rules_written_back(stack: Stack) -> None:
    """vmalert's recording rules land in the store (the alert rules read the thresholds from there)."""
    assert stack.query("gpuwatch:threshold:xid_window_seconds")
    assert stack.query('ALERTS{alertname="GpuLost", alertstate="firing"}')


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    pending = {q.key: substitute(q.expr) for q in queries()}
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        for key, expr in list(pending.items()):
            if stack.query(expr):
                del pending[key]
        if pending:
            time.sleep(2)
    assert not pending, "queries without data from VictoriaMetrics:\n" + "\n".join(
        f"{k}: {e}" for k, e in pending.items()
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

    def gpu_lost_fires() -> bool:
        alerts = _get(f"{recv}/alerts")["data"]["alerts"]
        return any(
            a["state"] == "firing" and a["labels"]["alertname"] == "GpuLost" and a["labels"].get("node") == "node-003"
            for a in alerts
        )

    _poll("GpuLost on node-003 from the receiver's rules", gpu_lost_fires, deadline)
    site = _get(f"{recv}/query?" + urllib.parse.urlencode({"query": 'up{node="node-000"}'}))["data"]["result"]
    assert site[0]["metric"]["site"] == "dc1"  # the agent's external label travels with every series


def _vmagent_metric(url: str, name: str) -> float:
    """The sum of a vmagent's own metric over its label sets, from its /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.split("{")[0].split(" ")[0] == name)


def _scrapes(stack: Stack) -> float:
    return sum(_vmagent_metric(url, "vm_promscrape_scrapes_total") for url in stack.vmagents)


def test_store_down_buffers_replay_and_alerts_resume(stack: Stack) -> None:
    """victoria-metrics stopped for OUTAGE_S s while the fleet runs: the vmagent shards buffer on disk and replay
    after it restarts. Not a sample lost: the store holds one `up` sample for every scrape the shards counted
    (vm_promscrape_scrapes_total) over the whole time, outage included; each node's `up` covers the outage; vmagent
    dropped nothing. Then vmalert evaluates without errors and fires what it fired before."""
    scrapes_before, before = _scrapes(stack), time.time()
    time.sleep(2)
    _stop(stack.procs["victoria-metrics"])
    down_at = time.time()
    time.sleep(OUTAGE_S)
    pending = sum(_vmagent_metric(url, "vmagent_remotewrite_pending_data_bytes") for url in stack.vmagents)
    stack.start("victoria-metrics", stack.vm_cmd())
    up_at = time.time()
    deadline = time.monotonic() + 60
    assert pending > 0, "vmagent buffered nothing while the store was down"

    def replayed() -> bool:
        backlog = sum(_vmagent_metric(url, "vmagent_remotewrite_pending_data_bytes") for url in stack.vmagents)
        return backlog == 0 and len(stack.query('count_over_time(up{job="gpuwatch"}[5s])', at=up_at - 2)) == NODES

    _poll("the shards' buffers replayed into the store", replayed, deadline)
    time.sleep(3)  # the newest samples: flushed (1 s) and visible (-search.latencyOffset=1s)
    scrapes_after, end = _scrapes(stack), time.time()
    stored = stack.query(f'sum(count_over_time(up{{job="gpuwatch"}}[{end - before:.3f}s]))', at=end)
    # Scrapes in flight at either end of the window may fall on either side: at most one per node at each end.
    assert abs(float(stored[0]["value"][1]) - (scrapes_after - scrapes_before)) <= 2 * NODES, (
        stored,
        scrapes_after - scrapes_before,
    )
    assert sum(_vmagent_metric(url, "vmagent_remotewrite_packets_dropped_total") for url in stack.vmagents) == 0
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
    assert stack.query('ALERTS{alertname="GpuLost", alertstate="firing"}', at=time.time() - 1)
