"""The simulated node and its NVML: every scenario shows its fault in time, the quirks of the real library are
there, injected faults behave, and counters only ever grow. Time is driven by a fake clock throughout."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simnode import IN_THREAD_SCENARIOS

from gpuwatch.core.model import THROTTLE_REASONS
from gpuwatch.core.scenario_catalogue import FAULT_GPU, SCENARIOS
from gpuwatch.simulated import nvml_constants as c
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.scenarios import SimulatedNode

WALL = 1_795_342_040.0  # the fixture's unix time


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make(scenario: str = "healthy", gpus: int = 8, seed: int = 0, **kw: Any) -> tuple[SimulatedNode, Any, FakeClock]:
    clock = FakeClock()
    node = SimulatedNode(scenario, gpus=gpus, seed=seed, clock=clock, wall_clock=lambda: WALL, **kw)
    lib = simulated_pynvml(node)
    if scenario != "backend_down":
        lib.nvmlInit()
    return node, lib, clock


def err(lib: Any, name: str) -> type[BaseException]:
    cls: type[BaseException] = getattr(lib, name)
    return cls


def field(lib: Any, h: object, fid: int) -> Any:
    return lib.nvmlDeviceGetFieldValues(h, [fid])[0]


def field_u(lib: Any, h: object, fid: int) -> int:
    fv = field(lib, h, fid)
    assert fv.nvmlReturn == 0 and fv.timestamp != 0, fid
    return int(fv.value.ullVal if fv.valueType == c.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG else fv.value.uiVal)


def reasons(lib: Any, h: object) -> int:
    return int(lib.nvmlDeviceGetCurrentClocksEventReasons(h))


# --- scenarios as data ---------------------------------------------------------------------------------------


def test_scenario_names_are_those_of_the_cli_spec(spec_names: dict[str, Any]) -> None:
    names = spec_names["scenarios"]
    assert "mixed" in names and len(names) >= 16
    assert sorted(names) == sorted(SCENARIOS)


def test_scenario_info_says_which_gpu_faults() -> None:
    node_wide = {n for n, s in SCENARIOS.items() if s.node_wide}
    assert node_wide == {"busy", "psu_undervoltage", "backend_down", "training"}
    for name, info in SCENARIOS.items():
        assert info.name == name and info.description
        if name in ("healthy", "mixed") or info.node_wide:
            assert info.fault_gpu is None
        else:
            assert info.fault_gpu == FAULT_GPU == 2
            assert FAULT_GPU in info.gpu_faults
    assert set(SCENARIOS["mixed"].gpu_faults) == {2, 5, 6}
    assert SCENARIOS["mixed"].probe_slowdown == {6: 0.2}
    assert SCENARIOS["underperforming"].probe_slowdown == {2: 0.2}


def test_unknown_scenario_and_vendor_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        SimulatedNode("on_fire")
    with pytest.raises(ValueError, match="unknown vendor"):
        SimulatedNode(vendor="intel")


# --- identity and idle readings (the H100 fixture) -----------------------------------------------------------


def test_identity_is_deterministic_and_h100_like() -> None:
    _node, lib, _ = make()
    again = SimulatedNode(gpus=8, seed=0)
    other = SimulatedNode(gpus=8, seed=1)
    uuids = []
    for i in range(8):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        uuid = lib.nvmlDeviceGetUUID(h)
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
        assert uuid == again.spec(i).uuid != other.spec(i).uuid
        uuids.append(uuid)
        assert lib.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        assert lib.nvmlDeviceGetVbiosVersion(h) == "96.00.DA.00.0C"
        assert re.fullmatch(r"\d{13}", lib.nvmlDeviceGetSerial(h))
        assert lib.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        assert lib.nvmlDeviceGetIndex(h) == i
        assert lib.nvmlDeviceGetHandleByUUID(uuid) is not h  # a fresh handle object, as pynvml returns
        assert lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetHandleByUUID(uuid)) == uuid
    assert len(set(uuids)) == 8
    assert lib.nvmlDeviceGetCount() == 8
    assert lib.nvmlSystemGetDriverVersion() == "580.159.04"
    assert lib.nvmlSystemGetNVMLVersion() == "13.580.159.04"
    assert lib.nvmlSystemGetCudaDriverVersion_v2() == 13000
    bus_ids = [lib.nvmlDeviceGetPciInfo(lib.nvmlDeviceGetHandleByIndex(i)).busId for i in range(8)]
    assert bus_ids[0] == "00000000:18:00.0" and len(set(bus_ids)) == 8
    for form in ("00000000:2A:00.0", "0000:2a:00.0", b"00000000:2a:00.0"):
        assert lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetHandleByPciBusId(form)) == uuids[1]
    with pytest.raises(err(lib, "NVMLError_NotFound")):
        lib.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(err(lib, "NVMLError_NotFound")):
        lib.nvmlDeviceGetHandleByPciBusId("0000:77:00.0")
    with pytest.raises(err(lib, "NVMLError_InvalidArgument")):
        lib.nvmlDeviceGetHandleByIndex(8)


def test_idle_gpu_reads_like_the_fixture() -> None:
    _node, lib, clock = make()
    clock.advance(3.0)
    for i in range(8):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        assert 28 <= lib.nvmlDeviceGetTemperature(h, c.NVML_TEMPERATURE_GPU) <= 34
        assert 31 <= field_u(lib, h, c.NVML_FI_DEV_MEMORY_TEMP) <= 37
        assert 64_000 <= lib.nvmlDeviceGetPowerUsage(h) <= 80_000
        assert lib.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_SM) == 345
        assert lib.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_MEM) == 2619
        assert lib.nvmlDeviceGetMaxClockInfo(h, c.NVML_CLOCK_SM) == 1980
        assert reasons(lib, h) == c.nvmlClocksEventReasonGpuIdle
        assert lib.nvmlDeviceGetSupportedClocksEventReasons(h) == 511
        assert lib.nvmlDeviceGetPerformanceState(h) == 0
        util = lib.nvmlDeviceGetUtilizationRates(h)
        assert (util.gpu, util.memory) == (0, 0)
        v1 = lib.nvmlDeviceGetMemoryInfo(h)
        assert (v1.total, v1.used, v1.free) == (85520809984, 503316480, 85017493504)
        v2 = lib.nvmlDeviceGetMemoryInfo(h, version=c.nvmlMemory_v2)
        assert (v2.total, v2.reserved, v2.used, v2.free) == (85520809984, 503316480, 0, 85017493504)
        assert lib.nvmlDeviceGetComputeRunningProcesses(h) == []
        assert lib.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
        assert lib.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700_000
        assert lib.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 700_000]
        assert lib.nvmlDeviceGetPowerSource(h) == c.NVML_POWER_SOURCE_AC
        thresholds = [lib.nvmlDeviceGetTemperatureThreshold(h, t) for t in range(4)]
        assert thresholds == [95, 89, 95, 87]  # shutdown, slowdown, memory max, gpu max
        assert lib.nvmlDeviceGetMarginTemperature(h) == 87 - lib.nvmlDeviceGetTemperature(h, 0)
        assert lib.nvmlDeviceGetMaxPcieLinkGeneration(h) == lib.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 5
        assert lib.nvmlDeviceGetMaxPcieLinkWidth(h) == lib.nvmlDeviceGetCurrPcieLinkWidth(h) == 16
        # some idle GPUs drop their link to gen 1 to save power (healthy)
        assert lib.nvmlDeviceGetCurrPcieLinkGeneration(h) == (1 if i % 4 == 3 else 5)
        assert lib.nvmlDeviceGetEccMode(h) == [1, 1]
        assert lib.nvmlDeviceGetMigMode(h) == [0, 0]
        assert lib.nvmlDeviceGetPersistenceMode(h) == 1
        assert lib.nvmlDeviceGetComputeMode(h) == c.NVML_COMPUTEMODE_DEFAULT
        assert lib.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
        assert 100 <= field_u(lib, h, c.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER) <= 145
        assert field_u(lib, h, c.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) == 0


def test_busy_gpu_sits_at_its_power_cap_healthy() -> None:
    node, lib, clock = make("busy")
    h = lib.nvmlDeviceGetHandleByIndex(4)
    temps = []
    for _ in range(60):
        clock.advance(0.5)
        assert 694_000 <= lib.nvmlDeviceGetPowerUsage(h) <= 701_000
        assert 1335 <= lib.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_SM) <= 1395
        assert reasons(lib, h) == c.nvmlClocksEventReasonSwPowerCap
        assert lib.nvmlDeviceGetUtilizationRates(h).gpu == 100
        temps.append(lib.nvmlDeviceGetTemperature(h, 0))
    assert 53 <= temps[0] <= 56 and 60 <= temps[-1] <= 63
    procs = lib.nvmlDeviceGetComputeRunningProcesses(h)
    assert len(procs) == 1 and procs[0].pid > 0 and procs[0].usedGpuMemory > 70 * 2**30
    mem = lib.nvmlDeviceGetMemoryInfo(h, version=c.nvmlMemory_v2)
    assert mem.used == procs[0].usedGpuMemory
    # SW power cap all the time: the POWER violation counter grew by the whole 30 s
    power_s = lib.nvmlDeviceGetViolationStatus(h, c.NVML_PERF_POLICY_POWER).violationTime / 1e9
    assert power_s == pytest.approx(30.0, abs=0.01)
    assert field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP) == int(power_s * 1e9)
    energy_j = lib.nvmlDeviceGetTotalEnergyConsumption(h) / 1000
    assert node.state(4).energy_joules == pytest.approx(energy_j, abs=0.01)


# --- every scenario shows its fault in time, on its GPU only ----------------------------------------------------

Check = Callable[[Any, Any], bool]


def _overheating(lib: Any, h: Any) -> bool:
    hot = lib.nvmlDeviceGetTemperature(h, 0) >= lib.nvmlDeviceGetTemperatureThreshold(h, 1)
    return hot and bool(reasons(lib, h) & c.nvmlClocksEventReasonHwThermalSlowdown)


def _memory_hot(lib: Any, h: Any) -> bool:
    return field_u(lib, h, c.NVML_FI_DEV_MEMORY_TEMP) >= lib.nvmlDeviceGetTemperatureThreshold(h, 2) - 5


def _power_brake(lib: Any, h: Any) -> bool:
    mask = c.nvmlClocksEventReasonHwPowerBrakeSlowdown | c.nvmlClocksEventReasonHwSlowdown
    return reasons(lib, h) & mask == mask and lib.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_SM) < 700


def _limit_low(lib: Any, h: Any) -> bool:
    return lib.nvmlDeviceGetEnforcedPowerLimit(h) < 0.95 * lib.nvmlDeviceGetPowerManagementDefaultLimit(h)


def _pcie_degraded(lib: Any, h: Any) -> bool:
    busy = lib.nvmlDeviceGetUtilizationRates(h).gpu > 50
    return busy and (lib.nvmlDeviceGetCurrPcieLinkGeneration(h), lib.nvmlDeviceGetCurrPcieLinkWidth(h)) == (3, 8)


def _ecc(lib: Any, h: Any) -> bool:
    return lib.nvmlDeviceGetTotalEccErrors(h, c.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, c.NVML_AGGREGATE_ECC) > 0


def _remap(lib: Any, h: Any) -> bool:
    _, _, pending, failed = lib.nvmlDeviceGetRemappedRows(h)
    return bool(pending and failed) and field_u(lib, h, c.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) == 1


def _lost(lib: Any, h: Any) -> bool:
    try:
        lib.nvmlDeviceGetTemperature(h, 0)
    except err(lib, "NVMLError_GpuIsLost"):
        return True
    return False


FAULTS: dict[str, tuple[Check, float]] = {  # scenario -> (fault visible, by when in seconds)
    "overheating": (_overheating, 10.0),
    "memory_overheating": (_memory_hot, 10.0),
    "power_brake": (_power_brake, 2.0),
    "power_limit_low": (_limit_low, 0.5),
    "pcie_degraded": (_pcie_degraded, 0.5),
    "ecc_uncorrectable": (_ecc, 2.0),
    "row_remap_failure": (_remap, 2.0),
    "gpu_lost": (_lost, 7.0),
}


@pytest.mark.parametrize("scenario", sorted(FAULTS))
def test_fault_shows_on_its_gpu_in_time_and_stays(scenario: str) -> None:
    check, by = FAULTS[scenario]
    _node, lib, clock = make(scenario)
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    first = None
    while clock.t < 60.0:
        clock.advance(0.5)
        shown = check(lib, handles[FAULT_GPU])
        if first is None and shown:
            first = clock.t
        if first is not None:
            assert shown, f"{scenario}: fault went away at {clock.t}s"
        for i in (0, 1, 3, 7):
            assert not check(lib, handles[i]), f"{scenario}: healthy GPU {i} shows the fault"
    assert first is not None and first <= by, (scenario, first)


def test_overheating_counts_thermal_throttle_time() -> None:
    _node, lib, clock = make("overheating")
    h = lib.nvmlDeviceGetHandleByIndex(2)
    clock.advance(10.0)
    thermal0 = lib.nvmlDeviceGetViolationStatus(h, c.NVML_PERF_POLICY_THERMAL).violationTime
    hw0 = field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN)
    sw0 = field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN)
    clock.advance(20.0)
    assert lib.nvmlDeviceGetViolationStatus(h, c.NVML_PERF_POLICY_THERMAL).violationTime - thermal0 == pytest.approx(
        20e9, rel=1e-6
    )
    assert field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN) - hw0 == pytest.approx(20e9, rel=1e-6)
    assert field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN) - sw0 == pytest.approx(20e9, rel=1e-6)
    assert reasons(lib, h) & c.nvmlClocksEventReasonSwThermalSlowdown
    assert lib.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_SM) < 800
    assert lib.nvmlDeviceGetTemperature(h, 0) < 95  # below shutdown


def test_thermal_throttling_is_a_large_share_below_slowdown() -> None:
    _node, lib, clock = make("thermal_throttling")
    h = lib.nvmlDeviceGetHandleByIndex(2)
    clock.advance(5.0)
    assert reasons(lib, h) & c.nvmlClocksEventReasonSwThermalSlowdown
    start = field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN)
    peak = 0
    for _ in range(120):
        clock.advance(0.25)
        peak = max(peak, lib.nvmlDeviceGetTemperature(h, 0))
        assert not reasons(lib, h) & c.nvmlClocksEventReasonHwThermalSlowdown
    share = (field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN) - start) / 30e9
    assert 0.6 <= share <= 0.8
    assert 86 <= peak < 89


def test_psu_undervoltage_brakes_every_gpu_and_reports_undersized_supply() -> None:
    _node, lib, clock = make("psu_undervoltage")
    clock.advance(2.0)
    for i in range(8):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        assert _power_brake(lib, h)
        assert lib.nvmlDeviceGetPowerSource(h) == c.NVML_POWER_SOURCE_UNDERSIZED
    brake0 = field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN)
    clock.advance(5.0)
    assert field_u(lib, h, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN) - brake0 == pytest.approx(5e9)


def test_pcie_degraded_counters_grow() -> None:
    _node, lib, clock = make("pcie_degraded")
    h = lib.nvmlDeviceGetHandleByIndex(2)
    clock.advance(2.0)
    replays = lib.nvmlDeviceGetPcieReplayCounter(h)
    l0 = field_u(lib, h, c.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER)
    assert field_u(lib, h, c.NVML_FI_DEV_PCIE_REPLAY_COUNTER) == replays
    clock.advance(10.0)
    assert lib.nvmlDeviceGetPcieReplayCounter(h) > replays
    assert field_u(lib, h, c.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER) > l0
    assert lib.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5 and lib.nvmlDeviceGetMaxPcieLinkWidth(h) == 16
    healthy = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlDeviceGetPcieReplayCounter(healthy) == 0


def test_ecc_uncorrectable_counts_grow_volatile_and_aggregate() -> None:
    _node, lib, clock = make("ecc_uncorrectable")
    h = lib.nvmlDeviceGetHandleByIndex(2)
    unc = c.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    clock.advance(2.0)
    first = [lib.nvmlDeviceGetTotalEccErrors(h, unc, k) for k in (c.NVML_VOLATILE_ECC, c.NVML_AGGREGATE_ECC)]
    clock.advance(10.0)
    later = [lib.nvmlDeviceGetTotalEccErrors(h, unc, k) for k in (c.NVML_VOLATILE_ECC, c.NVML_AGGREGATE_ECC)]
    assert all(b > a > 0 for a, b in zip(first, later, strict=True))
    assert field_u(lib, h, c.NVML_FI_DEV_ECC_DBE_AGG_TOTAL) == later[1]


def test_gpu_lost_stays_on_the_bus() -> None:
    node, lib, clock = make("gpu_lost")
    h = lib.nvmlDeviceGetHandleByIndex(2)
    uuid = lib.nvmlDeviceGetUUID(h)
    clock.advance(10.0)
    lost = err(lib, "NVMLError_GpuIsLost")
    for call in (
        lambda: lib.nvmlDeviceGetUUID(h),
        lambda: lib.nvmlDeviceGetPowerUsage(h),
        lambda: lib.nvmlDeviceGetFieldValues(h, [c.NVML_FI_DEV_MEMORY_TEMP]),
        lambda: lib.nvmlDeviceGetMemoryInfo(h),
        lambda: lib.nvmlDeviceGetHandleByIndex(2),
        lambda: lib.nvmlDeviceGetHandleByUUID(uuid),
    ):
        with pytest.raises(lost):
            call()
    assert lib.nvmlDeviceGetCount() == 8
    assert node.pci_gpu_counts() == {"nvidia": 8, "amd": 0}
    assert lib.nvmlDeviceGetPowerUsage(lib.nvmlDeviceGetHandleByIndex(3)) > 0
    node.faults.restore_gpu(2)  # the driver reload brings it back
    assert lib.nvmlDeviceGetUUID(h) == uuid


def test_mixed_demo_node() -> None:
    node, lib, clock = make("mixed")
    clock.advance(15.0)
    h = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert _overheating(lib, h[2])
    assert lib.nvmlDeviceGetEnforcedPowerLimit(h[5]) == 500_000
    assert lib.nvmlDeviceGetPowerManagementDefaultLimit(h[5]) == 700_000
    assert node.probe_slowdown == {6: 0.2}
    for i in (0, 1, 3, 4, 6, 7):
        assert not _overheating(lib, h[i]) and not _limit_low(lib, h[i])
    # the probe only runs on an all-idle node, so every GPU stays idle (no processes)
    assert all(lib.nvmlDeviceGetComputeRunningProcesses(x) == [] for x in h)


def test_a_probe_loads_the_gpu_through_nvml_at_its_power_cap_and_the_clock_that_cap_gives() -> None:
    """Issue #30 (9): mixed's GPU 5 (500 W of 700 W) read idle while probed. While a probe's worker runs, NVML shows
    the load as under any full load (physics.rates): power just under the enforced limit, sw_power_cap, the SM clock
    sqrt(limit share) of the busy clock, utilization 100 %, temperature rising, but no compute process of the
    scenario's (the worker is the probe's own); after, the idle clock, and the temperature cools with the same time
    constant. The energy counter integrates the load."""
    node, lib, clock = make("mixed")
    clock.advance(1.0)
    h = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    idle = {i: (lib.nvmlDeviceGetTemperature(h[i], 0), lib.nvmlDeviceGetTotalEnergyConsumption(h[i])) for i in (4, 5)}
    running = {4: True, 5: True}
    shares = {i: node.start_probe_load(i, lambda i=i: running[i]) for i in (4, 5)}
    assert shares[4] == pytest.approx(1.0) and shares[5] == pytest.approx((500 / 700) ** 0.5)
    clock.advance(10.0)
    for i, limit in ((4, 700_000), (5, 500_000)):
        assert 0.97 * limit <= lib.nvmlDeviceGetPowerUsage(h[i]) <= limit
        assert reasons(lib, h[i]) == c.nvmlClocksEventReasonSwPowerCap
        sm = lib.nvmlDeviceGetClockInfo(h[i], c.NVML_CLOCK_SM)
        assert sm == pytest.approx(1365 * shares[i], abs=16), i  # the busy clock at the cap, its 15 MHz bins
        assert lib.nvmlDeviceGetUtilizationRates(h[i]).gpu == 100
        assert lib.nvmlDeviceGetComputeRunningProcesses(h[i]) == []
        assert lib.nvmlDeviceGetTemperature(h[i], 0) > idle[i][0] + 8  # 10 s into a 12 s time constant
        joules = (lib.nvmlDeviceGetTotalEnergyConsumption(h[i]) - idle[i][1]) / 1000
        assert 0.9 * 10 * limit / 1000 < joules < 10 * limit / 1000
    assert lib.nvmlDeviceGetClockInfo(h[5], c.NVML_CLOCK_SM) < lib.nvmlDeviceGetClockInfo(h[4], c.NVML_CLOCK_SM)
    assert lib.nvmlDeviceGetClockInfo(h[3], c.NVML_CLOCK_SM) == 345  # a GPU not probed stays idle
    hot = lib.nvmlDeviceGetTemperature(h[5], 0)
    running[5] = False  # the worker is gone: the next reading of the GPU notices
    assert lib.nvmlDeviceGetClockInfo(h[5], c.NVML_CLOCK_SM) == 345
    clock.advance(1.0)
    assert reasons(lib, h[5]) == c.nvmlClocksEventReasonGpuIdle
    assert lib.nvmlDeviceGetClockInfo(h[5], c.NVML_CLOCK_SM) == 345
    assert lib.nvmlDeviceGetPowerUsage(h[5]) < 100_000
    assert idle[5][0] < lib.nvmlDeviceGetTemperature(h[5], 0) < hot  # cooling, not back to idle at once
    clock.advance(60.0)
    assert lib.nvmlDeviceGetTemperature(h[5], 0) <= idle[5][0] + 1
    assert lib.nvmlDeviceGetPowerUsage(h[4]) > 0.97 * 700_000  # GPU 4's worker still runs


def test_a_probes_load_shows_in_the_activity_counters_and_they_keep_it() -> None:
    """GPM's SM activity (activity.py) agrees with the probe's 100 % utilization: its matmul keeps the SMs and the
    tensor pipes busy while it runs, nothing after, and a later probe adds to the counters since boot (never takes
    the earlier one's share away)."""
    node, _lib, clock = make("healthy", gpus=1)
    clock.advance(1.0)

    def sm_active_s() -> float:
        return node.state(0).activity.active_s["sm_active"]

    def probe(seconds: float) -> float:
        running = [True]
        before = sm_active_s()
        node.start_probe_load(0, lambda: running[0])
        clock.advance(seconds)
        during = sm_active_s() - before
        running[0] = False
        sm_active_s()  # the reading that notices the worker gone
        return during

    assert sm_active_s() == 0.0  # idle since boot
    assert 0.9 * 10 < probe(10.0) < 10.0
    assert node.state(0).activity.active_s["tensor_active"] <= sm_active_s()
    after_first = sm_active_s()
    clock.advance(30.0)
    assert sm_active_s() == after_first  # idle again
    assert 0.9 * 5 < probe(5.0) < 5.0
    assert sm_active_s() > after_first + 4.5


def test_underperforming_has_healthy_telemetry() -> None:
    node, lib, clock = make("underperforming")
    clock.advance(20.0)
    h = lib.nvmlDeviceGetHandleByIndex(2)
    assert reasons(lib, h) == c.nvmlClocksEventReasonGpuIdle
    assert node.probe_slowdown == {2: 0.2}
    assert node.fault_gpus == (2,)


def test_backend_down_and_library_coming_back() -> None:
    node, lib, _clock = make("backend_down")
    with pytest.raises(err(lib, "NVMLError_LibraryNotFound")) as raised:
        lib.nvmlInit()
    assert raised.value.value == c.NVML_ERROR_LIBRARY_NOT_FOUND
    assert node.pci_gpu_counts()["nvidia"] == 8
    with pytest.raises(err(lib, "NVMLError_Uninitialized")):
        lib.nvmlDeviceGetCount()
    node.faults.set_library_missing(False)  # the driver got installed
    lib.nvmlInit()
    assert lib.nvmlDeviceGetCount() == 8


def test_small_node_clamps_the_fault_gpu() -> None:
    node, lib, clock = make("overheating", gpus=2)
    clock.advance(12.0)
    assert _overheating(lib, lib.nvmlDeviceGetHandleByIndex(1))
    node, lib, clock = make("mixed", gpus=4)
    assert node.probe_slowdown == {}


# --- NVML semantics: init, handles, unsupported calls, quirks ------------------------------------------------------


def test_uninitialized_and_ref_counted_init() -> None:
    node = SimulatedNode(clock=FakeClock())
    lib = simulated_pynvml(node)
    uninit = err(lib, "NVMLError_Uninitialized")
    with pytest.raises(uninit):
        lib.nvmlDeviceGetCount()
    with pytest.raises(uninit):
        lib.nvmlShutdown()
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlInitWithFlags(0)
    lib.nvmlShutdown()
    assert lib.nvmlDeviceGetTemperature(h, 0) > 0  # one init still holds
    lib.nvmlShutdown()
    with pytest.raises(uninit):
        lib.nvmlDeviceGetTemperature(h, 0)


def test_non_handles_are_rejected() -> None:
    _, lib, _ = make()
    other = simulated_pynvml(SimulatedNode(clock=FakeClock()))
    other.nvmlInit()
    for bad in (None, 0, "GPU-0", other.nvmlDeviceGetHandleByIndex(0)):
        with pytest.raises(err(lib, "NVMLError_InvalidArgument")):
            lib.nvmlDeviceGetPowerUsage(bad)


def test_what_an_h100_sxm_does_not_support() -> None:
    _, lib, _ = make()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    unsupported = err(lib, "NVMLError_NotSupported")
    for call in (
        lambda: lib.nvmlDeviceGetFanSpeed(h),
        lambda: lib.nvmlDeviceGetFanSpeed_v2(h, 0),
        lambda: lib.nvmlDeviceGetRetiredPages(h, 0),
        lambda: lib.nvmlDeviceGetRetiredPages_v2(h, 0),
        lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h),
        lambda: lib.nvmlDeviceGetApplicationsClock(h, c.NVML_CLOCK_VIDEO),
        lambda: lib.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0),
    ):
        with pytest.raises(unsupported):
            call()
    for threshold in range(4, 8):  # acoustic and GPS thresholds
        with pytest.raises(unsupported):
            lib.nvmlDeviceGetTemperatureThreshold(h, threshold)
    for link in range(18):
        with pytest.raises(unsupported):
            lib.nvmlDeviceGetNvLinkState(h, link)
    assert lib.nvmlDeviceGetNumFans(h) == 0
    assert lib.nvmlDeviceGetApplicationsClock(h, c.NVML_CLOCK_SM) == 1980
    invalid = err(lib, "NVMLError_InvalidArgument")
    for call in (
        lambda: lib.nvmlDeviceGetTemperatureThreshold(h, 8),
        lambda: lib.nvmlDeviceGetClockInfo(h, 9),
        lambda: lib.nvmlDeviceGetViolationStatus(h, 7),
        lambda: lib.nvmlDeviceGetTotalEccErrors(h, 2, 0),
        lambda: lib.nvmlDeviceGetTemperature(h, 1),
        lambda: lib.nvmlDeviceGetPcieThroughput(h, 2),
    ):
        with pytest.raises(invalid):
            call()
    with pytest.raises(err(lib, "NVMLError_ArgumentVersionMismatch")):
        lib.nvmlDeviceGetMemoryInfo(h, version=1)
    with pytest.raises(err(lib, "NVMLError_ArgumentVersionMismatch")):
        lib.nvmlDeviceGetTemperatureV(h, 0, version=2)
    assert lib.nvmlDeviceGetTemperatureV(h, 0) == lib.nvmlDeviceGetTemperature(h, 0)


