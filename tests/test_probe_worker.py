"""The real probe worker in a child process: on the CPU with PyTorch's CPU build (CI), and its error contract."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.probe.engines import available_engines
from gpuwatch.probe.protocol import CAPPED_LINE

WORKER = [sys.executable, "-m", "gpuwatch.probe.worker", "--json"]
TINY = ["--size", "64", "--warmup-min", "0.02", "--warmup-max", "0.05", "--measure", "0.05", "--copy-mib", "1"]


def run(*args: str, stdin: str = "", command: list[str] = WORKER) -> tuple[int, dict]:  # type: ignore[type-arg]
    proc = subprocess.run([*command, *args], input=stdin, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"one JSON line on stdout, got {proc.stdout!r} (stderr {proc.stderr[-500:]!r})"
    return proc.returncode, json.loads(lines[0])


@pytest.fixture
def torch_installed() -> None:
    if "torch" not in available_engines():
        if os.environ.get("CI"):
            raise RuntimeError("torch is missing: scripts/test.sh installs torch==2.13.0 (CPU build)")
        pytest.skip("torch not installed (pip install torch==2.13.0)")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_real_worker_measures_a_matmul_on_the_cpu(torch_installed: None, dtype: str) -> None:
    code, doc = run("--device", "cpu", "--engine", "torch", "--dtype", dtype, *TINY)
    assert code == 0 and doc["ok"], doc
    assert doc["engine"] == "torch" and doc["device"] == "cpu" and doc["dtype"] == dtype
    assert doc["engine_version"].startswith("2.") and doc["blas_version"].startswith("cpu ")
    assert doc["shape"] == "64x64x64"
    assert doc["iterations"] >= 1 and doc["gpu_time_seconds"] > 0
    assert 0 < doc["flops_p10"] <= doc["flops_median"] <= doc["flops_p90"]
    assert doc["spread_ratio"] == pytest.approx((doc["flops_p90"] - doc["flops_p10"]) / doc["flops_median"])
    assert doc["power_capped"] is None  # no power signal on the CPU
    # No device, no link: the copy is a host memcpy, labelled as such, never passed off as PCIe bandwidth.
    assert doc["h2d_bytes_per_second"] is None and doc["d2h_bytes_per_second"] is None
    assert "host-memcpy" in doc["copy_kind"] and doc["host_memcpy_bytes_per_second"] > 0


def test_the_reported_gpu_time_covers_warm_up_measured_window_and_copies(torch_installed: None) -> None:
    """gpuwatch_probe_duration_seconds is what a probe costs the GPU, not only its measured window."""
    args = ["--device", "cpu", "--engine", "torch", "--size", "64", "--warmup-min", "0.3", "--warmup-max", "0.3"]
    code, doc = run(*args, "--measure", "0.2", "--copy-mib", "16")
    assert code == 0 and doc["ok"], doc
    assert doc["warmup_seconds"] >= 0.3 and doc["measured_seconds"] > 0
    phases = doc["warmup_seconds"] + doc["measured_seconds"]
    assert doc["gpu_time_seconds"] >= phases >= 0.45  # was the measured window alone (~0.2 s)
    assert doc["gpu_time_seconds"] <= doc["wall_seconds"] - doc["startup_seconds"] + 1e-3


def test_the_worker_ends_warm_up_when_told_the_power_limit_is_reached(torch_installed: None) -> None:
    args = ["--device", "cpu", "--size", "32", "--warmup-min", "0", "--warmup-max", "60", "--measure", "0.02"]
    code, doc = run(*args, "--copy-mib", "0", "--power-signal", stdin="capped\n")
    assert code == 0 and doc["power_capped"] is True and doc["warmup_seconds"] < 60


def test_a_cpu_only_torch_on_a_gpu_node_is_no_engine_not_a_cpu_measurement(torch_installed: None) -> None:
    env_has_gpu = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    ).stdout.strip()
    if env_has_gpu == "True":
        pytest.skip("this machine has a GPU")
    code, doc = run("--engine", "torch", *TINY)
    assert code == 3 and doc == {"ok": False, "error": "no_engine", "message": doc["message"]}
    assert "sees no GPU" in doc["message"]


def test_a_missing_engine_is_a_clear_no_engine_error() -> None:
    if "cupy" in available_engines():
        pytest.skip("CuPy is installed here")
    code, doc = run("--engine", "cupy", *TINY)
    assert code == 3 and doc["error"] == "no_engine" and "cupy" in doc["message"]


def test_the_simulated_worker_is_a_realistic_h100_slowed_by_the_scenario() -> None:
    """Its own entry point, a real child taking the production worker's arguments; the production worker has no
    simulation left in it."""
    sim = [sys.executable, "-m", "gpuwatch.simulated.probe_worker", "--json", "--seed", "1", "--seconds", "0"]
    code, healthy = run(*TINY, "--power-signal", stdin=f"{CAPPED_LINE}\n", command=sim)
    assert code == 0 and 680e12 < healthy["flops_median"] < 700e12 and healthy["power_capped"] is True
    assert healthy["shape"] == "64x64x64" and healthy["engine"] == "simulated"
    code, slow = run("--slowdown", "0.2", command=sim)
    assert slow["flops_median"] == pytest.approx(0.8 * healthy["flops_median"])
    # As the production worker: power_capped only when the runner said so before warm-up ended, None unasked.
    assert run(*TINY, "--power-signal", command=sim)[1]["power_capped"] is False
    assert slow["power_capped"] is None
    # The clock its GPU's physics gives the probe's load (the launcher's --clock-share) sets its throughput.
    capped = run("--clock-share", "0.845", command=sim)[1]
    assert capped["flops_median"] == pytest.approx(0.845 * healthy["flops_median"])
    refused = subprocess.run([*WORKER, "--simulate"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unrecognized arguments: --simulate" in refused.stderr


def test_the_simulated_workers_noise_and_spread_are_what_h100s_measured() -> None:
    """Probe to probe and within a probe, the simulated H100 varies as real ones did: the CV of the median between
    the fixture H100's (0.14-0.42 %, tests/fixtures/h100/probe-measurements.json) and a second H100's (10 idle probes,
    twice: benchmarks/hardware/results/2026-11-26-h100/probe_study*.json), the timed matmuls' p10 and p90 as far from
    the median as that H100's were."""
    from gpuwatch.simulated.probe_worker import simulate, simulated_parser

    results = Path(__file__).resolve().parents[1] / "benchmarks/hardware/results/2026-11-26-h100"
    studies = [json.loads((results / name).read_text()) for name in ("probe_study.json", "probe_study_defaults.json")]
    real_cv = [study["probes"]["stats"]["flops_all"]["cv_pct_population"] / 100 for study in studies]
    measured = [p["result"]["measured"] for study in studies for p in study["probes"]["probes"]]
    below = [1 - m["flops_p10"] / m["flops_median"] for m in measured]
    above = [m["flops_p90"] / m["flops_median"] - 1 for m in measured]
    docs = [simulate(simulated_parser().parse_args(["--seed", str(seed), "--seconds", "0"])) for seed in range(300)]
    medians = [doc["flops_median"] for doc in docs]
    cv = statistics.pstdev(medians) / statistics.fmean(medians)
    assert 0.0014 <= cv <= max(real_cv)
    sim_below = [1 - doc["flops_p10"] / doc["flops_median"] for doc in docs]
    sim_above = [doc["flops_p90"] / doc["flops_median"] - 1 for doc in docs]
    assert min(below) <= statistics.median(sim_below) <= max(below)
    assert min(above) <= statistics.median(sim_above) <= max(above)


