"""The NVML backend over the vendor's own binding: the real nvidia-ml-py (``pynvml``) over the simulated
libnvidia-ml of ``gpuwatch.simulated`` (``simulated_pynvml``), never over a Python stand-in of pynvml (one hid a
crash every real GPU would hit: an event set is an unhashable ctypes pointer).

The simulated healthy H100 is seeded from tests/fixtures/h100/nvml-idle.json: where a test checks a value the
fixture read (thresholds, clocks, limits, memory), it checks the fixture's number too. Whatever a test needs to go
wrong is injected as the driver would show it (``node.faults``: failing C functions, per-field answers of
nvmlDeviceGetFieldValues, NVLink error counters) or as a library option (symbols an older driver lacks, the
driver release); the backend has no test hooks.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.nvml import NvmlBackend, load_pynvml
from gpuwatch.core.model import THROTTLE_REASONS, GpuSample
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.scenarios import SimulatedNode

FIXTURE = json.loads((Path(__file__).resolve().parent / "fixtures/h100/nvml-idle.json").read_text())
CALLS = FIXTURE["calls"]
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
BITMASK_REASONS = THROTTLE_REASONS[:9]


def value(name: str) -> Any:
    """What the H100 of the fixture answered to nvmlDeviceGet<name> (or the system call <name>)."""
    return CALLS[name]["value"]


def ns_seconds(seconds: float) -> float:
    """A counter the driver keeps in ns (as the simulated library truncates it), read back in seconds."""
    return int(seconds * 1e9) / 1e9


# ----- the backend over the simulated library -----


class FakeClock:
    """The node's monotonic clock; tests move it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """The simulated library with every NVML call counted (by pynvml's function name)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._lib, name)
        if not name.startswith("nvml") or not callable(found) or isinstance(found, type):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return found(*args, **kwargs)

        return counted


@dataclass
class Sim:
    node: SimulatedNode
    lib: Any  # the module simulated_pynvml gave: the real pynvml over SimulatedLibNvml
    clock: FakeClock
    backend: NvmlBackend  # over Counting(lib)
    calls: Counter[str] = field(default_factory=Counter)  # the backend's calls

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    def samples(self, *, slow: bool = False) -> list[GpuSample]:
        samples = [reading.sample for reading in self.backend.poll(slow=slow)]
        assert all(sample is not None for sample in samples)
        return [sample for sample in samples if sample is not None]

    def handle(self, index: int) -> Any:
        return self.lib.nvmlDeviceGetHandleByIndex(index)

    def init_counts(self) -> tuple[int, int]:
        """nvmlInit calls not yet paired with nvmlShutdown: in the C library, and in pynvml's own count."""
        return self.lib.nvmlLib.driver._refcount, self.lib._nvmlLib_refcount


def simulate(
    scenario: str = "healthy",
    gpus: int = 4,
    *,
    opened: bool = True,
    index_offset: int = 0,
    library: dict[str, Any] | None = None,
    **options: Any,
) -> Sim:
    """A simulated node, the real pynvml over its library (``library``: SimulatedLibNvml's options) and a backend
    over that pynvml, opened unless asked not to (to inject faults first)."""
    clock = FakeClock()
    node = SimulatedNode(
        scenario=scenario, gpus=gpus, vendor="nvidia", seed=0, clock=clock, wall_clock=lambda: 1.75e9, **options
    )
    lib = simulated_pynvml(node, **(library or {}))
    counting = Counting(lib)
    backend = NvmlBackend(counting, index_offset=index_offset, clock=node.wall_time)
    sim = Sim(node, lib, clock, backend, counting.calls)
    if opened:
        sim.backend.open()
    return sim


@pytest.fixture
def sim() -> Iterator[Sim]:
    simulated = simulate()
    yield simulated
    simulated.backend.close()


def sample_of(sim: Sim, index: int = 0, *, slow: bool = False) -> GpuSample:
    sample = sim.backend.poll(slow=slow)[index].sample
    assert sample is not None
    return sample


# ----- the H100 as the fixture read it -----


def test_healthy_h100_reads_like_the_fixture() -> None:
    """Every fast reading in the schema's units, from the calls of nvml.h the fixture made."""
    sim = simulate(gpus=1, index_offset=4)
    reading = sim.backend.poll(slow=False)[0]
    identity, sample = reading.identity, reading.sample
    spec, state, handle, lib = sim.node.spec(0), sim.node.state(0), sim.handle(0), sim.lib
    assert sample is not None and reading.error is None
    assert identity.index == 4 and identity.vendor == "nvidia"
    assert identity.model == value("Name") == "NVIDIA H100 80GB HBM3"
    assert identity.driver_version == value("driver") and identity.vbios_version == value("VbiosVersion")
    assert identity.serial == spec.serial and identity.pci_bus_id == spec.pci_bus_id  # per simulated GPU
    assert identity.uuid == sample.uuid == spec.uuid and identity.uuid.startswith("GPU-")
    assert sample.timestamp == sim.node.wall_time()
    assert sample.temperature_celsius == {
        "core": float(lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)),
        "memory": float(int(state.temperature_memory_celsius)),
    }
    assert abs(sample.temperature_celsius["core"] - value("Temperature.gpu")) <= 6  # idle, as the fixture's 31 °C
    assert sample.power_watts == lib.nvmlDeviceGetPowerUsage(handle) / 1000
    assert sample.power_watts == pytest.approx(value("PowerUsage") / 1000, abs=10)
    assert sample.energy_joules == lib.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000
    idle_clocks = {"sm": "SM", "memory": "MEM", "graphics": "GRAPHICS", "video": "VIDEO"}
    assert sample.clock_hertz == {k: value(f"ClockInfo.{n}") * 1e6 for k, n in idle_clocks.items()}
    assert sample.clock_max_hertz == {k: value(f"MaxClockInfo.{n}") * 1e6 for k, n in idle_clocks.items()}
    assert sample.clock_max_hertz == {"sm": 1980e6, "memory": 2619e6, "graphics": 1980e6, "video": 1545e6}
    thresholds = {
        ("core", "slowdown"): "SLOWDOWN",
        ("core", "shutdown"): "SHUTDOWN",
        ("core", "max_operating"): "GPU_MAX",
        ("memory", "max_operating"): "MEM_MAX",
    }
    assert sample.temperature_threshold_celsius == {
        k: value(f"TemperatureThreshold.{n}") for k, n in thresholds.items()
    }
    assert sample.temperature_threshold_celsius == {
        ("core", "slowdown"): 89.0,
        ("core", "shutdown"): 95.0,
        ("core", "max_operating"): 87.0,
        ("memory", "max_operating"): 95.0,
    }
    assert value("CurrentClocksEventReasons") == lib.nvmlClocksEventReasonGpuIdle
    assert sample.throttle_active == {reason: reason == "gpu_idle" for reason in BITMASK_REASONS}
    assert sample.performance_state == value("PerformanceState") == 0
    assert sample.power_supply_undersized is False and value("PowerSource") == lib.NVML_POWER_SOURCE_AC
    assert sample.utilization_ratio == 0.0 and sample.memory_utilization_ratio == 0.0  # the fixture's 0 %, 0 %
    assert sample.memory_total_bytes == value("MemoryInfo")["total"] == 85520809984
    assert sample.memory_used_bytes == 0  # v2: the driver's reserved share apart
    assert sample.process_pids == () and value("ComputeRunningProcesses") == []


