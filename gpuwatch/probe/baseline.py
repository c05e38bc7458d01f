"""Each GPU's own healthy probe throughput, persisted in the state dir (``probe_baselines.json``).

A baseline belongs to a key — dtype, shape, engine and its version, BLAS version, driver version, power limit — and is
the median of the first 5 steady-state (power-capped) probes under that key: never a maximum (a cold GPU's first
probe runs ~15 % fast), and never lowered by a degraded run (a probe under 90 % of an established baseline never
changes it). A new key starts a new baseline, and keeps the last established baseline of the keys before it as
``previous``: a driver or library roll-out that made every GPU of a model slower shows as new baselines below the
previous ones across the fleet (GpuProbeRegressionFleetwide), which a fresh baseline alone would hide.

A GPU that never reaches its power limit within warmup_max (a low power draw for its limit) would never get one:
after UNCAPPED_PROBES_TO_ESTABLISH consecutive uncapped probes its baseline is taken from those, under the same key
marked ``uncapped`` so a later capped run starts a capped baseline instead of mixing with it.

The file is read and written under a lock, so the agent and a `gpuwatch probe --update-baseline` never lose each
other's change; a corrupt or foreign file is moved aside (see statefile.read_json) and rebuilt, never fatal. So is
one holding a throughput no probe can have measured (NaN, infinite, not positive, above probebook.MAX_PLAUSIBLE_FLOPS).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from gpuwatch.core.latch import Latch
from gpuwatch.files.safefile import open_regular
from gpuwatch.files.statedir import open_in_state_dir
from gpuwatch.files.statefile import STATE_VERSION, StateDirError, atomic_write_json, read_json
from gpuwatch.state.probebook import MAX_PLAUSIBLE_FLOPS, plausible_flops

log = logging.getLogger(__name__)

BASELINES_FILE = "probe_baselines.json"
BASELINES_KIND = "probe_baselines"
PROBES_TO_ESTABLISH = 5
UNCAPPED_PROBES_TO_ESTABLISH = 5  # consecutive probes that never reached the power limit: baseline from those
MAX_SAMPLES = 15
DEGRADED_BELOW = 0.9  # a probe under this share of the baseline never changes it

# agent: counts while the baseline is being established; none: the CLI without flags, changes nothing;
# update: counts even after establishment (median of the kept samples); reset: starts over with this probe.
Mode = Literal["agent", "none", "update", "reset"]


def median(values: list[float]) -> float:
    """statistics.median, without loading statistics (decimal, fractions: 0.6 MiB of the agent's RSS)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True, slots=True)
class BaselineKey:
    dtype: str
    shape: str
    engine: str
    engine_version: str
    blas_version: str
    driver_version: str
    power_limit_watts: float | None
    uncapped: bool = False  # taken from probes that never reached the power limit (files without it: False)

    def changes_from(self, other: BaselineKey) -> str:
        """What differs, for the log ("driver_version 550.54 -> 580.159")."""
        mine, theirs = asdict(self), asdict(other)
        return ", ".join(f"{k} {theirs[k]} -> {mine[k]}" for k in mine if mine[k] != theirs[k])


@dataclass(slots=True)
class Baseline:
    key: BaselineKey
    samples: list[float] = field(default_factory=list)
    flops: float | None = None  # None until PROBES_TO_ESTABLISH steady-state probes were seen
    established_timestamp: float | None = None
    uncapped_samples: list[float] = field(default_factory=list)  # the current run of consecutive uncapped probes
    previous_key: BaselineKey | None = None  # the last key before this one that had an established baseline
    previous_flops: float | None = None

    def successor(self, key: BaselineKey) -> Baseline:
        """A fresh baseline under ``key`` that remembers this one (or what this one remembered)."""
        if self.flops is not None and self.key != key:
            return Baseline(key, previous_key=self.key, previous_flops=self.flops)
        return Baseline(key, previous_key=self.previous_key, previous_flops=self.previous_flops)


class Baselines:
    """The baselines of every GPU of this node, by UUID; every change is a locked read-modify-write."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / BASELINES_FILE
        self._lock_path = state_dir / f".{BASELINES_FILE}.lock"
        self._failing = Latch(log)  # a read-only or full state dir is said once, not at every probe of every GPU
        self._unlocked = Latch(log)  # a lock file that cannot be opened (a full state dir): said once as well

    def load(self) -> dict[str, Baseline]:
        """Every GPU's baseline; a missing or unusable file gives {} (an unusable one is moved aside and logged)."""
        with self._locked(shared=True):
            return self._read()

    def peek(self) -> dict[str, Baseline]:
        """The baselines as `load` gives them, writing nothing (no lock file made, nothing moved): `gpuwatch check`.

        Without the lock: every write is an atomic rename, so a reader sees the old file or the new one."""
        return self._read(move_aside=False)

    def observe(
        self,
        uuid: str,
        key: BaselineKey,
        flops: float,
        *,
        steady: bool,
        mode: Mode,
        timestamp: float,
        uncapped: bool = False,
    ) -> tuple[Baseline | None, str]:
        """Let one probe result count toward the GPU's baseline as `mode` says; returns the baseline and a note.

        `uncapped`: the probe ran its whole warm-up without reaching the power limit (not steady under `key`)."""
        with self._locked(shared=mode == "none"):
            entries = self._read()
            current = entries.get(uuid)
            if mode == "none":
                return current, ""
            if uncapped and not steady:
                if current is not None and current.key == replace(key, uncapped=True):
                    key, steady = current.key, True  # the uncapped baseline of this key: counts as usual
                elif mode == "agent":
                    switched = self._observe_uncapped(entries, uuid, key, flops, timestamp)
                    if switched is not None:
                        return switched
                    current = entries.get(uuid)
            note, changed = "", False
            if current is None or current.key != key or mode == "reset":
                changed = True
                if current is not None and current.key != key:
                    note = f"baseline re-established: {key.changes_from(current.key)}"
                elif current is not None:
                    note = "baseline reset"
                current = current.successor(key) if current is not None else Baseline(key)
            if steady and current.uncapped_samples:  # the run of consecutive uncapped probes is broken
                current.uncapped_samples = []
                changed = True
            if not steady:
                note = note or "not counted toward the baseline: the probe did not reach steady state"
                if current.uncapped_samples and current.flops is None:
                    note += (
                        f" ({len(current.uncapped_samples)} of {UNCAPPED_PROBES_TO_ESTABLISH} uncapped probes before "
                        "the baseline is taken from uncapped probes)"
                    )
            elif current.flops is not None and flops < DEGRADED_BELOW * current.flops:
                note = f"not counted toward the baseline: below {DEGRADED_BELOW:.0%} of it"
            elif current.flops is None or mode == "update":
                current.samples = [*current.samples, flops][-MAX_SAMPLES:]
                changed = True
                if len(current.samples) >= PROBES_TO_ESTABLISH:
                    established = current.flops is None
                    current.flops = median(current.samples)
                    if established:
                        current.established_timestamp = timestamp
                        note = note or f"baseline established from {len(current.samples)} probes"
                else:
                    note = note or f"baseline {len(current.samples)} of {PROBES_TO_ESTABLISH} probes"
            if changed:
                entries[uuid] = current
                self._write(entries)
            return current, note

    def _observe_uncapped(
        self, entries: dict[str, Baseline], uuid: str, key: BaselineKey, flops: float, timestamp: float
    ) -> tuple[Baseline, str] | None:
        """Count one uncapped probe; the baseline and note once this one establishes an uncapped baseline."""
        current = entries.get(uuid)
        if current is None or current.key != key:  # a new GPU or a new key: this key starts over
            if current is not None:
                log.info("GPU %s: baseline re-established: %s", uuid, key.changes_from(current.key))
            current = current.successor(key) if current is not None else Baseline(key)
        if current.flops is not None:  # a capped baseline exists: an uncapped probe never counts toward it
            entries[uuid] = current
            return None
        current.uncapped_samples = [*current.uncapped_samples, flops][-MAX_SAMPLES:]
        entries[uuid] = current
        if len(current.uncapped_samples) < UNCAPPED_PROBES_TO_ESTABLISH:
            self._write(entries)
            return None
        samples = current.uncapped_samples[-UNCAPPED_PROBES_TO_ESTABLISH:]
        established = Baseline(replace(key, uncapped=True), samples, median(samples), timestamp)
        established.previous_key, established.previous_flops = current.previous_key, current.previous_flops
        entries[uuid] = established
        self._write(entries)
        note = (
            f"baseline established from {len(samples)} probes that never reached the power limit within "
            "warmup_max_seconds (uncapped: compared only with uncapped probes)"
        )
        log.warning("GPU %s: %s", uuid, note)
        return established, note

    @contextmanager
    def _locked(self, *, shared: bool) -> Iterator[None]:
        try:
            fd = open_in_state_dir(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)  # no link followed, no FIFO
        except OSError:
            try:  # another user's agent owns the state dir: a read-only descriptor still takes a flock
                fd = open_regular(self._lock_path, os.O_RDONLY)
            except OSError as exc:
                self._unlocked.fail("cannot lock %s (%s); reading baselines without the lock", self._lock_path, exc)
                yield
                return
        self._unlocked.recover()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self, *, move_aside: bool = True) -> dict[str, Baseline]:
        data = read_json(
            self.path, expect_kind=BASELINES_KIND, move_aside=move_aside, content_problem=_implausible_throughput
        )
        if data is None:
            return {}
        gpus = data.get("gpus")
        if not isinstance(gpus, dict):
            log.warning('state file %s has no "gpus" object; rebuilding the probe baselines', self.path)
            return {}
        out: dict[str, Baseline] = {}
        for uuid, entry in gpus.items():
            parsed = _parse(entry)
            if parsed is None:
                log.warning("state file %s: ignoring the malformed baseline of GPU %r; it is rebuilt", self.path, uuid)
            else:
                out[uuid] = parsed
        return out

    def _write(self, entries: dict[str, Baseline]) -> None:
        doc = {
            "kind": BASELINES_KIND,
            "version": STATE_VERSION,
            "gpus": {uuid: asdict(b) for uuid, b in sorted(entries.items())},
        }
        try:
            atomic_write_json(self.path, doc)
        except StateDirError as exc:
            self._failing.fail("%s; the probe baseline is kept for this run only", exc)
            return
        self._failing.recover("wrote %s again after earlier failures", self.path)


