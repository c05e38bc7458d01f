"""`gpuwatch diag`'s node-wide tests, beside each GPU's own (gpuwatch/probe/diag.py): the all-reduce across the node's
GPUs, and DCGM's or RVS's own diagnostics where they are installed. Neither is ever required: each is "skip" with
the reason where it cannot run.

`dcgmi diag -r N -j` prints DCGM 4's JSON: ``{"DCGM Diagnostic": {"test_categories": [{"category": …, "tests":
[{"name": …, "results": [{"entity_group": "GPU", "entity_id": N, "status": "Pass"|"Fail"|"Skip"|"Warn"|…,
"warnings": [{"warning": …, "error_id": …}]}], "test_summary": {"status": …}}]}], "runtime_error": …}}``, as
NVIDIA/DCGM's testing/python3/dcgm_diag_schema.json defines it; its entity ids are NVML's GPU indices.

`rvs -r N -i <indices> -j FILE` (ROCm Validation Suite; ROCm/ROCmValidationSuite docs/ug1main.md, "Command line
options" and "Test Levels") writes ``{"version": "1.0", "<module>": {"<action>": [{"gpu_id": "…", "gpu_index": "0",
…, "pass": "true"|"false"}, …]}, …}``: src/rvsliblogger.cpp builds the module and action nodes, include/rvs_util.h's
log_to_json each result with `gpu_index` (the amd-smi index, which gpuwatch's AMD backend shares) and the module's
"pass" key (smqt writes it as "1"/"0").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuwatch.core.model import GpuIdentity, GpuSample
from gpuwatch.probe.children import _kill_group
from gpuwatch.probe.diag import TestOutcome, nominal_bytes_per_second
from gpuwatch.probe.diag_results import Result
from gpuwatch.probe.launch import WORKER_CWD, worker_argv

DCGM_SECONDS = {1: 120.0, 2: 600.0, 3: 1800.0}  # dcgmi diag -r 1 takes about a minute, -r 3 up to half an hour
ALLREDUCE_MODULE = "gpuwatch.probe.diag_allreduce"
ALLREDUCE_SECONDS = 120.0  # NCCL's start-up on eight GPUs takes seconds; 20 all-reduces of 256 MiB well under one
# Per NVLink (3rd and 4th generation: A100, H100) and direction: 25 GB/s. NCCL's bus bandwidth on a healthy 8-GPU
# H100 node is 360-480 GB/s of 18 links' 450; through PCIe (no NVLink) it reaches about half the slot's nominal.
# The share below is a floor for a broken link or a GPU fallen back to PCIe, not yet measured on a real node.
NVLINK_LINK_BYTES_PER_SECOND = 25e9
ALLREDUCE_SHARE_MIN = 0.25
P2P_MODULE = "gpuwatch.probe.diag_p2p"
# A peer copy over NVLink moves most of the links' nominal one way (H100: ~370 of 450 GB/s); through PCIe about its
# nominal's 80 %. Half is a floor for a link down or a pair fallen back to the host, not yet measured on a real node.
P2P_SHARE_MIN = 0.5
_NO_P2P = TestOutcome("p2p", "skip", "no peer copy result for this GPU", 0.0)
# gpuwatch's levels on RVS's (docs/ug1main.md, "Test Levels"): 2 checks PCIe, a quick HBM pass and XGMI in seconds;
# 3 measures HBM, PCIe and XGMI bandwidth and GEMM in minutes; 4 adds a memory test, tens of minutes. RVS's level 1
# only checks that ROCm's packages are installed, which says nothing about a GPU.
RVS_LEVELS = {1: 2, 2: 3, 3: 4}
RVS_SECONDS = {1: 300.0, 2: 1800.0, 3: 5400.0}
RVS_INSTALLED = "/opt/rocm/bin/rvs"  # where the rocm-validation-suite package puts it (docs/install/installation)
_PASS_WORDS = {"true": True, "1": True, "false": False, "0": False}


def node_tests(
    chosen: list[tuple[GpuIdentity, GpuSample]],
    hello: dict[str, Any],
    level: int,
    *,
    which: Callable[[str], str | None] = shutil.which,
) -> dict[str, list[TestOutcome]]:
    """Each GPU's outcomes of the node-wide tests, by UUID."""
    identities = [i for i, _ in chosen]
    peers = p2p(chosen, hello)
    reduced = allreduce(chosen, hello)
    out: dict[str, list[TestOutcome]] = {
        i.uuid: [peers.get(i.uuid, peers.get("", _NO_P2P)), reduced] for i in identities
    }
    vendors = {i.vendor for i in identities}
    if "nvidia" in vendors:
        for uuid, outcome in dcgm(identities, level, which).items():
            out[uuid].append(outcome)
    if "amd" in vendors:
        for uuid, outcome in rvs(identities, level, which).items():
            out[uuid].append(outcome)
    return out


