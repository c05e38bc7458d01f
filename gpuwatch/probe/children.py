"""The probe's worker processes, piece by piece: one child's record, killing it with its process group, reading its
output, its resident memory and PIDs (NSpid), and what its exit says. gpuwatch/probe/supervisor.py puts them
together; gpuwatch/probe/launch.py says what a worker is."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpuwatch.core.model import GpuIdentity, GpuSample

KILL_WAIT_SECONDS = 5.0  # how long a SIGKILLed child may take to die before it is left to a later round's poll()
PID_NAMESPACE_PATH = Path("/proc/self/ns/pid")
PROC_PID_INIT_INO = 0xEFFFFFFC  # the kernel's fixed inode of the initial (host) PID namespace


@dataclass(slots=True)
class _Child:
    identity: GpuIdentity
    proc: subprocess.Popen[bytes]
    started_wall: float
    deadline: float
    own_pids: set[int]
    power_signal: bool
    explicit_busy: bool
    stdout: list[bytes] = field(default_factory=list)
    stderr: list[bytes] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)
    signalled: bool = False
    timed_out: bool = False
    unkillable: bool = False  # SIGKILLed but still alive (stuck in the driver, uninterruptible)
    foreign_pids: set[int] = field(default_factory=set)
    seen: dict[float, GpuSample] = field(default_factory=dict)
    ended: float | None = None
    memory_exceeded: int = 0  # the RSS (bytes) at which it was killed for passing the memory limit


def pid_namespace_inode(path: Path) -> int | None:
    """The inode of a PID namespace link (PROC_PID_INIT_INO for the host's), or None where it cannot be read."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _rss(pid: int) -> int:
    """Resident memory of a running process in bytes; 0 once it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def _pids_of(pid: int, *, recursive: bool = False) -> set[int]:
    """The PIDs a process has in every PID namespace (NSpid), plus its descendants' when asked."""
    pids = {pid, *_nspids(pid)}
    if recursive:
        with contextlib.suppress(psutil.Error):
            for descendant in psutil.Process(pid).children(recursive=True):
                pids |= {descendant.pid, *_nspids(descendant.pid)}
    return pids


def _nspids(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return {int(x) for x in line.split()[1:] if x.isdigit()}
    except OSError:
        pass
    return set()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_WAIT_SECONDS)


def _drain(stream: object, sink: list[bytes]) -> None:
    read = getattr(stream, "read", None)
    if read is None:
        return
    with contextlib.suppress(OSError, ValueError):
        while chunk := read(65536):
            sink.append(chunk)
            if sum(len(c) for c in sink) > 4 * 2**20:  # a runaway child: keep the tail that matters
                del sink[:-4]


def _last_json(out: bytes) -> dict[str, object] | None:
    for line in reversed(out.decode(errors="replace").strip().splitlines()):
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                return doc
    return None


def _failure(code: int | None, doc: dict[str, object] | None, stderr: str) -> str:
    if doc is not None and doc.get("message"):
        return str(doc["message"])
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"the worker died of {signal.Signals(-code).name}" + (f": {stderr[-300:]}" if stderr else "")
    tail = stderr[-300:] if stderr else "no output"
    return f"the worker exited with status {code} without a result: {tail}"
