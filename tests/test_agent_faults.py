"""Faults while the agent runs for real (scheduler, event thread, HTTP server) over the simulated library:
a hung vendor call, a GPU lost and back, NotSupported everywhere, random errors."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent

from gpuwatch.collectors.sources import BackendSlot, NodeSources
from gpuwatch.config.settings import load_config
from gpuwatch.service.agent import Agent
from gpuwatch.simulated.node import simulated_slot
from gpuwatch.simulated.nvml_constants import NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN
from gpuwatch.simulated.scenarios import SimulatedNode

POLL = 0.2


class Running:
    def __init__(self, tmp_path: Path, scenario: str = "healthy") -> None:
        self.node = SimulatedNode(scenario=scenario, gpus=4)
        slot = simulated_slot(self.node)
        self.port = free_port()
        overrides = {
            "agent": {
                "backend": "simulated",
                "state_dir": str(tmp_path),
                "poll_interval_seconds": POLL,
                "listen": f"127.0.0.1:{self.port}",
            }
        }
        self.agent = Agent(load_config(None, overrides), NodeSources([slot], self.node.pci_gpu_counts, None))
        self.agent.start()

    def get(self, path: str) -> tuple[int, str, float]:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, response.read().decode(), time.monotonic() - started
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), time.monotonic() - started

    def up(self) -> dict[str, float]:
        _, text, _ = self.get("/metrics")
        out = {}
        for family in text_string_to_metric_families(text):
            if family.name == "gpuwatch_gpu_up":
                out.update({s.labels["gpu"]: s.value for s in family.samples})
        return out

    def series(self, name: str, gpu: str) -> list[float]:
        _, text, _ = self.get("/metrics")
        return [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and s.labels.get("gpu") == gpu
        ]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    wait_for(lambda: r.get("/healthz")[0] == 200)
    yield r
    r.node.faults.clear()
    r.agent.stop()


def test_hung_vendor_call_turns_gpus_stale_but_scrapes_stay_fast(running: Running) -> None:
    assert set(running.up().values()) == {1.0}
    running.node.faults.hang("nvmlDeviceGetPowerUsage", gpu=1)
    assert running.node.faults.wait_until_blocked(1, timeout=5)
    wait_for(lambda: set(running.up().values()) == {0.0}, timeout=3 * POLL + 2)
    status, body, _ = running.get("/healthz")
    assert status == 503 and "hung vendor call" in body
    assert running.series("gpuwatch_gpu_power_watts", "0") == []  # no stale readings that look healthy
    _, _, scrape_seconds = running.get("/metrics")
    assert scrape_seconds < 0.5
    running.node.faults.release()
    wait_for(lambda: set(running.up().values()) == {1.0})
    assert running.get("/healthz")[0] == 200


def test_stop_within_two_seconds_while_a_vendor_call_hangs(running: Running) -> None:
    running.node.faults.hang("nvmlDeviceGetTemperature")
    assert running.node.faults.wait_until_blocked(1, timeout=5)
    started = time.monotonic()
    running.agent.stop()
    assert time.monotonic() - started < 2.0


def test_gpu_lost_mid_run_and_back_after_a_driver_reload(running: Running) -> None:
    running.node.faults.lose_gpu(2)
    wait_for(lambda: running.up().get("2") == 0.0)
    up = running.up()
    assert up["0"] == up["1"] == up["3"] == 1.0
    assert running.series("gpuwatch_gpu_temperature_celsius", "2") == []
    assert running.get("/healthz")[0] == 200  # the hardware's problem, not the agent's
    running.node.faults.restore_gpu(2)
    wait_for(lambda: running.up().get("2") == 1.0)
    assert running.series("gpuwatch_gpu_temperature_celsius", "2") != []


def test_not_supported_everywhere_omits_readings_but_keeps_the_gpu_up(running: Running) -> None:
    for pattern in (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature*",
    ):
        running.node.faults.fail(pattern, NVML_ERROR_NOT_SUPPORTED)
    wait_for(lambda: running.series("gpuwatch_gpu_power_watts", "0") == [])
    assert running.series("gpuwatch_gpu_temperature_celsius", "0") == []
    assert running.series("gpuwatch_gpu_utilization_ratio", "0") == []
    assert set(running.up().values()) == {1.0}
    assert running.series("gpuwatch_gpu_memory_total_bytes", "0") != []  # what is supported is still read


def test_random_errors_never_stop_the_agent(running: Running) -> None:
    running.node.faults.fail("nvmlDevice*", NVML_ERROR_UNKNOWN, rate=0.2)
    time.sleep(2.0)
    for _ in range(10):
        status, text, _ = running.get("/metrics")
        assert status == 200
        list(text_string_to_metric_families(text))  # always parses
    running.node.faults.clear_failures()
    wait_for(lambda: set(running.up().values()) == {1.0})


class _BrokenOnOpen:
    """A backend whose open fails with an error that is not BackendUnavailable (a bug, a binding quirk)."""

    name = "nvml"
    vendor = "nvidia"

    def __init__(self, opens: list[float]) -> None:
        self._opens = opens

    def open(self) -> None:
        self._opens.append(time.monotonic())
        raise TypeError("unhashable type")

    def close(self) -> None:
        pass


def test_a_backend_that_fails_to_open_with_a_bug_is_down_with_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Any exception while opening makes the library 'down' (gpuwatch_backend_up 0, the reason in the log once)
    and is retried with backoff, never a traceback on every poll (issue: 13 tracebacks in 8 s, no backend_up)."""
    opens: list[float] = []
    now = [0.0]
    slot = BackendSlot("nvml", "nvidia", lambda: _BrokenOnOpen(opens))  # type: ignore[arg-type, return-value]
    overrides = {"agent": {"backend": "simulated", "state_dir": str(tmp_path)}}
    sources = NodeSources([slot], lambda: {"nvidia": 1}, None)
    agent = Agent(load_config(None, overrides), sources, monotonic=lambda: now[0])
    for _ in range(40):  # 40 polls over 8 s
        agent.poll_once()
        now[0] += 0.2
    assert len(opens) == 4  # at 0, 1, 3 and 7 s
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1
    assert agent.registry.get_sample_value("gpuwatch_backend_up", {"backend": "nvml"}) == 0.0


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_losing_gpu_0_never_stops_the_other_gpus(tmp_path: Path, vendor: str) -> None:
    """Found in review: the AMD backend's driver-version check asked GPU 0 only, so losing GPU 0 stopped the other
    GPUs' polls; it asks the first GPU that answers."""
    sim = SimAgent(tmp_path, scenario="healthy", gpus=4, vendor=vendor)
    sim.run(2.0)
    sim.node.faults.lose_gpu(0)
    sim.run(70.0)  # past two slow polls: the driver-version check asks a GPU too
    assert sim.value("gpuwatch_gpu_up", 0) == 0.0
    for gpu in (1, 2, 3):
        assert sim.value("gpuwatch_gpu_up", gpu) == 1.0, gpu
    assert sim.agent.health()[0]
    sim.close()