def test_first_poll_already_carries_the_slow_tier() -> None:
    sim = simulate(gpus=1)
    sample, state = sample_of(sim), sim.node.state(0)
    assert sample.power_limit_watts == {"enforced": 700.0, "default": 700.0, "min": 200.0, "max": 700.0}
    assert value("EnforcedPowerLimit") == value("PowerManagementDefaultLimit") == 700_000
    assert value("PowerManagementLimitConstraints") == [200_000, 700_000]
    assert sample.pcie_link_generation == {"current": 5, "max": 5}
    assert (value("CurrPcieLinkGeneration"), value("MaxPcieLinkGeneration")) == (5, 5)
    assert sample.pcie_link_width == {"current": 16, "max": 16}
    assert (value("CurrPcieLinkWidth"), value("MaxPcieLinkWidth")) == (16, 16)
    assert sample.pcie_replays_total == value("PcieReplayCounter") == 0
    assert sample.pcie_link_recoveries_total == state.counters.pcie_l0_recoveries  # the L0-to-recovery field
    assert sample.pcie_link_recoveries_total is not None and 100 <= sample.pcie_link_recoveries_total <= 142
    assert sample.ecc_enabled is True and value("EccMode") == [1, 1]
    assert sample.ecc_errors_total == {"corrected": 0, "uncorrected": 0}
    assert sample.remapped_rows_total == {"correctable": 0, "uncorrectable": 0} and value("RemappedRows") == [0] * 4
    assert sample.row_remap_pending is False and sample.row_remap_failed is False
    assert sample.recovery_action == 0
    assert sample.mig_enabled is False and sample.compute_mode == "default"
    assert sample.persistence_mode_enabled is True


