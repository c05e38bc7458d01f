"""InfiniBand and RoCE ports (issue #34): the sysfs reader against trees laid out as the kernel lays them out, the
`network` collector on the simulated HGX node's NICs, and what the agent says of a port down, flapping or slow.

The trees follow Documentation/ABI/stable/sysfs-class-infiniband (the files and what they hold) and
drivers/infiniband/core/sysfs.c (how it writes them: state and phys_state as "%d: %s", rate as "%d Gb/sec (%dX %s)"
or with ".5" for SDR/DDR lanes, counters as decimal numbers); /sys/class/infiniband/<dev> is a link into the NIC's
PCI path, as udev and `ls -l /sys/class/infiniband` show on any mlx5 host. hw_counters/ are mlx5's (Documentation/
networking/device_drivers/ethernet/mellanox/mlx5/counters.rst, "RDMA counters").
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from simnode import SimAgent

from gpuwatch.judge.findings import node_findings
from gpuwatch.readers.rdma import nearest_gpu, pci_path_of, read_ports
from gpuwatch.web.status_page import render_status_page

SWITCH = "pci0000:15/0000:15:01.0/0000:16:00.0"  # a root port and the PCIe switch under it (an HGX baseboard's)


def _function(root: Path, parent: str, address: str) -> Path:
    path = root / "devices" / parent / address
    path.mkdir(parents=True)
    link = root / "bus" / "pci" / "devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(path, link.parent))
    return path


def _port(root: Path, name: str, function: Path, files: dict[str, str]) -> Path:
    device = function / "infiniband" / name
    port = device / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    (device / "device").symlink_to(os.path.relpath(function, device))
    link = root / "class" / "infiniband" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(device, link.parent))
    for relative, text in files.items():
        (port / relative).parent.mkdir(parents=True, exist_ok=True)
        (port / relative).write_text(text + "\n")
    return port


NDR = {  # a ConnectX-7 on InfiniBand NDR, up
    "state": "4: ACTIVE",
    "phys_state": "5: LinkUp",
    "rate": "400 Gb/sec (4X NDR)",
    "link_layer": "InfiniBand",
    "counters/symbol_error": "12",
    "counters/link_error_recovery": "0",
    "counters/link_downed": "1",
    "counters/port_rcv_errors": "0",
    "counters/port_xmit_discards": "3",
    "counters/local_link_integrity_errors": "0",
    "counters/excessive_buffer_overrun_errors": "0",
    "counters/port_rcv_remote_physical_errors": "0",
    "hw_counters/out_of_buffer": "0",
    "hw_counters/out_of_sequence": "4",
    "hw_counters/packet_seq_err": "0",
    "hw_counters/local_ack_timeout_err": "0",
}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """GPU 0000:18:00.0 and mlx5_0 under one PCIe switch; mlx5_1 (RoCE, 200 Gb/s HDR on a ConnectX-6 Dx) on the CPU's
    root complex; GPU 0000:2a:00.0 under another root complex."""
    _function(tmp_path, f"{SWITCH}/0000:17:00.0", "0000:18:00.0")
    _function(tmp_path, "pci0000:27/0000:27:01.0/0000:28:00.0/0000:29:00.0", "0000:2a:00.0")
    _port(tmp_path, "mlx5_0", _function(tmp_path, f"{SWITCH}/0000:17:01.0", "0000:19:00.0"), NDR)
    roce = {
        **{k: v for k, v in NDR.items() if k.startswith(("counters/", "hw_counters/"))},
        "state": "4: ACTIVE",
        "phys_state": "5: LinkUp",
        "rate": "200 Gb/sec (4X HDR)",
        "link_layer": "Ethernet",
        "gid_attrs/ndevs/0": "ens9np0",
    }
    _port(tmp_path, "mlx5_1", _function(tmp_path, "pci0000:00/0000:00:03.0", "0000:0e:00.0"), roce)
    return tmp_path


def test_ports_read_as_the_kernel_writes_them(node: Path) -> None:
    ib, roce = read_ports(node)
    assert (ib.device, ib.port, ib.state, ib.phys_state, ib.up) == ("mlx5_0", "1", 4, 5, True)
    assert ib.rate_bits_per_second == 400e9 and ib.link_layer == "InfiniBand" and ib.netdev == ""
    assert ib.link_downed == 1 and ib.errors["symbol_error"] == 12 and ib.errors["out_of_sequence"] == 4
    assert "link_downed" not in ib.errors and ib.saturated == ()
    assert roce.link_layer == "Ethernet" and roce.netdev == "ens9np0" and roce.rate_bits_per_second == 200e9


FIXTURES = Path(__file__).parent / "fixtures" / "rdma"  # its README.md cites where each file and value comes from


def test_a_connectx7_on_infiniband_ndr_reads_as_its_tree_shows() -> None:
    (port,) = read_ports(FIXTURES / "cx7-ib-ndr")
    assert (port.device, port.port, port.state, port.phys_state, port.up) == ("mlx5_0", "1", 4, 5, True)
    assert (port.rate_bits_per_second, port.link_layer, port.netdev, port.carrier_down) == (
        400e9,
        "InfiniBand",
        "",
        None,
    )
    assert port.link_downed == 1
    assert port.errors == {
        "symbol_error": 65535,
        "link_error_recovery": 2,
        "port_rcv_errors": 0,
        "port_rcv_remote_physical_errors": 0,
        "port_xmit_discards": 0,
        "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0,
        "out_of_buffer": 0,
        "out_of_sequence": 1,
        "packet_seq_err": 1,
        "local_ack_timeout_err": 131,
    }
    assert port.saturated == ("symbol_error",)  # 16 bits (sysfs.c's PORT_PMA_ATTR width): it counts no more
    gpu = pci_path_of("00000000:18:00.0", FIXTURES / "cx7-ib-ndr")
    assert nearest_gpu(port.pci_path, {"0": gpu}) == "0"


def test_a_connectx6dx_roce_port_is_down_with_its_interface_and_counts_its_carrier_losses() -> None:
    (port,) = read_ports(FIXTURES / "cx6dx-roce")
    assert (port.device, port.state, port.phys_state, port.up) == ("mlx5_1", 1, 3, False)
    assert (port.link_layer, port.netdev, port.carrier_down) == ("Ethernet", "ens1f0np0", 2)
    assert port.rate_bits_per_second == 100e9 and port.link_downed == 0
    assert port.errors["local_ack_timeout_err"] == 131 and "roce_adp_retrans" not in port.errors  # not a link error


def test_a_roce_interface_named_to_leave_class_net_is_not_read(tmp_path: Path) -> None:
    """The interface's name comes from sysfs; one that would climb out of class/net reads as no carrier count."""
    outside = tmp_path / "class" / "carrier_down_count"
    outside.parent.mkdir(parents=True)
    outside.write_text("7\n")
    function = _function(tmp_path, "pci0000:00/0000:00:03.0", "0000:0e:00.0")
    _port(tmp_path, "mlx5_1", function, {"state": "4: ACTIVE", "link_layer": "Ethernet", "gid_attrs/ndevs/0": ".."})
    (port,) = read_ports(tmp_path)
    assert port.netdev == ".." and port.carrier_down is None


