"""The node's side of the NVLink fabric (issue #34; gpuwatch/collectors/fabric.py): whether nv-fabricmanager runs
where NVSwitches need it, read from the real process table, and what the agent makes of it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import until
from simnode import SimAgent

from gpuwatch.judge.findings import gpu_health, node_findings
from gpuwatch.readers.fabric_manager import DAEMON, process_running


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process named as NVIDIA's package installs the daemon (/usr/bin/nv-fabricmanager): 16 characters, one
    more than the kernel keeps in a process's comm, so the name is read in full or not at all."""
    binary = tmp_path / DAEMON
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    process = subprocess.Popen([str(binary), "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_the_daemon_is_found_by_its_full_name_and_gone_once_it_exits(daemon: subprocess.Popen[bytes]) -> None:
    assert len(DAEMON) == 16
    until("the daemon in the process table", lambda: process_running(DAEMON), 5)
    assert not process_running(DAEMON[:15])  # the truncated comm alone is not the daemon's name
    daemon.kill()
    daemon.wait()
    assert not process_running(DAEMON)


def test_an_nvswitch_node_exports_the_daemons_state_and_its_absence_is_a_node_finding(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, "fabric_degraded")
    try:
        sim.run(2)
        assert sim.value("gpuwatch_host_nvswitches") == 4.0
        assert sim.value("gpuwatch_host_fabric_manager_running") == 1.0
        assert not [f for f in node_findings(sim.agent.store.snapshot()) if f.alert == "NvidiaFabricManagerDown"]
        sim.node.faults.stop_fabric_manager()
        sim.run(31)  # the collector's 30 s
        assert sim.value("gpuwatch_host_fabric_manager_running") == 0.0
        down = [f for f in node_findings(sim.agent.store.snapshot()) if f.alert == "NvidiaFabricManagerDown"]
        assert len(down) == 1 and down[0].level == "bad"
        assert "not running on a node with 4 NVSwitch(es)" in down[0].text
        healthy, why = gpu_health(sim.agent.store.snapshot())  # /health/gpus: 503, saying why
        assert not healthy and "nvidia-fabricmanager is not running" in why
    finally:
        sim.close()


def test_a_node_without_nvswitches_needs_no_fabric_manager(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, "healthy")
    try:
        sim.run(2)
        assert sim.value("gpuwatch_host_nvswitches") == 0.0
        assert sim.value("gpuwatch_host_fabric_manager_running") is None
    finally:
        sim.close()
