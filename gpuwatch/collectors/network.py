"""The `network` collector: the node's InfiniBand and RoCE ports (gpuwatch/readers/rdma.py), each labelled with the
GPU it sits beside, so a training job's other half — its network rail — is watched with its GPUs.

Each run reads every port's state, rate and error counters from sysfs (a few hundred small files on an 8-NIC node,
every 15 s on its own job). Between runs it keeps, per port, whether it has been up since the agent started (only a
port that was up and went down is a port down: an unused port is not) and the rate it is expected to run at: the
configured `network.expected_rate_gbps`, else the highest rate this port or any other port of the same link layer
on the node has run at since the agent started (eight identical NICs: one that trained at half speed stands out).
A port counts as having been up when the agent saw it up, or when its link_downed counter (a RoCE interface's
carrier_down_count) is above 0: the link came up and went down since the driver loaded, so a port already down when
the agent starts is still a port down.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from gpuwatch.collectors.base import CheckLine, CollectorContext, Every
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.metric_spec import MetricSpec, SampleSink
from gpuwatch.readers.rdma import RdmaPort, nearest_gpu, pci_path_of, read_ports

log = logging.getLogger(__name__)

PORT = ("device", "port", "gpu")
FLAP_WINDOW_S = 900.0  # HostNetworkPortFlapping: link_downed (RoCE: carrier_down) grown twice or more in 15 minutes
FLAPS = 2
ERROR_WINDOW_S = 600.0  # HostNetworkPortErrors: error counters grown in 10 minutes
# The counters whose first count is an error worth a look, and symbol errors past their allowance (the rules' own).
LINK_ERRORS = frozenset(
    {
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "link_error_recovery",
    }
)
SYMBOL_ERRORS_ALLOWED = 100


@dataclass(frozen=True, slots=True)
class NetworkSection:
    """[network]: the RDMA ports' collector (docs/network.md)."""

    SECTION: ClassVar[str] = "network"

    interval_seconds: float = 15.0
    expected_rate_gbps: float = 0.0  # 0: the highest rate seen on the node's ports of the same link layer

    def problems(self) -> Iterator[tuple[str, str]]:
        if not 1.0 <= self.interval_seconds <= 3600.0:
            yield "interval_seconds", f"must be between 1 and 3600 seconds, got {self.interval_seconds:g}"
        if not 0.0 <= self.expected_rate_gbps <= 10_000.0:
            yield (
                "expected_rate_gbps",
                f"must be 0 (learn it from the ports) or a rate in Gb/s such as 400, got {self.expected_rate_gbps:g}",
            )


SETTINGS = NetworkSection

FAMILIES = (
    MetricSpec("gpuwatch_network_port_up", "gauge", PORT, "1 while the RDMA port is ACTIVE (and its link LinkUp)."),
    MetricSpec(
        "gpuwatch_network_port_rate_bits_per_second",
        "gauge",
        PORT,
        "The port's data rate (active width × active speed), 0 while it is down.",
    ),
    MetricSpec(
        "gpuwatch_network_port_expected_rate_bits_per_second",
        "gauge",
        PORT,
        "The rate the port should run at: network.expected_rate_gbps, else the highest the node's ports of its link "
        "layer have run at since the agent started.",
    ),
    MetricSpec(
        "gpuwatch_network_port_errors_total",
        "counter",
        (*PORT, "type"),
        "Port error counters as the kernel reports them (counters/ and mlx5 hw_counters/), by counter name.",
    ),
    MetricSpec(
        "gpuwatch_network_port_link_downed_total",
        "counter",
        PORT,
        "Times the port's link went down (link_downed): growing means a flapping link.",
    ),
    MetricSpec(
        "gpuwatch_network_port_carrier_down_total",
        "counter",
        PORT,
        "RoCE: times the port's network interface lost its carrier (carrier_down_count), its Ethernet link downs.",
    ),
    MetricSpec(
        "gpuwatch_network_port_counter_saturated",
        "gauge",
        (*PORT, "type"),
        "1 for a legacy 4-16 bit counter stuck at its maximum: it counts no more until the driver resets it.",
    ),
    MetricSpec(
        "gpuwatch_network_port_info",
        "gauge",
        (*PORT, "link_layer", "netdev"),
        "1 per RDMA port: its link layer (InfiniBand or Ethernet for RoCE) and, for RoCE, its network interface.",
    ),
)


