#!/usr/bin/env python3
"""How often the probe's checked result (gpuwatch/probe/checksum.py) calls a healthy matmul wrong, and whether it
sees a corrupted one: many checks of healthy results through the production engines, each on fresh random inputs.

Run by hand (never by the test suite). For each engine, dtype and size it draws `--seeds` input pairs, runs the
engine's matmul, checks the result as the worker does, then corrupts one element (the worker's --corrupt-elements
hook: CORRUPT_SCALE·‖C[:,j]‖₂ added) and checks again. It reports the false alarms (healthy results called wrong),
the worst and the 99th percentile of each check's worst |difference|/tolerance (how close a healthy result came to
an alarm: the margin), the tolerance relative to a column's norm, and how many corrupted results were caught.

The tolerance's false-alarm probability is 1e-9 per probe by construction, far below what any run can measure: a
run shows 0 alarms and, more usefully, the margin. Never loosen the tolerance after seeing these figures.

    python benchmarks/probe_check_false_alarms.py                         # CPU torch: 3 dtypes x 256/1024, 200 seeds
    python benchmarks/probe_check_false_alarms.py --device gpu --sizes 8192 --seeds 300 --engines torch cupy
    python benchmarks/probe_check_false_alarms.py --json                  # machine-readable
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from gpuwatch.probe.checksum import CORRUPT_SCALE, FALSE_ALARM_PROBABILITY
from gpuwatch.probe.engines import CupyEngine, Engine, NoEngine, TorchEngine


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--engines", nargs="+", choices=("torch", "cupy"), default=["torch"])
    p.add_argument("--dtypes", nargs="+", choices=("bf16", "fp16", "fp32"), default=["bf16", "fp16", "fp32"])
    p.add_argument("--sizes", nargs="+", type=int, default=[256, 1024])
    p.add_argument("--seeds", type=int, default=200, help="healthy checks per engine, dtype and size")
    p.add_argument("--corrupted", type=int, default=20, help="of those, how many are also checked corrupted")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.corrupted < 0 or any(n < 2 for n in args.sizes):
        p.error("--seeds must be at least 1, --corrupted 0 or more, every --sizes at least 2")
    return args


def new_engine(name: str, device: str) -> Engine:
    if name == "cupy":
        if device != "gpu":
            raise NoEngine("CuPy needs a GPU")
        return CupyEngine()
    return TorchEngine(device)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def study(engine: Engine, dtype: str, n: int, seeds: int, corrupted: int) -> dict[str, Any]:
    """`seeds` healthy checks (and `corrupted` corrupted ones) of one engine, dtype and size."""
    excess: list[float] = []
    relative_tolerance: list[float] = []
    alarms = 0
    caught = 0
    check_seconds: list[float] = []
    for seed in range(seeds):
        engine.prepare(n, dtype, seed=seed)  # draws the inputs and runs one matmul: the result checked
        result = engine.check()
        check_seconds.append(result.seconds)
        alarms += 0 if result.ok else 1
        excess.append(result.worst_excess)
        # The probe's inputs are standard normal: ‖C[:,j]‖₂ ≈ n, so tolerance/n is tolerance/‖C[:,j]‖₂.
        relative_tolerance.append(result.worst_tolerance / n)
        if seed < corrupted:
            engine.corrupt(1)
            caught += 0 if engine.check().ok else 1
    return {
        "engine": engine.name,
        "engine_version": engine.version,
        "blas_version": engine.blas_version,
        "device": engine.device,
        "dtype": dtype,
        "n": n,
        "checks": seeds,
        "false_alarms": alarms,
        "worst_excess_max": max(excess),
        "worst_excess_p99": quantile(excess, 0.99),
        "worst_excess_median": quantile(excess, 0.5),
        "tolerance_over_column_norm": quantile(relative_tolerance, 0.5),
        "corrupted_checks": min(corrupted, seeds),
        "corrupted_caught": caught,
        "check_seconds_median": quantile(check_seconds, 0.5),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    started = time.time()
    for name in args.engines:
        try:
            engine = new_engine(name, args.device)
        except (NoEngine, ImportError) as exc:
            skipped.append(f"{name}: {exc}")
            continue
        for dtype in args.dtypes:
            for n in args.sizes:
                rows.append(study(engine, dtype, n, args.seeds, args.corrupted))
                if not args.json:
                    print(f"  done: {name} {dtype} n={n}", file=sys.stderr)
    doc = {
        "false_alarm_probability_per_probe": FALSE_ALARM_PROBABILITY,
        "corrupt_scale": CORRUPT_SCALE,
        "rows": rows,
        "skipped": skipped,
        "seconds": time.time() - started,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_table(doc)
    total = sum(r["false_alarms"] for r in rows)
    missed = sum(r["corrupted_checks"] - r["corrupted_caught"] for r in rows)
    return 1 if not rows or total or missed else 0


def print_table(doc: dict[str, Any]) -> None:
    print(f"false-alarm probability per probe (by construction): {doc['false_alarm_probability_per_probe']:g}")
    print(
        "| engine | device | dtype | n | checks | false alarms | worst excess (max / p99 / median) | "
        "tolerance / ‖C[:,j]‖ | corrupted caught | check (ms) |"
    )
    print("|---|---|---|---:|---:|---:|---|---:|---|---:|")
    for r in doc["rows"]:
        print(
            f"| {r['engine']} {r['engine_version']} | {r['device']} | {r['dtype']} | {r['n']} | {r['checks']} | "
            f"{r['false_alarms']} | {r['worst_excess_max']:.3f} / {r['worst_excess_p99']:.3f} / "
            f"{r['worst_excess_median']:.3f} | {r['tolerance_over_column_norm']:.3g} | "
            f"{r['corrupted_caught']} of {r['corrupted_checks']} | {r['check_seconds_median'] * 1000:.1f} |"
        )
    checks = sum(r["checks"] for r in doc["rows"])
    alarms = sum(r["false_alarms"] for r in doc["rows"])
    worst = max((r["worst_excess_max"] for r in doc["rows"]), default=math.nan)
    print(f"\n{alarms} false alarms in {checks} healthy checks; the closest came to {worst:.3f} of its tolerance")
    for line in doc["skipped"]:
        print(f"skipped {line}")


if __name__ == "__main__":
    sys.exit(main())
