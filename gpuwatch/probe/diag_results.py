"""`diag_results.json` in the state dir: the last run of each diag test on each GPU, written atomically by `gpuwatch
diag` (gpuwatch/probe/diag.py) and read by the agent's `diag_results` collector (metrics, findings, the ledger) and by
`gpuwatch report`. A run of some tests on some GPUs replaces only those tests' entries: the file keeps the last run
of every test on every GPU. A corrupt or foreign file is moved aside and logged, as every state file is."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from gpuwatch.files.statefile import STATE_VERSION, atomic_write_json, read_json

KIND = "diag_results"
FILE_NAME = "diag_results.json"
Result = Literal["pass", "fail", "skip"]
RESULTS: tuple[Result, ...] = get_args(Result)
MAX_DETAIL = 1000


@dataclass(frozen=True, slots=True)
class TestRecord:
    """One test's last run on one GPU."""

    name: str
    result: Result
    detail: str
    seconds: float
    at: float  # unix time it ended
    level: int


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """A GPU's last run of each test, by test name."""

    uuid: str
    index: int
    tests: Mapping[str, TestRecord]


def results_path(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def read_results(state_dir: Path, *, move_aside: bool = True) -> dict[str, GpuRecord]:
    """Every GPU's last diag results by UUID; {} when there are none (or the file is unusable: moved aside)."""
    data = read_json(results_path(state_dir), expect_kind=KIND, move_aside=move_aside, content_problem=_problem)
    return {} if data is None else _parse(data)


def record_results(state_dir: Path, gpus: Iterable[GpuRecord]) -> Path:
    """Merge this run's results into the file (each test replaces its own last run); StateDirError when it cannot
    be written."""
    merged = read_results(state_dir)
    for gpu in gpus:
        old = merged.get(gpu.uuid)
        tests = {**(dict(old.tests) if old is not None else {}), **gpu.tests}
        merged[gpu.uuid] = GpuRecord(gpu.uuid, gpu.index, tests)
    path = results_path(state_dir)
    atomic_write_json(
        path, {"kind": KIND, "version": STATE_VERSION, "gpus": {u: _gpu_json(g) for u, g in merged.items()}}
    )
    return path


def _gpu_json(gpu: GpuRecord) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "tests": {
            t.name: {"result": t.result, "detail": t.detail, "seconds": t.seconds, "at": t.at, "level": t.level}
            for t in gpu.tests.values()
        },
    }


def _problem(data: dict[str, Any]) -> str | None:
    gpus = data.get("gpus")
    if not isinstance(gpus, dict):
        return "its 'gpus' is not an object"
    for uuid, entry in gpus.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("tests"), dict):
            return f"GPU {uuid!r} has no 'tests' object"
        if type(entry.get("index")) is not int:
            return f"GPU {uuid!r} has no integer 'index'"
        for name, test in entry["tests"].items():
            if not isinstance(test, dict) or test.get("result") not in RESULTS:
                return f"GPU {uuid!r} test {name!r} has no result of {', '.join(RESULTS)}"
            for key in ("seconds", "at"):
                value = test.get(key)
                if (
                    not isinstance(value, int | float)
                    or isinstance(value, bool)
                    or not math.isfinite(value)
                    or value < 0
                ):
                    return f"GPU {uuid!r} test {name!r} has no valid {key!r}"
    return None


def _parse(data: dict[str, Any]) -> dict[str, GpuRecord]:
    out: dict[str, GpuRecord] = {}
    for uuid, entry in data["gpus"].items():
        tests = {
            name: TestRecord(
                name,
                test["result"],
                str(test.get("detail", ""))[:MAX_DETAIL],
                float(test["seconds"]),
                float(test["at"]),
                int(test.get("level", 1)) if type(test.get("level", 1)) is int else 1,
            )
            for name, test in entry["tests"].items()
        }
        out[str(uuid)] = GpuRecord(str(uuid), entry["index"], tests)
    return out
