#!/usr/bin/env python3
"""Issue #36's "CV floor": where the idle probe's spread comes from, and what a probe can reach at a power cap.

The H100 run (README, "Results: H100 80GB HBM3") measured an idle-probe CV of 0.61-0.83 % against #4's goal of
0.5 %, with the SM clock swinging 1282-1467 MHz between probes at the power cap. This study asks which of three
suspects makes the spread, in one pass on the GPU (read-only: it changes no GPU setting):

- **the clock at the cap**: each trial's throughput beside its mean SM clock over the same window: if throughput per
  MHz repeats much tighter than throughput, the spread is the clock's (the power management's, not the probe's);
- **where the warm-up ends**: the time from the first matmul to the power cap (clocks event reason SW power cap), and
  the window the probe would have measured (from the cap, at least 0.5 s and at most 1.5 s in, for 1 s: the worker's
  `--warmup-min`/`--warmup-max`/`--measure`, gpuwatch/probe/worker.py);
- **the measured window**: the same trials cut into other windows (later starts, longer lengths): the CV each would
  have given.

One child holds the probe's own engine (gpuwatch.probe.engines, `auto`: CuPy's cuBLAS on NVIDIA when installed, as
the agent's probe) for the whole study. Each trial waits until the GPU is idle and cool (probe_study.wait_idle), then
the child times every matmul from the first one for --run seconds on the device (engine.timed: an event around each)
while this process reads the SM clock, power, temperature and clocks event reasons every --sample-ms. Trial 1 is
left out of the statistics, as #4's "idle probes 2..N" leaves out the first probe.

Writes one JSON (--out: every trial's matmul times and samples) and a Markdown summary (--markdown, also printed).
`--dry-run` runs the same flow on the CPU (torch at a small size, the simulated node's readings), so a slip in this
script costs no device time. Exit status 0 when every trial measured, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # the kit's scripts, and gpuwatch from this checkout
import probe_study as study  # noqa: E402  (the idle wait, the readers and the child handling, shared)

from gpuwatch.probe.worker import build_parser as build_worker_parser  # noqa: E402

SW_POWER_CAP = study.SW_POWER_CAP
CAPPED_SHARE_OF_LIMIT = 0.98  # a sample at this share of the enforced limit counts as capped where reasons are absent
_WORKER = build_worker_parser().parse_args([])  # the probe worker's own defaults, so the two never drift apart
WORKER_WARMUP_MIN, WORKER_WARMUP_MAX, WORKER_MEASURE = _WORKER.warmup_min, _WORKER.warmup_max, _WORKER.measure
WINDOW_STARTS = (0.5, 1.0, 1.5, 2.0, 3.0)
WINDOW_LENGTHS = (0.5, 1.0, 2.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("cv_floor.json"))
    p.add_argument("--markdown", type=Path, help="also write the summary here")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (NVML order; default 0)")
    p.add_argument("--trials", type=int, default=10, help="idle trials (default 10; the first is left out)")
    p.add_argument("--run", type=float, default=4.0, help="seconds of matmuls per trial from cold (default 4)")
    p.add_argument("--idle-min", type=float, default=8.0, help="seconds between trials at least (default 8)")
    p.add_argument("--idle-max", type=float, default=20.0, help="give up waiting for idle and cool after (20)")
    p.add_argument("--sample-ms", type=float, default=20.0, help="NVML reading interval (default 20 ms)")
    p.add_argument("--engine", choices=("auto", "cupy", "torch"), default="auto", help="the probe's engine choice")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--python", default=sys.executable, help="interpreter of the engine child")
    p.add_argument("--dry-run", action="store_true", help="no GPU: torch on the CPU, the simulated node's readings")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help=argparse.SUPPRESS)
    return p


# --------------------------------------------------------------------------------------------------------------------
# The engine child: prepares once, then on each "go" line times every matmul for --run seconds from the first one.


def child(args: argparse.Namespace) -> int:
    from gpuwatch.probe import engines

    engine, passed_over = engines.prepared_engine(args.engine, "nvidia", args.device, args.size, args.dtype)
    t0 = time.perf_counter()
    engine.run(1)
    engine.synchronize()
    per = max(time.perf_counter() - t0, 1e-6)
    batch = max(1, min(512, int(engines.ITERATION_BATCH_SECONDS / per)))  # as the worker sizes its batches
    print(
        json.dumps(
            {
                "ready": True,
                "engine": engine.name,
                "engine_version": engine.version,
                "blas_version": engine.blas_version,
                "passed_over": passed_over,
                "batch": batch,
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        if line.strip() != "go":
            break
        started = time.monotonic()
        times = engine.timed(args.run, batch)
        print(json.dumps({"started": started, "ended": time.monotonic(), "times": times}), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------------------------
# Reading the GPU while a trial runs


def fast_sample(reader: study.GpuReader) -> dict[str, Any]:
    """The few readings the analysis needs, cheap enough to repeat every 20 ms (NvmlReader), or the simulated
    snapshot (the dry run: about one a second)."""
    if not isinstance(reader, study.NvmlReader) or not reader.available:
        s = reader.sample()
        return {
            "t": time.monotonic(),
            "sm_mhz": s.get("sm_clock_mhz"),
            "watts": s.get("power_watts"),
            "reasons": None,
            "temp_c": s.get("temperature_c"),
        }
    nv = reader._nv
    reasons = reader.clocks_event_reasons()
    power = reader._call("nvmlDeviceGetPowerUsage")
    return {
        "t": time.monotonic(),
        "sm_mhz": reader._call("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM),
        "watts": None if power is None else power / 1000,
        "reasons": reasons,
        "temp_c": reader._temperature(),
    }


class OwnContextExcluded(study.GpuReader):
    """The reader as the idle wait sees it, less the engine child's own CUDA context: the child lives through every
    trial, so NVML lists it as a compute process even while the GPU idles (it adds no utilization)."""

    def __init__(self, inner: study.GpuReader) -> None:
        super().__init__()
        self.inner, self.available, self.why = inner, inner.available, inner.why

    def sample(self) -> dict[str, Any]:
        s = dict(self.inner.sample())
        if s.get("compute_processes"):
            s["compute_processes"] -= 1
        return s


def next_json(stream: Any) -> dict[str, Any] | None:
    """The child's next JSON line (a library may print other lines first); None at its end."""
    for line in stream:
        doc = study.last_json(line)
        if doc is not None:
            return doc
    return None


