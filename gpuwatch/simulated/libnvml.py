"""A simulated ``libnvidia-ml.so.1``: the C functions nvidia-ml-py looks up by name, over a SimulatedNode.

The real ``pynvml`` module runs on top of it unchanged (``gpuwatch.simulated.bindings`` loads it), so what the
backend meets is the vendor's own Python: its struct classes, error classes, string decoding, version fallbacks,
and handles that are ctypes pointers (unhashable, a fresh object per lookup). Every function here is a ctypes
function pointer with the C prototype of nvml.h: arguments arrive as the C side sees them (pointers as addresses,
enums as unsigned ints) and answers are written through the pointers, with an ``nvmlReturn_t`` as the result.

Faithful where a backend can go wrong (values and costs from tests/fixtures/h100/nvml-idle.json): Uninitialized
before nvmlInit and after the last nvmlShutdown, InvalidArgument for what is not a handle, injected faults,
GpuIsLost from every call on a lost GPU, InsufficientSize for short buffers, NotSupported for what an H100 SXM
lacks, per-field returns and the timestamp-0 quirk in nvmlDeviceGetFieldValues, the field numbering of the
driver's version, a real blocking nvmlEventSetWait_v2. A function the driver lacks is absent: pynvml then
raises FunctionNotFound, as it does on an older driver.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from ctypes import POINTER, c_int, c_int32, c_uint, c_ulonglong, c_void_p, cast
from typing import Any, TypeVar

from gpuwatch.simulated import nvml_constants as c
from gpuwatch.simulated.mig import MigDevice
from gpuwatch.simulated.nvml_errors import NvmlFailure
from gpuwatch.simulated.nvml_fields import HwCounterQuirk, field_numbering, fill_field_values
from gpuwatch.simulated.nvml_gpm import GPM_PROTOTYPES, GpmFunctions
from gpuwatch.simulated.nvml_mig import MIG_PROTOTYPES, MigFunctions, mig_name
from gpuwatch.simulated.nvml_structs import (
    nvmlEccSramErrorStatus_v1_t,
    nvmlEventData_t,
    nvmlFieldValue_t,
    nvmlGpuFabricInfo_t,
    nvmlGpuFabricInfo_v2_t,
    nvmlGpuFabricInfo_v3_t,
    nvmlMarginTemperature_t,
    nvmlMemory_t,
    nvmlMemory_v2_t,
    nvmlPciInfo_t,
    nvmlProcessInfo_t,
    nvmlRowRemapperHistogramValues_t,
    nvmlTemperature_t,
    nvmlUtilization_t,
    nvmlViolationTime_t,
)
from gpuwatch.simulated.scenarios import GpuSpec, GpuState, SimEvent, SimProcess, SimulatedNode

log = logging.getLogger(__name__)

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
_REMAP_BANKS = 2560  # an H100 80GB's memory banks (nvidia-smi -q: "Bank Remap Availability Histogram, Max")
_FABRIC_INFO_V2 = 0x02000024
_FABRIC_INFO_V3 = 0x3000028
# nvml.h's fabric health mask (nvidia-ml-py 13.615.71 pynvml.py, NVML_GPU_FABRIC_HEALTH_MASK_*): 2-bit fields
# NOT_SUPPORTED 0 / TRUE 1 / FALSE 2 for degraded bandwidth (shift 0), route recovery (2), route unhealthy (4) and
# access timeout recovery (6); a 4-bit incorrect configuration (shift 8: NONE 1, else which); the partition (12) and
# the global fabric manager (14), which only multi-node NVLink systems report. An HGX H100 reports the first five.
_HEALTHY_FABRIC_MASK = (2 << 0) | (2 << 2) | (2 << 4) | (2 << 6) | (1 << 8)
_DEGRADED_BW_TRUE = 1 << 0
_FABRIC_SUMMARY_HEALTHY = 1  # NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
_FABRIC_SUMMARY_LIMITED_CAPACITY = 3
_SRAM_ECC_STATUS_V1 = 0x1000068
_FABRIC_STATE_NOT_SUPPORTED = 0
_FABRIC_STATE_COMPLETED = 3
_PCI_SUBSYSTEM_ID = 0x16C110DE
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId without MIG
_SUPPORTED_EVENTS = c.nvmlEventTypeAll  # the H100 fixture: 65439
_SUPPORTED_REASONS = c.nvmlClocksEventReasonAll  # the H100 fixture: 511
# Milliseconds each call took on the H100: the median of every call the backend made in one open, slow and fast polls
# and close (tests/fixtures/h100/nvml-backend-calls.json, driver 580.159.04), else the one read of nvml-idle.json;
# keyed by the C symbol pynvml calls; slept only when latency_scale > 0. tests/test_h100_backend_calls.py holds this
# table to that fixture.
_LATENCY_MS = {
    "nvmlDeviceGetClockInfo": 0.0095,
    "nvmlDeviceGetComputeMode": 0.03,
    "nvmlDeviceGetComputeRunningProcesses_v3": 0.043,
    "nvmlDeviceGetCount_v2": 0.026,
    "nvmlDeviceGetCurrPcieLinkGeneration": 0.46,
    "nvmlDeviceGetCurrPcieLinkWidth": 0.15,
    "nvmlDeviceGetCurrentClocksEventReasons": 0.015,
    "nvmlDeviceGetEccMode": 1.7,
    "nvmlDeviceGetEnforcedPowerLimit": 1.9,
    "nvmlDeviceGetFieldValues": 1.9,
    "nvmlDeviceGetGpuFabricInfoV": 0.043,
    "nvmlDeviceGetHandleByIndex_v2": 6.8,
    "nvmlDeviceGetMaxClockInfo": 2.1,
    "nvmlDeviceGetMaxPcieLinkGeneration": 0.02,
    "nvmlDeviceGetMaxPcieLinkWidth": 0.054,
    "nvmlDeviceGetMemoryInfo_v2": 0.054,
    "nvmlDeviceGetMigMode": 0.6,
    "nvmlDeviceGetName": 0.026,
    "nvmlDeviceGetNumFans": 0.39,
    "nvmlDeviceGetNvLinkState": 0.015,
    "nvmlDeviceGetPciInfo_v3": 0.12,
    "nvmlDeviceGetPcieReplayCounter": 0.4,
    "nvmlDeviceGetPerformanceState": 0.035,
    "nvmlDeviceGetPersistenceMode": 0.033,
    "nvmlDeviceGetPowerManagementDefaultLimit": 0.04,
    "nvmlDeviceGetPowerManagementLimitConstraints": 0.025,
    "nvmlDeviceGetPowerSource": 0.43,
    "nvmlDeviceGetPowerUsage": 0.017,
    "nvmlDeviceGetRemappedRows": 0.04,
    "nvmlDeviceGetRetiredPages": 0.21,
    "nvmlDeviceGetRowRemapperHistogram": 0.035,
    "nvmlDeviceGetSerial": 0.083,
    "nvmlDeviceGetSramEccErrorStatus": 0.032,
    "nvmlDeviceGetSupportedClocksEventReasons": 0.05,
    "nvmlDeviceGetSupportedEventTypes": 0.54,
    "nvmlDeviceGetTemperature": 0.029,
    "nvmlDeviceGetTemperatureThreshold": 0.79,
    "nvmlDeviceGetTotalEccErrors": 0.76,
    "nvmlDeviceGetTotalEnergyConsumption": 4.6,
    "nvmlDeviceGetUUID": 0.048,
    "nvmlDeviceGetUtilizationRates": 0.029,
    "nvmlDeviceGetVbiosVersion": 0.028,
    "nvmlDeviceRegisterEvents": 0.66,
    "nvmlDeviceValidateInforom": 71.0,
    "nvmlEventSetCreate": 0.088,
    "nvmlEventSetFree": 1.1,
    "nvmlGpmMetricsGet": 7.6,
    "nvmlGpmQueryDeviceSupport": 0.03,
    "nvmlGpmSampleAlloc": 0.024,
    "nvmlGpmSampleFree": 0.033,
    "nvmlGpmSampleGet": 0.19,
    "nvmlInitWithFlags": 12.0,
    "nvmlShutdown": 4.6,
    "nvmlSystemGetCudaDriverVersion_v2": 0.054,
    "nvmlSystemGetDriverVersion": 0.04,
    "nvmlSystemGetNVMLVersion": 0.046,
    # Not called by the backend's polls (nvml-idle.json, one read each):
    "nvmlDeviceGetMarginTemperature": 1.38,
    "nvmlDeviceGetApplicationsClock": 1.0,
    "nvmlDeviceGetViolationStatus": 0.9,
    "nvmlDeviceGetPcieThroughput": 20.7,
    "nvmlDeviceGetInforomImageVersion": 0.019,
}
# nvmlErrorString of the driver.
ERROR_STRINGS: dict[int, str] = {
    c.NVML_SUCCESS: "Success",
    c.NVML_ERROR_UNINITIALIZED: "Uninitialized",
    c.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    c.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    c.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    c.NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    c.NVML_ERROR_NOT_FOUND: "Not Found",
    c.NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    c.NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    c.NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    c.NVML_ERROR_TIMEOUT: "Timeout",
    c.NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    c.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    c.NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    c.NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    c.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    c.NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    c.NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    c.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    c.NVML_ERROR_IN_USE: "In use by another client",
    c.NVML_ERROR_MEMORY: "Insufficient Memory",
    c.NVML_ERROR_NO_DATA: "No data",
    c.NVML_ERROR_INSUFFICIENT_RESOURCES: "Ran out of critical resources, other than memory",
    c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "The provided version is invalid/unsupported",
    c.NVML_ERROR_DEPRECATED: "Requested functionality has been deprecated",
    c.NVML_ERROR_NOT_READY: "The system is not ready for the request",
    c.NVML_ERROR_GPU_NOT_FOUND: "No GPUs were found",
    c.NVML_ERROR_INVALID_STATE: "Resource not in correct state to perform requested operation",
    c.NVML_ERROR_UNKNOWN: "Unknown Error",
}

_P = c_void_p  # every pointer argument: the library sees an address, whatever the binding's struct class
_Impl = TypeVar("_Impl", bound=Callable[..., Any])
# C name -> (argument types, implementation method name); filled by @_export below.
_PROTOTYPES: dict[str, tuple[tuple[Any, ...], str]] = {}


def _export(*argtypes: Any, names: tuple[str, ...] = ()) -> Callable[[_Impl], _Impl]:
    """Declare a method as the C function(s) ``names`` (default: the method's name) with nvml.h's arguments."""

    def register(method: _Impl) -> _Impl:
        for name in names or (method.__name__,):
            _PROTOTYPES[name] = (argtypes, method.__name__)
        return method

    return register


class _EventSet:
    """What an nvmlEventSet_t points at: which GPUs registered for which event types, what was delivered."""

    def __init__(self) -> None:
        self.memory = ctypes.create_string_buffer(8)  # its address is the handle
        self.registered: dict[int, int] = {}  # gpu -> event type mask
        self.delivered: set[int] = set()


class SimulatedLibNvml:
    """The function table of libnvidia-ml over one simulated node: ``getattr(lib, "nvmlFoo")`` is what ctypes'
    CDLL gives pynvml, a function pointer, or AttributeError for a symbol the library does not have.

    `latency_scale` > 0 makes calls sleep that share of what they took on the H100 (off by default: tests stay
    fast). `hw_counter_quirk` chooses how the HW thermal / power-brake counter fields behave (nvml_fields.py).
    `driver_version` overrides the node's, for the differences between driver releases (field numbering).
    `missing_symbols` are C functions this library lacks (an older driver): looking one up fails as dlsym does,
    and pynvml raises FunctionNotFound. `supported_clocks_event_reasons` is the mask
    nvmlDeviceGetSupportedClocksEventReasons answers (default the H100 fixture's 511, without the newer
    BoardLimit and Reliability bits). `compute_capability` makes every GPU another architecture's (8.0: an A100,
    before Hopper: no GPM).
    """

    def __init__(
        self,
        node: SimulatedNode,
        *,
        latency_scale: float = 0.0,
        hw_counter_quirk: HwCounterQuirk = "until_active",
        driver_version: str | None = None,
        missing_symbols: Iterable[str] = (),
        supported_clocks_event_reasons: int = _SUPPORTED_REASONS,
        compute_capability: tuple[int, int] | None = None,
    ) -> None:
        self.driver = _Driver(node, latency_scale, hw_counter_quirk, driver_version)
        self.driver.supported_reasons = supported_clocks_event_reasons
        self.driver.compute_capability_override = compute_capability
        missing = frozenset(missing_symbols)
        self._functions: dict[str, Any] = {}
        for name, (argtypes, method) in _PROTOTYPES.items():
            if name in missing:
                continue
            restype = c_void_p if name == "nvmlErrorString" else c_int
            implementation = _guarded(name, self.driver, getattr(self.driver, method))
            self._functions[name] = ctypes.CFUNCTYPE(restype, *argtypes)(implementation)

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"libnvidia-ml.so.1: undefined symbol: {name}")


def _guarded(name: str, driver: _Driver, implementation: Callable[..., int | None]) -> Callable[..., int]:
    """C cannot raise: a failure becomes its nvmlReturn_t, a bug in the simulation NVML_ERROR_UNKNOWN."""

    def call(*args: Any) -> int:
        driver.calling.symbol = name
        try:
            result = implementation(*args)
        except NvmlFailure as failure:
            return failure.code
        except Exception:
            log.exception("simulated libnvidia-ml: %s failed", name)
            return c.NVML_ERROR_UNKNOWN
        return c.NVML_SUCCESS if result is None else int(result)

    return call


class _Driver(GpmFunctions, MigFunctions):
    """What the library's functions do: one method per C function (``@_export`` names it and its arguments;
    the GPM functions are GpmFunctions', nvml_gpm.py, the MIG ones MigFunctions', nvml_mig.py)."""

    def __init__(
        self, node: SimulatedNode, latency_scale: float, hw_counter_quirk: HwCounterQuirk, driver_version: str | None
    ) -> None:
        self.node = node
        self._driver_version = driver_version
        self._latency_scale = latency_scale
        self._hw_counter_quirk: HwCounterQuirk = hw_counter_quirk
        self._lock = threading.Lock()
        self.calling = threading.local()  # .symbol: the C function being called, for fault injection
        self._refcount = 0
        self.supported_reasons = _SUPPORTED_REASONS
        # One small block of memory per GPU: its address is the GPU's nvmlDevice_t, as in the driver.
        self._device_memory = [ctypes.create_string_buffer(8) for _ in range(node.gpu_count)]
        self._device_by_address = {ctypes.addressof(m): i for i, m in enumerate(self._device_memory)}
        self._event_sets: dict[int, _EventSet] = {}
        self._strings = {code: ctypes.create_string_buffer(text.encode()) for code, text in ERROR_STRINGS.items()}

    @property
    def driver_version(self) -> str:
        """The node's driver (a test may upgrade it underneath a running backend), unless fixed at creation."""
        return self._driver_version or self.node.profile.driver_version

    def device_handle_address(self, index: int) -> int:
        """The nvmlDevice_t of GPU ``index`` (what a handle from nvmlDeviceGetHandleByIndex points at)."""
        return ctypes.addressof(self._device_memory[index])

    # --- the gate every call passes ---------------------------------------------------------------------------
    def _enter(
        self, names: tuple[str, ...], device: int | None = None, *, needs_device: bool = False, about: int | None = None
    ) -> int:
        """Uninitialized / InvalidArgument / injected faults / GpuIsLost / NotSupported on a MIG device handle, in
        that order; returns the GPU index.

        Faults match the C symbol called, or a name of pynvml's that reaches it (``nvmlInit`` for
        nvmlInitWithFlags); never another symbol that shares the implementation. A MIG device handle reaches only
        the calls that take one (they call `_enter_any`): nvml.h documents the others for "the target device" alone,
        and names no code for a MIG handle there; the simulation answers NotSupported ("if the device does not
        support this feature"), as utilization is on a MIG-enabled GPU (nvml.h 13.3.29 line 7075).
        """
        if not needs_device:
            return self._gate(names, None, about)[0]
        index, mig = self._gate(names, device or 0, about)
        if mig is not None:
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        return index

    def _enter_any(
        self, names: tuple[str, ...], device: int | None = None, *, about: int | None = None
    ) -> tuple[int, MigDevice | None]:
        """The gate for a call that takes a GPU's handle or a MIG device's: (the GPU's index, the MIG device or
        None). A MIG device handle whose instance is gone is InvalidArgument (nvml.h line 13421: it "would remain
        invalid and must be requested again")."""
        return self._gate(names, device or 0, about)

    def _gate(self, names: tuple[str, ...], device: int | None, about: int | None) -> tuple[int, MigDevice | None]:
        symbol = getattr(self.calling, "symbol", names[0])
        names = (symbol, *(name for name in names if name != symbol and name not in _PROTOTYPES))
        with self._lock:
            if self._refcount == 0:
                raise NvmlFailure(c.NVML_ERROR_UNINITIALIZED)
        index = -1
        mig: MigDevice | None = None
        if device is not None:
            found = self._device_by_address.get(device or 0)
            if found is None:
                mig = self.mig_device_at(device)
                if mig is None:
                    raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
                found = mig.gpu
            index = found
        code = self.node.faults.before_call(names, index if device is not None else about)
        if code is not None:
            raise NvmlFailure(code)
        if device is not None and self.node.is_lost(index):
            raise NvmlFailure(c.NVML_ERROR_GPU_IS_LOST)
        self._sleep(names[0])
        return index, mig

    def _gpu(self, name: str, device: int | None, *aliases: str) -> tuple[GpuSpec, GpuState]:
        index = self._enter((name, *aliases), device, needs_device=True)
        return self.node.spec(index), self.node.state(index)

    def _spec(self, name: str, device: int | None, *aliases: str) -> GpuSpec:
        return self.node.spec(self._enter((name, *aliases), device, needs_device=True))

    def _sleep(self, name: str, ms: float | None = None) -> None:
        if self._latency_scale > 0:
            time.sleep(self._latency_scale * (ms if ms is not None else _LATENCY_MS.get(name, 0.02)) / 1000.0)

    # --- init, system -----------------------------------------------------------------------------------------
    @_export(c_uint)
    def nvmlInitWithFlags(self, flags: int) -> None:
        if self.node.library_missing or self.node.vendor != "nvidia":
            raise NvmlFailure(c.NVML_ERROR_LIBRARY_NOT_FOUND)  # what pynvml says when the .so is not there
        code = self.node.faults.before_call(("nvmlInitWithFlags", "nvmlInit"), None)
        if code is not None:
            raise NvmlFailure(code)
        self._sleep("nvmlInitWithFlags")
        with self._lock:
            self._refcount += 1

    @_export()
    def nvmlShutdown(self) -> None:
        self._enter(("nvmlShutdown",))
        with self._lock:
            self._refcount = max(0, self._refcount - 1)

    @_export(c_int)
    def nvmlErrorString(self, result: int) -> int:
        text = self._strings.get(result)
        if text is None:
            text = self._strings[result] = ctypes.create_string_buffer(f"Unknown Error (code {result})".encode())
        return ctypes.addressof(text)

    @_export(_P, c_uint)
    def nvmlSystemGetDriverVersion(self, out: int, length: int) -> None:
        self._enter(("nvmlSystemGetDriverVersion",))
        _write_string(out, length, self.driver_version)

    @_export(_P, c_uint)
    def nvmlSystemGetNVMLVersion(self, out: int, length: int) -> None:
        self._enter(("nvmlSystemGetNVMLVersion",))
        _write_string(out, length, ("13." if _major(self.driver_version) >= 580 else "12.") + self.driver_version)

    @_export(_P, names=("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2"))
    def nvmlSystemGetCudaDriverVersion(self, out: int) -> None:
        self._enter(("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2"))
        _write(out, c_int, 13000 if _major(self.driver_version) >= 580 else 12090)

    # --- handles, identity ----------------------------------------------------------------------------------
    @_export(_P)
    def nvmlDeviceGetCount_v2(self, out: int) -> None:
        self._enter(("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"))
        _write(out, c_uint, self.node.gpu_count)  # a lost GPU still counts

    @_export(c_uint, _P)
    def nvmlDeviceGetHandleByIndex_v2(self, index: int, out: int) -> None:
        # A fault for GPU `index` applies here: nvml.h lets this call answer NVML_ERROR_INSUFFICIENT_POWER
        # ("improperly attached external power cables") for that GPU.
        self._enter(("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2"), about=index)
        if not 0 <= index < self.node.gpu_count or not out:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        self._write_handle(index, out)

    @_export(_P, _P)
    def nvmlDeviceGetHandleByUUID(self, uuid: int, out: int) -> None:
        self._enter(("nvmlDeviceGetHandleByUUID",))
        wanted = ctypes.string_at(uuid).decode(errors="replace") if uuid else ""
        for i in range(self.node.gpu_count):
            if self.node.spec(i).uuid == wanted:
                return self._write_handle(i, out)
        if wanted.startswith("MIG-"):  # nvml.h line 4682: "The UUID of the target GPU or MIG instance"
            for i in range(self.node.gpu_count):
                for mig in self.node.mig_devices(i):
                    if mig.uuid == wanted:
                        if self.node.is_lost(i):
                            raise NvmlFailure(c.NVML_ERROR_GPU_IS_LOST)
                        return _write(out, c_void_p, self.mig_device_address(mig))
        raise NvmlFailure(c.NVML_ERROR_NOT_FOUND)

    @_export(_P, _P)
    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: int, out: int) -> None:
        self._enter(("nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2"))
        wanted = _parse_bus_id(ctypes.string_at(bus_id).decode(errors="replace") if bus_id else "")
        for i in range(self.node.gpu_count):
            spec = self.node.spec(i)
            if wanted == (spec.pci_domain, spec.pci_bus, 0, 0):
                return self._write_handle(i, out)
        raise NvmlFailure(c.NVML_ERROR_NOT_FOUND)

    def _write_handle(self, index: int, out: int) -> None:
        if self.node.is_lost(index):
            raise NvmlFailure(c.NVML_ERROR_GPU_IS_LOST)
        _write(out, c_void_p, self.device_handle_address(index))

    @_export(_P, _P)
    def nvmlDeviceGetIndex(self, device: int, out: int) -> None:
        """A MIG device's index under its parent (nvml.h line 4818: "indices that can be passed to
        nvmlDeviceGetMigDeviceHandleByIndex to retrieve an identical handle")."""
        index, mig = self._enter_any(("nvmlDeviceGetIndex",), device)
        _write(out, c_uint, index if mig is None else mig.index)

    @_export(_P, _P)
    def nvmlDeviceGetMinorNumber(self, device: int, out: int) -> None:
        _write(out, c_uint, self._spec("nvmlDeviceGetMinorNumber", device).index)

    @_export(_P, _P, c_uint)
    def nvmlDeviceGetName(self, device: int, out: int, length: int) -> None:
        index, mig = self._enter_any(("nvmlDeviceGetName",), device)
        spec = self.node.spec(index)
        _write_string(out, length, spec.model if mig is None else mig_name(spec, mig))

    @_export(_P, _P, c_uint)
    def nvmlDeviceGetUUID(self, device: int, out: int, length: int) -> None:
        """A MIG device's own `MIG-` UUID (nvml.h line 5170)."""
        index, mig = self._enter_any(("nvmlDeviceGetUUID",), device)
        _write_string(out, length, self.node.spec(index).uuid if mig is None else mig.uuid)

    @_export(_P, _P, c_uint)
    def nvmlDeviceGetSerial(self, device: int, out: int, length: int) -> None:
        _write_string(out, length, self._spec("nvmlDeviceGetSerial", device).serial)

    @_export(_P, _P, c_uint)
    def nvmlDeviceGetVbiosVersion(self, device: int, out: int, length: int) -> None:
        _write_string(out, length, self._spec("nvmlDeviceGetVbiosVersion", device).vbios_version)

    @_export(_P, _P, c_uint)
    def nvmlDeviceGetBoardPartNumber(self, device: int, out: int, length: int) -> None:
        _write_string(out, length, self._spec("nvmlDeviceGetBoardPartNumber", device).board_part_number)

    @_export(_P, _P, c_uint)
    def nvmlDeviceGetInforomImageVersion(self, device: int, out: int, length: int) -> None:
        """nvml.h 13.3.29 line 5281: NotSupported "if the device does not have an infoROM"."""
        self._spec("nvmlDeviceGetInforomImageVersion", device)
        image = self.node.profile.inforom_image_version
        if not image:
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        _write_string(out, length, image)

    @_export(_P, c_uint, _P, c_uint)
    def nvmlDeviceGetInforomVersion(self, device: int, inforom_object: int, out: int, length: int) -> None:
        """nvml.h 13.3.29 line 5254 (object: nvmlInforomObject_t, lines 1284-1289): an object the board lacks is
        NotSupported, as nvidia-smi's "N/A" for the H100's Power Management Object; one past the enum is invalid."""
        self._spec("nvmlDeviceGetInforomVersion", device)
        names = {c.NVML_INFOROM_OEM: "oem", c.NVML_INFOROM_ECC: "ecc", c.NVML_INFOROM_POWER: "power"}
        if not 0 <= inforom_object < c.NVML_INFOROM_COUNT:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        version = self.node.profile.inforom_object_versions.get(names.get(inforom_object, "den"))
        if version is None:
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        _write_string(out, length, version)

    @_export(_P, _P)
    def nvmlDeviceGetPciInfo_v3(self, device: int, out: int) -> None:
        spec = self._spec("nvmlDeviceGetPciInfo_v3", device, "nvmlDeviceGetPciInfo")
        info = _struct(out, nvmlPciInfo_t)
        info.busIdLegacy = f"{spec.pci_domain:04X}:{spec.pci_bus:02X}:00.0".encode()
        info.domain = spec.pci_domain
        info.bus = spec.pci_bus
        info.device = 0
        info.pciDeviceId = _PCI_DEVICE_ID
        info.pciSubSystemId = _PCI_SUBSYSTEM_ID
        info.busId = spec.pci_bus_id.encode()

    @_export(_P, _P, _P)
    def nvmlDeviceGetCudaComputeCapability(self, device: int, major: int, minor: int) -> None:
        spec = self._spec("nvmlDeviceGetCudaComputeCapability", device)
        capability = self.compute_capability_override or spec.compute_capability
        _write(major, c_int, capability[0])
        _write(minor, c_int, capability[1])

    @_export(_P, _P)
    def nvmlDeviceGetPersistenceMode(self, device: int, out: int) -> None:
        self._spec("nvmlDeviceGetPersistenceMode", device)
        _write(out, c_uint, c.NVML_FEATURE_ENABLED)

    @_export(_P, _P)
    def nvmlDeviceGetComputeMode(self, device: int, out: int) -> None:
        """nvml.h line 6757: "If MIG is enabled on a GPU, device must be MIG device handle"; the GPU's own handle then
        answers NotSupported (nvml.h names no code for it: unverified)."""
        index, mig = self._enter_any(("nvmlDeviceGetComputeMode",), device)
        if mig is None and self.mig_enabled(index):
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        _write(out, c_uint, c.NVML_COMPUTEMODE_DEFAULT)

    # --- temperature ------------------------------------------------------------------------------------------
    @_export(_P, c_uint, _P)
    def nvmlDeviceGetTemperature(self, device: int, sensor: int, out: int) -> None:
        _, state = self._gpu("nvmlDeviceGetTemperature", device)
        if sensor != c.NVML_TEMPERATURE_GPU:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        _write(out, c_uint, round(state.temperature_core_celsius))

    @_export(_P, _P)
    def nvmlDeviceGetTemperatureV(self, device: int, out: int) -> None:
        _, state = self._gpu("nvmlDeviceGetTemperatureV", device)
        reading = _struct(out, nvmlTemperature_t)
        if reading.version != c.nvmlTemperature_v1:
            raise NvmlFailure(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if reading.sensorType != c.NVML_TEMPERATURE_GPU:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        reading.temperature = round(state.temperature_core_celsius)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetTemperatureThreshold(self, device: int, threshold: int, out: int) -> None:
        spec = self._spec("nvmlDeviceGetTemperatureThreshold", device)
        values = {
            c.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: spec.temp_shutdown_celsius,
            c.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: spec.temp_slowdown_celsius,
            c.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: spec.temp_memory_max_celsius,
            c.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: spec.temp_gpu_max_celsius,
        }
        if threshold in values:
            return _write(out, c_uint, int(values[threshold]))
        if 0 <= threshold < c.NVML_TEMPERATURE_THRESHOLD_COUNT:  # acoustic and GPS: not on an H100 SXM
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)

    @_export(_P, _P)
    def nvmlDeviceGetMarginTemperature(self, device: int, out: int) -> None:
        spec, state = self._gpu("nvmlDeviceGetMarginTemperature", device)
        margin = _struct(out, nvmlMarginTemperature_t)
        if margin.version != c.nvmlMarginTemperature_v1:
            raise NvmlFailure(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        # nvidia-smi's "GPU T.Limit Temp": degrees left below max operating (H100 idle: 87 - 31 = 56).
        margin.marginTemperature = round(spec.temp_gpu_max_celsius - state.temperature_core_celsius)

    # --- clocks and clock event reasons ------------------------------------------------------------------------
    @_export(_P, c_uint, _P)
    def nvmlDeviceGetClockInfo(self, device: int, clock_type: int, out: int) -> None:
        _, state = self._gpu("nvmlDeviceGetClockInfo", device)
        _write(out, c_uint, int(state.clocks_mhz[_clock_name(clock_type)]))

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetMaxClockInfo(self, device: int, clock_type: int, out: int) -> None:
        _write(out, c_uint, self._spec("nvmlDeviceGetMaxClockInfo", device).clock_max_mhz[_clock_name(clock_type)])

    @_export(_P, c_uint, _P, names=("nvmlDeviceGetApplicationsClock", "nvmlDeviceGetDefaultApplicationsClock"))
    def nvmlDeviceGetApplicationsClock(self, device: int, clock_type: int, out: int) -> None:
        spec = self._spec("nvmlDeviceGetApplicationsClock", device, "nvmlDeviceGetDefaultApplicationsClock")
        clock = _clock_name(clock_type)
        if clock == "video":
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        _write(out, c_uint, spec.clock_max_mhz[clock])

    @_export(_P, _P, names=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"))
    def nvmlDeviceGetCurrentClocksEventReasons(self, device: int, out: int) -> None:
        spec, state = self._gpu(
            "nvmlDeviceGetCurrentClocksEventReasons", device, "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        held = self.node.faults.held_clock_event_reasons(spec.index)
        _write(out, c_ulonglong, _reason_mask(state.throttle_active) | held)

    @_export(_P, _P, names=("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons"))
    def nvmlDeviceGetSupportedClocksEventReasons(self, device: int, out: int) -> None:
        self._spec("nvmlDeviceGetSupportedClocksEventReasons", device, "nvmlDeviceGetSupportedClocksThrottleReasons")
        _write(out, c_ulonglong, self.supported_reasons)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetViolationStatus(self, device: int, policy_type: int, out: int) -> None:
        _, state = self._gpu("nvmlDeviceGetViolationStatus", device)
        policy = _POLICIES.get(policy_type)
        if policy is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        violation = _struct(out, nvmlViolationTime_t)
        violation.referenceTime = int(state.timestamp * 1e6)  # µs
        violation.violationTime = int(state.policy_seconds[policy] * 1e9)  # ns

    # --- power ------------------------------------------------------------------------------------------------
    @_export(_P, _P)
    def nvmlDeviceGetPowerUsage(self, device: int, out: int) -> None:
        _write(out, c_uint, int(self._gpu("nvmlDeviceGetPowerUsage", device)[1].power_watts * 1000))

    @_export(_P, _P)
    def nvmlDeviceGetPowerManagementLimit(self, device: int, out: int) -> None:
        _write(out, c_uint, int(self._gpu("nvmlDeviceGetPowerManagementLimit", device)[1].power_limit_watts * 1000))

    @_export(_P, _P)
    def nvmlDeviceGetEnforcedPowerLimit(self, device: int, out: int) -> None:
        state = self._gpu("nvmlDeviceGetEnforcedPowerLimit", device)[1]
        _write(out, c_uint, int(state.power_limit_enforced_watts * 1000))

    @_export(_P, _P)
    def nvmlDeviceGetPowerManagementDefaultLimit(self, device: int, out: int) -> None:
        spec = self._spec("nvmlDeviceGetPowerManagementDefaultLimit", device)
        _write(out, c_uint, int(spec.power_limit_default_watts * 1000))

    @_export(_P, _P, _P)
    def nvmlDeviceGetPowerManagementLimitConstraints(self, device: int, low: int, high: int) -> None:
        spec = self._spec("nvmlDeviceGetPowerManagementLimitConstraints", device)
        _write(low, c_uint, int(spec.power_limit_min_watts * 1000))
        _write(high, c_uint, int(spec.power_limit_max_watts * 1000))

    @_export(_P, _P)
    def nvmlDeviceGetTotalEnergyConsumption(self, device: int, out: int) -> None:
        state = self._gpu("nvmlDeviceGetTotalEnergyConsumption", device)[1]
        _write(out, c_ulonglong, int(state.energy_joules * 1000))  # mJ

    @_export(_P, _P)
    def nvmlDeviceGetPowerSource(self, device: int, out: int) -> None:
        state = self._gpu("nvmlDeviceGetPowerSource", device)[1]
        source = c.NVML_POWER_SOURCE_UNDERSIZED if state.power_source_undersized else c.NVML_POWER_SOURCE_AC
        _write(out, c_uint, source)

    @_export(_P, _P, names=("nvmlDeviceGetPerformanceState", "nvmlDeviceGetPowerState"))
    def nvmlDeviceGetPerformanceState(self, device: int, out: int) -> None:
        state = self._gpu("nvmlDeviceGetPerformanceState", device, "nvmlDeviceGetPowerState")[1]
        _write(out, c_uint, state.performance_state)

    # --- utilization, memory, fans, processes ----------------------------------------------------------------
    @_export(_P, _P)
    def nvmlDeviceGetUtilizationRates(self, device: int, out: int) -> None:
        """nvml.h line 7075: "On MIG-enabled GPUs, querying device utilization rates is not currently supported"."""
        spec, state = self._gpu("nvmlDeviceGetUtilizationRates", device)
        if self.mig_enabled(spec.index):
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        rates = _struct(out, nvmlUtilization_t)
        rates.gpu = round(state.utilization * 100)
        rates.memory = round(state.memory_utilization * 100)

    # In MIG mode the GPU's handle answers for the whole GPU, a MIG device's for its GPU instance alone (nvml.h lines
    # 6678-6680 and 6722-6724: "if device handle is provided, the API returns aggregate information ... Per-instance
    # information can be queried by using specific MIG device handles"). An instance's memory is its profile's,
    # shared by its compute instances, none of it reserved by the driver (a simplification).
    @_export(_P, _P)
    def nvmlDeviceGetMemoryInfo(self, device: int, out: int) -> None:
        total, reserved, used = self._memory(("nvmlDeviceGetMemoryInfo",), device)
        memory = _struct(out, nvmlMemory_t)
        memory.total = total
        memory.used = reserved + used  # v1 counts the driver's share
        memory.free = memory.total - memory.used

    @_export(_P, _P)
    def nvmlDeviceGetMemoryInfo_v2(self, device: int, out: int) -> None:
        total, reserved, used = self._memory(("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"), device)
        memory = _struct(out, nvmlMemory_v2_t)
        if memory.version != c.nvmlMemory_v2:
            raise NvmlFailure(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        memory.total = total
        memory.reserved = reserved
        memory.used = used
        memory.free = total - reserved - used

    def _memory(self, names: tuple[str, ...], device: int) -> tuple[int, int, int]:
        """(total, reserved by the driver, used by processes) of a GPU or a MIG device's GPU instance."""
        index, mig = self._enter_any(names, device)
        spec, state = self.node.spec(index), self.node.state(index)
        if mig is None:
            return spec.memory_total_bytes, spec.memory_reserved_bytes, state.memory_used_bytes
        used = sum(p.used_memory_bytes for p in state.processes if p.gpu_instance_id == mig.gpu_instance.id)
        return mig.gpu_instance.profile.memory_bytes, 0, used

    @_export(_P, _P)
    def nvmlDeviceGetNumFans(self, device: int, out: int) -> None:
        self._spec("nvmlDeviceGetNumFans", device)
        _write(out, c_uint, 0)  # passively cooled SXM board

    @_export(_P, _P)
    def nvmlDeviceGetFanSpeed(self, device: int, out: int) -> None:
        self._spec("nvmlDeviceGetFanSpeed", device)
        raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetFanSpeed_v2(self, device: int, fan: int, out: int) -> None:
        self._spec("nvmlDeviceGetFanSpeed_v2", device)
        raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)

    @_export(_P, _P, _P, names=("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"))
    def nvmlDeviceGetComputeRunningProcesses_v3(self, device: int, count: int, out: int) -> None:
        """A MIG device's processes, the GPU's all (nvml.h lines 7378-7380: "In MIG mode, if device handle is provided,
        the API returns aggregate information ... Per-instance information can be queried by using specific MIG device
        handles"), each with the GPU and compute instance it runs in (0xFFFFFFFF without MIG, lines 310-313)."""
        names = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3")
        index, mig = self._enter_any(names, device)
        processes: Sequence[SimProcess] = self.node.state(index).processes
        if mig is not None:
            processes = [
                p
                for p in processes
                if (p.gpu_instance_id, p.compute_instance_id) == (mig.gpu_instance.id, mig.compute_instance.id)
            ]
        _write_array(count, out, nvmlProcessInfo_t, processes, _fill_process)

    @_export(_P, _P, _P)
    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, device: int, count: int, out: int) -> None:
        self._spec("nvmlDeviceGetGraphicsRunningProcesses_v3", device, "nvmlDeviceGetGraphicsRunningProcesses")
        _write_array(count, out, nvmlProcessInfo_t, [], _fill_process)

    # --- ECC, row remapping, retired pages ---------------------------------------------------------------------
    @_export(_P, _P, _P)
    def nvmlDeviceGetEccMode(self, device: int, current: int, pending: int) -> None:
        self._spec("nvmlDeviceGetEccMode", device)
        _write(current, c_uint, c.NVML_FEATURE_ENABLED)
        _write(pending, c_uint, c.NVML_FEATURE_ENABLED)

    @_export(_P, c_uint, c_uint, _P)
    def nvmlDeviceGetTotalEccErrors(self, device: int, error_type: int, counter_type: int, out: int) -> None:
        _, state = self._gpu("nvmlDeviceGetTotalEccErrors", device)
        if counter_type not in (c.NVML_VOLATILE_ECC, c.NVML_AGGREGATE_ECC):
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        if error_type == c.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return _write(out, c_ulonglong, state.counters.ecc_corrected)
        if error_type == c.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return _write(out, c_ulonglong, state.counters.ecc_uncorrected)
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)

    @_export(_P, _P, _P, _P, _P)
    def nvmlDeviceGetRemappedRows(self, device: int, corr: int, unc: int, pending: int, failure: int) -> None:
        """nvml.h line 8431: NotSupported "If MIG is enabled"."""
        spec, state = self._gpu("nvmlDeviceGetRemappedRows", device)
        if self.mig_enabled(spec.index):
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        k = state.counters
        _write(corr, c_uint, k.remapped_correctable)
        _write(unc, c_uint, k.remapped_uncorrectable)
        _write(pending, c_uint, int(k.remap_pending))
        _write(failure, c_uint, int(k.remap_failed))

    @_export(_P, c_uint, _P, _P)
    def nvmlDeviceGetRetiredPages(self, device: int, cause: int, count: int, out: int) -> None:
        self._spec("nvmlDeviceGetRetiredPages", device)
        raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)  # page retirement is pre-Ampere

    # nvml.h has a fifth argument (timestamps), but pynvml's first call passes four; a C function would read a
    # garbage fifth, a ctypes prototype of five refuses the call: declare four, extra arguments pass through.
    @_export(_P, c_uint, _P, _P)
    def nvmlDeviceGetRetiredPages_v2(self, device: int, cause: int, count: int, out: int) -> None:
        self._spec("nvmlDeviceGetRetiredPages_v2", device)
        raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)

    @_export(_P, _P)
    def nvmlDeviceGetRowRemapperHistogram(self, device: int, out: int) -> None:
        """Banks by spare rows left: each remapped row takes one bank from max to high; a failed remap means a
        bank with none left."""
        k = self._gpu("nvmlDeviceGetRowRemapperHistogram", device)[1].counters
        histogram = _struct(out, nvmlRowRemapperHistogramValues_t)
        used = min(_REMAP_BANKS, k.remapped_correctable + k.remapped_uncorrectable)
        histogram.none = int(k.remap_failed)
        histogram.low = 0
        histogram.partial = 0
        histogram.high = max(0, used - histogram.none)
        histogram.max = _REMAP_BANKS - histogram.high - histogram.none

    @_export(_P, _P)
    def nvmlDeviceGetSramEccErrorStatus(self, device: int, out: int) -> None:
        """SRAM (on-die: L2, SM, PCIe, microcontroller) ECC totals and whether they passed the driver's threshold
        (nvidia-smi -q "SRAM Threshold Exceeded"; the fixture H100 reads No and zeros)."""
        spec = self._spec("nvmlDeviceGetSramEccErrorStatus", device)
        status = _struct(out, nvmlEccSramErrorStatus_v1_t)
        if status.version != _SRAM_ECC_STATUS_V1:
            raise NvmlFailure(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        exceeded = self.node.faults.sram_ecc_threshold_exceeded(spec.index)
        status.aggregateUncSecDed = status.aggregateUncBucketL2 = 3 if exceeded else 0
        status.bThresholdExceeded = int(exceeded)

    @_export(_P)
    def nvmlDeviceValidateInforom(self, device: int) -> None:
        self._spec("nvmlDeviceValidateInforom", device)

    @_export(_P, _P)
    def nvmlDeviceGetGpuFabricInfoV(self, device: int, out: int) -> None:
        """An NVLink (HGX) node has a fabric the GPU registered with; elsewhere the state is NOT_SUPPORTED,
        as the fixture's single PCIe-attached H100 shows ("Fabric State: N/A"). Version 2 adds the health mask,
        version 3 its summary (nvml.h nvmlGpuFabricInfo_v2/_v3). The driver answers either, whichever was asked,
        from the release whose nvml.h has it: v3 from 580 (NVML 13.0; go-nvml 9da9e13 "Bump nvml.h to 13.0.39"),
        v2 from 550 (NVML 12.4, the function itself; f7ceebd), so an older driver lacks this symbol
        (missing_symbols) and a 550-575 one refuses v3 with ArgumentVersionMismatch."""
        index = self._enter(("nvmlDeviceGetGpuFabricInfoV",), device, needs_device=True)
        version = _struct(out, nvmlGpuFabricInfo_v2_t).version
        known = (_FABRIC_INFO_V2, _FABRIC_INFO_V3) if _major(self.driver_version) >= 580 else (_FABRIC_INFO_V2,)
        if version not in known:
            raise NvmlFailure(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info = _struct(out, nvmlGpuFabricInfo_v3_t if version == _FABRIC_INFO_V3 else nvmlGpuFabricInfo_v2_t)
        self._fill_fabric(index, info)
        if info.state == _FABRIC_STATE_NOT_SUPPORTED:
            info.healthMask = 0  # every condition NOT_SUPPORTED
            if version == _FABRIC_INFO_V3:
                info.healthSummary = 0
            return
        degraded = self.node.fabric_degraded(index)
        mask = _HEALTHY_FABRIC_MASK
        if degraded:
            mask = (mask & ~0x3) | _DEGRADED_BW_TRUE
        info.healthMask = mask
        if version == _FABRIC_INFO_V3:
            info.healthSummary = _FABRIC_SUMMARY_LIMITED_CAPACITY if degraded else _FABRIC_SUMMARY_HEALTHY

    @_export(_P, _P)
    def nvmlDeviceGetGpuFabricInfo(self, device: int, out: int) -> None:
        """The unversioned call of drivers 525-545 (NVML 12.0, go-nvml c892d99), still answered by later ones
        (deprecated in 13.0): the registration state alone, no health."""
        index = self._enter(("nvmlDeviceGetGpuFabricInfo",), device, needs_device=True)
        self._fill_fabric(index, _struct(out, nvmlGpuFabricInfo_t))

    def _fill_fabric(self, index: int, info: Any) -> None:
        """The fields every version shares: registered (COMPLETED, SUCCESS) on an NVLink node, none elsewhere."""
        info.status = c.NVML_SUCCESS
        info.cliqueId = 0
        info.state = _FABRIC_STATE_COMPLETED if self.node.spec(index).nvlink_links else _FABRIC_STATE_NOT_SUPPORTED

    @_export(_P, _P)
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: int, out: int) -> None:
        self._spec("nvmlDeviceGetRetiredPagesPendingStatus", device)
        raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)

    # --- PCIe, NVLink -------------------------------------------------------------------------------------------
    @_export(_P, _P)
    def nvmlDeviceGetCurrPcieLinkGeneration(self, device: int, out: int) -> None:
        _write(out, c_uint, self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", device)[1].pcie_generation)

    @_export(_P, _P)
    def nvmlDeviceGetMaxPcieLinkGeneration(self, device: int, out: int) -> None:
        _write(out, c_uint, self._spec("nvmlDeviceGetMaxPcieLinkGeneration", device).pcie_max_generation)

    @_export(_P, _P)
    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, device: int, out: int) -> None:
        _write(out, c_uint, self._spec("nvmlDeviceGetGpuMaxPcieLinkGeneration", device).pcie_gpu_max_generation)

    @_export(_P, _P)
    def nvmlDeviceGetCurrPcieLinkWidth(self, device: int, out: int) -> None:
        _write(out, c_uint, self._gpu("nvmlDeviceGetCurrPcieLinkWidth", device)[1].pcie_width)

    @_export(_P, _P)
    def nvmlDeviceGetMaxPcieLinkWidth(self, device: int, out: int) -> None:
        _write(out, c_uint, self._spec("nvmlDeviceGetMaxPcieLinkWidth", device).pcie_max_width)

    @_export(_P, _P)
    def nvmlDeviceGetPcieSpeed(self, device: int, out: int) -> None:
        _write(out, c_uint, _PCIE_SPEED_MBPS[self._gpu("nvmlDeviceGetPcieSpeed", device)[1].pcie_generation])

    @_export(_P, _P)
    def nvmlDeviceGetPcieReplayCounter(self, device: int, out: int) -> None:
        _write(out, c_uint, self._gpu("nvmlDeviceGetPcieReplayCounter", device)[1].counters.pcie_replays)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetPcieThroughput(self, device: int, counter: int, out: int) -> None:
        state = self._gpu("nvmlDeviceGetPcieThroughput", device)[1]  # sleeps ~20 ms × latency_scale
        if counter == c.NVML_PCIE_UTIL_TX_BYTES:
            return _write(out, c_uint, state.pcie_tx_kbps)
        if counter == c.NVML_PCIE_UTIL_RX_BYTES:
            return _write(out, c_uint, state.pcie_rx_kbps)
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetNvLinkState(self, device: int, link: int, out: int) -> None:
        spec, state = self._gpu("nvmlDeviceGetNvLinkState", device)
        _check_link(spec, link)
        _write(out, c_uint, c.NVML_FEATURE_ENABLED if state.nvlink_up[link] else c.NVML_FEATURE_DISABLED)

    @_export(_P, c_uint, c_uint, _P)
    def nvmlDeviceGetNvLinkErrorCounter(self, device: int, link: int, counter: int, out: int) -> None:
        spec, _ = self._gpu("nvmlDeviceGetNvLinkErrorCounter", device)
        _check_link(spec, link)
        if not 0 <= counter < c.NVML_NVLINK_ERROR_COUNT:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        count = self.node.faults.nvlink_errors(spec.index, link, counter)
        if count is None:
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        _write(out, c_ulonglong, count)

    # --- field values --------------------------------------------------------------------------------------------
    @_export(_P, c_int32, _P)
    def nvmlDeviceGetFieldValues(self, device: int, count: int, values: int) -> None:
        index = self._enter(("nvmlDeviceGetFieldValues",), device, needs_device=True)
        if count < 0 or (count and not values):
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        self._sleep("nvmlDeviceGetFieldValues", 0.18 * count)
        array = cast(values, POINTER(nvmlFieldValue_t))
        answers = (array[i] for i in range(count))
        spec, state = self.node.spec(index), self.node.state(index)
        numbering = field_numbering(self.driver_version)
        fill_field_values(answers, spec, state, self._hw_counter_quirk, numbering, self.node.faults)

    # --- events --------------------------------------------------------------------------------------------------
    @_export(_P)
    def nvmlEventSetCreate(self, out: int) -> None:
        self._enter(("nvmlEventSetCreate",))
        if not out:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        event_set = _EventSet()
        with self._lock:
            self._event_sets[ctypes.addressof(event_set.memory)] = event_set
        _write(out, c_void_p, ctypes.addressof(event_set.memory))

    @_export(_P, _P)
    def nvmlDeviceGetSupportedEventTypes(self, device: int, out: int) -> None:
        self._spec("nvmlDeviceGetSupportedEventTypes", device)
        _write(out, c_ulonglong, _SUPPORTED_EVENTS)

    @_export(_P, c_ulonglong, _P)
    def nvmlDeviceRegisterEvents(self, device: int, event_types: int, event_set: int) -> None:
        index = self._enter(("nvmlDeviceRegisterEvents",), device, needs_device=True)
        es = self._event_set(event_set)
        if event_types & ~_SUPPORTED_EVENTS:
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            if index not in es.registered:  # what happened before registering is never delivered
                es.delivered.update(e.seq for e in self.node.events_until(self.node.elapsed()) if e.gpu == index)
            es.registered[index] = es.registered.get(index, 0) | event_types

    @_export(_P, _P, c_uint)
    def nvmlEventSetWait_v2(self, event_set: int, out: int, timeout_ms: int) -> None:
        """Block up to `timeout_ms` real milliseconds for an event; wake as soon as one is due.

        Events are due on the node's clock; the timeout runs on real time (a fake clock that nobody advances must
        not hang the event thread). A lost GPU in the set gives GpuIsLost once no event is left to deliver.
        """
        self._enter(("nvmlEventSetWait_v2", "nvmlEventSetWait"))
        es = self._event_set(event_set)
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            now = self.node.elapsed()
            event = self._next_due(es, now)
            if event is not None:
                return self._write_event(event, out)
            with self._lock:
                registered = list(es.registered)
            if any(self.node.is_lost(i) for i in registered):
                raise NvmlFailure(c.NVML_ERROR_GPU_IS_LOST)
            left = deadline - time.monotonic()
            if left <= 0:
                raise NvmlFailure(c.NVML_ERROR_TIMEOUT)
            if self.node.clock_is_real:  # block as the driver does: until the timeout, the next event or loss due
                nap = left  # (faults and emitted events wake the wait themselves)
                for upcoming in (self.node.next_event_after(now), *(self._lost_after(i, now) for i in registered)):
                    if upcoming is not None:
                        nap = min(nap, max(0.0005, upcoming - now))
            else:
                nap = min(left, 0.005)  # a fake clock moves when the test says: look again soon
            self.node.wait_for_change(nap)

    def _lost_after(self, index: int, now: float) -> float | None:
        """When the scenario loses GPU `index`, if that is still to come."""
        after = self.node.plan(index).lost_after_s
        return after if after is not None and after > now else None

    @_export(_P)
    def nvmlEventSetFree(self, event_set: int) -> None:
        self._enter(("nvmlEventSetFree",))
        self._event_set(event_set)
        with self._lock:
            del self._event_sets[event_set]

    def _event_set(self, address: int | None) -> _EventSet:
        with self._lock:
            event_set = self._event_sets.get(address or 0)
        if event_set is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    def _next_due(self, es: _EventSet, now: float) -> SimEvent | None:
        with self._lock:
            for event in self.node.events_until(now):
                if event.seq in es.delivered or event.kind != "xid":
                    continue
                if es.registered.get(event.gpu, 0) & c.nvmlEventTypeXidCriticalError:
                    es.delivered.add(event.seq)
                    return event
        return None

    def _write_event(self, event: SimEvent, out: int) -> None:
        data = _struct(out, nvmlEventData_t)
        data.device = self.device_handle_address(event.gpu)
        data.eventType = c.nvmlEventTypeXidCriticalError
        data.eventData = event.code or 0
        data.gpuInstanceId = _NO_INSTANCE
        data.computeInstanceId = _NO_INSTANCE