@dataclass(frozen=True, slots=True)
class PortView:
    """A port as the agent judges it: the reading, its GPU, whether it has been up and the rate expected."""

    reading: RdmaPort
    gpu: str
    was_up: bool
    expected_rate_bits_per_second: float | None
    flaps: int = 0  # link_downed's (RoCE: carrier_down's, where larger) growth over the last 15 minutes of runs
    error_growth: Mapping[str, int] = field(default_factory=dict)  # each counter's growth over the last 10 minutes

    @property
    def labels(self) -> tuple[str, str, str]:
        return (self.reading.device, self.reading.port, self.gpu)

    @property
    def down(self) -> bool:
        """Down after having been up: seen up by the agent, or its link_downed above 0."""
        return self.was_up and not self.reading.up

    @property
    def flapping(self) -> bool:
        return self.flaps >= FLAPS

    @property
    def erring(self) -> dict[str, int]:
        """The error counters past their allowance over the last 10 minutes, as HostNetworkPortErrors judges."""
        return {
            kind: grown
            for kind, grown in self.error_growth.items()
            if (kind in LINK_ERRORS and grown > 0) or (kind == "symbol_error" and grown > SYMBOL_ERRORS_ALLOWED)
        }

    @property
    def slow(self) -> bool:
        rate, expected = self.reading.rate_bits_per_second, self.expected_rate_bits_per_second
        return self.reading.up and rate is not None and expected is not None and rate < expected


NetworkPorts = tuple[PortView, ...]  # what a run stores


def export_node(part: NetworkPorts | None, out: SampleSink) -> None:
    for view in part or ():
        labels, port = view.labels, view.reading
        out.add("gpuwatch_network_port_up", labels, port.up)
        out.add("gpuwatch_network_port_info", (*labels, port.link_layer, port.netdev), 1)
        if port.rate_bits_per_second is not None:
            out.add("gpuwatch_network_port_rate_bits_per_second", labels, port.rate_bits_per_second if port.up else 0)
        if view.expected_rate_bits_per_second is not None:
            out.add("gpuwatch_network_port_expected_rate_bits_per_second", labels, view.expected_rate_bits_per_second)
        for kind, count in port.errors.items():
            out.add("gpuwatch_network_port_errors_total", (*labels, kind), count)
        if port.link_downed is not None:
            out.add("gpuwatch_network_port_link_downed_total", labels, port.link_downed)
        if port.carrier_down is not None:
            out.add("gpuwatch_network_port_carrier_down_total", labels, port.carrier_down)
        for kind in port.saturated:
            out.add("gpuwatch_network_port_counter_saturated", (*labels, kind), 1)


