#!/usr/bin/env python3
"""Scale: a simulated fleet scraped by a real Prometheus evaluating the shipped rules; the numbers that size a fleet.

Run by hand, never by the test suite. Starts Prometheus (the Debian `prometheus` binary, loopback, a temporary TSDB)
with deploy/prometheus/prometheus.yml rewritten only for paths, intervals and the Alertmanager target (none), and the
shipped gpuwatch-rules.yml and gpuwatch-alerts.yml as they are; measures an empty Prometheus for a baseline, then
starts `gpuwatch simulate-fleet` (several processes, fleet-mode poll) and measures for --duration seconds:

- series per node (`scrape_samples_scraped`), scrape duration p50/p99/max (`scrape_duration_seconds`, every target
  and every scrape of the window), targets up;
- rule group evaluation time (`prometheus_rule_group_last_duration_seconds`, per group, max and last), missed
  iterations and failed evaluations;
- Prometheus: head series, RSS (its own `process_resident_memory_bytes`), CPU; the simulator's CPU (psutil, whole
  process tree) to show it is not the bottleneck;

and derives series per 1,000 nodes, samples/s at a 15 s scrape and Prometheus memory per million series.

    python benchmarks/scale.py                                  # 200 nodes x 8 GPUs, 15 s scrape, 180 s measured
    python benchmarks/scale.py --nodes 400 --duration 300 --save /tmp/scale400.json

Prometheus' memory in the first minutes is below its steady state (the head grows chunks for up to 2 h before it is
compacted): read the memory per million series as a lower bound, and run longer (--duration 7200) to see the plateau.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cost import MIB, BenchmarkError, percentile, run_guarded

REPO = Path(__file__).resolve().parent.parent
PROM_DIR = REPO / "deploy" / "prometheus"
RULE_FILES = ("gpuwatch-rules.yml", "gpuwatch-alerts.yml")


# --------------------------------------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_range(count: int, start: int = 20000, end: int = 60000) -> int:
    """The first port P such that P..P+count-1 can all be bound on loopback now."""
    base = start
    while base + count < end:
        for offset in range(count):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("127.0.0.1", base + offset))
                except OSError:
                    base += offset + 1
                    break
        else:
            return base
    raise BenchmarkError(f"no {count} free consecutive ports between {start} and {end}")


class Child:
    """A child in its own process group, output to a file; stop() is SIGTERM, then SIGKILL to the group."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log_path = name, argv, log
        self._log = log.open("wb")
        try:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            self._log.close()
            raise BenchmarkError(f"cannot start {name} ({shlex.join(argv)}): {exc}") from None
        self.proc = psutil.Process(self.popen.pid)

    def check(self) -> None:
        if self.popen.poll() is not None:
            raise BenchmarkError(f"{self.name} exited with status {self.popen.returncode}:\n{self.tail()}")

    def tail(self, limit: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-limit:]

    def cpu_seconds(self) -> float:
        """User+system of the process and every live descendant plus reaped children."""
        try:
            t = self.proc.cpu_times()
            total = t.user + t.system + t.children_user + t.children_system
            for kid in self.proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    k = kid.cpu_times()
                    total += k.user + k.system
            return total
        except psutil.Error:
            return 0.0

    def rss_tree(self) -> int:
        try:
            total = int(self.proc.memory_info().rss)
            for kid in self.proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += int(kid.memory_info().rss)
            return total
        except psutil.Error:
            return 0

    def stop(self, grace: float = 15.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._log.close()


# --------------------------------------------------------------------------------------------------------------------
# Prometheus


def write_config(work: Path, targets_glob: str, scrape_interval: str, eval_interval: str) -> Path:
    """The shipped prometheus.yml with paths, intervals and the Alertmanager target rewritten; rules copied as-is."""
    try:
        import yaml
    except ImportError:
        raise BenchmarkError("PyYAML is needed to rewrite prometheus.yml: .venv/bin/pip install pyyaml") from None
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = scrape_interval
    config["global"]["evaluation_interval"] = eval_interval
    config.pop("alerting", None)  # no Alertmanager here: alerts are evaluated, not sent anywhere
    for job in config["scrape_configs"]:
        if job.get("job_name") == "gpuwatch":
            job["scrape_interval"] = scrape_interval
            if _seconds(job.get("scrape_timeout", "10s")) > _seconds(scrape_interval):
                job["scrape_timeout"] = scrape_interval  # Prometheus refuses a timeout above the interval
            job["file_sd_configs"] = [{"files": [targets_glob], "refresh_interval": "5s"}]
    for name in RULE_FILES:
        shutil.copy(PROM_DIR / name, work / name)
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _seconds(duration: str) -> float:
    """A Prometheus duration as written in the shipped file ("10s", "1m")."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    raise BenchmarkError(f"cannot read the duration {duration!r} in prometheus.yml")


def http_get(port: int, path: str, timeout: float = 30.0) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise BenchmarkError(f"GET {path}: HTTP {resp.status}: {body[:300]!r}")
        return body
    except OSError as exc:
        raise BenchmarkError(f"GET {path}: {exc}") from None
    finally:
        conn.close()


def query(port: int, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    data = json.loads(http_get(port, "/api/v1/query?" + urllib.parse.urlencode(params)))
    if data.get("status") != "success":
        raise BenchmarkError(f"query {expr!r} failed: {data}")
    return list(data["data"]["result"])


def self_metrics(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus' own /metrics, parsed (only the families we read)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "prometheus_tsdb_head_series",
        "prometheus_rule_group_last_duration_seconds",
        "prometheus_rule_group_iterations_missed_total",
        "prometheus_rule_evaluation_failures_total",
        "prometheus_rule_group_interval_seconds",
        "go_memstats_heap_inuse_bytes",
    }
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(http_get(port, "/metrics").decode()):
        for sample in family.samples:
            if sample.name in wanted:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def one(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    values = metrics.get(name) or [({}, float("nan"))]
    return sum(v for _, v in values)


def _group_name(labels: dict[str, str]) -> str:
    # rule_group is "<file path>;<group>"; two files both have a `gpuwatch-probe` group, so keep the file's stem
    path, _, group = labels.get("rule_group", "?;?").rpartition(";")
    return f"{Path(path).stem}/{group}"


# --------------------------------------------------------------------------------------------------------------------
# The run


def wait_until(what: str, check: Any, timeout: float, children: Sequence[Child]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for child in children:
            child.check()
        with contextlib.suppress(BenchmarkError):
            if check():
                return
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1.0)


@contextlib.contextmanager
def workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="gpuwatch-scale-") as tmp:
        yield Path(tmp)


def run(args: argparse.Namespace) -> dict[str, Any]:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        raise BenchmarkError("no `prometheus` binary on PATH: apt-get install -y prometheus")
    children: list[Child] = []
    with workdir(args.keep_dir) as work:
        try:
            sd_dir = work / "file_sd"
            sd_dir.mkdir(exist_ok=True)
            targets = sd_dir / "gpuwatch-fleet.json"
            config = write_config(
                work, str(sd_dir / "gpuwatch*.json"), f"{args.scrape_interval:g}s", f"{args.eval_interval:g}s"
            )
            prom_port = free_port()
            prom = Child(
                "prometheus",
                [
                    prometheus_bin,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=warn",
                ],
                work / "prometheus.log",
            )
            children.append(prom)
            wait_until("Prometheus ready", lambda: http_get(prom_port, "/-/ready") is not None, 60, children)
            time.sleep(5)
            base = self_metrics(prom_port)
            baseline = {
                "rss_mib": round(one(base, "process_resident_memory_bytes") / MIB, 1),
                "head_series": int(one(base, "prometheus_tsdb_head_series")),
            }
            print(f"prometheus ready on :{prom_port}, empty RSS {baseline['rss_mib']} MiB", file=sys.stderr)

            port_base = args.port_base or free_port_range(args.nodes)
            fleet_argv = [
                sys.executable,
                "-m",
                "gpuwatch",
                "simulate-fleet",
                "--nodes",
                str(args.nodes),
                "--gpus",
                str(args.gpus),
                "--port-base",
                str(port_base),
                "--targets",
                str(targets),
                "--nodes-per-process",
                str(args.nodes_per_process),
                "--poll-interval",
                f"{args.poll_interval:g}",
                "--state-dir",
                str(work / "state"),
                "--log-level",
                "warning",
            ]
            started = time.monotonic()
            fleet = Child("simulate-fleet", fleet_argv, work / "fleet.log")
            children.append(fleet)
            wait_until("the fleet's targets file", targets.exists, 600, children)
            fleet_start_s = time.monotonic() - started
            print(f"fleet serving after {fleet_start_s:.1f} s; waiting for every target up", file=sys.stderr)

            def all_up() -> bool:
                r = query(prom_port, 'count(up{job="gpuwatch"} == 1)')
                return bool(r) and int(float(r[0]["value"][1])) == args.nodes

            wait_until(f"{args.nodes} targets up", all_up, 10 * args.scrape_interval + 60, children)
            # One more full scrape + evaluation cycle so the rule groups have run against every node.
            time.sleep(args.scrape_interval + args.eval_interval)

            t_begin = time.time()
            m0 = time.monotonic()
            fleet_cpu0, prom_cpu0 = fleet.cpu_seconds(), prom.cpu_seconds()
            prom_self_cpu0 = one(self_metrics(prom_port), "process_cpu_seconds_total")
            load_begin = os.getloadavg()[0]
            group_all: dict[str, list[float]] = {}
            group_max: dict[str, float] = {}
            group_last: dict[str, float] = {}
            rss_samples: list[float] = []
            head_samples: list[float] = []
            fleet_rss_max = 0
            up_min = args.nodes
            print(f"measuring {args.duration:g} s", file=sys.stderr)
            while True:
                for child in children:
                    child.check()
                m = self_metrics(prom_port)
                rss_samples.append(one(m, "process_resident_memory_bytes"))
                head_samples.append(one(m, "prometheus_tsdb_head_series"))
                for labels, value in m.get("prometheus_rule_group_last_duration_seconds", []):
                    g = _group_name(labels)
                    group_max[g] = max(group_max.get(g, 0.0), value)
                    group_all.setdefault(g, []).append(value)
                    group_last[g] = value
                fleet_rss_max = max(fleet_rss_max, fleet.rss_tree())
                r = query(prom_port, 'count(up{job="gpuwatch"} == 1)')
                up_min = min(up_min, int(float(r[0]["value"][1])) if r else 0)
                if time.monotonic() - m0 >= args.duration:
                    break
                time.sleep(min(5.0, max(0.0, args.duration - (time.monotonic() - m0))))
            window = time.monotonic() - m0
            fleet_cpu = fleet.cpu_seconds() - fleet_cpu0
            prom_cpu = prom.cpu_seconds() - prom_cpu0
            t_end = time.time()
            rng = f"[{int(t_end - t_begin)}s]"

            def range_values(expr: str) -> list[float]:
                return [float(v) for s in query(prom_port, expr + rng, at=t_end) for _, v in s["values"]]

            durations = sorted(range_values('scrape_duration_seconds{job="gpuwatch"}'))
            all_scraped = range_values('scrape_samples_scraped{job="gpuwatch"}')
            # A failed scrape (timeout, refused) reports 0 samples: count it, keep it out of series per node.
            per_node = sorted(v for v in all_scraped if v > 0)
            failed_scrapes = len(all_scraped) - len(per_node)
            rule_series = query(prom_port, 'count({__name__=~"gpuwatch:.+"})', at=t_end)
            alerts = query(prom_port, 'count by (alertname) (ALERTS{alertstate="firing"})', at=t_end)
            end = self_metrics(prom_port)
            prom_self_cpu = one(end, "process_cpu_seconds_total") - prom_self_cpu0
            load = (round(load_begin, 1), round(os.getloadavg()[0], 1))
            fleet_stats = {"cpu_cores": round(fleet_cpu / window, 3), "rss_max_mib": round(fleet_rss_max / MIB, 1)}
        finally:
            for child in reversed(children):
                child.stop()

    if not durations or not per_node:
        raise BenchmarkError("Prometheus recorded no successful scrape in the window")
    series_per_node = percentile(per_node, 0.5)
    head = one(end, "prometheus_tsdb_head_series")
    rss = one(end, "process_resident_memory_bytes")
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "host": f"{psutil.cpu_count()} CPUs, {round(psutil.virtual_memory().total / 2**30)} GiB, no GPU",
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "nodes_per_process": args.nodes_per_process,
        "fleet_processes": -(-args.nodes // args.nodes_per_process),
        "agent_poll_interval_s": args.poll_interval,
        "scrape_interval_s": args.scrape_interval,
        "eval_interval_s": args.eval_interval,
        "measured_s": round(window, 1),
        "fleet_start_s": round(fleet_start_s, 1),
        "targets_up_min": up_min,
        "failed_scrapes": failed_scrapes,
        "series_per_node": {"min": per_node[0], "p50": series_per_node, "max": per_node[-1]},
        "scrape_duration_ms": {
            "p50": round(percentile(durations, 0.5) * 1000, 2),
            "p99": round(percentile(durations, 0.99) * 1000, 2),
            "max": round(durations[-1] * 1000, 2),
            "scrapes": len(durations),
        },
        "rule_group_ms": {
            g: {
                "p50": round(percentile(sorted(group_all[g]), 0.5) * 1000, 2),
                "max": round(group_max[g] * 1000, 2),
                "last": round(group_last[g] * 1000, 2),
            }
            for g in sorted(group_max)
        },
        "load_average_1m_begin_end": load,
        "rule_groups_total_last_ms": round(sum(group_last.values()) * 1000, 2),
        "rule_iterations_missed": one(end, "prometheus_rule_group_iterations_missed_total"),
        "rule_evaluation_failures": one(end, "prometheus_rule_evaluation_failures_total"),
        "recorded_series": int(float(rule_series[0]["value"][1])) if rule_series else 0,
        "alerts_firing": {a["metric"].get("alertname", "?"): int(float(a["value"][1])) for a in alerts},
        "prometheus": {
            "head_series": int(head),
            "rss_mib": round(rss / MIB, 1),
            "rss_max_mib": round(max(rss_samples) / MIB, 1),
            "heap_inuse_mib": round(one(end, "go_memstats_heap_inuse_bytes") / MIB, 1),
            "empty_rss_mib": baseline["rss_mib"],
            "cpu_cores": round(prom_cpu / window, 3),
            "cpu_cores_own_metric": round(prom_self_cpu / window, 3),
        },
        "simulator": fleet_stats,
    }
    ingested = head - baseline["head_series"]
    report["derived"] = {
        "series_per_1000_nodes": round(series_per_node * 1000),
        "head_series_per_1000_nodes_incl_rules_and_up": round(ingested / args.nodes * 1000),
        "samples_per_s_per_1000_nodes_at_15s": round(series_per_node * 1000 / 15),
        "samples_per_s_now": round(series_per_node * args.nodes / args.scrape_interval),
        "prometheus_rss_mib_per_million_series": round(rss / MIB / head * 1e6) if head else None,
        "prometheus_marginal_rss_mib_per_million_series": (
            round((rss / MIB - baseline["rss_mib"]) / ingested * 1e6) if ingested > 0 else None
        ),
    }
    return report


def table(r: dict[str, Any]) -> str:
    p, d, s = r["prometheus"], r["derived"], r["scrape_duration_ms"]
    rows: list[tuple[str, Any]] = [
        ("date, host", f"{r['date']}, {r['host']}"),
        (
            "fleet",
            f"{r['nodes']} nodes x {r['gpus_per_node']} GPUs, {r['fleet_processes']} processes, "
            f"agent poll {r['agent_poll_interval_s']:g} s",
        ),
        (
            "scrape / eval interval (s), measured (s)",
            f"{r['scrape_interval_s']:g} / {r['eval_interval_s']:g}, {r['measured_s']}",
        ),
        ("targets up (min over window)", f"{r['targets_up_min']} / {r['nodes']}"),
        ("failed scrapes (timeout, refused)", f"{r['failed_scrapes']} of {r['scrape_duration_ms']['scrapes']}"),
        (
            "series per node (scrape_samples_scraped)",
            "{p50:g} (min {min:g}, max {max:g})".format(**r["series_per_node"]),
        ),
        ("scrape duration p50 / p99 / max (ms)", f"{s['p50']} / {s['p99']} / {s['max']} ({s['scrapes']} scrapes)"),
    ]
    for g, v in r["rule_group_ms"].items():
        rows.append((f"rule group {g} (ms, p50 / max)", f"{v['p50']} / {v['max']}"))
    rows += [
        ("rule groups, all (ms, last)", r["rule_groups_total_last_ms"]),
        (
            "missed iterations, failed evaluations",
            f"{r['rule_iterations_missed']:g}, {r['rule_evaluation_failures']:g}",
        ),
        ("recorded series (gpuwatch:*)", r["recorded_series"]),
        ("alerts firing", ", ".join(f"{k} {v}" for k, v in r["alerts_firing"].items()) or "none"),
        ("Prometheus head series", p["head_series"]),
        ("Prometheus RSS now / max / empty (MiB)", f"{p['rss_mib']} / {p['rss_max_mib']} / {p['empty_rss_mib']}"),
        ("Prometheus Go heap in use (MiB)", p["heap_inuse_mib"]),
        ("Prometheus CPU (cores; its own metric)", f"{p['cpu_cores']}; {p['cpu_cores_own_metric']}"),
        ("load average 1 min, begin / end", "{} / {}".format(*r["load_average_1m_begin_end"])),
        ("simulator CPU (cores), RSS max (MiB)", f"{r['simulator']['cpu_cores']}, {r['simulator']['rss_max_mib']}"),
        ("series per 1,000 nodes", d["series_per_1000_nodes"]),
        ("head series per 1,000 nodes (+ up, rules)", d["head_series_per_1000_nodes_incl_rules_and_up"]),
        ("samples/s per 1,000 nodes at 15 s", d["samples_per_s_per_1000_nodes_at_15s"]),
        ("samples/s ingested in this run", d["samples_per_s_now"]),
        ("Prometheus RSS per million series (MiB)", d["prometheus_rss_mib_per_million_series"]),
        ("  marginal (RSS - empty) per million (MiB)", d["prometheus_marginal_rss_mib_per_million_series"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scale.py", description="A simulated fleet scraped by a real Prometheus.")
    parser.add_argument("--nodes", type=int, default=200, help="simulated nodes (default 200)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--nodes-per-process", type=int, default=50, help="fleet process size (default 50)")
    parser.add_argument("--poll-interval", type=float, default=5.0, help="agent poll in the fleet (default 5 s)")
    parser.add_argument("--scrape-interval", type=float, default=15.0, help="Prometheus scrape interval (default 15)")
    parser.add_argument("--eval-interval", type=float, default=15.0, help="rule evaluation interval (default 15)")
    parser.add_argument("--duration", type=float, default=180.0, help="measured seconds (default 180)")
    parser.add_argument("--port-base", type=int, help="first node port (default: the first free range from 20000)")
    parser.add_argument(
        "--keep-dir", type=Path, help="work here and keep it (config, TSDB, logs) instead of a temp dir"
    )
    parser.add_argument("--save", type=Path, help="also write the JSON report here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.gpus < 1 or args.duration <= 0 or args.scrape_interval <= 0:
        parser.error("--nodes, --gpus, --duration and --scrape-interval must be positive")
    report = run_guarded("scale", "Prometheus and the fleet were stopped", lambda: run(args))
    if args.save:
        args.save.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
