"""The diag child process: ``python -m gpuwatch.probe.diag_worker --json --tests hbm,pcie,sustained ...`` runs the
GPU tests of `gpuwatch diag` on the one GPU it is pinned to (``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``, as
the probe worker is), with PyTorch, and prints one JSON line per event on stdout:

- ``{"event": "hello", "engine": "torch", "version": …, "nccl": bool}`` once PyTorch is imported;
- ``{"event": "start", "test": NAME}`` as each test begins (the parent's per-test deadline starts there);
- ``{"event": "result", "test": NAME, "values": {…}}`` with what the test measured, or ``"skip": reason`` /
  ``"error": text``. The parent (gpuwatch/probe/diag.py) judges the values: the child only measures.

Tests: ``hbm`` writes patterns (walking ones, address-in-address, seeded random) over ``--fraction`` of the free
device memory (``--bytes`` on the CPU), reads each back and counts the 32-bit words that differ; ``pcie`` times
pinned host->device and device->host copies; ``sustained`` runs back-to-back matmuls for ``--seconds`` and reports
each second's throughput (the parent reads clocks, power and temperature from the vendor library meanwhile).
``--device cpu`` runs the same code on torch's CPU device (the simulated node, CI). Exit 0 when every test ran, 3
without PyTorch (every test skipped), 1 on any other failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuwatch.core.exitcodes import WORKER_FAILED, WORKER_NO_ENGINE, WORKER_OK

WORKER_TESTS = ("hbm", "pcie", "sustained")
CHUNK_WORDS = 64 * 2**20  # 256 MiB of int32 per step: the address pattern's int64 temporary is 512 MiB
HEADROOM_BYTES = 2 * 2**30  # left free on the device for the temporaries and the runtime
WALKING_BITS = {1: (0, 8, 16, 31), 2: (0, 4, 8, 12, 16, 20, 24, 28, 31), 3: tuple(range(32))}


def build_parser(
    prog: str = "python -m gpuwatch.probe.diag_worker", doc: str | None = __doc__
) -> argparse.ArgumentParser:
    """The diag child's command line (what gpuwatch/probe/diag.py passes every diag child)."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print JSON lines (the only output format)")
    p.add_argument("--uuid", default="", help="the GPU's UUID (for the record; pinning is by the environment)")
    p.add_argument("--tests", default=",".join(WORKER_TESTS), help=f"comma-separated, of {', '.join(WORKER_TESTS)}")
    p.add_argument("--level", type=int, choices=(1, 2, 3), default=1)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: torch's CPU device (tests, CI)")
    p.add_argument("--fraction", type=float, default=0.25, help="share of the free device memory the hbm test uses")
    p.add_argument("--bytes", type=int, default=0, help="memory the hbm test uses (overrides --fraction)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random pattern")
    p.add_argument("--copy-mib", type=int, default=256, help="size of each host<->device copy (MiB)")
    p.add_argument("--seconds", type=float, default=3.0, help="how long the sustained matmul runs")
    p.add_argument("--size", type=int, default=8192, help="n of the sustained n×n×n matmul")
    return p


def emit(doc: dict[str, Any]) -> None:
    """One event line on stdout, flushed (the parent reads them as they come)."""
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        for test in _tests(args):
            emit({"event": "result", "test": test, "skip": f"PyTorch is not installed ({exc})"})
        return WORKER_NO_ENGINE
    return run_tests(args, torch, TESTS)


def _tests(args: argparse.Namespace) -> list[str]:
    return [t for t in args.tests.split(",") if t]


Test = Callable[[Any, Any, argparse.Namespace], dict[str, Any]]


def run_tests(args: argparse.Namespace, torch: Any, tests: dict[str, Test]) -> int:
    """Say hello, then run each asked test in turn, one start and one result line each."""
    nccl = bool(getattr(torch.distributed, "is_nccl_available", lambda: False)())
    gpu = args.device != "cpu" and bool(torch.cuda.is_available())
    emit({"event": "hello", "engine": "torch", "version": str(torch.__version__), "nccl": nccl,
          "device": "cuda" if gpu else "cpu"})  # fmt: skip
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core per simulated GPU: eight of them share a CI machine
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        for test in _tests(args):
            emit({"event": "result", "test": test, "skip": "PyTorch sees no GPU (a CPU-only build, or no driver)"})
        return WORKER_NO_ENGINE
    else:
        device = torch.device("cuda", 0)
    code = WORKER_OK
    for test in _tests(args):
        emit({"event": "start", "test": test})
        started = time.perf_counter()
        try:
            values = tests[test](torch, device, args)
        except Exception as exc:  # a device error is the test's result, said with its text
            emit({"event": "result", "test": test, "error": f"{type(exc).__name__}: {exc}"[:500]})
            code = WORKER_FAILED
            continue
        values["seconds"] = time.perf_counter() - started
        emit({"event": "result", "test": test, "values": values})
    return code


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def hbm_bytes(torch: Any, device: Any, args: argparse.Namespace) -> int:
    """How much memory the pattern test covers: --bytes, else --fraction of what is free less headroom."""
    if args.bytes > 0 or device.type != "cuda":
        return max(int(args.bytes), 4 * 2**20)
    free, _total = torch.cuda.mem_get_info()
    usable: int = int(args.fraction * max(0, int(free) - HEADROOM_BYTES))
    return max(4 * 2**20, usable)