def test_field_values_timestamp_zero_quirk_at_idle() -> None:
    _, lib, clock = make()
    clock.advance(1.0)
    h = lib.nvmlDeviceGetHandleByIndex(0)
    empty = [
        c.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        c.NVML_FI_DEV_POWER_DEFAULT_LIMIT,
        c.NVML_FI_DEV_POWER_MIN_LIMIT,
        c.NVML_FI_DEV_POWER_MAX_LIMIT,
        c.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
        c.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
        c.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT,
        c.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
        c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
        c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    ]
    for fv in lib.nvmlDeviceGetFieldValues(h, empty):
        assert (fv.nvmlReturn, fv.valueType, fv.value.dVal, fv.timestamp) == (0, 0, 0.0, 0), fv.fieldId
    filled = lib.nvmlDeviceGetFieldValues(
        h, [c.NVML_FI_DEV_MEMORY_TEMP, c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, c.NVML_FI_DEV_ENERGY]
    )
    assert [fv.valueType for fv in filled] == [1, 3, 3]
    assert all(fv.nvmlReturn == 0 and fv.timestamp > int(WALL * 1e6) for fv in filled)
    assert filled[0].value.uiVal == filled[0].value.ullVal  # a true union, as in pynvml
    assert filled[2].value.ullVal == lib.nvmlDeviceGetTotalEnergyConsumption(h)
    # per-field errors; the call itself succeeds
    mixed = lib.nvmlDeviceGetFieldValues(
        h,
        [
            c.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
            c.NVML_FI_DEV_RETIRED_PENDING,
            c.NVML_FI_DEV_C2C_LINK_COUNT,
            0,
            c.NVML_FI_MAX,
            (c.NVML_FI_DEV_MEMORY_TEMP, 0),
        ],
    )
    assert [fv.nvmlReturn for fv in mixed] == [3, 3, 3, 2, 2, 0]