# --- writing through the caller's pointers ----------------------------------------------------------------------
_S = TypeVar("_S", bound=ctypes.Structure)


def _struct(address: int | None, struct: type[_S]) -> _S:
    if not address:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    return struct.from_address(address)


def _write(address: int | None, ctype: Any, value: int) -> None:
    if not address:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    cast(address, POINTER(ctype))[0] = value


def _write_string(address: int | None, length: int, text: str) -> None:
    """Copy a NUL-terminated string into the caller's buffer; InsufficientSize when it does not fit."""
    data = text.encode()
    if not address:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    if len(data) + 1 > length:
        raise NvmlFailure(c.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(address, data + b"\0", len(data) + 1)


def _write_array(
    count: int | None, out: int | None, struct: type[_S], items: Sequence[Any], fill: Callable[[_S, Any], None]
) -> None:
    """The two-call protocol: with too small a buffer (or none) set *count to what is needed and answer
    InsufficientSize; otherwise fill the buffer and set *count to how many were written."""
    if not count:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    capacity = cast(count, POINTER(c_uint))[0]
    cast(count, POINTER(c_uint))[0] = len(items)
    if len(items) > capacity or (items and not out):
        raise NvmlFailure(c.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, item in enumerate(items):
        fill(struct.from_address(int(out or 0) + i * ctypes.sizeof(struct)), item)


def _fill_process(info: nvmlProcessInfo_t, process: SimProcess) -> None:
    info.pid = process.pid
    info.usedGpuMemory = process.used_memory_bytes
    info.gpuInstanceId = _NO_INSTANCE if process.gpu_instance_id is None else process.gpu_instance_id
    info.computeInstanceId = _NO_INSTANCE if process.compute_instance_id is None else process.compute_instance_id


def _clock_name(clock_type: int) -> str:
    name = _CLOCKS.get(clock_type)
    if name is None:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    return name


def _reason_mask(reasons: frozenset[str]) -> int:
    mask = 0
    for reason in reasons:
        mask |= _REASON_BITS.get(reason, 0)
    return mask


def _check_link(spec: GpuSpec, link: int) -> None:
    if not 0 <= link < c.NVML_NVLINK_MAX_LINKS:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    if link >= spec.nvlink_links:
        raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)


def _major(driver_version: str) -> int:
    head = driver_version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


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


_PROTOTYPES.update(GPM_PROTOTYPES)
_PROTOTYPES.update(MIG_PROTOTYPES)
PROTOTYPES = _PROTOTYPES  # for the conformance test: every exported C name and its argument types
