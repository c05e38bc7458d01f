"""Every probe checks its result (issue #33): the column checksums of C = A·B against (1ᵀA)·B, with a tolerance
derived from the dtype's rounding and the size (gpuwatch/probe/checksum.py, docs/probe.md "Checked results").

Real parts throughout: torch's CPU build computes the matmuls the check judges (the production engine's code path),
the worker and the agent run as child processes, and a wrong result is followed from the worker's JSON to the
metric, the verdict and /health/gpus on the simulated node's scenario `corrupt`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from processes import until
from test_agent_process import Agent, samples
from test_probe_worker import TINY, WORKER, run, torch_installed  # noqa: F401 (the fixture)

from gpuwatch.probe.checksum import (
    CORRUPT_SCALE,
    FALSE_ALARM_PROBABILITY,
    accumulation_gamma,
    check_columns,
    confidence_factor,
    corruption_targets,
)
from gpuwatch.probe.engines import CupyEngine

SIM_WORKER = [sys.executable, "-m", "gpuwatch.simulated.probe_worker", "--json", "--seconds", "0"]


def _torch() -> Any:
    return pytest.importorskip("torch")


def _product(n: int, dtype: str, seed: int) -> tuple[Any, Any, Any]:
    """A, B (random normal, as the probe draws them) and C = A·B computed by torch in `dtype` on the CPU."""
    torch = _torch()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn((n, n), generator=gen).to(dt)
    b = torch.randn((n, n), generator=gen).to(dt)
    return a, b, torch.mm(a, b)


def _check(a: Any, b: Any, c: Any, dtype: str, truncating: bool = False) -> Any:
    f64 = _torch().float64
    return check_columns(a, b, c, dtype=dtype, truncating=truncating, to64=lambda x: x.to(f64))


# --- the tolerance -------------------------------------------------------------------------------------------------


def test_the_confidence_factor_is_hoeffdings_for_the_stated_false_alarm_probability() -> None:
    """λ = sqrt(2·ln(2n/p)): 2·exp(−λ²/2) per column times n columns is exactly p."""
    for n in (64, 8192):
        lam = confidence_factor(n)
        assert n * 2 * math.exp(-(lam**2) / 2) == pytest.approx(FALSE_ALARM_PROBABILITY)
    assert confidence_factor(8192) == pytest.approx(7.80, abs=0.01)
    with pytest.raises(ValueError, match="false-alarm probability"):
        confidence_factor(8192, 0.0)


def test_truncating_hardware_gets_twice_the_accumulation_bound_and_fp32_one_more_rounding() -> None:
    assert accumulation_gamma(8192, "bf16", truncating=True) == pytest.approx(
        2 * accumulation_gamma(8192, "bf16", truncating=False), rel=1e-3
    )
    assert accumulation_gamma(8192, "fp32", False) > accumulation_gamma(8192, "bf16", False)  # products round


# --- healthy results pass, wrong ones do not -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_healthy_results_pass_for_every_seed(dtype: str) -> None:
    """40 seeds at two sizes, checked as on the CPU (round to nearest, the tighter bound): no column flagged, and the
    worst stays well inside its tolerance (a margin, not a near miss)."""
    worst = 0.0
    for seed in range(20):
        for n in (64, 256):
            result = _check(*_product(n, dtype, seed), dtype)
            assert result.bad_columns == 0, (dtype, n, seed, result)
            worst = max(worst, result.worst_excess)
    assert 0 < worst < 0.5, worst


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_one_corrupted_element_of_the_documented_size_is_caught_in_its_column(dtype: str) -> None:
    a, b, c = _product(256, dtype, 7)
    f64 = _torch().float64
    (row, column), *_ = corruption_targets(256, 1)
    c[row, column] = float(c[row, column]) + CORRUPT_SCALE * float(c[:, column].to(f64).norm())
    result = _check(a, b, c, dtype)
    assert result.bad_columns == 1 and result.worst_column == column
    assert result.worst_excess > 3  # CORRUPT_SCALE·‖C_j‖ is several tolerances, for every dtype


def test_a_corruption_below_the_tolerance_is_not_seen() -> None:
    """The check's honest limit (docs/probe.md): a single element off by less than its column's tolerance passes."""
    a, b, c = _product(256, "fp32", 3)
    column = 11
    tolerance = _check(a, b, c, "fp32").worst_tolerance  # of the worst column; every tolerance is of this order
    c[5, column] += tolerance * 0.05
    assert _check(a, b, c, "fp32").bad_columns == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_result_that_is_not_finite_is_always_wrong(bad: float) -> None:
    a, b, c = _product(64, "bf16", 1)
    c[3, 9] = bad
    result = _check(a, b, c, "bf16")
    assert result.bad_columns == 1 and result.worst_column == 9
    assert result.as_json()["worst_excess"] is None  # JSON has no NaN: null says "not finite"


def test_the_hook_corrupts_distinct_columns_and_refuses_a_negative_count() -> None:
    targets = corruption_targets(256, 5)
    assert len({column for _, column in targets}) == 5
    with pytest.raises(ValueError, match="give 0 or more"):
        corruption_targets(256, -1)


# --- the CuPy engine's check, on NumPy ------------------------------------------------------------------------------
# CuPy implements NumPy's array API ("CuPy is a NumPy/SciPy-compatible array library", docs.cupy.dev, Overview), and
# the CuPy engine's check, its float64 conversion of the raw bf16 bits and its corruption hook use only that API. No
# GPU here runs CuPy, so NumPy stands in for it below; only the GEMM, cuBLAS's, is computed by NumPy too (bf16: the
# float32 product rounded to nearest even, as cublasGemmEx with CUBLAS_COMPUTE_32F stores it).


def _numpy_cupy_engine(dtype: str, n: int) -> Any:
    numpy = pytest.importorskip("numpy")

    def bf16_gemm(n: int, a: Any, b: Any, out: Any) -> Any:
        def gemm() -> None:
            wide = lambda x: (x.astype(numpy.uint32) << 16).view(numpy.float32)  # noqa: E731
            bits = (wide(a) @ wide(b)).view(numpy.uint32)
            out[...] = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(numpy.uint16)

        return gemm

    class NumpyAsCupy:
        """NumPy, but with CuPy's RandomState: its standard_normal takes a dtype, as NumPy's Generator's does."""

        random = SimpleNamespace(RandomState=numpy.random.default_rng)

        def __getattr__(self, name: str) -> Any:
            return getattr(numpy, name)

    engine = object.__new__(CupyEngine)
    engine._cp = NumpyAsCupy()
    engine._keep = []
    engine._dtype = ""
    engine.synchronize = lambda: None  # type: ignore[method-assign]
    engine._bf16_gemm = bf16_gemm  # type: ignore[method-assign]
    engine.prepare(n, dtype, seed=3)
    return engine


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_cupy_engines_check_passes_its_product_and_catches_one_corrupted_element(dtype: str) -> None:
    engine = _numpy_cupy_engine(dtype, 256)
    healthy = engine.check()
    assert healthy.ok and healthy.columns == 256, healthy
    assert engine.corrupt(1) == 1
    wrong = engine.check()
    assert wrong.bad_columns == 1 and wrong.worst_excess > 1.0, wrong
    assert wrong.worst_column == corruption_targets(256, 1)[0][1]


