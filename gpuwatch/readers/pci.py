"""GPUs on the PCI bus, read from sysfs: the default for ``gpuwatch_gpus_expected``.

The vendor libraries only report GPUs they can still talk to; a GPU that fell off the bus or failed to
initialise is missing from NVML but usually still enumerated on PCI. Counting the bus gives the agent an
independent number to compare against. The sysfs root is a parameter (node_exporter's habit) so tests run on
fixture trees.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpuwatch.core.model import Vendor

log = logging.getLogger(__name__)

PCI_VENDOR_IDS: dict[int, Vendor] = {0x10DE: "nvidia", 0x1002: "amd"}

# PCI class codes (base class << 8 | subclass) that are GPUs rather than the other functions GPU vendors ship
# (NVSwitch bridges 0x0680, HDMI audio 0x0403, USB-C controllers 0x0c03, …).
GPU_CLASS_CODES: frozenset[int] = frozenset(
    {
        0x0300,  # VGA compatible controller (consumer and workstation cards)
        0x0302,  # 3D controller (NVIDIA data-center GPUs: A100, H100, B200)
        0x0380,  # other display controller (AMD Instinct MI100/MI200)
        0x1200,  # processing accelerator (AMD Instinct MI300X/MI300A/MI325X/MI350: "Aqua Vanjaram")
    }
)


def pci_gpu_addresses(sysfs_root: Path = Path("/sys")) -> dict[str, list[str]]:
    """Sorted PCI addresses (``0000:3b:00.0``) of the GPUs of each vendor; both vendors always present.

    A device whose files cannot be read is skipped (and logged at debug), never the whole bus: on a node where
    one GPU's config space went bad, the others still count.
    """
    found: dict[str, list[str]] = {vendor: [] for vendor in PCI_VENDOR_IDS.values()}
    for device in _pci_devices(sysfs_root):
        vendor = _gpu_vendor(device)
        if vendor is not None:
            found[vendor].append(device.name)
    for addresses in found.values():
        addresses.sort()
    return found


def count_pci_gpus(sysfs_root: Path = Path("/sys")) -> dict[str, int]:
    """GPUs of each vendor on the PCI bus: ``{"nvidia": n, "amd": m}``, zeros when none or no sysfs."""
    return {vendor: len(addresses) for vendor, addresses in pci_gpu_addresses(sysfs_root).items()}


def _pci_devices(sysfs_root: Path) -> list[Path]:
    """The entries of ``bus/pci/devices``; none when the directory is missing or unreadable (a container)."""
    devices_dir = sysfs_root / "bus" / "pci" / "devices"
    try:
        return sorted(devices_dir.iterdir())
    except OSError as exc:
        log.debug("cannot list %s: %s; counting no PCI GPUs", devices_dir, exc)
        return []


def _gpu_vendor(device: Path) -> Vendor | None:
    """The vendor when this PCI function is a GPU of a vendor we support, else None (also when unreadable)."""
    vendor_id = _read_hex(device / "vendor")
    if vendor_id is None or vendor_id not in PCI_VENDOR_IDS:
        return None
    class_id = _read_hex(device / "class")
    if class_id is None or (class_id >> 8) not in GPU_CLASS_CODES:
        return None
    return PCI_VENDOR_IDS[vendor_id]


def _read_hex(path: Path) -> int | None:
    """A sysfs hex attribute such as ``0x10de``; None when it cannot be read or parsed."""
    try:
        return int(path.read_text(encoding="ascii").strip(), 16)
    except (OSError, ValueError) as exc:
        log.debug("cannot read %s: %s; skipping the device", path, exc)
        return None


# NVSwitch chips on an HGX baseboard enumerate as NVIDIA "Bridge: other" functions (class 0x0680; pci.ids:
# 10de 1af1 "GA100 [A100 NVSwitch]", 22a3 "GH100 [H100 NVSwitch]"); an NVIDIA bridge is an NVSwitch.
NVSWITCH_CLASS_CODE = 0x0680


def count_nvswitches(sysfs_root: Path = Path("/sys")) -> int:
    """NVSwitches on this node's PCI bus (0 without any, or without sysfs): where there are, CUDA needs the fabric
    manager. NVL72-style racks keep their switches in switch trays, off the compute node's bus."""
    count = 0
    for device in _pci_devices(sysfs_root):
        class_id = _read_hex(device / "class")
        if _read_hex(device / "vendor") == 0x10DE and class_id is not None and class_id >> 8 == NVSWITCH_CLASS_CODE:
            count += 1
    return count
