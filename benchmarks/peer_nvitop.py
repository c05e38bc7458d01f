#!/usr/bin/env python3
"""nvitop-exporter on gpuwatch's simulated node: the launcher `peer.py` starts in the peer's own virtualenv.

NVIDIA's real `pynvml` (nvidia-ml-py, the peer's own copy) is imported as nvitop imports it; only the C library under
it is gpuwatch's simulated libnvidia-ml (`gpuwatch/simulated/libnvml.py`), set where pynvml's `_LoadNvmlLibrary`
would have put the driver's CDLL, exactly as `gpuwatch.simulated.bindings.simulated_pynvml` does for gpuwatch. So both
exporters run the same vendor Python over the same simulated GPUs, and no shim is needed.

    /path/to/peer-venv/bin/python benchmarks/peer_nvitop.py --gpus 8 --scenario healthy -- --port 9000 --interval 1

Everything after `--` goes to nvitop-exporter's own command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    ours, _, theirs = (argv[: argv.index("--")], "--", argv[argv.index("--") + 1 :]) if "--" in argv else (argv, "", [])
    parser = argparse.ArgumentParser(prog="peer_nvitop.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    parser.add_argument("--scenario", default="healthy", help="simulated scenario (default healthy)")
    args = parser.parse_args(ours)
    sys.path.insert(0, str(REPO))  # gpuwatch's simulated library only; the peer venv has no gpuwatch installed

    import pynvml  # the peer's real nvidia-ml-py

    from gpuwatch.simulated.libnvml import SimulatedLibNvml
    from gpuwatch.simulated.scenarios import SimulatedNode

    node = SimulatedNode(scenario=args.scenario, gpus=args.gpus, vendor="nvidia")
    pynvml.nvmlLib = SimulatedLibNvml(node)  # what _LoadNvmlLibrary's CDLL would have set; it then loads nothing

    from nvitop_exporter.cli import main as exporter_main

    sys.argv = ["nvitop-exporter", *theirs]
    return int(exporter_main() or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
