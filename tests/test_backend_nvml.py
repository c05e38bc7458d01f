"""The NVML backend over stand-ins for ``pynvml``.

``TinyNvml`` (below) is a deliberately small fake for the quirks, built from the real pynvml's constants, error
classes and ctypes structs so field values, event data and device handles behave exactly as on a real H100
(values from shared/fixtures/h100/nvml-idle.json). The simulated library of ``gpuwatch.simulated`` runs the
backend through whole scenarios in the tests at the end.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.nvml import NvmlBackend, load_pynvml
from gpuwatch.model import THROTTLE_REASONS, GpuSample
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.scenarios import SimulatedNode

FIXTURE = json.loads((Path(__file__).resolve().parent / "fixtures/h100/nvml-idle.json").read_text())
CALLS = FIXTURE["calls"]
H100_FIELDS = FIXTURE["fieldvalues"]
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
BITMASK_REASONS = THROTTLE_REASONS[:9]


def value(name: str) -> Any:
    return CALLS[name]["value"]


class TinyNvml:
    """A stand-in for ``pynvml`` serving the fixture's H100 readings on every GPU.

    ``errors[(function, gpu index or None)]`` makes a call raise that NVML code; ``fields[field id]`` overrides a
    field as ``(valueType, value, timestamp)`` or a return code; ``absent`` lists functions the driver lacks.
    """

    def __init__(self, gpus: int = 2) -> None:
        self._devices = [pynvml.struct_c_nvmlDevice_t() for _ in range(gpus)]
        self.calls: Counter[str] = Counter()
        self.errors: dict[tuple[str, int | None], int] = {}
        self.absent: set[str] = set()
        self.fields: dict[int, tuple[int, float, int] | int] = {}
        self.driver = value("driver")
        self.nvlinks = 0
        self.events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.initialised = False

    def __getattr__(self, name: str) -> Any:
        """Constants, structs and error classes of the real binding; never its functions (those are absent)."""
        found = getattr(pynvml, name)
        if callable(found) and not isinstance(found, type):
            raise AttributeError(name)
        return found

    # ----- plumbing -----

    def _enter(self, name: str, handle: Any = None) -> int | None:
        self.calls[name] = self.calls[name] + 1
        index = None if handle is None else self._index(handle)
        if name in self.absent:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        code = self.errors.get((name, index), self.errors.get((name, None)))
        if code is not None:
            raise pynvml.NVMLError(code)
        return index

    def _index(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        return next(i for i, d in enumerate(self._devices) if ctypes.addressof(d) == address)

    def _answer(self, key: str, handle: Any) -> Any:
        """nvmlDeviceGet<key> as the fixture read it."""
        self._enter(f"nvmlDeviceGet{key}", handle)
        return value(key)

    # ----- system -----

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return str(self.driver)

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return str(value("nvml_version"))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return int(value("cuda_driver"))

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        return ctypes.pointer(self._devices[index])  # a new pointer object on every call, as in pynvml

    # ----- identity and static -----

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        index = self._enter("nvmlDeviceGetUUID", handle)
        return f"{value('UUID')[:-1]}{index}"

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._answer("Name", handle))

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return str(self._answer("Serial", handle))

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return str(self._answer("VbiosVersion", handle))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        index = self._enter("nvmlDeviceGetPciInfo", handle)
        return type("Pci", (), {"busId": f"00000000:0{index}:00.0"})()

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        self._enter("nvmlDeviceGetTemperatureThreshold", handle)
        names = {0: "SHUTDOWN", 1: "SLOWDOWN", 2: "MEM_MAX", 3: "GPU_MAX"}
        if threshold not in names:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return int(value(f"TemperatureThreshold.{names[threshold]}"))

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", handle)
        return int(value("MaxClockInfo." + ("GRAPHICS", "SM", "MEM", "VIDEO")[clock]))

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        return int(self._answer("SupportedClocksEventReasons", handle))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return int(self._answer("SupportedEventTypes", handle))

    def nvmlDeviceGetNumFans(self, handle: Any) -> int:
        return int(self._answer("NumFans", handle))

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", handle)
        if link >= self.nvlinks:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        self._enter("nvmlDeviceGetNvLinkErrorCounter", handle)
        if counter == pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return 10 * link + counter

    # ----- fields -----

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        self._enter("nvmlDeviceGetFieldValues", handle)
        names = {getattr(pynvml, name): name for name in H100_FIELDS}
        names[pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION] = "recovery"
        answers = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for answer, field_id in zip(answers, field_ids, strict=True):
            answer.fieldId = field_id
            override = self.fields.get(field_id)
            if isinstance(override, int):
                answer.nvmlReturn = override
                continue
            if override is None:
                reading = H100_FIELDS.get(names.get(field_id, ""), {"type": 1, "value": 0, "ts": 1})
                if "ret" in reading:
                    answer.nvmlReturn = reading["ret"]
                    continue
                override = (reading["type"], reading["value"], reading["ts"])
            answer.valueType, answer.timestamp = override[0], override[2]
            member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[override[0]]
            setattr(answer.value, member, type(getattr(answer.value, member))(override[1]))
        return answers

    # ----- fast and slow readings -----

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(value("Temperature.gpu"))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._answer("PowerUsage", handle))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._answer("TotalEnergyConsumption", handle))

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle)
        return int(value("ClockInfo." + ("GRAPHICS", "SM", "MEM", "VIDEO")[clock]))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(self._answer("CurrentClocksEventReasons", handle))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return int(self._answer("CurrentClocksThrottleReasons", handle))

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        self._enter("nvmlDeviceGetViolationStatus", handle)
        names = {getattr(pynvml, f"NVML_PERF_POLICY_{n}"): n for n in ("POWER", "THERMAL", "SYNC_BOOST")}
        names.update({getattr(pynvml, f"NVML_PERF_POLICY_{n}"): n for n in ("BOARD_LIMIT", "LOW_UTILIZATION")})
        names[pynvml.NVML_PERF_POLICY_RELIABILITY] = "RELIABILITY"
        status = pynvml.c_nvmlViolationTime_t()
        status.violationTime = value(f"ViolationStatus.{names[policy]}")["violationTime"] + 1000 * policy
        return status

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=50, memory=25)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo" + ("_v2" if version else ""), handle)
        total, used = value("MemoryInfo")["total"], value("MemoryInfo")["used"]
        if version:
            return pynvml.c_nvmlMemory_v2_t(total=total, reserved=used - 4096, used=4096)
        return pynvml.c_nvmlMemory_t(total=total, used=used, free=total - used)

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return int(self._answer("PerformanceState", handle))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [type("Process", (), {"pid": 4242, "usedGpuMemory": 1 << 30})()]

    def nvmlDeviceGetPowerSource(self, handle: Any) -> int:
        return int(self._answer("PowerSource", handle))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._answer("EnforcedPowerLimit", handle))

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return int(self._answer("PowerManagementDefaultLimit", handle))

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        return list(self._answer("PowerManagementLimitConstraints", handle))

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        return list(self._answer("EccMode", handle))

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", handle)
        assert counter == pynvml.NVML_AGGREGATE_ECC
        return 3 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return tuple(self._answer("RemappedRows", handle))

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        self._enter("nvmlDeviceGetRetiredPages", handle)
        raise pynvml.NVMLError(NOT_SUPPORTED)

    def nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: int) -> int:
        self._enter("nvmlDeviceGetFanSpeed_v2", handle)
        raise pynvml.NVMLError(NOT_SUPPORTED)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return int(self._answer("CurrPcieLinkGeneration", handle))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return int(self._answer("MaxPcieLinkGeneration", handle))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return int(self._answer("CurrPcieLinkWidth", handle))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return int(self._answer("MaxPcieLinkWidth", handle))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return int(self._answer("PcieReplayCounter", handle))

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        raise AssertionError("nvmlDeviceGetPcieThroughput blocks 20 ms: never in a poll")

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return list(self._answer("MigMode", handle))

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return int(self._answer("ComputeMode", handle))

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return int(self._answer("PersistenceMode", handle))

    # ----- events -----

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        assert types == pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        deadline = time.monotonic() + timeout_ms / 1000
        while not self.events:
            if time.monotonic() >= deadline:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(0.001)
        index, xid = self.events.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.device = ctypes.pointer(self._devices[index])
        data.eventType, data.eventData = pynvml.nvmlEventTypeXidCriticalError, xid
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree")


def opened(lib: Any, **kwargs: Any) -> NvmlBackend:
    backend = NvmlBackend(lib, clock=lambda: 1000.0, **kwargs)
    backend.open()
    return backend


def sample_of(backend: NvmlBackend, index: int = 0, *, slow: bool = False) -> GpuSample:
    sample = backend.poll(slow=slow)[index].sample
    assert sample is not None
    return sample


# ----- the H100 as the fixture read it -----


def test_healthy_h100_reads_like_the_fixture() -> None:
    backend = opened(TinyNvml(), index_offset=4)
    reading = backend.poll(slow=False)[0]
    identity, sample = reading.identity, reading.sample
    assert sample is not None and reading.error is None
    assert identity.index == 4 and identity.vendor == "nvidia"
    assert identity.model == "NVIDIA H100 80GB HBM3" and identity.serial == "1753024033842"
    assert identity.driver_version == "580.159.04" and identity.vbios_version == "96.00.DA.00.0C"
    assert identity.uuid == sample.uuid and identity.uuid.startswith("GPU-edaa9d68")
    assert sample.timestamp == 1000.0
    assert sample.temperature_celsius == {"core": 31.0, "memory": 34.0}
    assert sample.power_watts == pytest.approx(71.864)
    assert sample.energy_joules == pytest.approx(2899.27)
    assert sample.clock_hertz == {"sm": 345e6, "memory": 2619e6, "graphics": 345e6, "video": 765e6}
    assert sample.clock_max_hertz == {"sm": 1980e6, "memory": 2619e6, "graphics": 1980e6, "video": 1545e6}
    assert sample.temperature_threshold_celsius == {
        ("core", "slowdown"): 89.0,
        ("core", "shutdown"): 95.0,
        ("core", "max_operating"): 87.0,
        ("memory", "max_operating"): 95.0,
    }
    assert sample.throttle_active == {reason: reason == "gpu_idle" for reason in BITMASK_REASONS}
    assert sample.performance_state == 0 and sample.power_supply_undersized is False
    assert sample.utilization_ratio == 0.5 and sample.memory_utilization_ratio == 0.25
    assert sample.memory_total_bytes == 85520809984 and sample.memory_used_bytes == 4096  # v2: no reserved
    assert sample.process_pids == (4242,)


def test_first_poll_already_carries_the_slow_tier() -> None:
    sample = sample_of(opened(TinyNvml()))
    assert sample.power_limit_watts == {"enforced": 700.0, "default": 700.0, "min": 200.0, "max": 700.0}
    assert sample.pcie_link_generation == {"current": 5, "max": 5}
    assert sample.pcie_link_width == {"current": 16, "max": 16}
    assert sample.pcie_replays_total == 0 and sample.pcie_link_recoveries_total == 142
    assert sample.ecc_enabled is True and sample.ecc_errors_total == {"corrected": 3, "uncorrected": 0}
    assert sample.remapped_rows_total == {"correctable": 0, "uncorrectable": 0}
    assert sample.row_remap_pending is False and sample.row_remap_failed is False
    assert sample.recovery_action == 0
    assert sample.mig_enabled is False and sample.compute_mode == "default"
    assert sample.persistence_mode_enabled is True


def test_unsupported_readings_are_left_out_not_zero() -> None:
    sample = sample_of(opened(TinyNvml()))
    assert sample.retired_pages is None  # NotSupported on an H100
    assert sample.fan_speed_ratio == {}  # no fans on an SXM board
    assert sample.nvlink_up == {} and sample.nvlink_errors_total == {}
    assert "hw_thermal" not in sample.throttle_counter_seconds  # timestamp 0 in the fixture
    assert "hw_power_brake" not in sample.throttle_counter_seconds


def test_slow_tier_values_persist_into_fast_samples() -> None:
    lib = TinyNvml()
    backend = opened(lib)
    first = sample_of(backend)
    calls = lib.calls["nvmlDeviceGetEnforcedPowerLimit"]
    second = sample_of(backend)
    assert lib.calls["nvmlDeviceGetEnforcedPowerLimit"] == calls  # a fast poll does not read limits
    assert second.power_limit_watts == first.power_limit_watts and second.pcie_link_generation["max"] == 5
    second.power_limit_watts["enforced"] = 1.0  # samples never share the kept dicts
    assert sample_of(backend).power_limit_watts["enforced"] == 700.0
    sample_of(backend, slow=True)
    assert lib.calls["nvmlDeviceGetEnforcedPowerLimit"] == calls + 2  # two GPUs


def test_fast_poll_costs_few_calls_and_never_pcie_throughput() -> None:
    lib = TinyNvml(gpus=1)
    backend = opened(lib)
    backend.poll(slow=True)
    before = sum(lib.calls.values())
    backend.poll(slow=False)
    assert sum(lib.calls.values()) - before <= 20
    assert lib.calls["nvmlDeviceGetFieldValues"] == 3  # the probe at open, then one batch per poll


# ----- throttle counters -----


def test_throttle_counters_from_the_reason_fields() -> None:
    lib = TinyNvml()
    lib.fields[pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP] = (3, 9_750_000_000, 1)
    lib.fields[pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN] = (3, 5_000_000_000, 1)
    counters = sample_of(opened(lib)).throttle_counter_seconds
    assert counters == {
        "sw_power_cap": 9.75,
        "sync_boost": 0.0,
        "sw_thermal": 0.0,
        "hw_power_brake": 5.0,
        "board_limit": 0.0,
        "low_utilization": pytest.approx(27.478484608),
        "reliability": 0.0,
    }
    assert lib.calls["nvmlDeviceGetViolationStatus"] == 0


def test_throttle_counters_fall_back_to_violation_status() -> None:
    lib = TinyNvml()
    for name in dir(pynvml):
        if name.startswith(("NVML_FI_DEV_PERF_POLICY_", "NVML_FI_DEV_CLOCKS_EVENT_REASON_")):
            lib.fields[getattr(pynvml, name)] = NOT_SUPPORTED
    counters = sample_of(opened(lib)).throttle_counter_seconds
    # violationTime (ns) + 1000 ns × policy in TinyNvml; the combined THERMAL counter stands for sw_thermal
    assert counters == {
        "sw_power_cap": pytest.approx(0.0),
        "sw_thermal": pytest.approx(1e-6),
        "sync_boost": pytest.approx(2e-6),
        "board_limit": pytest.approx(3e-6),
        "low_utilization": pytest.approx(27.604212128 + 4e-6),
        "reliability": pytest.approx(5e-6),
    }


def test_sw_thermal_is_not_double_counted_from_the_combined_thermal_counter() -> None:
    lib = TinyNvml()
    lib.fields[pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN] = (3, 2_000_000_000, 1)
    lib.fields[pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL] = (3, 7_000_000_000, 1)
    assert sample_of(opened(lib)).throttle_counter_seconds["sw_thermal"] == 2.0
    lib.fields[pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN] = NOT_SUPPORTED
    assert sample_of(opened(lib)).throttle_counter_seconds["sw_thermal"] == 7.0


def test_no_counters_at_all_where_neither_fields_nor_violation_status_exist() -> None:
    lib = TinyNvml()
    lib.absent.add("nvmlDeviceGetFieldValues")
    lib.errors[("nvmlDeviceGetViolationStatus", None)] = NOT_SUPPORTED
    backend = opened(lib)
    sample = sample_of(backend)
    assert sample.throttle_counter_seconds == {} and "memory" not in sample.temperature_celsius
    assert sample.throttle_active["gpu_idle"] is True  # the store accumulates from these
    sample_of(backend)
    assert lib.calls["nvmlDeviceGetViolationStatus"] == 2 * 6  # asked once per GPU and policy, then remembered


def test_field_with_timestamp_zero_is_not_available() -> None:
    lib = TinyNvml()
    lib.fields[pynvml.NVML_FI_DEV_MEMORY_TEMP] = (1, 0, 0)  # NVML_SUCCESS, value 0, timestamp 0
    sample = sample_of(opened(lib))
    assert "memory" not in sample.temperature_celsius
    lib.fields[pynvml.NVML_FI_DEV_MEMORY_TEMP] = (0, 36.5, 7)  # a double this time
    assert sample_of(opened(lib)).temperature_celsius["memory"] == 36.5


def test_only_supported_reasons_are_reported() -> None:
    lib = TinyNvml()
    lib.errors[("nvmlDeviceGetCurrentClocksEventReasons", None)] = NOT_SUPPORTED
    lib.absent.add("nvmlDeviceGetCurrentClocksThrottleReasons")
    assert sample_of(opened(lib)).throttle_active == {}


# ----- quirks of the binding -----


def test_function_not_found_falls_back_to_the_older_name_once() -> None:
    lib = TinyNvml()
    lib.absent.add("nvmlDeviceGetCurrentClocksEventReasons")
    backend = opened(lib)
    for _ in range(3):
        assert sample_of(backend).throttle_active["gpu_idle"] is True
    assert lib.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert lib.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 6


def test_memory_falls_back_to_v1_where_the_driver_lacks_v2() -> None:
    lib = TinyNvml()
    lib.errors[("nvmlDeviceGetMemoryInfo_v2", None)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    sample = sample_of(opened(lib))
    assert sample.memory_used_bytes == value("MemoryInfo")["used"]


def test_process_list_falls_back_on_a_library_mismatch() -> None:
    lib = TinyNvml()

    def mismatch(handle: Any) -> list[Any]:
        raise pynvml.NVMLLibraryMismatchError("use nvmlDeviceGetComputeRunningProcesses_v2")

    lib.nvmlDeviceGetComputeRunningProcesses = mismatch  # type: ignore[method-assign]
    lib.nvmlDeviceGetComputeRunningProcesses_v2 = lambda handle: []  # type: ignore[attr-defined]
    assert sample_of(opened(lib)).process_pids == ()


def test_not_supported_is_remembered_until_the_driver_changes() -> None:
    lib = TinyNvml(gpus=1)
    backend = opened(lib)
    for _ in range(3):
        backend.poll(slow=True)
    assert lib.calls["nvmlDeviceGetRetiredPages"] == 2  # once per cause
    assert lib.calls["nvmlDeviceGetNvLinkState"] == pynvml.NVML_NVLINK_MAX_LINKS  # probed once at open
    lib.driver = "580.200.01"
    reading = backend.poll(slow=True)[0]
    assert reading.identity.driver_version == "580.200.01"
    assert lib.calls["nvmlDeviceGetRetiredPages"] == 4  # asked again after the driver change
    assert lib.calls["nvmlDeviceGetTemperatureThreshold"] == 8  # static tier re-read


def test_no_permission_is_not_available_but_asked_again() -> None:
    lib = TinyNvml(gpus=1)
    lib.errors[("nvmlDeviceGetPowerUsage", 0)] = pynvml.NVML_ERROR_NO_PERMISSION
    backend = opened(lib)
    assert sample_of(backend).power_watts is None
    del lib.errors[("nvmlDeviceGetPowerUsage", 0)]
    assert sample_of(backend).power_watts == pytest.approx(71.864)


def test_nvlinks_that_exist_are_read_with_their_error_counters() -> None:
    lib = TinyNvml(gpus=1)
    lib.nvlinks = 2
    sample = sample_of(opened(lib))
    assert sample.nvlink_up == {"0": True, "1": True}
    # TinyNvml counts 10 × link + counter; crc sums flit (2) and data (3); ecc is NotSupported
    assert sample.nvlink_errors_total == {
        ("0", "replay"): 0,
        ("0", "recovery"): 1,
        ("0", "crc"): 5,
        ("1", "replay"): 10,
        ("1", "recovery"): 11,
        ("1", "crc"): 25,
    }


# ----- failures -----


def test_a_lost_gpu_has_no_sample_while_the_others_are_read() -> None:
    lib = TinyNvml(gpus=3)
    backend = opened(lib)
    backend.poll(slow=False)
    lib.errors[("nvmlDeviceGetTemperature", 1)] = pynvml.NVML_ERROR_GPU_IS_LOST
    readings = backend.poll(slow=False)
    assert [r.sample is not None for r in readings] == [True, False, True]
    assert readings[1].error is not None and "lost" in readings[1].error
    assert readings[1].identity.uuid.endswith("1")
    del lib.errors[("nvmlDeviceGetTemperature", 1)]
    thresholds = lib.calls["nvmlDeviceGetTemperatureThreshold"]
    assert backend.poll(slow=False)[1].sample is not None
    assert lib.calls["nvmlDeviceGetTemperatureThreshold"] == thresholds + 4  # read afresh on return


def test_a_gpu_lost_before_open_is_skipped() -> None:
    lib = TinyNvml(gpus=2)
    lib.errors[("nvmlDeviceGetUUID", 0)] = pynvml.NVML_ERROR_GPU_IS_LOST
    backend = opened(lib)
    assert [gpu.index for gpu in backend.gpus()] == [1]


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
    lib = TinyNvml()
    lib.errors[("nvmlInit", None)] = code
    backend = NvmlBackend(lib)
    with pytest.raises(BackendUnavailable, match=words):
        backend.open()
    with pytest.raises(BackendUnavailable):
        backend.poll(slow=False)
    backend.close()


def test_library_failure_while_polling_makes_the_backend_unavailable() -> None:
    lib = TinyNvml()
    backend = opened(lib)
    lib.errors[("nvmlDeviceGetPowerUsage", None)] = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    with pytest.raises(BackendUnavailable, match="reload the nvidia kernel modules"):
        backend.poll(slow=False)
    backend.close()
    assert lib.calls["nvmlShutdown"] == 1 and lib.calls["nvmlEventSetFree"] == 1


def test_missing_binding_is_reported_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install 'gpuwatch\[nvidia\]'"):
        load_pynvml()


def test_close_is_safe_when_never_opened() -> None:
    NvmlBackend(TinyNvml()).close()


# ----- events and versions -----


def test_xid_arrives_through_wait_events_with_the_gpu_uuid() -> None:
    lib = TinyNvml(gpus=2)
    backend = opened(lib)
    lib.events.append((1, 79))
    events = backend.wait_events(0.01)
    assert [(e.uuid, e.kind, e.code, e.timestamp, e.source) for e in events] == [
        (backend.gpus()[1].uuid, "xid", 79, 1000.0, "nvml")
    ]
    assert backend.wait_events(0.01) == []  # NVMLError_Timeout


def test_wait_events_from_another_thread_while_polling() -> None:
    lib = TinyNvml(gpus=2)
    backend = opened(lib)
    seen: list[int | None] = []
    waiter = threading.Thread(target=lambda: seen.extend(e.code for e in backend.wait_events(0.5)))
    waiter.start()
    lib.events.append((0, 48))
    for _ in range(5):
        backend.poll(slow=False)
    waiter.join()
    assert seen == [48]


def test_wait_events_on_a_lost_gpu_or_without_event_support_sleeps_and_returns_nothing() -> None:
    lib = TinyNvml()
    backend = opened(lib)
    lib.errors[("nvmlEventSetWait_v2", None)] = pynvml.NVML_ERROR_GPU_IS_LOST
    started = time.monotonic()
    assert backend.wait_events(0.05) == []
    assert time.monotonic() - started >= 0.04  # no busy loop in the event thread

    lib = TinyNvml()
    lib.errors[("nvmlDeviceGetSupportedEventTypes", None)] = NOT_SUPPORTED
    backend = opened(lib)
    assert backend.wait_events(0.01) == [] and lib.calls["nvmlEventSetCreate"] == 0


def test_versions() -> None:
    versions = opened(TinyNvml()).versions()
    assert versions["nvml"] == "13.580.159.04" and versions["driver"] == "580.159.04"
    assert versions["cuda_driver"] == "13.0" and versions["nvidia-ml-py"]


# ----- the backend over the simulated library -----


class FakeClock:
    """The node's monotonic clock; tests move it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """The simulated library with every NVML call counted."""

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
    lib: Any
    clock: FakeClock
    backend: NvmlBackend

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    def samples(self, *, slow: bool = False) -> list[GpuSample]:
        samples = [reading.sample for reading in self.backend.poll(slow=slow)]
        assert all(sample is not None for sample in samples)
        return [sample for sample in samples if sample is not None]

    def handle(self, index: int) -> Any:
        return self.lib.nvmlDeviceGetHandleByIndex(index)


def simulate(scenario: str = "healthy", gpus: int = 4, *, opened: bool = True, **options: Any) -> Sim:
    clock = FakeClock()
    node = SimulatedNode(
        scenario=scenario, gpus=gpus, vendor="nvidia", seed=0, clock=clock, wall_clock=lambda: 1.75e9, **options
    )
    lib = simulated_pynvml(node)
    sim = Sim(node, lib, clock, NvmlBackend(lib, clock=node.wall_time))
    if opened:
        sim.backend.open()
    return sim


@pytest.fixture
def sim() -> Iterator[Sim]:
    simulated = simulate()
    yield simulated
    simulated.backend.close()


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


def test_newer_reason_bits_count_where_the_device_supports_them() -> None:
    lib = TinyNvml(gpus=1)
    lib.nvmlDeviceGetSupportedClocksEventReasons = lambda handle: 0x7FF  # type: ignore[method-assign]
    lib.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: 0x200  # type: ignore[method-assign]
    active = sample_of(opened(lib)).throttle_active
    assert active["board_limit"] is True and active["reliability"] is False and len(active) == 11
