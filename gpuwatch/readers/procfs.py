"""Read what names a GPU process's workload from a procfs root: /proc/PID/cgroup, the real uid from
/proc/PID/status, the command name from /proc/PID/comm, and whether those PIDs are the ones the GPU driver reports.

The root is a parameter (as hwmon's sysfs root is), so the same code reads /proc on a node, a mount of the host's
/proc in a container, a fixture tree in the tests and the simulated node's temporary procfs.

Three reasons a PID cannot be read, told apart because they mean different things:
- the PIDs are not this procfs's: NVML and AMD SMI report host PIDs (the driver's), which a procfs of another PID
  namespace (a container without the host's) maps to other processes or none: every process is ``unknown``;
- hidden: /proc mounted with ``hidepid=`` (systemd's ProtectProc=invisible or noaccess is one) hides or locks other
  users' processes: ``unknown``, never a guess;
- gone: the process exited between the vendor's read and this one (ENOENT without hidepid): left out. So is a
  PID the kernel gave to a new process since: its start time (/proc/PID/stat) is after the vendor listed it, or
  changed while its files were read.
"""

from __future__ import annotations

import errno
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuwatch.readers.cgroup import Workload, workload_of_cgroup

PROC_PID_INIT_INO = 0xEFFFFFFC  # include/linux/proc_ns.h: the inode of the initial (host) PID namespace
MAX_FILE_BYTES = 64 * 1024  # a cgroup file is a line per hierarchy; status is ~1.5 KiB
_STARTTIME_FIELD = 22  # proc(5), /proc/pid/stat: "(22) starttime %llu", clock ticks after boot
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Unreadable = Literal["missing", "hidden"]  # missing: gone, or hidden by hidepid=invisible (hides_others tells)


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """The workload a process belongs to and its user (a name, or the uid where no name is known)."""

    workload: Workload
    user: str
    parent: int | None = field(default=None, compare=False)  # PPid: the agent's own children are its probe workers


