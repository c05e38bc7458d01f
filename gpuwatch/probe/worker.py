"""The probe child process: ``python -m gpuwatch.probe.worker --json ...`` prints one JSON document and exits.

The runner starts one per GPU, pinned to it by UUID (``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``), so the
agent never holds a CUDA context or imports an array library. The worker warms the GPU up until the runner says, on
stdin, that the power limit is reached (it watches the vendor library; ``--power-signal``) or a bounded time passes,
then times each matmul over a measured window, checks the last one's result against its column checksums
(``compute_check``; gpuwatch/probe/checksum.py), then times pinned host<->device copies. ``gpu_time_seconds`` covers all
three: from the first warm-up matmul to the end of the last copy.

Exit status (gpuwatch/core/exitcodes.py, WORKER_*): 0 with a result; 3 when the probe cannot run here (no engine:
``{"ok": false, "error": "no_engine"}``, which the runner counts as skipped_unsupported, never failed); 1 on any other
failure (``"error": "failed"``).
Any other worker a launcher starts (gpuwatch/probe/launch.py) takes these arguments and answers the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, get_args

from gpuwatch.core.exitcodes import WORKER_FAILED, WORKER_NO_ENGINE, WORKER_OK
from gpuwatch.core.model import ProbeDtype, ProbeEngineChoice, Vendor
from gpuwatch.probe.protocol import CAPPED_LINE

if TYPE_CHECKING:
    from gpuwatch.probe.engines import Engine


def build_parser(
    prog: str = "python -m gpuwatch.probe.worker", description: str | None = __doc__
) -> argparse.ArgumentParser:
    """The worker's command line: what the runner passes every worker (gpuwatch/probe/supervisor.py)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--json", action="store_true", help="print the result as JSON (the only output format)")
    p.add_argument("--uuid", default="", help="the GPU's UUID (for the record; pinning is by the environment)")
    p.add_argument("--vendor", choices=get_args(Vendor), default="nvidia")
    p.add_argument("--engine", choices=get_args(ProbeEngineChoice), default="auto")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: run on the CPU (tests, CI)")
    p.add_argument("--dtype", choices=get_args(ProbeDtype), default="bf16")
    p.add_argument("--size", type=int, default=8192, help="n of the n×n×n matmul")
    p.add_argument("--warmup-min", type=float, default=0.5, help="warm up at least this long (s)")
    p.add_argument("--warmup-max", type=float, default=1.5, help="give up waiting for the power limit after (s)")
    p.add_argument("--measure", type=float, default=1.0, help="measured window (s)")
    p.add_argument("--copy-mib", type=int, default=256, help="size of each host<->device copy (MiB); 0 = none")
    p.add_argument("--power-signal", action="store_true", help=f"the runner writes {CAPPED_LINE!r} on stdin")
    # The test hook of the checked result (tests, the hardware kit, the simulated node's `corrupt` scenario): make
    # this many elements of the last matmul's output wrong on the device before the check. Hidden from --help.
    p.add_argument("--corrupt-elements", type=_count, default=0, help=argparse.SUPPRESS)
    return p