# --- the worker ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_worker_reports_its_check_and_the_hooks_corruption(torch_installed: None, dtype: str) -> None:  # noqa: F811
    base = ["--device", "cpu", "--engine", "torch", "--dtype", dtype, *TINY]
    code, doc = run(*base)
    assert code == 0 and doc["ok"], doc
    check = doc["compute_check"]
    assert check["ran"] is True and check["columns"] == 64 and check["bad_columns"] == 0
    assert 0 < check["worst_excess"] <= 1 and check["tolerance"] > 0 and check["corrupted_elements"] == 0
    code, doc = run(*base, "--corrupt-elements", "2")
    assert code == 0 and doc["ok"], doc  # the worker reports; the runner judges
    check = doc["compute_check"]
    assert check["bad_columns"] == 2 and check["corrupted_elements"] == 2 and check["worst_excess"] > 1


def test_the_worker_refuses_a_negative_corruption_count_clearly() -> None:
    proc = subprocess.run([*WORKER, "--corrupt-elements", "-1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "-1 is negative (give 0 or more)" in proc.stderr


def test_the_simulated_worker_checks_a_real_cpu_matmul_when_asked(torch_installed: None) -> None:  # noqa: F811
    code, doc = run("--check-on-cpu", "--corrupt-elements", "3", command=SIM_WORKER)
    check = doc["compute_check"]
    assert code == 0 and check["ran"] is True and check["bad_columns"] == 3 and check["corrupted_elements"] == 3
    assert "on the CPU" in check["engine"] and "stands in" in check["engine"]
    code, doc = run("--check-on-cpu", command=SIM_WORKER)
    assert doc["compute_check"]["ran"] is True and doc["compute_check"]["bad_columns"] == 0
    code, doc = run(command=SIM_WORKER)  # not asked: says it did not check, never pretends
    assert doc["compute_check"]["ran"] is False and "computes nothing" in doc["compute_check"]["why"]


def test_the_simulated_worker_without_torch_says_the_check_did_not_run(tmp_path: Path) -> None:
    """The demo on a bare machine: a `torch` that cannot be found (a shadowing module that hides it) is reported."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util, sys\n"
        "_real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'torch' else _real(name, *a)\n"
    )
    env = {"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[1]}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [*SIM_WORKER, "--check-on-cpu", "--corrupt-elements", "3"], capture_output=True, text=True, env=env, timeout=60
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["compute_check"] == {"ran": False, "why": doc["compute_check"]["why"]}
    assert "torch is not installed" in doc["compute_check"]["why"]


# --- scenario corrupt: counted, paged, never slow ------------------------------------------------------------------


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels` (the UUID need not be given); None if there is none."""
    found = [v for (n, have), v in samples(text).items() if n == name and set(labels.items()) <= have]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def _health(base: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{base}/health/gpus?format=json")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_scenario_corrupt_counts_and_pages_the_wrong_result_within_one_probe(
    tmp_path: Path,
    torch_installed: None,  # noqa: F811
) -> None:
    agent = Agent(tmp_path, "--scenario", "corrupt", "--gpus", "4", "--probe-interval", "2")
    try:
        agent.wait_ready()
        first = _wait_for_series(agent, "gpuwatch_probe_runs_total", result="ok", gpu="3")
        for gpu in range(4):  # exported from 0 for every GPU the probe runs on, before any probe ended
            assert value(first, "gpuwatch_probe_compute_errors_total", gpu=str(gpu)) == 0.0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            text = agent.metrics()
            if (value(text, "gpuwatch_probe_compute_errors_total", gpu="2") or 0) >= 1:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("GPU 2's compute error was never counted")
        status, doc = _health(agent.base)  # the same probe round: paged at once
        runs = {r: value(text, "gpuwatch_probe_runs_total", gpu="2", result=r) for r in ("ok", "compute_error")}
        assert runs["ok"] == 0.0 and runs["compute_error"] == value(
            text, "gpuwatch_probe_compute_errors_total", gpu="2"
        )
        assert status == 503 and doc["healthy"] is False
        gpu2 = next(g for g in doc["gpus"] if g["index"] == 2)
        assert gpu2["state"] == "unhealthy" and gpu2["action"] == "reset_gpu", gpu2
        evidence = " ".join(gpu2["evidence"])
        assert "GpuComputeErrors" in evidence and "3 of 256 column checksums disagree" in evidence
        assert "corrupted on purpose" in evidence  # the simulated node's planted error says so
        # Never "slow": no throughput of the wrong result is exported, no slow verdict, no baseline learnt from it.
        assert "GpuUnderperforming" not in evidence and "GpuSlowerThanFleet" not in evidence
        assert value(text, "gpuwatch_probe_flops", gpu="2", dtype="bf16") is None
        assert value(text, "gpuwatch_probe_baseline_flops", gpu="2", dtype="bf16") is None
        # The healthy GPUs ran the same real check, passed it, and count none.
        text = _wait_for_ok_probes(agent, [0, 1, 3])
        for gpu in (0, 1, 3):
            assert value(text, "gpuwatch_probe_compute_errors_total", gpu=str(gpu)) == 0.0
            assert value(text, "gpuwatch_probe_runs_total", gpu=str(gpu), result="compute_error") is None  # none yet
            verdict = next(g for g in _health(agent.base)[1]["gpus"] if g["index"] == gpu)
            assert verdict["state"] == "healthy", verdict
        code, _elapsed, out = agent.stop()
        assert code == 0
        assert "computed a wrong result: 3 of 256 column checksums disagree" in out  # logged, with the runbook
        assert "#gpucomputeerrors" in out
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.communicate()


def _wait_for_series(agent: Agent, name: str, timeout: float = 30.0, **labels: str) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = agent.metrics()
        if value(text, name, **labels) is not None:
            return text
        time.sleep(0.1)
    raise AssertionError(f"{name}{labels} never exported")


def _wait_for_ok_probes(agent: Agent, gpus: list[int], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = agent.metrics()
        if all((value(text, "gpuwatch_probe_runs_total", gpu=str(g), result="ok") or 0) >= 1 for g in gpus):
            return text
        time.sleep(0.2)
    raise AssertionError(f"GPUs {gpus} never probed ok")


def test_gpuwatch_probe_on_scenario_corrupt_reports_each_gpus_check(tmp_path: Path, torch_installed: None) -> None:  # noqa: F811
    """`gpuwatch probe --json`, one round: GPU 2's real CPU check finds its 3 corrupted elements (compute_error, exit
    1); GPU 0, the control, passed the same real check; the others say they were not checked."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "gpuwatch", "probe", "--backend", "simulated", "--scenario", "corrupt"),
            *("--gpus", "4", "--state-dir", str(tmp_path / "state"), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    results = {r["gpu"]: r for r in json.loads(proc.stdout)["results"]}
    assert proc.returncode == 1, proc.stderr[-500:]
    wrong = results[2]
    assert wrong["result"] == "compute_error" and wrong["ratio_to_baseline"] is None and wrong["baseline_flops"] is None
    check = wrong["measured"]["compute_check"]
    assert check["ran"] and check["bad_columns"] == 3 and check["corrupted_elements"] == 3 and check["columns"] == 256
    assert "stands in" in check["engine"]
    control = results[0]["measured"]["compute_check"]
    assert results[0]["result"] == "ok" and control["ran"] and control["bad_columns"] == 0 and control["columns"] == 256
    for gpu in (1, 3):
        assert results[gpu]["result"] == "ok" and results[gpu]["measured"]["compute_check"]["ran"] is False
    assert "computed a wrong result" in proc.stderr and "#gpucomputeerrors" in proc.stderr


def test_the_ledger_holds_a_compute_error_and_escalates_it_after_two_repairs(
    tmp_path: Path,
    torch_installed: None,  # noqa: F811
) -> None:
    """Written to the fault ledger with its evidence; `gpuwatch repair` closes it, the next wrong result opens it
    again, and after two repairs it asks for inspect_hardware ([ledger] escalate_after = 2)."""
    from gpuwatch.state.ledger import LEDGER_FILE

    agent = Agent(tmp_path, "--scenario", "corrupt", "--gpus", "3", "--probe-interval", "2")
    ledger = agent.state_dir / LEDGER_FILE

    def open_fault() -> dict[str, Any] | None:
        if not ledger.exists():
            return None
        for record in json.loads(ledger.read_text())["gpus"].values():
            for fault in record["faults"]:
                if fault["key"] == "GpuComputeErrors" and fault.get("closed") is None:
                    return dict(fault)
        return None

    try:
        agent.wait_ready()
        actions = []
        for round_ in range(3):
            fault = until(f"an open GpuComputeErrors fault (round {round_})", open_fault, 60, every=0.2)
            assert "column checksums disagree" in fault["evidence"] and fault["index"] == 2, fault
            status, doc = _health(agent.base)
            gpu2 = next(g for g in doc["gpus"] if g["index"] == 2)
            assert status == 503 and "held until repaired" in " ".join(gpu2["evidence"]), gpu2
            actions.append(gpu2["action"])
            repair = subprocess.run(
                [
                    *(sys.executable, "-m", "gpuwatch", "repair", "--gpu", "2", "--note", f"reset, round {round_}"),
                    *("--state-dir", str(agent.state_dir)),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert repair.returncode == 0 and "GpuComputeErrors" in repair.stdout, repair.stdout + repair.stderr
            closed = json.loads(ledger.read_text())["gpus"][gpu2["uuid"]]["faults"][round_]["closed"]
            assert closed["how"] == "repair" and closed["note"] == f"reset, round {round_}", closed
        assert actions == ["reset_gpu", "reset_gpu", "inspect_hardware"]
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.communicate()


@pytest.mark.parametrize(
    ("check", "error"),
    [
        ("yes", "must be an object"),
        ({"ran": "yes"}, "ran must be a boolean"),
        ({"ran": True, "columns": 8, "bad_columns": 9}, "0 <= bad_columns <= columns"),
        ({"ran": True, "columns": 8, "bad_columns": -1}, "0 <= bad_columns <= columns"),
    ],
)
def test_a_malformed_compute_check_is_a_malformed_result_not_a_verdict(check: object, error: str) -> None:
    """The runner makes a malformed worker result `failed` (never ok, never compute_error): it must be refused."""
    from gpuwatch.state.probebook import WorkerResult

    good = {
        **dict.fromkeys(("engine", "engine_version", "blas_version", "dtype", "shape", "copy_kind"), "x"),
        **dict.fromkeys(("flops_median", "flops_p10", "flops_p90", "spread_ratio", "gpu_time_seconds"), 1.0),
        "iterations": 1,
    }
    assert WorkerResult.from_json(good).compute_check is None  # a worker from before the check: nothing claimed
    with pytest.raises((TypeError, ValueError), match=error):
        WorkerResult.from_json({**good, "compute_check": check})
