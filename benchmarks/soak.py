#!/usr/bin/env python3
"""Soak: does the agent leak over an hour? RSS growth, CPU per minute, threads and fds over time, scrape errors.

Run by hand, never by the test suite. Starts `gpuwatch run` (simulated 8-GPU `mixed` node, 0.2 s poll, the matmul probe
every 10 s so probe children come and go) as a child, scrapes /metrics every few seconds the way Prometheus does, and
samples the child with psutil. A 60 s scrape window is not a leak test; this is.

    python benchmarks/soak.py                                     # 1 h, table at the end
    python benchmarks/soak.py --duration 300 --save /tmp/soak5.json
    nohup python benchmarks/soak.py --save /tmp/soak.json > /tmp/soak.log 2>&1 &   # read /tmp/soak.json meanwhile

With --save the JSON report is rewritten (atomically) after every sample with `"complete": false`, so a soak still
running can be read; the last write says `"complete": true`. Everything after `--` replaces the agent flags.
Reuses agent_cost.py (same directory) for the child, the scrapes and the psutil snapshot.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cost import (  # a sibling script, not a package
    MIB,
    Agent,
    BenchmarkError,
    Target,
    agent_argv,
    percentile,
    run_guarded,
    scrape,
    snapshot,
    wait_ready,
)

DEFAULT_AGENT_ARGS = [
    "--backend",
    "simulated",
    "--scenario",
    "mixed",
    "--gpus",
    "8",
    "--poll-interval",
    "0.2",
    "--probe-interval",
    "10",
]


@dataclass
class Sample:
    """One psutil look at the agent, `t` seconds after measuring began."""

    t: float
    rss_mib: float
    rss_tree_mib: float
    cpu_s: float
    threads: int
    fds: int | None
    children: int


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value), scaled to value per hour; None under 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return None
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    return sxy / sxx * 3600


class SoakScraper(threading.Thread):
    """Scrapes every `interval` s until stopped; keeps latency, errors and the series count of each answer."""

    def __init__(self, target: Target, interval: float, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="soak-scraper")
        self.target, self.interval, self.stop_event = target, interval, stop
        self.lock = threading.Lock()
        self.latencies_ms: list[float] = []
        self.errors: list[tuple[float, str]] = []
        self.series_min: int | None = None
        self.series_max: int | None = None
        self.series_drops: list[tuple[float, int]] = []  # (s, series) of answers far below the largest so far
        self.count = 0

    def run(self) -> None:
        t0 = time.monotonic()
        slot = 0
        while not self.stop_event.is_set():
            due = t0 + slot * self.interval
            delay = due - time.monotonic()
            if delay > 0 and self.stop_event.wait(delay):
                return
            result = scrape(self.target)
            with self.lock:
                self.count += 1
                if result.error is not None:
                    self.errors.append((round(time.monotonic() - t0, 1), result.error))
                else:
                    self.latencies_ms.append(result.seconds * 1000)
                    body = result.body or b""
                    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
                    self.series_min = series if self.series_min is None else min(self.series_min, series)
                    self.series_max = series if self.series_max is None else max(self.series_max, series)
                    if series < self.series_max // 2:  # the agent dropped most of its GPUs' series (stale GPUs?)
                        self.series_drops.append((round(time.monotonic() - t0, 1), series))
            slot = max(slot + 1, int((time.monotonic() - t0) / self.interval))


def _quarter_range(samples: list[Sample], key: str, lo: float, hi: float) -> tuple[int, int] | None:
    """(min, max) of `key` over the samples taken between lo and hi seconds."""
    values = [getattr(s, key) for s in samples if lo <= s.t <= hi and getattr(s, key) is not None]
    return (min(values), max(values)) if values else None


def summarize(
    samples: list[Sample], scraper: SoakScraper, warmup: float, meta: dict[str, Any], complete: bool
) -> dict[str, Any]:
    """The report: RSS at start / after warm-up / end with a fitted slope, CPU per minute, thread and fd trends."""
    out: dict[str, Any] = dict(meta)
    out["complete"] = complete
    out["elapsed_s"] = round(samples[-1].t, 1) if samples else 0.0
    out["samples"] = len(samples)
    if samples:
        first, last = samples[0], samples[-1]
        warm = next((s for s in samples if s.t >= warmup), None)
        after = [s for s in samples if s.t >= warmup]
        out["rss_start_mib"] = first.rss_mib
        out["rss_after_warmup_mib"] = warm.rss_mib if warm else None
        out["rss_end_mib"] = last.rss_mib
        out["rss_max_mib"] = max(s.rss_mib for s in samples)
        out["rss_growth_after_warmup_mib"] = round(last.rss_mib - warm.rss_mib, 2) if warm else None
        slope = slope_per_hour([(s.t, s.rss_mib) for s in after])
        out["rss_slope_mib_per_h"] = round(slope, 3) if slope is not None else None
        half = [s for s in after if s.t >= (warmup + last.t) / 2]
        slope2 = slope_per_hour([(s.t, s.rss_mib) for s in half])
        out["rss_slope_second_half_mib_per_h"] = round(slope2, 3) if slope2 is not None else None
        out["rss_tree_max_mib"] = max(s.rss_tree_mib for s in samples)
        window = last.t - first.t
        out["cpu_s_per_min"] = round((last.cpu_s - first.cpu_s) / window * 60, 3) if window > 0 else None
        if warm and last.t > warm.t:
            out["cpu_s_per_min_after_warmup"] = round((last.cpu_s - warm.cpu_s) / (last.t - warm.t) * 60, 3)
        out["cpu_percent_of_one_core"] = round(out["cpu_s_per_min"] / 60 * 100, 2) if out["cpu_s_per_min"] else None
        out["children_max"] = max(s.children for s in samples)
        span = last.t - warmup
        for key in ("threads", "fds"):
            values = [getattr(s, key) for s in samples if getattr(s, key) is not None]
            out[f"{key}_start"] = getattr(first, key)
            out[f"{key}_end"] = getattr(last, key)
            out[f"{key}_max"] = max(values) if values else None
            # Probe children swing both up and down every probe interval; a leak lifts the floor and the top together,
            # so compare min and max of the last quarter with those of the first quarter after warm-up.
            q1 = _quarter_range(samples, key, warmup, warmup + span / 4) if span > 0 else None
            q4 = _quarter_range(samples, key, last.t - span / 4, last.t) if span > 0 else None
            out[f"{key}_range_first_quarter"] = q1
            out[f"{key}_range_last_quarter"] = q4
            out[f"{key}_grow"] = bool(q1 and q4 and q4[0] > q1[0] and q4[1] > q1[1])
    with scraper.lock:
        lat = sorted(scraper.latencies_ms)
        out["scrapes"] = scraper.count
        out["scrape_errors"] = len(scraper.errors)
        out["first_scrape_errors"] = [f"{t} s: {e}" for t, e in scraper.errors[:5]]
        out["series_min"], out["series_max"] = scraper.series_min, scraper.series_max
        out["series_drops"] = len(scraper.series_drops)
        out["first_series_drops"] = [f"{t} s: {n} series" for t, n in scraper.series_drops[:10]]
    if lat:
        out["scrape_ms"] = {
            "p50": round(percentile(lat, 0.5), 2),
            "p99": round(percentile(lat, 0.99), 2),
            "max": round(lat[-1], 2),
        }
    # A thinned trace (at most ~120 points) to plot or eyeball.
    step = max(1, len(samples) // 120)
    out["trace"] = [asdict(s) for s in samples[::step]]
    return out


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def table(r: dict[str, Any]) -> str:
    """The headline rows, one per line."""
    lat = r.get("scrape_ms", {})
    rows = [
        ("complete", r["complete"]),
        ("measured (s)", r["elapsed_s"]),
        ("agent", r["command"]),
        (
            "RSS start / after warm-up / end (MiB)",
            f"{r.get('rss_start_mib')} / {r.get('rss_after_warmup_mib')} / {r.get('rss_end_mib')}",
        ),
        ("RSS growth after warm-up (MiB)", r.get("rss_growth_after_warmup_mib")),
        (
            "RSS slope after warm-up (MiB/h), 2nd half",
            f"{r.get('rss_slope_mib_per_h')}, {r.get('rss_slope_second_half_mib_per_h')}",
        ),
        ("RSS max, with children (MiB)", f"{r.get('rss_max_mib')}, {r.get('rss_tree_max_mib')}"),
        ("CPU s per minute (after warm-up)", f"{r.get('cpu_s_per_min')} ({r.get('cpu_s_per_min_after_warmup')})"),
        (
            "threads start / end / max; grow",
            f"{r.get('threads_start')} / {r.get('threads_end')} / {r.get('threads_max')}; {r.get('threads_grow')}",
        ),
        (
            "fds start / end / max; grow",
            f"{r.get('fds_start')} / {r.get('fds_end')} / {r.get('fds_max')}; {r.get('fds_grow')}",
        ),
        ("probe children seen at once (max)", r.get("children_max")),
        ("scrapes, errors", f"{r.get('scrapes')}, {r.get('scrape_errors')}"),
        ("scrape p50 / p99 / max (ms)", f"{lat.get('p50')} / {lat.get('p99')} / {lat.get('max')}"),
        (
            "series min / max; answers under half the max",
            f"{r.get('series_min')} / {r.get('series_max')}; {r.get('series_drops')}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    state_dir = tempfile.TemporaryDirectory(prefix="gpuwatch-soak-state-")
    agent: Agent | None = None
    stop = threading.Event()
    try:
        argv, base, _ = agent_argv("{python} -m gpuwatch run", args.agent_args or DEFAULT_AGENT_ARGS, state_dir.name)
        print(f"starting: {shlex.join(argv)}", file=sys.stderr)
        agent = Agent(argv)
        proc = psutil.Process(agent.popen.pid)
        target = Target(base + "/metrics", False, args.scrape_timeout)
        wait_ready(target.with_path("/healthz"), agent, 60.0, args.allow_unhealthy)
        meta = {
            "command": shlex.join(argv),
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "scrape_interval_s": args.scrape_interval,
            "sample_interval_s": args.sample_interval,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": f"{psutil.cpu_count()} CPUs, {round(psutil.virtual_memory().total / 2**30)} GiB",
        }
        scraper = SoakScraper(target, args.scrape_interval, stop)
        scraper.start()
        samples: list[Sample] = []
        t0 = time.monotonic()
        next_at = t0
        last_print = t0
        while True:
            now = time.monotonic()
            if agent.exited() is not None:
                raise BenchmarkError(f"the agent exited with status {agent.exited()}:\n{agent.output()}")
            snap = snapshot(proc)
            kids = len(proc.children(recursive=True))
            samples.append(
                Sample(
                    round(now - t0, 2),
                    round(snap.rss_bytes / MIB, 2),
                    round(snap.rss_tree_bytes / MIB, 2),
                    round(snap.cpu_seconds, 3),
                    snap.threads,
                    snap.fds,
                    kids,
                )
            )
            if args.save:
                write_atomic(args.save, summarize(samples, scraper, args.warmup, meta, complete=False))
            if now - last_print >= 60:
                last_print = now
                s = samples[-1]
                print(
                    f"{s.t:7.0f} s  rss {s.rss_mib} MiB  cpu {s.cpu_s} s  threads {s.threads}  fds {s.fds}",
                    file=sys.stderr,
                )
            if now - t0 >= args.duration:
                break
            next_at += args.sample_interval
            time.sleep(max(0.0, min(next_at, t0 + args.duration) - time.monotonic()))
        stop.set()
        scraper.join(args.scrape_timeout + 1)
        report = summarize(samples, scraper, args.warmup, meta, complete=True)
        agent.stop(10.0)
        report["exit_status_after_sigterm"] = agent.exit_status
        report["stop_s"] = agent.stop_seconds
        if args.save:
            write_atomic(args.save, report)
        return report
    finally:
        stop.set()
        if agent is not None:
            agent.stop(10.0)
        state_dir.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    agent_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, agent_args = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(prog="soak.py", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=3600.0, help="measured seconds (default 3600)")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds before the growth baseline (default 120)")
    parser.add_argument("--scrape-interval", type=float, default=5.0, help="seconds between scrapes (default 5)")
    parser.add_argument("--sample-interval", type=float, default=5.0, help="seconds between psutil samples (default 5)")
    parser.add_argument("--scrape-timeout", type=float, default=10.0)
    parser.add_argument("--allow-unhealthy", action="store_true", help="treat /healthz 503 as ready")
    parser.add_argument("--save", type=Path, help="write the JSON report here, rewritten as the soak goes")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    args.agent_args = agent_args
    if args.duration <= 0 or args.scrape_interval <= 0 or args.sample_interval <= 0 or args.warmup < 0:
        parser.error("--duration, --scrape-interval and --sample-interval must be > 0, --warmup >= 0")
    report = run_guarded("soak", "the agent was stopped", lambda: run(args))
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "trace"}, indent=2))
    else:
        print(table(report))
    return 1 if report.get("scrape_errors") else 0


if __name__ == "__main__":
    sys.exit(main())
