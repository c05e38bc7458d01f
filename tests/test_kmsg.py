"""Kernel-log XIDs: record parsing, PCI address matching, once-only delivery, and an unreadable log."""

from __future__ import annotations

import errno
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.core.xid import OTHER_XID, XID_MAX, XID_MIN, fold_xid, xid_from_digits, xid_label
from gpuwatch.readers.kmsg import (
    KernelLogXidReader,
    KernelXid,
    KmsgRecord,
    normalize_pci_bus_id,
    parse_record,
    parse_sxid,
    parse_xid,
)

BOOT = 1_700_000_000.0

FALLEN_OFF = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
RPC_TIMEOUT = (
    "NVRM: Xid (PCI:0000:5d:00): 119, pid='<unknown>', name=<unknown>, "
    "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL)."
)

# What `cat /dev/kmsg > file` gives: records, each maybe followed by dictionary lines that start with a space.
FIXTURE = f"""\
6,1,0,-;Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) #45-Ubuntu SMP
6,2,1503,-;Command line: BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2
4,1230,5012345678,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04
6,1231,5012400000,-;NVRM: GPU at PCI:0000:3b:00: GPU-edaa9d68-a820-baa4-66f3-e07b41c6c0d3
 SUBSYSTEM=pci
 DEVICE=+pci:0000:3b:00.0
4,1234,5678901234,-;{FALLEN_OFF}
 SUBSYSTEM=pci
 DEVICE=+pci:0000:3b:00.0
4,1235,5678950000,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 32 egress non-posted
4,1236,5700000000,-,caller=T1234;{RPC_TIMEOUT}
4,1237,5800000000,c;NVRM: Xid (0000:9a:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)
4,1238,5800000001,-;NVRM: Xid (PCI:0000:AB:00.0): 48, pid=77, name=train, An uncorrectable double bit error
"""


def write_fixture(tmp_path: Path, text: str = FIXTURE) -> Path:
    path = tmp_path / "kmsg"
    path.write_text(text)
    return path


# --- normalize_pci_bus_id -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bus_id", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),  # NVML busId
        ("0000:3B:00.0", "0000:3b:00"),  # NVML busIdLegacy
        ("0000:3b:00", "0000:3b:00"),  # NVRM Xid lines
        ("0000:3b:00.0", "0000:3b:00"),  # some drivers, sysfs
        ("PCI:0000:3b:00", "0000:3b:00"),
        ("0000:c1:00.0", "0000:c1:00"),  # AMD SMI
        ("3b:00.0", "0000:3b:00"),  # no domain: domain 0
        ("0001:3b:00.0", "0001:3b:00"),
        ("00010000:3B:1F.0", "10000:3b:1f"),  # VMD domains above 0xffff, as the kernel prints them
        ("10000:3b:1f", "10000:3b:1f"),
        ("  0000:3b:00.0\n", "0000:3b:00"),
    ],
)
def test_normalize_pci_bus_id(bus_id: str, expected: str) -> None:
    assert normalize_pci_bus_id(bus_id) == expected


def test_nvml_and_kernel_forms_compare_equal() -> None:
    assert normalize_pci_bus_id("00000000:3B:00.0") == normalize_pci_bus_id("0000:3b:00")


@pytest.mark.parametrize("junk", ["", "N/A", "GPU-edaa9d68", "0000:3b", "0000:3b:00.9", "zz:zz:zz"])
def test_non_addresses_stay_themselves_and_match_no_address(junk: str) -> None:
    assert normalize_pci_bus_id(junk) == junk.strip().lower()
    assert normalize_pci_bus_id(junk) != "0000:3b:00"


# --- parse_record / parse_xid ---------------------------------------------------------------------


def test_parse_record() -> None:
    assert parse_record(f"4,1234,5678901234,-;{FALLEN_OFF}\n") == KmsgRecord(1234, 5678901234, FALLEN_OFF)


def test_parse_record_with_extra_prefix_fields_and_semicolons_in_message() -> None:
    record = parse_record("6,339,5140900,-,caller=T1;a; b; c")
    assert record == KmsgRecord(339, 5140900, "a; b; c")


