"""The state dir as a whole: whose it is, which agent owns it, what a killed agent left in it, and getting it back.

- Only its owner may write in it: a dir another user owns, or that group or others may write, lets them plant
  links and FIFOs where a root agent opens files, so it is refused (exit 78) with what to change.
- One agent per state dir: the second would read the first's known GPUs and report them lost. The agent holds an
  exclusive flock on ``agent.lock`` (with its PID inside) and on the state dir itself for its lifetime; the kernel
  drops them when the agent dies. The dir's own lock holds alone where a full filesystem has no inode left for
  ``agent.lock``.
- A full filesystem or quota (ENOSPC, EDQUOT; NO_SPACE_ERRNOS) is not a reason to refuse to start: the agent keeps
  its state in memory and says so (gpuwatch.service.startup.claim_state_dir).
- Temp files of our own naming pattern (statefile.atomic_write_json) left behind by a kill -9 are removed at
  start-up once they are older than any write takes.
- A state dir deleted while the agent runs is made again (logged once), rather than failing every write.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import threading
import time
from pathlib import Path

from gpuwatch.core.latch import Latch
from gpuwatch.files.safefile import open_regular, read_regular_file

log = logging.getLogger(__name__)

AGENT_LOCK_FILE = "agent.lock"
STATE_DIR_MODE = 0o750  # as systemd's StateDirectoryMode= in systemd/gpuwatch.service
STALE_TEMP_SECONDS = 60.0  # an atomic write takes milliseconds; a temp file this old was left by a killed writer
# ".known_gpus.json.k2j4_x9a.tmp": tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp") in statefile.
# The errors of a filesystem with no room for the agent: a full disk or inode table, or a user's quota. The agent starts
# and keeps its state in memory (said once) rather than exit, so a local user filling a shared /var cannot keep it down.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_TEMP_RE = re.compile(r"^\.[A-Za-z0-9_.-]+\.[a-z0-9_]{8}\.tmp$")

_recreated = Latch(log)  # by path: said once per state dir
_recreate_lock = threading.Lock()


class StateDirUnsafe(Exception):
    """The state dir is another user's, or others may write in it; the message says what to change."""


class StateDirBusy(Exception):
    """Another agent holds the state dir; the message names its PID when known."""


def state_dir_problem(path: Path, *, euid: int | None = None) -> str | None:
    """Why ``path`` is unsafe to use as the state dir, or None (also None when it does not exist yet)."""
    uid = os.geteuid() if euid is None else euid
    try:
        link = os.lstat(path)
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # not there (yet): whether it can be made is another check
        return None
    except OSError as exc:
        return f"cannot look at it: {exc.strerror}"
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (uid, 0):
        return f"it is a symbolic link owned by UID {link.st_uid}, not by this user (UID {uid}) or root"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if info.st_uid not in (uid, 0):
        return (
            f"it is owned by UID {info.st_uid}, not by this user (UID {uid}) or root: its owner could plant links "
            f"and FIFOs where this process writes; run as its owner (sudo -u '#{info.st_uid}' gpuwatch …) or use a "
            "state dir of your own (--state-dir)"
        )
    if info.st_mode & 0o022:
        return (
            f"its group or others may write in it (mode {stat.S_IMODE(info.st_mode):04o}): they could plant links and "
            f"FIFOs where this process writes; chmod go-w {path}"
        )
    return None


def require_safe_state_dir(path: Path) -> None:
    """Raise StateDirUnsafe naming the problem (the CLI exits 78)."""
    problem = state_dir_problem(path)
    if problem is not None:
        raise StateDirUnsafe(f"state dir {path}: {problem}")