def test_each_nic_is_labelled_with_the_gpu_under_its_pcie_switch(node: Path) -> None:
    ib, roce = read_ports(node)
    gpus = {"0": pci_path_of("00000000:18:00.0", node), "1": pci_path_of("0000:2a:00.0", node)}  # NVML's form too
    assert gpus["0"][:3] == ("pci0000:15", "0000:15:01.0", "0000:16:00.0")
    assert nearest_gpu(ib.pci_path, gpus) == "0"
    assert nearest_gpu(roce.pci_path, gpus) == ""  # only the CPU between them
    assert pci_path_of("GPU-not-an-address", node) == () and pci_path_of("0000:77:00.0", node) == ()


@pytest.mark.parametrize(
    ("state", "phys_state", "rate", "up", "bits"),
    [
        ("1: DOWN", "2: Polling", "10 Gb/sec (4X SDR)", False, 10e9),  # no link partner: cable or switch port
        ("2: INIT", "5: LinkUp", "400 Gb/sec (4X NDR)", False, 400e9),  # link up, no subnet manager yet
        ("4: ACTIVE", "5: LinkUp", "2.5 Gb/sec (1X SDR)", True, 2.5e9),
        ("4: ACTIVE", "6: LinkErrorRecovery", "200 Gb/sec (2X NDR)", False, 200e9),
    ],
)
def test_states_and_rates(tmp_path: Path, state: str, phys_state: str, rate: str, up: bool, bits: float) -> None:
    files = {**NDR, "state": state, "phys_state": phys_state, "rate": rate}
    _port(tmp_path, "mlx5_0", _function(tmp_path, "pci0000:00/0000:00:02.0", "0000:05:00.0"), files)
    (port,) = read_ports(tmp_path)
    assert port.up is up and port.rate_bits_per_second == bits


def test_garbage_missing_and_saturated_counters(tmp_path: Path) -> None:
    """A 16-bit symbol_error at 65535 and an 8-bit link_downed at 255 count no more (sysfs.c PORT_PMA_ATTR widths);
    a counter that is not a number, or missing, is left out; an unreadable state reads as unknown, not as up."""
    files = {
        **NDR,
        "state": "garbage",
        "rate": "fast",
        "counters/symbol_error": "65535",
        "counters/link_downed": "255",
        "counters/port_rcv_errors": "-3",
        "counters/port_xmit_discards": "lots",
    }
    port_dir = _port(tmp_path, "mlx5_0", _function(tmp_path, "pci0000:00/0000:00:02.0", "0000:05:00.0"), files)
    (port_dir / "counters" / "local_link_integrity_errors").unlink()
    (port,) = read_ports(tmp_path)
    assert port.state is None and not port.up and port.rate_bits_per_second is None
    assert set(port.saturated) == {"symbol_error", "link_downed"}
    assert "port_rcv_errors" not in port.errors and "port_xmit_discards" not in port.errors
    assert "local_link_integrity_errors" not in port.errors and port.errors["symbol_error"] == 65535
    assert read_ports(tmp_path / "nowhere") == []


