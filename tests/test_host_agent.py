"""Host sensors through the whole agent: the simulated node's hwmon tree and BMC read by the real readers, the
collectors on a machine without hwmon or a BMC, --disable-collector, and the CLI's check and snapshot."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from simnode import SimAgent

from gpuwatch.collectors.base import CollectorContext
from gpuwatch.collectors.configuration import load_config
from gpuwatch.collectors.host import build_host_sources
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.service.scheduling import Collectors
from gpuwatch.state.store import SampleStore

PSU1 = {"chip": "pmbus-i2c-7-58", "sensor": "vout1"}


def test_psu_undervoltage_shows_the_rail_below_its_lower_critical_in_metrics(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="psu_undervoltage")
    try:
        sim.run(10.0)
        volts = sim.value("gpuwatch_host_voltage_volts", **PSU1)
        minimum = sim.value("gpuwatch_host_voltage_min_volts", **PSU1)
        assert volts == 11.2 and minimum == 11.6  # in2_min, the PSU's VOUT_UV_WARN_LIMIT
        assert sim.value("gpuwatch_host_voltage_volts", chip="pmbus-i2c-7-59", sensor="vout1") == 12.08
        # the GPUs power-brake at the same time
        assert sim.value("gpuwatch_gpu_throttle_active", 0, reason="hw_power_brake") == 1.0
        assert sim.value("gpuwatch_collector_success", collector="hwmon") == 1.0
    finally:
        sim.close()


def test_psu_undervoltage_loses_redundancy_with_both_supplies_up(tmp_path: Path) -> None:
    """The BMC (read every 60 s) reports Redundancy Lost once the sag starts: the node draws more than one supply can
    carry, both supplies still up (HostPsuRedundancyLost without HostPsuFailed); PS2 carries more than PS1."""
    sim = SimAgent(tmp_path, scenario="psu_undervoltage")
    try:
        sim.run(65.0)
        assert sim.value("gpuwatch_host_psu_redundancy_lost") == 1.0
        assert [sim.value("gpuwatch_host_psu_up", psu=f"PS{n} Status") for n in (1, 2)] == [1.0, 1.0]
        assert sim.value("gpuwatch_host_psu_power_watts", psu="PS1 Status") == 2380.0
        assert sim.value("gpuwatch_host_psu_power_watts", psu="PS2 Status") == 3290.0
    finally:
        sim.close()


def test_healthy_node_has_rails_over_their_limits_supplies_up_temperatures_and_fans(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="healthy")
    try:
        sim.run(10.0)
        assert sim.value("gpuwatch_host_voltage_volts", **PSU1) == 12.1
        assert sim.value("gpuwatch_host_voltage_nominal_volts", chip="ipmi", sensor="12V") == 12.0
        assert sim.value("gpuwatch_host_psu_up", psu="PS1 Status") == 1.0
        assert sim.value("gpuwatch_host_psu_up", psu="PS2 Status") == 1.0
        # per-supply input power under the psu names of gpuwatch_host_psu_up; the BMC says fully redundant
        assert sim.value("gpuwatch_host_psu_power_watts", psu="PS1 Status") == 612.0
        assert sim.value("gpuwatch_host_psu_power_watts", psu="PS2 Status") == 598.0
        assert sim.value("gpuwatch_host_psu_redundancy_lost") == 0.0
        assert sim.value("gpuwatch_host_temperature_celsius", chip="coretemp-isa-0000", sensor="Package id 0") == 41
        assert sim.value("gpuwatch_host_fan_rpm", chip="pmbus-i2c-7-58", sensor="fan1") == 6400
        assert sim.value("gpuwatch_host_voltage_volts", chip="ipmi", sensor="VBAT") is None
        assert sim.value("gpuwatch_collector_interval_seconds", collector="hwmon") == 5.0
        assert sim.value("gpuwatch_collector_interval_seconds", collector="ipmi") == 60.0
    finally:
        sim.close()


def test_disabled_host_collectors_export_nothing(tmp_path: Path) -> None:
    # fabric too: the NVSwitches and the fabric manager are the host's (gpuwatch_host_nvswitches)
    sim = SimAgent(tmp_path, scenario="healthy", disable_collectors=["hwmon", "ipmi", "fabric"])
    try:
        sim.run(3.0)
        assert not any(name.startswith("gpuwatch_host_") for name, _ in sim.samples())
        assert sim.value("gpuwatch_collector_success", collector="hwmon") is None
        assert sim.value("gpuwatch_collector_success", collector="fabric") is None
    finally:
        sim.close()


def registered_collectors(config: Config) -> tuple[Collectors, SampleStore]:
    """The registry's collectors of a node with no GPU backend and the host sources of `config`, registered."""
    store = SampleStore(poll_interval_seconds=1.0)
    sources = NodeSources([], dict, None, host=build_host_sources(config))
    context = CollectorContext(lambda: config, sources, store, [], time.time, time.monotonic, threading.Event())
    collectors = Collectors.build(context)
    collectors.register()
    return collectors, store