@pytest.mark.parametrize(
    ("quirk", "at_idle", "while_braking"), [("until_active", 0, True), ("always", 0, False), ("never", 3, True)]
)
def test_hw_reason_counter_quirk_modes(quirk: Any, at_idle: int, while_braking: bool) -> None:
    clock = FakeClock()
    node = SimulatedNode("power_brake", clock=clock, wall_clock=lambda: WALL)
    lib = simulated_pynvml(node, hw_counter_quirk=quirk)
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(2)
    fid = c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
    assert field(lib, h, fid).valueType == at_idle
    clock.advance(5.0)
    fv = field(lib, h, fid)
    assert (fv.timestamp != 0) is while_braking
    if while_braking:
        assert fv.value.ullVal == pytest.approx(4e9)  # braking since 1 s


def test_nvlink_option() -> None:
    node, lib, _ = make(nvlink=True)
    h = lib.nvmlDeviceGetHandleByIndex(0)
    assert all(lib.nvmlDeviceGetNvLinkState(h, link) == 1 for link in range(18))
    with pytest.raises(err(lib, "NVMLError_NotSupported")):
        lib.nvmlDeviceGetNvLinkState(h, 18)
    with pytest.raises(err(lib, "NVMLError_InvalidArgument")):
        lib.nvmlDeviceGetNvLinkState(h, 36)
    assert lib.nvmlDeviceGetNvLinkErrorCounter(h, 0, c.NVML_NVLINK_ERROR_DL_REPLAY) == 0
    assert field_u(lib, h, c.NVML_FI_DEV_NVLINK_LINK_COUNT) == 18
    node.faults.set_nvlink_up(0, 3, False)
    assert lib.nvmlDeviceGetNvLinkState(h, 3) == 0
    state = lib.nvmlDeviceGetFieldValues(h, [(c.NVML_FI_DEV_NVLINK_GET_STATE, 3)])[0]
    assert (state.nvmlReturn, state.value.uiVal) == (0, 0)


