"""The stack of tests/test_victoriametrics_e2e.py (see its docstring), as real processes on loopback: simulate-fleet,
two vmagent shards, victoria-metrics, vmalert, Alertmanager and a webhook; Prometheus in agent mode and a Prometheus
remote-write receiver beside them; and the store outage its last tests read."""

from __future__ import annotations

import math
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

import yaml
from ports import free_port, free_port_range
from promrules import PROM_DIR, ROOT
from test_alerts_e2e import (
    EXPECTED,
    FAULTS,
    INHIBITED,
    SCALE,
    SLOW_GPU,
    Webhook,
    _get,
    _poll,
    _serve_webhook,
    _stop,
    scale_durations,
)

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
GPUS = 8  # the dashboard test's mixed node needs GPUs 2, 5 and 6
ALERT_NODES = 6  # nodes 0-5: test_alerts_e2e's fleet and faults, unchanged
# tests/test_dashboards_prometheus.py's faults, moved to nodes 6, 7 and 8 (8 busy: its GPUs hold workloads; its GPU 4
# starved of input: the real-utilization panels)
DASHBOARD_FAULTS = [
    "6=mixed",
    "7=mig",  # its GPU 2 split into MIG instances, a job in one: the MIG panels (as the dashboard test's node-001)
    "7/3=xid",
    "7/5=ib_flapping",  # node 7 an HGX node: the network and fabric panels (as the dashboard test's node-001)
    "7/6=fabric_degraded",
    "8=busy",
    "8/4=dataloader_starved",
]
NODES = 12  # 9-11 healthy
SHARDS = 2  # deploy/victoriametrics/vmagent.env's -promscrape.cluster.membersCount
VM_DEPLOY = ROOT / "deploy" / "victoriametrics"
DEADLINE_S = 150.0
OUTAGE_S = 30  # the stores down this long while the fleet runs (benchmarks/vm_scale.py --outage 300: 5 minutes)
RARE_PROBE_S = 60.0  # the probe interval of every node but the slow GPU's (3 s)
SCRAPE_INTERVAL_S = 1.0


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
    prom_agent: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Any] = field(default_factory=dict)
    vm_port: int = 0
    receiver_cmd: list[str] = field(default_factory=list)
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
        alerts = _get(f"{self.vmalert}/api/v1/alerts")["data"]["alerts"] or []
        return {
            (a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("gpu", ""))
            for a in alerts
            if a["state"] == "firing"
        }


def run_stack(tmp: Path) -> Iterator[Stack]:
    """The whole stack of the module docstring, up with its alerts delivered; stopped when the generator closes."""
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
        prom_agent=f"http://127.0.0.1:{agent_port}",
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

    # Each probe is a real child process (~0.1 s of CPU): 96 GPUs probing every 3 s would want more than the two
    # cores CI has, and a starved fleet serves stale polls that flap the alerts. Only the slow GPU's node probes
    # often enough for its baseline and slowdown to show within the test; the rest probe now and then, enough for
    # the dashboards' probe panels.
    pipes = "[nvml]\ngpm_per_pipe = true\n"  # opt-in detail the node board's pipes panel reads
    (tmp / "fleet.toml").write_text(
        f"[probe]\ninterval_seconds = {RARE_PROBE_S}\n[gpus]\npower_limit_watts = 700\n{pipes}"
    )
    (tmp / "slow-gpu-node.toml").write_text(
        f"[probe]\ninterval_seconds = 3.0\n[gpus]\npower_limit_watts = 700\n{pipes}"
    )
    fleet_cmd = [sys.executable, "-m", "gpuwatch", "simulate-fleet", "--nodes", str(NODES), "--gpus", str(GPUS)]
    fleet_cmd += ["--port-base", str(base), "--targets", str(targets), "--poll-interval", "1"]
    fleet_cmd += ["--state-dir", str(tmp / "state"), "--config", str(tmp / "fleet.toml")]
    fleet_cmd += ["--node-config", f"{SLOW_GPU[1]}={tmp / 'slow-gpu-node.toml'}"]
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
        s.receiver_cmd = [
            "prometheus",
            f"--config.file={tmp / 'receiver.yml'}",
            f"--storage.tsdb.path={tmp / 'receiver-tsdb'}",
            f"--web.listen-address=127.0.0.1:{recv_port}",
            "--web.enable-remote-write-receiver",
            "--log.level=warn",
        ]
        s.start("prometheus-receiver", s.receiver_cmd)
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
        try:
            _poll(
                "the expected alerts delivered and the inhibited ones firing in vmalert",
                lambda: {a[:3] for a in hook.alerts()} >= EXPECTED and s.vmalert_firing() >= INHIBITED,
                deadline,
            )
        except AssertionError as e:
            delivered, firing = {a[:3] for a in hook.alerts()}, s.vmalert_firing()
            raise AssertionError(
                f"{e}: not delivered {EXPECTED - delivered}, not firing {INHIBITED - firing}"
            ) from None
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


def _metric(url: str, name: str) -> float:
    """The sum of a process's own metric over its label sets, from its /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.split("{")[0].split(" ")[0] == name)


def _scrapes(stack: Stack) -> float:
    return sum(_metric(url, "vm_promscrape_scrapes_total") for url in stack.vmagents)


# The Prometheus agent counts every scrape of every target here (the interval since that target's previous scrape).
AGENT_SCRAPES = "prometheus_target_interval_length_seconds_count"


@dataclass
class Outage:
    """A store stopped OUTAGE_S s while the fleet runs, then restarted: what its scrapers counted and held."""

    before: float  # wall time once `scrapes_before` was read
    down_at: float
    up_at: float
    scrapes_before: float  # the scrapers' scrapes so far
    held: float  # vmagent: bytes buffered at the end of the outage; the agent: samples it had retried
    read_seconds: float = 0.0  # how long reading `scrapes_before` took


def edge_allowance(*read_seconds: float) -> int:
    """How many scrapes a count of stored samples between two counter readings may differ by: a sample is stamped
    when its scrape starts, counted when it ends, so at each end of the window one scrape per node may be in flight,
    and one more per node for every scrape interval that reading the counters took (seconds on a starved machine)."""
    return sum(NODES * (1 + math.ceil(seconds / SCRAPE_INTERVAL_S)) for seconds in read_seconds)


def take_down(stack: Stack, store: str) -> Outage:
    """`store` ("victoria-metrics" or "prometheus-receiver") down OUTAGE_S s, then up again. One store at a time: both
    replaying at once on a small machine starves the simulated fleet, and its scrapes time out."""
    vm = store == "victoria-metrics"
    read_at = time.time()
    scrapes = _scrapes(stack) if vm else _metric(stack.prom_agent, AGENT_SCRAPES)
    before = time.time()
    time.sleep(2)
    _stop(stack.procs[store])
    down_at = time.time()
    time.sleep(OUTAGE_S)
    if vm:
        held = sum(_metric(url, "vmagent_remotewrite_pending_data_bytes") for url in stack.vmagents)
    else:
        held = _metric(stack.prom_agent, "prometheus_remote_storage_samples_retried_total")
    stack.start(store, stack.vm_cmd() if vm else stack.receiver_cmd)
    return Outage(before, down_at, time.time(), scrapes, held, before - read_at)
