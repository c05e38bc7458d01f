"""Fault injection through the simulated vendor libraries (NVML and AMD SMI), with the real backends and agent:
random vendor errors at a high rate, a driver unloaded and reloaded, a hung vendor call and the systemd watchdog."""

from __future__ import annotations

import logging
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from reliability_agent import POLL, LiveAgent, wait_for
from simnode import SimAgent

from gpuwatch.service.sdnotify import SdNotifier, ServiceNotifier
from gpuwatch.simulated.amdsmi_sim import simulated_amdsmi
from gpuwatch.simulated.nvml_constants import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN
from gpuwatch.simulated.scenarios import SimulatedNode

NVML_CODES = [*range(1, 31), NVML_ERROR_UNKNOWN]
# Every amdsmi_status_t of the installed amdsmi, read off its own wrapper (amdsmi 7.0.2 amdsmi_wrapper.py:289).
AMD_CODES = [code for code in simulated_amdsmi(SimulatedNode("healthy", gpus=1, vendor="amd")).amdsmi_wrapper
             .amdsmi_status_t__enumvalues if code != 0]  # fmt: skip
POLLS = 200


def long_lived_threads() -> set[str]:
    """The agent's own threads (HTTP server, scheduler, event readers), not the per-request ones."""
    per_request = ("process_request_thread", "http-conn")  # gpuwatch/web/server.py names each connection's thread
    return {t.name for t in threading.enumerate() if not any(p in t.name for p in per_request)}


def counters(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every counter sample of one exposition (parsed with the official parser)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        if family.type == "counter"
        for s in family.samples
        if s.name.endswith("_total")
    }


@pytest.mark.parametrize(("vendor", "codes"), [("nvidia", NVML_CODES), ("amd", AMD_CODES)])
def test_random_vendor_errors_on_every_call(
    tmp_path: Path, vendor: str, codes: list[int], promtool: str, caplog: pytest.LogCaptureFixture
) -> None:
    """30 % of all vendor calls fail with a random code of that vendor, for hundreds of polls."""
    sim = SimAgent(tmp_path, scenario="mixed", gpus=4, vendor=vendor)
    try:
        sim.run(3.0)
        for code in codes:  # each code its own rule; together about 30 % of calls fail
            sim.node.faults.fail("*", code, rate=0.3 / len(codes) * 1.2)
        seen: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        expositions = []
        with caplog.at_level(logging.WARNING):
            for poll in range(POLLS):
                sim.run(1.0)
                text = sim.text()
                for key, value in counters(text).items():  # the parser accepts it; counters never go back
                    assert value >= seen.get(key, value), (poll, key, seen[key], value)
                    seen[key] = value
                if poll % 50 == 0:
                    expositions.append(text)
        unexpected = [r.getMessage() for r in caplog.records if "unexpected" in r.getMessage()]
        assert unexpected == []  # every vendor code is handled, none escapes as a bug
        for text in expositions:
            lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
            assert lint.returncode == 0, lint.stdout + lint.stderr
        sim.node.faults.clear_failures()
        sim.run(70.0)  # past the longest backoff
        assert {sim.value("gpuwatch_gpu_up", gpu) for gpu in range(4)} == {1.0}
    finally:
        sim.close()


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_random_errors_in_the_running_agent_kill_no_thread(tmp_path: Path, vendor: str) -> None:
    live = LiveAgent(tmp_path, vendor=vendor, gpus=4)
    try:
        wait_for(lambda: live.get("/healthz")[0] == 200, what="healthy agent")
        threads = long_lived_threads()
        codes = NVML_CODES if vendor == "nvidia" else AMD_CODES
        for code in codes:
            live.node.faults.fail("*", code, rate=0.3 / len(codes))
        collector = live.agent.slots[0].name
        errors = live.metric("gpuwatch_collector_errors_total")
        last_run = live.metric("gpuwatch_collector_last_run_timestamp_seconds")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            status, text, _ = live.get("/metrics")
            assert status == 200
            list(text_string_to_metric_families(text))
            time.sleep(0.1)
        assert long_lived_threads() >= threads  # the HTTP server, the scheduler and the event thread live on
        later_errors = live.metric("gpuwatch_collector_errors_total")
        assert all(later_errors[labels] >= value for labels, value in errors.items())
        poll = frozenset({("collector", collector)})
        # Still polling: a later run ends. Waited for, not asserted at once: on a loaded machine APScheduler skips a
        # poll that would overlap the one still running, so the 3 s above may hold no finished run.
        wait_for(
            lambda: live.metric("gpuwatch_collector_last_run_timestamp_seconds")[poll] > last_run[poll],
            timeout=20,
            what="a poll to finish after the errors began",
        )
        live.node.faults.clear_failures()
        wait_for(lambda: set(live.up().values()) == {1.0}, timeout=30, what="all GPUs up again")
    finally:
        live.stop()


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_driver_unloaded_and_reloaded_brings_the_same_gpus_back(tmp_path: Path, vendor: str) -> None:
    sim = SimAgent(tmp_path, scenario="healthy", gpus=4, vendor=vendor)
    try:
        sim.run(3.0)
        before = {gpu: sim.gpu(gpu)["uuid"] for gpu in range(4)}
        # The driver goes away: every GPU is lost and the library cannot be opened again.
        for gpu in range(4):
            sim.node.faults.lose_gpu(gpu)
        sim.node.faults.set_library_missing(True)
        if vendor == "nvidia":
            sim.node.faults.fail("nvml*", NVML_ERROR_GPU_IS_LOST)
        sim.run(30.0)
        up = {labels: value for (name, labels), value in sim.samples().items() if name == "gpuwatch_gpu_up"}
        assert len(up) == 4 and set(up.values()) == {0.0}  # remembered GPUs stay exported, down
        assert sim.text().count("gpuwatch_gpu_temperature_celsius{") == 0  # no stale readings
        # The driver reload: library back, GPUs back, with the same UUIDs.
        sim.node.faults.clear()
        sim.run(70.0)  # past the longest retry backoff
        after = {gpu: sim.gpu(gpu)["uuid"] for gpu in range(4)}
        assert after == before
        up = {labels: value for (name, labels), value in sim.samples().items() if name == "gpuwatch_gpu_up"}
        assert len(up) == 4 and set(up.values()) == {1.0}  # no duplicates, all back
    finally:
        sim.close()


