"""One lock file per GPU in the state dir (``probe-<uuid>.lock``, flock): a probe from `gpuwatch probe` and one
from the agent never run on the same GPU at once. Locks are taken in UUID order, so two multi-GPU probes cannot
deadlock; the kernel drops a lock when its holder dies, so a killed probe never leaves a GPU locked. A link or FIFO
planted in a lock file's place is refused, never followed (gpuwatch.files.safefile)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path

from gpuwatch.files.safefile import UnsafeFileError, open_regular
from gpuwatch.files.statedir import NO_SPACE_ERRNOS, open_in_state_dir


class LockUnavailable(Exception):
    """The lock file cannot be opened (state dir missing or not ours); the message says what to do."""


class LockNoRoom(LockUnavailable):
    """The state dir's filesystem or quota has no room to create the lock file: a probe round skips the GPU (said
    once) rather than fail, as the agent runs on with its state in memory."""


def lock_path(state_dir: Path, uuid: str) -> Path:
    return state_dir / f"probe-{re.sub(r'[^A-Za-z0-9_.-]', '_', uuid)}.lock"


def try_lock(state_dir: Path, uuid: str, *, wait: bool) -> int | None:
    """The held lock's descriptor; None when another probe holds it and `wait` is False."""
    path = lock_path(state_dir, uuid)
    try:
        fd = open_in_state_dir(path, os.O_RDWR | os.O_CREAT, 0o644)  # no link followed, no FIFO waited on
    except UnsafeFileError as exc:
        raise LockUnavailable(f"refusing the probe lock: {exc}; remove it (the agent makes it again)") from None
    except OSError as create_error:
        try:  # the agent's user owns the file: a read-only descriptor takes a flock just the same
            fd = open_regular(path, os.O_RDONLY)
        except OSError as exc:
            if create_error.errno in NO_SPACE_ERRNOS:
                raise LockNoRoom(
                    f"no room to create the probe lock {path} ({create_error.strerror}): free space (or quota) on "
                    "the state dir's filesystem"
                ) from None
            raise LockUnavailable(
                f"cannot open the probe lock {path}: {exc.strerror or exc}; run as the agent's user, or pass "
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