def test_slow_tier_memory_health_counts_what_the_driver_counts() -> None:
    """nvmlDeviceGetTotalEccErrors (aggregate) and the recovery-action field, where the GPU has errors."""
    sim = simulate("ecc_uncorrectable")
    sim.advance(6.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    sample, counters = sim.samples(slow=True)[gpu], sim.node.state(gpu).counters
    assert sample.ecc_errors_total == {"corrected": counters.ecc_corrected, "uncorrected": counters.ecc_uncorrected}
    assert sample.ecc_errors_total["uncorrected"] == 2


def test_unsupported_readings_are_left_out_not_zero() -> None:
    """NotSupported (nvml.h) for what an H100 SXM lacks, and the fixture's timestamp-0 answers, are no readings."""
    sample = sample_of(simulate(gpus=1))
    assert sample.retired_pages is None  # NotSupported on an H100 (row remapping instead)
    assert sample.fan_speed_ratio == {} and value("NumFans") == 0  # no fans on an SXM board
    assert sample.nvlink_up == {} and sample.nvlink_errors_total == {}
    assert "hw_thermal" not in sample.throttle_counter_seconds  # timestamp 0 in the fixture
    assert "hw_power_brake" not in sample.throttle_counter_seconds


def test_slow_tier_values_persist_into_fast_samples() -> None:
    sim = simulate(gpus=2)
    first = sample_of(sim)
    calls = sim.calls["nvmlDeviceGetEnforcedPowerLimit"]
    second = sample_of(sim)
    assert sim.calls["nvmlDeviceGetEnforcedPowerLimit"] == calls  # a fast poll does not read limits
    assert second.power_limit_watts == first.power_limit_watts and second.pcie_link_generation["max"] == 5
    second.power_limit_watts["enforced"] = 1.0  # samples never share the kept dicts
    assert sample_of(sim).power_limit_watts["enforced"] == 700.0
    sample_of(sim, slow=True)
    assert sim.calls["nvmlDeviceGetEnforcedPowerLimit"] == calls + 2  # two GPUs


def test_fast_poll_costs_few_calls_and_never_pcie_throughput() -> None:
    """nvmlDeviceGetPcieThroughput blocks ~20 ms (the fixture's 20.7 ms): never in any poll."""
    sim = simulate(gpus=1)
    sim.backend.poll(slow=True)
    before = sum(sim.calls.values())
    sim.backend.poll(slow=False)
    assert sum(sim.calls.values()) - before <= 20
    assert sim.calls["nvmlDeviceGetFieldValues"] == 3  # the probe at open, then one batch per poll
    assert sim.calls["nvmlDeviceGetPcieThroughput"] == 0


# ----- throttle counters -----


def test_throttle_counters_from_the_reason_fields() -> None:
    """nvml.h NVML_FI_DEV_CLOCKS_EVENT_REASON_* / NVML_FI_DEV_PERF_POLICY_*: ns each reason has held the clocks
    down, read in the one batched nvmlDeviceGetFieldValues; nvmlDeviceGetViolationStatus is never needed."""
    sim = simulate("power_brake")
    sim.advance(5.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    counters, state = sim.samples()[gpu].throttle_counter_seconds, sim.node.state(gpu)
    policies, reasons = state.policy_seconds, state.throttle_seconds
    assert counters == {
        "sw_power_cap": ns_seconds(policies["power"]),
        "sync_boost": ns_seconds(policies["sync_boost"]),
        "sw_thermal": ns_seconds(reasons["sw_thermal"]),
        "hw_power_brake": ns_seconds(reasons["hw_power_brake"]),
        "board_limit": ns_seconds(policies["board_limit"]),
        "low_utilization": ns_seconds(policies["low_utilization"]),
        "reliability": ns_seconds(policies["reliability"]),
    }  # hw_thermal: timestamp 0 while it has not counted (the fixture's quirk)
    assert counters["hw_power_brake"] == pytest.approx(4.0, abs=0.3)  # braking since 1 s
    assert sim.calls["nvmlDeviceGetViolationStatus"] == 0


def test_throttle_counters_fall_back_to_violation_status() -> None:
    """Fields answering NotSupported one by one (nvml.h: nvmlFieldValue_t.nvmlReturn per field, the call
    succeeds): their reasons come from nvmlDeviceGetViolationStatus (violationTime in ns), the combined THERMAL
    policy standing for sw_thermal; the reasons with no policy (hw_thermal, hw_power_brake) have no counter."""
    sim = simulate("thermal_throttling", opened=False)
    for name in dir(sim.lib):
        if name.startswith(("NVML_FI_DEV_PERF_POLICY_", "NVML_FI_DEV_CLOCKS_EVENT_REASON_")):
            sim.node.faults.field(getattr(sim.lib, name), code=NOT_SUPPORTED)
    sim.backend.open()
    sim.advance(20.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    samples = sim.samples()
    counters, policies = samples[gpu].throttle_counter_seconds, sim.node.state(gpu).policy_seconds
    assert counters == {
        "sw_power_cap": ns_seconds(policies["power"]),
        "sw_thermal": ns_seconds(policies["thermal"]),
        "sync_boost": ns_seconds(policies["sync_boost"]),
        "board_limit": ns_seconds(policies["board_limit"]),
        "low_utilization": ns_seconds(policies["low_utilization"]),
        "reliability": ns_seconds(policies["reliability"]),
    }
    assert counters["sw_thermal"] > 5.0 and "memory" in samples[gpu].temperature_celsius  # other fields still read
    fixture_idle = value("ViolationStatus.LOW_UTILIZATION")["violationTime"] / 1e9  # 27.6 s since the driver loaded
    assert samples[0].throttle_counter_seconds["low_utilization"] == pytest.approx(fixture_idle + 20.0, abs=0.01)
    assert sim.calls["nvmlDeviceGetViolationStatus"] == 4 * 6


def test_sw_thermal_is_not_double_counted_from_the_combined_thermal_counter() -> None:
    """NVML_FI_DEV_PERF_POLICY_THERMAL counts software and hardware thermal slowdown together: it stands for
    sw_thermal only where NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN answers NotSupported. A GPU that
    held the clocks down 2 s for software and 5 s more for hardware thermal slowdown:"""
    u64 = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    sw_thermal, thermal = (
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
        pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL,
    )
    sim = simulate(gpus=1, opened=False)
    sim.node.faults.field(sw_thermal, value=2_000_000_000, value_type=u64)
    sim.node.faults.field(thermal, value=7_000_000_000, value_type=u64)
    sim.backend.open()
    assert sample_of(sim).throttle_counter_seconds["sw_thermal"] == 2.0
    sim.backend.close()

    sim.node.faults.field(sw_thermal, code=NOT_SUPPORTED)  # the newest rule for a field wins
    sim.backend.open()
    assert sample_of(sim).throttle_counter_seconds["sw_thermal"] == 7.0


def test_no_counters_at_all_where_neither_fields_nor_violation_status_exist() -> None:
    """A driver without nvmlDeviceGetFieldValues (pynvml: NVMLError_FunctionNotFound) whose
    nvmlDeviceGetViolationStatus answers NotSupported: no counters, asked once per GPU and policy."""
    sim = simulate(gpus=2, opened=False, library={"missing_symbols": {"nvmlDeviceGetFieldValues"}})
    sim.node.faults.fail("nvmlDeviceGetViolationStatus", NOT_SUPPORTED)
    sim.backend.open()
    sample = sample_of(sim)
    assert sample.throttle_counter_seconds == {} and "memory" not in sample.temperature_celsius
    assert sample.throttle_active["gpu_idle"] is True  # the store accumulates from these
    sample_of(sim)
    assert sim.calls["nvmlDeviceGetViolationStatus"] == 2 * 6  # asked once per GPU and policy, then remembered
    assert sim.calls["nvmlDeviceGetFieldValues"] == 1  # the first GPU's probe at open; missing: never asked again


def test_field_with_timestamp_zero_is_not_available() -> None:
    """nvml.h: nvmlDeviceGetFieldValues fills nvmlFieldValue_t per field; the H100 fixture showed fields
    answering NVML_SUCCESS with value 0 and timestamp 0 (not filled): no reading, not 0. A filled field is read
    from the union member its valueType names (a double here)."""
    sim = simulate(gpus=1)
    lib, faults = sim.lib, sim.node.faults
    empty = faults.field(lib.NVML_FI_DEV_MEMORY_TEMP, value=0, value_type=lib.NVML_VALUE_TYPE_UNSIGNED_INT, timestamp=0)
    assert "memory" not in sample_of(sim).temperature_celsius
    faults.remove(empty)
    faults.field(lib.NVML_FI_DEV_MEMORY_TEMP, value=36.5, value_type=lib.NVML_VALUE_TYPE_DOUBLE, timestamp=7)
    assert sample_of(sim).temperature_celsius["memory"] == 36.5


def test_only_supported_reasons_are_reported() -> None:
    """nvmlDeviceGetCurrentClocksEventReasons answering NotSupported: no reason is reported (not all False), and
    NotSupported is an answer, so the deprecated ThrottleReasons name is not tried."""
    sim = simulate(gpus=1, opened=False)
    sim.node.faults.fail("nvmlDeviceGetCurrentClocksEventReasons", NOT_SUPPORTED)
    sim.backend.open()
    assert sample_of(sim).throttle_active == {}
    assert sim.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0


def test_newer_reason_bits_count_where_the_device_supports_them() -> None:
    """pynvml.py: nvmlClocksThrottleReasonBoardLimit (0x200) and Reliability (0x400) lie outside
    nvmlClocksEventReasonAll (the fixture's supported mask, 511): reported only where
    nvmlDeviceGetSupportedClocksEventReasons includes them."""
    sim = simulate(gpus=1)
    assert len(sample_of(sim).throttle_active) == 9 and value("SupportedClocksEventReasons") == 511

    sim = simulate(gpus=1, opened=False, library={"supported_clocks_event_reasons": pynvml.nvmlClocksThrottleReasonAll})
    sim.node.faults.hold_clock_event_reasons(0, pynvml.nvmlClocksThrottleReasonBoardLimit)
    sim.backend.open()
    active = sample_of(sim).throttle_active
    assert active["board_limit"] is True and active["reliability"] is False and len(active) == 11


# ----- quirks of the binding -----


def test_function_not_found_falls_back_to_the_older_name_once() -> None:
    """A driver before nvmlDeviceGetCurrentClocksEventReasons (pynvml: NVMLError_FunctionNotFound when the symbol
    is not in the library) answers the deprecated nvmlDeviceGetCurrentClocksThrottleReasons; the missing name
    is asked once."""
    missing = {"nvmlDeviceGetCurrentClocksEventReasons"}
    sim = simulate(gpus=2, library={"missing_symbols": missing})
    for _ in range(3):
        assert sample_of(sim).throttle_active["gpu_idle"] is True
    assert sim.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert sim.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 6


def test_memory_falls_back_to_v1_where_the_driver_lacks_v2() -> None:
    """pynvml.py nvmlDeviceGetMemoryInfo(handle, version) calls nvmlDeviceGetMemoryInfo_v2; without it the v1
    call's ``used`` includes the driver's reserved share (the fixture's 503316480 bytes at idle)."""
    sim = simulate(gpus=1, library={"missing_symbols": {"nvmlDeviceGetMemoryInfo_v2"}})
    sample = sample_of(sim)
    assert sample.memory_used_bytes == value("MemoryInfo")["used"] == sim.node.profile.memory_reserved_bytes
    assert sample.memory_total_bytes == value("MemoryInfo")["total"]


def test_process_list_falls_back_on_a_library_mismatch() -> None:
    """pynvml.py: nvmlDeviceGetComputeRunningProcesses is @throwOnVersionMismatch over _v3, so a driver without
    nvmlDeviceGetComputeRunningProcesses_v3 raises NVMLLibraryMismatchError; the backend asks _v2."""
    sim = simulate("busy", library={"missing_symbols": {"nvmlDeviceGetComputeRunningProcesses_v3"}})
    sim.advance(2.0)
    for _ in range(2):
        samples = sim.samples()
        assert [s.process_pids for s in samples] == [
            tuple(p.pid for p in sim.node.state(i).processes) for i in range(4)
        ]
    assert samples[0].process_pids
    assert sim.calls["nvmlDeviceGetComputeRunningProcesses"] == 1  # then remembered as missing
    assert sim.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 8


def test_not_supported_is_remembered_until_the_driver_changes() -> None:
    sim = simulate(gpus=1)
    for _ in range(3):
        sim.backend.poll(slow=True)
    assert sim.calls["nvmlDeviceGetRetiredPages"] == 2  # once per cause
    assert sim.calls["nvmlDeviceGetNvLinkState"] == pynvml.NVML_NVLINK_MAX_LINKS  # probed once at open
    sim.node.profile = replace(sim.node.profile, driver_version="580.200.01")
    reading = sim.backend.poll(slow=True)[0]
    assert reading.identity.driver_version == "580.200.01"
    assert sim.calls["nvmlDeviceGetRetiredPages"] == 4  # asked again after the driver change
    assert sim.calls["nvmlDeviceGetTemperatureThreshold"] == 8  # static tier re-read


def test_no_permission_is_not_available_but_asked_again() -> None:
    """NVML_ERROR_NO_PERMISSION is no reading, but not remembered as NotSupported is."""
    sim = simulate(gpus=1, opened=False)
    rule = sim.node.faults.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NO_PERMISSION, gpu=0)
    sim.backend.open()
    assert sample_of(sim).power_watts is None
    sim.node.faults.remove(rule)
    assert sample_of(sim).power_watts == sim.lib.nvmlDeviceGetPowerUsage(sim.handle(0)) / 1000


def test_nvlinks_that_exist_are_read_with_their_error_counters() -> None:
    """nvml.h nvmlDeviceGetNvLinkErrorCounter per link and nvmlNvLinkErrorCounter_t: crc sums the FLIT and DATA
    counters; a counter answering NotSupported (ECC_DATA here) is left out, not 0."""
    sim = simulate(gpus=1, opened=False, nvlink=True)
    faults, lib = sim.node.faults, sim.lib
    faults.set_nvlink_errors(0, 0, lib.NVML_NVLINK_ERROR_DL_RECOVERY, 1)
    for counter, count in enumerate((10, 11, 12, 13)):  # replay, recovery, crc flit, crc data
        faults.set_nvlink_errors(0, 1, counter, count)
    for link in range(18):
        faults.set_nvlink_errors(0, link, lib.NVML_NVLINK_ERROR_DL_ECC_DATA, None)
    sim.backend.open()
    sample = sample_of(sim)
    assert sample.nvlink_up == {str(link): True for link in range(18)}
    expected = {(str(link), kind): 0 for link in range(18) for kind in ("replay", "recovery", "crc")}
    expected.update({("0", "recovery"): 1, ("1", "replay"): 10, ("1", "recovery"): 11, ("1", "crc"): 25})
    assert sample.nvlink_errors_total == expected


# ----- failures -----


def test_a_lost_gpu_has_no_sample_while_the_others_are_read() -> None:
    """NVML_ERROR_GPU_IS_LOST from one GPU's call: that GPU has no sample, the others are read; when it answers
    again its static tier is read afresh."""
    sim = simulate(gpus=3)
    sim.backend.poll(slow=False)
    rule = sim.node.faults.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=1)
    readings = sim.backend.poll(slow=False)
    assert [r.sample is not None for r in readings] == [True, False, True]
    assert readings[1].error is not None and "lost" in readings[1].error
    assert readings[1].identity.uuid == sim.node.spec(1).uuid
    sim.node.faults.remove(rule)
    thresholds = sim.calls["nvmlDeviceGetTemperatureThreshold"]
    assert sim.backend.poll(slow=False)[1].sample is not None
    assert sim.calls["nvmlDeviceGetTemperatureThreshold"] == thresholds + 4  # read afresh on return


def test_a_gpu_lost_before_open_is_skipped() -> None:
    sim = simulate(gpus=2, opened=False)
    sim.node.faults.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=0)
    sim.backend.open()
    assert [gpu.index for gpu in sim.backend.gpus()] == [1]
    assert [gpu.uuid for gpu in sim.backend.gpus()] == [sim.node.spec(1).uuid]


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "install the NVIDIA driver"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "/dev/nvidia"),
        (pynvml.NVML_ERROR_UNKNOWN, "nvmlInit"),
    ],
)
def test_library_failures_at_open_say_what_to_do(code: int, words: str) -> None:
    """nvml.h return codes of nvmlInit (pynvml.py nvmlInit -> nvmlInitWithFlags)."""
    sim = simulate(opened=False)
    sim.node.faults.fail("nvmlInit", code)
    with pytest.raises(BackendUnavailable, match=words):
        sim.backend.open()
    with pytest.raises(BackendUnavailable):
        sim.backend.poll(slow=False)
    sim.backend.close()
    assert sim.init_counts() == (0, 0) and sim.calls["nvmlShutdown"] == 0


