"""XIDs from both sources: NVML events and the kernel log since boot, mapped to GPUs and counted once."""

from __future__ import annotations

from pathlib import Path

from simnode import START_WALL, SimAgent

from gpuwatch.readers.kmsg import KernelLogXidReader

BOOT = START_WALL - 3600.0  # the node booted an hour before the agent started


def kmsg_line(seq: int, seconds_after_boot: float, bus: str, xid: int) -> str:
    return f"3,{seq},{int(seconds_after_boot * 1e6)},-;NVRM: Xid (PCI:{bus}): {xid}, pid=1234, name=python, msg\n"


def kernel_bus(sim: SimAgent, gpu: int) -> str:
    """NVML's "00000000:5D:00.0" form as the kernel prints it: "0000:5d:00"."""
    domain, bus_no, rest = sim.node.spec(gpu).pci_bus_id.split(":")
    return f"{domain[-4:]}:{bus_no.lower()}:{rest.split('.')[0].lower()}"


def test_kernel_log_xids_since_boot_keep_their_own_time(tmp_path: Path) -> None:
    """The backlog in the kernel's buffer at start is stamped with each record's own time."""
    log = tmp_path / "kmsg"
    log.write_text("")
    sim = SimAgent(tmp_path / "state", scenario="healthy", kernel_log=KernelLogXidReader(log, boot_time=BOOT))
    log.write_text(kmsg_line(1, 100.0, kernel_bus(sim, 3), 79) + kmsg_line(2, 200.0, kernel_bus(sim, 3), 13))
    sim.run(2.0)
    assert sim.value("gpuwatch_gpu_xid_errors_total", 3, xid="79") == 1.0
    # The event's own (kernel) time, an hour old: a rule on "the last 10 m" stays silent after a restart.
    assert sim.value("gpuwatch_gpu_xid_last_timestamp_seconds", 3, xid="79") == BOOT + 100.0
    assert sim.value("gpuwatch_gpu_xid_last_timestamp_seconds", 3, xid="13") == BOOT + 200.0
    sim.run(2.0)  # read again: nothing new
    assert sim.value("gpuwatch_gpu_xid_errors_total", 3, xid="79") == 1.0
    sim.close()


def test_the_same_xid_from_nvml_and_the_kernel_log_counts_once(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    sim = SimAgent(tmp_path / "state", scenario="healthy", kernel_log=KernelLogXidReader(log, boot_time=BOOT))
    sim.run(1.0)
    sim.node.faults.emit_xid(1, 79)
    sim.run(1.0)
    assert sim.value("gpuwatch_gpu_xid_errors_total", 1, xid="79") == 1.0
    nvml_time = sim.value("gpuwatch_gpu_xid_last_timestamp_seconds", 1, xid="79")
    assert nvml_time is not None
    with log.open("a") as f:  # the kernel logged the same XID a moment before NVML delivered it
        f.write(kmsg_line(7, nvml_time - BOOT - 0.5, kernel_bus(sim, 1), 79))
    sim.run(2.0)
    assert sim.value("gpuwatch_gpu_xid_errors_total", 1, xid="79") == 1.0
    sim.close()


def test_live_kernel_xids_are_stamped_when_read_not_by_a_drifting_boot_clock(tmp_path: Path) -> None:
    """Boot time + the kernel's monotonic timestamp drifts from wall time over a long uptime (the kernel's
    CLOCK_MONOTONIC is not stepped by NTP; Documentation/ABI/testing/dev-kmsg: the timestamp is in microseconds
    since boot): a record read live is stamped with the agent's clock at the read."""
    log = tmp_path / "kmsg"
    log.write_text("")
    drifted_boot = BOOT - 90.0  # boot time + monotonic 90 s behind wall time after months of uptime
    sim = SimAgent(tmp_path / "state", scenario="healthy", kernel_log=KernelLogXidReader(log, boot_time=drifted_boot))
    sim.run(1.0)
    read_at = sim.clock.wall()
    log.write_text(kmsg_line(5, read_at - BOOT, kernel_bus(sim, 2), 79))
    sim.run(1.0)
    stamped = sim.value("gpuwatch_gpu_xid_last_timestamp_seconds", 2, xid="79")
    assert stamped is not None and abs(stamped - read_at) <= 1.0  # not read_at - 90
    sim.close()


def test_nvswitch_sxids_are_exported_per_switch_and_code(tmp_path: Path) -> None:
    """An HGX node's NVSwitch errors reach /metrics as gpuwatch_nvswitch_sxid_errors_total{pci_bus_id,sxid}."""
    log = tmp_path / "kmsg"
    log.write_text("3,1,1000000,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 61 LTSSM Fault Up\n")
    sim = SimAgent(tmp_path / "state", scenario="healthy", kernel_log=KernelLogXidReader(log, boot_time=BOOT))
    sim.run(1.0)
    assert sim.value("gpuwatch_nvswitch_sxid_errors_total", pci_bus_id="0000:07:00", sxid="20034") == 1.0
    stamped = sim.value("gpuwatch_nvswitch_sxid_last_timestamp_seconds", pci_bus_id="0000:07:00", sxid="20034")
    assert stamped == BOOT + 1.0  # the backlog keeps kernel time: a restart re-reads it and moves nothing
    sim.close()


def test_kernel_xids_logged_before_the_gpu_is_known_are_kept(tmp_path: Path) -> None:
    """Found in review: an XID read while the driver was not loaded (no GPU known yet) was dropped; it waits now."""
    log = tmp_path / "kmsg"
    log.write_text("")
    boot = START_WALL - 60.0
    sim = SimAgent(tmp_path / "state", scenario="backend_down", kernel_log=KernelLogXidReader(log, boot_time=boot))
    log.write_text(kmsg_line(1, 50.0, kernel_bus(sim, 2), 79))
    sim.run(3.0)  # the driver is not loaded: no GPU is known yet, the XID waits
    sim.node.faults.set_library_missing(False)
    sim.run(70.0)
    assert sim.value("gpuwatch_gpu_xid_errors_total", 2, xid="79") == 1.0
    assert sim.value("gpuwatch_gpu_xid_last_timestamp_seconds", 2, xid="79") == boot + 50.0
    sim.close()