def test_unversioned_process_call_raises_library_mismatch() -> None:
    node, lib, _ = make("busy")
    h = lib.nvmlDeviceGetHandleByIndex(0)
    node.faults.fail("nvmlDeviceGetComputeRunningProcesses_v3", c.NVML_ERROR_FUNCTION_NOT_FOUND)
    with pytest.raises(lib.NVMLLibraryMismatchError):
        lib.nvmlDeviceGetComputeRunningProcesses(h)
    with pytest.raises(err(lib, "NVMLError_FunctionNotFound")):
        lib.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert len(lib.nvmlDeviceGetComputeRunningProcesses_v2(h)) == 1


# --- fault injection --------------------------------------------------------------------------------------------


def test_injected_errors_by_pattern_gpu_and_count() -> None:
    node, lib, _ = make()
    h0, h1 = lib.nvmlDeviceGetHandleByIndex(0), lib.nvmlDeviceGetHandleByIndex(1)
    rule = node.faults.fail("nvmlDeviceGetPower*", c.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    assert lib.nvmlDeviceGetPowerUsage(h0) > 0
    with pytest.raises(err(lib, "NVMLError_NotSupported")):
        lib.nvmlDeviceGetPowerUsage(h1)
    with pytest.raises(err(lib, "NVMLError_NotSupported")):
        lib.nvmlDeviceGetPowerManagementLimit(h1)
    node.faults.remove(rule)
    assert lib.nvmlDeviceGetPowerUsage(h1) > 0
    node.faults.fail("nvmlDeviceGetCurrentClocksEventReasons", c.NVML_ERROR_FUNCTION_NOT_FOUND)
    with pytest.raises(err(lib, "NVMLError_FunctionNotFound")):
        reasons(lib, h0)
    assert lib.nvmlDeviceGetCurrentClocksThrottleReasons(h0) == 1  # the fallback still works
    node.faults.fail("nvmlDeviceGetTemperature", c.NVML_ERROR_TIMEOUT, times=1)
    with pytest.raises(err(lib, "NVMLError_Timeout")):
        lib.nvmlDeviceGetTemperature(h0, 0)
    assert lib.nvmlDeviceGetTemperature(h0, 0) > 0
    node.faults.clear()
    assert reasons(lib, h0) == 1


def test_random_unknown_errors_are_seeded() -> None:
    def pattern(seed: int) -> list[bool]:
        node, lib, _ = make(seed=seed)
        h = lib.nvmlDeviceGetHandleByIndex(0)
        node.faults.fail("nvmlDevice*", c.NVML_ERROR_UNKNOWN, rate=0.3)
        out = []
        for _ in range(200):
            try:
                lib.nvmlDeviceGetPowerUsage(h)
                out.append(True)
            except err(lib, "NVMLError_Unknown"):
                out.append(False)
        return out

    first = pattern(7)
    assert first == pattern(7)
    assert 30 <= first.count(False) <= 90


def test_hang_until_released() -> None:
    node, lib, _ = make()
    h2, h3 = lib.nvmlDeviceGetHandleByIndex(2), lib.nvmlDeviceGetHandleByIndex(3)
    node.faults.hang("nvmlDeviceGetPowerUsage", gpu=2)
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(lib.nvmlDeviceGetPowerUsage(h2)), daemon=True)
    worker.start()
    assert node.faults.wait_until_blocked(1, timeout=5.0)
    assert node.faults.blocked_calls() == 1
    assert lib.nvmlDeviceGetPowerUsage(h3) > 0  # other GPUs answer
    assert lib.nvmlDeviceGetTemperature(h2, 0) > 0  # other calls answer
    time.sleep(0.05)
    assert worker.is_alive() and not result
    node.faults.release()
    worker.join(5.0)
    assert not worker.is_alive() and result and result[0] > 0
    assert node.faults.blocked_calls() == 0