@pytest.mark.parametrize(
    "line",
    [" SUBSYSTEM=pci", " DEVICE=+pci:0000:3b:00.0", "", "no prefix at all", "4,1234;short", "a,b,c,-;text"],
)
def test_parse_record_rejects_continuations_and_junk(line: str) -> None:
    assert parse_record(line) is None


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (FALLEN_OFF, ("0000:3b:00", 79)),
        (RPC_TIMEOUT, ("0000:5d:00", 119)),
        ("NVRM: Xid (PCI:0000:3b:00.0): 79, pid=1, name=x, GPU has fallen off the bus.", ("0000:3b:00", 79)),
        ("NVRM: Xid (0000:3b:00): 13, Graphics Exception: ESR 0x504648=0x1000", ("0000:3b:00", 13)),
        (
            "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset)",
            ("0000:3b:00", 154),
        ),
        ("NVRM: Xid (PCI:0001:C1:00): 31", ("0001:c1:00", 31)),
    ],
)
def test_parse_xid_formats(message: str, expected: tuple[str, int]) -> None:
    assert parse_xid(message) == expected


@pytest.mark.parametrize(
    "message",
    [
        "NVRM: GPU at PCI:0000:3b:00: GPU-edaa9d68-a820-baa4-66f3-e07b41c6c0d3",
        "NVRM: GPU Board Serial Number: 1753024033842",
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04",
        "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        "NVRM: Xid (PCI:0000:3b:00): none, text",
    ],
)
def test_parse_xid_ignores_other_lines(message: str) -> None:
    assert parse_xid(message) is None


# --- reading a regular file -----------------------------------------------------------------------


def test_reads_xids_from_file_with_record_times(tmp_path: Path) -> None:
    reader = KernelLogXidReader(write_fixture(tmp_path), boot_time=BOOT)
    assert reader.available and reader.reason is None
    xids = reader.read_new()
    assert [(x.pci_bus_id, x.xid) for x in xids] == [
        ("0000:3b:00", 79),
        ("0000:5d:00", 119),
        ("0000:9a:00", 13),
        ("0000:ab:00", 48),
    ]
    first = xids[0]
    assert isinstance(first, KernelXid)
    assert (first.pci_bus_id, first.xid, first.message) == ("0000:3b:00", 79, FALLEN_OFF)
    assert first.timestamp == pytest.approx(BOOT + 5678.901234)
    assert xids[1].message == RPC_TIMEOUT
    assert xids[3].timestamp == pytest.approx(BOOT + 5800.000001)


def test_each_record_is_returned_once(tmp_path: Path) -> None:
    path = write_fixture(tmp_path)
    reader = KernelLogXidReader(path, boot_time=BOOT)
    assert len(reader.read_new()) == 4
    assert reader.read_new() == []
    with path.open("a") as f:
        f.write("4,1240,5900000000,-;NVRM: Xid (PCI:0000:db:00): 94, pid=9, name=x, Contained ECC error.\n")
    assert [(x.pci_bus_id, x.xid) for x in reader.read_new()] == [("0000:db:00", 94)]
    assert reader.read_new() == []


def test_rewritten_file_is_deduplicated_by_sequence(tmp_path: Path) -> None:
    path = write_fixture(tmp_path)
    reader = KernelLogXidReader(path, boot_time=BOOT)
    assert len(reader.read_new()) == 4
    # A new copy of the log (truncated and written again) repeats old records before a new one.
    path.write_text(FIXTURE.split("\n", 6)[-1] + "4,1241,5900000000,-;NVRM: Xid (PCI:0000:18:00): 92, x\n")
    assert [(x.pci_bus_id, x.xid) for x in reader.read_new()] == [("0000:18:00", 92)]


def test_partial_last_line_waits_until_complete(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("4,10,1000000,-;NVRM: Xid (PCI:0000:3b:00): 7")
    reader = KernelLogXidReader(path, boot_time=BOOT)
    assert reader.read_new() == []
    with path.open("a") as f:
        f.write("9, pid=1, name=x, GPU has fallen off the bus.\n")
    (xid,) = reader.read_new(now=BOOT + 7.0)
    assert (xid.xid, xid.timestamp) == (79, BOOT + 7.0)  # read live: stamped when read


def test_boot_time_defaults_to_psutil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(psutil, "boot_time", lambda: 1_600_000_000.0)
    reader = KernelLogXidReader(write_fixture(tmp_path))
    assert reader.boot_time == 1_600_000_000.0
    assert reader.read_new()[0].timestamp == pytest.approx(1_600_005_678.901234)


def test_boot_time_falls_back_to_monotonic_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> float:
        raise RuntimeError("no /proc/stat")

    monkeypatch.setattr(psutil, "boot_time", broken)
    reader = KernelLogXidReader(write_fixture(tmp_path))
    assert reader.boot_time == pytest.approx(time.time() - time.monotonic(), abs=1.0)


def test_close_and_context_manager(tmp_path: Path) -> None:
    with KernelLogXidReader(write_fixture(tmp_path), boot_time=BOOT) as reader:
        assert reader.available
    assert not reader.available
    assert reader.read_new() == []


# --- an unreadable log ----------------------------------------------------------------------------


def test_missing_log_is_unavailable_with_a_reason(tmp_path: Path) -> None:
    reader = KernelLogXidReader(tmp_path / "kmsg", boot_time=BOOT)
    assert not reader.available
    assert reader.reason is not None and "does not exist" in reader.reason
    assert reader.read_new() == []


def test_permission_denied_names_dmesg_restrict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, which chmod does not stop: raise what open(2) gives without CAP_SYSLOG.
    path = write_fixture(tmp_path)

    def eperm(*args: object, **kwargs: object) -> int:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "open", eperm)
    reader = KernelLogXidReader(path, boot_time=BOOT)
    assert not reader.available
    assert reader.reason is not None
    assert "dmesg_restrict" in reader.reason and "CAP_SYSLOG" in reader.reason
    assert reader.read_new() == []