def allreduce(chosen: list[tuple[GpuIdentity, GpuSample]], hello: dict[str, Any]) -> TestOutcome:
    """An all-reduce across the GPUs under test (one process each, NCCL/RCCL), its bus bandwidth against their links;
    where it cannot run, a skip that says why."""
    if len(chosen) < 2:
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
    started = time.monotonic()
    doc, error = run_allreduce(chosen)
    seconds = time.monotonic() - started
    if doc is None:
        return TestOutcome("allreduce", "fail", error, seconds)
    if "skip" in doc:
        return TestOutcome("allreduce", "skip", str(doc["skip"]), seconds)
    if not doc.get("ok"):
        return TestOutcome("allreduce", "fail", f"the all-reduce failed: {doc.get('error', doc)}", seconds)
    return judge_allreduce(chosen, doc, seconds)


def p2p(chosen: list[tuple[GpuIdentity, GpuSample]], hello: dict[str, Any]) -> dict[str, TestOutcome]:
    """Peer copies from the first GPU under test to each other one and back, against the links: by UUID (the first
    GPU's is its slowest pair's); a skip for every GPU under "" where it cannot run."""
    if len(chosen) < 2:
        return {"": TestOutcome("p2p", "skip", "one GPU under test: a peer copy needs two or more", 0.0)}
    if hello.get("device") != "cuda":
        why = "torch's CPU device has no peer link" if hello else "no diag child reported its engine"
        return {"": TestOutcome("p2p", "skip", why, 0.0)}
    started = time.monotonic()
    doc, error = run_node_child(chosen, P2P_MODULE, [])
    seconds = time.monotonic() - started
    if doc is None or not doc.get("ok"):
        why = error if doc is None else str(doc.get("skip") or doc.get("error"))
        result: Result = "skip" if doc is not None and "skip" in doc else "fail"
        return {"": TestOutcome("p2p", result, why, seconds)}
    nominal, how = link_nominal(chosen)
    floor = P2P_SHARE_MIN * nominal if nominal is not None else None
    out: dict[str, TestOutcome] = {}
    worst: tuple[float, str] | None = None
    for pair in doc["pairs"]:
        rate = min(float(pair["out_bytes_per_second"]), float(pair["back_bytes_per_second"]))
        uuid = chosen[int(pair["to"])][0].uuid
        text = f"with GPU {chosen[0][0].index}: {rate / 1e9:.1f} GB/s" + (
            "" if pair["peer_access"] else " (no peer access)"
        )
        if floor is None:
            out[uuid] = TestOutcome("p2p", "skip", f"{text}; {how}, so no nominal to hold it to", seconds)
            continue
        text += f", {rate / nominal:.0%} of {nominal / 1e9:.0f} GB/s ({how})"  # type: ignore[operator]
        bad = rate < floor
        out[uuid] = TestOutcome(
            "p2p", "fail" if bad else "pass", f"below {P2P_SHARE_MIN:.0%}: {text}" if bad else text, seconds
        )
        if worst is None or rate < worst[0]:
            worst = (rate, uuid)
    if worst is not None:
        first = out[worst[1]]
        out[chosen[0][0].uuid] = TestOutcome("p2p", first.result, f"slowest pair: {first.detail}", seconds)
    return out


def run_allreduce(chosen: list[tuple[GpuIdentity, GpuSample]]) -> tuple[dict[str, Any] | None, str]:
    """The all-reduce child's answer, or None and why there is none (killed at its deadline, no output)."""
    return run_node_child(chosen, ALLREDUCE_MODULE, ["--world", str(len(chosen))])