def test_hang_for_a_while() -> None:
    node, lib, _ = make()
    node.faults.hang("nvmlDeviceGetCount", seconds=0.1)
    start = time.monotonic()
    assert lib.nvmlDeviceGetCount() == 8
    assert time.monotonic() - start >= 0.09


def test_library_missing_and_back() -> None:
    node = SimulatedNode(clock=FakeClock())
    lib = simulated_pynvml(node)
    node.faults.set_library_missing(True)
    with pytest.raises(lib.NVMLError) as raised:
        lib.nvmlInit()
    assert type(raised.value).__name__ == "NVMLError_LibraryNotFound"
    node.faults.set_library_missing(False)
    lib.nvmlInit()
    assert lib.nvmlDeviceGetCount() == 8


def test_lose_and_restore_a_gpu() -> None:
    node, lib, _ = make()
    h = lib.nvmlDeviceGetHandleByIndex(1)
    uuid = lib.nvmlDeviceGetUUID(h)
    node.faults.lose_gpu(1)
    assert node.is_lost(1) and node.pci_gpu_counts()["nvidia"] == 8
    with pytest.raises(err(lib, "NVMLError_GpuIsLost")):
        lib.nvmlDeviceGetTemperature(h, 0)
    node.faults.restore_gpu(1)
    assert lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetHandleByIndex(1)) == uuid


