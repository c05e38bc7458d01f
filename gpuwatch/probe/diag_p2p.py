"""The peer-to-peer child of `gpuwatch diag`: ``python -m gpuwatch.probe.diag_p2p --json`` sees every GPU under test
(``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``) and times a `--mib` MiB copy from the first GPU to each other
one and back, with the device's events, over NVLink/XGMI where the GPUs have it (PCIe otherwise); one JSON line:
each pair's bytes per second and whether the runtime reports peer access. The parent (gpuwatch/probe/diag_node.py)
judges it against the links."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from gpuwatch.core.exitcodes import WORKER_FAILED, WORKER_NO_ENGINE, WORKER_OK

REPEATS = 8


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuwatch.probe.diag_p2p", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--mib", type=int, default=256, help="size of each copy (MiB)")
    args = p.parse_args(argv)
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError as exc:
        print(json.dumps({"ok": False, "skip": f"PyTorch is not installed ({exc})"}), flush=True)
        return WORKER_NO_ENGINE
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        print(json.dumps({"ok": False, "skip": f"PyTorch sees {count} GPU(s): peer copies need two"}), flush=True)
        return WORKER_NO_ENGINE
    try:
        pairs = [_pair(torch, 0, peer, args.mib * 2**20) for peer in range(1, count)]
    except Exception as exc:  # a copy that fails is the result
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
        return WORKER_FAILED
    print(json.dumps({"ok": True, "bytes": args.mib * 2**20, "pairs": pairs}), flush=True)
    return WORKER_OK


def _pair(torch: Any, first: int, peer: int, nbytes: int) -> dict[str, Any]:
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{first}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{peer}")
    rates = {}
    for direction, dst, src, device in (("out", b, a, first), ("back", a, b, peer)):
        with torch.cuda.device(device):
            dst.copy_(src)
            torch.cuda.synchronize(first)
            torch.cuda.synchronize(peer)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPEATS):
                dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            rates[direction] = REPEATS * nbytes / (start.elapsed_time(end) / 1e3)
    return {
        "from": first,
        "to": peer,
        "peer_access": bool(torch.cuda.can_device_access_peer(first, peer)),
        "out_bytes_per_second": rates["out"],
        "back_bytes_per_second": rates["back"],
    }


if __name__ == "__main__":
    sys.exit(main())
