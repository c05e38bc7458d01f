#!/usr/bin/env python3
"""The remote_write path at fleet size, per store: a simulated fleet -> two vmagent shards -> victoria-metrics with
vmalert, and the same fleet -> Prometheus in agent mode -> a Prometheus remote-write receiver with the rules.

Run by hand, never by the test suite (issue 18). Everything on loopback; the shipped deploy/victoriametrics/*.env
flags and vmagent.yml, deploy/prometheus/remote-write/agent-remote-write.yml, and the shipped rules unchanged (only
paths, ports, and the scrape/evaluation interval rewritten). For each store, after every target is up and one more
interval, it measures for --duration seconds:

- samples/s ingested: VictoriaMetrics' `vm_rows_inserted_total`, the receiver's
  `prometheus_tsdb_head_samples_appended_total`, as a rate over the window;
- RSS of the store, of the scrapers (both vmagents / the agent-mode Prometheus) and of the rule evaluator (vmalert),
  by psutil at the end of the window;
- disk bytes per sample after a flush: VictoriaMetrics after /internal/force_flush and /internal/force_merge, du of
  -storageDataPath divided by the rows it holds (`vm_rows{type=~"storage/.*"}`); Prometheus: an admin-API snapshot
  (the head written as a block, as compaction does) divided by the samples appended;
- rule evaluation time: vmalert's `vmalert_iteration_duration_seconds` (sum/count per group) and the receiver's
  `prometheus_rule_group_last_duration_seconds`;

and with --outage S the store is stopped S seconds while the fleet runs. VictoriaMetrics: the vmagents' buffered bytes,
bytes per buffered sample, replay time, and scrapes counted by the vmagents against `up` samples stored over the whole
time (lost = the difference). The Prometheus receiver: the agent's resend time after the restart, its scrapes
against the `up` samples stored, and per node the `up` samples the receiver holds for the outage itself.

    .venv/bin/python benchmarks/vm_scale.py                              # 200 nodes x 8 GPUs, 15 s, 120 s each store
    .venv/bin/python benchmarks/vm_scale.py --store vm --outage 300      # the full 5-minute store outage
    .venv/bin/python benchmarks/vm_scale.py --store prometheus --nodes 50 --duration 30 --outage 300
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
PROM_DIR = REPO / "deploy" / "prometheus"
VM_DIR = REPO / "deploy" / "victoriametrics"
RULES = [PROM_DIR / "gpuwatch-rules.yml", PROM_DIR / "gpuwatch-alerts.yml"]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cost import free_port  # noqa: E402
from scale import free_port_range  # noqa: E402


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return bytes(reply.read())


def metrics(url: str) -> dict[str, float]:
    """name{labels} -> value of a /metrics page."""
    out = {}
    for line in get(f"{url}/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


def total(m: dict[str, float], name: str, contains: str = "") -> float:
    return sum(v for k, v in m.items() if k.split("{")[0] == name and contains in k)


def query(url: str, expr: str, at: float | None = None) -> list[Any]:
    params = {"query": expr} | ({"time": f"{at:.0f}"} if at is not None else {})
    reply = json.loads(get(f"{url}/api/v1/query?" + urllib.parse.urlencode(params)))
    return list(reply["data"]["result"])


def shipped_args(env_file: str, **overrides: str | list[str]) -> list[str]:
    """deploy/victoriametrics/<env_file>'s ARGS, flags named in overrides (dots as underscores) replaced or added."""
    text = (VM_DIR / env_file).read_text().replace("\\\n", "")
    [assignment] = shlex.split(text, comments=True)
    args = shlex.split(assignment.removeprefix("ARGS="))
    wanted = {k.replace("_", "."): [v] if isinstance(v, str) else v for k, v in overrides.items()}
    out = [a for a in args if a.lstrip("-").split("=", 1)[0] not in wanted]
    return out + [f"-{name}={v}" for name, values in wanted.items() for v in values]


def rss_mib(*procs: subprocess.Popen[bytes]) -> float:
    return sum(psutil.Process(p.pid).memory_info().rss for p in procs if p.poll() is None) / 2**20


def cpu(*procs: subprocess.Popen[bytes]) -> list[float]:
    """user+system CPU seconds of each process so far."""
    return [sum(psutil.Process(p.pid).cpu_times()[:2]) for p in procs]


