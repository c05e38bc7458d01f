"""The simulated HGX node's RDMA NICs: a sysfs tree as the kernel lays it out, which the REAL reader
(gpuwatch/readers/rdma.py) reads.

One ConnectX-7 per GPU on InfiniBand NDR (mlx5_0..7, "400 Gb/sec (4X NDR)"), each under the PCIe switch of its GPU
as on an HGX H100 baseboard, and one ConnectX for storage on RoCE (mlx5_8, Ethernet, 200 Gb/s, interface ens9np0) on
the CPU's root complex, beside no GPU, with its interface under ``class/net`` (up; its carrier lost as
faults.lose_storage_carrier says). The files are the kernel's: ``state`` "4: ACTIVE", ``phys_state`` "5: LinkUp",
``rate``, ``link_layer``, ``counters/`` and mlx5's ``hw_counters/``
(Documentation/ABI/stable/sysfs-class-infiniband; drivers/infiniband/core/sysfs.c), ``class/infiniband/mlx5_N`` a
link into the device's PCI path, and ``bus/pci/devices/<address>`` a link to each GPU's and NIC's function.

`ib_port_down`: the NIC beside the faulted GPU (GPU 2; any GPU given the scenario's fault) loses its link at 1 s
(cable or transceiver: "1: DOWN", "2: Polling"), link_downed counting it. `ib_flapping`: that NIC's link goes down
and comes back every 20 s, link_downed and link_error_recovery counting each flap and symbol errors each retraining.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwatch.simulated.scenarios import SimulatedNode

ONSET_S = 1.0
FLAP_PERIOD_S = 20.0  # ib_flapping: one down-and-up every 20 s
FLAP_DOWN_S = 2.0  # of which the link is down for 2 s
SYMBOLS_PER_FLAP = 37  # symbol errors counted while the link retrains
LEGACY = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
HW = ("out_of_buffer", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err")
STORAGE_NIC = "mlx5_8"
STORAGE_NETDEV = "ens9np0"


class SimulatedRdma:
    """Renders the node's RDMA ports at the node's current time into a temporary sysfs root."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self._dir = tempfile.TemporaryDirectory(prefix="gpuwatch-simrdma-")
        weakref.finalize(self, self._dir.cleanup)
        self.root = Path(self._dir.name)
        self._ports: dict[str, Path] = {}
        self._interface: Path | None = None  # the RoCE storage NIC's network interface
        self._written: dict[Path, str] = {}  # what each file holds: a refresh rewrites only what changed
        self._build()
        self.refresh()

    def _build(self) -> None:
        for index in range(self.node.gpu_count):
            gpu = self.node.spec(index).pci_bus_id.lower()
            gpu = gpu[4:] if len(gpu.split(":")[0]) == 8 else gpu  # NVML's 8-digit domain -> sysfs's 4
            bus = int(gpu.split(":")[1], 16)
            switch = f"pci0000:{bus - 3:02x}/0000:{bus - 3:02x}:01.0/0000:{bus - 2:02x}:00.0"
            self._function(f"{switch}/0000:{bus - 1:02x}:00.0", gpu)
            self._nic(f"mlx5_{index}", f"{switch}/0000:{bus - 1:02x}:01.0", f"0000:{bus + 1:02x}:00.0")
        if self.node.gpu_count:
            self._nic(STORAGE_NIC, "pci0000:00/0000:00:03.0", "0000:0e:00.0")

    def _function(self, parent: str, address: str) -> Path:
        path = self.root / "devices" / parent / address
        path.mkdir(parents=True, exist_ok=True)
        link = self.root / "bus" / "pci" / "devices" / address
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(path, link.parent))
        return path

    def _nic(self, name: str, parent: str, address: str) -> None:
        function = self._function(parent, address)
        device = function / "infiniband" / name
        port = device / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "hw_counters").mkdir()
        (device / "device").symlink_to(os.path.relpath(function, device))
        link = self.root / "class" / "infiniband" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(device, link.parent))
        ethernet = name == STORAGE_NIC
        (port / "link_layer").write_text("Ethernet\n" if ethernet else "InfiniBand\n")
        if ethernet:
            (port / "gid_attrs" / "ndevs").mkdir(parents=True)
            (port / "gid_attrs" / "ndevs" / "0").write_text(f"{STORAGE_NETDEV}\n")
            # Its interface, as Documentation/ABI/testing/sysfs-class-net lays it out: a link from class/net into the
            # function's net/ directory, which holds operstate, speed (Mb/s) and the carrier counts.
            interface = function / "net" / STORAGE_NETDEV
            interface.mkdir(parents=True)
            net = self.root / "class" / "net" / STORAGE_NETDEV
            net.parent.mkdir(parents=True, exist_ok=True)
            net.symlink_to(os.path.relpath(interface, net.parent))
            self._interface = interface
        self._ports[name] = port

    def refresh(self) -> None:
        """Write each port's state and counters as they are now."""
        elapsed = self.node.elapsed()
        for name, port in self._ports.items():
            up, downed, recoveries, symbols = True, 0, 0, 0
            beside = int(name.removeprefix("mlx5_"))
            fault = self.node.plan(beside).fault if beside < self.node.gpu_count else None
            if elapsed >= ONSET_S:
                if fault == "ib_port_down":
                    up, downed = False, 1
                elif fault == "ib_flapping":
                    since = elapsed - ONSET_S
                    flaps = int(since // FLAP_PERIOD_S) + 1
                    up = since % FLAP_PERIOD_S >= FLAP_DOWN_S
                    downed, recoveries, symbols = flaps, flaps, SYMBOLS_PER_FLAP * flaps
            ethernet = name == STORAGE_NIC
            rate = "200 Gb/sec (4X HDR)" if ethernet else "400 Gb/sec (4X NDR)"
            files = {
                "state": "4: ACTIVE" if up else "1: DOWN",
                "phys_state": "5: LinkUp" if up else "2: Polling",
                "rate": rate if up else "10 Gb/sec (4X SDR)",
                **{f"counters/{c}": "0" for c in LEGACY},
                **{f"hw_counters/{c}": "0" for c in HW},
                "counters/link_downed": str(downed),
                "counters/link_error_recovery": str(recoveries),
                "counters/symbol_error": str(symbols),
            }
            targets = {port / relative: text for relative, text in files.items()}
            if ethernet and self._interface is not None:  # up, its carrier lost and back as the faults say
                lost = self.node.faults.storage_carrier_losses
                interface = {"operstate": "up", "carrier": "1", "speed": "200000", "carrier_changes": str(1 + 2 * lost)}
                interface |= {"carrier_up_count": str(1 + lost), "carrier_down_count": str(lost)}
                targets |= {self._interface / relative: text for relative, text in interface.items()}
            for target, text in targets.items():
                if self._written.get(target) == text:
                    continue
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_text(text + "\n")
                tmp.replace(target)  # a reader never sees half a file
                self._written[target] = text