def test_other_open_errors_are_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def eio(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "open", eio)
    reader = KernelLogXidReader(tmp_path / "kmsg", boot_time=BOOT)
    assert not reader.available and reader.reason is not None and "Input/output error" in reader.reason


def test_directory_is_unavailable(tmp_path: Path) -> None:
    reader = KernelLogXidReader(tmp_path, boot_time=BOOT)
    assert not reader.available and reader.reason is not None and "directory" in reader.reason


# --- the device path: one record per read, non-blocking -------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A named pipe with a writer attached, so an empty read is EAGAIN as on /dev/kmsg."""
    path = tmp_path / "kmsg.fifo"
    os.mkfifo(path)
    reader_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open without blocking
    writer = os.open(path, os.O_WRONLY)
    os.close(reader_fd)
    yield path, writer
    os.close(writer)


def test_pipe_records_and_split_writes(fifo: tuple[Path, int]) -> None:
    path, writer = fifo
    reader = KernelLogXidReader(path, boot_time=BOOT)
    assert reader.available
    assert reader.read_new() == []  # EAGAIN: nothing yet
    os.write(writer, f"4,1234,5678901234,-;{FALLEN_OFF}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n".encode())
    os.write(writer, b"4,1235,5700000000,-;NVRM: Xid (PCI:0000:5d:00): 1")
    assert [x.xid for x in reader.read_new()] == [79]
    os.write(writer, b"19, pid='<unknown>', name=<unknown>, Timeout\n")
    assert [(x.pci_bus_id, x.xid) for x in reader.read_new()] == [("0000:5d:00", 119)]
    assert reader.read_new() == []
    reader.close()


class ScriptedDevice:
    """os.read as /dev/kmsg answers it: one record per call, then EAGAIN; EPIPE/EINVAL where scripted."""

    def __init__(self, script: list[bytes | OSError]) -> None:
        self.script = script
        self.sizes: list[int] = []

    def __call__(self, fd: int, size: int) -> bytes:
        self.sizes.append(size)
        if not self.script:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        item = self.script.pop(0)
        if isinstance(item, OSError):
            raise item
        return item


def device_reader(
    fifo: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, device: ScriptedDevice
) -> KernelLogXidReader:
    reader = KernelLogXidReader(fifo[0], boot_time=BOOT)
    monkeypatch.setattr(os, "read", device)
    return reader