def test_amd_node_has_no_nvml() -> None:
    node = SimulatedNode("healthy", vendor="amd", clock=FakeClock())
    assert node.pci_gpu_counts() == {"nvidia": 0, "amd": 8}
    assert node.spec(0).model == "AMD Instinct MI300X"
    lib = simulated_pynvml(node)
    with pytest.raises(lib.NVMLError_LibraryNotFound):
        lib.nvmlInit()
    assert [e.kind for e in SimulatedNode("xid", vendor="amd").events_until(60.0)] == ["reset", "reset"]


def test_power_limit_can_change_at_run_time() -> None:
    node, lib, clock = make("busy")
    h = lib.nvmlDeviceGetHandleByIndex(0)
    node.set_power_limit(0, 600.0)
    clock.advance(2.0)
    assert lib.nvmlDeviceGetEnforcedPowerLimit(h) == 600_000
    assert lib.nvmlDeviceGetPowerUsage(h) <= 601_000


def test_latency_scale_makes_slow_calls_slow() -> None:
    node = SimulatedNode(clock=FakeClock())
    lib = simulated_pynvml(node, latency_scale=1.0)
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    start = time.monotonic()
    lib.nvmlDeviceGetPcieThroughput(h, c.NVML_PCIE_UTIL_TX_BYTES)
    assert time.monotonic() - start >= 0.02