class NotifySocket:
    """A real AF_UNIX datagram socket standing in for systemd's $NOTIFY_SOCKET; records what arrives, when."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                continue

    def pings_since(self, since: float) -> int:
        return sum(1 for at, text in list(self.messages) if at >= since and "WATCHDOG=1" in text.splitlines())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_a_hung_vendor_call_stops_the_watchdog_pings(tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    watchdog = 8 * POLL  # pings at most every watchdog/4 = 2 polls
    notifier = ServiceNotifier(SdNotifier(str(notify.path), watchdog_seconds=watchdog))
    live = LiveAgent(tmp_path / "state", gpus=4, notifier=notifier)
    try:
        wait_for(lambda: live.get("/healthz")[0] == 200, what="healthy agent")
        wait_for(lambda: notify.pings_since(time.monotonic() - 1.0) >= 2, what="regular watchdog pings")
        assert any("READY=1" in text for _, text in notify.messages)
        live.node.faults.hang("*")
        assert live.node.faults.wait_until_blocked(1, timeout=5)
        wait_for(lambda: set(live.up().values()) == {0.0}, timeout=10, what="GPUs stale")
        status, body, _ = live.get("/healthz")
        assert status == 503, body
        quiet_from = time.monotonic()
        time.sleep(watchdog)  # a whole watchdog period without one ping: systemd would restart the agent
        assert notify.pings_since(quiet_from) == 0
        _, _, seconds = live.get("/metrics")
        assert seconds < 5.0  # the scrape reads the store, never the hung call (loose bound for CI)
        live.node.faults.release()
        resumed = time.monotonic()
        wait_for(lambda: notify.pings_since(resumed) >= 1, what="pings after the hang")
        wait_for(lambda: live.get("/healthz")[0] == 200, what="healthy again")
    finally:
        live.stop()
        notify.close()
