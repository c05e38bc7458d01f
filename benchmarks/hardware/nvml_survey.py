#!/usr/bin/env python3
"""Every NVML call gpuwatch's backend makes on this node, as the real driver answers it, and the floor of #20.

Read-only on the GPU (it changes no setting). Two parts:

1. calls: the NVML backend opened and polled (fast and slow tiers, GPM included) over the real pynvml, every nvml*
   call recorded with its arguments, its answer (ctypes structures unpacked to plain JSON, field values with their
   own nvmlReturn), the NVMLError code where it raised, its wall time and the CPU time it cost this thread (a driver
   call that waits costs wall time only; one that computes, both). This is what the simulated libnvidia-ml
   must answer the same way: `tests/fixtures/h100/nvml-backend-calls.json` is this file from an H100, and the
   conformance tests compare the simulation with it.
2. floor: `benchmarks/agent_overhead.py`'s measurement over the real library: a poll's CPU time against the CPU time
   of the very NVML calls it made, replayed bare (goal: poll / library <= 1.2), fast and slow polls.

    python benchmarks/hardware/nvml_survey.py --out nvml-backend-calls.json --markdown survey.md
    python benchmarks/hardware/nvml_survey.py --dry-run --out /tmp/calls.json   # the simulated H100, no GPU
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from agent_overhead import Recording, measure, report  # noqa: E402

from gpuwatch.backends.nvml import NvmlBackend, load_pynvml  # noqa: E402


def plain(value: Any, depth: int = 0) -> Any:
    """A pynvml answer as JSON: structures by field, arrays as lists, handles and pointers by their type name."""
    if depth > 6:
        return repr(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.Structure | ctypes.Union):
        fields = getattr(type(value), "_fields_", ())
        return {name: plain(getattr(value, name), depth + 1) for name, *_ in fields}
    if isinstance(value, ctypes.Array):
        return [plain(item, depth + 1) for item in value]
    if type(value).__name__ == "CArgObject":  # byref(structure): an out-parameter, read after the call
        return plain(value._obj, depth + 1)
    if isinstance(value, ctypes._Pointer | ctypes.c_void_p):  # handles: nothing to compare
        return f"<{type(value).__name__}>"
    if isinstance(value, ctypes._SimpleCData):
        return plain(value.value, depth + 1)
    if isinstance(value, list | tuple):
        return [plain(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {str(key): plain(item, depth + 1) for key, item in value.items()}
    if hasattr(value, "__dict__"):
        return {key: plain(item, depth + 1) for key, item in vars(value).items() if not key.startswith("_")}
    return repr(value)


class TimedRecording(Recording):
    """Recording, plus each call's wall time and every call outside the recorded poll too (open, close)."""

    def __init__(self, lib: Any) -> None:
        self.log: list[dict[str, Any]] = []
        self.phase = "open"
        self.error_class = lib.NVMLError
        super().__init__(lib)

    def _recorded(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        inner = super()._recorded(name, function)

        def call(*args: Any, **kwargs: Any) -> Any:
            started, cpu_started = time.perf_counter(), time.thread_time()
            entry: dict[str, Any] = {"phase": self.phase, "function": name}
            try:
                answer = inner(*args, **kwargs)
            except self.error_class as exc:
                entry["error"] = int(getattr(exc, "value", -1))
                entry["error_text"] = str(exc)
                raise
            except Exception as exc:
                entry["exception"] = f"{type(exc).__name__}: {exc}"
                raise
            else:
                entry["value"] = plain(answer)
                return answer
            finally:
                entry["ms"] = round((time.perf_counter() - started) * 1000, 4)
                entry["cpu_ms"] = round((time.thread_time() - cpu_started) * 1000, 4)  # user + system, this thread
                entry["args"] = plain(args[1:] if args else ())  # after the call: out-parameters filled
                self.log.append(entry)

        return call


def record_backend(
    lib: Any, polls: int, pause: Callable[[], None] = lambda: time.sleep(0.2)
) -> tuple[list[dict[str, Any]], dict[str, str], list[Any]]:
    """Open the NVML backend over `lib`, poll it `polls` times (the first reads the slow tier too) and close it,
    recording every call; returns the calls, the backend's versions and its last readings."""
    recording = TimedRecording(lib)
    backend = NvmlBackend(recording)
    readings: list[Any] = []
    try:
        backend.open()
        versions = backend.versions()
        for poll in range(polls):
            recording.phase = "slow poll" if poll == 0 else "fast poll"
            readings = backend.poll(slow=poll == 0)
            pause()
        recording.phase = "close"
    finally:
        backend.close()
    return recording.log, versions, [plain(reading) for reading in readings]


def summary(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per function: calls, answers (ok or each error code), median and max wall time."""
    rows: dict[str, dict[str, Any]] = {}
    for entry in log:
        row = rows.setdefault(
            entry["function"], {"function": entry["function"], "calls": 0, "answers": {}, "ms": [], "cpu_ms": []}
        )
        row["calls"] += 1
        if "error" in entry:
            answer = f"error {entry['error']} ({entry['error_text']})"
        elif "exception" in entry:
            answer = entry["exception"]
        else:
            answer = "ok"
        row["answers"][answer] = row["answers"].get(answer, 0) + 1
        row["ms"].append(entry["ms"])
        if "cpu_ms" in entry:  # fixtures recorded before the column existed have none
            row["cpu_ms"].append(entry["cpu_ms"])
    for row in rows.values():
        times, cpu = row.pop("ms"), row.pop("cpu_ms")
        row["median_ms"] = round(statistics.median(times), 4)
        row["max_ms"] = round(max(times), 4)
        row["median_cpu_ms"] = round(statistics.median(cpu), 4) if cpu else None
    return sorted(rows.values(), key=lambda row: row["function"])


def field_values(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each field id nvmlDeviceGetFieldValues was asked for, with the nvmlReturn the driver gave it."""
    seen: dict[int, dict[str, Any]] = {}
    for entry in log:
        if entry["function"] != "nvmlDeviceGetFieldValues" or not isinstance(entry.get("value"), list):
            continue
        for value in entry["value"]:
            if isinstance(value, dict) and "fieldId" in value:
                seen[value["fieldId"]] = {"fieldId": value["fieldId"], "nvmlReturn": value.get("nvmlReturn")}
    return [seen[key] for key in sorted(seen)]


def markdown(rows: list[dict[str, Any]], fields: list[dict[str, Any]], floors: list[str]) -> str:
    lines = ["", "### NVML calls of the backend (open, slow and fast polls, close)", ""]
    lines += ["| function | calls | answers | median ms | median CPU ms | max ms |", "|---|---|---|---|---|---|"]
    for row in rows:
        answers = ", ".join(f"{answer} ×{count}" for answer, count in row["answers"].items())
        cells = (row["function"], row["calls"], answers, row["median_ms"], row["median_cpu_ms"], row["max_ms"])
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    if fields:
        lines += ["", "Field values (nvmlReturn 0 is success, 3 not supported):", ""]
        lines.append(", ".join(f"{row['fieldId']}: {row['nvmlReturn']}" for row in fields))
    lines += ["", "### The floor: a poll's CPU against the bare NVML calls it makes", "", "```", *floors, "```", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="nvml_survey.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON: every call, the summary and the floor")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    parser.add_argument("--polls", type=int, default=3, help="recorded polls after open (the first reads slow too)")
    parser.add_argument("--rounds", type=int, default=20, help="floor: interleaved rounds (best of)")
    parser.add_argument("--repeat", type=int, default=10, help="floor: polls per timed batch")
    parser.add_argument("--dry-run", action="store_true", help="the simulated H100 node instead of the real library")
    args = parser.parse_args()

    def library() -> Any:
        if not args.dry_run:
            return load_pynvml()
        from gpuwatch.simulated.bindings import simulated_pynvml
        from gpuwatch.simulated.scenarios import SimulatedNode

        return simulated_pynvml(SimulatedNode("healthy", gpus=1, vendor="nvidia"))

    lib = library()
    report_json: dict[str, Any] = {"dry_run": args.dry_run, "complete": False}
    log, report_json["versions"], report_json["readings"] = record_backend(lib, args.polls)
    rows = summary(log)
    fields = field_values(log)
    report_json.update(calls=log, summary=rows, field_values=fields)
    args.out.write_text(json.dumps(report_json, indent=1, default=repr))

    floors: list[str] = []
    report_json["floor"] = {}
    for slow in (False, True):
        # Two module objects: the real pynvml is one module, so the recording wraps the same library as `lib`.
        measured = measure(lib, Recording(lib), slow=slow, repeat=args.repeat, rounds=args.rounds)
        report_json["floor"]["slow" if slow else "fast"] = measured
        floors.append(report("simulated" if args.dry_run else "real NVML", slow, measured))
    report_json["complete"] = True
    args.out.write_text(json.dumps(report_json, indent=1, default=repr))
    text = markdown(rows, fields, floors)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
