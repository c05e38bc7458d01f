"""XIDs from both sources: NVML events and the kernel log since boot, mapped to GPUs and counted once."""

from __future__ import annotations

from pathlib import Path

from simnode import START_WALL, SimAgent

from gpuwatch.kmsg import KernelLogXidReader

BOOT = START_WALL - 3600.0  # the node booted an hour before the agent started


def kmsg_line(seq: int, seconds_after_boot: float, bus: str, xid: int) -> str:
    return f"3,{seq},{int(seconds_after_boot * 1e6)},-;NVRM: Xid (PCI:{bus}): {xid}, pid=1234, name=python, msg\n"


def test_kernel_log_xids_since_boot_keep_their_own_time(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    sim = SimAgent(tmp_path / "state", scenario="healthy", kernel_log=KernelLogXidReader(log, boot_time=BOOT))
    sim.run(1.0)
    bus = sim.node.spec(3).pci_bus_id  # NVML's "00000000:5D:00.0" form; the kernel prints "0000:5d:00"
    domain, bus_no, rest = bus.split(":")
    kernel_bus = f"{domain[-4:]}:{bus_no.lower()}:{rest.split('.')[0].lower()}"
    log.write_text(kmsg_line(1, 100.0, kernel_bus, 79) + kmsg_line(2, 200.0, kernel_bus, 13))
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
    domain, bus_no, rest = sim.node.spec(1).pci_bus_id.split(":")
    kernel_bus = f"{domain[-4:]}:{bus_no.lower()}:{rest.split('.')[0].lower()}"
    with log.open("a") as f:  # the kernel logged the same XID a moment before NVML delivered it
        f.write(kmsg_line(7, nvml_time - BOOT - 0.5, kernel_bus, 79))
    sim.run(2.0)
    assert sim.value("gpuwatch_gpu_xid_errors_total", 1, xid="79") == 1.0
    sim.close()