class NetworkCollector:
    name = "network"
    schedule = Every("host-network", lambda config: config.section(NetworkSection).interval_seconds)

    def __init__(self, context: CollectorContext) -> None:
        self._context = context
        self._was_up: set[tuple[str, str]] = set()
        self._best: dict[tuple[str, str], float] = {}  # port -> highest rate it has run at
        self._gpu_paths: dict[str, tuple[str, ...]] = {}
        self._gpu_key: frozenset[tuple[int, str]] = frozenset()
        # port -> (monotonic time, link_downed, carrier_down, error counters) of the runs of the last 15 minutes
        self._history: dict[tuple[str, str], deque[tuple[float, int | None, int | None, dict[str, int]]]] = {}

    def update(self) -> bool:
        rdma = self._context.sources.rdma
        if rdma.root is None:
            self._context.store.set_part(self.name, ())
            return True
        rdma.refresh()
        ports = read_ports(rdma.root)
        section = self._context.config().section(NetworkSection)
        self._context.store.set_part(self.name, self._judge(ports, rdma.root, section))
        return True

    def _judge(self, ports: list[RdmaPort], root: Path, section: NetworkSection) -> NetworkPorts:
        gpus = self._gpus(root)
        for port in ports:
            key = (port.device, port.port)
            if port.up:
                self._was_up.add(key)
                if port.rate_bits_per_second:
                    self._best[key] = max(self._best.get(key, 0.0), port.rate_bits_per_second)
        by_layer: dict[str, float] = {}
        for port in ports:
            best = self._best.get((port.device, port.port))
            if best is not None:
                by_layer[port.link_layer] = max(by_layer.get(port.link_layer, 0.0), best)
        configured = section.expected_rate_gbps * 1e9 or None
        now = self._context.monotonic()
        views = []
        for port in ports:
            flaps, growth = self._remember(port, now)
            views.append(
                PortView(
                    port,
                    nearest_gpu(port.pci_path, gpus),
                    (port.device, port.port) in self._was_up or bool(port.link_downed) or bool(port.carrier_down),
                    configured or by_layer.get(port.link_layer),
                    flaps,
                    growth,
                )
            )
        for gone in set(self._history) - {(p.device, p.port) for p in ports}:  # a NIC removed or renamed
            del self._history[gone]
        return tuple(views)

    def _remember(self, port: RdmaPort, now: float) -> tuple[int, dict[str, int]]:
        """This run's counters kept; the growth of the link downs over 15 minutes (link_downed, or a RoCE
        interface's carrier losses where they count more) and of each error over 10, a counter that went down (a
        driver reload) counted from 0."""
        history = self._history.setdefault((port.device, port.port), deque())
        history.append((now, port.link_downed, port.carrier_down, dict(port.errors)))
        while history and now - history[0][0] > FLAP_WINDOW_S:
            history.popleft()
        flaps = max(_growth([downed for _, downed, _, _ in history]), _growth([lost for _, _, lost, _ in history]))
        recent = [errors for at, _, _, errors in history if now - at <= ERROR_WINDOW_S]
        growth = {kind: _growth([errors.get(kind) for errors in recent]) for kind in port.errors}
        return flaps, growth

    def _gpus(self, root: Path) -> dict[str, tuple[str, ...]]:
        """Each GPU's PCI path, looked up again only when the GPUs change."""
        identities = self._context.store.identities().values()
        key = frozenset((i.index, i.pci_bus_id) for i in identities if i.pci_bus_id)
        if key != self._gpu_key:
            self._gpu_key = key
            self._gpu_paths = {str(index): pci_path_of(bus, root) for index, bus in key}
        return self._gpu_paths


def _growth(values: list[int | None]) -> int:
    """How much a counter grew over its readings, as Prometheus' increase() counts it: a drop is a reset."""
    grown, last = 0, None
    for value in values:
        if value is None:
            continue
        if last is not None:
            grown += value - last if value >= last else value
        last = value
    return grown


def collectors(context: CollectorContext, name: str) -> list[NetworkCollector]:
    return [NetworkCollector(context)]


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """`gpuwatch check`: the RDMA ports found and their states (a node without any is fine)."""
    if sources.rdma.root is not None:
        sources.rdma.refresh()
    ports = read_ports(sources.rdma.root) if sources.rdma.root is not None else []
    if not ports:
        return [CheckLine("ok", "RDMA ports", "none (no /sys/class/infiniband): nothing to export")]
    up = [f"{p.device}/{p.port}" for p in ports if p.up]
    return [CheckLine("ok", "RDMA ports", f"{len(ports)} port(s), {len(up)} up: {', '.join(up) or 'none'}")]
