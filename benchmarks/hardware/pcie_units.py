#!/usr/bin/env python3
"""What unit NVML GPM's PCIe rates are in, settled by copying a known number of bytes (#20; nvml.h says MiB/s).

Read-only on the GPU (it changes no setting). The NVML backend is polled, then pinned host memory is copied to the
GPU (or back) for about two seconds, then polled again: the increase of `pcie_bytes_total` against the bytes copied
says whether the backend's unit is right (ratio ~1; a little above from the link's own traffic), or off by 2**20
(the rates in bytes/s) or 2**10 (KiB/s). Each direction three times, with an idle interval beside them.

    python benchmarks/hardware/pcie_units.py --out pcie_units.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpuwatch.backends.nvml import NvmlBackend, load_pynvml  # noqa: E402


def totals(nvml: NvmlBackend, gpu: int) -> dict[str, float]:
    sample = nvml.poll(slow=False)[gpu].sample
    assert sample is not None, "the GPU gave no sample"
    return dict(sample.pcie_bytes_total)


def main() -> int:
    parser = argparse.ArgumentParser(prog="pcie_units.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--mib", type=int, default=1024, help="size of one copy")
    parser.add_argument("--seconds", type=float, default=2.0, help="copying per interval")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch

    host = torch.empty(args.mib << 20, dtype=torch.uint8).pin_memory()
    device = torch.empty(args.mib << 20, dtype=torch.uint8, device=f"cuda:{args.gpu}")
    nvml = NvmlBackend(load_pynvml())
    nvml.open()
    nvml.poll(slow=True)
    time.sleep(1.0)
    rows: list[dict[str, Any]] = []
    for kind in ("idle", "h2d", "d2h") * 3:
        before = totals(nvml, args.gpu)
        started = time.monotonic()
        copied = 0
        while time.monotonic() - started < args.seconds:
            if kind == "h2d":
                device.copy_(host, non_blocking=True)
            elif kind == "d2h":
                host.copy_(device, non_blocking=True)
            else:
                time.sleep(0.05)
                continue
            torch.cuda.synchronize(args.gpu)
            copied += args.mib << 20
        after = totals(nvml, args.gpu)
        seconds = time.monotonic() - started
        delta = {direction: after.get(direction, 0.0) - before.get(direction, 0.0) for direction in ("rx", "tx")}
        # GPM's rx is traffic into the GPU (host to device), tx out of it.
        moved = delta["rx"] if kind == "h2d" else delta["tx"] if kind == "d2h" else None
        row = {
            "kind": kind,
            "seconds": round(seconds, 3),
            "copied_bytes": copied,
            "delta_bytes": delta,
            "ratio": round(moved / copied, 4) if moved is not None and copied else None,
        }
        rows.append(row)
        print(json.dumps(row))
        time.sleep(1.0)
    nvml.close()
    args.out.write_text(json.dumps({"gpu": args.gpu, "copy_mib": args.mib, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
