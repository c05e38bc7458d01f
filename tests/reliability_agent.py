"""A real agent (scheduler, event thread, HTTP server) over the simulated libraries, for the reliability tests."""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from pathlib import Path

from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import load_config
from gpuwatch.service.agent import Agent
from gpuwatch.service.sdnotify import ServiceNotifier
from gpuwatch.simulated.node import simulated_slot
from gpuwatch.simulated.scenarios import SimulatedNode

POLL = 0.2


class LiveAgent:
    """The agent serving on a free loopback port; `get()` speaks plain HTTP/1.1 to it."""

    def __init__(
        self,
        state_dir: Path,
        *,
        vendor: str = "nvidia",
        gpus: int = 8,
        scenario: str = "healthy",
        notifier: ServiceNotifier | None = None,
    ) -> None:
        self.node = SimulatedNode(scenario=scenario, gpus=gpus, vendor=vendor)
        slot = simulated_slot(self.node, clock=time.time)
        self.port = free_port()
        overrides: dict[str, dict[str, object]] = {
            "agent": {
                "backend": "simulated",
                "state_dir": str(state_dir),
                "poll_interval_seconds": POLL,
                "listen": f"127.0.0.1:{self.port}",
            }
        }
        self.agent = Agent(
            load_config(None, overrides), NodeSources([slot], self.node.pci_gpu_counts, None), notifier=notifier
        )
        self.agent.start()

    def get(self, path: str, method: str = "GET", timeout: float = 30.0) -> tuple[int, str, float]:
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            return response.status, response.read().decode(), time.monotonic() - started
        finally:
            conn.close()

    def metric(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        _, text, _ = self.get("/metrics")
        return {
            frozenset(s.labels.items()): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        }

    def up(self) -> dict[str, float]:
        return {dict(labels)["gpu"]: value for labels, value in self.metric("gpuwatch_gpu_up").items()}

    def stop(self) -> None:
        self.node.faults.clear()
        self.agent.stop()


def wait_for(condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        time.sleep(0.05)
