"""The fault ledger: each GPU's faults that need an action, kept in the state dir until they are repaired.

A verdict judged from one snapshot lapses with its signal (an XID leaves the rules' window after ten minutes, an
agent restart forgets it). The ledger keeps the fault instead, per GPU, keyed by its UUID and serial: a card moved to
another slot keeps its history when the state dir goes with it, and a new card in the same slot starts clean. Each
fault carries its time, the boot it was seen in, the driver and its evidence; a closed one keeps who closed it, how
and why, so a fault that returns is known to return (gpuwatch.judge.held decides what opens, escalates and closes).

One file, ``fault_ledger.json``, written by the agent after a poll that changed it and by `gpuwatch repair`: each
read-modify-write holds an flock on ``fault_ledger.lock``, and re-reads the file first when it changed on disk, so
neither undoes the other's change. The agent notices a repair by the file's change (one stat per poll). Written
atomically and read defensively (gpuwatch.files.statefile): a file that is not a ledger is moved aside, a malformed
GPU or fault in it is skipped and said, and every list and string is bounded, so a planted file cannot make the
agent hold a GPU, grow without bound or fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from gpuwatch.core.latch import Latch
from gpuwatch.files.statedir import open_in_state_dir
from gpuwatch.files.statefile import STATE_VERSION, StateDirError, atomic_write_json, read_json

log = logging.getLogger(__name__)

LEDGER_FILE = "fault_ledger.json"
LEDGER_LOCK_FILE = "fault_ledger.lock"
LEDGER_KIND = "fault_ledger"
# Bounds: a node's GPUs over its life (replacements included) and each GPU's faults, newest kept. 256 GPUs of 32
# faults with their longest strings stay under 4 MiB, half the state files' read limit.
MAX_GPUS = 256
MAX_FAULTS_PER_GPU = 32
MAX_EVIDENCE_CHARS = 400
MAX_NOTE_CHARS = 500
MAX_NAME_CHARS = 128
MAX_BOOTS_PER_FAULT = 8

# What a fault asks for, mildest first (the verdict's actions above restart_app: only those are held).
HeldAction = Literal["reset_gpu", "reboot_node", "inspect_hardware", "replace_gpu"]
HELD_ACTIONS: tuple[HeldAction, ...] = get_args(HeldAction)
HeldState = Literal["degraded", "unhealthy"]
HELD_STATES: tuple[HeldState, ...] = get_args(HeldState)
ClosedHow = Literal["repair", "clean_probe"]  # `gpuwatch repair`, or a clean probe after a reboot
CLOSED_HOW: tuple[ClosedHow, ...] = get_args(ClosedHow)


@dataclass(frozen=True, slots=True)
class Closure:
    """How a fault ended: when, how, by whom (a user, or the agent) and why."""

    time: float
    how: ClosedHow
    by: str
    note: str


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of one GPU: what signal (`key`: an alert's name or ``XID 79``), what it asks for, and when.

    `action` is what the fault asks for now: `base_action` escalated for the times it returned (`returns`: earlier
    occurrences of the same key closed since, and reboots it outlived). `at` is the signal's own time (an XID's
    event), so a repair is not undone by the same event read again after a restart."""

    key: str
    state: HeldState
    base_action: HeldAction
    action: HeldAction
    evidence: str
    opened: float
    at: float
    index: int
    driver: str
    boots: tuple[str, ...]
    returns: int = 0
    closed: Closure | None = None

    @property
    def is_open(self) -> bool:
        return self.closed is None


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """A GPU's history: its identity and its faults, oldest first."""

    uuid: str
    serial: str
    index: int
    faults: tuple[Fault, ...] = ()

    @property
    def open_faults(self) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.is_open)

    def last(self, key: str) -> Fault | None:
        """The newest fault of `key`, open or closed."""
        return next((f for f in reversed(self.faults) if f.key == key), None)

    def closed_count(self, key: str) -> int:
        return sum(1 for f in self.faults if f.key == key and not f.is_open)


@dataclass(frozen=True, slots=True)
class LedgerView:
    """The ledger as one snapshot reads it: every GPU's record by UUID."""

    gpus: Mapping[str, GpuRecord] = field(default_factory=dict)

    def open_faults(self, uuid: str) -> tuple[Fault, ...]:
        record = self.gpus.get(uuid)
        return record.open_faults if record is not None else ()

    def record(self, uuid: str) -> GpuRecord | None:
        return self.gpus.get(uuid)


