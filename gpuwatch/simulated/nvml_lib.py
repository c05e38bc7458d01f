"""A stand-in for the `pynvml` module over a SimulatedNode: same function names, signatures, constants,
struct attributes and NVMLError classes, so `backends/nvml.py` runs unchanged on it.

    lib = SimulatedNvml(SimulatedNode("overheating", gpus=8))
    lib.nvmlInit(); h = lib.nvmlDeviceGetHandleByIndex(2); lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)

Faithful where a backend can go wrong (read ../shared/reference/vendor-apis.md): Uninitialized before nvmlInit,
ref-counted init, InvalidArgument for non-handles, GpuIsLost from every call on a lost GPU, NotSupported for what
an H100 SXM lacks (fans, retired pages, acoustic thresholds, NVLink unless the node has it), per-field returns and
the timestamp-0 quirk in nvmlDeviceGetFieldValues, ns violation counters, mW / mJ / MHz units, a real blocking
nvmlEventSetWait_v2. Only names pynvml has are public here (tests/test_nvml_conformance.py checks).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from gpuwatch.simulated import nvml_constants as c
from gpuwatch.simulated.nvml_errors import (
    ERROR_CLASSES,
    NVMLError,
    NVMLLibraryMismatchError,
    error_string,
    nvmlExceptionClass,
)
from gpuwatch.simulated.nvml_fields import HwCounterQuirk, field_values
from gpuwatch.simulated.nvml_structs import (
    STRUCTS,
    c_nvmlEventData_t,
    c_nvmlFieldValue_t,
    c_nvmlMemory_t,
    c_nvmlMemory_v2_t,
    c_nvmlProcessInfo_v3_t,
    c_nvmlUtilization_t,
    c_nvmlViolationTime_t,
    nvmlFriendlyObject,
    nvmlPciInfo_t,
    nvmlStructToFriendlyObject,
)
from gpuwatch.simulated.scenarios import GpuSpec, GpuState, SimEvent, SimulatedNode

_CLOCKS = {
    c.NVML_CLOCK_GRAPHICS: "graphics",
    c.NVML_CLOCK_SM: "sm",
    c.NVML_CLOCK_MEM: "memory",
    c.NVML_CLOCK_VIDEO: "video",
}
_REASON_BITS = {
    "gpu_idle": c.nvmlClocksThrottleReasonGpuIdle,
    "applications_clocks": c.nvmlClocksThrottleReasonApplicationsClocksSetting,
    "sw_power_cap": c.nvmlClocksThrottleReasonSwPowerCap,
    "hw_slowdown": c.nvmlClocksThrottleReasonHwSlowdown,
    "sync_boost": c.nvmlClocksThrottleReasonSyncBoost,
    "sw_thermal": c.nvmlClocksThrottleReasonSwThermalSlowdown,
    "hw_thermal": c.nvmlClocksThrottleReasonHwThermalSlowdown,
    "hw_power_brake": c.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
    "display_clock": c.nvmlClocksThrottleReasonDisplayClockSetting,
    "board_limit": c.nvmlClocksThrottleReasonBoardLimit,
    "reliability": c.nvmlClocksThrottleReasonReliability,
}
_POLICIES = {
    c.NVML_PERF_POLICY_POWER: "power",
    c.NVML_PERF_POLICY_THERMAL: "thermal",
    c.NVML_PERF_POLICY_SYNC_BOOST: "sync_boost",
    c.NVML_PERF_POLICY_BOARD_LIMIT: "board_limit",
    c.NVML_PERF_POLICY_LOW_UTILIZATION: "low_utilization",
    c.NVML_PERF_POLICY_RELIABILITY: "reliability",
    c.NVML_PERF_POLICY_TOTAL_APP_CLOCKS: "total_app_clocks",
    c.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS: "total_base_clocks",
}
_PCIE_SPEED_MBPS = {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}
_PCI_DEVICE_ID = 0x233010DE  # H100 SXM5 80GB
_PCI_SUBSYSTEM_ID = 0x16C110DE
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId without MIG
_SUPPORTED_EVENTS = c.nvmlEventTypeAll  # the H100 fixture: 65439
_SUPPORTED_REASONS = c.nvmlClocksEventReasonAll  # the H100 fixture: 511
# Milliseconds each call took on the H100 (nvml-idle.json); slept only when latency_scale > 0.
_LATENCY_MS = {
    "nvmlInitWithFlags": 11.2,
    "nvmlDeviceGetPowerUsage": 2.04,
    "nvmlDeviceGetTotalEnergyConsumption": 3.24,
    "nvmlDeviceGetPerformanceState": 2.49,
    "nvmlDeviceGetUtilizationRates": 1.03,
    "nvmlDeviceGetTemperature": 0.27,
    "nvmlDeviceGetTemperatureThreshold": 1.0,
    "nvmlDeviceGetMarginTemperature": 1.38,
    "nvmlDeviceGetMaxClockInfo": 2.0,
    "nvmlDeviceGetApplicationsClock": 1.0,
    "nvmlDeviceGetCurrentClocksEventReasons": 0.34,
    "nvmlDeviceGetViolationStatus": 0.9,
    "nvmlDeviceGetEccMode": 2.08,
    "nvmlDeviceGetRemappedRows": 1.44,
    "nvmlDeviceGetPcieThroughput": 20.7,
    "nvmlDeviceGetCurrPcieLinkGeneration": 0.5,
    "nvmlDeviceGetPcieReplayCounter": 0.4,
    "nvmlDeviceGetMigMode": 0.42,
    "nvmlDeviceGetPowerSource": 0.22,
}


class _Device:
    """An opaque device handle (pynvml: a ctypes pointer); a fresh object per lookup, as pynvml returns."""

    __slots__ = ("_index", "_lib")

    def __init__(self, lib: SimulatedNvml, index: int) -> None:
        self._lib = lib
        self._index = index

    def __repr__(self) -> str:
        return f"<simulated c_nvmlDevice_t object at {id(self):#x}>"

    # Real handles are fresh pointer objects to one per-device struct: equal by the address they point at.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Device) and other._lib is self._lib and other._index == self._index

    def __hash__(self) -> int:
        return hash((id(self._lib), self._index))


class _EventSet:
    """An opaque event set: which GPUs registered for which event types since when, and what it delivered."""

    __slots__ = ("_delivered", "_freed", "_lib", "_registered")

    def __init__(self, lib: SimulatedNvml) -> None:
        self._lib = lib
        self._registered: dict[int, int] = {}  # gpu -> event type mask
        self._delivered: set[int] = set()
        self._freed = False

    def __repr__(self) -> str:
        return f"<simulated c_nvmlEventSet_t object at {id(self):#x}>"


class SimulatedNvml:
    """The `pynvml` module over a simulated node; every nvml* method mirrors pynvml's function of that name.

    `latency_scale` > 0 makes calls sleep that share of what they took on the H100 (off by default: tests stay
    fast). `hw_counter_quirk` chooses how the HW thermal / power-brake counter fields behave (nvml_fields.py).
    """

    def __init__(
        self,
        node: SimulatedNode,
        *,
        latency_scale: float = 0.0,
        hw_counter_quirk: HwCounterQuirk = "until_active",
    ) -> None:
        self._node = node
        self._latency_scale = latency_scale
        self._hw_counter_quirk: HwCounterQuirk = hw_counter_quirk
        self._lock = threading.Lock()
        self._refcount = 0

    # --- the gate every call passes ---------------------------------------------------------------------------
    def _enter(self, names: Sequence[str], handle: object = None, *, device: bool = False) -> int:
        """Uninitialized / InvalidArgument / injected faults / GpuIsLost, in that order; returns the GPU index."""
        with self._lock:
            if self._refcount == 0:
                raise NVMLError(c.NVML_ERROR_UNINITIALIZED)
        index = -1
        if device:
            if not isinstance(handle, _Device) or handle._lib is not self:
                raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
            index = handle._index
        code = self._node.faults.before_call(names, index if device else None)
        if code is not None:
            raise NVMLError(code)
        if device and self._node.is_lost(index):
            raise NVMLError(c.NVML_ERROR_GPU_IS_LOST)
        self._sleep(names[0])
        return index

    def _dev(self, name: str, handle: object, *aliases: str) -> tuple[GpuSpec, GpuState]:
        index = self._enter((name, *aliases), handle, device=True)
        return self._node.spec(index), self._node.state(index)

    def _spec(self, name: str, handle: object, *aliases: str) -> GpuSpec:
        return self._node.spec(self._enter((name, *aliases), handle, device=True))

    def _sleep(self, name: str, ms: float | None = None) -> None:
        if self._latency_scale > 0:
            time.sleep(self._latency_scale * (ms if ms is not None else _LATENCY_MS.get(name, 0.02)) / 1000.0)

    # --- init, system -----------------------------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> None:
        if self._node.library_missing or self._node.vendor != "nvidia":
            raise NVMLError(c.NVML_ERROR_LIBRARY_NOT_FOUND)
        code = self._node.faults.before_call(("nvmlInitWithFlags", "nvmlInit"), None)
        if code is not None:
            raise NVMLError(code)
        self._sleep("nvmlInitWithFlags")
        with self._lock:
            self._refcount += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        self._enter(("nvmlShutdown",))
        with self._lock:
            if self._refcount > 0:
                self._refcount -= 1

    def nvmlErrorString(self, result: int) -> str:
        return error_string(result)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter(("nvmlSystemGetDriverVersion",))
        return self._node.profile.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter(("nvmlSystemGetNVMLVersion",))
        return "13." + self._node.profile.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter(("nvmlSystemGetCudaDriverVersion",))
        return 13000

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter(("nvmlSystemGetCudaDriverVersion_v2",))
        return 13000

    # --- handles, identity ----------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._enter(("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"))
        return self._node.gpu_count  # a lost GPU still counts

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Device:
        self._enter(("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2"))
        if not isinstance(index, int) or not 0 <= index < self._node.gpu_count:
            raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Device:
        self._enter(("nvmlDeviceGetHandleByUUID",))
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i in range(self._node.gpu_count):
            if self._node.spec(i).uuid == wanted:
                return self._handle(i)
        raise NVMLError(c.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> _Device:
        self._enter(("nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2"))
        wanted = _parse_bus_id(pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId)
        for i in range(self._node.gpu_count):
            spec = self._node.spec(i)
            if wanted == (spec.pci_domain, spec.pci_bus, 0, 0):
                return self._handle(i)
        raise NVMLError(c.NVML_ERROR_NOT_FOUND)

    def _handle(self, index: int) -> _Device:
        if self._node.is_lost(index):
            raise NVMLError(c.NVML_ERROR_GPU_IS_LOST)
        return _Device(self, index)

    def nvmlDeviceGetIndex(self, handle: object) -> int:
        return self._spec("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        return self._spec("nvmlDeviceGetMinorNumber", handle).index

    def nvmlDeviceGetName(self, handle: object) -> str:
        return self._spec("nvmlDeviceGetName", handle).model

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._spec("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetSerial(self, handle: object) -> str:
        return self._spec("nvmlDeviceGetSerial", handle).serial

    def nvmlDeviceGetVbiosVersion(self, handle: object) -> str:
        return self._spec("nvmlDeviceGetVbiosVersion", handle).vbios_version

    def nvmlDeviceGetBoardPartNumber(self, handle: object) -> str:
        return self._spec("nvmlDeviceGetBoardPartNumber", handle).board_part_number

    def nvmlDeviceGetPciInfo(self, handle: object) -> nvmlPciInfo_t:
        return self._pci_info(("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3"), handle)

    def nvmlDeviceGetPciInfo_v3(self, handle: object) -> nvmlPciInfo_t:
        return self._pci_info(("nvmlDeviceGetPciInfo_v3",), handle)

    def _pci_info(self, names: tuple[str, ...], handle: object) -> nvmlPciInfo_t:
        spec = self._node.spec(self._enter(names, handle, device=True))
        info = nvmlPciInfo_t()
        info.busIdLegacy = f"{spec.pci_domain:04X}:{spec.pci_bus:02X}:00.0"
        info.domain = spec.pci_domain
        info.bus = spec.pci_bus
        info.device = 0
        info.pciDeviceId = _PCI_DEVICE_ID
        info.pciSubSystemId = _PCI_SUBSYSTEM_ID
        info.busId = spec.pci_bus_id
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        return self._spec("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetPersistenceMode(self, handle: object) -> int:
        self._spec("nvmlDeviceGetPersistenceMode", handle)
        return c.NVML_FEATURE_ENABLED

    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:
        self._spec("nvmlDeviceGetMigMode", device)
        return [c.NVML_DEVICE_MIG_DISABLE, c.NVML_DEVICE_MIG_DISABLE]

    def nvmlDeviceGetComputeMode(self, handle: object) -> int:
        self._spec("nvmlDeviceGetComputeMode", handle)
        return c.NVML_COMPUTEMODE_DEFAULT

    # --- temperature ------------------------------------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        _, state = self._dev("nvmlDeviceGetTemperature", handle)
        if sensor != c.NVML_TEMPERATURE_GPU:
            raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
        return round(state.temperature_core_celsius)

    def nvmlDeviceGetTemperatureV(self, handle: object, sensor: int, version: int = c.nvmlTemperature_v1) -> int:
        if version != c.nvmlTemperature_v1:
            raise NVMLError(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        _, state = self._dev("nvmlDeviceGetTemperatureV", handle)
        if sensor != c.NVML_TEMPERATURE_GPU:
            raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
        return round(state.temperature_core_celsius)

    def nvmlDeviceGetTemperatureThreshold(self, handle: object, threshold: int) -> int:
        spec = self._spec("nvmlDeviceGetTemperatureThreshold", handle)
        values = {
            c.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: spec.temp_shutdown_celsius,
            c.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: spec.temp_slowdown_celsius,
            c.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: spec.temp_memory_max_celsius,
            c.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: spec.temp_gpu_max_celsius,
        }
        if threshold in values:
            return int(values[threshold])
        if 0 <= threshold < c.NVML_TEMPERATURE_THRESHOLD_COUNT:  # acoustic and GPS: not on an H100 SXM
            raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)
        raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMarginTemperature(self, handle: object) -> int:
        spec, state = self._dev("nvmlDeviceGetMarginTemperature", handle)
        # nvidia-smi's "GPU T.Limit Temp": degrees left below max operating (H100 idle: 87 - 31 = 56).
        return round(spec.temp_gpu_max_celsius - state.temperature_core_celsius)

    # --- clocks and clock event reasons ------------------------------------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: object, type: int) -> int:
        _, state = self._dev("nvmlDeviceGetClockInfo", handle)
        return int(state.clocks_mhz[_clock_name(type)])

    def nvmlDeviceGetMaxClockInfo(self, handle: object, type: int) -> int:
        spec = self._spec("nvmlDeviceGetMaxClockInfo", handle)
        return spec.clock_max_mhz[_clock_name(type)]

    def nvmlDeviceGetApplicationsClock(self, handle: object, type: int) -> int:
        return self._app_clock("nvmlDeviceGetApplicationsClock", handle, type)

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: object, type: int) -> int:
        return self._app_clock("nvmlDeviceGetDefaultApplicationsClock", handle, type)

    def _app_clock(self, name: str, handle: object, clock_type: int) -> int:
        spec = self._spec(name, handle)
        clock = _clock_name(clock_type)
        if clock == "video":
            raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)
        return spec.clock_max_mhz[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return _reason_mask(state.throttle_active)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return _reason_mask(state.throttle_active)

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: object) -> int:
        self._spec("nvmlDeviceGetSupportedClocksEventReasons", handle)
        return _SUPPORTED_REASONS

    def nvmlDeviceGetSupportedClocksThrottleReasons(self, handle: object) -> int:
        self._spec("nvmlDeviceGetSupportedClocksThrottleReasons", handle)
        return _SUPPORTED_REASONS

    def nvmlDeviceGetViolationStatus(self, device: object, perfPolicyType: int) -> c_nvmlViolationTime_t:
        _, state = self._dev("nvmlDeviceGetViolationStatus", device)
        policy = _POLICIES.get(perfPolicyType)
        if policy is None:
            raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
        out = c_nvmlViolationTime_t()
        out.referenceTime = int(state.timestamp * 1e6)  # µs
        out.violationTime = int(state.policy_seconds[policy] * 1e9)  # ns
        return out

    # --- power ------------------------------------------------------------------------------------------------
    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetPowerUsage", handle)
        return int(state.power_watts * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetPowerManagementLimit", handle)
        return int(state.power_limit_watts * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetEnforcedPowerLimit", handle)
        return int(state.power_limit_enforced_watts * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: object) -> int:
        return int(self._spec("nvmlDeviceGetPowerManagementDefaultLimit", handle).power_limit_default_watts * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object) -> list[int]:
        spec = self._spec("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [int(spec.power_limit_min_watts * 1000), int(spec.power_limit_max_watts * 1000)]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetTotalEnergyConsumption", handle)
        return int(state.energy_joules * 1000)  # mJ

    def nvmlDeviceGetPowerSource(self, device: object) -> int:
        _, state = self._dev("nvmlDeviceGetPowerSource", device)
        return c.NVML_POWER_SOURCE_UNDERSIZED if state.power_source_undersized else c.NVML_POWER_SOURCE_AC

    def nvmlDeviceGetPerformanceState(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetPerformanceState", handle)
        return state.performance_state

    def nvmlDeviceGetPowerState(self, handle: object) -> int:
        _, state = self._dev("nvmlDeviceGetPowerState", handle)
        return state.performance_state

    # --- utilization, memory, fans, processes ----------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> c_nvmlUtilization_t:
        _, state = self._dev("nvmlDeviceGetUtilizationRates", handle)
        out = c_nvmlUtilization_t()
        out.gpu = round(state.utilization * 100)
        out.memory = round(state.memory_utilization * 100)
        return out

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> c_nvmlMemory_t | c_nvmlMemory_v2_t:
        if not version:
            spec, state = self._dev("nvmlDeviceGetMemoryInfo", handle)
            v1 = c_nvmlMemory_t()
            v1.total = spec.memory_total_bytes
            v1.used = spec.memory_reserved_bytes + state.memory_used_bytes  # v1 counts the driver's share
            v1.free = v1.total - v1.used
            return v1
        spec, state = self._dev("nvmlDeviceGetMemoryInfo", handle, "nvmlDeviceGetMemoryInfo_v2")
        if version != c.nvmlMemory_v2:
            raise NVMLError(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        v2 = c_nvmlMemory_v2_t()
        v2.version = version
        v2.total = spec.memory_total_bytes
        v2.reserved = spec.memory_reserved_bytes
        v2.used = state.memory_used_bytes
        v2.free = spec.memory_total_bytes - spec.memory_reserved_bytes - state.memory_used_bytes
        return v2

    def nvmlDeviceGetNumFans(self, device: object) -> int:
        self._spec("nvmlDeviceGetNumFans", device)
        return 0  # passively cooled SXM board

    def nvmlDeviceGetFanSpeed(self, handle: object) -> int:
        self._spec("nvmlDeviceGetFanSpeed", handle)
        raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetFanSpeed_v2(self, handle: object, fan: int) -> int:
        self._spec("nvmlDeviceGetFanSpeed_v2", handle)
        raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[nvmlFriendlyObject]:
        try:
            return self._processes(
                ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3"), handle
            )
        except NVMLError as err:
            if err.value != c.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            raise NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib version. "
                "Either use matching pyNVML and NVML lib versions or use a versioned function such as "
                "nvmlDeviceGetComputeRunningProcesses_v2"
            ) from None

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: object) -> list[nvmlFriendlyObject]:
        return self._processes(("nvmlDeviceGetComputeRunningProcesses_v2",), handle)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: object) -> list[nvmlFriendlyObject]:
        return self._processes(("nvmlDeviceGetComputeRunningProcesses_v3",), handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[nvmlFriendlyObject]:
        self._spec("nvmlDeviceGetGraphicsRunningProcesses", handle, "nvmlDeviceGetGraphicsRunningProcesses_v3")
        return []

    def _processes(self, names: tuple[str, ...], handle: object) -> list[nvmlFriendlyObject]:
        state = self._node.state(self._enter(names, handle, device=True))
        out = []
        for proc in state.processes:
            info = c_nvmlProcessInfo_v3_t()
            info.pid = proc.pid
            info.usedGpuMemory = proc.used_memory_bytes
            info.gpuInstanceId = _NO_INSTANCE
            info.computeInstanceId = _NO_INSTANCE
            out.append(nvmlStructToFriendlyObject(info))
        return out

    # --- ECC, row remapping, retired pages ---------------------------------------------------------------------
    def nvmlDeviceGetEccMode(self, handle: object) -> list[int]:
        self._spec("nvmlDeviceGetEccMode", handle)
        return [c.NVML_FEATURE_ENABLED, c.NVML_FEATURE_ENABLED]

    def nvmlDeviceGetTotalEccErrors(self, handle: object, errorType: int, counterType: int) -> int:
        _, state = self._dev("nvmlDeviceGetTotalEccErrors", handle)
        if counterType not in (c.NVML_VOLATILE_ECC, c.NVML_AGGREGATE_ECC):
            raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
        if errorType == c.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return state.counters.ecc_corrected
        if errorType == c.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return state.counters.ecc_uncorrected
        raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRemappedRows(self, device: object) -> tuple[int, int, int, int]:
        _, state = self._dev("nvmlDeviceGetRemappedRows", device)
        k = state.counters
        return (k.remapped_correctable, k.remapped_uncorrectable, int(k.remap_pending), int(k.remap_failed))

    def nvmlDeviceGetRetiredPages(self, device: object, sourceFilter: int) -> list[int]:
        self._spec("nvmlDeviceGetRetiredPages", device)
        raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)  # page retirement is pre-Ampere

    def nvmlDeviceGetRetiredPages_v2(self, device: object, sourceFilter: int) -> list[dict[str, int]]:
        self._spec("nvmlDeviceGetRetiredPages_v2", device)
        raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: object) -> int:
        self._spec("nvmlDeviceGetRetiredPagesPendingStatus", device)
        raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)

    # --- PCIe, NVLink -------------------------------------------------------------------------------------------
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object) -> int:
        return self._dev("nvmlDeviceGetCurrPcieLinkGeneration", handle)[1].pcie_generation

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int:
        return self._spec("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_max_generation

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: object) -> int:
        return self._spec("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle).pcie_gpu_max_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object) -> int:
        return self._dev("nvmlDeviceGetCurrPcieLinkWidth", handle)[1].pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int:
        return self._spec("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_max_width

    def nvmlDeviceGetPcieSpeed(self, device: object) -> int:
        return _PCIE_SPEED_MBPS[self._dev("nvmlDeviceGetPcieSpeed", device)[1].pcie_generation]

    def nvmlDeviceGetPcieReplayCounter(self, handle: object) -> int:
        return self._dev("nvmlDeviceGetPcieReplayCounter", handle)[1].counters.pcie_replays

    def nvmlDeviceGetPcieThroughput(self, device: object, counter: int) -> int:
        _, state = self._dev("nvmlDeviceGetPcieThroughput", device)  # sleeps ~20 ms × latency_scale
        if counter == c.NVML_PCIE_UTIL_TX_BYTES:
            return state.pcie_tx_kbps
        if counter == c.NVML_PCIE_UTIL_RX_BYTES:
            return state.pcie_rx_kbps
        raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> int:
        spec, state = self._dev("nvmlDeviceGetNvLinkState", device)
        _check_link(spec, link)
        return c.NVML_FEATURE_ENABLED if state.nvlink_up[link] else c.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, device: object, link: int, counter: int) -> int:
        spec, _ = self._dev("nvmlDeviceGetNvLinkErrorCounter", device)
        _check_link(spec, link)
        if not 0 <= counter < c.NVML_NVLINK_ERROR_COUNT:
            raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    # --- field values --------------------------------------------------------------------------------------------
    def nvmlDeviceGetFieldValues(
        self, handle: object, fieldIds: Sequence[int | tuple[int, int]]
    ) -> list[c_nvmlFieldValue_t]:
        index = self._enter(("nvmlDeviceGetFieldValues",), handle, device=True)
        self._sleep("nvmlDeviceGetFieldValues", 0.18 * len(fieldIds))
        spec, state = self._node.spec(index), self._node.state(index)
        return field_values(fieldIds, spec, state, self._hw_counter_quirk)

    # --- events --------------------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter(("nvmlEventSetCreate",))
        return _EventSet(self)

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        self._spec("nvmlDeviceGetSupportedEventTypes", handle)
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: object) -> None:
        index = self._enter(("nvmlDeviceRegisterEvents",), handle, device=True)
        es = self._event_set(eventSet)
        if eventTypes & ~_SUPPORTED_EVENTS:
            raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            if index not in es._registered:  # what happened before registering is never delivered
                es._delivered.update(e.seq for e in self._node.events_until(self._node.elapsed()) if e.gpu == index)
            es._registered[index] = es._registered.get(index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> c_nvmlEventData_t:
        return self._wait(("nvmlEventSetWait", "nvmlEventSetWait_v2"), eventSet, timeoutms)

    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> c_nvmlEventData_t:
        return self._wait(("nvmlEventSetWait_v2",), eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: object) -> None:
        self._enter(("nvmlEventSetFree",))
        es = self._event_set(eventSet)
        with self._lock:
            es._freed = True
            es._registered.clear()

    def _event_set(self, event_set: object) -> _EventSet:
        if not isinstance(event_set, _EventSet) or event_set._lib is not self or event_set._freed:
            raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    def _wait(self, names: tuple[str, ...], event_set: object, timeoutms: int) -> c_nvmlEventData_t:
        """Block up to `timeoutms` real milliseconds for an event; wake as soon as one is due.

        Events are due on the node's clock; the timeout runs on real time (a fake clock that nobody advances must
        not hang the event thread). A lost GPU in the set raises GpuIsLost once no event is left to deliver.
        """
        self._enter(names)
        es = self._event_set(event_set)
        deadline = time.monotonic() + max(0, timeoutms) / 1000.0
        while True:
            now = self._node.elapsed()
            event = self._next_due(es, now)
            if event is not None:
                return self._event_data(event)
            with self._lock:
                registered = list(es._registered)
            if any(self._node.is_lost(i) for i in registered):
                raise NVMLError(c.NVML_ERROR_GPU_IS_LOST)
            left = deadline - time.monotonic()
            if left <= 0:
                raise NVMLError(c.NVML_ERROR_TIMEOUT)
            if self._node.clock_is_real:
                nap = min(left, 0.1)
                upcoming = self._node.next_event_after(now)
                if upcoming is not None:
                    nap = min(nap, max(0.0005, upcoming - now))
            else:
                nap = min(left, 0.005)  # a fake clock moves when the test says: look again soon
            self._node.wait_for_change(nap)

    def _next_due(self, es: _EventSet, now: float) -> SimEvent | None:
        with self._lock:
            for event in self._node.events_until(now):
                if event.seq in es._delivered or event.kind != "xid":
                    continue
                if es._registered.get(event.gpu, 0) & c.nvmlEventTypeXidCriticalError:
                    es._delivered.add(event.seq)
                    return event
        return None

    def _event_data(self, event: SimEvent) -> c_nvmlEventData_t:
        data = c_nvmlEventData_t()
        data.device = _Device(self, event.gpu)
        data.eventType = c.nvmlEventTypeXidCriticalError
        data.eventData = event.code or 0
        data.gpuInstanceId = _NO_INSTANCE
        data.computeInstanceId = _NO_INSTANCE
        return data

    def __getattr__(self, name: str) -> Any:
        """For type checkers: constants and error classes are attached to the class below."""
        raise AttributeError(f"module 'pynvml' has no attribute {name!r}")


def _clock_name(clock_type: int) -> str:
    name = _CLOCKS.get(clock_type)
    if name is None:
        raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
    return name


def _reason_mask(reasons: frozenset[str]) -> int:
    mask = 0
    for reason in reasons:
        mask |= _REASON_BITS.get(reason, 0)
    return mask


def _check_link(spec: GpuSpec, link: int) -> None:
    if not 0 <= link < c.NVML_NVLINK_MAX_LINKS:
        raise NVMLError(c.NVML_ERROR_INVALID_ARGUMENT)
    if link >= spec.nvlink_links:
        raise NVMLError(c.NVML_ERROR_NOT_SUPPORTED)


def _parse_bus_id(bus_id: str) -> tuple[int, int, int, int] | None:
    """ "00000000:18:00.0", "0000:18:00.0" or "18:00.0" -> (domain, bus, device, function)."""
    try:
        parts = bus_id.strip().split(":")
        if len(parts) == 2:
            parts.insert(0, "0")
        domain, bus, rest = parts
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


# The module-level names of pynvml: constants, error classes, struct types, nvmlExceptionClass.
_MODULE_NAMES: dict[str, object] = {
    **{name: getattr(c, name) for name in dir(c) if not name.startswith("_") and isinstance(getattr(c, name), int)},
    **ERROR_CLASSES,
    **STRUCTS,
    "NVMLError": NVMLError,
    "NVMLLibraryMismatchError": NVMLLibraryMismatchError,
    "nvmlExceptionClass": staticmethod(nvmlExceptionClass),
}
for _name, _value in _MODULE_NAMES.items():
    setattr(SimulatedNvml, _name, _value)
