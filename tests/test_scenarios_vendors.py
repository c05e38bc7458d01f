"""One scenario suite for both vendors: the real agent and the real NVML or AMD SMI backend over the same simulated
node, 30 s at a 1 s poll. For every scenario meaningful on both, the alert-relevant series have the same names and
labels and the same shape; values differ only as the hardware does (an MI300X hotspot runs hotter, against a
higher limit). Where AMD has no equivalent (power brake, XID, row remapping) its nearest signal is checked. AMD runs
twice: over amdsmi 7.0.2 and 6.4.3, each AMD's own package over the simulated libamd_smi.so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from amd_releases import RELEASES
from simnode import SimAgent

from gpuwatch.core.scenario_catalogue import FAULT_GPU
from gpuwatch.simulated.node import VERSION_ENV

VENDORS = ("nvidia", "amd")
BACKEND = {"nvidia": "nvml", "amd": "amdsmi"}
# Series the alert rules read, with the labels they select on: every GPU of both vendors has each of them.
ALERT_SERIES: tuple[tuple[str, dict[str, str]], ...] = (
    ("gpuwatch_gpu_up", {}),
    ("gpuwatch_gpu_temperature_celsius", {"sensor": "core"}),
    ("gpuwatch_gpu_temperature_celsius", {"sensor": "memory"}),
    ("gpuwatch_gpu_temperature_threshold_celsius", {"sensor": "core", "threshold": "slowdown"}),
    ("gpuwatch_gpu_temperature_threshold_celsius", {"sensor": "memory", "threshold": "max_operating"}),
    ("gpuwatch_gpu_power_watts", {}),
    ("gpuwatch_gpu_power_limit_watts", {"limit": "enforced"}),
    ("gpuwatch_gpu_power_limit_watts", {"limit": "default"}),
    ("gpuwatch_gpu_energy_joules_total", {}),
    ("gpuwatch_gpu_throttle_seconds_total", {"reason": "hw_slowdown"}),
    ("gpuwatch_gpu_throttle_seconds_total", {"reason": "sw_thermal"}),
    ("gpuwatch_gpu_utilization_ratio", {}),
    ("gpuwatch_gpu_memory_used_bytes", {}),
    ("gpuwatch_gpu_memory_total_bytes", {}),
    ("gpuwatch_gpu_processes", {}),
    ("gpuwatch_gpu_ecc_errors_total", {"type": "uncorrected"}),
    ("gpuwatch_gpu_pcie_link_generation", {"link": "current"}),
    ("gpuwatch_gpu_pcie_link_generation", {"link": "max"}),
    ("gpuwatch_gpu_pcie_link_width", {"link": "current"}),
    ("gpuwatch_gpu_pcie_link_width", {"link": "max"}),
    ("gpuwatch_gpu_pcie_replays_total", {}),
    ("gpuwatch_gpu_pcie_link_recoveries_total", {}),
)
# NVIDIA only: hardware thermal slowdown (clocks cut by half or more). AMD SMI has no such signal: its thermal
# residencies are the firmware's own temperature control (sw_thermal), and GpuOverheating reads an AMD GPU's hotspot
# against its slowdown limit instead.
NVIDIA_ALERT_SERIES: tuple[tuple[str, dict[str, str]], ...] = (
    ("gpuwatch_gpu_throttle_seconds_total", {"reason": "hw_thermal"}),
)
# gpuwatch_gpu_throttle_active is served only while its reason holds (the rules read `== 1`; the time is
# gpuwatch_gpu_throttle_seconds_total's, above): docs/cost-and-sizing.md, "The series budget".


@pytest.fixture
def sim(tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimAgent]:
    vendor, scenario, release = request.param
    if release:
        monkeypatch.setenv(VERSION_ENV, release)  # the amdsmi release the simulated node runs
    agent = SimAgent(tmp_path, scenario=scenario, vendor=vendor)
    agent.run(30.0)
    yield agent
    agent.close()


def scenario(name: str) -> pytest.MarkDecorator:
    """NVIDIA once, AMD over every amdsmi release (skipped where a release is not extracted)."""
    params = [pytest.param(("nvidia", name, ""), id="nvidia")]
    for release in RELEASES:
        (version,), marks = release.values, release.marks  # type: ignore[attr-defined]
        params.append(pytest.param(("amd", name, version), id=f"amd-{version}", marks=marks))
    return pytest.mark.parametrize("sim", params, indirect=True)


def vendor_of(sim: SimAgent) -> str:
    return sim.node.vendor


def value(sim: SimAgent, name: str, gpu: int, **labels: str) -> float:
    found = sim.value(name, gpu, **labels)
    assert found is not None, f"{vendor_of(sim)}: no {name}{labels} for GPU {gpu}"
    return found


def thermal_seconds(sim: SimAgent, gpu: int) -> float:
    return sum(
        sim.value("gpuwatch_gpu_throttle_seconds_total", gpu, reason=r) or 0.0 for r in ("sw_thermal", "hw_thermal")
    )


def assert_healthy(sim: SimAgent, gpu: int) -> None:
    """What every health alert reads stays quiet (GpuOverheating, GpuTemperatureHigh, GpuThermalThrottling, …)."""
    assert value(sim, "gpuwatch_gpu_up", gpu) == 1.0
    core = value(sim, "gpuwatch_gpu_temperature_celsius", gpu, sensor="core")
    assert core < value(sim, "gpuwatch_gpu_temperature_threshold_celsius", gpu, sensor="core", threshold="slowdown") - 5
    memory = value(sim, "gpuwatch_gpu_temperature_celsius", gpu, sensor="memory")
    limit = value(sim, "gpuwatch_gpu_temperature_threshold_celsius", gpu, sensor="memory", threshold="max_operating")
    assert memory < limit - 5
    assert thermal_seconds(sim, gpu) == 0.0
    for reason in ("hw_slowdown", "hw_power_brake"):
        assert (sim.value("gpuwatch_gpu_throttle_seconds_total", gpu, reason=reason) or 0.0) == 0.0
    assert value(sim, "gpuwatch_gpu_power_limit_watts", gpu, limit="enforced") == value(
        sim, "gpuwatch_gpu_power_limit_watts", gpu, limit="default"
    )
    assert value(sim, "gpuwatch_gpu_ecc_errors_total", gpu, type="uncorrected") == 0.0


def others() -> list[int]:
    return [i for i in range(8) if i != FAULT_GPU]


@scenario("healthy")
def test_healthy_has_every_alert_series_on_every_gpu(sim: SimAgent) -> None:
    for gpu in range(8):
        for name, labels in ALERT_SERIES + (NVIDIA_ALERT_SERIES if vendor_of(sim) == "nvidia" else ()):
            value(sim, name, gpu, **labels)
        if vendor_of(sim) == "amd":
            assert all(sim.value(name, gpu, **labels) is None for name, labels in NVIDIA_ALERT_SERIES)
        assert_healthy(sim, gpu)
        assert value(sim, "gpuwatch_gpu_processes", gpu) == 0.0
        modes = [dict(labels) for name, labels in sim.samples() if name == "gpuwatch_gpu_modes_info"]
        assert [m["mig"] for m in modes if m["gpu"] == str(gpu)] == ["0"]  # MIG and AMD partitions: the info's
    assert sim.value("gpuwatch_backend_up", backend=BACKEND[vendor_of(sim)]) == 1.0
    assert sim.value("gpuwatch_gpus_detected") == 8.0
    assert sim.value("gpuwatch_gpus_expected", vendor=vendor_of(sim)) == 8.0
    assert sim.agent.health() == (True, "ok")


@scenario("busy")
def test_busy_at_the_power_cap_is_healthy(sim: SimAgent) -> None:
    for gpu in range(8):
        assert_healthy(sim, gpu)
        assert value(sim, "gpuwatch_gpu_utilization_ratio", gpu) >= 0.9
        assert value(sim, "gpuwatch_gpu_processes", gpu) >= 1
        assert value(sim, "gpuwatch_gpu_throttle_active", gpu, reason="sw_power_cap") == 1.0
        assert value(sim, "gpuwatch_gpu_throttle_seconds_total", gpu, reason="sw_power_cap") > 20.0
        enforced = value(sim, "gpuwatch_gpu_power_limit_watts", gpu, limit="enforced")
        assert value(sim, "gpuwatch_gpu_power_watts", gpu) >= 0.97 * enforced
    if vendor_of(sim) == "amd":  # "an MI300X hotspot in the 80s-90s under load, well under its own threshold"
        assert 80 <= value(sim, "gpuwatch_gpu_temperature_celsius", 0, sensor="core") < 95


@scenario("overheating")
def test_overheating(sim: SimAgent) -> None:
    """Past the slowdown limit. NVIDIA: hardware thermal slowdown. AMD: the firmware holds the socket at its thermal
    limit all the time (socket thermal residency, TVIOL in amdsmi.h: sw_thermal); AMD SMI has no hardware-slowdown
    signal, so GpuOverheating fires on the hotspot against its slowdown limit."""
    core = value(sim, "gpuwatch_gpu_temperature_celsius", FAULT_GPU, sensor="core")
    assert core >= value(
        sim, "gpuwatch_gpu_temperature_threshold_celsius", FAULT_GPU, sensor="core", threshold="slowdown"
    )
    if vendor_of(sim) == "nvidia":
        assert value(sim, "gpuwatch_gpu_throttle_active", FAULT_GPU, reason="hw_thermal") == 1.0
    else:
        assert value(sim, "gpuwatch_gpu_throttle_active", FAULT_GPU, reason="sw_thermal") == 1.0
        assert sim.value("gpuwatch_gpu_throttle_active", FAULT_GPU, reason="hw_thermal") is None
    before = thermal_seconds(sim, FAULT_GPU)
    assert before > 5.0
    sim.run(10.0)
    assert thermal_seconds(sim, FAULT_GPU) >= before + 9.0
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("memory_overheating")
def test_memory_overheating(sim: SimAgent) -> None:
    memory = value(sim, "gpuwatch_gpu_temperature_celsius", FAULT_GPU, sensor="memory")
    limit = value(
        sim, "gpuwatch_gpu_temperature_threshold_celsius", FAULT_GPU, sensor="memory", threshold="max_operating"
    )
    assert limit - 5 <= memory <= limit + 3
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("thermal_throttling")
def test_thermal_throttling(sim: SimAgent) -> None:
    assert thermal_seconds(sim, FAULT_GPU) > 0.1 * 30
    core = value(sim, "gpuwatch_gpu_temperature_celsius", FAULT_GPU, sensor="core")
    assert core < value(
        sim, "gpuwatch_gpu_temperature_threshold_celsius", FAULT_GPU, sensor="core", threshold="slowdown"
    )
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("power_limit_low")
def test_power_limit_low(sim: SimAgent) -> None:
    enforced = value(sim, "gpuwatch_gpu_power_limit_watts", FAULT_GPU, limit="enforced")
    assert enforced < 0.95 * value(sim, "gpuwatch_gpu_power_limit_watts", FAULT_GPU, limit="default")
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("power_brake")
def test_power_brake(sim: SimAgent) -> None:
    """NVIDIA: the power brake. AMD has no power-brake signal; an external slowdown asserts PROCHOT (hw_slowdown)."""
    assert value(sim, "gpuwatch_gpu_throttle_seconds_total", FAULT_GPU, reason="hw_slowdown") > 20.0
    brake = sim.value("gpuwatch_gpu_throttle_seconds_total", FAULT_GPU, reason="hw_power_brake")
    if vendor_of(sim) == "nvidia":
        assert brake is not None and brake > 20.0
    else:
        assert brake is None  # never reported: AMD cannot tell
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("pcie_degraded")
def test_pcie_degraded_under_load(sim: SimAgent) -> None:
    gen = value(sim, "gpuwatch_gpu_pcie_link_generation", FAULT_GPU, link="current")
    width = value(sim, "gpuwatch_gpu_pcie_link_width", FAULT_GPU, link="current")
    assert gen < value(sim, "gpuwatch_gpu_pcie_link_generation", FAULT_GPU, link="max") or width < value(
        sim, "gpuwatch_gpu_pcie_link_width", FAULT_GPU, link="max"
    )
    assert value(sim, "gpuwatch_gpu_utilization_ratio", FAULT_GPU) > 0.5
    replays = value(sim, "gpuwatch_gpu_pcie_replays_total", FAULT_GPU)
    sim.run(60.0)
    assert value(sim, "gpuwatch_gpu_pcie_replays_total", FAULT_GPU) > replays
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("ecc_uncorrectable")
def test_ecc_uncorrectable(sim: SimAgent) -> None:
    before = value(sim, "gpuwatch_gpu_ecc_errors_total", FAULT_GPU, type="uncorrected")
    assert before >= 1
    sim.run(60.0)
    assert value(sim, "gpuwatch_gpu_ecc_errors_total", FAULT_GPU, type="uncorrected") > before
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("gpu_lost")
def test_gpu_lost(sim: SimAgent) -> None:
    assert value(sim, "gpuwatch_gpu_up", FAULT_GPU) == 0.0
    lost = sim.gpu(FAULT_GPU)["uuid"]
    # No reading of a lost GPU is exported: its identity, up = 0, and its verdict (docs/verdicts.md: GpuLost asks for a
    # reboot), which a scheduler reads to keep jobs off it.
    exported = {name for name, labels in sim.samples() if ("uuid", lost) in labels}
    assert exported == {
        "gpuwatch_gpu_info",
        "gpuwatch_gpu_up",
        "gpuwatch_gpu_health",
        "gpuwatch_gpu_recommended_action",
    }
    assert value(sim, "gpuwatch_gpu_health", FAULT_GPU, state="unhealthy") == 1.0
    assert value(sim, "gpuwatch_gpu_recommended_action", FAULT_GPU, action="reboot_node") == 1.0
    assert sim.value("gpuwatch_gpus_detected") == 7.0
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("backend_down")
def test_backend_down_then_the_library_arrives(sim: SimAgent) -> None:
    backend = BACKEND[vendor_of(sim)]
    assert sim.value("gpuwatch_backend_up", backend=backend) == 0.0
    assert sim.value("gpuwatch_gpus_expected", vendor=vendor_of(sim)) == 8.0
    assert sim.value("gpuwatch_gpus_detected") == 0.0
    sim.node.faults.set_library_missing(False)
    sim.run(70.0)
    assert sim.value("gpuwatch_backend_up", backend=backend) == 1.0
    assert sim.value("gpuwatch_gpus_detected") == 8.0


@scenario("xid")
def test_xid_or_its_amd_counterpart_a_reset(sim: SimAgent) -> None:
    if vendor_of(sim) == "nvidia":
        assert value(sim, "gpuwatch_gpu_xid_errors_total", FAULT_GPU, xid="79") >= 1
        return
    assert value(sim, "gpuwatch_gpu_reset_events_total", FAULT_GPU) == 2.0  # the scenario's two events
    for gpu in others():
        assert value(sim, "gpuwatch_gpu_reset_events_total", gpu) == 0.0  # exists from start-up at 0


@scenario("row_remap_failure")
def test_row_remap_or_its_amd_counterpart_bad_pages(sim: SimAgent) -> None:
    if vendor_of(sim) == "nvidia":
        assert value(sim, "gpuwatch_gpu_row_remap_failed", FAULT_GPU) == 1.0
        return
    assert value(sim, "gpuwatch_gpu_retired_pages", FAULT_GPU) >= 1
    for gpu in others():
        assert value(sim, "gpuwatch_gpu_retired_pages", gpu) == 0.0