def _port_value(sim: SimAgent, name: str, **labels: str) -> float | None:
    """A sample by its full label set (`gpu` is a label here, not SimAgent.value's GPU index)."""
    return sim.samples().get((name, frozenset(labels.items())))


def _findings(sim: SimAgent, alert: str) -> list[str]:
    return [f.text for f in node_findings(sim.agent.store.snapshot()) if f.alert == alert]


def test_an_hgx_node_has_a_nic_per_gpu_beside_it_and_a_storage_nic(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, "fabric_degraded")  # an HGX node, its network healthy
    try:
        sim.run(2)
        for gpu in range(8):
            labels = {"device": f"mlx5_{gpu}", "port": "1", "gpu": str(gpu)}
            assert _port_value(sim, "gpuwatch_network_port_up", **labels) == 1.0
            assert _port_value(sim, "gpuwatch_network_port_rate_bits_per_second", **labels) == 400e9
            assert _port_value(sim, "gpuwatch_network_port_link_downed_total", **labels) == 0.0
        storage = {"device": "mlx5_8", "port": "1", "gpu": ""}
        assert _port_value(sim, "gpuwatch_network_port_info", **storage, link_layer="Ethernet", netdev="ens9np0") == 1.0
        assert not [f for f in node_findings(sim.agent.store.snapshot()) if f.alert.startswith("HostNetwork")]
    finally:
        sim.close()


def test_ib_port_down_is_a_node_finding_once_the_port_was_seen_up(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, "ib_port_down")
    try:
        sim.run(20)  # up at the first run (0 s), down from 1 s: the second run (15 s) sees it
        labels = {"device": "mlx5_2", "port": "1", "gpu": "2"}
        assert _port_value(sim, "gpuwatch_network_port_up", **labels) == 0.0
        assert _port_value(sim, "gpuwatch_network_port_rate_bits_per_second", **labels) == 0.0
        assert _port_value(sim, "gpuwatch_network_port_link_downed_total", **labels) == 1.0
        (down,) = _findings(sim, "HostNetworkPortDown")
        assert "network port mlx5_2/1 (beside GPU 2) is down (state 1, physical state 2)" in down
        page = render_status_page(sim.agent.store.snapshot())
        assert 'id="network"' in page and "mlx5_2/1" in page and '<span class="flag bad">down</span>' in page
    finally:
        sim.close()


def test_ib_flapping_counts_each_drop_and_is_judged_as_the_rule_judges_it(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, "ib_flapping")
    try:
        sim.run(16)
        assert _findings(sim, "HostNetworkPortFlapping") == []  # one drop so far
        sim.run(35)  # drops at 1 s, 21 s and 41 s; the collector reads every 15 s
        labels = {"device": "mlx5_2", "port": "1", "gpu": "2"}
        assert _port_value(sim, "gpuwatch_network_port_link_downed_total", **labels) == 3.0
        (flapping,) = _findings(sim, "HostNetworkPortFlapping")
        assert "network port mlx5_2/1 (beside GPU 2) went down" in flapping and "times in 15 minutes" in flapping
        (errors,) = _findings(sim, "HostNetworkPortErrors")
        assert "link_error_recovery" in errors and "symbol_error" in errors  # 111 symbol errors: past 100
    finally:
        sim.close()


def test_a_roce_port_whose_interface_keeps_losing_its_carrier_is_flapping(tmp_path: Path) -> None:
    """RoCE: link_downed is the InfiniBand link's counter; the storage NIC's flaps show in its interface's
    carrier_down_count (sysfs-class-net), exported as gpuwatch_network_port_carrier_down_total and judged as the
    rule judges it (twice or more in 15 minutes)."""
    sim = SimAgent(tmp_path, "fabric_degraded")  # an HGX node: its storage NIC mlx5_8 on RoCE
    try:
        sim.run(2)
        labels = {"device": "mlx5_8", "port": "1", "gpu": ""}
        assert _port_value(sim, "gpuwatch_network_port_carrier_down_total", **labels) == 0.0
        assert _port_value(sim, "gpuwatch_network_port_carrier_down_total", device="mlx5_0", port="1", gpu="0") is None
        sim.node.faults.lose_storage_carrier()
        sim.run(16)
        assert _findings(sim, "HostNetworkPortFlapping") == []  # once
        sim.node.faults.lose_storage_carrier()
        sim.run(16)
        assert _port_value(sim, "gpuwatch_network_port_carrier_down_total", **labels) == 2.0
        assert _port_value(sim, "gpuwatch_network_port_link_downed_total", **labels) == 0.0
        (flapping,) = _findings(sim, "HostNetworkPortFlapping")
        assert "network port mlx5_8/1" in flapping
    finally:
        sim.close()
