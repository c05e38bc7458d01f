"""count_pci_gpus over fixture sysfs trees shaped like real GPU nodes."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.readers import pci
from gpuwatch.readers.pci import count_pci_gpus, pci_gpu_addresses


def add_device(root: Path, address: str, vendor: str, pci_class: str) -> Path:
    """One PCI function as sysfs shows it (files as the kernel writes them: hex with a newline)."""
    device = root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(f"{vendor}\n")
    (device / "class").write_text(f"{pci_class}\n")
    return device


@pytest.fixture
def h100_node(tmp_path: Path) -> Path:
    """8×H100 SXM (3D controllers), 4 NVSwitches (bridges), an ASPEED BMC VGA, a ConnectX NIC, a bridge."""
    for bus in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"):
        add_device(tmp_path, f"0000:{bus}:00.0", "0x10de", "0x030200")
    for bus in ("05", "06", "07", "08"):
        add_device(tmp_path, f"0000:{bus}:00.0", "0x10de", "0x068000")
    add_device(tmp_path, "0000:03:00.0", "0x1a03", "0x030000")  # ASPEED AST2600 BMC VGA
    add_device(tmp_path, "0000:19:00.0", "0x15b3", "0x020700")  # ConnectX-7 InfiniBand
    add_device(tmp_path, "0000:00:00.0", "0x8086", "0x060000")  # host bridge
    return tmp_path


def test_h100_node_counts_only_the_gpus(h100_node: Path) -> None:
    assert count_pci_gpus(h100_node) == {"nvidia": 8, "amd": 0}


def test_addresses_are_sorted_and_per_vendor(h100_node: Path) -> None:
    addresses = pci_gpu_addresses(h100_node)
    assert addresses["amd"] == []
    assert addresses["nvidia"][0] == "0000:18:00.0"
    assert addresses["nvidia"] == sorted(addresses["nvidia"])
    assert "0000:05:00.0" not in addresses["nvidia"]  # NVSwitch


def test_nvswitches_are_the_nvidia_bridges(h100_node: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """An HGX H100 baseboard's four NVSwitches: `lspci -nn` shows each as "Bridge [0680]: NVIDIA Corporation GH100
    [H100 NVSwitch] [10de:22a3]" (pci.ids); the GPUs, the BMC's VGA, the NIC and other vendors' bridges are not."""
    assert pci.count_nvswitches(h100_node) == 4
    pcie_node = tmp_path_factory.mktemp("pcie")
    add_device(pcie_node, "0000:18:00.0", "0x10de", "0x030200")
    add_device(pcie_node, "0000:00:01.0", "0x8086", "0x068000")  # an Intel bridge of class 0680: not a switch
    assert pci.count_nvswitches(pcie_node) == 0
    assert pci.count_nvswitches(tmp_path_factory.mktemp("empty") / "no-sysfs") == 0


def test_mi300x_node_counts_processing_accelerators_not_audio(tmp_path: Path) -> None:
    # MI300X enumerates as a "processing accelerator" (class 0x1200); a Radeon's HDMI audio (0x0403) and the
    # AMD CPU's own functions (vendor 0x1022) are not GPUs.
    for bus in ("05", "26", "46", "65", "85", "a6", "c6", "e5"):
        add_device(tmp_path, f"0000:{bus}:00.0", "0x1002", "0x120000")
    add_device(tmp_path, "0000:c1:00.0", "0x1002", "0x030000")  # a Radeon VGA on the same node
    add_device(tmp_path, "0000:c1:00.1", "0x1002", "0x040300")  # its HDMI audio function
    add_device(tmp_path, "0000:00:00.2", "0x1022", "0x080600")  # AMD IOMMU
    add_device(tmp_path, "0000:02:00.0", "0x1022", "0x108000")  # AMD PSP / crypto
    assert count_pci_gpus(tmp_path) == {"nvidia": 0, "amd": 9}


def test_mi250_other_display_controller_counts(tmp_path: Path) -> None:
    add_device(tmp_path, "0000:29:00.0", "0x1002", "0x038000")
    assert count_pci_gpus(tmp_path) == {"nvidia": 0, "amd": 1}


def test_mixed_node_counts_both_vendors(tmp_path: Path) -> None:
    add_device(tmp_path, "0000:3b:00.0", "0x10de", "0x030000")  # a workstation card: VGA class
    add_device(tmp_path, "0000:3b:00.1", "0x10de", "0x040300")  # its HDMI audio
    add_device(tmp_path, "0000:c1:00.0", "0x1002", "0x038000")
    assert count_pci_gpus(tmp_path) == {"nvidia": 1, "amd": 1}


def test_missing_sysfs_gives_zeros(tmp_path: Path) -> None:
    assert count_pci_gpus(tmp_path / "nonexistent") == {"nvidia": 0, "amd": 0}
    (tmp_path / "bus").mkdir()  # /sys/bus without pci (a minimal container)
    assert count_pci_gpus(tmp_path) == {"nvidia": 0, "amd": 0}


def test_empty_bus_gives_zeros(tmp_path: Path) -> None:
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    assert count_pci_gpus(tmp_path) == {"nvidia": 0, "amd": 0}