def make_private_dir(path: Path, mode: int = 0o700) -> None:
    """Create ``path`` (and parents) with ``mode``, and tighten it when it exists and is ours (the demo's dir)."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & ~mode:
        os.chmod(path, mode)


def ensure_state_dir(path: Path) -> bool:
    """Make the state dir again when it was deleted under a running agent; True when it exists afterwards."""
    if path.is_dir():
        return True
    with _recreate_lock:
        try:
            path.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            _recreated.fail("state dir %s is gone and cannot be made again: %s", path, exc.strerror, key=str(path))
            return False
        _recreated.fail("state dir %s was deleted while the agent ran; made it again", path, key=str(path))
    return True


def clean_stale_temp_files(path: Path, *, older_than: float = STALE_TEMP_SECONDS, now: float | None = None) -> int:
    """Remove our own temp files that a killed writer left behind; how many were removed."""
    cutoff = (time.time() if now is None else now) - older_than
    removed = 0
    try:
        names = os.listdir(path)
    except OSError:
        return 0
    for name in names:
        if not _TEMP_RE.match(name):
            continue
        with contextlib.suppress(OSError):
            info = os.lstat(path / name)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_mtime < cutoff:
                os.unlink(path / name)
                removed += 1
    if removed:
        log.info("removed %d temp file(s) left in %s by an earlier agent that was killed mid-write", removed, path)
    return removed


class AgentLock:
    """The exclusive hold of one agent on its state dir, for the agent's lifetime: a flock on ``agent.lock`` (its PID
    inside, for the message another agent gives) and one on the directory itself, which is all there is where a full
    filesystem has no room for ``agent.lock``."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / AGENT_LOCK_FILE
        self._fd: int | None = None
        self._dir_fd: int | None = None

    @property
    def file_held(self) -> bool:
        """Whether ``agent.lock`` is held (False while only the directory's lock is: no room to create it)."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise StateDirBusy (another agent) / OSError (cannot open it)."""
        fd = self._lock_file()
        try:
            dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(dir_fd)
                raise StateDirBusy(self._busy_message()) from None
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        self._fd, self._dir_fd = fd, dir_fd

    def renew(self) -> None:
        """Once a full filesystem has room again: create and take ``agent.lock`` if there was no room for it (the
        directory's lock held meanwhile), and write the PID in it that found no room at start."""
        if self._dir_fd is None:
            return
        if self._fd is None:
            with contextlib.suppress(OSError, StateDirBusy):
                self._fd = self._lock_file()
        else:
            self._write_pid(self._fd)

    def _lock_file(self) -> int | None:
        """``agent.lock`` locked, with our PID; None when the filesystem has no room to create it."""
        try:
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno in NO_SPACE_ERRNOS:
                return None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(self._busy_message()) from None
        except BaseException:
            os.close(fd)
            raise
        self._write_pid(fd)
        return fd

    @staticmethod
    def _write_pid(fd: int) -> None:
        with contextlib.suppress(OSError):  # no room for it: the message of a second agent names no PID
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._dir_fd = None

    def _busy_message(self) -> str:
        pid = ""
        with contextlib.suppress(OSError, ValueError):
            text = read_regular_file(self.path, max_bytes=64).decode("ascii").strip()
            if text.isdigit():
                pid = f" (PID {int(text)})"
        return (
            f"another gpuwatch agent{pid} already uses the state dir {self.path.parent} (it holds {self.path}); "
            "stop it, or give this one its own --state-dir"
        )


def open_in_state_dir(path: Path, flags: int, mode: int = 0o644) -> int:
    """open_regular for a file directly in the state dir, making the dir again if it was deleted meanwhile."""
    try:
        return open_regular(path, flags, mode)
    except FileNotFoundError:
        if not flags & os.O_CREAT or not ensure_state_dir(path.parent):
            raise
        return open_regular(path, flags, mode)


def demo_state_dir(vendor: str) -> Path:
    """The demo's state dir: private to this user, never a predictable name in a shared /tmp.

    ``$XDG_CACHE_HOME/gpuwatch/demo-<vendor>`` (``~/.cache/...``), so its probe baselines survive a reboot; only
    where no home directory can be found, ``$XDG_RUNTIME_DIR`` (a per-user tmpfs, 0700 by design)."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if cache and Path(cache).is_absolute():
        base = Path(cache)
    else:
        try:
            base = Path.home() / ".cache"
        except RuntimeError:  # no $HOME and no passwd entry
            runtime = os.environ.get("XDG_RUNTIME_DIR", "")
            if not runtime:
                raise StateDirUnsafe(
                    "no private place for the demo's state: set $HOME or $XDG_CACHE_HOME, or pass --state-dir"
                ) from None
            base = Path(runtime)
    return base / "gpuwatch" / f"demo-{vendor}"


def writable_problem(path: Path) -> str | None:
    """Why the agent could not write in ``path`` (or make it), found without writing anything; None when it could."""
    target = path
    while not target.exists():  # the agent makes missing dirs: the nearest existing parent must take them
        if target.parent == target:
            return "no part of the path exists"
        target = target.parent
    if not target.is_dir():
        return f"{target} is not a directory"
    if not os.access(target, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return f"not writable by this user (UID {os.geteuid()}): {target}"
    try:
        fs = os.statvfs(target)
    except OSError as exc:
        return f"cannot look at its filesystem: {exc.strerror}"
    if fs.f_flag & os.ST_RDONLY:
        return f"{target} is on a read-only filesystem"
    if target != path and (fs.f_bavail == 0 or fs.f_favail == 0):  # a state dir that exists is space_problem's
        return f"the filesystem of {target} is full (no free blocks or inodes): the state dir cannot be made there"
    return None


def space_problem(path: Path) -> str | None:
    """Why the agent would start with its state in memory (its filesystem is full), found without writing; or None.
    A quota (EDQUOT) shows only when a write is tried: the agent's start says that one."""
    if not path.is_dir():  # one to be made on a full filesystem cannot be: writable_problem's
        return None
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    if fs.f_bavail == 0 or fs.f_favail == 0:
        return (
            f"the filesystem of {path} is full (no free {'blocks' if fs.f_bavail == 0 else 'inodes'}): the agent "
            "starts, but keeps its state in memory only, lost at a restart, until there is room"
        )
    return None
