#!/usr/bin/env python3
"""Which of an idle agent's threads wake, how often, and what they spend: where idle CPU goes, by thread.

Run by hand. Starts a whole agent in this process (the real `Agent` on a simulated node: scheduler, poll, event
thread, HTTP server; nobody scrapes), lets it settle for `--warmup` seconds, then reads each thread's voluntary
context switches (every time it blocked: one per wake of a thread that sleeps on a timer) and its CPU ticks from
/proc/self/task/TID over `--duration` seconds. On a small VM each wake of a thread costs ~0.1 ms of CPU by itself
(`time.sleep(0.02)` in a loop: ~70 µs a call here), so a thread that wakes for nothing shows up in the idle column of
the peer table. The main thread (this script) sleeps throughout and is left out.

    python benchmarks/wakeups.py                      # 1 GPU, 60 s
    python benchmarks/wakeups.py --gpus 8 --duration 120
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from gpuwatch.config.settings import load_config
from gpuwatch.service.agent import Agent
from gpuwatch.simulated.node import simulated_sources

TICK_SECONDS = 1 / os.sysconf("SC_CLK_TCK")


def thread_counters(native_id: int) -> tuple[int, int]:
    """(voluntary context switches, user + system ticks) of one thread of this process."""
    task = Path(f"/proc/self/task/{native_id}")
    status = (task / "status").read_text().splitlines()
    switches = int(next(line.split()[1] for line in status if line.startswith("voluntary_ctxt_switches")))
    fields = (task / "stat").read_text().rpartition(")")[2].split()
    return switches, int(fields[11]) + int(fields[12])


def snapshot() -> dict[int, tuple[str, int, int]]:
    out = {}
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.native_id is None:
            continue
        try:
            out[thread.native_id] = (thread.name, *thread_counters(thread.native_id))
        except (FileNotFoundError, StopIteration):  # ended meanwhile
            continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="wakeups.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwatch-wakeups-") as state:
        overrides = {
            "agent": {
                "backend": "simulated",
                "state_dir": state,
                "listen": "127.0.0.1:0",
                "poll_interval_seconds": args.poll_interval,
            },
            "simulated": {"scenario": args.scenario, "gpus": args.gpus},
        }
        config = load_config(None, overrides)
        agent = Agent(config, simulated_sources(config))
        agent.start()
        try:
            time.sleep(args.warmup)
            before = snapshot()
            time.sleep(args.duration)
            after = snapshot()
        finally:
            agent.stop()
    print(f"{args.gpus} GPU(s), {args.scenario}, poll every {args.poll_interval:g} s, idle for {args.duration:g} s:")
    print(f"  {'thread':28s} {'wakes/s':>8s} {'CPU ms/min':>11s}")
    total_wakes = total_ticks = 0
    for native_id, (name, switches, ticks) in sorted(after.items(), key=lambda item: item[1][0]):
        first = before.get(native_id)
        if first is None:
            continue  # started during the window: a connection or a probe, not the idle agent's
        wakes, spent = switches - first[1], ticks - first[2]
        total_wakes, total_ticks = total_wakes + wakes, total_ticks + spent
        print(f"  {name:28s} {wakes / args.duration:8.2f} {spent * TICK_SECONDS * 60e3 / args.duration:11.0f}")
    rate, cpu = total_wakes / args.duration, total_ticks * TICK_SECONDS * 60e3 / args.duration
    print(f"  {'all':28s} {rate:8.2f} {cpu:11.0f}")


if __name__ == "__main__":
    main()