class Sampler(threading.Thread):
    """Reads the GPU every `interval` s until stopped; the samples in order."""

    def __init__(self, reader: study.GpuReader, interval: float) -> None:
        super().__init__(name="cv-floor-sampler", daemon=True)
        self.reader, self.interval = reader, interval
        self.samples: list[dict[str, Any]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append(fast_sample(self.reader))
            self._stop_event.wait(self.interval)

    def stop(self) -> list[dict[str, Any]]:
        self._stop_event.set()
        self.join(timeout=10)
        return self.samples


# --------------------------------------------------------------------------------------------------------------------
# Analysis: the same trials cut into windows


def timeline(times: list[float], flop: float) -> list[tuple[float, float, float]]:
    """(start, end, FLOP/s) of each matmul, in seconds from the first one's start (back to back on the device)."""
    out, at = [], 0.0
    for t in times:
        if t > 0:
            out.append((at, at + t, flop / t))
        at += t
    return out


def capped(sample: dict[str, Any], limit_watts: float | None) -> bool:
    reasons, watts = sample.get("reasons"), sample.get("watts")
    if reasons is not None:
        return bool(reasons & SW_POWER_CAP)
    return limit_watts is not None and watts is not None and watts >= CAPPED_SHARE_OF_LIMIT * limit_watts


def window_of(trial: dict[str, Any], start: float, length: float) -> dict[str, Any] | None:
    """The trial's median throughput, mean SM clock and power over [start, start + length) s; None when the trial
    did not run that long."""
    rates = [r for a, b, r in trial["timeline"] if a >= start and b <= start + length]
    if not rates or trial["timeline"][-1][1] < start + length:
        return None
    inside = [s for s in trial["samples"] if start <= s["rel"] < start + length]
    mhz = [s["sm_mhz"] for s in inside if s.get("sm_mhz")]
    watts = [s["watts"] for s in inside if s.get("watts") is not None]
    rates.sort()
    median = statistics.median(rates)
    clock = statistics.fmean(mhz) if mhz else None
    return {
        "tflops": median / 1e12,
        "sm_mhz": clock,
        "sm_mhz_stdev": statistics.pstdev(mhz) if len(mhz) > 1 else None,
        "watts": statistics.fmean(watts) if watts else None,
        "tflops_per_ghz": None if not clock else median / 1e12 / (clock / 1000),
        "spread": (rates[int(0.9 * (len(rates) - 1))] - rates[int(0.1 * (len(rates) - 1))]) / median,
        "iterations": len(rates),
    }


def production_start(trial: dict[str, Any]) -> float:
    """Where the worker's measured window would have started: at the power cap, within its warm-up bounds."""
    cap = trial.get("seconds_to_cap")
    return WORKER_WARMUP_MAX if cap is None else min(max(cap, WORKER_WARMUP_MIN), WORKER_WARMUP_MAX)


def cv_pct(values: list[float]) -> float | None:
    """The sample CV in %, as the probe study gives it (probe_study.spread_stats)."""
    cv: float | None = study.spread_stats(values).get("cv_pct")
    return cv


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or len(xs) != len(ys):
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant column (the dry run's clock)
        return None


def row(name: str, windows: list[dict[str, Any] | None]) -> dict[str, Any]:
    got = [w for w in windows if w is not None]
    tflops = [w["tflops"] for w in got]
    mhz = [w["sm_mhz"] for w in got if w["sm_mhz"]]
    per_ghz = [w["tflops_per_ghz"] for w in got if w["tflops_per_ghz"]]
    return {
        "window": name,
        "trials": len(got),
        "tflops_mean": statistics.fmean(tflops) if tflops else None,
        "cv_pct": cv_pct(tflops),
        "cv_per_clock_pct": cv_pct(per_ghz) if len(per_ghz) == len(got) else None,
        "r_tflops_clock": pearson(tflops, mhz) if len(mhz) == len(got) else None,
        "sm_mhz_mean_range": [min(mhz), max(mhz)] if mhz else None,
        "sm_mhz_stdev_inside_median": study.median_or_none(
            [w["sm_mhz_stdev"] for w in got if w["sm_mhz_stdev"] is not None]
        ),
        "spread_inside_median": study.median_or_none([w["spread"] for w in got]),
    }


def analyse(trials: list[dict[str, Any]], run_seconds: float) -> list[dict[str, Any]]:
    used = [t for t in trials[1:] if t.get("timeline")]
    rows = [
        row(
            "the probe's own (from the cap, 0.5-1.5 s in, 1 s)",
            [window_of(t, production_start(t), WORKER_MEASURE) for t in used],
        )
    ]
    for start in WINDOW_STARTS:
        for length in WINDOW_LENGTHS:
            if start + length <= run_seconds - 0.05:
                rows.append(row(f"{start:g}-{start + length:g} s", [window_of(t, start, length) for t in used]))
    return rows


# --------------------------------------------------------------------------------------------------------------------


def run_trials(args: argparse.Namespace, reader: study.GpuReader, doc: dict[str, Any]) -> None:
    env = doc["environment"]
    pin = study.cuda_pin(env) if not args.dry_run else None
    argv = [args.python, str(Path(__file__).resolve()), "--child", "--engine", args.engine, "--size", str(args.size)]
    argv += ["--dtype", args.dtype, "--run", str(args.run), "--device", "cpu" if args.dry_run else "gpu"]
    proc = study.spawn(argv, study.child_env(pin), stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    ready = next_json(proc.stdout)
    if not ready or not ready.get("ready"):
        _, err = study.communicate(proc, 10)
        raise study.PhaseError(f"the engine child did not start: {study.tail(err, 500)}")
    doc["engine"] = ready
    flop = 2.0 * args.size**3
    limit = env.get("power_limit_enforced_watts")
    temp_ref = (env.get("now") or {}).get("temperature_c")
    last_end: float | None = None
    try:
        for i in range(args.trials):
            idle = study.wait_idle(OwnContextExcluded(reader), temp_ref, last_end, args.idle_min, args.idle_max)
            sampler = Sampler(reader, args.sample_ms / 1000)
            sampler.start()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            answer = next_json(proc.stdout)
            samples = sampler.stop()
            last_end = time.monotonic()
            if not answer or "times" not in answer:
                raise study.PhaseError(f"trial {i + 1}: the engine child stopped answering")
            started = answer["started"]
            for s in samples:
                s["rel"] = s["t"] - started
            cap = next((s["rel"] for s in samples if s["rel"] >= 0 and capped(s, limit)), None)
            trial = {
                "index": i + 1,
                "idle": idle,
                "times": answer["times"],
                "timeline": timeline(answer["times"], flop),
                "samples": samples,
                "seconds_to_cap": cap,
                "temperature_at_start_c": next((s.get("temp_c") for s in samples), None),
            }
            own = window_of(trial, production_start(trial), WORKER_MEASURE)
            trial["probe_window"] = own
            doc["trials"].append(trial)
            measured = "-" if own is None else f"{own['tflops']:.1f} TFLOP/s at {own['sm_mhz'] or 0:.0f} MHz"
            reached = "-" if cap is None else f"{cap:.2f} s"
            study.say(f"trial {i + 1}/{args.trials}: {len(answer['times'])} matmuls, cap at {reached}, {measured}")
    finally:
        with_stdin = proc.stdin
        if with_stdin is not None:
            with_stdin.close()
        study.stop_child(proc)


def summary(doc: dict[str, Any]) -> list[str]:
    env, args, engine = doc.get("environment") or {}, doc["args"], doc.get("engine") or {}
    dry = ", DRY RUN on the CPU" if args["dry_run"] else ""
    lines = [
        f"# CV floor: {env.get('name') or 'no GPU read'} ({doc['started']}{dry})",
        "",
        f"`{doc['command']}`",
        "",
        f"- {len(doc['trials'])} trials of {args['run']:g} s of {args['dtype']} {args['size']}³ matmuls from cold, "
        f"each after ≥ {args['idle_min']:g} s idle; engine {engine.get('engine')} {engine.get('engine_version')} "
        f"({engine.get('blas_version')}); power limit {env.get('power_limit_enforced_watts')} W, SM clock max "
        f"{env.get('sm_clock_max_mhz')} MHz",
    ]
    trials = doc["trials"]
    caps = [t["seconds_to_cap"] for t in trials[1:] if t.get("seconds_to_cap") is not None]
    gaps = [b["t"] - a["t"] for t in trials for a, b in zip(t["samples"], t["samples"][1:], strict=False)]
    lines.append(
        f"- the power cap reached after {statistics.median(caps):.2f} s (median; {min(caps):.2f}-{max(caps):.2f})"
        if caps
        else "- the power cap: never seen (no SW power cap reason, power under 98 % of the limit)"
    )
    if gaps:
        lines.append(f"- NVML read every {1000 * statistics.median(gaps):.0f} ms (median)")
    lines += [
        "",
        "| trial | idle wait (s) | °C at start | s to cap | the probe's window: TFLOP/s | SM MHz (± inside) | W |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    for t in trials:
        w = t.get("probe_window") or {}
        lines.append(
            f"| {t['index']} | {study._f((t.get('idle') or {}).get('waited_seconds'))} "
            f"| {study._f(t.get('temperature_at_start_c'), 0)} | {study._f(t.get('seconds_to_cap'), 2)} "
            f"| {study._f(w.get('tflops'))} | {study._f(w.get('sm_mhz'), 0)} (± {study._f(w.get('sm_mhz_stdev'), 0)}) "
            f"| {study._f(w.get('watts'), 0)} |"
        )
    lines += [
        "",
        f"CV over trials 2..{len(trials)} (goal ≤ 0.5 %), each window cut from the same trials:",
        "",
        "| window | trials | TFLOP/s | CV | CV of TFLOP/s per GHz | r(TFLOP/s, clock) | SM MHz over trials "
        "| SM MHz ± inside | spread inside |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in doc.get("windows") or []:
        mhz = r["sm_mhz_mean_range"]
        lines.append(
            f"| {r['window']} | {r['trials']} | {study._f(r['tflops_mean'])} | {study._f(r['cv_pct'], 2)} % "
            f"| {study._f(r['cv_per_clock_pct'], 2)} % | {study._f(r['r_tflops_clock'], 2)} "
            f"| {'-' if not mhz else f'{mhz[0]:.0f}-{mhz[1]:.0f}'} | {study._f(r['sm_mhz_stdev_inside_median'], 0)} "
            f"| {study._pct(r['spread_inside_median'])} |"
        )
    lines += ["", *reading(doc.get("windows") or [])]
    return lines


def reading(rows: list[dict[str, Any]]) -> list[str]:
    """What the table says, in words: the conclusion the numbers support, not more."""
    if not rows or rows[0]["cv_pct"] is None:
        return ["Too few trials measured the probe's own window to say anything (see the JSON)."]
    own, best = rows[0], min((r for r in rows if r["cv_pct"] is not None), key=lambda r: r["cv_pct"])
    out = [
        f"- The probe's own window: CV {own['cv_pct']:.2f} %; the tightest window: {best['window']}, "
        f"{best['cv_pct']:.2f} %."
    ]
    per = own["cv_per_clock_pct"]
    if per is not None:
        verdict = (
            "the clock explains the spread: per GHz the probe repeats within the goal"
            if per <= 0.5 < own["cv_pct"]
            else "the clock does not explain it all"
            if per > 0.5
            else "within the goal either way"
        )
        out.append(f"- Per GHz of SM clock, the probe's window repeats with CV {per:.2f} %: {verdict}.")
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        return child(args)
    if args.dry_run:
        args.size = 256 if args.size == 8192 else args.size
        args.idle_min, args.idle_max, args.run = min(args.idle_min, 0.5), min(args.idle_max, 2.0), min(args.run, 3.0)
        args.sample_ms = max(args.sample_ms, 200.0)
    doc: dict[str, Any] = {
        "what": "gpuwatch probe CV floor (issue #36)",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "trials": [],
    }
    reader: study.GpuReader = (
        study.SimulatedReader(args.python, args.gpu, ["--scenario", "healthy", "--gpus", str(args.gpu + 1)])
        if args.dry_run
        else study.NvmlReader(args.gpu)
    )
    code = 0
    try:
        doc["environment"] = reader.environment() if reader.available else {"available": False, "why": reader.why}
        run_trials(args, reader, doc)
    except study.PhaseError as exc:
        doc["error"] = str(exc)
        study.say(str(exc))
        code = 1
    finally:
        study.stop_all_children()
        reader.close()
    doc["windows"] = analyse(doc["trials"], args.run)
    code = code or (0 if len(doc["trials"]) == args.trials else 1)
    text = "\n".join(summary(doc)) + "\n"
    for t in doc["trials"]:
        del t["timeline"]  # the JSON keeps the raw times; the timeline is made from them
    args.out.write_text(json.dumps(doc, indent=1))
    if args.markdown is not None:
        args.markdown.write_text(text)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
