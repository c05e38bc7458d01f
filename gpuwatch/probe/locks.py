"""One lock file per GPU in the state dir (``probe-<uuid>.lock``, flock): a probe from `gpuwatch probe` and one
from the agent never run on the same GPU at once. Locks are taken in UUID order, so two multi-GPU probes cannot
deadlock; the kernel drops a lock when its holder dies, so a killed probe never leaves a GPU locked."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path


class LockUnavailable(Exception):
    """The lock file cannot be opened (state dir missing or not ours); the message says what to do."""


def lock_path(state_dir: Path, uuid: str) -> Path:
    return state_dir / f"probe-{re.sub(r'[^A-Za-z0-9_.-]', '_', uuid)}.lock"


def try_lock(state_dir: Path, uuid: str, *, wait: bool) -> int | None:
    """The held lock's descriptor; None when another probe holds it and `wait` is False."""
    path = lock_path(state_dir, uuid)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        try:  # the agent's user owns the file: a read-only descriptor takes a flock just the same
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise LockUnavailable(
                f"cannot open the probe lock {path}: {exc.strerror}; run as the agent's user or root, or pass "
                "--state-dir with the agent's state dir"
            ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the last descriptor releases the flock