def run_node_child(
    chosen: list[tuple[GpuIdentity, GpuSample]], module: str, arguments: list[str]
) -> tuple[dict[str, Any] | None, str]:
    """A node-wide child's answer (every GPU under test visible to it), or None and why there is none."""
    env = dict(os.environ)
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        env.pop(name, None)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    amd = chosen[0][0].vendor == "amd"
    env["ROCR_VISIBLE_DEVICES" if amd else "CUDA_VISIBLE_DEVICES"] = ",".join(
        (s.runtime_device or i.uuid) for i, s in chosen
    )
    argv = [*worker_argv(module), *arguments]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=WORKER_CWD, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=ALLREDUCE_SECONDS)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return None, f"{module} did not finish within {ALLREDUCE_SECONDS:g} s: the child was killed"
    finally:
        _kill_group(proc)
    for line in reversed(out.decode(errors="replace").splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc, ""
    tail = err.decode(errors="replace").strip()[-300:]
    return None, f"{module} exited with status {proc.returncode} without a result: {tail or 'no output'}"


def link_nominal(chosen: list[tuple[GpuIdentity, GpuSample]]) -> tuple[float | None, str]:
    """What an all-reduce's bus bandwidth is held to: the NVLink/XGMI links that are up (the fewest of any GPU), at
    NVLINK_LINK_BYTES_PER_SECOND each; else the slowest GPU's PCIe link."""
    links = [sum(1 for up in s.nvlink_up.values() if up) for _, s in chosen]
    if links and min(links) > 0:
        return min(links) * NVLINK_LINK_BYTES_PER_SECOND, f"{min(links)} NVLink/XGMI links up per GPU"
    nominals = [nominal_bytes_per_second(s) for _, s in chosen]
    known = [(n, how) for n, how in nominals if n is not None]
    if not known:
        return None, "no link read"
    slowest = min(known)
    return slowest[0], f"PCIe {slowest[1]}"


def judge_allreduce(chosen: list[tuple[GpuIdentity, GpuSample]], doc: dict[str, Any], seconds: float) -> TestOutcome:
    busbw = float(doc["busbw_bytes_per_second"])
    size = f"{doc.get('backend')}, {doc['bytes'] / 2**20:.0f} MiB"
    text = f"bus bandwidth {busbw / 1e9:.1f} GB/s over {doc['world']} GPUs ({size})"
    if int(doc.get("wrong_elements", 0)):
        return TestOutcome("allreduce", "fail", f"{doc['wrong_elements']} elements summed wrong; {text}", seconds)
    nominal, how = link_nominal(chosen)
    if nominal is None:
        return TestOutcome("allreduce", "skip", f"{text}; {how}, so no nominal to hold it to", seconds)
    share = busbw / nominal
    text += f": {share:.0%} of {nominal / 1e9:.0f} GB/s ({how})"
    if share < ALLREDUCE_SHARE_MIN:
        return TestOutcome(
            "allreduce", "fail", f"below {ALLREDUCE_SHARE_MIN:.0%} of the links' nominal: {text}", seconds
        )
    return TestOutcome("allreduce", "pass", text, seconds)


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


def rvs(
    identities: list[GpuIdentity], level: int, which: Callable[[str], str | None] = shutil.which
) -> dict[str, TestOutcome]:
    """`rvs -r LEVEL -j FILE` folded in: one outcome per GPU (fail when any of its results failed)."""
    found = which("rvs") or (RVS_INSTALLED if os.access(RVS_INSTALLED, os.X_OK) else None)
    if found is None:
        text = f"RVS is not installed (no rvs on PATH or at {RVS_INSTALLED})"
        return {i.uuid: TestOutcome("rvs", "skip", text, 0.0) for i in identities}
    rvs_level = RVS_LEVELS[level]
    indices = ",".join(str(i.index) for i in identities)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuwatch-rvs-") as scratch:
        report = Path(scratch) / "rvs.json"
        argv = [found, "-r", str(rvs_level), "-i", indices, "-j", str(report), "--quiet"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=RVS_SECONDS[level], check=False)
        except subprocess.TimeoutExpired:
            seconds = time.monotonic() - started
            text = f"rvs -r {rvs_level} did not finish within {RVS_SECONDS[level]:g} s (killed)"
            return {i.uuid: TestOutcome("rvs", "skip", text, seconds) for i in identities}
        seconds = time.monotonic() - started
        try:
            text = report.read_text(errors="replace")
        except OSError:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[-200:]
            missing = f"rvs -r {rvs_level} wrote no JSON (exit {done.returncode}): {said or 'no output'}"
            return {i.uuid: TestOutcome("rvs", "skip", missing, seconds) for i in identities}
    return {i.uuid: fold_rvs(text, i.index, rvs_level, seconds) for i in identities}


def fold_rvs(text: str, index: int, rvs_level: int, seconds: float) -> TestOutcome:
    """One GPU's outcome from RVS's JSON log: every result record of that `gpu_index`, named module/action."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        return TestOutcome("rvs", "skip", f"rvs -r {rvs_level} wrote JSON that does not parse ({err})", seconds)
    passed: list[str] = []
    failed: list[str] = []
    for where, record in _rvs_records(doc, ()):
        if str(record.get("gpu_index", "")).strip() != str(index):
            continue
        verdict = _PASS_WORDS.get(str(record["pass"]).strip().lower())
        if verdict is True:
            passed.append(where)
        elif verdict is False:
            details = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("gpu_id", "gpu_index", "pass"))
            failed.append(f"{where}: {details}" if details else where)
    if failed:
        return TestOutcome("rvs", "fail", f"rvs -r {rvs_level}: " + " | ".join(dict.fromkeys(failed)), seconds)
    if passed:
        count = len(dict.fromkeys(passed))
        return TestOutcome("rvs", "pass", f"rvs -r {rvs_level}: {count} action(s) passed", seconds)
    return TestOutcome("rvs", "skip", f"rvs -r {rvs_level} reported no result for this GPU", seconds)


def _rvs_records(node: object, path: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every result record (a dict with a "pass" key) under `node`, with the module/action keys that lead to it."""
    if isinstance(node, dict):
        if "pass" in node:
            yield "/".join(path) or "rvs", node
            return
        for key, child in node.items():
            yield from _rvs_records(child, (*path, str(key)))
    elif isinstance(node, list):
        for child in node:
            yield from _rvs_records(child, path)