class Records:
    """The mutable copy of the ledger that one change works on (FaultLedger.change)."""

    def __init__(self, gpus: dict[str, GpuRecord]) -> None:
        self.gpus = gpus
        self.changed = False
        self.notes: list[str] = []  # what changed, in words, for the log

    def put(self, record: GpuRecord) -> None:
        """Replace a GPU's record (bounded to its newest faults) when it differs."""
        record = _bounded(record)
        if self.gpus.get(record.uuid) != record:
            self.gpus[record.uuid] = record
            self.changed = True

    def view(self) -> LedgerView:
        return LedgerView(dict(self.gpus))


class FaultLedger:
    """The ledger file of one state dir; thread-safe. The agent keeps a view in memory, refreshed when the file
    changes; a write that fails (a full or read-only state dir) is said once and the view kept in memory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LEDGER_FILE
        self._lock_path = state_dir / LEDGER_LOCK_FILE
        self._lock = threading.Lock()
        self._gpus: dict[str, GpuRecord] = {}
        self._stamp: tuple[int, int, int] | None = None  # the file's (inode, size, mtime_ns) when last read or written
        self._loaded = False
        self._failing = Latch(log)

    def view(self) -> LedgerView:
        """The ledger now, re-read first when the file changed on disk (a repair from the CLI)."""
        with self._lock:
            self._refresh()
            return LedgerView(dict(self._gpus))

    @contextlib.contextmanager
    def change(self) -> Iterator[Records]:
        """A read-modify-write under the file lock: yields the records to change; writes them when they changed.
        Raises StateDirError when the write fails (the change is kept in memory all the same)."""
        with self._lock, self._file_lock():
            self._refresh()
            records = Records(dict(self._gpus))
            yield records
            if not records.changed:
                return
            self._gpus = _bounded_gpus(records.gpus)
            try:
                atomic_write_json(self.path, _document(self._gpus))
            except StateDirError as exc:
                self._failing.fail("%s; the fault ledger is kept in memory and written at its next change", exc)
                raise
            self._failing.recover("wrote %s again after earlier failures", self.path)
            self._stamp = _stamp(self.path)

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """The flock that orders the agent's writes and `gpuwatch repair`'s; none where it cannot be created (a full
        state dir: nothing can be written then anyway)."""
        try:
            fd = open_in_state_dir(self._lock_path, os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError as exc:
            log.debug("cannot open %s: %s; changing the ledger without its lock", self._lock_path, exc)
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _refresh(self) -> None:
        stamp = _stamp(self.path)
        if self._loaded and stamp == self._stamp:
            return
        data = read_json(self.path, expect_kind=LEDGER_KIND)
        self._gpus = parse_ledger(data, self.path)
        self._stamp = _stamp(self.path)  # after a corrupt file was moved aside: missing
        self._loaded = True


def read_ledger(state_dir: Path) -> LedgerView:
    """The ledger for a reader that must change nothing (`gpuwatch snapshot`, `check`): a bad file is left as it is."""
    path = state_dir / LEDGER_FILE
    return LedgerView(parse_ledger(read_json(path, expect_kind=LEDGER_KIND, move_aside=False), path))


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


# --- the file ----------------------------------------------------------------------------------------------------


def _document(gpus: Mapping[str, GpuRecord]) -> dict[str, Any]:
    return {
        "kind": LEDGER_KIND,
        "version": STATE_VERSION,
        "gpus": {uuid: _record_json(record) for uuid, record in sorted(gpus.items())},
    }


def _record_json(record: GpuRecord) -> dict[str, Any]:
    return {
        "serial": record.serial,
        "index": record.index,
        "faults": [_fault_json(f) for f in record.faults],
    }


def _fault_json(fault: Fault) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key": fault.key,
        "state": fault.state,
        "base_action": fault.base_action,
        "action": fault.action,
        "evidence": fault.evidence,
        "opened": fault.opened,
        "at": fault.at,
        "index": fault.index,
        "driver": fault.driver,
        "boots": list(fault.boots),
        "returns": fault.returns,
        "closed": None,
    }
    if fault.closed is not None:
        c = fault.closed
        out["closed"] = {"time": c.time, "how": c.how, "by": c.by, "note": c.note}
    return out


def parse_ledger(data: dict[str, Any] | None, path: Path) -> dict[str, GpuRecord]:
    """The records of a ledger document; a malformed GPU or fault is skipped and said, never the whole file."""
    if data is None:
        return {}
    entries = data.get("gpus")
    if not isinstance(entries, dict):
        log.warning('fault ledger %s has no "gpus" object; starting with an empty ledger', path)
        return {}
    gpus: dict[str, GpuRecord] = {}
    for uuid, entry in entries.items():
        record = _parse_record(uuid, entry, path)
        if record is None:
            log.warning("fault ledger %s: ignoring the malformed record of GPU %r", path, str(uuid)[:80])
        else:
            gpus[uuid] = record
    return _bounded_gpus(gpus)


def _parse_record(uuid: object, entry: object, path: Path) -> GpuRecord | None:
    if not _text(uuid) or not isinstance(entry, dict):
        return None
    serial, index, faults = entry.get("serial"), entry.get("index"), entry.get("faults")
    if not isinstance(serial, str) or len(serial) > MAX_NAME_CHARS or not _count(index) or not isinstance(faults, list):
        return None
    parsed: list[Fault] = []
    for raw in faults[-MAX_FAULTS_PER_GPU * 4 :]:  # a planted list of millions is not walked
        fault = _parse_fault(raw)
        if fault is None:
            log.warning("fault ledger %s: ignoring a malformed fault of GPU %s", path, uuid)
        else:
            parsed.append(fault)
    assert isinstance(uuid, str) and isinstance(index, int)
    return _bounded(GpuRecord(uuid, serial, index, tuple(parsed)))


def _parse_fault(raw: object) -> Fault | None:
    if not isinstance(raw, dict):
        return None
    key, state, base, action, evidence = (raw.get(k) for k in ("key", "state", "base_action", "action", "evidence"))
    opened, at, index, driver, boots, returns = (
        raw.get(k) for k in ("opened", "at", "index", "driver", "boots", "returns")
    )
    if not (_text(key) and state in HELD_STATES and base in HELD_ACTIONS and action in HELD_ACTIONS):
        return None
    if not (isinstance(evidence, str) and _time(opened) and _time(at) and _count(index) and _count(returns)):
        return None
    if not isinstance(driver, str) or len(driver) > MAX_NAME_CHARS:
        return None
    if not isinstance(boots, list) or not boots or not all(_text(b) for b in boots):
        return None
    closed = raw.get("closed")
    closure = None
    if closed is not None:
        closure = _parse_closure(closed)
        if closure is None:
            return None
    assert isinstance(opened, int | float) and isinstance(at, int | float)
    assert isinstance(index, int) and isinstance(returns, int)
    return Fault(
        key=str(key),
        state=state,
        base_action=base,
        action=action,
        evidence=evidence[:MAX_EVIDENCE_CHARS],
        opened=float(opened),
        at=float(at),
        index=index,
        driver=driver,
        boots=tuple(boots[-MAX_BOOTS_PER_FAULT:]),
        returns=returns,
        closed=closure,
    )


def _parse_closure(raw: object) -> Closure | None:
    if not isinstance(raw, dict):
        return None
    at, how, by, note = (raw.get(k) for k in ("time", "how", "by", "note"))
    if not (_time(at) and how in CLOSED_HOW and isinstance(by, str) and isinstance(note, str)):
        return None
    assert isinstance(at, int | float)
    return Closure(float(at), how, by[:MAX_NAME_CHARS], note[:MAX_NOTE_CHARS])


def _text(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**31


def _time(value: object) -> bool:
    # A unix time: from 2001 to 2286 (what a real clock can have written), not NaN, negative or 1e308.
    return isinstance(value, int | float) and not isinstance(value, bool) and 1e9 <= value < 1e10


def _bounded(record: GpuRecord) -> GpuRecord:
    """At most MAX_FAULTS_PER_GPU faults: every open one first, then the newest closed."""
    if len(record.faults) <= MAX_FAULTS_PER_GPU:
        return record
    open_ = [f for f in record.faults if f.is_open][-MAX_FAULTS_PER_GPU:]
    room = MAX_FAULTS_PER_GPU - len(open_)
    closed = [f for f in record.faults if not f.is_open][-room:] if room else []
    kept = {id(f) for f in (*open_, *closed)}
    return replace(record, faults=tuple(f for f in record.faults if id(f) in kept))


def _bounded_gpus(gpus: dict[str, GpuRecord]) -> dict[str, GpuRecord]:
    """At most MAX_GPUS records: those with open faults first, then the most recently active."""
    if len(gpus) <= MAX_GPUS:
        return gpus
    keep = sorted(gpus.values(), key=_activity, reverse=True)[:MAX_GPUS]
    return {r.uuid: r for r in keep}


def _activity(record: GpuRecord) -> tuple[bool, float]:
    """Open faults first, then the latest a fault opened or closed."""
    times = [f.closed.time if f.closed else f.opened for f in record.faults]
    return bool(record.open_faults), max(times, default=0.0)
