#!/usr/bin/env python3
"""gpuwatch beside nvitop-exporter on the same simulated GPUs: ratios gpuwatch / nvitop-exporter, alternating runs.

Run by hand, never by the test suite or CI. Both exporters run NVIDIA's real `pynvml` over gpuwatch's simulated
libnvidia-ml (healthy node, 1 s poll / update); nvitop-exporter runs in a virtualenv of its own through the launcher
`peer_nvitop.py`. For each GPU count, `--rounds` rounds; each round measures both exporters one after the other (the
order alternates between rounds, never both at once: they would share the CPU), each as:

- ready, then `--warmup` s of one scrape a second;
- idle: `--idle` s with no scrape: CPU s per minute;
- 1/s: `--duration` s of one scrape a second (a fresh connection each, as Prometheus does): series, scrape p50,
  CPU s per minute, RSS at the end;
- burst: `--burst-duration` s of `--burst` scrapers firing together each second: p99 (a scrape that fails or
  times out counts as `--scrape-timeout`, and the failures are counted).

The gpuwatch arm runs `python -m gpuwatch` with this environment, so PYTHONPATH chooses which gpuwatch (a checkout of
an older commit, for a before/after); nvitop-exporter always runs on this checkout's simulated library.

It prints, per GPU count, both exporters' medians and the ratio's min / median / max over the rounds (the machine is
shared and noisy: read the ratios, not the absolute numbers alone).

    python benchmarks/peer.py                                     # 1, 8, 64 GPUs; 3 rounds
    python benchmarks/peer.py --gpus 8 --rounds 3 --save /tmp/peer.json
    python benchmarks/peer.py --peer-venv /opt/nvitop-venv        # or GPUWATCH_PEER_VENV=/opt/nvitop-venv

The peer virtualenv (`--peer-venv`, env GPUWATCH_PEER_VENV, default ~/.cache/gpuwatch-bench/nvitop-venv) is created
when it has no python: `python3 -m venv`, then `pip install nvitop-exporter==<--nvitop-version>` and the
nvidia-ml-py gpuwatch runs with (the same vendor Python on both sides). It is never gpuwatch's own environment.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cost import (
    MIB,
    Agent,
    BenchmarkError,
    Scraper,
    Target,
    agent_argv,
    count_series,
    percentile,
    run_guarded,
    scrape,
    snapshot,
    wait_ready,
)

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = Path.home() / ".cache" / "gpuwatch-bench" / "nvitop-venv"
VENV_ENV = "GPUWATCH_PEER_VENV"
ARMS = ("gpuwatch", "nvitop-exporter")
# (key, row title, format)
ROWS: tuple[tuple[str, str, str], ...] = (
    ("series", "series", "{:.0f}"),
    ("p50_ms", "scrape p50 at 1/s (ms)", "{:.2f}"),
    ("cpu_1s", "CPU at 1 scrape/s (s/min)", "{:.3f}"),
    ("cpu_idle", "CPU idle, no scrapes (s/min)", "{:.3f}"),
    ("rss_mib", "RSS (MiB)", "{:.1f}"),
    ("burst_p99_ms", "burst scrapers: p99 (ms)", "{:.1f}"),
)


def peer_python(venv: Path, nvitop_version: str) -> Path:
    """The peer venv's python, created (venv + pip) when missing."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    ml_py = importlib.metadata.version("nvidia-ml-py")
    print(f"creating {venv}: nvitop-exporter=={nvitop_version}, nvidia-ml-py=={ml_py}", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"nvitop-exporter=={nvitop_version}", f"nvidia-ml-py=={ml_py}"], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BenchmarkError(f"cannot create the peer venv {venv}: {exc} (give one with --peer-venv)") from None
    return python


def command(arm: str, gpus: int, python: Path) -> tuple[str, list[str]]:
    """agent_cost's --agent-cmd and agent args for one arm."""
    if arm == "gpuwatch":
        flags = ["--backend", "simulated", "--scenario", "healthy", "--gpus", str(gpus), "--poll-interval", "1"]
        return "{python} -m gpuwatch run --log-level warning", flags
    launcher = f"{python} {HERE / 'peer_nvitop.py'} --gpus {gpus} --scenario healthy --"
    return launcher + " --bind-address 127.0.0.1 --port {port} --interval 1", []


