"""`gpuwatch diag`'s node-wide tests, beside each GPU's own (gpuwatch/probe/diag.py): the all-reduce across the node's
GPUs, and DCGM's or RVS's own diagnostics where they are installed. Neither is ever required: each is "skip" with
the reason where it cannot run.

`dcgmi diag -r N -j` prints DCGM 4's JSON: ``{"DCGM Diagnostic": {"test_categories": [{"category": …, "tests":
[{"name": …, "results": [{"entity_group": "GPU", "entity_id": N, "status": "Pass"|"Fail"|"Skip"|"Warn"|…,
"warnings": [{"warning": …, "error_id": …}]}], "test_summary": {"status": …}}]}], "runtime_error": …}}``, as
NVIDIA/DCGM's testing/python3/dcgm_diag_schema.json defines it; its entity ids are NVML's GPU indices.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from gpuwatch.core.model import GpuIdentity
from gpuwatch.probe.diag import TestOutcome

DCGM_SECONDS = {1: 120.0, 2: 600.0, 3: 1800.0}  # dcgmi diag -r 1 takes about a minute, -r 3 up to half an hour
RVS_NOT_YET = "RVS is installed, but folding its results in is not done yet: run `rvs` by hand"


def node_tests(
    identities: list[GpuIdentity],
    hello: dict[str, Any],
    level: int,
    *,
    which: Callable[[str], str | None] = shutil.which,
) -> dict[str, list[TestOutcome]]:
    """Each GPU's outcomes of the node-wide tests, by UUID."""
    out: dict[str, list[TestOutcome]] = {i.uuid: [allreduce(identities, hello)] for i in identities}
    vendors = {i.vendor for i in identities}
    if "nvidia" in vendors:
        for uuid, outcome in dcgm(identities, level, which).items():
            out[uuid].append(outcome)
    if "amd" in vendors:
        found = which("rvs")
        reason = RVS_NOT_YET if found else "RVS is not installed (no rvs on PATH)"
        for i in identities:
            out[i.uuid].append(TestOutcome("rvs", "skip", reason, 0.0))
    return out


def allreduce(identities: list[GpuIdentity], hello: dict[str, Any]) -> TestOutcome:
    """An all-reduce across the node's GPUs; where it cannot run, a skip that says why."""
    if len(identities) < 2:
        return TestOutcome("allreduce", "skip", "one GPU under test: an all-reduce needs two or more", 0.0)
    if not hello:
        return TestOutcome("allreduce", "skip", "no diag child reported its engine (PyTorch missing?)", 0.0)
    if not hello.get("nccl"):
        return TestOutcome(
            "allreduce",
            "skip",
            f"PyTorch {hello.get('version', '?')} has no NCCL/RCCL (torch.distributed.is_nccl_available() is False)",
            0.0,
        )
    return TestOutcome(
        "allreduce", "skip", "PyTorch has NCCL, but the all-reduce test is not implemented in this version yet", 0.0
    )


def dcgm(
    identities: list[GpuIdentity], level: int, which: Callable[[str], str | None] = shutil.which
) -> dict[str, TestOutcome]:
    """`dcgmi diag -r LEVEL -j` folded in: one outcome per GPU (fail when any of its results failed)."""
    dcgmi = which("dcgmi")
    if dcgmi is None:
        return {
            i.uuid: TestOutcome("dcgm", "skip", "DCGM is not installed (no dcgmi on PATH)", 0.0) for i in identities
        }
    indices = ",".join(str(i.index) for i in identities)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [dcgmi, "diag", "-r", str(level), "-j", "-i", indices],
            capture_output=True,
            timeout=DCGM_SECONDS[level],
            check=False,
        )
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - started
        text = f"dcgmi diag -r {level} did not finish within {DCGM_SECONDS[level]:g} s (killed)"
        return {i.uuid: TestOutcome("dcgm", "skip", text, seconds) for i in identities}
    seconds = time.monotonic() - started
    return {
        i.uuid: fold_dcgm(done.stdout.decode(errors="replace"), i.index, level, seconds, done.returncode)
        for i in identities
    }


def fold_dcgm(text: str, index: int, level: int, seconds: float, code: int = 0) -> TestOutcome:
    """One GPU's outcome from `dcgmi diag -j`'s JSON (DCGM 4's schema)."""
    try:
        doc = json.loads(text)
        diag = doc["DCGM Diagnostic"]
    except (ValueError, KeyError, TypeError):
        return TestOutcome("dcgm", "skip", f"dcgmi diag -r {level} gave no JSON (exit {code}): {text[-200:]}", seconds)
    if diag.get("runtime_error"):
        return TestOutcome("dcgm", "skip", f"dcgmi diag -r {level}: {diag['runtime_error']}", seconds)
    passed: list[str] = []
    failed: list[str] = []
    for category in diag.get("test_categories", []):
        for test in category.get("tests", []):
            for result in test.get("results", []):
                if result.get("entity_group") != "GPU" or result.get("entity_id") != index:
                    continue
                status = str(result.get("status", "")).lower()
                if status == "pass":
                    passed.append(test.get("name", "?"))
                elif status == "fail":
                    warnings = "; ".join(str(w.get("warning", "")) for w in result.get("warnings", []))
                    failed.append(f"{test.get('name', '?')}: {warnings}".rstrip(": "))
    if failed:
        return TestOutcome("dcgm", "fail", f"dcgmi diag -r {level}: " + " | ".join(failed), seconds)
    if passed:
        return TestOutcome("dcgm", "pass", f"dcgmi diag -r {level}: {len(passed)} test(s) passed", seconds)
    return TestOutcome("dcgm", "skip", f"dcgmi diag -r {level} ran no test on this GPU", seconds)
