"""Every simulated scenario shows its fault in /metrics the way the real fault would, within 30 s at a 1 s poll,
and the GPUs it does not fault stay healthy — the real agent, backend and collector over the simulated pynvml."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from simnode import SimAgent

from gpuwatch.core.model import FABRIC_CONDITIONS
from gpuwatch.core.scenario_catalogue import FAULT_GPU, SCENARIOS
from gpuwatch.judge.gpu_verdict import gpu_verdicts

HARDWARE_REASONS = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")


@pytest.fixture
def sim(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SimAgent]:
    agent = SimAgent(tmp_path, scenario=request.param)
    agent.run(30.0)
    yield agent
    agent.close()


def scenario(name: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("sim", [name], indirect=True)


def throttled(sim: SimAgent, gpu: int, reason: str) -> bool:
    return sim.value("gpuwatch_gpu_throttle_active", gpu, reason=reason) == 1.0


def seconds(sim: SimAgent, gpu: int, reason: str) -> float:
    return sim.value("gpuwatch_gpu_throttle_seconds_total", gpu, reason=reason) or 0.0


def assert_healthy(sim: SimAgent, gpu: int) -> None:
    assert sim.value("gpuwatch_gpu_up", gpu) == 1.0
    core = sim.value("gpuwatch_gpu_temperature_celsius", gpu, sensor="core")
    slowdown = sim.value("gpuwatch_gpu_temperature_threshold_celsius", gpu, sensor="core", threshold="slowdown")
    assert core is not None and slowdown is not None and core < slowdown - 5
    for reason in HARDWARE_REASONS:
        assert not throttled(sim, gpu, reason), reason
        assert seconds(sim, gpu, reason) == 0.0, reason
    enforced = sim.value("gpuwatch_gpu_power_limit_watts", gpu, limit="enforced")
    default = sim.value("gpuwatch_gpu_power_limit_watts", gpu, limit="default")
    assert enforced == default
    assert sim.value("gpuwatch_gpu_ecc_errors_total", gpu, type="uncorrected") == 0.0
    assert sim.value("gpuwatch_gpu_row_remap_failed", gpu) == 0.0


def others(fault: int = FAULT_GPU) -> list[int]:
    return [i for i in range(8) if i != fault]


def test_every_scenario_of_the_spec_exists() -> None:
    spec = {
        "healthy", "mixed", "busy", "overheating", "memory_overheating", "thermal_throttling", "power_brake",
        "power_limit_low", "psu_undervoltage", "underperforming", "pcie_degraded", "xid", "ecc_uncorrectable",
        "row_remap_failure", "gpu_lost", "backend_down",
        "training", "dataloader_starved", "idle_allocated",  # issue 17: real utilization
        "nvml_hang",  # issue 30: a vendor call that never returns
        "corrupt",  # issue 33: a GPU whose matmul results are wrong
        "fabric_degraded",  # issue 34: an NVSwitch node whose GPU's fabric runs degraded
        "ib_port_down", "ib_flapping",  # issue 34: the NIC beside GPU 2 loses its link, or keeps losing it
        "mig",  # issue 35: GPU 2 split into MIG instances, a job in one (tests/test_mig.py)
    }  # fmt: skip
    assert set(SCENARIOS) == spec


@scenario("healthy")
def test_healthy(sim: SimAgent) -> None:
    for gpu in range(8):
        assert_healthy(sim, gpu)
        assert throttled(sim, gpu, "gpu_idle")
        assert sim.value("gpuwatch_gpu_processes", gpu) == 0.0
    assert sim.value("gpuwatch_gpus_detected") == 8.0
    assert sim.agent.health() == (True, "ok")


@scenario("busy")
def test_busy_is_healthy_at_the_power_cap(sim: SimAgent) -> None:
    for gpu in range(8):
        assert_healthy(sim, gpu)
        assert (sim.value("gpuwatch_gpu_processes", gpu) or 0) >= 1
        assert (sim.value("gpuwatch_gpu_utilization_ratio", gpu) or 0) >= 0.9
        assert throttled(sim, gpu, "sw_power_cap")
        power = sim.value("gpuwatch_gpu_power_watts", gpu) or 0
        assert power >= 0.97 * (sim.value("gpuwatch_gpu_power_limit_watts", gpu, limit="enforced") or 1)
        assert seconds(sim, gpu, "sw_power_cap") > 20.0
        sm = sim.value("gpuwatch_gpu_clock_hertz", gpu, clock="sm") or 0
        assert 1.3e9 <= sm <= 1.45e9


@scenario("overheating")
def test_overheating(sim: SimAgent) -> None:
    core = sim.value("gpuwatch_gpu_temperature_celsius", FAULT_GPU, sensor="core") or 0
    slowdown = sim.value("gpuwatch_gpu_temperature_threshold_celsius", FAULT_GPU, sensor="core", threshold="slowdown")
    assert slowdown is not None and core >= slowdown
    assert throttled(sim, FAULT_GPU, "hw_thermal")
    before = seconds(sim, FAULT_GPU, "hw_thermal")
    assert before > 5.0
    sim.run(10.0)
    assert seconds(sim, FAULT_GPU, "hw_thermal") >= before + 9.0
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("memory_overheating")
def test_memory_overheating(sim: SimAgent) -> None:
    memory = sim.value("gpuwatch_gpu_temperature_celsius", FAULT_GPU, sensor="memory") or 0
    limit = sim.value(
        "gpuwatch_gpu_temperature_threshold_celsius", FAULT_GPU, sensor="memory", threshold="max_operating"
    )
    assert limit is not None and memory >= limit - 5
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("thermal_throttling")
def test_thermal_throttling(sim: SimAgent) -> None:
    thermal = seconds(sim, FAULT_GPU, "sw_thermal") + seconds(sim, FAULT_GPU, "hw_thermal")
    assert thermal > 0.1 * 30
    core = sim.value("gpuwatch_gpu_temperature_celsius", FAULT_GPU, sensor="core") or 0
    assert core < (
        sim.value("gpuwatch_gpu_temperature_threshold_celsius", FAULT_GPU, sensor="core", threshold="slowdown") or 0
    )
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("power_brake")
def test_power_brake(sim: SimAgent) -> None:
    assert throttled(sim, FAULT_GPU, "hw_power_brake")
    assert seconds(sim, FAULT_GPU, "hw_power_brake") > 20.0
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("psu_undervoltage")
def test_psu_undervoltage_brakes_every_gpu(sim: SimAgent) -> None:
    for gpu in range(8):
        assert seconds(sim, gpu, "hw_power_brake") > 20.0


@scenario("power_limit_low")
def test_power_limit_low(sim: SimAgent) -> None:
    enforced = sim.value("gpuwatch_gpu_power_limit_watts", FAULT_GPU, limit="enforced") or 0
    default = sim.value("gpuwatch_gpu_power_limit_watts", FAULT_GPU, limit="default") or 0
    assert enforced < 0.95 * default
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("pcie_degraded")
def test_pcie_degraded_under_load(sim: SimAgent) -> None:
    gen = sim.value("gpuwatch_gpu_pcie_link_generation", FAULT_GPU, link="current") or 0
    width = sim.value("gpuwatch_gpu_pcie_link_width", FAULT_GPU, link="current") or 0
    assert gen < (sim.value("gpuwatch_gpu_pcie_link_generation", FAULT_GPU, link="max") or 0) or width < (
        sim.value("gpuwatch_gpu_pcie_link_width", FAULT_GPU, link="max") or 0
    )
    assert (sim.value("gpuwatch_gpu_utilization_ratio", FAULT_GPU) or 0) > 0.5
    replays = sim.value("gpuwatch_gpu_pcie_replays_total", FAULT_GPU) or 0
    sim.run(60.0)  # the slow tier re-reads PCIe counters every 30 s
    assert (sim.value("gpuwatch_gpu_pcie_replays_total", FAULT_GPU) or 0) > replays
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("xid")
def test_xid(sim: SimAgent) -> None:
    assert (sim.value("gpuwatch_gpu_xid_errors_total", FAULT_GPU, xid="79") or 0) >= 1
    last = sim.value("gpuwatch_gpu_xid_last_timestamp_seconds", FAULT_GPU, xid="79") or 0
    assert 0 <= sim.clock.wall() - last <= 30
    assert (sim.value("gpuwatch_gpu_xid_errors_total", FAULT_GPU, xid="13") or 0) >= 1
    for gpu in others():
        assert not any(
            name == "gpuwatch_gpu_xid_errors_total" and ("gpu", str(gpu)) in labels for name, labels in sim.samples()
        )


@scenario("ecc_uncorrectable")
def test_ecc_uncorrectable(sim: SimAgent) -> None:
    before = sim.value("gpuwatch_gpu_ecc_errors_total", FAULT_GPU, type="uncorrected") or 0
    assert before >= 1
    sim.run(60.0)
    assert (sim.value("gpuwatch_gpu_ecc_errors_total", FAULT_GPU, type="uncorrected") or 0) > before
    for gpu in others():
        assert_healthy(sim, gpu)


@scenario("row_remap_failure")
def test_row_remap_failure(sim: SimAgent) -> None:
    assert sim.value("gpuwatch_gpu_row_remap_failed", FAULT_GPU) == 1.0
    assert sim.value("gpuwatch_gpu_recovery_action", FAULT_GPU) == 1.0
    for gpu in others():
        assert_healthy(sim, gpu)
        assert sim.value("gpuwatch_gpu_recovery_action", gpu) == 0.0


@scenario("fabric_degraded")
def test_fabric_degraded_shows_its_conditions_and_only_on_its_gpu(sim: SimAgent) -> None:
    """nvmlGpuFabricInfo_v3 (nvidia-ml-py 13.615.71 pynvml.py): the mask's DEGRADED_BW TRUE and the summary
    LIMITED_CAPACITY on the faulted GPU; every condition the mask and summary report is exported on each GPU."""
    for gpu in range(8):
        assert sim.value("gpuwatch_gpu_fabric_healthy", gpu) == 1.0  # registered: the fabric runs, degraded
        assert sim.value("gpuwatch_gpu_nvlinks_up", gpu) == sim.value("gpuwatch_gpu_nvlinks_expected", gpu) == 18.0
        holding = {c for c in FABRIC_CONDITIONS if sim.value("gpuwatch_gpu_fabric_health", gpu, condition=c) == 1.0}
        served = {c for c in FABRIC_CONDITIONS if sim.value("gpuwatch_gpu_fabric_health", gpu, condition=c) is not None}
        assert served == holding, gpu  # only the conditions that hold: docs/cost-and-sizing.md, "The series budget"
        assert holding == ({"degraded_bandwidth", "limited_capacity"} if gpu == FAULT_GPU else set()), gpu
        reported = set(sim.agent.store.snapshot().samples[sim.gpu(gpu)["uuid"]].fabric_health)
        assert reported == set(FABRIC_CONDITIONS), gpu  # an HGX H100 reports the five mask fields and the summary
    verdicts = {v.index: v.as_json() for v in gpu_verdicts(sim.agent.store.snapshot())}
    faulted = verdicts[FAULT_GPU]
    assert faulted["state"] == "degraded" and faulted["action"] == "reset_gpu", faulted
    assert any("NVLink fabric health: degraded bandwidth, limited capacity" in e for e in faulted["evidence"]), faulted
    assert sim.value("gpuwatch_gpu_health", FAULT_GPU, state="degraded") == 1.0
    for gpu in others():
        assert verdicts[gpu]["state"] == "healthy", verdicts[gpu]


@scenario("gpu_lost")
def test_gpu_lost(sim: SimAgent) -> None:
    assert sim.value("gpuwatch_gpu_up", FAULT_GPU) == 0.0
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
    assert sim.value("gpuwatch_gpu_health", FAULT_GPU, state="unhealthy") == 1.0
    assert sim.value("gpuwatch_gpu_recommended_action", FAULT_GPU, action="reboot_node") == 1.0
    assert sim.value("gpuwatch_gpus_detected") == 7.0
    assert sim.value("gpuwatch_gpus_expected", vendor="nvidia") == 8.0
    for gpu in others():
        assert_healthy(sim, gpu)
    assert sim.agent.health()[0]  # a lost GPU is the hardware's problem, not the agent's


@scenario("backend_down")
def test_backend_down(sim: SimAgent) -> None:
    assert sim.value("gpuwatch_backend_up", backend="nvml") == 0.0
    assert sim.value("gpuwatch_gpus_detected") == 0.0
    assert sim.value("gpuwatch_gpus_expected", vendor="nvidia") == 8.0
    assert sim.value("gpuwatch_collector_success", collector="nvml") == 0.0
    sim.node.faults.set_library_missing(False)  # the driver finally loads: picked up by the backoff retry
    sim.run(70.0)
    assert sim.value("gpuwatch_backend_up", backend="nvml") == 1.0
    assert sim.value("gpuwatch_gpus_detected") == 8.0


@scenario("mixed")
def test_mixed_demo_node(sim: SimAgent) -> None:
    core = sim.value("gpuwatch_gpu_temperature_celsius", 2, sensor="core") or 0
    assert core >= (
        sim.value("gpuwatch_gpu_temperature_threshold_celsius", 2, sensor="core", threshold="slowdown") or 99
    )
    assert throttled(sim, 2, "hw_thermal")
    assert (sim.value("gpuwatch_gpu_power_limit_watts", 5, limit="enforced") or 0) < 0.95 * (
        sim.value("gpuwatch_gpu_power_limit_watts", 5, limit="default") or 0
    )
    for gpu in (0, 1, 3, 4, 6, 7):
        assert_healthy(sim, gpu)


@scenario("corrupt")
def test_corrupt_telemetry_looks_healthy_only_the_probe_shows_it(sim: SimAgent) -> None:
    for gpu in range(8):
        assert_healthy(sim, gpu)
    assert SCENARIOS["corrupt"].probe_corrupt == {FAULT_GPU: 3}


@scenario("underperforming")
def test_underperforming_telemetry_looks_healthy(sim: SimAgent) -> None:
    for gpu in range(8):
        assert_healthy(sim, gpu)
    assert SCENARIOS["underperforming"].probe_slowdown == {FAULT_GPU: 0.2}
