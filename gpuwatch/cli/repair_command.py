"""`gpuwatch repair`: say that a GPU's held faults are mended, so its verdict clears.

The fault ledger (gpuwatch.state.ledger) holds a fault that needs an action until it is repaired. After the action
(a reset, a reboot, reseating, a new cable), a person records it here with a note; the ledger keeps who and why, and
a running agent reads the change at its next poll (it watches the file), so /health/gpus, the verdict metrics and
`gpuwatch health` clear within seconds. If the fault shows again, it opens again and counts as having returned: a
fault that keeps returning escalates (docs/verdicts.md).

Works with the agent running or stopped: both change the ledger under its file lock.
"""

from __future__ import annotations

import getpass
import os
import sys
import time
from pathlib import Path

from gpuwatch.config.settings import Config
from gpuwatch.core.exitcodes import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from gpuwatch.files.statedir import StateDirUnsafe, require_safe_state_dir
from gpuwatch.files.statefile import StateDirError
from gpuwatch.judge.held import repair
from gpuwatch.state.ledger import MAX_NOTE_CHARS, FaultLedger, GpuRecord, LedgerView


class NotFound(Exception):
    """--gpu names no GPU of the ledger (or more than one); the message says which exist."""


def who() -> str:
    """The person repairing: the sudo caller where there is one, else the login name."""
    sudo = os.environ.get("SUDO_USER", "")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{sudo} (via sudo)" if sudo and sudo != user else user


def find_gpu(view: LedgerView, gpu: str) -> GpuRecord:
    """The record `gpu` names: a UUID, or an index (the slot the GPU was last seen in; among several cards seen in
    that slot, the one with faults held)."""
    if gpu in view.gpus:
        return view.gpus[gpu]
    if not gpu.isdigit():
        raise NotFound(f"--gpu {gpu!r}: no GPU with that UUID in the ledger{_listing(view)}")
    index = int(gpu)
    found = [r for r in view.gpus.values() if r.index == index]
    held = [r for r in found if r.open_faults]
    if len(held) == 1 or (len(found) == 1 and not held):
        return (held or found)[0]
    if not found:
        raise NotFound(f"--gpu {index}: the ledger holds nothing for a GPU {index}{_listing(view)}")
    raise NotFound(f"--gpu {index}: several GPUs were seen as GPU {index}; name one by UUID{_listing(view)}")


def _listing(view: LedgerView) -> str:
    held = [r for r in view.gpus.values() if r.open_faults]
    if not held:
        return " (no GPU has a fault held)"
    return "; faults are held for " + ", ".join(
        f"GPU {r.index} ({r.uuid})" for r in sorted(held, key=lambda r: r.index)
    )


def note_problem(note: str) -> str | None:
    if not note.strip():
        return "--note is empty: say what was done (e.g. 'reseated, cable replaced')"
    if len(note) > MAX_NOTE_CHARS:
        return f"--note is {len(note)} characters long; at most {MAX_NOTE_CHARS}"
    if not note.isprintable():
        return "--note has control characters; one line of text"
    return None


def repair_gpu(config: Config, gpu: str, note: str) -> int:
    problem = note_problem(note)
    if problem is not None:
        print(f"gpuwatch repair: {problem}", file=sys.stderr)
        return EXIT_USAGE
    state_dir = Path(config.state_dir)
    if not state_dir.is_dir():
        print(
            f"gpuwatch repair: no state dir at {state_dir}: is this the agent's? (--state-dir, or [agent] state_dir)",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    try:
        require_safe_state_dir(state_dir)
    except StateDirUnsafe as exc:
        print(f"gpuwatch repair: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    ledger = FaultLedger(state_dir)
    by = who()
    try:
        with ledger.change() as records:
            try:
                record = find_gpu(records.view(), gpu)
            except NotFound as exc:
                print(f"gpuwatch repair: {exc}", file=sys.stderr)
                return EXIT_USAGE
            mended, closed = repair(record, now=time.time(), by=by, note=note.strip())
            if closed:
                records.put(mended)
    except (StateDirError, PermissionError) as exc:
        print(f"gpuwatch repair: {exc}; run it as the agent's user or root", file=sys.stderr)
        return EXIT_UNAVAILABLE
    name = f"GPU {record.index} ({record.uuid})"
    if not closed:
        print(f"{name}: no fault held; nothing to repair")
        return EXIT_OK
    for fault in closed:
        print(f"{name}: {fault.key} ({fault.action}) repaired by {by}: {note.strip()}")
    print(f"recorded in {ledger.path}; a running agent clears the verdict at its next poll")
    return EXIT_OK
