"""Forged and odd kernel-log XIDs: only the NVIDIA driver's own records count, and the xid label stays bounded.

The record format is the kernel's Documentation/ABI/testing/dev-kmsg: ``prefix,seq,timestamp,flags;message``,
where the prefix is the syslog priority and facility in one number (``level | facility << 3``). "It is not possible
to inject messages from userspace with the facility number LOG_KERN (0), to make sure that the origin of the
messages can always be reliably determined": a user's write to /dev/kmsg carries LOG_USER (1), so its prefix is 8 or
more. The NVIDIA driver's ``NVRM: Xid`` reports are LOG_KERN records whose text starts with ``NVRM:``; a kernel
record that merely quotes the text (the segfault line quotes the user-chosen file name of the faulting mapping)
opens with something else.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from simnode import START_WALL, SimAgent

from gpuwatch.core.model import GpuEvent
from gpuwatch.core.xid import OTHER_XID, XID_MAX, fold_xid, xid_label
from gpuwatch.readers.kmsg import KernelLogXidReader, parse_record, parse_xid
from gpuwatch.state.store import SampleStore

BOOT = START_WALL - 3600.0
REAL = "NVRM: Xid (PCI:{bus}): {xid}, pid=1234, name=python, GPU has fallen off the bus."
SEGFAULT = (
    "python3[4321]: segfault at 0 ip 00007f3a2c0d1e2f sp 00007ffd4e2b1a90 error 4 in "
    "NVRM: Xid (PCI:{bus}): 79, forged[7f3a2c0d0000+2000] likely on CPU 3 (core 3, socket 0)"
)


def record(prefix: int, seq: int, message: str) -> str:
    return f"{prefix},{seq},{seq * 1_000_000},-;{message}\n"


def kernel_bus(sim: SimAgent, gpu: int) -> str:
    domain, bus, rest = sim.node.spec(gpu).pci_bus_id.split(":")
    return f"{domain[-4:]}:{bus.lower()}:{rest.split('.')[0].lower()}"


@pytest.fixture
def agent_with_log(tmp_path: Path):  # type: ignore[no-untyped-def]
    log = tmp_path / "kmsg"
    log.write_text("")
    sim = SimAgent(tmp_path / "state", scenario="healthy", gpus=2, kernel_log=KernelLogXidReader(log, boot_time=BOOT))
    sim.run(1.0)
    yield sim, log
    sim.close()


def xid_series(sim: SimAgent) -> dict[str, float]:
    sim._scraped = None
    return {
        dict(labels)["xid"]: value
        for (name, labels), value in sim.samples().items()
        if name == "gpuwatch_gpu_xid_errors_total" and dict(labels)["gpu"] == "0"
    }


def test_a_file_name_in_a_kernel_segfault_line_is_no_xid(agent_with_log: tuple[SimAgent, Path]) -> None:
    sim, log = agent_with_log
    bus = kernel_bus(sim, 0)
    log.write_text(record(6, 10, SEGFAULT.format(bus=bus)))
    sim.run(2.0)
    assert xid_series(sim) == {}


def test_a_user_space_write_to_dev_kmsg_is_no_xid(agent_with_log: tuple[SimAgent, Path]) -> None:
    """`echo 'NVRM: Xid (PCI:…): 79, …' > /dev/kmsg` as any user: facility LOG_USER (prefix 8..15), never counted."""
    sim, log = agent_with_log
    bus = kernel_bus(sim, 0)
    forged = "".join(record(8 + level, 10 + level, REAL.format(bus=bus, xid=79)) for level in range(8))
    log.write_text(forged + record(4, 30, REAL.format(bus=bus, xid=48)))
    sim.run(2.0)
    assert xid_series(sim) == {"48": 1.0}


def test_the_driver_report_must_open_the_message() -> None:
    assert parse_xid("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, x") == ("0000:3b:00", 79)
    assert parse_xid("x NVRM: Xid (PCI:0000:3b:00): 79, pid=1, x") is None
    assert parse_xid(SEGFAULT.format(bus="0000:3b:00")) is None


def test_the_facility_comes_from_the_prefix() -> None:
    kern, user = parse_record("4,1,2,-;text"), parse_record("14,1,2,-;text")
    assert kern is not None and kern.facility == 0
    assert user is not None and user.facility == 1


def test_a_5000_digit_xid_folds_into_other_and_keeps_the_real_xids_of_the_same_read(
    agent_with_log: tuple[SimAgent, Path],
) -> None:
    sim, log = agent_with_log
    bus = kernel_bus(sim, 0)
    log.write_text(
        record(4, 10, REAL.format(bus=bus, xid=79))
        + record(4, 11, REAL.format(bus=bus, xid="9" * 5000))
        + record(4, 12, REAL.format(bus=bus, xid=13))
        + f"4,{'9' * 5000},1,-;{REAL.format(bus=bus, xid=31)}\n"  # junk sequence number: skipped, nothing else
        + record(4, 13, REAL.format(bus=bus, xid=48))
    )
    sim.run(2.0)
    assert xid_series(sim) == {"79": 1.0, "other": 1.0, "13": 1.0, "48": 1.0}


@pytest.mark.parametrize(("code", "label"), [(0, "other"), (1, "1"), (154, "154"), (XID_MAX, "999"), (1000, "other")])
def test_codes_outside_the_catalogue_range_fold_into_other(code: int, label: str) -> None:
    assert xid_label(fold_xid(code)) == label


def test_many_odd_codes_make_one_other_series_per_gpu() -> None:
    """NVML events carry the code as a number too: the store folds them, whatever their source."""
    store = SampleStore(poll_interval_seconds=1.0, clock=lambda: 1000.0)
    store.add_events(GpuEvent("GPU-0", "xid", 900.0 + n, code=5000 + n, source="nvml") for n in range(10_000))
    store.add_events([GpuEvent("GPU-0", "xid", 1.0, code=79, source="nvml")])
    xids = store.snapshot().xids
    assert set(xids) == {("GPU-0", OTHER_XID), ("GPU-0", 79)}
    assert xids["GPU-0", OTHER_XID].total == 10_000