@dataclass(frozen=True, slots=True)
class Procfs:
    """A procfs to read GPU processes from. `host_pids`: whether its PIDs are the host's (the ones the vendor
    libraries report); None finds out from the root itself (pids_are_host)."""

    root: Path = Path("/proc")
    host_pids: bool | None = None
    keep: object = field(default=None, compare=False, repr=False)  # the owner of a temporary root (simulated node)

    def pids_are_host(self) -> bool:
        """True when this procfs shows the host's PID namespace, as far as /proc can tell.

        ``<root>/self/status`` NSpid lists this process's PIDs from the procfs's namespace down to its own
        (fs/proc/array.c, task_state), and ``<root>/self/ns/pid`` is its own namespace: one NSpid entry in the host's
        namespace (PROC_PID_INIT_INO) is the host's procfs; more than one entry is a procfs of an ancestor namespace
        (the host's /proc mounted into a container); one entry anywhere else is the container's own."""
        if self.host_pids is not None:
            return self.host_pids
        nspids = _nspid_count(self.root / "self" / "status")
        if nspids is None:
            return False
        if nspids > 1:
            return True
        try:
            return os.stat(self.root / "self" / "ns" / "pid").st_ino == PROC_PID_INIT_INO
        except OSError:
            return False

    def hidepid(self) -> str | None:
        """The ``hidepid=`` option this procfs is mounted with (``invisible``/``2``, ``noaccess``/``1``,
        ``ptraceable``/``4``), None when other users' processes are visible (fs/proc/root.c, proc_parse_param)."""
        try:
            with open(self.root / "self" / "mountinfo", encoding="utf-8", errors="replace") as f:
                lines = f.read(1 << 20).splitlines()
        except OSError:
            return None
        target = str(self.root.resolve()) if self.root.is_absolute() else str(self.root)
        options = ""  # the super options of the last proc mount on the root: the one on top is the one seen
        for line in lines:
            fields = line.split(" ")  # proc(5), /proc/pid/mountinfo: field 5 the mount point, "-", fstype, source
            if len(fields) >= 10 and fields[4] == target and "-" in fields:
                after = fields[fields.index("-") + 1 :]
                if len(after) >= 3 and after[0] == "proc":
                    options = after[2]
        for option in options.split(","):
            key, _, value = option.partition("=")
            if key == "hidepid" and value not in ("0", "off"):
                return value
        return None

    def hides_others(self) -> str | None:
        """The hidepid option when it makes other users' processes invisible to this reader (ENOENT, as for a
        process that exited): ``invisible``/``2`` or ``ptraceable``/``4``, unless this reader is exempt (root,
        CAP_SYS_PTRACE, the mount's gid=), which shows as PID 1 (root's init) being visible."""
        option = self.hidepid()
        if option in ("invisible", "2", "ptraceable", "4") and not (self.root / "1").exists():
            return option
        return None

    def own_pid(self) -> int | None:
        """This process's PID as this procfs numbers it (``<root>/self`` links to it: proc(5)), which is the host's
        PID when the root is the host's /proc mounted into a container; None where it cannot be read."""
        try:
            target = os.readlink(self.root / "self")
        except OSError:
            return None
        return int(target) if target.isdigit() else None

    def boot_id(self) -> str | None:
        """This boot's random id (<root>/sys/kernel/random/boot_id, random(4): a new UUID each boot, the same for every
        reader until the next), None where it cannot be read."""
        try:
            text = _read(self.root / "sys" / "kernel" / "random" / "boot_id").strip()
        except OSError:
            return None
        return text if 0 < len(text) <= 64 and text.isprintable() else None

    def boot_time(self) -> float | None:
        """The unix time the host booted (``btime`` of <root>/stat, proc(5)), None where it cannot be read."""
        try:
            text = _read(self.root / "stat")
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "btime" and value.strip().isdigit():
                return float(value)
        return None

    def owner(
        self,
        pid: int,
        users: Callable[[int | None], str] | None = None,
        listed_at: float | None = None,
        boot_time: float | None = None,
    ) -> ProcessOwner | Unreadable:
        """The workload and user of a process, or why they cannot be read: "hidden" (access denied) or "missing"
        (no such process: it exited, or hidepid=invisible hides it, or the PID is another process's now). `users`
        names a uid (default user_name). With `listed_at` (the unix time the vendor listed the PID) and the host's
        `boot_time`, a process that started after the listing is a reused PID, not the GPU's process."""
        base = self.root / str(pid)
        try:
            started = _start_ticks(_read(base / "stat"))
            cgroup = _read(base / "cgroup")
            status = _read(base / "status")
            comm = _read(base / "comm").strip()
            if _start_ticks(_read(base / "stat")) != started:
                return "missing"  # exited and its PID reused while its files were read
        except OSError as exc:
            # hidepid=noaccess: EACCES. hidepid=invisible: ENOENT, as for a process that is gone.
            return "hidden" if exc.errno in (errno.EACCES, errno.EPERM) else "missing"
        if started is None:
            return "missing"  # not a process's stat: distrusted
        # btime is whole seconds (rounded down), so the start read here is at most a second early: never later.
        if listed_at is not None and boot_time is not None and boot_time + started / CLOCK_TICKS > listed_at + 1.0:
            return "missing"  # started after the vendor listed this PID: the GPU's process is gone
        workload = workload_of_cgroup(cgroup) or Workload("process", comm or f"pid-{pid}")
        return ProcessOwner(workload, (users or user_name)(_real_uid(status)), _status_number(status, "PPid:"))


class UserNames:
    """uid -> name, remembered for `ttl_seconds`: a lookup may go to LDAP or SSSD, and the poll job must not wait on
    it for every process of every poll; a user created or renamed shows within the TTL."""

    def __init__(self, ttl_seconds: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._clock = ttl_seconds, clock
        self._names: dict[int | None, tuple[str, float]] = {}

    def __call__(self, uid: int | None) -> str:
        now = self._clock()
        known = self._names.get(uid)
        if known is None or known[1] <= now:
            if len(self._names) >= 4096:
                self._names.clear()
            known = self._names[uid] = (user_name(uid), now + self._ttl)
        return known[0]


def user_name(uid: int | None) -> str:
    """The user's name where this node knows it, else the uid as a number ("" when there is none)."""
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(MAX_FILE_BYTES)


def _start_ticks(stat: str) -> int | None:
    """Field 22 of /proc/PID/stat, counted after the command name's closing parenthesis (the name may hold spaces
    and parentheses: proc(5) reads it with "%s" only for names without them)."""
    _, paren, rest = stat.rpartition(")")
    fields = rest.split()
    index = _STARTTIME_FIELD - 3  # fields 1 (pid) and 2 (comm) end at the parenthesis; rest starts at field 3
    if not paren or len(fields) <= index or not fields[index].isdigit():
        return None
    return int(fields[index])


def _status_number(status: str, key: str) -> int | None:
    """The first number of a /proc/PID/status line (``PPid:\t1``), None when absent or not a number."""
    for line in status.splitlines():
        if line.startswith(key):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def _real_uid(status: str) -> int | None:
    """The real uid: the first of the four on the ``Uid:`` line (proc(5): real, effective, saved set, filesystem)."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def _nspid_count(path: Path) -> int | None:
    try:
        text = _read(path)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 1
    return 1  # kernels before 4.1 have no NSpid line and no nested view of it
