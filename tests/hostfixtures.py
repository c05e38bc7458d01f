"""Fixture sysfs trees shaped like real machines: devices where the kernel puts them, hwmonN/device links, the
files each driver creates (millivolts, millidegrees, RPM), for the hwmon reader to read as it reads /sys."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gpuwatch.core.model import HostSample
from gpuwatch.exposition.exporter import families
from gpuwatch.state.store import SampleStore

ASUS_BOARD = "Pro WS WRX80E-SAGE SE WIFI"


def exported(samples: Sequence[HostSample], prefix: str = "gpuwatch_host_") -> dict[tuple[str, ...], float]:
    """What /metrics shows of host samples: {(metric, *label values): value}, through the store and the exporter."""
    clock = max((s.timestamp for s in samples), default=0.0)
    store = SampleStore(poll_interval_seconds=1.0, clock=lambda: clock)
    for sample in samples:
        store.record_host(sample, 60.0)
    return {
        (metric.name, *s.labels.values()): s.value
        for metric in families(store.snapshot())
        if metric.name.startswith(prefix)
        for s in metric.samples
    }


def add_chip(root: Path, index: int, device: str, name: str, files: dict[str, object], pci_class: str = "") -> Path:
    """A hwmon chip under `device` (relative to root), linked from class/hwmon like the kernel does."""
    hwmon = root / device / "hwmon" / f"hwmon{index}"
    hwmon.mkdir(parents=True)
    (hwmon / "device").symlink_to(os.path.relpath(root / device, hwmon))
    (hwmon / "name").write_text(name + "\n")
    if pci_class:
        (root / device / "class").write_text(pci_class + "\n")
    for key, value in files.items():
        (hwmon / key).write_text(f"{value}\n")
    link = root / "class" / "hwmon" / f"hwmon{index}"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(hwmon, link.parent))
    return hwmon


def set_board(root: Path, board: str) -> None:
    dmi = root / "class" / "dmi" / "id"
    dmi.mkdir(parents=True, exist_ok=True)
    (dmi / "board_name").write_text(board + "\n")


def pmbus_psu(vout_mv: int, *, lcrit: bool = True, alarm: int = 0) -> dict[str, object]:
    """A server PSU on the pmbus driver: AC input, 12 V output with its UV fault and warn limits, temps, a fan."""
    files: dict[str, object] = {
        "in1_label": "vin",
        "in1_input": 229500,
        "in1_lcrit": 180000,
        "in1_min": 190000,
        "in2_label": "vout1",
        "in2_input": vout_mv,
        "in2_min": 11600,
        "in2_min_alarm": alarm,
        "curr1_label": "iin",
        "curr1_input": 1870,
        "temp1_input": 31500,
        "temp2_input": 36250,
        "fan1_input": 6336,
        # pmbus_core: power1 is the input (READ_PIN, "pin"), power2 the output (READ_POUT, "pout1"), in microwatts
        "power1_label": "pin",
        "power1_input": 412500000,
        "power2_label": "pout1",
        "power2_input": 380000000,
    }
    if lcrit:
        files["in2_lcrit"] = 11400
        files["in2_lcrit_alarm"] = alarm
    return files


def server_tree(root: Path) -> Path:
    """A two-socket Intel GPU server: coretemp per socket, two PMBus PSUs on i2c-7, an NVMe drive, ACPI zone."""
    add_chip(root, 0, "devices/virtual/thermal/thermal_zone0", "acpitz", {"temp1_input": 27800})
    add_chip(
        root,
        1,
        "devices/platform/coretemp.0",
        "coretemp",
        {"temp1_label": "Package id 0", "temp1_input": 44000, "temp2_label": "Core 0", "temp2_input": 41000},
    )
    add_chip(
        root,
        2,
        "devices/platform/coretemp.1",
        "coretemp",
        {"temp1_label": "Package id 1", "temp1_input": 46000, "temp2_label": "Core 0", "temp2_input": 43000},
    )
    i2c = "devices/pci0000:00/0000:00:1f.4/i2c-7"
    add_chip(root, 3, f"{i2c}/7-0058", "pmbus", pmbus_psu(12112))
    add_chip(root, 4, f"{i2c}/7-0059", "pmbus", pmbus_psu(11200, lcrit=False, alarm=1))
    add_chip(
        root,
        5,
        "devices/pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0",
        "nvme",
        {"temp1_label": "Composite", "temp1_input": 38850, "temp2_label": "Sensor 1", "temp2_input": 38850},
    )
    return root


def workstation_tree(root: Path) -> Path:
    """An AMD Threadripper workstation: ASUS board with an NCT6798D, k10temp, an NVMe drive, a Radeon GPU."""
    set_board(root, ASUS_BOARD)
    nct: dict[str, object] = {
        # raw pin voltages in mV as the nct6775 driver gives them (in2/3/7/8 already doubled by the driver)
        "in0_input": 1024,  # Vcore
        "in1_input": 1016,  # +5V / 5
        "in2_input": 3344,  # AVCC
        "in3_input": 3328,  # 3VCC
        "in4_input": 1008,  # +12V / 12
        "in5_input": 832,
        "in6_input": 1160,  # DRAM
        "in7_input": 3392,  # 3VSB
        "in8_input": 3104,  # Vbat
        "in4_min": 0,
        "temp1_label": "SYSTIN",
        "temp1_input": 33000,
        "temp2_label": "CPUTIN",
        "temp2_input": 41500,
        "temp7_label": "AUXTIN3",
        "temp7_input": -62000,
        "fan1_input": 1205,
        "fan2_input": 0,
    }
    add_chip(root, 0, "devices/platform/nct6775.656", "nct6798", nct)
    add_chip(
        root,
        1,
        "devices/pci0000:00/0000:00:18.3",
        "k10temp",
        {"temp1_label": "Tctl", "temp1_input": 52875, "temp3_label": "Tccd1", "temp3_input": 47250},
    )
    add_chip(
        root,
        2,
        "devices/pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:00.0/0000:43:00.0",
        "amdgpu",
        {
            "in0_label": "vddgfx",
            "in0_input": 806,
            "temp1_label": "edge",
            "temp1_input": 36000,
            "fan1_input": 1100,
        },
        pci_class="0x030000",
    )
    # A GPU's chip under a driver name the reader does not know: excluded by the device's PCI display class.
    add_chip(
        root,
        3,
        "devices/pci0000:80/0000:80:01.1/0000:81:00.0",
        "gpu_hwmon",
        {"temp1_input": 40000},
        pci_class="0x030200",
    )
    add_chip(
        root,
        4,
        "devices/pci0000:00/0000:00:01.2/0000:02:00.0/nvme/nvme0",
        "nvme",
        {"temp1_label": "Composite", "temp1_input": 35850},
    )
    return root