def disk_row(series: int, rows: int, data: int, index: int) -> dict[str, Any]:
    """The disk columns of a store's row: bytes per stored sample and per series."""
    return {
        "series": series,
        "rows_stored": rows,
        "data_bytes": data,
        "index_bytes": index,
        "data_bytes_per_sample": round(data / rows, 3),
        "index_bytes_per_series": round(index / series),
    }


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait(what: str, check: Any, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if check():
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


class Run:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)


def bench_vm(args: argparse.Namespace, run: Run, targets: Path, nodes: int) -> dict[str, Any]:
    tmp, interval = run.tmp, f"{args.interval}s"
    vm_port, alert_port = free_port(), free_port()
    vm = f"http://127.0.0.1:{vm_port}"
    config = yaml.safe_load((VM_DIR / "vmagent.yml").read_text())
    config["global"]["scrape_interval"] = interval
    job = config["scrape_configs"][0]
    job["scrape_interval"] = interval
    job["scrape_timeout"] = f"{min(10, args.interval)}s"
    job["file_sd_configs"] = [{"files": [str(targets)]}]
    (tmp / "vmagent.yml").write_text(yaml.safe_dump(config))
    vm_cmd = [
        "victoria-metrics",
        *shipped_args(
            "victoria-metrics.env", storageDataPath=str(tmp / "vmdata"), httpListenAddr=f"127.0.0.1:{vm_port}"
        ),
    ]
    store = run.start("victoria-metrics", vm_cmd)
    agent_urls, agents = [], []
    for shard in range(2):
        port = free_port()
        agent_urls.append(f"http://127.0.0.1:{port}")
        flags = shipped_args(
            "vmagent.env",
            promscrape_config=str(tmp / "vmagent.yml"),
            promscrape_fileSDCheckInterval="5s",
            promscrape_cluster_memberNum=str(shard),
            remoteWrite_url=f"{vm}/api/v1/write",
            remoteWrite_tmpDataPath=str(tmp / f"buffer-{shard}"),
            httpListenAddr=f"127.0.0.1:{port}",
        )
        agents.append(run.start(f"vmagent-{shard}", ["vmagent", *flags]))
    vmalert = run.start(
        "vmalert",
        [
            "vmalert",
            *shipped_args(
                "vmalert.env",
                rule=[str(p) for p in RULES],
                datasource_url=vm,
                remoteWrite_url=vm,
                remoteRead_url=vm,
                notifier_url=f"http://127.0.0.1:{free_port()}",  # nobody there: alerts evaluated, not delivered
                evaluationInterval=interval,
                httpListenAddr=f"127.0.0.1:{alert_port}",
                loggerLevel="FATAL",
            ),
        ],
    )
    alert_url = f"http://127.0.0.1:{alert_port}"
    up = f'count(up{{job="gpuwatch"}} == 1) >= {nodes}'
    ready_s = wait("every target up in VictoriaMetrics", lambda: query(vm, up), 600)
    time.sleep(args.interval + 35)  # one more scrape and evaluation, and -search.latencyOffset
    m0, a0, t0, c0 = metrics(vm), [metrics(u) for u in (alert_url,)], time.monotonic(), cpu(store, *agents, vmalert)
    time.sleep(args.duration)
    m1, a1, t1, c1 = metrics(vm), [metrics(u) for u in (alert_url,)], time.monotonic(), cpu(store, *agents, vmalert)
    cores = [round((b - a) / (t1 - t0), 3) for a, b in zip(c0, c1, strict=True)]
    rows_per_s = (total(m1, "vm_rows_inserted_total") - total(m0, "vm_rows_inserted_total")) / (t1 - t0)
    groups: dict[str, float] = {}
    for key, value in a1[0].items():
        if key.startswith("vmalert_iteration_duration_seconds_sum"):
            count_key = key.replace("_sum", "_count", 1)
            d_sum = value - a0[0].get(key, 0)
            d_count = a1[0].get(count_key, 0) - a0[0].get(count_key, 0)
            group = key.split('group="', 1)[1].split('"', 1)[0] if 'group="' in key else key
            groups[group] = round(1000 * d_sum / d_count, 1) if d_count else float("nan")
    out: dict[str, Any] = {
        "store": "victoria-metrics (2 vmagent shards, vmalert)",
        "ready_s": round(ready_s, 1),
        "samples_per_s": round(rows_per_s),
        "active_series": len(query(vm, '{job="gpuwatch"}')) if args.count_series else None,
        "rss_store_mib": round(rss_mib(store)),
        "rss_scrapers_mib": round(rss_mib(*agents)),
        "rss_rules_mib": round(rss_mib(vmalert)),
        "cpu_cores_store_scrapers_rules": [cores[0], round(cores[1] + cores[2], 3), cores[3]],
        "rule_group_mean_ms": groups,
        "rule_missed_iterations": total(a1[0], "vmalert_iteration_missed_total"),
    }
    if args.outage:
        out["outage"] = outage(args, run, vm, vm_cmd, agent_urls, nodes)
    get(f"{vm}/internal/force_flush")
    get(f"{vm}/internal/force_merge", timeout=600)
    time.sleep(10)
    m = metrics(vm)
    stored_rows = total(m, "vm_rows", 'type="storage/')
    series = json.loads(get(f"{vm}/api/v1/series/count"))["data"][0]
    data, index = du(tmp / "vmdata" / "data"), du(tmp / "vmdata" / "indexdb")
    return out | disk_row(series, stored_rows, data, index)