def test_library_failure_while_polling_makes_the_backend_unavailable() -> None:
    sim = simulate()
    sim.node.faults.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(BackendUnavailable, match="reload the nvidia kernel modules"):
        sim.backend.poll(slow=False)
    sim.backend.close()
    assert sim.calls["nvmlShutdown"] == 1 and sim.calls["nvmlEventSetFree"] == 1
    assert sim.init_counts() == (0, 0)


def test_missing_binding_is_reported_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install 'gpuwatch-agent\[nvidia\]'"):
        load_pynvml()


def test_close_is_safe_when_never_opened() -> None:
    sim = simulate(opened=False)
    sim.backend.close()
    assert sim.calls["nvmlShutdown"] == 0 and sim.init_counts() == (0, 0)


# ----- events and versions -----


def test_xid_arrives_through_wait_events_with_the_gpu_uuid() -> None:
    """nvml.h nvmlEventSetWait_v2: nvmlEventData_t.device is the GPU's handle; NVML_ERROR_TIMEOUT when none."""
    sim = simulate(gpus=2)
    sim.node.faults.emit_xid(1, 79)
    events = sim.backend.wait_events(0.5)
    assert [(e.uuid, e.kind, e.code, e.timestamp, e.source) for e in events] == [
        (sim.node.spec(1).uuid, "xid", 79, sim.node.wall_time(), "nvml")
    ]
    assert sim.backend.gpus()[1].uuid == sim.node.spec(1).uuid
    assert sim.backend.wait_events(0.01) == []  # NVMLError_Timeout


