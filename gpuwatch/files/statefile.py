"""The agent's persistence: small JSON files in the state dir, written atomically and read defensively.

Every file is ``{"kind": ..., "version": 1, ...}``. A power cut mid-write must never leave a half file behind
(write a temp file, fsync, rename, fsync the dir), and a file the agent cannot understand (corrupt, or written
by something else) must never stop it: it is moved aside for a human to look at and the agent starts without
it.

Known GPUs (``known_gpus.json``) live here too: a GPU seen once is remembered, so one lost before an agent
restart is still exported as ``gpuwatch_gpu_up 0`` after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuwatch.core.latch import Latch
from gpuwatch.core.model import GpuIdentity
from gpuwatch.files.safefile import UnsafeFileError, read_regular_file
from gpuwatch.files.statedir import NO_SPACE_ERRNOS, STATE_DIR_MODE, ensure_state_dir

log = logging.getLogger(__name__)

STATE_VERSION = 1
KNOWN_GPUS_FILE = "known_gpus.json"
KNOWN_GPUS_KIND = "known_gpus"
MAX_STATE_FILE_BYTES = 8 * 2**20  # known GPUs and baselines of a 1,024-GPU node are well under 1 MiB


class StateDirError(Exception):
    """The state dir cannot be written (read-only, full, missing permission); the message says what to do."""

    def __init__(self, path: Path, cause: OSError) -> None:
        self.path = path
        self.errno = cause.errno
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        code = errno.errorcode.get(cause.errno, "") if cause.errno else ""
        super().__init__(
            f"cannot write state file {path}: {reason}{f' ({code})' if code else ''}; make {path.parent} "
            "writable by the agent (--state-dir, systemd StateDirectory=) and check its filesystem has space"
        )

    @property
    def no_space(self) -> bool:
        """The filesystem or the user's quota is full: the agent runs on with its state in memory."""
        return self.errno in NO_SPACE_ERRNOS


# The outcome of the last state-file write in each directory (True: it worked), for gpuwatch_state_dir_writable: every
# writer of state files says its failures its own way, and this says whether the dir takes writes at all.
_last_write_ok: dict[str, bool] = {}
_outcome_lock = threading.Lock()


def last_write_ok(directory: Path) -> bool | None:
    """Whether the last state file written in ``directory`` was written (None: nothing was written there yet)."""
    with _outcome_lock:
        return _last_write_ok.get(os.path.normpath(directory))


def _record_write(directory: Path, ok: bool) -> None:
    with _outcome_lock:
        _last_write_ok[os.path.normpath(directory)] = ok


def atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON so that a reader sees the old file or the new one, never a mix.

    Raises StateDirError (the old file left intact) when the directory cannot be written; a value that is not
    JSON-serialisable is a programming error and raises TypeError/ValueError before anything touches the disk.
    """
    payload = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")
    tmp: str | None = None
    try:
        ensure_state_dir(path.parent)  # deleted under a running agent: made again, said once
        # mkstemp opens with O_CREAT | O_EXCL | O_NOFOLLOW: a planted link or file of that name is never written
        # through; os.replace then renames over whatever `path` is (a link is replaced, never followed).
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fchmod(f.fileno(), 0o644)  # readable by `gpuwatch` CLI runs as another user; nothing secret
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        _record_write(path.parent, False)
        raise StateDirError(path, exc) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    _record_write(path.parent, True)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable; best effort, as the new file is already in place for every reader."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        log.debug("cannot fsync directory %s: %s", directory, exc)


def check_state_dir(state_dir: Path) -> None:
    """Raise StateDirError unless a file can be written in ``state_dir`` (the agent's start-up, exit 69)."""
    try:
        state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise StateDirError(state_dir / ".gpuwatch-write-test", exc) from exc
    atomic_write_json(state_dir / ".gpuwatch-write-test", {"kind": "write_test", "version": STATE_VERSION})
    with contextlib.suppress(OSError):
        (state_dir / ".gpuwatch-write-test").unlink()


def read_json(
    path: Path,
    *,
    expect_kind: str,
    move_aside: bool = True,
    content_problem: Callable[[dict[str, Any]], str | None] | None = None,
) -> dict[str, Any] | None:
    """The file's content when it is ours (right kind and version); None when missing, unreadable or not ours.

    Never raises: a corrupt or foreign file is renamed to ``<name>.corrupt-<unixtime>`` and logged, so the
    agent starts fresh while the evidence stays for a human (``move_aside=False``: only logged, for readers that
    must change nothing, as `gpuwatch check`). A link, FIFO or device in its place is never followed or read, and
    a file over MAX_STATE_FILE_BYTES is not read either. `content_problem` says what makes a well-formed file of
    this kind corrupt all the same (a value no writer of it can have written), or None; such a file is moved aside too.
    """
    aside = _move_aside if move_aside else _say_unusable
    try:
        raw = read_regular_file(path, max_bytes=MAX_STATE_FILE_BYTES)
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        aside(path, str(exc))
        return None
    except OSError as exc:
        log.warning("cannot read state file %s: %s; starting without it (check its permissions)", path, exc)
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        aside(path, f"it is not valid JSON ({str(exc)[:200]})")
        return None
    problem = _envelope_problem(data, expect_kind)
    if problem is None and content_problem is not None:
        assert isinstance(data, dict)
        problem = content_problem(data)
    if problem is not None:
        aside(path, problem)
        return None
    assert isinstance(data, dict)
    return data


def _envelope_problem(data: object, expect_kind: str) -> str | None:
    """Why ``data`` is not a version-1 file of ``expect_kind``, or None when it is."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    kind, version = data.get("kind"), data.get("version")
    if kind != expect_kind:
        return f"its kind is {kind!r}, expected {expect_kind!r}"
    if type(version) is not int or version != STATE_VERSION:
        newer = type(version) is int and version > STATE_VERSION
        hint = " (written by a newer gpuwatch?)" if newer else ""
        return f"its version is {version!r}, expected {STATE_VERSION}{hint}"
    return None


def _say_unusable(path: Path, problem: str) -> None:
    log.warning("state file %s is unusable: %s; ignoring it (left as it is)", path, problem)


def _move_aside(path: Path, problem: str) -> None:
    """Rename a bad state file out of the way and tell the operator what happened and what to do."""
    aside = _aside_name(path)
    try:
        os.replace(path, aside)
    except OSError as exc:
        log.warning(
            "state file %s is unusable: %s; could not move it aside (%s), ignoring it. Delete or fix it; "
            "the agent rebuilds it",
            path,
            problem,
            exc,
        )
        return
    log.warning(
        "state file %s is unusable: %s; moved it to %s and started without it. The agent rebuilds it; "
        "look at the moved file (restore it by hand if it was yours) and then delete it",
        path,
        problem,
        aside,
    )


def _aside_name(path: Path) -> Path:
    """``<name>.corrupt-<unixtime>``, with a counter when two files go bad within the same second."""
    base = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    candidate, n = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}.{n}")
        n += 1
    return candidate


class KnownGpus:
    """Every GPU this node has ever shown the agent, by UUID, kept in ``<state_dir>/known_gpus.json``.

    A lost GPU vanishes from the vendor library; remembering its identity lets the exporter keep reporting it
    as ``gpuwatch_gpu_up 0`` with its info metric, even across agent restarts. The file is written only when
    the set changes (a new GPU, or an identity field such as the driver version changed), so a steady node
    never writes.

    Removing a GPU on purpose (an RMA): call ``forget(uuid)``; by hand, stop the agent, delete the GPU's entry
    under ``"gpus"`` in ``known_gpus.json`` (or delete the whole file; the present GPUs are re-learned at the
    next poll), then start it. Editing the file while the agent runs is undone at its next write.

    A write that fails (read-only or full disk) is logged once; the in-memory view stays right, and the write
    is retried on the next change or after ``retry_interval_s``. Thread-safe.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        retry_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = state_dir / KNOWN_GPUS_FILE
        self._retry_interval_s = retry_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus: dict[str, GpuIdentity] | None = None  # None until loaded
        self._unsaved = False
        self._failing = Latch(log)  # a failing disk is said once, and once when a write works again
        self._last_attempt = 0.0

    def load(self) -> dict[str, GpuIdentity]:
        """Read the file (again) and return every known GPU by UUID; missing or unusable file → {}."""
        with self._lock:
            self._gpus = _parse_known_gpus(read_json(self.path, expect_kind=KNOWN_GPUS_KIND), self.path)
            self._unsaved = False
            return dict(self._gpus)

    def known(self) -> dict[str, GpuIdentity]:
        """The current view by UUID (loading the file first if that has not happened yet)."""
        with self._lock:
            return dict(self._ensure_loaded())

    def remember(self, identities: Iterable[GpuIdentity]) -> None:
        """Add new GPUs, update changed identities; write the file only when something changed."""
        with self._lock:
            gpus = self._ensure_loaded()
            for identity in identities:
                if gpus.get(identity.uuid) != identity:
                    gpus[identity.uuid] = identity
                    self._unsaved = True
                    self._last_attempt = float("-inf")  # a change is worth an immediate write attempt
            self._save_if_needed()

    def write_now(self) -> None:
        """Write what is unsaved at once, not after retry_interval_s: the state dir has room again."""
        with self._lock:
            self._last_attempt = float("-inf")
            self._save_if_needed()

    def forget(self, uuid: str) -> bool:
        """Drop a GPU that was removed on purpose; True when it was known. Persisted like any other change."""
        with self._lock:
            gpus = self._ensure_loaded()
            if gpus.pop(uuid, None) is None:
                return False
            self._unsaved = True
            self._last_attempt = float("-inf")
            self._save_if_needed()
            return True

    def _ensure_loaded(self) -> dict[str, GpuIdentity]:
        if self._gpus is None:
            self._gpus = _parse_known_gpus(read_json(self.path, expect_kind=KNOWN_GPUS_KIND), self.path)
        return self._gpus

    def _save_if_needed(self) -> None:
        """Write when there is something unsaved, but retry a failing disk only every retry_interval_s."""
        now = self._clock()
        if not self._unsaved or now - self._last_attempt < self._retry_interval_s:
            return
        self._last_attempt = now
        try:
            atomic_write_json(self.path, _known_gpus_document(self._ensure_loaded()))
        except StateDirError as exc:
            self._failing.fail("%s; known GPUs are kept in memory and written when possible", exc)
            return
        self._failing.recover("wrote %s again after earlier failures", self.path)
        self._unsaved = False


def _known_gpus_document(gpus: Mapping[str, GpuIdentity]) -> dict[str, Any]:
    return {
        "kind": KNOWN_GPUS_KIND,
        "version": STATE_VERSION,
        "gpus": {uuid: dataclasses.asdict(identity) for uuid, identity in sorted(gpus.items())},
    }


def _parse_known_gpus(data: dict[str, Any] | None, path: Path) -> dict[str, GpuIdentity]:
    """The identities in a known_gpus document; a malformed entry is skipped (and logged), not the file."""
    if data is None:
        return {}
    entries = data.get("gpus")
    if not isinstance(entries, dict):
        log.warning('state file %s has no "gpus" object; starting with no known GPUs', path)
        return {}
    gpus: dict[str, GpuIdentity] = {}
    for uuid, entry in entries.items():
        identity = _parse_identity(uuid, entry)
        if identity is None:
            log.warning("state file %s: ignoring malformed entry for GPU %r", path, uuid)
        else:
            gpus[uuid] = identity
    return gpus


_STRING_FIELDS = ("model", "serial", "pci_bus_id", "driver_version", "vbios_version")


def _parse_identity(uuid: str, entry: object) -> GpuIdentity | None:
    if not isinstance(entry, dict) or entry.get("uuid", uuid) != uuid:
        return None
    vendor, index = entry.get("vendor"), entry.get("index")
    if vendor not in ("nvidia", "amd") or type(index) is not int:
        return None
    strings = {name: entry.get(name, "") for name in _STRING_FIELDS}
    if not all(isinstance(value, str) for value in strings.values()):
        return None
    return GpuIdentity(uuid=uuid, vendor=vendor, index=index, **strings)
