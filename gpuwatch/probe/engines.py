"""The array libraries the probe worker can run on: CuPy (NVIDIA) and PyTorch (NVIDIA, ROCm, and CPU for CI).

Only the worker child imports an array library; the agent imports this module for `available_engines` and
`engine_versions` alone, which find the libraries and their versions without importing them. Each engine is small
and does the same four things — allocate random-normal inputs and a preallocated output, enqueue matmuls, time them
per iteration (CUDA/HIP events on a GPU, perf_counter on the CPU), and time pinned host<->device copies — so the
worker's measuring logic is the same on every engine.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import re
import time
from collections.abc import Callable
from typing import Any

from gpuwatch.probe.baseline import median
from gpuwatch.probe.checksum import CORRUPT_SCALE, CheckResult, check_columns, corruption_targets

ITERATION_BATCH_SECONDS = 0.025  # how much work is queued between two looks at the clock


class NoEngine(Exception):
    """No usable array library (none installed, or one without GPU support): the probe is skipped, not failed."""


class Engine:
    """The interface the worker measures through."""

    name = ""
    version = ""
    blas_version = ""
    device = ""  # cuda, rocm, cpu

    def prepare(self, n: int, dtype: str, seed: int = 0) -> None:
        """Allocate random-normal inputs (`seed`: the probe always draws 0; the false-alarm benchmark many)."""
        raise NotImplementedError

    def run(self, count: int) -> None:
        """Enqueue `count` matmuls into the preallocated output (asynchronous on a GPU)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def timed(self, seconds: float, batch: int) -> list[float]:
        """Seconds of each matmul over a window of about `seconds`, timed on the device."""
        raise NotImplementedError

    def copies(self, nbytes: int) -> dict[str, Any]:
        """Copy bandwidths: h2d/d2h bytes per second (pinned) on a GPU; a clearly labelled memcpy on the CPU."""
        raise NotImplementedError

    def check(self) -> CheckResult:
        """Whether the last matmul's output is A·B (gpuwatch/probe/checksum.py), after the queued work is done."""
        raise NotImplementedError

    def corrupt(self, count: int) -> int:
        """The test hook: make `count` elements of the output wrong on the device, as a faulty GPU would; how many."""
        raise NotImplementedError


def available_engines() -> list[str]:
    """Engines importable in this interpreter, found without importing them (cheap enough for the agent)."""
    return [name for name in ("cupy", "torch") if importlib.util.find_spec(name) is not None]


def prepared_engine(choice: str, vendor: str, device: str, n: int, dtype: str) -> tuple[Engine, list[str]]:
    """An engine with its operands allocated, and why the engines tried before it were passed over.

    `choice` auto means CuPy on NVIDIA when installed, else PyTorch; when CuPy is installed but cannot run (a wheel
    for another CUDA than the driver's, a library that fails to load) auto goes on to PyTorch rather than leave the
    GPU unprobed. The reasons travel with the result, so the fallback is seen, never silent.
    """
    names = _candidates(choice, vendor, device)
    passed_over: list[str] = []
    first_error: Exception | None = None  # a real failure (not "cannot run here") must stay a failure
    for position, name in enumerate(names):
        try:
            engine = CupyEngine() if name == "cupy" else TorchEngine(device)
            engine.prepare(n, dtype)
            return engine, passed_over
        except Exception as exc:
            unusable = isinstance(exc, (NoEngine, ImportError))
            if first_error is None and not unusable:
                first_error = exc
            if position == len(names) - 1:
                if first_error is not None and first_error is not exc:
                    raise RuntimeError("; ".join([*passed_over, f"{name}: {_one_line(exc)}"])) from first_error
                if passed_over and unusable:
                    raise NoEngine("; ".join([*passed_over, f"{name}: {_one_line(exc)}"])) from None
                raise
            passed_over.append(f"{name}: {_one_line(exc)}")
    raise AssertionError("unreachable: _candidates never returns an empty list")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _candidates(choice: str, vendor: str, device: str) -> list[str]:
    found = available_engines()
    if choice == "auto":
        order = ["cupy", "torch"] if vendor == "nvidia" and device == "gpu" else ["torch"]
        candidates = [name for name in order if name in found]
        if not candidates:
            raise NoEngine(
                "no probe engine installed: install CuPy (pip install 'gpuwatch-agent[probe]') or PyTorch into the "
                "agent's Python environment"
            )
        return candidates
    if choice not in found:
        raise NoEngine(f"probe engine {choice!r} is not installed in this Python environment")
    if choice == "cupy" and device != "gpu":
        raise NoEngine("CuPy needs a GPU; use the torch engine on the CPU")
    return [choice]


