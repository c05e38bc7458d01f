"""NVIDIA XID errors (and NVSwitch SXid errors) from the kernel log (``/dev/kmsg``), since boot.

NVML only delivers XID events that happen while the agent is registered for them; the kernel log also holds
the ones from before the agent (re)started, and the ones of a GPU that fell off the bus and is gone from NVML.
The backlog read at start is stamped with each record's own kernel time, so re-reading old XIDs after a restart
moves no ``*_last_timestamp_seconds`` forward; records read live are stamped when read, because boot time plus
the kernel's monotonic clock drifts from wall time over a long uptime (NTP slews the one, not the other).

``/dev/kmsg`` yields exactly one record per ``read()``; a regular file (a saved copy, the test fixture) is
read line by line. Both keep their place, and records are also de-duplicated by their sequence number.

Only what the NVIDIA driver itself wrote counts (any local user can put text into the kernel log): the record's
facility must be the kernel's (Documentation/ABI/testing/dev-kmsg: the first prefix field is the syslog
priority and facility, ``level | facility << 3``; userspace writes to /dev/kmsg get facility LOG_USER and can
never inject LOG_KERN), and ``NVRM: Xid`` must open the message text — a kernel segfault line that quotes a
user-chosen file name named ``NVRM: Xid (PCI:…): 79`` is kernel-facility text too, but not the driver's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

from gpuwatch.core.xid import OTHER_XID, xid_from_digits

log = logging.getLogger(__name__)

_READ_SIZE = 16 * 1024  # /dev/kmsg refuses (EINVAL) a buffer smaller than the record; records are < 8 KiB
_MAX_RECORDS_PER_CALL = 100_000  # bounds one call under a kernel log flood
_MAX_FIELD_DIGITS = 20  # a u64 sequence number or timestamp; longer is junk, never a 4,300-digit int() error
_MAX_PENDING_SXIDS = 10_000  # between two drains; a flood keeps the newest
KERNEL_FACILITY = 0  # LOG_KERN: the prefix value of a kernel record is below 8

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, ..." and the older "NVRM: Xid (0000:3b:00): 13, ...".
# NVSwitch "SXid" lines and other NVRM lines do not match; the text must start the message (matched with .match).
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+(?:\.[0-7])?)\):\s*(?P<xid>\d+)\b"
)
# "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 61 LTSSM Fault Up" (NVIDIA Fabric Manager user
# guide, "NVSwitch SXid errors"): the switch driver's own prefix opens the message.
_SXID_RE = re.compile(
    r"nvidia-nvswitch\d*: SXid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+(?:\.[0-7])?)\):"
    r"\s*(?P<sxid>\d+)\b"
)
SXID_MAX = 99_999  # SXid codes are five digits (11xxx..24xxx); anything longer is folded into "other"
_PCI_RE = re.compile(r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<device>[0-9a-f]{1,2})(?:\.[0-7])?$")


def normalize_pci_bus_id(bus_id: str) -> str:
    """One comparable form, ``domain:bus:device`` in lower case with the function dropped: ``0000:3b:00``.

    Maps NVML's ``00000000:3B:00.0``, the kernel's ``0000:3b:00`` / ``0000:3b:00.0`` and AMD's
    ``0000:c1:00.0`` alike, so a kernel XID can be matched to the GPU's UUID. A string that is not a PCI
    address comes back stripped and lower-cased: it still equals itself, and never a real address.
    """
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    match = _PCI_RE.match(text)
    if match is None:
        return text
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{int(match['bus'], 16):02x}:{int(match['device'], 16):02x}"


@dataclass(frozen=True, slots=True)
class KernelXid:
    """One XID line from the kernel log."""

    pci_bus_id: str  # normalised (normalize_pci_bus_id)
    xid: int
    timestamp: float  # unix time the kernel logged it
    message: str  # the record's text, for logs


@dataclass(frozen=True, slots=True)
class KernelSxid:
    """One NVSwitch SXid line from the kernel log: the switch is known only by its PCI address."""

    pci_bus_id: str  # normalised
    sxid: int  # OTHER_XID outside 1..SXID_MAX
    timestamp: float
    message: str


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One /dev/kmsg record: ``level,seq,usec_since_boot,flags[,…];message``."""

    seq: int
    usec_since_boot: int
    message: str
    facility: int = KERNEL_FACILITY  # syslog facility (prefix field 0 >> 3): 0 the kernel's own, 1 userspace writes


def parse_record(line: str) -> KmsgRecord | None:
    """The record in one /dev/kmsg line; None for continuation lines (`` KEY=value``) and junk."""
    if not line or line[0].isspace():
        return None
    prefix, sep, message = line.partition(";")
    fields = prefix.split(",")
    if not sep or len(fields) < 3:
        return None
    if not all(f.isascii() and f.isdigit() and len(f) <= _MAX_FIELD_DIGITS for f in fields[:3]):
        return None
    return KmsgRecord(
        seq=int(fields[1]),
        usec_since_boot=int(fields[2]),
        message=message.rstrip("\n"),
        facility=int(fields[0]) >> 3,
    )


def parse_xid(message: str) -> tuple[str, int] | None:
    """``(normalised pci bus id, xid)`` when the message is an NVRM XID report, else None.

    The report must open the message; a code outside gpuwatch.core.xid's range comes back as OTHER_XID."""
    match = _XID_RE.match(message)
    if match is None:
        return None
    return normalize_pci_bus_id(match["bus"]), xid_from_digits(match["xid"])


def parse_sxid(message: str) -> tuple[str, int] | None:
    """``(normalised pci bus id, sxid)`` when the message is an NVSwitch SXid report, else None."""
    match = _SXID_RE.match(message)
    if match is None:
        return None
    digits = match["sxid"].lstrip("0") or "0"
    code = int(digits) if len(digits) <= len(str(SXID_MAX)) else OTHER_XID
    return normalize_pci_bus_id(match["bus"]), code if 1 <= code <= SXID_MAX else OTHER_XID