def test_wait_events_from_another_thread_while_polling() -> None:
    sim = simulate(gpus=2)
    seen: list[int | None] = []
    waiter = threading.Thread(target=lambda: seen.extend(e.code for e in sim.backend.wait_events(2.0)))
    waiter.start()
    sim.node.faults.emit_xid(0, 48)
    for _ in range(5):
        sim.backend.poll(slow=False)
    waiter.join()
    assert seen == [48]


def test_wait_events_on_a_lost_gpu_or_without_event_support_sleeps_and_returns_nothing() -> None:
    """nvmlEventSetWait_v2 answers NVML_ERROR_GPU_IS_LOST for a lost GPU in the set; a GPU whose
    nvmlDeviceGetSupportedEventTypes answers NotSupported gets no event set at all."""
    sim = simulate()
    sim.node.faults.lose_gpu(0)
    started = time.monotonic()
    assert sim.backend.wait_events(0.05) == []
    assert time.monotonic() - started >= 0.04  # no busy loop in the event thread
    assert sim.calls["nvmlEventSetWait_v2"] == 1

    sim = simulate(opened=False)
    sim.node.faults.fail("nvmlDeviceGetSupportedEventTypes", NOT_SUPPORTED)
    sim.backend.open()
    assert sim.backend.wait_events(0.01) == [] and sim.calls["nvmlEventSetCreate"] == 0


def test_versions() -> None:
    """nvmlSystemGetNVMLVersion, nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion_v2 (13000 = 13.0)."""
    versions = simulate().backend.versions()
    assert versions["nvml"] == value("nvml_version") == "13.580.159.04"
    assert versions["driver"] == value("driver") == "580.159.04"
    assert versions["cuda_driver"] == "13.0" and value("cuda_driver") == 13000
    assert versions["nvidia-ml-py"]