# --- PyTorch ---------------------------------------------------------------------------------------------------------


class TorchEngine(Engine):
    name = "torch"

    def __init__(self, device: str) -> None:
        torch: Any = importlib.import_module("torch")
        self._torch = torch
        self.version = str(torch.__version__)
        if device == "gpu":
            if not torch.cuda.is_available():
                raise NoEngine(f"torch {self.version} sees no GPU (a CPU-only build, or no device visible)")
            self._dev = torch.device("cuda", 0)
            hip = getattr(torch.version, "hip", None)
            self.device = "rocm" if hip else "cuda"
            self.blas_version = f"hipblas (rocm {hip})" if hip else _cublas_version(str(torch.version.cuda))
        else:
            self._dev = torch.device("cpu")
            self.device = "cpu"
            self.blas_version = _torch_cpu_blas(torch)
        self._a: Any = None
        self._b: Any = None
        self._out: Any = None
        self._dtype = ""

    def prepare(self, n: int, dtype: str, seed: int = 0) -> None:
        torch = self._torch
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        if self.device != "cpu":
            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, not TF32
        gen = torch.Generator(device=self._dev).manual_seed(seed)
        self._a = torch.randn((n, n), generator=gen, device=self._dev, dtype=torch.float32).to(dt)
        self._b = torch.randn((n, n), generator=gen, device=self._dev, dtype=torch.float32).to(dt)
        self._out = torch.empty((n, n), device=self._dev, dtype=dt)
        self._dtype = dtype
        self.run(1)  # a GEMM that cannot run (no kernel for this dtype here) fails now, where auto can move on
        self.synchronize()

    def run(self, count: int) -> None:
        mm, a, b, out = self._torch.mm, self._a, self._b, self._out
        for _ in range(count):
            mm(a, b, out=out)

    def synchronize(self) -> None:
        if self.device != "cpu":
            self._torch.cuda.synchronize(self._dev)

    def timed(self, seconds: float, batch: int) -> list[float]:
        if self.device == "cpu":
            return _timed_on_host(self.run, seconds)
        event = self._torch.cuda.Event
        return _timed_on_device(
            lambda: self.run(1),
            lambda: event(enable_timing=True),
            lambda start, end: start.elapsed_time(end),
            seconds,
            batch,
        )

    def copies(self, nbytes: int) -> dict[str, Any]:
        torch = self._torch
        if self.device == "cpu":
            src = torch.ones(nbytes, dtype=torch.uint8)
            dst = torch.empty(nbytes, dtype=torch.uint8)
            return _host_memcpy(lambda: dst.copy_(src), nbytes)
        host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=self._dev)
        event = self._torch.cuda.Event

        def once(dst: Any, src: Any) -> float:
            start, end = event(enable_timing=True), event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0

        return _copy_bandwidths(lambda: once(dev, host), lambda: once(host, dev), nbytes)

    def check(self) -> CheckResult:
        self.synchronize()
        f64 = self._torch.float64
        # cuBLAS and hipBLASLt tensor cores align addends with truncation (Fasi et al. 2021): the conservative bound.
        return _timed_check(
            lambda: check_columns(
                self._a,
                self._b,
                self._out,
                dtype=self._dtype,
                truncating=self.device != "cpu",
                to64=lambda x: x.to(f64),
            )
        )

    def corrupt(self, count: int) -> int:
        self.synchronize()
        out, f64 = self._out, self._torch.float64
        targets = corruption_targets(int(out.shape[0]), count)
        for row, column in targets:
            norm = float(out[:, column].to(f64).norm())
            out[row, column] = float(out[row, column]) + CORRUPT_SCALE * norm
        self.synchronize()
        return len(targets)


def _timed_check(run: Callable[[], CheckResult]) -> CheckResult:
    started = time.perf_counter()
    result = run()
    return dataclasses.replace(result, seconds=time.perf_counter() - started)


def _cublas_version(cuda: str) -> str:
    """The exact cuBLAS a torch wheel brought (its nvidia-cublas package), else the CUDA version it was built for."""
    for package in ("nvidia-cublas-cu12", "nvidia-cublas-cu13", "nvidia-cublas", "nvidia-cublas-cu11"):
        try:
            return f"cublas {importlib.metadata.version(package)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"cublas (cuda {cuda})"


def _torch_cpu_blas(torch: Any) -> str:
    config = str(torch.__config__.show())
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", config)
    name = blas.group(1) if blas else "unknown"
    return f"cpu {name}{f' {mkl.group(1)}' if mkl else ''}"