def test_device_timing_loop_times_every_matmul_between_its_events() -> None:
    """The loop both GPU engines share, driven by host-clock events: one interval per matmul, over the window."""
    import time

    from gpuwatch.probe.engines import _timed_on_device

    class HostEvent:
        def record(self) -> None:
            self.at = time.perf_counter()

        def synchronize(self) -> None:
            pass

    runs: list[float] = []
    times = _timed_on_device(
        lambda: runs.append(time.sleep(0.002) or 0.0),
        HostEvent,
        lambda start, end: (end.at - start.at) * 1000.0,
        0.05,
        4,
    )
    assert len(times) == len(runs) and len(runs) % 4 == 0 and len(runs) >= 8
    assert all(0.0015 < t < 0.05 for t in times)
    assert sum(times) >= 0.05


BROKEN_CUPY = """
__version__ = "13.9.9"


class _Runtime:
    @staticmethod
    def getDeviceCount():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")


class cuda:
    runtime = _Runtime
"""


@pytest.fixture
def forget_cupy() -> Iterator[None]:
    """An in-process test imports its own fake CuPy; no other test may find it in sys.modules."""
    sys.modules.pop("cupy", None)
    yield
    sys.modules.pop("cupy", None)


@pytest.fixture
def broken_cupy(tmp_path: Path) -> Path:
    """A CuPy wheel built for a newer CUDA than the node's driver: it imports, then cannot reach the GPU."""
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(BROKEN_CUPY)
    return tmp_path


