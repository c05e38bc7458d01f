#!/usr/bin/env python3
"""The /metrics render of one store snapshot, per series: what a cache-miss scrape spends before the first byte.

Run by hand. An in-process agent on a simulated node (the real backend and pynvml over the simulated libnvidia-ml,
host sensors, the probe's counters) polls twice; then each way of turning its snapshot into the text exposition is
timed `--repeat` times in this thread's CPU time (best of `--rounds`, interleaved: the least disturbed by a
shared machine):

- library: prometheus_client's own generate_latest over gpuwatch's collector (the oracle);
- objects: gpuwatch.exporter.families (prometheus_client Metric objects) + exposition_fast.render (before #19);
- lines: gpuwatch.exporter.export into exposition_fast.SeriesLines (the agent's path since #19).

All three bodies are checked to be the same bytes.

    python benchmarks/render.py                       # 8 GPUs, healthy
    python benchmarks/render.py --gpus 64 --scenario mixed
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

from gpuwatch.agent import Agent
from gpuwatch.config import load_config
from gpuwatch.exporter import GpuwatchCollector, export, families
from gpuwatch.exposition_fast import SeriesLines, render
from gpuwatch.simulation import simulated_sources


def best_us(ways: dict[str, Callable[[], bytes]], repeat: int, rounds: int) -> dict[str, float]:
    """Each way's best mean over `rounds` rounds of `repeat` calls, the ways interleaved round by round; in this
    thread's CPU time, so time the machine gave other processes is not counted."""
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for name, work in ways.items():
            started = time.thread_time()
            for _ in range(repeat):
                work()
            best[name] = min(best[name], (time.thread_time() - started) / repeat)
    return {name: seconds * 1e6 for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="render.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwatch-render-") as state:
        overrides = {
            "agent": {"backend": "simulated", "state_dir": state},
            "simulated": {"scenario": args.scenario, "gpus": args.gpus},
        }
        config = load_config(None, overrides)
        agent = Agent(config, simulated_sources(config))
        agent.collectors.register(threads=False)
        for _ in range(2):
            agent.poll_once()
            for job in agent.collectors.jobs():
                if job.startswith("host-"):
                    agent.collectors.run_job(job)
        snap = agent.store.snapshot()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GpuwatchCollector(agent.store))

        def lines() -> bytes:
            out = SeriesLines()
            export(snap, out)
            return out.body("text")

        def objects() -> bytes:
            return render(families(snap), "text") or b""

        def library() -> bytes:
            return generate_latest(registry)

        body = lines()
        if not body == objects() == library():
            raise SystemExit("render.py: the three bodies differ")
        series = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
        print(f"{args.gpus} GPUs, {args.scenario}: {series} series, {len(body)} bytes")
        ways = {"library": library, "objects": objects, "lines": lines}
        for name, us in best_us(ways, args.repeat, args.rounds).items():
            print(f"  {name:8s} {us / 1000:7.3f} ms  {us / series:6.3f} µs per series")


if __name__ == "__main__":
    main()