def _count(text: str) -> int:
    """A count of 0 or more, or a clear error that says so."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (give 0 or more)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (give 0 or more)")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    return answer(measure, build_parser().parse_args(argv))


def answer(work: Callable[[argparse.Namespace], dict[str, Any]], args: argparse.Namespace) -> int:
    """Run `work` and print its one JSON document (or the error's) on stdout; the exit status of the contract."""
    # Libraries print to stdout at times; keep it for our one JSON document and send everything else to stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        doc = work(args)
        code = WORKER_OK
    except _NoEngine as exc:
        doc, code = {"ok": False, "error": "no_engine", "message": str(exc)}, WORKER_NO_ENGINE
    except Exception as exc:
        doc, code = {"ok": False, "error": "failed", "message": f"{type(exc).__name__}: {exc}"}, WORKER_FAILED
    os.write(out_fd, (json.dumps(doc) + "\n").encode())
    os.close(out_fd)
    return code


class _NoEngine(Exception):
    """The probe cannot run here (no engine): exit 3, skipped_unsupported."""


class _CapSignal:
    """Whether the runner said the power limit is reached (a line on stdin), read without blocking."""

    def __init__(self, watching: bool) -> None:
        self.watching = watching
        self.capped = False

    def poll(self) -> bool:
        if self.watching and not self.capped:
            try:
                ready, _, _ = select.select([sys.stdin], [], [], 0)
            except (OSError, ValueError):
                ready = []
            if ready and sys.stdin.readline().strip() == CAPPED_LINE:
                self.capped = True
        return self.capped


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, time each matmul over the window, time the copies; one result document."""
    started = time.perf_counter()
    from gpuwatch.probe import engines

    n = args.size
    try:
        engine, passed_over = engines.prepared_engine(args.engine, args.vendor, args.device, n, args.dtype)
    except engines.NoEngine as exc:
        raise _NoEngine(str(exc)) from None
    ready = time.perf_counter()

    signal = _CapSignal(args.power_signal)
    batch, warm_started = 1, time.perf_counter()
    while True:
        t0 = time.perf_counter()
        engine.run(batch)
        engine.synchronize()
        per_iteration = max((time.perf_counter() - t0) / batch, 1e-6)
        batch = max(1, min(512, int(engines.ITERATION_BATCH_SECONDS / per_iteration)))
        warmed = time.perf_counter() - warm_started
        if warmed >= args.warmup_max or (warmed >= args.warmup_min and (signal.poll() or not signal.watching)):
            break
    warmup_seconds = time.perf_counter() - warm_started
    power_capped = signal.poll() if signal.watching else None

    times = engine.timed(args.measure, batch)
    flop = 2.0 * n**3
    rates = sorted(flop / t for t in times if t > 0)
    if not rates:
        raise RuntimeError("no timed iteration took measurable time")
    median, p10, p90 = _quantile(rates, 0.5), _quantile(rates, 0.1), _quantile(rates, 0.9)
    corrupted = engine.corrupt(args.corrupt_elements) if args.corrupt_elements else 0
    check = checked(engine, corrupted)
    copies = engine.copies(args.copy_mib * 2**20) if args.copy_mib > 0 else {"copy_kind": "none"}
    engine.synchronize()
    gpu_time = time.perf_counter() - warm_started  # the GPU was ours from the first warm-up matmul to the last copy
    return {
        **throughput_fields(args, median, p10, p90),
        "engine": engine.name,
        "engine_version": engine.version,
        "blas_version": engine.blas_version,
        "device": engine.device,
        "iterations": len(rates),
        "gpu_time_seconds": gpu_time,  # warm-up + measured window + copies: what the probe costs the GPU
        "measured_seconds": sum(times),
        "warmup_seconds": warmup_seconds,
        "power_capped": power_capped,
        "startup_seconds": ready - started,
        "wall_seconds": time.perf_counter() - started,
        "engines_passed_over": passed_over,  # e.g. "cupy: CUDA driver version is insufficient…" before torch ran
        "compute_check": check,  # bad_columns > 0: a wrong result, a compute error (never "slow")
        **copies,
    }


def checked(engine: Engine, corrupted: int) -> dict[str, Any]:
    """The last matmul's output against its column checksums (gpuwatch/probe/checksum.py). A check that cannot run
    (no room for its float64 blocks on a full GPU) says so and why, and leaves the measurement standing."""
    try:
        result = engine.check()
    except Exception as exc:  # the array library's own errors (out of memory) differ between engines
        return {"ran": False, "why": f"the check could not run: {type(exc).__name__}: {exc}"}
    return dataclasses.replace(result, corrupted=corrupted).as_json()


def throughput_fields(args: argparse.Namespace, median: float, p10: float, p90: float) -> dict[str, Any]:
    """The throughput part of a result, which every worker reports alike (WorkerResult.from_json reads it)."""
    n = args.size
    return {
        "ok": True,
        "uuid": args.uuid,
        "dtype": args.dtype,
        "shape": f"{n}x{n}x{n}",
        "flops_median": median,
        "flops_p10": p10,
        "flops_p90": p90,
        "spread_ratio": (p90 - p10) / median,
    }


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an ascending list."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


if __name__ == "__main__":
    sys.exit(main())