def test_simulated_healthy_h100(sim: Sim) -> None:
    readings = sim.backend.poll(slow=False)
    assert [r.identity.index for r in readings] == [0, 1, 2, 3]
    assert len({r.identity.uuid for r in readings}) == 4
    for reading in readings:
        sample = reading.sample
        assert sample is not None and reading.error is None
        assert reading.identity.model == "NVIDIA H100 80GB HBM3" and reading.identity.driver_version == "580.159.04"
        assert reading.identity.pci_bus_id.startswith("00000000:")
        assert 25 <= sample.temperature_celsius["core"] <= 36 and 28 <= sample.temperature_celsius["memory"] <= 40
        assert sample.power_watts is not None and 60 <= sample.power_watts <= 80
        assert sample.clock_hertz["sm"] == 345e6 and sample.clock_max_hertz["sm"] == 1980e6
        assert sample.power_limit_watts == {"enforced": 700.0, "default": 700.0, "min": 200.0, "max": 700.0}
        assert sample.memory_total_bytes == 85520809984 and sample.memory_used_bytes == 0  # v2: reserved apart
        assert sample.throttle_active == {reason: reason == "gpu_idle" for reason in BITMASK_REASONS}
        assert sample.pcie_link_generation["max"] == 5 and 1 <= sample.pcie_link_generation["current"] <= 5
        assert sample.pcie_link_width == {"current": 16, "max": 16}  # idle links may drop a generation
        assert sample.ecc_errors_total == {"corrected": 0, "uncorrected": 0} and sample.recovery_action == 0
        assert sample.retired_pages is None and sample.fan_speed_ratio == {} and sample.nvlink_up == {}
        assert sample.timestamp == sim.node.wall_time()


def test_simulated_units_match_the_raw_calls(sim: Sim) -> None:
    sim.advance(3.0)
    sample, handle, lib = sim.samples()[1], sim.handle(1), sim.lib
    assert sample.power_watts == lib.nvmlDeviceGetPowerUsage(handle) / 1000
    assert sample.energy_joules == lib.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000
    assert sample.clock_hertz["memory"] == lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_MEM) * 1e6
    assert sample.temperature_celsius["core"] == lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)
    (memory_temp,) = lib.nvmlDeviceGetFieldValues(handle, [lib.NVML_FI_DEV_MEMORY_TEMP])
    assert sample.temperature_celsius["memory"] == memory_temp.value.uiVal
    low_utilization = lib.nvmlDeviceGetViolationStatus(handle, lib.NVML_PERF_POLICY_LOW_UTILIZATION)
    assert sample.throttle_counter_seconds["low_utilization"] == pytest.approx(low_utilization.violationTime / 1e9)


def test_simulated_fast_poll_cost() -> None:
    sim = simulate(gpus=8, opened=False)
    counting = Counting(sim.lib)
    backend = NvmlBackend(counting, clock=sim.node.wall_time)
    backend.open()
    backend.poll(slow=False)
    counting.calls.clear()
    backend.poll(slow=False)
    assert sum(counting.calls.values()) <= 8 * 20
    assert counting.calls["nvmlDeviceGetFieldValues"] == 8
    backend.poll(slow=True)
    assert counting.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert counting.calls["nvmlDeviceGetRetiredPages"] == 0  # NotSupported at the first slow poll: remembered
    backend.close()


def test_simulated_counters_from_fields_under_load() -> None:
    sim = simulate("busy")
    sim.advance(10.0)
    sample = sim.samples()[0]
    assert sample.throttle_active["sw_power_cap"] is True and sample.throttle_active["gpu_idle"] is False
    assert sample.throttle_counter_seconds["sw_power_cap"] == pytest.approx(10.0, abs=0.3)
    assert "hw_thermal" not in sample.throttle_counter_seconds  # timestamp 0 until it counts


