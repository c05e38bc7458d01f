"""The all-reduce child of `gpuwatch diag`: ``python -m gpuwatch.probe.diag_allreduce --json --world N ...`` starts
one process per GPU visible to it (``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` name the GPUs under test),
joins them with torch.distributed (NCCL, which is RCCL on ROCm builds; gloo on the CPU for the tests), checks one
all-reduce's sums, times `--iterations` all-reduces of `--mib` MiB each and prints one JSON line: the algorithm
bandwidth and the bus bandwidth (algbw × 2(n-1)/n, as nccl-tests reports it: what each link carries). The parent
(gpuwatch/probe/diag_node.py) judges it against the GPUs' links."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from gpuwatch.core.exitcodes import WORKER_FAILED, WORKER_NO_ENGINE, WORKER_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuwatch.probe.diag_allreduce", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--world", type=int, required=True, help="processes: one per GPU")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: gloo on the CPU (tests, CI)")
    p.add_argument("--mib", type=int, default=256, help="size of each all-reduce (MiB)")
    p.add_argument("--iterations", type=int, default=20, help="timed all-reduces")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        torch: Any = importlib.import_module("torch")
        dist: Any = importlib.import_module("torch.distributed")
        mp: Any = importlib.import_module("torch.multiprocessing")
    except ImportError as exc:
        print(json.dumps({"ok": False, "skip": f"PyTorch is not installed ({exc})"}), flush=True)
        return WORKER_NO_ENGINE
    if args.device == "gpu" and (not dist.is_nccl_available() or torch.cuda.device_count() < args.world):
        why = "no NCCL/RCCL" if not dist.is_nccl_available() else f"{torch.cuda.device_count()} GPU(s) visible"
        print(json.dumps({"ok": False, "skip": f"PyTorch cannot all-reduce here: {why}"}), flush=True)
        return WORKER_NO_ENGINE
    with tempfile.TemporaryDirectory(prefix="gpuwatch-allreduce-") as scratch:
        results = mp.get_context("spawn").SimpleQueue()
        try:
            mp.spawn(_rank, args=(args, os.path.join(scratch, "rendezvous"), results), nprocs=args.world, join=True)
        except Exception as exc:  # a rank that failed: its error is the result
            print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
            return WORKER_FAILED
        doc: dict[str, Any] = results.get()
    print(json.dumps(doc), flush=True)
    return WORKER_OK


def _rank(rank: int, args: argparse.Namespace, rendezvous: str, results: Any) -> None:
    import torch
    import torch.distributed as dist

    gpu = args.device == "gpu"
    if gpu:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=args.world)  # fmt: skip
    try:
        n = args.mib * 2**20 // 4
        check = torch.full((n,), float(rank), device=device)
        dist.all_reduce(check)
        expected = args.world * (args.world - 1) / 2
        wrong = int((check != expected).sum().item())
        data = torch.ones(n, device=device)
        for _ in range(3):
            dist.all_reduce(data)
        _sync(torch, gpu)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(args.iterations):
            dist.all_reduce(data)
        _sync(torch, gpu)
        seconds = (time.perf_counter() - started) / args.iterations
        algbw = n * 4 / seconds
        if rank == 0:
            results.put(
                {
                    "ok": True,
                    "world": args.world,
                    "backend": dist.get_backend(),
                    "bytes": n * 4,
                    "seconds_per_allreduce": seconds,
                    "algbw_bytes_per_second": algbw,
                    "busbw_bytes_per_second": algbw * 2 * (args.world - 1) / args.world,
                    "wrong_elements": wrong,
                }
            )
    finally:
        dist.destroy_process_group()


def _sync(torch: Any, gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