def scrape_window(target: Target, seconds: float, scrapers: int) -> tuple[list[float], int, bytes | None]:
    """`scrapers` scrapers at 1/s each for `seconds`: latencies (ms, sorted; a failed scrape counts as the scrape
    timeout), how many failed, and the last body."""
    stop = threading.Event()
    t0 = time.perf_counter() + 0.05
    threads = [Scraper(target, t0, 1.0, t0 + seconds, stop) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = [r for t in threads for r in t.results]
    failed = sum(1 for r in results if r.error is not None)
    latencies = sorted((r.seconds if r.error is None else max(r.seconds, target.timeout)) * 1000 for r in results)
    return latencies, failed, next((t.last_body for t in threads if t.last_body is not None), None)


def cpu_per_minute(proc: psutil.Process, work: Callable[[], Any]) -> tuple[float, Any]:
    before = snapshot(proc)
    out = work()
    after = snapshot(proc)
    return (after.cpu_seconds - before.cpu_seconds) / (after.at - before.at) * 60, out


def measure(arm: str, gpus: int, python: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd, flags = command(arm, gpus, python)
    with tempfile.TemporaryDirectory(prefix="gpuwatch-peer-") as state:
        argv, base, is_gpuwatch = agent_argv(cmd, flags, state)
        agent = Agent(argv)
        try:
            target = Target(base + "/metrics", False, args.scrape_timeout)
            wait_ready(target.with_path("/healthz") if is_gpuwatch else target, agent, 120.0, False)
            proc = psutil.Process(agent.popen.pid)
            deadline = time.monotonic() + args.warmup
            while time.monotonic() < deadline:
                scrape(target)
                time.sleep(1.0)
            idle, _ = cpu_per_minute(proc, lambda: time.sleep(args.idle))
            cpu_1s, (latencies, failed, body) = cpu_per_minute(proc, lambda: scrape_window(target, args.duration, 1))
            rss = proc.memory_info().rss / MIB
            burst, burst_failed, _ = scrape_window(target, args.burst_duration, args.burst)
            if agent.exited() is not None:
                raise BenchmarkError(f"{arm} exited during the run:\n{agent.output()}")
        finally:
            agent.stop(5.0)
    series = count_series(body)[0] if body else 0
    return {
        "series": series,
        "p50_ms": percentile(latencies, 0.5),
        "cpu_1s": cpu_1s,
        "cpu_idle": idle,
        "rss_mib": rss,
        "burst_p99_ms": percentile(burst, 0.99),
        "failed_scrapes": failed + burst_failed,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    python = peer_python(args.peer_venv, args.nvitop_version)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "host": f"{psutil.cpu_count()} CPUs",
        "settings": {k: v for k, v in vars(args).items() if k not in ("save", "json", "peer_venv")},
        "gpus": {},
    }
    for gpus in args.gpus:
        runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
        for round_ in range(args.rounds):
            for arm in ARMS if round_ % 2 == 0 else ARMS[::-1]:
                print(f"{gpus} GPUs, round {round_ + 1}/{args.rounds}: {arm}", file=sys.stderr)
                runs[arm].append(measure(arm, gpus, python, args))
                report["gpus"][str(gpus)] = runs
                if args.save:  # after every run, so an interrupted benchmark keeps what it measured
                    args.save.write_text(json.dumps(report, indent=2) + "\n")
    return report


def summary(report: dict[str, Any]) -> str:
    lines = []
    for gpus, runs in report["gpus"].items():
        gw, nv = runs["gpuwatch"], runs["nvitop-exporter"]
        lines += [
            f"\n| {gpus} GPU(s), {len(gw)} rounds | gpuwatch (median) | nvitop-exporter (median) | "
            "ratio min / median / max |",
            "|---|---|---|---|",
        ]
        for key, title, fmt in ROWS:
            ratios = sorted(a[key] / b[key] for a, b in zip(gw, nv, strict=True) if b[key])
            r = " / ".join(f"{x:.2f}" for x in (ratios[0], statistics.median(ratios), ratios[-1])) if ratios else "-"
            a = fmt.format(statistics.median(x[key] for x in gw))
            b = fmt.format(statistics.median(x[key] for x in nv))
            lines.append(f"| {title} | {a} | {b} | {r} |")
        failed = {arm: sum(int(x.get("failed_scrapes", 0)) for x in runs[arm]) for arm in ARMS}
        if any(failed.values()):
            lines.append(f"\nfailed scrapes (counted at the scrape timeout): {failed}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="peer.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 64], help="GPU counts (default 1 8 64)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of 1/s scrapes before measuring")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds with no scrape (default 30)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds at 1 scrape/s (default 30)")
    parser.add_argument("--burst", type=int, default=20, help="concurrent scrapers in the burst (default 20)")
    parser.add_argument("--burst-duration", type=float, default=10.0, help="seconds of bursts (default 10)")
    parser.add_argument("--scrape-timeout", type=float, default=10.0, help="per scrape, as Prometheus' (default 10)")
    parser.add_argument(
        "--peer-venv",
        type=Path,
        default=Path(os.environ.get(VENV_ENV) or DEFAULT_VENV),
        help=f"nvitop-exporter's virtualenv, created if missing (env {VENV_ENV}; default {DEFAULT_VENV})",
    )
    parser.add_argument("--nvitop-version", default="1.7.2", help="nvitop-exporter to install (default 1.7.2)")
    parser.add_argument("--save", type=Path, help="also write the JSON report here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    if args.rounds < 1 or min(args.gpus) < 1 or args.duration <= 0 or args.idle <= 0:
        parser.error("--rounds, --gpus, --duration and --idle must be positive")
    report = run_guarded("peer", "the exporters were stopped", lambda: run(args))
    if args.save:
        args.save.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