def _boot_time() -> float:
    """Unix time of boot (from /proc/stat via psutil); from the monotonic clock if that cannot be read."""
    try:
        return float(psutil.boot_time())
    except Exception:  # psutil raises its own errors for an odd /proc; XIDs are still worth reading
        return time.time() - time.monotonic()


class KernelLogXidReader:
    """Reads new XID records from the kernel log on each ``read_new()``; never raises for an unreadable log.

    When the log cannot be opened (``kernel.dmesg_restrict=1`` without CAP_SYSLOG, no /dev/kmsg in a
    container), ``available`` is False and ``reason`` says why, for ``gpuwatch check``; XIDs then come from
    NVML alone. The first read (the backlog) is stamped ``boot_time + usec_since_boot``; later reads with the
    caller's ``now``, at most one event-loop wait after the kernel logged them.
    """

    def __init__(self, path: Path = Path("/dev/kmsg"), boot_time: float | None = None) -> None:
        self.path = path
        self.boot_time = _boot_time() if boot_time is None else boot_time
        self._backlog_read = False
        self._sxids: list[KernelSxid] = []
        self.reason: str | None = None
        self._fd: int | None = None
        self._is_file = False
        self._offset = 0  # regular files: where the next unread line starts
        self._pending = b""  # a record split across reads (pipes)
        self._last_seq = -1
        self._open()

    @property
    def available(self) -> bool:
        """True while the log can be read."""
        return self._fd is not None

    def read_new(self, now: float | None = None) -> list[KernelXid]:
        """XIDs logged since the previous call (on the first call: every one still in the kernel's buffer, at
        their kernel time; later ones at ``now``, default the wall clock)."""
        if self._fd is None:
            return []
        try:
            lines = self._read_file_lines(self._fd) if self._is_file else self._read_records(self._fd)
        except OSError as exc:
            self._fail(f"reading {self.path} failed: {exc}")
            return []
        stamp = (time.time() if now is None else now) if self._backlog_read else None
        self._backlog_read = True
        return self._xids(lines, stamp)

    def drain_sxids(self) -> list[KernelSxid]:
        """NVSwitch SXids found by the reads since the last call."""
        found, self._sxids = self._sxids, []
        return found

    def close(self) -> None:
        """Release the descriptor; the reader then reports nothing."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> KernelLogXidReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _open(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except PermissionError:
            self.reason = (
                f"cannot read {self.path}: permission denied (kernel.dmesg_restrict=1 needs CAP_SYSLOG: "
                "systemd AmbientCapabilities=CAP_SYSLOG, or run as root); XIDs come from NVML events only"
            )
            return
        except FileNotFoundError:
            self.reason = f"{self.path} does not exist (a container without the kernel log?); XIDs come from NVML only"
            return
        except OSError as exc:
            self.reason = f"cannot open {self.path}: {exc}; XIDs come from NVML events only"
            return
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            os.close(fd)
            self.reason = f"{self.path} is a directory, not the kernel log"
            return
        self._fd, self._is_file = fd, stat.S_ISREG(mode)

    def _fail(self, reason: str) -> None:
        log.warning("kernel log XIDs disabled: %s", reason)
        self.reason = reason
        self.close()

    def _read_records(self, fd: int) -> list[str]:
        """Drain the device (one record per read) or a pipe; EAGAIN or EOF ends the batch."""
        lines: list[str] = []
        for _ in range(_MAX_RECORDS_PER_CALL):
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                break
            except BrokenPipeError:  # EPIPE: the ring buffer overwrote records we had not read yet; carry on
                log.info("kernel log records were overwritten before they could be read; some XIDs are missing")
                continue
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise OSError(errno.EINVAL, f"a record larger than {_READ_SIZE} bytes") from exc
                raise
            if not chunk:
                break
            lines.extend(self._split(chunk))
        return lines

    def _split(self, chunk: bytes) -> list[str]:
        """Complete lines of ``chunk``; a trailing partial line waits for the next read."""
        *complete, self._pending = (self._pending + chunk).split(b"\n")
        return [raw.decode("utf-8", "replace") for raw in complete]

    def _read_file_lines(self, fd: int) -> list[str]:
        """New complete lines of a regular file since the last call; a truncated file is read again from 0."""
        size = os.fstat(fd).st_size
        if size < self._offset:
            self._offset = 0
        data = os.pread(fd, size - self._offset, self._offset) if size > self._offset else b""
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode("utf-8", "replace").splitlines()

    def _xids(self, lines: list[str], now: float | None) -> list[KernelXid]:
        """The XIDs in the records that were not returned before (by sequence number); SXids are kept aside.
        ``now`` stamps them, or None for each record's own kernel time (the backlog)."""
        xids: list[KernelXid] = []
        for line in lines:
            record = parse_record(line)
            if record is None or record.seq <= self._last_seq:
                continue
            self._last_seq = record.seq
            if record.facility != KERNEL_FACILITY:  # written by a user process, not the driver
                continue
            timestamp = now if now is not None else self.boot_time + record.usec_since_boot / 1e6
            if (found := parse_xid(record.message)) is not None:
                bus_id, xid = found
                xids.append(KernelXid(pci_bus_id=bus_id, xid=xid, timestamp=timestamp, message=record.message))
            elif (switch := parse_sxid(record.message)) is not None:
                bus_id, sxid = switch
                self._sxids.append(KernelSxid(bus_id, sxid, timestamp, record.message))
                del self._sxids[:-_MAX_PENDING_SXIDS]
        return xids
