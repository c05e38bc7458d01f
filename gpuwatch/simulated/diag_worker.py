"""The simulated node's diag child, a real process: ``python -m gpuwatch.simulated.diag_worker --json ...`` takes the
production child's arguments (gpuwatch/probe/diag_worker.py) and answers with its JSON lines, running what can run
without a GPU for real:

- ``hbm``: the production pattern test on torch's CPU device (``--device cpu --bytes …``), with the simulated GPU's
  faulty memory (``--stuck-bit``: one word whose bit reads 0 whatever was written) between writes and reads;
- ``pcie``: the copies timed over the simulated GPU's link as the launcher read it under the diag's load
  (``--link-generation``, ``--link-width``): what that link moves at a real H100's efficiency (~85 % of nominal);
- ``sustained``: the production matmul loop on the CPU for ``--seconds``, reported as the simulated H100's
  throughput at the SM clock its physics gives under the load (``--clock-share``) and its scenario's ``--slowdown``,
  while the launcher's node runs the load (``--pid-file``) so that the readings the parent takes show it.

``--hang-in TEST`` makes it hang in that test (never answers), for the tests of the runner's deadlines.
gpuwatch/simulated/diag_launcher.py starts it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpuwatch.core.exitcodes import WORKER_NO_ENGINE
from gpuwatch.probe import diag_worker
from gpuwatch.simulated.probe_worker import SIM_FLOPS, _write_pid

LINK_EFFICIENCY = 0.85  # pinned copies on an H100 SXM over PCIe gen 5 x16: 53.5 GB/s of 63 (probe_worker.SIM_H2D)
LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


def parser() -> argparse.ArgumentParser:
    p = diag_worker.build_parser("python -m gpuwatch.simulated.diag_worker", __doc__)
    p.add_argument("--link-generation", type=int, default=5, help="the simulated link's generation under load")
    p.add_argument("--link-width", type=int, default=16, help="the simulated link's width under load")
    p.add_argument("--clock-share", type=float, default=1.0, help="SM clock under load / a healthy GPU's")
    p.add_argument("--slowdown", type=float, default=0.0, help="share of throughput the scenario takes away")
    p.add_argument("--stuck-bit", type=int, default=-1, help="a memory word's bit that reads 0 (-1: none)")
    p.add_argument("--hang-in", default="", help="hang in this test (for the runner's deadline)")
    p.add_argument("--pid-file", default="", help="write this process's PID here as it starts (the launcher's)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.pid_file:
        _write_pid(args.pid_file)
    try:
        import torch
    except ImportError as exc:
        for test in args.tests.split(","):
            diag_worker.emit({"event": "result", "test": test, "skip": f"PyTorch is not installed ({exc})"})
        return WORKER_NO_ENGINE
    rng = random.Random(args.seed)

    def hbm(t: Any, d: Any, a: argparse.Namespace) -> dict[str, Any]:
        _hang(a, "hbm")
        return diag_worker.hbm(t, d, a, _stuck(a))

    def pcie(t: Any, d: Any, a: argparse.Namespace) -> dict[str, Any]:
        _hang(a, "pcie")
        return _pcie(a, rng)

    def sustained(t: Any, d: Any, a: argparse.Namespace) -> dict[str, Any]:
        _hang(a, "sustained")
        return _sustained(t, d, a, rng)

    tests: dict[str, diag_worker.Test] = {"hbm": hbm, "pcie": pcie, "sustained": sustained}
    args.device = "cpu"
    return diag_worker.run_tests(args, torch, tests)


def _hang(args: argparse.Namespace, test: str) -> None:
    while args.hang_in == test:
        time.sleep(60)


def _stuck(args: argparse.Namespace) -> Any:
    if args.stuck_bit < 0:
        return None
    mask = ~(1 << args.stuck_bit)

    def damage(buf: Any) -> None:
        word = len(buf) // 3
        buf[word] = int(buf[word]) & mask  # the cell keeps 0 in that bit, whatever was written

    return damage


def _pcie(args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    rate = LANE_BYTES_PER_SECOND.get(args.link_generation, 0.0) * args.link_width * LINK_EFFICIENCY
    time.sleep(0.2)  # the copies' time
    return {
        "copy_bytes": args.copy_mib * 2**20,
        "h2d_bytes_per_second": rate * (1.0 + rng.gauss(0.0, 0.003)),
        "d2h_bytes_per_second": rate * 0.983 * (1.0 + rng.gauss(0.0, 0.003)),
        "simulated": f"the simulated link, gen {args.link_generation} x{args.link_width}",
    }


def _sustained(torch: Any, device: Any, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    cpu = diag_worker.sustained(torch, device, args)  # the real loop on the CPU, for as long as the GPU's would run
    flops = SIM_FLOPS["bf16"] * args.clock_share * (1.0 - args.slowdown)
    windows = [flops * (1.0 + rng.gauss(0.0, 0.005)) for _ in cpu["flops_per_window"]]
    return {
        "shape": "8192x8192x8192",
        "dtype": "bf16",
        "flops_per_window": windows,
        "cpu_flops_per_window": cpu["flops_per_window"],
        "simulated": "an H100 SXM at the clock its physics gives under the load",
    }


if __name__ == "__main__":
    sys.exit(main())
