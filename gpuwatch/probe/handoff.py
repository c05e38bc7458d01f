"""Probe results handed to the running agent by a probe that ran outside it (`gpuwatch slurm epilog`).

A probe run outside the agent (its own children, killed at its own deadline) would otherwise be lost to the agent:
its baselines are shared already (the state dir's baselines file, written under its lock by whoever probed), but
its results, runs and telemetry live in the agent's store. So the outside probe writes its outcomes, atomically, as
one file ``probe-results-<ns>-<pid>.json`` in the agent's state dir; the agent's `probe_results` collector
(gpuwatch/collectors/probe_results.py) takes each file within a poll interval, records its outcomes in its store as
it records its own probes' (`ProbeBook.record`), reloads the baselines, and removes the file. The file's removal
tells the writer that the agent has the results (`wait_taken`).

Why a file and not a call to the agent: the state dir is the agent's private directory (0700, root's or the agent
user's), so only who may probe may hand results over; the agent needs no new endpoint that the network could
reach; and results written while the agent is restarting are taken when it is back. A file the agent cannot
understand is moved aside (``.corrupt-<time>``) and logged, as every state file is (gpuwatch/files/statefile.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuwatch.files.statefile import STATE_VERSION, atomic_write_json, read_json
from gpuwatch.probe.baseline import Baselines
from gpuwatch.probe.readings import _previous
from gpuwatch.state.probebook import RESULTS, ProbeOutcome, Telemetry, WorkerResult, plausible_flops
from gpuwatch.state.store import SampleStore

log = logging.getLogger(__name__)

KIND = "probe_results"
PREFIX = "probe-results-"
MAX_FILES_PER_RUN = 64  # a flood of files is taken over several runs, never all in one
MAX_OUTCOMES_PER_FILE = 1024  # a node has at most a few dozen GPUs
WAIT_STEP_SECONDS = 0.05


def hand_over(state_dir: Path, outcomes: Iterable[ProbeOutcome], source: str) -> Path:
    """Write the outcomes for the agent to take; the file's path (StateDirError when it cannot be written)."""
    path = state_dir / f"{PREFIX}{time.time_ns()}-{os.getpid()}.json"
    document = {
        "kind": KIND,
        "version": STATE_VERSION,
        "source": source,
        "outcomes": [dataclasses.asdict(o) for o in outcomes],
    }
    atomic_write_json(path, document)
    return path


def wait_taken(path: Path, deadline: float) -> bool:
    """Whether the agent took the file (it is gone) before `deadline` (time.monotonic())."""
    while path.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(WAIT_STEP_SECONDS)
    return True


def pending(state_dir: Path) -> list[Path]:
    """The result files waiting in the state dir, oldest first (names sort by their nanosecond time)."""
    try:
        names = sorted(n for n in os.listdir(state_dir) if n.startswith(PREFIX) and n.endswith(".json"))
    except OSError:
        return []
    return [state_dir / n for n in names[:MAX_FILES_PER_RUN]]


def take_over(state_dir: Path, store: SampleStore) -> list[ProbeOutcome]:
    """Record every waiting file's outcomes for the GPUs this agent knows, remove the files, reload the baselines;
    the outcomes recorded."""
    files = pending(state_dir)
    if not files:
        return []
    known = store.identities()
    taken: list[ProbeOutcome] = []
    for path in files:
        data = read_json(path, expect_kind=KIND, content_problem=_content_problem)  # a bad one is moved aside
        if data is None:
            continue
        for outcome in (_outcome(entry) for entry in data["outcomes"]):
            identity = known.get(outcome.uuid)
            if identity is None:
                log.warning("probe results in %s name GPU %s, unknown to this agent: ignored", path, outcome.uuid)
                continue
            # the agent's index is the one it exports; a time ahead of the agent's clock would keep a result fresh
            outcome = dataclasses.replace(outcome, index=identity.index, timestamp=min(outcome.timestamp, time.time()))
            store.probe.record(outcome)
            taken.append(outcome)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the probe results %s once taken (%s): they would be taken again", path, exc)
        log.info("took %d probe result(s) from %s (%s)", len(data["outcomes"]), path.name, data.get("source", "?"))
    for uuid, baseline in Baselines(state_dir).load().items():  # the outside probe may have changed them
        store.probe.set_baseline(uuid, baseline.key.dtype, baseline.flops, _previous(baseline))
    return taken


def _content_problem(data: dict[str, Any]) -> str | None:
    outcomes = data.get("outcomes")
    if not isinstance(outcomes, list) or len(outcomes) > MAX_OUTCOMES_PER_FILE:
        return f"'outcomes' must be a list of at most {MAX_OUTCOMES_PER_FILE} probe results"
    for n, entry in enumerate(outcomes):
        try:
            _outcome(entry)
        except (KeyError, TypeError, ValueError) as exc:
            return f"outcome {n} is not a probe result: {type(exc).__name__} {str(exc)[:120]}"
    return None


def _outcome(entry: Any) -> ProbeOutcome:
    """A ProbeOutcome from its JSON (dataclasses.asdict of one); KeyError/TypeError/ValueError when malformed."""
    if not isinstance(entry, dict):
        raise TypeError(f"a probe result is a JSON object, got {type(entry).__name__}")
    uuid, index, result = entry["uuid"], entry["index"], entry["result"]
    if not isinstance(uuid, str) or not uuid or type(index) is not int or result not in RESULTS:
        raise ValueError(f"uuid {uuid!r}, index {index!r} or result {result!r} is not a probe result's")
    measured = entry.get("measured")
    telemetry = entry.get("telemetry") or {}
    if not isinstance(telemetry, dict):
        raise TypeError("telemetry must be an object")
    baseline = _number(entry.get("baseline_flops"))
    if baseline is not None and not plausible_flops(baseline):
        raise ValueError(f"baseline_flops {baseline!r} is no throughput")
    return ProbeOutcome(
        uuid=uuid,
        index=index,
        result=result,
        reason=str(entry.get("reason", ""))[:1000],
        timestamp=_number(entry.get("timestamp")) or 0.0,
        measured=None if measured is None else WorkerResult.from_json(measured),
        telemetry=Telemetry(
            sm_clock_hertz=_number(telemetry.get("sm_clock_hertz")),
            power_watts=_number(telemetry.get("power_watts")),
            temperature_celsius=_number(telemetry.get("temperature_celsius")),
            samples=int(telemetry.get("samples", 0)),
        ),
        wall_seconds=_number(entry.get("wall_seconds")),
        baseline_flops=baseline,
        baseline_note=str(entry.get("baseline_note", ""))[:1000],
    )


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)
