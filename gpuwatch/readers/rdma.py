"""InfiniBand and RoCE ports from sysfs: link state, rate and error counters of each RDMA port, and the GPU each
NIC sits beside.

The layout is the kernel's stable ABI (Documentation/ABI/stable/sysfs-class-infiniband):
``/sys/class/infiniband/<device>/ports/<port>/`` holds ``state`` ("4: ACTIVE"; DOWN, INIT, ARMED, ACTIVE,
ACTIVE_DEFER), ``phys_state`` ("5: LinkUp"; Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp,
LinkErrorRecovery, Phy Test), ``rate`` ("400 Gb/sec (4X NDR)": active width × active speed), ``link_layer``
("InfiniBand" or "Ethernet"), ``counters/`` (the PortCounters attribute of the InfiniBand Architecture
Specification) and, on mlx5, ``hw_counters/`` (Documentation/networking/device_drivers/ethernet/mellanox/mlx5/
counters.rst, "RDMA counters"). drivers/infiniband/core/sysfs.c writes the strings above.

The legacy error counters are narrow (symbol_error and port_rcv_errors 16 bits, link_downed and
link_error_recovery 8, local_link_integrity_errors and excessive_buffer_overrun_errors 4: sysfs.c's PORT_PMA_ATTR
widths) and saturate rather than wrap: a counter at its maximum is reported as saturated, because it no longer
counts. A driver reload starts every counter again from 0, which Prometheus reads as a counter reset. A file that
is missing, unreadable or not a number is left out of that port's reading (logged at debug), never the port.

A RoCE port (link_layer "Ethernet") is its network interface's: mlx5 reports it ACTIVE and LinkUp exactly while the
interface runs with carrier, DOWN and Disabled otherwise (drivers/infiniband/hw/mlx5/main.c, mlx5_query_port_roce:
``netif_running(ndev) && netif_carrier_ok(ndev)``), so the port's own state already says whether its Ethernet link
is up. What the interface tells beyond it is how often its link was lost: ``/sys/class/net/<netdev>/
carrier_down_count`` (Documentation/ABI/testing/sysfs-class-net, since Linux 4.16), the Ethernet side's count of
link downs, where the InfiniBand PortCounters' link_downed is the IB link training state machine's (IBA 16.1.3.5)
and nothing documents it counting an Ethernet carrier loss.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.readers.sysfs import read_attribute

log = logging.getLogger(__name__)

ACTIVE = 4  # the port state "4: ACTIVE" (ib_verbs.h IB_PORT_ACTIVE)
LINK_UP = 5  # the physical state "5: LinkUp"

# counters/: the errors of the PortCounters attribute that speak of the link and the port, with their widths in bits
# (sysfs.c PORT_PMA_ATTR). Left out: a switch's relay errors, partition constraint errors and VL15 (management)
# drops, which say nothing about a host's link.
LEGACY_ERRORS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_xmit_discards": 16,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
}
LINK_DOWNED_BITS = 8
# hw_counters/ (mlx5, 64 bits; counters.rst, "RDMA counters"): packets dropped for want of a receive buffer, and
# the transport's signs of loss (out of sequence, sequence errors NAKed, acknowledgements that timed out). The
# completion-queue errors of applications are theirs, not the port's.
HW_ERRORS = ("out_of_buffer", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err")

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*(\d+)\s*:")


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """One port as read now."""

    device: str  # mlx5_0
    port: str  # 1
    state: int | None  # 4 = ACTIVE; None when unreadable
    phys_state: int | None  # 5 = LinkUp
    rate_bits_per_second: float | None
    link_layer: str  # InfiniBand, Ethernet, or "" when unreadable
    errors: dict[str, int] = field(default_factory=dict)  # counter name -> count
    saturated: tuple[str, ...] = ()  # legacy counters at their maximum: they count no more
    link_downed: int | None = None
    pci_path: tuple[str, ...] = ()  # the NIC's PCI device path below /sys/devices, root complex first
    netdev: str = ""  # the Ethernet interface of a RoCE port, "" for InfiniBand
    carrier_down: int | None = None  # RoCE: times its interface lost its carrier (class/net/…/carrier_down_count)

    @property
    def up(self) -> bool:
        return self.state == ACTIVE and self.phys_state in (None, LINK_UP)


def read_ports(sysfs_root: Path = Path("/sys")) -> list[RdmaPort]:
    """Every RDMA port of the node, sorted by device and port; none without /sys/class/infiniband."""
    base = sysfs_root / "class" / "infiniband"
    try:
        devices = sorted(p for p in base.iterdir())
    except OSError:
        return []
    ports: list[RdmaPort] = []
    for device in devices:
        try:
            numbers = sorted((device / "ports").iterdir(), key=lambda p: (len(p.name), p.name))
        except OSError as exc:
            log.debug("cannot list the ports of %s: %s", device, exc)
            continue
        pci_path = _pci_path(device / "device")
        for port_dir in numbers:
            ports.append(_read_port(device.name, port_dir, pci_path, sysfs_root))
    return ports


def _read_port(device: str, port_dir: Path, pci_path: tuple[str, ...], sysfs_root: Path) -> RdmaPort:
    errors: dict[str, int] = {}
    saturated: list[str] = []
    for name, bits in LEGACY_ERRORS.items():
        value = _int(port_dir / "counters" / name)
        if value is not None:
            errors[name] = value
            if value >= (1 << bits) - 1:
                saturated.append(name)
    for name in HW_ERRORS:
        value = _int(port_dir / "hw_counters" / name)
        if value is not None:
            errors[name] = value
    link_downed = _int(port_dir / "counters" / "link_downed")
    if link_downed is not None and link_downed >= (1 << LINK_DOWNED_BITS) - 1:
        saturated.append("link_downed")
    netdev = _netdev(port_dir)
    return RdmaPort(
        device=device,
        port=port_dir.name,
        state=_numbered(port_dir / "state"),
        phys_state=_numbered(port_dir / "phys_state"),
        rate_bits_per_second=_rate(port_dir / "rate"),
        link_layer=read_attribute(port_dir / "link_layer") or "",
        errors=errors,
        saturated=tuple(saturated),
        link_downed=link_downed,
        pci_path=pci_path,
        netdev=netdev,
        carrier_down=_carrier_down(sysfs_root, netdev),
    )


def _int(path: Path) -> int | None:
    text = read_attribute(path)
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        log.debug("%s is not a count: %r", path, text[:40])
        return None
    return value if value >= 0 else None


def _numbered(path: Path) -> int | None:
    """ "4: ACTIVE" -> 4."""
    match = _STATE.match(read_attribute(path) or "")
    return int(match.group(1)) if match else None


def _rate(path: Path) -> float | None:
    """ "400 Gb/sec (4X NDR)" -> 4e11; "2.5 Gb/sec (1X SDR)" -> 2.5e9."""
    match = _RATE.match(read_attribute(path) or "")
    return float(match.group(1)) * 1e9 if match else None


def _netdev(port_dir: Path) -> str:
    """The Ethernet interface behind a RoCE port: gid_attrs/ndevs/0 names it (sysfs-class-infiniband)."""
    return read_attribute(port_dir / "gid_attrs" / "ndevs" / "0") or ""


def _carrier_down(sysfs_root: Path, netdev: str) -> int | None:
    """How many times a RoCE port's interface lost its carrier; None for InfiniBand, or where the kernel (before
    4.16) or the interface does not say. The name comes from sysfs, so one that would leave class/net is not read."""
    if not netdev or "/" in netdev or netdev in (".", ".."):
        return None
    return _int(sysfs_root / "class" / "net" / netdev / "carrier_down_count")


def _pci_path(device_link: Path) -> tuple[str, ...]:
    """The PCI functions from the root complex down to the device (``pci0000:15``, ``0000:15:01.0``, …)."""
    try:
        resolved = device_link.resolve(strict=True)
    except OSError:
        return ()
    parts = resolved.parts
    for i, part in enumerate(parts):
        if part.startswith("pci"):
            return tuple(parts[i:])
    return ()


def pci_path_of(address: str, sysfs_root: Path = Path("/sys")) -> tuple[str, ...]:
    """The PCI path of a function by its address (``0000:18:00.0``; NVML's ``00000000:18:00.0`` too)."""
    domain, _, rest = address.strip().lower().partition(":")
    try:
        normal = f"{int(domain, 16):04x}:{rest}" if rest else address.lower()
    except ValueError:  # not a PCI address: no path, so no NIC is beside it
        return ()
    return _pci_path(sysfs_root / "bus" / "pci" / "devices" / normal)


def nearest_gpu(nic: tuple[str, ...], gpus: dict[str, tuple[str, ...]]) -> str:
    """The GPU (label) that shares the deepest PCIe switch with the NIC: the longest common path below the root
    complex. "" when none shares more than the root complex (they meet only through the CPU)."""
    best, depth = "", 1
    for label, path in sorted(gpus.items()):
        shared = 0
        for a, b in zip(nic, path, strict=False):
            if a != b:
                break
            shared += 1
        if shared > depth:
            best, depth = label, shared
    return best
