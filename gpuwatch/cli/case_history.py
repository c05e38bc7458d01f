"""What the state dir remembers about one GPU, for `gpuwatch report`: its faults across reboots (the fault ledger),
its XIDs in NVIDIA's catalogue's words, its probe baseline and the samples kept for it, and the last diag run.

Read only, as `gpuwatch snapshot` reads the ledger: no lock taken, nothing moved aside, a bad file said and left
as it is. The agent need not run. Every part is a plain JSON-able dict: the case file's JSON twin is these, and its
HTML is rendered from the twin (gpuwatch.web.case_file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwatch.core.thresholds import xid_class, xid_meaning
from gpuwatch.core.xid_catalogue import CATALOGUE, CATALOGUE_DATE, CATALOGUE_URL
from gpuwatch.judge.gpu_verdict import xid_step
from gpuwatch.probe.baseline import Baselines
from gpuwatch.probe.diag_results import read_results, results_path
from gpuwatch.state.ledger import Fault, GpuRecord


def fault_json(fault: Fault) -> dict[str, Any]:
    """One ledger fault as the case file lists it: open or closed, with its boots, driver, evidence and closure."""
    closed = fault.closed
    return {
        "key": fault.key,
        "open": fault.is_open,
        "state": fault.state,
        "action": fault.action,
        "base_action": fault.base_action,
        "evidence": fault.evidence,
        "opened": fault.opened,
        "at": fault.at,
        "gpu_index": fault.index,
        "driver_version": fault.driver,
        "boots": list(fault.boots),
        "returns": fault.returns,
        "closed": None
        if closed is None
        else {"time": closed.time, "how": closed.how, "by": closed.by, "note": closed.note},
    }


def ledger_json(record: GpuRecord | None) -> dict[str, Any]:
    if record is None:
        return {"serial": None, "faults": [], "note": "the fault ledger holds nothing for this GPU"}
    return {"serial": record.serial, "index": record.index, "faults": [fault_json(f) for f in record.faults]}


def xid_code(key: str) -> int | None:
    """The code of a ledger key "XID 79"; None for an alert's name."""
    word, _, code = key.partition(" ")
    return int(code) if word == "XID" and code.isdigit() else None


def xid_json(code: int) -> dict[str, Any]:
    """An XID in the catalogue's words and what the verdict makes of it."""
    mnemonic, description, bucket = CATALOGUE.get(code, ("", "", ""))
    cls = xid_class(code)
    return {
        "xid": code,
        "mnemonic": mnemonic or None,
        "description": description or None,
        "meaning": xid_meaning(code),
        "catalogue_action": bucket or None,
        "catalogue": f"{CATALOGUE_URL} ({CATALOGUE_DATE})" if code in CATALOGUE else None,
        "alert_class": cls,
        "action": xid_step(code, 1, 0.0, cls).action,
    }


def merge_xids(record: GpuRecord | None, counted: dict[str, dict[int, dict[str, float]]]) -> list[dict[str, Any]]:
    """Every XID the ledger holds or held for the GPU and every one another source counted (`counted`: source ->
    code -> {"count", "last"}), once each, newest first."""
    found: dict[int, dict[str, Any]] = {}

    def entry(code: int, source: str, last: float) -> dict[str, Any]:
        item = found.setdefault(code, {**xid_json(code), "last_timestamp": 0.0, "count": None, "sources": []})
        item["last_timestamp"] = max(item["last_timestamp"], last)
        if source not in item["sources"]:
            item["sources"].append(source)
        return item

    for fault in record.faults if record is not None else ():
        code = xid_code(fault.key)
        if code is not None:
            entry(code, "fault ledger", fault.at)
    for source, codes in counted.items():
        for code, seen in codes.items():
            item = entry(code, source, seen.get("last", 0.0))
            if "count" in seen:
                item["count"] = max(item["count"] or 0, int(seen["count"]))
    return sorted(found.values(), key=lambda e: -e["last_timestamp"])


def baseline_json(state_dir: Path, uuid: str) -> dict[str, Any]:
    """The GPU's probe baseline and the probe samples kept for it (probe_baselines.json), read without its lock."""
    baseline = Baselines(state_dir).peek().get(uuid)
    if baseline is None:
        return {"baseline_flops": None, "note": f"no probe baseline for this GPU in {state_dir}"}
    flops = baseline.flops
    return {
        "baseline_flops": flops,
        "established_timestamp": baseline.established_timestamp,
        "key": _key_json(baseline.key),
        "samples_flops": list(baseline.samples),
        "samples_ratio_to_baseline": [s / flops for s in baseline.samples] if flops else [],
        "previous_baseline_flops": baseline.previous_flops,
        "previous_key": _key_json(baseline.previous_key) if baseline.previous_key is not None else None,
        "note": None if flops else "baseline not established yet (it takes 5 steady probes)",
    }


def _key_json(key: Any) -> dict[str, Any]:
    return {name: getattr(key, name) for name in key.__dataclass_fields__}


def diag_json(state_dir: Path, uuid: str, index: int) -> dict[str, Any]:
    """The GPU's last run of each `gpuwatch diag` test (gpuwatch/probe/diag_results.py reads the file as the agent
    does, changing nothing); a missing file is said ("no diag run recorded"), an unusable one said, never an error."""
    path = results_path(state_dir)
    if not path.exists():
        return {"status": "none", "note": "no diag run recorded", "tests": []}
    records = read_results(state_dir, move_aside=False)
    if not records:
        return {"status": "unreadable", "note": f"{path} holds no diag results gpuwatch can read", "tests": []}
    gpu = records.get(uuid)
    if gpu is None:
        return {"status": "none", "note": f"{path} holds no diag run of this GPU", "tests": []}
    tests = sorted(gpu.tests.values(), key=lambda t: t.name)
    return {
        "status": "recorded",
        "note": None,
        "time": max(t.at for t in tests) if tests else None,
        "level": max(t.level for t in tests) if tests else None,
        "tests": [
            {
                "name": t.name,
                "result": t.result,
                "detail": t.detail,
                "seconds": t.seconds,
                "time": t.at,
                "level": t.level,
            }
            for t in tests
        ],
    }