# --- CuPy ------------------------------------------------------------------------------------------------------------

# cuBLAS / CUDA constants for the bf16 GEMM CuPy has no dtype for (cublasGemmEx on raw 16-bit buffers).
_CUDA_R_16BF = 14
_CUBLAS_OP_N = 0
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1


class CupyEngine(Engine):
    name = "cupy"

    def __init__(self) -> None:
        cupy: Any = importlib.import_module("cupy")
        self._cp = cupy
        self.version = str(cupy.__version__)
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # the CUDA runtime's own error types differ between CuPy releases
            raise NoEngine(f"CuPy {self.version} cannot reach a GPU: {exc}") from None
        if count < 1:
            raise NoEngine(f"CuPy {self.version} sees no GPU")
        cupy.cuda.Device(0).use()
        if getattr(cupy.cuda.runtime, "is_hip", False):
            raise NoEngine("the CuPy probe engine supports NVIDIA only; install PyTorch for ROCm")
        self.device = "cuda"
        self.blas_version = self._blas_version()
        self._gemm: Any = None
        self._keep: list[Any] = []
        self._dtype = ""

    def _blas_version(self) -> str:
        cp = self._cp
        try:
            cublas: Any = importlib.import_module("cupy_backends.cuda.libs.cublas")
            return f"cublas {cublas.getVersion(cp.cuda.device.get_cublas_handle())}"
        except Exception:  # fall back to the runtime, which pins the cuBLAS of a CuPy wheel
            return f"cublas (cuda runtime {cp.cuda.runtime.runtimeGetVersion()})"

    def prepare(self, n: int, dtype: str, seed: int = 0) -> None:
        cp = self._cp
        rng = cp.random.RandomState(seed)
        a32 = rng.standard_normal((n, n), dtype=cp.float32)
        b32 = rng.standard_normal((n, n), dtype=cp.float32)
        if dtype == "bf16":
            # bfloat16 is the top half of a float32; CuPy has no bf16 dtype, so GEMM runs on the raw bits.
            a = (a32.view(cp.uint32) >> 16).astype(cp.uint16)
            b = (b32.view(cp.uint32) >> 16).astype(cp.uint16)
            out = cp.empty((n, n), dtype=cp.uint16)
            self._gemm = self._bf16_gemm(n, a, b, out)
        else:
            dt = cp.float16 if dtype == "fp16" else cp.float32
            a, b = a32.astype(dt), b32.astype(dt)
            out = cp.empty((n, n), dtype=dt)
            matmul = cp.matmul
            self._gemm = lambda: matmul(a, b, out=out)
        self._keep = [a, b, out]
        self._dtype = dtype
        self.run(1)  # a cuBLAS call that fails (an unsupported type, a bad argument) fails now, where auto can move on
        self.synchronize()

    def _bf16_gemm(self, n: int, a: Any, b: Any, out: Any) -> Any:
        numpy: Any = importlib.import_module("numpy")
        cublas: Any = importlib.import_module("cupy_backends.cuda.libs.cublas")
        handle = self._cp.cuda.device.get_cublas_handle()
        alpha = numpy.array(1.0, dtype=numpy.float32)
        beta = numpy.array(0.0, dtype=numpy.float32)
        self._keep_host = (alpha, beta)
        gemm_ex = cublas.gemmEx
        args = (
            handle, _CUBLAS_OP_N, _CUBLAS_OP_N, n, n, n,
            alpha.ctypes.data, b.data.ptr, _CUDA_R_16BF, n, a.data.ptr, _CUDA_R_16BF, n,
            beta.ctypes.data, out.data.ptr, _CUDA_R_16BF, n, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip
        return lambda: gemm_ex(*args)

    def run(self, count: int) -> None:
        gemm = self._gemm
        for _ in range(count):
            gemm()

    def synchronize(self) -> None:
        self._cp.cuda.Device(0).synchronize()

    def timed(self, seconds: float, batch: int) -> list[float]:
        cuda = self._cp.cuda
        return _timed_on_device(self._gemm, cuda.Event, cuda.get_elapsed_time, seconds, batch)

    def copies(self, nbytes: int) -> dict[str, Any]:
        numpy: Any = importlib.import_module("numpy")
        cp = self._cp
        runtime = cp.cuda.runtime
        pinned = cp.cuda.alloc_pinned_memory(nbytes)
        host = numpy.frombuffer(pinned, dtype=numpy.uint8, count=nbytes)
        host.fill(1)
        dev = cp.empty(nbytes, dtype=cp.uint8)
        stream = cp.cuda.get_current_stream()

        def once(dst: int, src: int, kind: int) -> float:
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
            end.record(stream)
            end.synchronize()
            return float(cp.cuda.get_elapsed_time(start, end)) / 1000.0

        h2d = lambda: once(dev.data.ptr, host.ctypes.data, runtime.memcpyHostToDevice)  # noqa: E731
        d2h = lambda: once(host.ctypes.data, dev.data.ptr, runtime.memcpyDeviceToHost)  # noqa: E731
        return _copy_bandwidths(h2d, d2h, nbytes)

    def _to64(self, block: Any) -> Any:
        cp = self._cp
        if self._dtype == "bf16":  # raw bits: a bf16 is the top half of a float32
            return (block.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
        return block.astype(cp.float64)

    def check(self) -> CheckResult:
        self.synchronize()
        a, b, out = self._keep
        return _timed_check(lambda: check_columns(a, b, out, dtype=self._dtype, truncating=True, to64=self._to64))

    def corrupt(self, count: int) -> int:
        numpy: Any = importlib.import_module("numpy")
        self.synchronize()
        out = self._keep[2]
        targets = corruption_targets(int(out.shape[0]), count)
        for row, column in targets:
            norm = float(self._cp.linalg.norm(self._to64(out[:, column])))
            value = float(self._to64(out[row : row + 1, column])[0]) + CORRUPT_SCALE * norm
            if self._dtype == "bf16":
                out[row, column] = int(numpy.array(value, dtype=numpy.float32).view(numpy.uint32)) >> 16
            else:
                out[row, column] = value
        self.synchronize()
        return len(targets)


# --- shared timing helpers -------------------------------------------------------------------------------------------


def _timed_on_device(
    run_one: Callable[[], Any],
    new_event: Callable[[], Any],
    elapsed_ms: Callable[[Any, Any], float],
    seconds: float,
    batch: int,
) -> list[float]:
    """Seconds per matmul from device events around each one, over at least `seconds` of wall time.

    The next batch is queued before we wait on this one, so the GPU never runs dry while we look at the clock."""
    marks = [new_event()]
    marks[0].record()
    started = time.perf_counter()
    waiting_on = None
    while True:
        for _ in range(batch):
            run_one()
            mark = new_event()
            mark.record()
            marks.append(mark)
        if waiting_on is not None:
            waiting_on.synchronize()
            if time.perf_counter() - started >= seconds:
                break
        waiting_on = marks[-1]
    marks[-1].synchronize()
    return [elapsed_ms(marks[i], marks[i + 1]) / 1000.0 for i in range(len(marks) - 1)]


def _timed_on_host(run: Any, seconds: float) -> list[float]:
    times: list[float] = []
    started = time.perf_counter()
    while not times or time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        run(1)
        times.append(time.perf_counter() - t0)
    return times


def _copy_bandwidths(h2d: Any, d2h: Any, nbytes: int, repeats: int = 3) -> dict[str, Any]:
    """Median of `repeats` copies each way, after one untimed copy each way (first-touch costs)."""
    h2d()
    d2h()
    up = median([h2d() for _ in range(repeats)])
    down = median([d2h() for _ in range(repeats)])
    return {
        "copy_kind": "pinned",
        "copy_bytes": nbytes,
        "h2d_bytes_per_second": nbytes / up if up > 0 else None,
        "d2h_bytes_per_second": nbytes / down if down > 0 else None,
    }


def _host_memcpy(copy: Any, nbytes: int, repeats: int = 3) -> dict[str, Any]:
    """On the CPU there is no link to measure: a host memcpy of the same size, labelled as such."""
    copy()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy()
        times.append(time.perf_counter() - t0)
    took = median(times)
    return {
        "copy_kind": "host-memcpy (no device: not a PCIe measurement)",
        "copy_bytes": nbytes,
        "h2d_bytes_per_second": None,
        "d2h_bytes_per_second": None,
        "host_memcpy_bytes_per_second": nbytes / took if took > 0 else None,
    }


ENGINE_DISTRIBUTIONS = {"cupy": ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"), "torch": ("torch",)}


def engine_versions(found: list[str]) -> dict[str, str]:
    """The engines a launcher found, in preference order, with their package's version (a name that is no package of
    ours, like the simulated node's worker, stands as it is)."""
    versions = {}
    for name in found:
        dist = ENGINE_DISTRIBUTIONS.get(name, ())
        versions[name] = next(
            (v for d in dist if (v := _dist_version(d)) is not None), "" if not dist else "unknown version"
        )
    return versions


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