def outage(
    args: argparse.Namespace, run: Run, vm: str, vm_cmd: list[str], agents: list[str], nodes: int
) -> dict[str, Any]:
    """The store down args.outage seconds: buffered bytes, replay time, scrapes vs stored `up` samples."""
    store = next(
        p for p in run.procs if isinstance(p.args, list) and p.args[0] == "victoria-metrics" and p.poll() is None
    )
    scrapes0, wall0 = sum(total(metrics(u), "vm_promscrape_scrapes_total") for u in agents), time.time()
    time.sleep(2)
    stop(store)
    scrapes_down0 = sum(total(metrics(u), "vm_promscrape_scrapes_total") for u in agents)
    time.sleep(args.outage)
    scrapes_down1 = sum(total(metrics(u), "vm_promscrape_scrapes_total") for u in agents)
    pending = sum(total(metrics(u), "vmagent_remotewrite_pending_data_bytes") for u in agents)
    run.procs.remove(store)
    run.procs.append(run.start("victoria-metrics", vm_cmd))
    replay_s = wait(
        "the buffers replayed",
        lambda: sum(total(metrics(u), "vmagent_remotewrite_pending_data_bytes") for u in agents) == 0,
        1800,
    )
    time.sleep(10)
    scrapes1, wall1 = sum(total(metrics(u), "vm_promscrape_scrapes_total") for u in agents), time.time()
    time.sleep(40)  # flushed, and past -search.latencyOffset (30 s)
    # Samples stored in [wall0, wall1], against the scrapes the shards counted in between (± one per node at each end).
    stored = query(vm, f'sum(count_over_time(up{{job="gpuwatch"}}[{wall1 - wall0:.0f}s]))', at=wall1)
    samples_per_scrape = sum(
        total(metrics(u), "vm_promscrape_scraped_samples_sum")
        / max(1, total(metrics(u), "vm_promscrape_scrapes_total"))
        for u in agents
    ) / len(agents)
    return {
        "seconds": args.outage,
        "buffered_bytes": pending,
        "buffered_samples_est": round((scrapes_down1 - scrapes_down0) * samples_per_scrape),
        "buffer_bytes_per_sample": round(pending / max(1, (scrapes_down1 - scrapes_down0) * samples_per_scrape), 3),
        "replay_s": round(replay_s, 1),
        "scrapes_counted_approx": scrapes1 - scrapes0,
        "up_samples_stored": float(stored[0]["value"][1]) if stored else 0.0,
        "dropped_packets": sum(total(metrics(u), "vmagent_remotewrite_packets_dropped_total") for u in agents),
    }


