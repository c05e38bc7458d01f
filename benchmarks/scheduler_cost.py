#!/usr/bin/env python3
"""What one run of a scheduled job costs in APScheduler itself, with the agent's job defaults, an empty job.

Run by hand. A BackgroundScheduler as gpuwatch.service.scheduling.Collectors.start_scheduler makes it (one instance a
job, missed runs coalesced) runs a job that does nothing every `--interval` seconds for `--duration` seconds; the
process's CPU (user + system, 10 ms ticks: keep the runs many) over the runs is divided by their number. The agent's
poll is such a job every poll interval, so this is what its scheduling costs a node per poll, before any GPU is read.
`--executor inline` runs jobs in the scheduler's own thread (APScheduler's DebugExecutor): the difference to `pool`
is the hand-over to the worker thread.

    python benchmarks/scheduler_cost.py                  # every 0.02 s for 10 s, pool and inline
    python benchmarks/scheduler_cost.py --interval 1 --duration 120
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from apscheduler.executors.debug import DebugExecutor
from apscheduler.schedulers.background import BackgroundScheduler


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def per_run_us(executor: str, interval: float, duration: float) -> tuple[int, float]:
    runs = [0]

    def job() -> None:
        runs[0] += 1

    options: dict[str, Any] = {"job_defaults": {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}}
    if executor == "inline":
        options["executors"] = {"default": DebugExecutor()}
    scheduler = BackgroundScheduler(**options)
    scheduler.add_job(job, "interval", seconds=interval, id="job")
    scheduler.start()
    try:
        time.sleep(min(1.0, interval * 5))  # past the first runs' warm-up
        started, counted = cpu_seconds(), runs[0]
        time.sleep(duration)
        spent, done = cpu_seconds() - started, runs[0] - counted
    finally:
        scheduler.shutdown(wait=True)
    return done, spent / max(done, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="scheduler_cost.py", description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--executor", choices=("pool", "inline", "both"), default="both")
    args = parser.parse_args()
    for executor in ("pool", "inline") if args.executor == "both" else (args.executor,):
        runs, us = per_run_us(executor, args.interval, args.duration)
        print(f"{executor:6s} every {args.interval:g} s: {runs} runs, {us:.0f} µs of CPU per run")


if __name__ == "__main__":
    main()