def _implausible_throughput(data: dict[str, Any]) -> str | None:
    """The first throughput in the file that no probe can have measured (probebook.plausible_flops), or None.

    Such a file was edited or damaged, and every verdict from it is wrong, so it is moved aside whole, as a file that
    is not JSON is: the agent starts, says so once, and reports no slow probe until the baselines are re-established.
    A throughput written as a string ("Infinity") is no JSON number and counts as such a value. A malformed entry (a
    key missing, a key of the wrong shape) stays what `_parse` makes of it: that GPU's baseline ignored and rebuilt."""
    gpus = data.get("gpus")
    for uuid, entry in gpus.items() if isinstance(gpus, dict) else ():
        if not isinstance(entry, dict):
            continue
        for name in ("flops", "previous_flops"):
            value = entry.get(name)
            if value is not None and not plausible_flops(value):
                return f"GPU {uuid!r} has {name} {value!r}, not a throughput in (0, {MAX_PLAUSIBLE_FLOPS:g}] FLOP/s"
        for name in ("samples", "uncapped_samples"):
            values = entry.get(name)
            bad = [v for v in values if not plausible_flops(v)] if isinstance(values, list) else []
            if bad:
                return f"GPU {uuid!r} has {bad[0]!r} in {name}, not a throughput in (0, {MAX_PLAUSIBLE_FLOPS:g}] FLOP/s"
    return None


def _parse(entry: Any) -> Baseline | None:
    try:
        key = BaselineKey(**entry["key"])
        for name in ("dtype", "shape", "engine", "engine_version", "blas_version", "driver_version"):
            if not isinstance(getattr(key, name), str):
                return None
        if key.power_limit_watts is not None and not isinstance(key.power_limit_watts, int | float):
            return None
        samples = [float(x) for x in entry.get("samples", [])]
        flops = entry.get("flops")
        previous = entry.get("previous_key")  # absent in files written before it existed
        previous_key = BaselineKey(**previous) if isinstance(previous, dict) else None
        previous_flops = entry.get("previous_flops")
        established = entry.get("established_timestamp")
        if not isinstance(key.uncapped, bool):
            return None
        return Baseline(
            key,
            samples,
            None if flops is None else float(flops),
            None if established is None else float(established),
            [float(x) for x in entry.get("uncapped_samples", [])],
            previous_key,
            None if previous_flops is None or previous_key is None else float(previous_flops),
        )
    except (KeyError, TypeError, ValueError):
        return None