def test_device_overwritten_records_are_skipped_not_fatal(
    fifo: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    device = ScriptedDevice(
        [
            f"4,1234,5678901234,-;{FALLEN_OFF}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n".encode(),
            BrokenPipeError(errno.EPIPE, "Broken pipe"),  # records 1235-1299 were overwritten
            f"4,1300,5700000000,-;{RPC_TIMEOUT}\n".encode(),
            b"6,1301,5700000001,-;eth0: link up\n",
        ]
    )
    reader = device_reader(fifo, monkeypatch, device)
    assert [x.xid for x in reader.read_new()] == [79, 119]
    assert reader.available
    assert all(size >= 8192 for size in device.sizes)
    device.script.append(b"4,1302,5800000000,-;NVRM: Xid (PCI:0000:9a:00): 13, Graphics Exception\n")
    assert [x.xid for x in reader.read_new()] == [13]


def test_device_einval_disables_with_a_reason(fifo: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    device = ScriptedDevice([OSError(errno.EINVAL, "Invalid argument")])
    reader = device_reader(fifo, monkeypatch, device)
    assert reader.read_new() == []
    assert not reader.available
    assert reader.reason is not None and "larger than" in reader.reason


def test_device_read_error_disables_with_a_reason(fifo: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    reader = device_reader(fifo, monkeypatch, ScriptedDevice([OSError(errno.EIO, "Input/output error")]))
    assert reader.read_new() == []
    assert not reader.available
    assert reader.reason is not None and "Input/output error" in reader.reason


def test_real_dev_kmsg_never_raises() -> None:
    """On whatever machine runs the tests: either readable, or unavailable with a reason."""
    reader = KernelLogXidReader()
    try:
        assert isinstance(reader.read_new(), list)
        assert reader.available or reader.reason
        assert reader.read_new() == [] or reader.available
    finally:
        reader.close()


def test_nvswitch_sxids_are_read_apart_from_xids(tmp_path: Path) -> None:
    """NVIDIA Fabric Manager user guide, "NVSwitch SXid errors": the switch driver logs
    ``nvidia-nvswitchN: SXid (PCI:<bdf>): <code>, <severity> ...``; only a kernel record that opens with it counts,
    and a code of more than five digits folds into "other"."""
    path = tmp_path / "kmsg"
    path.write_text(
        "3,1,1000000,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 61 LTSSM Fault Up\n"
        "3,2,2000000,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 123456789, Non-fatal, garbled\n"
        "14,3,3000000,-;nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 11004, written by a user\n"
        "6,4,4000000,-;python[99]: segfault in nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 11004\n"
    )
    reader = KernelLogXidReader(path, boot_time=BOOT)
    assert reader.read_new() == []
    assert [(s.pci_bus_id, s.sxid, s.timestamp) for s in reader.drain_sxids()] == [
        ("0000:05:00", 20034, BOOT + 1.0),
        ("0000:05:00", OTHER_XID, BOOT + 2.0),
    ]
    assert reader.drain_sxids() == []


# --- properties -----------------------------------------------------------------------------------
# The record format is Documentation/ABI/testing/dev-kmsg: "prefix,seq,timestamp,flags[,...];message", the prefix
# being "level | facility << 3", seq and timestamp (microseconds since boot) u64 decimals; the kernel escapes
# non-printable bytes of the message as \xNN, so a message is printable ASCII. NVRM prints the GPU as
# "PCI:%04x:%02x:%02x" (domain, bus, device; VMD domains above 0xffff print as five or more digits).

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI host
U64 = st.integers(0, 2**64 - 1)
KERNEL_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)
PCI_FUNCTIONS = st.tuples(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))
XID_DIGITS = st.one_of(
    st.integers(0, 10**6).map(str),
    st.integers(0, 10**6).map(lambda n: f"000{n}"),
    st.text("0123456789", min_size=1, max_size=6000),  # a garbled or hostile code: past int()'s 4,300 digits
)


def kernel_bus(domain: int, bus: int, device: int, upper: bool) -> str:
    text = f"{domain:04x}:{bus:02x}:{device:02x}"
    return text.upper() if upper else text


@PROPERTY
@given(st.text(max_size=200))
def test_property_parse_record_never_raises(line: str) -> None:
    record = parse_record(line)
    assert record is None or (record.seq >= 0 and record.usec_since_boot >= 0 and "\n" not in record.message)


@PROPERTY
@given(
    st.integers(0, 191),
    U64,
    U64,
    st.lists(st.sampled_from(["-", "c", "+", "caller=T1234", "caller=C3"]), min_size=1, max_size=3),
    KERNEL_TEXT,
)
def test_property_a_rendered_record_parses_back(prefix: int, seq: int, usec: int, flags: list[str], text: str) -> None:
    """Semicolons and commas in the message stay in it; extra prefix fields (caller=) are ignored."""
    line = f"{prefix},{seq},{usec},{','.join(flags)};{text}\n"
    assert parse_record(line) == KmsgRecord(seq, usec, text, facility=prefix >> 3)


@PROPERTY
@given(st.text(max_size=200))
def test_property_parse_xid_and_sxid_never_raise_and_keep_the_label_bounded(message: str) -> None:
    found = parse_xid(message)
    assert found is None or found[1] == OTHER_XID or XID_MIN <= found[1] <= XID_MAX
    switch = parse_sxid(message)
    assert switch is None or switch[1] == OTHER_XID or 1 <= switch[1] <= 99_999


@PROPERTY
@given(
    PCI_FUNCTIONS, st.booleans(), st.booleans(), st.booleans(), XID_DIGITS, st.sampled_from(["", ",", " "]), KERNEL_TEXT
)
def test_property_an_nvrm_xid_line_parses_back(
    address: tuple[int, int, int, int],
    pci_prefix: bool,
    with_function: bool,
    upper: bool,
    digits: str,
    separator: str,
    tail: str,
) -> None:
    domain, bus, device, function = address
    where = kernel_bus(domain, bus, device, upper) + (f".{function}" if with_function else "")
    message = f"NVRM: Xid ({'PCI:' if pci_prefix else ''}{where}): {digits}{separator}{tail if separator else ''}"
    code = fold_xid(int(digits)) if len(digits.lstrip("0")) <= 3 else OTHER_XID
    assert parse_xid(message) == (f"{domain:04x}:{bus:02x}:{device:02x}", code)


@PROPERTY
@given(PCI_FUNCTIONS)
def test_property_every_form_of_one_address_normalizes_alike(address: tuple[int, int, int, int]) -> None:
    """NVML's busId ("%08X:%02X:%02X.0", nvml.h nvmlPciInfo_t), its legacy busIdLegacy ("%04X:..."), the kernel's
    "%04x:%02x:%02x" and AMD SMI's "%04x:%02x:%02x.%x" name one GPU; the normal form is a fixed point."""
    domain, bus, device, function = address
    forms = [
        f"{domain:08X}:{bus:02X}:{device:02X}.{function}",
        f"{domain:04X}:{bus:02X}:{device:02X}.{function}",
        f"PCI:{domain:04x}:{bus:02x}:{device:02x}",
        f"{domain:04x}:{bus:02x}:{device:02x}.{function}",
        f"  {domain:04x}:{bus:02x}:{device:02x}\n",
    ]
    normal = {normalize_pci_bus_id(form) for form in forms}
    assert normal == {f"{domain:04x}:{bus:02x}:{device:02x}"}
    assert normalize_pci_bus_id(normal.pop()) == f"{domain:04x}:{bus:02x}:{device:02x}"


@PROPERTY
@given(st.text(max_size=60))
def test_property_normalize_never_raises(text: str) -> None:
    assert isinstance(normalize_pci_bus_id(text), str)


@PROPERTY
@given(XID_DIGITS)
def test_property_an_xid_of_any_length_folds_to_one_bounded_label(digits: str) -> None:
    """gpuwatch.core.xid: codes 1..999 keep their own xid label, anything else (0, 1000+, 5,000 digits) is "other"."""
    code = xid_from_digits(digits)
    value = int(digits.lstrip("0") or "0") if len(digits.lstrip("0")) <= 4 else None
    if value is not None and XID_MIN <= value <= XID_MAX:
        assert (code, xid_label(code)) == (value, str(value))
    else:
        assert (code, xid_label(code)) == (OTHER_XID, "other")


# A line of a saved kernel log that is no kernel record: a dictionary continuation, a user's write (facility 1),
# or text without the record prefix.
NOT_A_KERNEL_XID = st.one_of(
    KERNEL_TEXT.map(lambda text: " " + text),
    KERNEL_TEXT.filter(lambda text: parse_record(text) is None),
)
XID_RECORD = st.tuples(PCI_FUNCTIONS, st.integers(1, XID_MAX), st.integers(0, 10**12), KERNEL_TEXT)
XidRecord = tuple[tuple[int, int, int, int], int, int, str]


@PROPERTY
@given(st.lists(st.tuples(XID_RECORD, st.lists(NOT_A_KERNEL_XID, max_size=3)), max_size=8))
def test_property_junk_between_records_loses_no_xid(records: list[tuple[XidRecord, list[str]]]) -> None:
    """Every XID record of a saved log comes back once, at its own kernel time, whatever lies between them."""
    lines, expected = [], []
    for n, ((address, code, usec, tail), junk) in enumerate(records):
        bus_id = kernel_bus(*address[:3], upper=False)
        lines.append(f"4,{2 * n},{usec},-;NVRM: Xid (PCI:{bus_id}): {code}, {tail}")
        lines.append(f"12,{2 * n + 1},{usec},-;NVRM: Xid (PCI:{bus_id}): {code}, written by a user")
        lines.extend(junk)
        expected.append((bus_id, code, BOOT + usec / 1e6))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kmsg"
        path.write_text("".join(line + "\n" for line in lines))
        with KernelLogXidReader(path, boot_time=BOOT) as reader:
            assert [(x.pci_bus_id, x.xid, x.timestamp) for x in reader.read_new()] == expected
            assert reader.read_new() == []