def test_a_machine_without_hwmon_or_bmc_succeeds_with_no_series(tmp_path: Path) -> None:
    overrides = {
        "agent": {"state_dir": str(tmp_path)},
        "host": {"sysfs_root": str(tmp_path / "empty-sys"), "ipmitool": str(tmp_path / "no-ipmitool")},
    }
    collectors, store = registered_collectors(load_config(None, overrides))
    collectors.run_job("host-hwmon")
    collectors.run_job("host-ipmi")
    snap = store.snapshot()
    assert {name: snap.collectors[name].success for name in ("hwmon", "ipmi")} == {"hwmon": True, "ipmi": True}
    assert all(not (s.voltages or s.psus or s.temperatures or s.fans) for s in snap.host)


def test_a_required_bmc_that_is_missing_is_a_failing_collector(tmp_path: Path) -> None:
    overrides = {"agent": {"state_dir": str(tmp_path)}, "host": {"ipmi": "on", "ipmitool": str(tmp_path / "none")}}
    collectors, store = registered_collectors(load_config(None, overrides))
    assert collectors.run_job("host-ipmi") is False
    assert store.snapshot().collectors["ipmi"].errors_total == 1


def gpuwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True, text=True, timeout=120)


def test_check_says_which_host_sources_it_found(tmp_path: Path) -> None:
    result = gpuwatch("check", "--backend", "simulated", "--state-dir", str(tmp_path), "--listen", "127.0.0.1:0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[ok] host hwmon:" in result.stdout and "[ok] host ipmi: simulated BMC" in result.stdout


def test_snapshot_json_shows_rails_supplies_and_temperatures(tmp_path: Path) -> None:
    result = gpuwatch("snapshot", "--backend", "simulated", "--scenario", "healthy", "--json")
    assert result.returncode == 0, result.stderr
    host = json.loads(result.stdout)["host"]
    rails = {(v["chip"], v["sensor"]): v for v in host["voltages"]}
    assert rails[("pmbus-i2c-7-58", "vout1")]["min_volts"] == 11.6
    assert {p["psu"]: p["up"] for p in host["psus"]} == {"PS1 Status": True, "PS2 Status": True}
    assert {p["psu"]: p["watts"] for p in host["psu_power"]} == {"PS1 Status": 612.0, "PS2 Status": 598.0}
    assert host["psu_redundancy_lost"] is False
    assert any(t["chip"] == "nvme-pci-0100" for t in host["temperatures"])
    table = gpuwatch("snapshot", "--backend", "simulated", "--scenario", "healthy")
    assert re.search(r"pmbus-i2c-7-58 vout1 +12\.\d+ +11\.600 +12\.000  ok", table.stdout), table.stdout
    assert re.search(r"PS1 Status +612  up", table.stdout) and re.search(r"PS2 Status +598  up", table.stdout)
    assert "power-supply redundancy: ok" in table.stdout
