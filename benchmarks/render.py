#!/usr/bin/env python3
"""The /metrics render of one store snapshot, per series: what a cache-miss scrape spends before the first byte.

Run by hand. An in-process agent on a simulated node (the real backend and pynvml over the simulated libnvidia-ml,
host sensors, the probe's counters) polls `--repeat` times a round; after each poll every way of turning the new
snapshot into the text exposition renders it once, timed in this thread's CPU time (best round of `--rounds`: the
least disturbed by a shared machine). Each render is of readings the agent has not rendered before, as a scrape's
after a poll is (what `lines` remembers, prefixes and numbers, comes from earlier polls):

- library: prometheus_client's own generate_latest over gpuwatch's collector (the oracle);
- objects: gpuwatch.exposition.exporter.families (prometheus_client Metric objects) + exposition.fast.render
  (before #19);
- lines: gpuwatch.exposition.exporter.export into exposition_fast.SeriesLines (the agent's path since #19).

Every poll's three bodies are checked to be the same bytes.

    python benchmarks/render.py                       # 8 GPUs, healthy
    python benchmarks/render.py --gpus 64 --scenario mixed
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuwatch.config.settings import load_config
from gpuwatch.exposition.exporter import export, families
from gpuwatch.exposition.fast import SeriesLines, render
from gpuwatch.service.agent import Agent
from gpuwatch.simulated.node import simulated_sources
from gpuwatch.state.store import StoreSnapshot


class _SnapshotCollector(Collector):
    """The families of one fixed snapshot: every arm renders the same samples, however long the rounds take."""

    def __init__(self, snap: StoreSnapshot) -> None:
        self._snap = snap

    def collect(self) -> Iterator[Metric]:
        return families(self._snap)


Way = Callable[[StoreSnapshot], bytes]


def best_us(agent: Agent, ways: dict[str, Way], repeat: int, rounds: int) -> tuple[dict[str, float], int, int]:
    """Each way's best mean over `rounds` rounds of `repeat` fresh polls, every way rendering each poll's snapshot
    once (in this thread's CPU time, so time the machine gave other processes is not counted), and the bodies
    checked to be the same bytes. Also: the series and bytes of the last body."""
    best = dict.fromkeys(ways, float("inf"))
    body = b""
    for _ in range(rounds):
        spent = dict.fromkeys(ways, 0.0)
        for _ in range(repeat):
            snap = _polled(agent)
            bodies = set()
            for name, work in ways.items():  # `lines` first: what it remembers comes from earlier polls only
                started = time.thread_time()
                body = work(snap)
                spent[name] += time.thread_time() - started
                bodies.add(body)
            if len(bodies) != 1:
                raise SystemExit("render.py: the bodies differ")
        for name, seconds in spent.items():
            best[name] = min(best[name], seconds / repeat)
    series = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
    return {name: seconds * 1e6 for name, seconds in best.items()}, series, len(body)


def _polled(agent: Agent) -> StoreSnapshot:
    """The store after one more poll of the GPUs and the host sensors: new readings, as a scrape after a poll sees."""
    agent.poll_once()
    for job in agent.collectors.jobs():
        if job.startswith("host-"):
            agent.collectors.run_job(job)
    return agent.store.snapshot()


def lines(snap: StoreSnapshot) -> bytes:
    out = SeriesLines()
    export(snap, out)
    return out.body("text")


def objects(snap: StoreSnapshot) -> bytes:
    return render(families(snap), "text") or b""


def library(snap: StoreSnapshot) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap))
    return generate_latest(registry)


def main() -> None:
    parser = argparse.ArgumentParser(prog="render.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwatch-render-") as state:
        overrides = {
            "agent": {"backend": "simulated", "state_dir": state},
            "simulated": {"scenario": args.scenario, "gpus": args.gpus},
        }
        config = load_config(None, overrides)
        agent = Agent(config, simulated_sources(config))
        agent.collectors.register(threads=False)
        _polled(agent)
        ways: dict[str, Way] = {"lines": lines, "objects": objects, "library": library}
        best, series, size = best_us(agent, ways, args.repeat, args.rounds)
        print(f"{args.gpus} GPUs, {args.scenario}: {series} series, {size} bytes")
        for name, us in best.items():
            print(f"  {name:8s} {us / 1000:7.3f} ms  {us / series:6.3f} µs per series")


if __name__ == "__main__":
    main()