def test_simulated_counters_fall_back_to_violation_status_then_to_nothing() -> None:
    sim = simulate("thermal_throttling", opened=False)
    sim.node.faults.fail("nvmlDeviceGetFieldValues", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sim.backend.open()
    sim.advance(20.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    sample = sim.samples()[gpu]
    state = sim.node.state(gpu)
    # the combined THERMAL counter stands in for sw_thermal (it counts hw_thermal too)
    assert sample.throttle_counter_seconds["sw_thermal"] == pytest.approx(state.policy_seconds["thermal"])
    assert "memory" not in sample.temperature_celsius and sample.pcie_link_recoveries_total is None

    sim = simulate("thermal_throttling", opened=False)
    sim.node.faults.fail("nvmlDeviceGetFieldValues", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sim.node.faults.fail("nvmlDeviceGetViolationStatus", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sim.backend.open()
    sim.advance(20.0)
    sample = sim.samples()[gpu]
    assert sample.throttle_counter_seconds == {}
    assert sample.throttle_active["sw_thermal"] in (True, False)  # the store accumulates from the bitmask


def test_simulated_sw_thermal_field_wins_over_the_combined_counter() -> None:
    sim = simulate("overheating")
    sim.advance(20.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    counters, state = sim.samples()[gpu].throttle_counter_seconds, sim.node.state(gpu)
    assert counters["sw_thermal"] == pytest.approx(state.throttle_seconds["sw_thermal"], abs=1e-6)
    assert counters["hw_thermal"] == pytest.approx(state.throttle_seconds["hw_thermal"], abs=1e-6)
    assert state.policy_seconds["thermal"] > counters["sw_thermal"]  # not double counted


def test_simulated_gpu_lost_mid_run(sim: Sim) -> None:
    sim.samples()
    sim.node.faults.lose_gpu(2)
    readings = sim.backend.poll(slow=False)
    assert [r.sample is None for r in readings] == [False, False, True, False]
    assert readings[2].error is not None and "lost" in readings[2].error
    assert readings[2].identity.uuid == sim.node.spec(2).uuid
    assert sim.backend.wait_events(0.01) == []  # the poll reports the loss
    sim.node.faults.restore_gpu(2)
    assert sim.samples(slow=False)[2].power_limit_watts["enforced"] == 700.0  # read afresh, slow tier too


def test_simulated_gpu_lost_scenario() -> None:
    sim = simulate("gpu_lost")
    sim.samples()
    sim.advance(7.0)
    readings = sim.backend.poll(slow=True)
    assert [r.sample is None for r in readings] == [False, False, True, False]


def test_simulated_library_missing() -> None:
    sim = simulate("backend_down", opened=False)
    with pytest.raises(BackendUnavailable, match=r"libnvidia-ml\.so\.1 was not found: install the NVIDIA driver"):
        sim.backend.open()
    sim.backend.close()
    sim = simulate(opened=False)
    sim.node.faults.fail("nvmlInit*", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendUnavailable, match="modprobe nvidia"):
        sim.backend.open()


def test_simulated_library_failing_while_polling(sim: Sim) -> None:
    sim.node.faults.fail("nvmlDevice*", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(BackendUnavailable, match="version"):
        sim.backend.poll(slow=False)


def test_simulated_function_not_found_fallbacks() -> None:
    sim = simulate(opened=False)
    missing = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    sim.node.faults.fail("nvmlDeviceGetCurrentClocksEventReasons", missing)
    sim.node.faults.fail("nvmlDeviceGetComputeRunningProcesses_v3", missing)  # NVMLLibraryMismatchError
    sim.node.faults.fail("nvmlDeviceGetMemoryInfo_v2", missing)
    sim.backend.open()
    sample = sim.samples()[0]
    assert sample.throttle_active["gpu_idle"] is True
    assert sample.process_pids == ()
    assert sample.memory_used_bytes == sim.node.profile.memory_reserved_bytes  # v1 counts the reserved share


def test_simulated_busy_processes_are_host_pids() -> None:
    sim = simulate("busy")
    sim.advance(2.0)
    sample = sim.samples()[0]
    assert sample.process_pids == tuple(p.pid for p in sim.node.state(0).processes) and sample.process_pids
    assert sample.utilization_ratio is not None and sample.utilization_ratio > 0.9


def test_simulated_xid_events() -> None:
    sim = simulate("xid")
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    assert sim.backend.wait_events(0.01) == []
    sim.advance(2.5)
    (event,) = sim.backend.wait_events(0.5)
    assert (event.uuid, event.kind, event.code, event.source) == (sim.node.spec(gpu).uuid, "xid", 13, "nvml")
    assert event.timestamp == sim.node.wall_time()
    sim.node.faults.emit_xid(0, 48)
    assert [(e.uuid, e.code) for e in sim.backend.wait_events(0.5)] == [(sim.node.spec(0).uuid, 48)]


def test_simulated_xid_from_another_thread_while_polling(sim: Sim) -> None:
    seen: list[int | None] = []
    waiter = threading.Thread(target=lambda: seen.extend(e.code for e in sim.backend.wait_events(2.0)))
    waiter.start()
    sim.backend.poll(slow=True)
    sim.node.faults.emit_xid(3, 94)
    for _ in range(3):
        sim.backend.poll(slow=False)
    waiter.join()
    assert seen == [94]


def test_simulated_event_set_not_supported_sleeps_out_the_timeout() -> None:
    sim = simulate(opened=False)
    sim.node.faults.fail("nvmlEventSetCreate", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sim.backend.open()
    started = time.monotonic()
    assert sim.backend.wait_events(0.05) == []
    assert time.monotonic() - started >= 0.04
    assert sim.samples()  # polling is unaffected


def test_simulated_slow_values_persist_until_the_next_slow_poll(sim: Sim) -> None:
    sim.samples()
    sim.node.set_power_limit(1, 500.0)
    assert sim.samples()[1].power_limit_watts["enforced"] == 700.0  # the slow tier's last value
    assert sim.samples(slow=True)[1].power_limit_watts["enforced"] == 500.0
    assert sim.samples()[1].power_limit_watts["enforced"] == 500.0


def test_simulated_driver_change_rereads_the_static_tier(sim: Sim) -> None:
    sim.samples()
    sim.node.profile = replace(sim.node.profile, driver_version="580.200.01")
    assert sim.backend.poll(slow=False)[0].identity.driver_version == "580.159.04"  # checked on slow polls
    readings = sim.backend.poll(slow=True)
    assert {r.identity.driver_version for r in readings} == {"580.200.01"}
    assert sim.backend.versions()["driver"] == "580.200.01"


def test_simulated_nvlink_present() -> None:
    sim = simulate(gpus=2, nvlink=True)
    sim.node.faults.set_nvlink_up(1, 3, False)
    sim.advance(0.5)  # the node keeps its readings for one moment
    samples = sim.samples()
    assert samples[0].nvlink_up == {str(link): True for link in range(18)}
    assert samples[1].nvlink_up["3"] is False and sum(samples[1].nvlink_up.values()) == 17
    assert samples[0].nvlink_errors_total[("5", "crc")] == 0
    assert {kind for _, kind in samples[0].nvlink_errors_total} == {"replay", "recovery", "crc", "ecc"}


def test_simulated_memory_health_faults() -> None:
    sim = simulate("row_remap_failure")
    sim.advance(2.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    sample = sim.samples(slow=True)[gpu]
    assert sample.remapped_rows_total == {"correctable": 0, "uncorrectable": 1}
    assert sample.row_remap_pending is True and sample.row_remap_failed is True and sample.recovery_action == 1


def test_simulated_pcie_degraded() -> None:
    sim = simulate("pcie_degraded")
    sim.advance(10.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    sample = sim.samples(slow=True)[gpu]
    assert sample.pcie_link_generation == {"current": 3, "max": 5}
    assert sample.pcie_link_width == {"current": 8, "max": 16}
    assert sample.pcie_replays_total and sample.pcie_replays_total > 0


def test_simulated_power_brake_and_undersized_supply() -> None:
    sim = simulate("psu_undervoltage")
    sim.advance(5.0)
    sample = sim.samples()[0]
    assert sample.power_supply_undersized is True
    assert sample.throttle_active["hw_power_brake"] is True and sample.throttle_active["hw_slowdown"] is True
    assert sample.throttle_counter_seconds["hw_power_brake"] == pytest.approx(4.0, abs=0.3)


# ----- what only the real binding shows (issue 13) -----


def test_open_registers_xid_events_over_the_real_binding() -> None:
    """pynvml.py nvmlEventSetCreate returns ``c_nvmlEventSet_t()``, a POINTER(struct_c_nvmlEventSet_t): an
    unhashable ctypes pointer. The backend passes it to nvmlDeviceRegisterEvents, and a NotSupported answer there is
    remembered with its arguments as the key: before the fix that crashed the open of every GPU offering XID
    events (nvmlDeviceGetSupportedEventTypes has nvmlEventTypeXidCriticalError) with "TypeError: unhashable type"
    in NvmlBackend._invoke, which a stand-in returning a string never showed."""
    sim = simulate(gpus=2, opened=False)
    lib = sim.lib
    lib.nvmlInit()
    for index in range(2):
        assert lib.nvmlDeviceGetSupportedEventTypes(sim.handle(index)) & lib.nvmlEventTypeXidCriticalError
    event_set = lib.nvmlEventSetCreate()
    assert isinstance(event_set, lib.c_nvmlEventSet_t)
    with pytest.raises(TypeError):
        hash(event_set)
    lib.nvmlEventSetFree(event_set)
    lib.nvmlShutdown()

    sim.node.faults.fail("nvmlDeviceRegisterEvents", NOT_SUPPORTED, gpu=1)  # remembered, event set as argument
    sim.backend.open()
    assert sim.calls["nvmlEventSetCreate"] == 1 and sim.calls["nvmlDeviceRegisterEvents"] == 2
    sim.node.faults.emit_xid(1, 31)  # GPU 1 is not registered: never delivered
    sim.node.faults.emit_xid(0, 79)
    events = sim.backend.wait_events(0.5)
    assert [(e.uuid, e.kind, e.code) for e in events] == [(sim.node.spec(0).uuid, "xid", 79)]
    assert sim.backend.wait_events(0.01) == []
    sim.backend.close()
    assert sim.calls["nvmlEventSetFree"] == 1 and sim.init_counts() == (0, 0)


def test_every_init_is_paired_with_a_shutdown_when_open_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """pynvml.py nvmlInit/nvmlShutdown count references (``_nvmlLib_refcount``) as libnvidia-ml does: an open that
    fails after nvmlInit, with a library failure or with anything unexpected, must shut NVML down again, or every
    reopen by the agent leaks one initialisation."""
    sim = simulate(opened=False)
    rule = sim.node.faults.fail("nvmlDeviceGetCount_v2", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(BackendUnavailable, match="reboot"):
        sim.backend.open()
    assert sim.init_counts() == (0, 0) and sim.calls["nvmlInit"] == sim.calls["nvmlShutdown"] == 1
    sim.node.faults.remove(rule)

    def broken(index: int) -> Any:
        raise RuntimeError("a bug between nvmlInit and the end of open")

    monkeypatch.setattr(sim.lib, "nvmlDeviceGetHandleByIndex", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        sim.backend.open()
    assert sim.init_counts() == (0, 0) and sim.calls["nvmlShutdown"] == 2
    monkeypatch.undo()

    sim.backend.open()
    assert sim.init_counts() == (1, 1)
    sim.backend.close()
    assert sim.init_counts() == (0, 0)


@pytest.mark.parametrize("scenario", ["power_brake", "overheating"])
@pytest.mark.parametrize(
    ("driver", "counter_ids", "smoothing_ids"),
    [
        ("570.172.08", None, (251, 252, 253)),
        ("575.57.08", (251, 252, 253), (256, 257, 258)),
        ("580.159.04", (269, 270, 271), (251, 252, 253)),
    ],
)
def test_throttle_time_fields_follow_the_driver_release(
    scenario: str, driver: str, counter_ids: tuple[int, int, int] | None, smoothing_ids: tuple[int, ...]
) -> None:
    """The NVML_FI_DEV_CLOCKS_EVENT_REASON_{SW_THERM,HW_THERM,HW_POWER_BRAKE}_SLOWDOWN ids of nvml.h are the
    driver's: none in R570 (nvidia-ml-py 12.570.86, where 251-253 are NVML_FI_PWR_SMOOTHING_ENABLED,
    _PRIV_LVL, _IMM_RAMP_DOWN_ENABLED and NVML_FI_MAX is 269), 251-253 in R575 (12.575.51, power smoothing
    moved to 256), 269-271 from 580.82 (13.580.82, power smoothing back at 251). The backend picks them by the
    driver's version, whatever pynvml is installed (gpuwatch/backends/nvml.py _THROTTLE_TIME_FIELDS; the
    simulation's numbering: nvml_fields.field_numbering). Without them sw_thermal comes from the combined
    NVML_FI_DEV_PERF_POLICY_THERMAL (75), and hw_thermal / hw_power_brake have no counter. The GPU here has
    power smoothing on (its fields answer 1): never read as a throttle counter."""
    sim = simulate(scenario, opened=False, library={"driver_version": driver, "hw_counter_quirk": "never"})
    for field_id in smoothing_ids:
        sim.node.faults.field(field_id, value=1, value_type=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
    sim.backend.open()
    assert sim.backend.versions()["driver"] == driver
    sim.advance(12.0)
    gpu = sim.node.info.fault_gpu
    assert gpu is not None
    counters, state = sim.samples()[gpu].throttle_counter_seconds, sim.node.state(gpu)
    if counter_ids is None:
        assert "hw_thermal" not in counters and "hw_power_brake" not in counters
        assert counters["sw_thermal"] == ns_seconds(state.policy_seconds["thermal"])
    else:
        for reason in ("sw_thermal", "hw_thermal", "hw_power_brake"):
            assert counters[reason] == ns_seconds(state.throttle_seconds[reason]), reason
    assert 1e-9 not in counters.values()  # no power-smoothing setting read as 1 ns
    active = "hw_power_brake" if scenario == "power_brake" else "hw_thermal"
    expected_seconds = state.throttle_seconds[active] if counter_ids else None
    assert counters.get(active) == (None if expected_seconds is None else ns_seconds(expected_seconds))
    assert expected_seconds is None or expected_seconds > 2.0  # the fault held the clocks down by now