def test_device_with_missing_or_garbage_files_is_skipped(tmp_path: Path) -> None:
    add_device(tmp_path, "0000:18:00.0", "0x10de", "0x030200")
    (add_device(tmp_path, "0000:2a:00.0", "0x10de", "0x030200") / "class").unlink()
    add_device(tmp_path, "0000:3a:00.0", "garbage", "0x030200")
    add_device(tmp_path, "0000:4a:00.0", "", "")
    add_device(tmp_path, "0000:5a:00.0", "0x10de", "0x0302zz")
    assert count_pci_gpus(tmp_path) == {"nvidia": 1, "amd": 0}


def test_unreadable_file_skips_only_that_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, where chmod 000 does not stop a read: raise the errors a bad device gives instead.
    add_device(tmp_path, "0000:18:00.0", "0x10de", "0x030200")
    eperm = add_device(tmp_path, "0000:2a:00.0", "0x10de", "0x030200")
    eio = add_device(tmp_path, "0000:3a:00.0", "0x10de", "0x030200")
    real_read_text = Path.read_text

    def failing_read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if self == eperm / "vendor":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        if self == eio / "class":
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", failing_read_text)
    assert count_pci_gpus(tmp_path) == {"nvidia": 1, "amd": 0}


def test_unlistable_devices_dir_gives_zeros(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    add_device(tmp_path, "0000:18:00.0", "0x10de", "0x030200")

    def refuse(self: Path) -> object:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", refuse)
    assert count_pci_gpus(tmp_path) == {"nvidia": 0, "amd": 0}


def test_symlinked_devices_like_real_sysfs(tmp_path: Path) -> None:
    # /sys/bus/pci/devices/* are symlinks into /sys/devices/pci…; the reader must follow them.
    real = tmp_path / "devices" / "pci0000:17" / "0000:18:00.0"
    real.mkdir(parents=True)
    (real / "vendor").write_text("0x10de\n")
    (real / "class").write_text("0x030200\n")
    devices = tmp_path / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    (devices / "0000:18:00.0").symlink_to(real)
    assert count_pci_gpus(tmp_path) == {"nvidia": 1, "amd": 0}


def test_class_codes_cover_the_gpu_classes() -> None:
    assert {0x0300, 0x0302, 0x0380} <= pci.GPU_CLASS_CODES
    assert 0x0680 not in pci.GPU_CLASS_CODES  # bridges: NVSwitch
    assert 0x0403 not in pci.GPU_CLASS_CODES  # HD audio


# --- properties: a bus of any devices, files holding anything -----------------------------------------------------
# The kernel writes sysfs `vendor` as "0x%04x\n" and `class` as "0x%06x\n" (drivers/pci/pci-sysfs.c, vendor_show and
# class_show): base class, subclass and programming interface.

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI host
VENDORS = st.sampled_from([0x10DE, 0x1002, 0x8086, 0x15B3, 0x1A03, 0x1022])
CLASSES = st.one_of(
    st.sampled_from([0x0300, 0x0302, 0x0380, 0x1200, 0x0680, 0x0403, 0x0C03, 0x0200, 0x0604]),
    st.integers(0, 0xFFFF),
)
DEVICE = st.tuples(
    st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), VENDORS, CLASSES, st.integers(0, 0xFF)
)
# Never a supported vendor's ID or a GPU class, whatever a parser makes of it: no hex digit at all, or odd spellings.
# Surrogates (category Cs) are left out: no file can hold them, so no kernel writes them.
NO_HEX = st.text(
    st.characters(blacklist_characters="0123456789abcdefABCDEF", blacklist_categories=("Cs",)), max_size=12
)
GARBAGE = st.one_of(NO_HEX, st.sampled_from(["", "0x", "0x10dg", "0x10de 0x1002", "0x" + "f" * 5000]))


@PROPERTY
@given(
    st.lists(DEVICE, max_size=12, unique_by=lambda d: d[:3]),
    st.lists(st.tuples(st.sampled_from(["vendor", "class"]), GARBAGE), max_size=4),
)
def test_property_every_gpu_function_is_counted_and_nothing_else(
    devices: list[tuple[int, int, int, int, int, int]], broken: list[tuple[str, str]]
) -> None:
    """A GPU is a function of NVIDIA (0x10de) or AMD (0x1002) whose class is a display controller or a processing
    accelerator; a device whose file holds anything else is skipped on its own, never the bus."""
    expected: dict[str, list[str]] = {"nvidia": [], "amd": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for domain, bus, slot, vendor, pci_class, prog_if in devices:
            address = f"{domain:04x}:{bus:02x}:{slot:02x}.0"
            add_device(root, address, f"0x{vendor:04x}", f"0x{pci_class:04x}{prog_if:02x}")
            if vendor in pci.PCI_VENDOR_IDS and pci_class in pci.GPU_CLASS_CODES:
                expected[pci.PCI_VENDOR_IDS[vendor]].append(address)
        for n, (name, garbage) in enumerate(broken):  # an H100 but for one file
            (add_device(root, f"ffff:ff:{n:02x}.7", "0x10de", "0x030200") / name).write_text(garbage)
        assert pci_gpu_addresses(root) == {vendor: sorted(found) for vendor, found in expected.items()}