# --- events ------------------------------------------------------------------------------------------------------


def test_event_wait_times_out_after_the_timeout() -> None:
    _, lib, _ = make()
    es = lib.nvmlEventSetCreate()
    lib.nvmlDeviceRegisterEvents(
        lib.nvmlDeviceGetHandleByIndex(0), lib.nvmlDeviceGetSupportedEventTypes(lib.nvmlDeviceGetHandleByIndex(0)), es
    )
    start = time.monotonic()
    with pytest.raises(err(lib, "NVMLError_Timeout")) as raised:
        lib.nvmlEventSetWait_v2(es, 100)
    assert raised.value.value == 10
    assert 0.09 <= time.monotonic() - start < 1.0
    lib.nvmlEventSetFree(es)
    with pytest.raises(err(lib, "NVMLError_InvalidArgument")):
        lib.nvmlEventSetWait_v2(es, 0)


def test_xid_scenario_delivers_13_then_79_on_the_fault_gpu() -> None:
    node, lib, clock = make("xid")
    es = lib.nvmlEventSetCreate()
    for i in range(8):
        lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(i), c.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(err(lib, "NVMLError_Timeout")):
        lib.nvmlEventSetWait_v2(es, 0)
    got: list[tuple[str, int, int]] = []

    def wait() -> None:
        for _ in range(2):
            data = lib.nvmlEventSetWait_v2(es, 5000)
            got.append((lib.nvmlDeviceGetUUID(data.device), data.eventType, data.eventData))

    waiter = threading.Thread(target=wait, daemon=True)
    started = time.monotonic()
    waiter.start()
    clock.advance(6.0)  # the waiter wakes early: it does not sit out its 5 s timeout
    waiter.join(5.0)
    assert not waiter.is_alive() and time.monotonic() - started < 2.0
    uuid = node.spec(2).uuid
    assert got == [(uuid, c.nvmlEventTypeXidCriticalError, 13), (uuid, c.nvmlEventTypeXidCriticalError, 79)]
    events = node.events_until(10.0)
    assert [(e.elapsed, e.code) for e in events] == [(2.0, 13), (5.0, 79)]
    assert events[1].timestamp == WALL + 5.0


def test_events_are_filtered_by_registration() -> None:
    node, lib, _clock = make()
    es = lib.nvmlEventSetCreate()
    h0 = lib.nvmlDeviceGetHandleByIndex(0)
    node.faults.emit_xid(0, 48)  # before registering: not delivered
    lib.nvmlDeviceRegisterEvents(h0, c.nvmlEventTypeXidCriticalError, es)
    node.faults.emit_xid(1, 79)  # GPU 1 is not registered
    with pytest.raises(err(lib, "NVMLError_Timeout")):
        lib.nvmlEventSetWait_v2(es, 20)
    with pytest.raises(err(lib, "NVMLError_NotSupported")):
        lib.nvmlDeviceRegisterEvents(h0, 1 << 40, es)


def test_emitted_xid_wakes_a_waiter_on_a_real_clock() -> None:
    node = SimulatedNode("healthy")
    lib = simulated_pynvml(node)
    lib.nvmlInit()
    es = lib.nvmlEventSetCreate()
    lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(5), c.nvmlEventTypeXidCriticalError, es)
    timer = threading.Timer(0.05, node.faults.emit_xid, (5, 94))
    start = time.monotonic()
    timer.start()
    data = lib.nvmlEventSetWait_v2(es, 5000)
    assert data.eventData == 94 and time.monotonic() - start < 1.0


def test_event_wait_on_a_lost_gpu_raises_gpu_is_lost() -> None:
    _node, lib, clock = make("gpu_lost")
    es = lib.nvmlEventSetCreate()
    lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(2), c.nvmlEventTypeXidCriticalError, es)
    clock.advance(7.0)
    with pytest.raises(err(lib, "NVMLError_GpuIsLost")):
        lib.nvmlEventSetWait_v2(es, 1000)


def test_event_thread_and_poll_thread_together() -> None:
    _node, lib, clock = make("xid")
    es = lib.nvmlEventSetCreate()
    lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(2), c.nvmlEventTypeXidCriticalError, es)
    seen: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def events() -> None:
        while not stop.is_set():
            try:
                seen.append(lib.nvmlEventSetWait_v2(es, 20).eventData)
            except err(lib, "NVMLError_Timeout"):
                pass
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)
                return

    thread = threading.Thread(target=events, daemon=True)
    thread.start()
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    for _ in range(100):
        clock.advance(0.1)
        for h in handles:
            lib.nvmlDeviceGetFieldValues(h, [c.NVML_FI_DEV_MEMORY_TEMP, c.NVML_FI_DEV_ENERGY])
            lib.nvmlDeviceGetPowerUsage(h)
    deadline = time.monotonic() + 5.0
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(5.0)
    assert not errors and seen == [13, 79]


# --- counters only grow, and only while their reason holds --------------------------------------------------------


def _counters(lib: Any, h: Any) -> list[int]:
    fids = [
        c.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        c.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER,
        c.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        c.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
        *range(c.NVML_FI_DEV_PERF_POLICY_POWER, c.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS + 1),
    ]
    values = [int(fv.value.ullVal) for fv in lib.nvmlDeviceGetFieldValues(h, fids)]
    values.append(lib.nvmlDeviceGetTotalEnergyConsumption(h))
    for policy in (c.NVML_PERF_POLICY_POWER, c.NVML_PERF_POLICY_THERMAL, c.NVML_PERF_POLICY_LOW_UTILIZATION):
        values.append(lib.nvmlDeviceGetViolationStatus(h, policy).violationTime)
    values.append(lib.nvmlDeviceGetTotalEccErrors(h, 1, 0))
    return values


