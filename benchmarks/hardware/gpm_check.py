#!/usr/bin/env python3
"""Issue 17's hardware check: real utilization (NVML GPM) read by gpuwatch's own NVML backend beside a running matmul.

Read-only on the GPU (it changes no setting). Phases on GPU --gpu:

1. idle, --idle s: the backend polled every second; SM and tensor activity should read ~0;
2. busy, --busy s: a bf16 8192x8192 matmul loop in a child process (torch), polled the same way after a 5 s warm-up;
   SM active and tensor active should read >= 0.9 (docs/reading-the-metrics.md, "To check on real hardware").

Also: the seconds counter's increase over each phase against the mean of the gauges (the same share two ways), and,
where the driver has the since-reboot counters (NVML 13.2+), the SM cycle counter's rate against the SM clock (does
NVML count per GPU or summed over SMs? nvml.h does not say). Everything raw goes to --out (JSON), the verdicts to
--markdown. `--dry-run` runs the same flow over the simulated node (idle: healthy; busy: training) without a GPU;
a training job is no pure matmul (tensor ~0.8), so its tensor check fails there, as expected. Exit 1 on a FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpuwatch.backends.nvml import NvmlBackend, load_pynvml  # noqa: E402

MATMUL = """
import sys, time, torch
end = time.time() + float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
n = 0
while time.time() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    n += 10
print(f"matmuls: {n}")
"""


def backend(dry_run: bool, scenario: str) -> NvmlBackend:
    if dry_run:
        from gpuwatch.simulated.bindings import simulated_pynvml
        from gpuwatch.simulated.scenarios import SimulatedNode

        return NvmlBackend(simulated_pynvml(SimulatedNode(scenario, gpus=1)))
    return NvmlBackend(load_pynvml())


def phase(nvml: NvmlBackend, gpu: int, seconds: float, warmup: float) -> dict[str, Any]:
    """Poll every second for `seconds`; keep the readings after `warmup`."""
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    polls = 0
    while time.monotonic() - start < seconds:
        readings = nvml.poll(slow=polls == 0)
        polls += 1
        sample = readings[gpu].sample if gpu < len(readings) else None
        if sample is not None and time.monotonic() - start >= warmup:
            row = {
                "t": time.monotonic() - start,
                "utilization": sample.utilization_ratio,
                "sm_active": sample.sm_active_ratio,
                "sm_occupancy": sample.sm_occupancy_ratio,
                "tensor_active": sample.tensor_active_ratio,
                "dram_active": sample.dram_active_ratio,
                "pipes": dict(sample.pipe_active_ratio),
                "sm_active_seconds": sample.active_seconds_total.get("sm"),
                "sm_cycles": sample.sm_cycles_total,
                "sm_clock_hz": sample.clock_hertz.get("sm"),
            }
            rows.append(row)
        time.sleep(1.0)
    return {"rows": rows, **summary(rows)}


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {key: _median(rows, key) for key in ("utilization", "sm_active", "tensor_active")}
    out["hmma"] = statistics.median([r["pipes"].get("hmma", 0.0) for r in rows]) if rows else None
    timed = [r for r in rows if r["sm_active_seconds"] is not None]
    if len(timed) >= 2:
        span = timed[-1]["t"] - timed[0]["t"]
        out["sm_active_from_counter"] = (timed[-1]["sm_active_seconds"] - timed[0]["sm_active_seconds"]) / span
        out["sm_active_gauge_mean"] = statistics.mean(r["sm_active"] for r in timed[1:] if r["sm_active"] is not None)
    cycles = [r for r in rows if r["sm_cycles"] is not None and r["sm_clock_hz"]]
    if len(cycles) >= 2:
        rate = (cycles[-1]["sm_cycles"] - cycles[0]["sm_cycles"]) / (cycles[-1]["t"] - cycles[0]["t"])
        out["sm_cycles_per_second_over_sm_clock"] = rate / statistics.mean(r["sm_clock_hz"] for r in cycles)
    return out


def verdicts(idle: dict[str, Any], busy: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    def at_least(value: float | None, floor: float) -> bool | None:
        return None if value is None else value >= floor

    def at_most(value: float | None, ceiling: float) -> bool | None:
        return None if value is None else value <= ceiling

    checks = [
        ("busy: tensor active >= 0.9", f"{busy.get('tensor_active')}", at_least(busy.get("tensor_active"), 0.9)),
        ("busy: SM active >= 0.9", f"{busy.get('sm_active')}", at_least(busy.get("sm_active"), 0.9)),
        ("busy: hmma within 0.05 of tensor", f"{busy.get('hmma')}", None),
        ("idle: SM active <= 0.05", f"{idle.get('sm_active')}", at_most(idle.get("sm_active"), 0.05)),
    ]
    if busy.get("hmma") is not None and busy.get("tensor_active") is not None:
        checks[2] = (checks[2][0], checks[2][1], abs(busy["hmma"] - busy["tensor_active"]) <= 0.05)
    for name, data in (("idle", idle), ("busy", busy)):
        if "sm_active_from_counter" in data:
            diff = abs(data["sm_active_from_counter"] - data["sm_active_gauge_mean"])
            checks.append((f"{name}: counter rate within 0.02 of the gauges' mean", f"{diff:.4f}", diff <= 0.02))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--idle", type=float, default=12.0)
    parser.add_argument("--busy", type=float, default=25.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"gpu": args.gpu, "dry_run": args.dry_run}
    nvml = backend(args.dry_run, "healthy")
    nvml.open()
    try:
        report["activity_support"] = nvml.activity_support()
        report["versions"] = nvml.versions()
        report["idle"] = phase(nvml, args.gpu, args.idle, warmup=2.0)
        if args.dry_run:  # the simulated node cannot start a job: the busy phase reads a training node
            nvml.close()
            nvml = backend(True, "training")
            nvml.open()
            child = None
        else:
            cmd = [sys.executable, "-c", MATMUL, str(args.busy + 5)]
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.gpu)}
            child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        report["busy"] = phase(nvml, args.gpu, args.busy, warmup=5.0)
        if child is not None:
            report["matmul_output"] = child.communicate(timeout=60)[0][-2000:]
    finally:
        nvml.close()
    checks = verdicts(report["idle"], report["busy"])
    report["verdicts"] = [{"check": c, "value": v, "ok": ok} for c, v, ok in checks]
    args.out.write_text(json.dumps(report, indent=1, default=str))
    lines = ["", "## Real utilization (NVML GPM) beside a matmul", "", "| check | value | verdict |", "|---|---|---|"]
    lines += [f"| {c} | {v} | {'ok' if ok else 'n/a' if ok is None else 'FAIL'} |" for c, v, ok in checks]
    ratio = report["busy"].get("sm_cycles_per_second_over_sm_clock")
    lines.append(f"\nSM cycle counter rate / SM clock (NVML 13.2+ only): {ratio}")
    text = "\n".join(lines) + "\n"
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    return 0 if all(ok is not False for _, _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