def test_auto_goes_past_a_cupy_that_cannot_run_and_says_why(torch_installed: None, broken_cupy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken_cupy), *sys.path])}
    proc = subprocess.run([*WORKER, "--engine", "auto", *TINY], capture_output=True, text=True, timeout=120, env=env)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    # Here torch is the CPU build, so it cannot run on a GPU either: no engine, with both reasons.
    assert proc.returncode == 3 and doc["error"] == "no_engine", doc
    assert "cupy: CuPy 13.9.9 cannot reach a GPU: cudaErrorInsufficientDriver" in doc["message"]
    assert "torch: torch 2." in doc["message"] and "sees no GPU" in doc["message"]


def test_a_failed_engine_hands_over_to_the_next_that_runs(
    torch_installed: None, broken_cupy: Path, monkeypatch: pytest.MonkeyPatch, forget_cupy: None
) -> None:
    from gpuwatch.probe import engines

    monkeypatch.syspath_prepend(str(broken_cupy))
    monkeypatch.setattr(engines, "_candidates", lambda choice, vendor, device: ["cupy", "torch"])  # a GPU node's order
    engine, passed_over = engines.prepared_engine("auto", "nvidia", "cpu", 32, "fp32")
    assert engine.name == "torch" and engine.device == "cpu"
    assert passed_over == [
        "cupy: CuPy 13.9.9 cannot reach a GPU: cudaErrorInsufficientDriver: CUDA driver version is insufficient "
        "for CUDA runtime version"
    ]
    engine.run(1)  # prepared: operands allocated
    engine.synchronize()


OOM_CUPY = """
__version__ = "13.9.9"


class _Runtime:
    is_hip = False

    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def runtimeGetVersion():
        return 12080


class _Device:
    def __init__(self, index):
        pass

    def use(self):
        pass


class cuda:
    runtime = _Runtime
    Device = _Device


class random:
    @staticmethod
    def RandomState(seed):
        raise RuntimeError("cudaErrorMemoryAllocation: out of memory")
"""


def test_a_real_failure_of_the_first_engine_stays_a_failure_when_none_runs(
    torch_installed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget_cupy: None
) -> None:
    """CuPy reached the GPU and then failed: with a CPU-only torch beside it that is a failed probe (an alert), not
    'no engine' (a quiet skip)."""
    from gpuwatch.probe import engines

    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(OOM_CUPY)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        RuntimeError, match=r"^cupy: cudaErrorMemoryAllocation: out of memory; torch: torch 2\."
    ) as info:
        engines.prepared_engine("auto", "nvidia", "gpu", 32, "fp32")
    assert not isinstance(info.value, engines.NoEngine) and "sees no GPU" in str(info.value)
