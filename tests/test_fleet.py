"""simulate-fleet: the command line's validation, and a fleet in several real processes serving real agents."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port_range

from gpuwatch.cli.fleet import FleetError, make_plan, parse_fault, parse_node_config
from gpuwatch.simulated.scenarios import SimulatedNode


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3", "expected NODE=SCENARIO"),
        ("9=overheating", "no node 9"),
        ("x=overheating", "neither a number"),
        ("1=melting", "unknown scenario"),
        ("1/7=overheating", "no GPU 7"),
        ("1/2=backend_down", "whole node"),
    ],
)
def test_bad_faults_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        parse_fault(text, nodes=4, gpus=4)


def test_faults_by_number_and_name() -> None:
    plan = make_plan(nodes=4, gpus=4, port_base=20000, faults=["node-002=power_brake", "3/1=gpu_lost"])
    assert plan.scenario_of(2) == "power_brake" and plan.scenario_of(3) == "healthy"
    assert plan.gpu_scenarios_of(3) == {1: "gpu_lost"}
    with pytest.raises(FleetError, match="two scenarios"):
        make_plan(nodes=4, gpus=4, port_base=20000, faults=["1=busy", "1=xid"])
    assert make_plan(nodes=1, gpus=1, port_base=20000, vendor="amd").vendor == "amd"
    with pytest.raises(FleetError, match="expected nvidia or amd"):
        make_plan(nodes=1, gpus=1, port_base=20000, vendor="intel")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3", "expected NODE=FILE"),
        ("=fast.toml", "expected NODE=FILE"),
        ("9=fast.toml", "no node 9"),
        ("x=fast.toml", "neither a number"),
    ],
)
def test_bad_node_configs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        parse_node_config(text, nodes=4)


def test_a_node_config_replaces_the_fleet_config_for_that_node_only() -> None:
    plan = make_plan(
        nodes=3, gpus=1, port_base=20000, config_path=Path("fleet.toml"), node_configs=["node-002=fast.toml"]
    )
    assert [plan.config_of(i) for i in range(3)] == [Path("fleet.toml"), Path("fleet.toml"), Path("fast.toml")]
    with pytest.raises(FleetError, match="node 1 is given two config files"):
        make_plan(nodes=3, gpus=1, port_base=20000, node_configs=["1=a.toml", "node-001=b.toml"])


def test_a_gpu_scenario_faults_only_that_gpu() -> None:
    node = SimulatedNode("healthy", gpus=4, gpu_scenarios={1: "power_limit_low"})
    assert node.fault_gpus == (1,)
    assert node.plan(1).power_limit_watts == 450.0 and node.plan(1).busy


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_fleet_in_several_processes_serves_every_node(tmp_path: Path, vendor: str) -> None:
    base = free_port_range(3)
    targets = tmp_path / "targets.json"
    cmd = [sys.executable, "-m", "gpuwatch", "simulate-fleet", "--nodes", "3", "--gpus", "2", "--port-base", str(base)]
    cmd += ["--vendor", vendor]
    cmd += ["--targets", str(targets), "--nodes-per-process", "2", "--state-dir", str(tmp_path / "state")]
    cmd += ["--fault", "1/1=gpu_lost"]
    (tmp_path / "fleet.toml").write_text("[probe]\ninterval_seconds = 600.0\n")
    (tmp_path / "fast.toml").write_text("[probe]\ninterval_seconds = 30.0\n")
    cmd += ["--config", str(tmp_path / "fleet.toml"), "--node-config", f"2={tmp_path / 'fast.toml'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not targets.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "no targets file within 60 s"
            time.sleep(0.2)
        doc = json.loads(targets.read_text())
        assert [t["labels"]["node"] for t in doc] == ["node-000", "node-001", "node-002"]
        uuids = set()
        for i, entry in enumerate(doc):
            assert entry["targets"] == [f"127.0.0.1:{base + i}"]
            with urllib.request.urlopen(f"http://127.0.0.1:{base + i}/metrics", timeout=10) as r:
                text = r.read().decode()
            uuids |= {line.split('uuid="')[1].split('"')[0] for line in text.splitlines() if "gpuwatch_gpu_up{" in line}
            assert f'vendor="{vendor}"' in text
            interval = 30.0 if i == 2 else 600.0  # node 2 reads its own file, the others the fleet's
            assert f"gpuwatch_probe_interval_seconds {interval}" in text.splitlines()
        assert len(uuids) == 6, "every GPU of the fleet has its own UUID"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "in 2 process(es)" in out
    assert not targets.exists(), "the targets file goes with the fleet"