@settings(max_examples=15, deadline=None)
@given(
    scenario=st.sampled_from(sorted(set(IN_THREAD_SCENARIOS) - {"backend_down", "gpu_lost"})),
    steps=st.lists(st.floats(min_value=0.0, max_value=7.0), min_size=2, max_size=25),
)
def test_counters_never_decrease(scenario: str, steps: list[float]) -> None:
    node, lib, clock = make(scenario, gpus=4)
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    last = [_counters(lib, h) for h in handles]
    for step in steps:
        clock.advance(step)
        for i, h in enumerate(handles):
            now = _counters(lib, h)
            assert all(b >= a for a, b in zip(last[i], now, strict=True)), (scenario, clock.t, i)
            last[i] = now
        for i in range(4):
            state = node.state(i)
            assert set(state.throttle_seconds) == set(THROTTLE_REASONS)


def test_throttle_time_grows_only_while_active() -> None:
    node, _lib, clock = make("power_brake")
    clock.advance(0.9)
    before = node.state(2)
    assert before.throttle_seconds["hw_power_brake"] == 0.0
    assert before.throttle_seconds["sw_power_cap"] == pytest.approx(0.9)
    clock.advance(10.1)
    after = node.state(2)
    assert after.throttle_seconds["hw_power_brake"] == pytest.approx(10.0)
    assert after.throttle_seconds["sw_power_cap"] == pytest.approx(1.0)  # stopped when the brake engaged
    assert node.state(0).throttle_seconds["gpu_idle"] == pytest.approx(11.0)
    assert node.state(0).throttle_seconds["hw_power_brake"] == 0.0


def test_same_seed_same_readings() -> None:
    def trace(seed: int) -> list[tuple[int, int, int]]:
        _, lib, clock = make("overheating", seed=seed)
        out = []
        for _ in range(40):
            clock.advance(0.37)
            h = lib.nvmlDeviceGetHandleByIndex(2)
            out.append(
                (
                    lib.nvmlDeviceGetTemperature(h, 0),
                    lib.nvmlDeviceGetPowerUsage(h),
                    lib.nvmlDeviceGetTotalEnergyConsumption(h),
                )
            )
        return out

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_readings_do_not_depend_on_how_often_anyone_looked() -> None:
    node_a, _lib_a, clock_a = make("thermal_throttling")
    node_b, _lib_b, clock_b = make("thermal_throttling")
    for _ in range(100):
        clock_a.advance(0.3)
        node_a.state(2)
    clock_b.advance(30.0)
    a, b = node_a.state(2), node_b.state(2)
    assert a.throttle_seconds == pytest.approx(b.throttle_seconds)
    assert a.energy_joules == pytest.approx(b.energy_joules)
    assert a.temperature_core_celsius == b.temperature_core_celsius


def test_a_node_simulated_for_a_day_holds_a_bounded_noise_cache() -> None:
    """The noise is a pure function of (seed, GPU, channel, time): its cache must stay small however long a demo or a
    simulated fleet runs, and must never change a reading."""
    from gpuwatch.simulated.physics import _JITTER_CACHE_ENTRIES, Jitter

    clock = FakeClock()
    node = SimulatedNode("healthy", gpus=2, seed=7, clock=clock)
    readings = []
    for step in range(24 * 60):  # a day at one poll a minute
        clock.t = step * 60.0
        readings.append(node.state(0).power_watts)
    assert max(len(j._cache) for j in node._jitter) <= _JITTER_CACHE_ENTRIES
    fresh = Jitter(node._jitter[0].seed, 0)
    assert [fresh.at(0, t, 2.0) for t in (0.5, 43_200.3, 86_000.9)] == [
        node._jitter[0].at(0, t, 2.0) for t in (0.5, 43_200.3, 86_000.9)
    ]
    assert len(set(readings)) > 100  # the noise still moves


def test_a_wait_with_nothing_due_blocks_until_its_timeout_without_waking() -> None:
    """nvml.h nvmlEventSetWait_v2: "Waits on events and delivers events ... timeoutms: maximum amount of wait time in
    milliseconds": the driver blocks the caller until an event or the timeout. The simulated wait used to wake every
    0.1 s to look again (a quarter of an idle agent's CPU); now it sleeps once, and an emitted event still wakes it
    (test_emitted_xid_wakes_a_waiter_on_a_real_clock)."""
    node = SimulatedNode("healthy")
    lib = simulated_pynvml(node)
    lib.nvmlInit()
    es = lib.nvmlEventSetCreate()
    lib.nvmlDeviceRegisterEvents(lib.nvmlDeviceGetHandleByIndex(0), c.nvmlEventTypeXidCriticalError, es)
    naps: list[float] = []
    wait_for_change = node.wait_for_change

    def counted(timeout: float) -> None:
        naps.append(timeout)
        wait_for_change(timeout)

    node.wait_for_change = counted  # type: ignore[method-assign]
    start = time.monotonic()
    with pytest.raises(err(lib, "NVMLError_Timeout")):
        lib.nvmlEventSetWait_v2(es, 400)
    assert 0.39 <= time.monotonic() - start < 2.0
    assert len(naps) == 1 and naps[0] > 0.39, naps


def test_readings_hold_for_a_sample_period_as_the_drivers_do() -> None:
    """The driver answers from readings it samples in the background, so calls a few milliseconds apart agree: NVML
    API Reference, nvmlUtilization_t ("Each sample period may be between 1 second and 1/6 second, depending on the
    product being queried") and nvmlDeviceGetPowerUsage ("On Ampere (except GA100) or newer GPUs, the API returns
    power averaged over 1 sec interval"). The simulation holds a GPU's state for SENSOR_PERIOD_S, far inside those."""
    from gpuwatch.simulated.scenarios import SENSOR_PERIOD_S

    _node, lib, clock = make("busy", gpus=1)
    h = lib.nvmlDeviceGetHandleByIndex(0)
    clock.advance(30.0)
    first = (lib.nvmlDeviceGetPowerUsage(h), lib.nvmlDeviceGetTotalEnergyConsumption(h))
    clock.advance(SENSOR_PERIOD_S / 2)
    assert (lib.nvmlDeviceGetPowerUsage(h), lib.nvmlDeviceGetTotalEnergyConsumption(h)) == first
    clock.advance(1.0)  # a poll later: a new sample, and the energy counter has grown
    assert lib.nvmlDeviceGetTotalEnergyConsumption(h) > first[1]