def hbm(
    torch: Any, device: Any, args: argparse.Namespace, damage: Callable[[Any], None] | None = None
) -> dict[str, Any]:
    """Write each pattern over the buffer, read it back and count the words that differ (per pattern). `damage`
    (the simulated node's faulty memory) acts on the buffer between the writes and the reads."""
    nbytes = hbm_bytes(torch, device, args)
    words = nbytes // 4
    buf = torch.empty(words, dtype=torch.int32, device=device)
    spans = [(start, min(CHUNK_WORDS, words - start)) for start in range(0, words, CHUNK_WORDS)]

    def random_chunk(i: int, start: int, size: int) -> Any:
        g = torch.Generator(device=device)
        g.manual_seed(args.seed * 1_000_003 + i)
        return torch.randint(-(2**31), 2**31 - 1, (size,), generator=g, dtype=torch.int32, device=device)

    def address_chunk(i: int, start: int, size: int) -> Any:
        return torch.arange(start, start + size, dtype=torch.int64, device=device).to(torch.int32)

    patterns: list[tuple[str, Callable[[int, int, int], Any] | int]] = []
    for bit in WALKING_BITS[args.level]:
        patterns.append((f"walking_one_{bit}", _signed32(1 << bit)))
        if args.level >= 3:
            patterns.append((f"walking_zero_{bit}", _signed32(~(1 << bit) & 0xFFFFFFFF)))
    patterns += [("address", address_chunk), ("random", random_chunk)]
    mismatches: dict[str, int] = {}
    for name, pattern in patterns:
        for i, (start, size) in enumerate(spans):
            view = buf[start : start + size]
            if isinstance(pattern, int):
                view.fill_(pattern)
            else:
                view.copy_(pattern(i, start, size))
        if damage is not None:
            damage(buf)
        _sync(torch, device)
        bad = torch.zeros((), dtype=torch.int64, device=device)
        for i, (start, size) in enumerate(spans):
            view = buf[start : start + size]
            expected = pattern if isinstance(pattern, int) else pattern(i, start, size)
            bad += (view != expected).sum()
        mismatches[name] = int(bad.item())
    del buf
    return {"bytes": words * 4, "patterns": len(patterns), "mismatches": mismatches}


def _signed32(value: int) -> int:
    return value - 2**32 if value >= 2**31 else value


def pcie(torch: Any, device: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Pinned host<->device copies, each timed with the device's events over a few repetitions."""
    if device.type != "cuda":
        return {"unmeasured": "torch's CPU device has no host link to time"}
    nbytes = args.copy_mib * 2**20
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates: dict[str, float] = {}
    copies: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("h2d", lambda: dev.copy_(host, non_blocking=True)),
        ("d2h", lambda: host.copy_(dev, non_blocking=True)),
    )
    for direction, copy in copies:
        copy()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        repeats = 8
        start.record()
        for _ in range(repeats):
            copy()
        end.record()
        end.synchronize()
        rates[f"{direction}_bytes_per_second"] = repeats * nbytes / (start.elapsed_time(end) / 1e3)
    return {"copy_bytes": nbytes, **rates}


def sustained(torch: Any, device: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Back-to-back matmuls for --seconds: each second's throughput (bf16 on a GPU, fp32 on the CPU)."""
    n = args.size if device.type == "cuda" else min(args.size, 256)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    flop = 2.0 * n**3
    windows: list[float] = []
    ends = time.perf_counter() + args.seconds
    while time.perf_counter() < ends:
        window_start, count = time.perf_counter(), 0
        while time.perf_counter() - window_start < 1.0 and time.perf_counter() < ends:
            for _ in range(8):
                torch.matmul(a, b)
            _sync(torch, device)
            count += 8
        windows.append(count * flop / max(time.perf_counter() - window_start, 1e-9))
    return {"shape": f"{n}x{n}x{n}", "dtype": str(dtype).removeprefix("torch."), "flops_per_window": windows}


TESTS: dict[str, Test] = {"hbm": hbm, "pcie": pcie, "sustained": sustained}


if __name__ == "__main__":
    sys.exit(main())
