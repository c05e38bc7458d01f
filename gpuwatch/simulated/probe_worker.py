"""The simulated node's probe worker, a real child process: ``python -m gpuwatch.simulated.probe_worker --json ...``
takes the production worker's arguments (gpuwatch/probe/worker.py), answers with its JSON contract and exit status,
and reports an H100 SXM without an engine: at the SM clock its GPU's physics gives the probe's load
(``--clock-share``, from the launcher, whose node runs the load while this process lives: ``--pid-file``), slowed by
``--slowdown``. It warms up as the production worker does, until the runner says the power limit is reached (at most
``--warmup-max``; the simulated GPU needs no minimum), and reports power_capped as that worker would.

The checked result (``compute_check``) is real where it can be: with ``--check-on-cpu`` and torch importable, the
worker runs the production engine's check (gpuwatch/probe/checksum.py through TorchEngine) on a real small matmul on
the CPU, after corrupting ``--corrupt-elements`` of its output as the faulty GPU of scenario ``corrupt`` would; its
``engine`` says so. Without torch (the demo on a bare machine) or without the flag it reports the check as not run
(``"ran": false`` and why) rather than pretend.

``--fault`` makes it misbehave as a broken worker would (crash: SIGABRT; hang: never answers; garbage: a result
the runner must reject), for the tests of the runner's supervision. gpuwatch/simulated/probe_launcher.py starts it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import os
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpuwatch.probe.worker import _CapSignal, answer, build_parser, throughput_fields

# The simulated H100 SXM: bf16 8192³ at its 700 W cap (tests/fixtures/h100/probe-measurements.json).
SIM_FLOPS = {"bf16": 690e12, "fp16": 666e12, "fp32": 50.4e12}
SIM_H2D, SIM_D2H = 53.5e9, 52.6e9  # pinned copies over PCIe gen 5 x16
# Probe to probe, the median's coefficient of variation: 0.14-0.42 % on the fixture's H100, 0.58-0.83 % on a second
# H100 (benchmarks/hardware/results/2026-11-26-h100, 10 idle probes twice). Within a probe the timed matmuls spread
# asymmetrically at the power cap: p10 12-18 % below the median, p90 1-3 % above (the same H100).
PROBE_CV = 0.005
FAULTS = ("none", "crash", "hang", "garbage")


def simulated_parser() -> argparse.ArgumentParser:
    """The production worker's arguments, and the simulated GPU's."""
    p = build_parser("python -m gpuwatch.simulated.probe_worker", __doc__)
    p.add_argument("--slowdown", type=float, default=0.0, help="share of throughput lost (0.2 = 20 %% slow)")
    p.add_argument("--seed", type=int, default=0, help="noise seed")
    p.add_argument("--seconds", type=float, default=0.2, help="how long the GPU work takes")
    p.add_argument("--fault", choices=FAULTS, default="none", help="misbehave as a broken worker would")
    p.add_argument(
        "--clock-share", type=float, default=1.0, help="SM clock under the probe's load / a healthy GPU's (physics)"
    )
    p.add_argument("--pid-file", default="", help="write this process's PID here as it starts (the launcher's)")
    p.add_argument(
        "--check-on-cpu", action="store_true", help="check a real small matmul on the CPU (torch) for compute_check"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return answer(simulate, simulated_parser().parse_args(argv))


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    """An H100 at its power cap, at the clock share its physics gives and slowed by `--slowdown`, with the noise and
    spread real probes show (PROBE_CV)."""
    started = time.perf_counter()
    if args.pid_file:
        _write_pid(args.pid_file)
    if args.fault == "crash":
        os.abort()
    if args.fault == "hang":
        while True:
            time.sleep(60)
    if args.fault == "garbage":
        return {"ok": True, "flops_median": "fast"}
    from gpuwatch import __version__

    rng = random.Random(args.seed)
    signal = _CapSignal(args.power_signal)
    warm_started = time.perf_counter()
    while not signal.poll() and signal.watching and time.perf_counter() - warm_started < args.warmup_max:
        time.sleep(0.01)
    warmup_seconds = time.perf_counter() - warm_started
    power_capped = signal.poll() if signal.watching else None
    time.sleep(max(0.0, args.seconds))
    check = cpu_check(args.dtype, args.corrupt_elements) if args.check_on_cpu else not_checked(NOT_ASKED)
    throughput = SIM_FLOPS[args.dtype] * args.clock_share * (1.0 - args.slowdown)
    median = throughput * (1.0 + rng.gauss(0.0, PROBE_CV))
    p10 = median * (1.0 - 0.14 - abs(rng.gauss(0.0, 0.015)))
    p90 = median * (1.0 + 0.015 + abs(rng.gauss(0.0, 0.01)))
    return {
        **throughput_fields(args, median, p10, p90),
        "engine": "simulated",
        "engine_version": __version__,
        "blas_version": "simulated",
        "device": "simulated",
        "iterations": 650,
        "gpu_time_seconds": warmup_seconds + args.seconds,
        "warmup_seconds": warmup_seconds,
        "power_capped": power_capped,
        "startup_seconds": warm_started - started,
        "wall_seconds": time.perf_counter() - started,
        "copy_kind": "simulated",
        "copy_bytes": args.copy_mib * 2**20,
        "h2d_bytes_per_second": SIM_H2D * (1.0 + rng.gauss(0.0, 0.003)),
        "d2h_bytes_per_second": SIM_D2H * (1.0 + rng.gauss(0.0, 0.003)),
        "compute_check": check,
    }


CHECK_SIZE = 256  # n of the real matmul checked on the CPU: a few milliseconds, the same code as on a GPU
NOT_ASKED = (
    "the simulated GPU computes nothing; the simulated node checks a real matmul on the CPU only for its corrupt GPU "
    "and one healthy control GPU (scenario corrupt)"
)
NO_TORCH = "torch is not installed: the simulated node cannot run the real check on the CPU (pip install torch)"


def not_checked(why: str) -> dict[str, Any]:
    return {"ran": False, "why": why}


def cpu_check(dtype: str, corrupt: int) -> dict[str, Any]:
    """The production engine's check of a real CPU matmul standing in for the simulated GPU's, `corrupt` elements of
    its output made wrong first; not run (and why) without torch."""
    if importlib.util.find_spec("torch") is None:
        return not_checked(NO_TORCH)
    from gpuwatch.probe.engines import TorchEngine

    engine = TorchEngine("cpu")
    importlib.import_module("torch").set_num_threads(1)  # eight workers at once on a small machine: one core each
    engine.prepare(CHECK_SIZE, dtype)
    corrupted = engine.corrupt(corrupt) if corrupt else 0
    result = dataclasses.replace(engine.check(), corrupted=corrupted)
    return {**result.as_json(), "engine": f"torch {engine.version} on the CPU, {CHECK_SIZE}x{CHECK_SIZE} (stands in)"}


def _write_pid(path: str) -> None:
    """This process's PID where the launcher looks for it, whole or not at all (a rename within the directory)."""
    partial = f"{path}.partial"
    with open(partial, "w") as out:
        out.write(str(os.getpid()))
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main())