def outage_receiver(
    args: argparse.Namespace, run: Run, recv: str, recv_cmd: list[str], agent: str, nodes: int
) -> dict[str, Any]:
    """The receiver down args.outage seconds: the agent's WAL backlog, its resend time, and per node the `up` samples
    the receiver holds for the outage against the scrapes of that time (one per interval)."""
    store = next(p for p in run.procs if p.args == recv_cmd and p.poll() is None)
    scrapes = "prometheus_target_interval_length_seconds_count"  # one per scrape of any target
    scrapes0, wall0 = total(metrics(agent), scrapes), time.time()
    time.sleep(2)
    stop(store)
    down_at = time.time()
    time.sleep(args.outage)
    m_down = metrics(agent)
    run.procs.remove(store)
    run.procs.append(run.start("prometheus-receiver", recv_cmd))
    up_at = time.time()

    def caught_up() -> bool:  # sends are in order: the newest sample sent is within an interval of the newest read
        m = metrics(agent)
        sent = total(m, "prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
        return sent >= total(m, "prometheus_remote_storage_highest_timestamp_in_seconds") - args.interval

    resend_s = wait("the agent's WAL resent", caught_up, 1800)
    time.sleep(args.interval + 5)
    m_end, wall1 = metrics(agent), time.time()
    window = f"{up_at - down_at:.0f}s"
    per_node = query(recv, f'count_over_time(up{{job="gpuwatch"}}[{window}])', at=up_at)
    stored = query(recv, f'sum(count_over_time(up{{job="gpuwatch"}}[{wall1 - wall0:.0f}s]))', at=wall1)
    counts = sorted(float(r["value"][1]) for r in per_node)
    return {
        "seconds": args.outage,
        "receiver_down_s": round(up_at - down_at, 1),
        "retried_samples_during": total(m_down, "prometheus_remote_storage_samples_retried_total"),
        "resend_s": round(resend_s, 1),
        "scrapes_counted_approx": total(m_end, scrapes) - scrapes0,
        "up_samples_stored": float(stored[0]["value"][1]) if stored else 0.0,
        "nodes_with_outage_samples": len(per_node),
        "up_samples_per_node_in_outage_min_max": [counts[0], counts[-1]] if counts else [],
        "scrapes_per_node_in_outage": round((up_at - down_at) / args.interval, 1),
        "failed_samples": total(m_end, "prometheus_remote_storage_samples_failed_total"),
        "dropped_samples": total(m_end, "prometheus_remote_storage_samples_dropped_total"),
    }


def bench_prometheus(args: argparse.Namespace, run: Run, targets: Path, nodes: int) -> dict[str, Any]:
    tmp, interval = run.tmp, f"{args.interval}s"
    recv_port, agent_port = free_port(), free_port()
    recv = f"http://127.0.0.1:{recv_port}"
    agent = yaml.safe_load((PROM_DIR / "remote-write" / "agent-remote-write.yml").read_text())
    agent["global"]["scrape_interval"] = interval
    job = agent["scrape_configs"][0]
    job["scrape_timeout"] = f"{min(10, args.interval)}s"
    job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "5s"}]
    job["relabel_configs"] = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())["scrape_configs"][0][
        "relabel_configs"
    ]
    rw = agent["remote_write"][0]
    rw.pop("headers", None)
    rw.pop("basic_auth", None)
    rw["url"] = f"{recv}/api/v1/write"
    (tmp / "agent.yml").write_text(yaml.safe_dump(agent))
    (tmp / "receiver.yml").write_text(
        yaml.safe_dump({"global": {"evaluation_interval": interval}, "rule_files": [str(p) for p in RULES]})
    )
    recv_cmd = [
        "prometheus",
        f"--config.file={tmp / 'receiver.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{recv_port}",
        "--web.enable-remote-write-receiver",
        "--web.enable-admin-api",
    ]
    receiver = run.start("prometheus-receiver", recv_cmd)
    scraper = run.start(
        "prometheus-agent",
        [
            "prometheus",
            "--enable-feature=agent",
            f"--config.file={tmp / 'agent.yml'}",
            f"--storage.agent.path={tmp / 'wal'}",
            f"--web.listen-address=127.0.0.1:{agent_port}",
        ],
    )
    up = f'count(up{{job="gpuwatch"}} == 1) >= {nodes}'
    ready_s = wait("every target up at the receiver", lambda: query(recv, up), 600)
    time.sleep(args.interval + 5)
    m0, t0, c0 = metrics(recv), time.monotonic(), cpu(receiver, scraper)
    time.sleep(args.duration)
    m1, t1, c1 = metrics(recv), time.monotonic(), cpu(receiver, scraper)
    cores = [round((b - a) / (t1 - t0), 3) for a, b in zip(c0, c1, strict=True)]
    appended = "prometheus_tsdb_head_samples_appended_total"
    groups = {
        k.split('rule_group="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1]: round(1000 * v, 1)
        for k, v in m1.items()
        if k.startswith("prometheus_rule_group_last_duration_seconds{")
    }
    out: dict[str, Any] = {
        "store": "prometheus receiver (agent-mode Prometheus in front)",
        "ready_s": round(ready_s, 1),
        "samples_per_s": round((total(m1, appended) - total(m0, appended)) / (t1 - t0)),
        "active_series": total(m1, "prometheus_tsdb_head_series"),
        "rss_store_mib": round(rss_mib(receiver)),
        "rss_scrapers_mib": round(rss_mib(scraper)),
        "rss_rules_mib": 0,
        "cpu_cores_store_scrapers_rules": [cores[0], cores[1], 0],
        "rule_group_last_ms": groups,
        "rule_missed_iterations": total(m1, "prometheus_rule_group_iterations_missed_total"),
    }
    if args.outage:
        out["outage"] = outage_receiver(args, run, recv, recv_cmd, f"http://127.0.0.1:{agent_port}", nodes)
        receiver = next(p for p in run.procs if p.args == recv_cmd and p.poll() is None)
    stop(scraper)
    time.sleep(2)
    reply = json.loads(
        urllib.request.urlopen(
            urllib.request.Request(f"{recv}/api/v1/admin/tsdb/snapshot", method="POST"), timeout=600
        ).read()
    )
    snap = tmp / "tsdb" / "snapshots" / reply["data"]["name"]
    samples = total(metrics(recv), appended)
    series = total(metrics(recv), "prometheus_tsdb_head_series")
    index = sum(f.stat().st_size for f in snap.rglob("index"))
    data = du(snap) - index
    return out | disk_row(series, samples, data, index)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=int, default=15, help="scrape, evaluation and agent poll interval (s)")
    parser.add_argument("--duration", type=int, default=120, help="seconds measured per store")
    parser.add_argument("--store", choices=["vm", "prometheus", "both"], default="both")
    parser.add_argument("--outage", type=int, default=0, help="stop the store this long (s) after measuring")
    parser.add_argument("--count-series", action="store_true", help="count the active series in VM (a heavy query)")
    parser.add_argument("--keep-dir", type=Path)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    for tool in ("victoria-metrics", "vmagent", "vmalert", "prometheus"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} missing: apt-get install -y victoria-metrics prometheus")
    results = []
    stores = ["vm", "prometheus"] if args.store == "both" else [args.store]
    for which in stores:
        tmp = Path(tempfile.mkdtemp(prefix=f"vm_scale-{which}-", dir=args.keep_dir))
        run = Run(tmp)
        targets = tmp / "targets.json"
        try:
            fleet = run.start(
                "fleet",
                [
                    *(sys.executable, "-m", "gpuwatch", "simulate-fleet", "--nodes", str(args.nodes)),
                    *("--gpus", str(args.gpus), "--port-base", str(free_port_range(args.nodes, end=32000))),
                    *("--targets", str(targets), "--poll-interval", str(args.interval), "--nodes-per-process", "50"),
                    *("--state-dir", str(tmp / "state")),
                ],
            )
            wait("the targets file", targets.exists, 300)
            result = (bench_vm if which == "vm" else bench_prometheus)(args, run, targets, args.nodes)
            tree = [psutil.Process(fleet.pid), *psutil.Process(fleet.pid).children(recursive=True)]
            result["simulator_rss_mib"] = round(sum(p.memory_info().rss for p in tree) / 2**20)
            result |= {"nodes": args.nodes, "gpus": args.gpus, "interval_s": args.interval}
            results.append(result)
            print(json.dumps(result, indent=1), flush=True)
        finally:
            run.stop_all()
            if args.keep_dir is None:
                shutil.rmtree(tmp, ignore_errors=True)
    if args.save:
        args.save.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
