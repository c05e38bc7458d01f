"""The simulated NVML holds to the installed nvidia-ml-py: names, signatures, constants, errors and struct fields.

The backend is written against pynvml and tested over the simulation; these tests make sure the two cannot drift
apart silently (a function the real module lacks, a renamed parameter, a constant with another value).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from gpuwatch.simulated import nvml_constants
from gpuwatch.simulated.nvml_errors import NVMLError as SimNVMLError
from gpuwatch.simulated.nvml_lib import SimulatedNvml
from gpuwatch.simulated.nvml_structs import STRUCTS
from gpuwatch.simulated.scenarios import SimulatedNode

pynvml = pytest.importorskip("pynvml")

# What the backend needs; each must exist on both modules.
REQUIRED_FUNCTIONS = [
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetMarginTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerSource",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetFieldValues",
    "nvmlEventSetCreate",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
    "nvmlExceptionClass",
]


@pytest.fixture
def lib() -> SimulatedNvml:
    return SimulatedNvml(SimulatedNode("busy", gpus=2, clock=lambda: 5.0, wall_clock=lambda: 1.8e9))


def _public(lib: SimulatedNvml) -> dict[str, Any]:
    return {name: getattr(lib, name) for name in dir(lib) if not name.startswith("_")}


def _functions(lib: SimulatedNvml) -> dict[str, Callable[..., Any]]:
    return {n: v for n, v in _public(lib).items() if callable(v) and not isinstance(v, type)}


def _signature(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_required_functions_exist_on_both(lib: SimulatedNvml) -> None:
    for name in REQUIRED_FUNCTIONS:
        assert hasattr(pynvml, name), f"pynvml lacks {name}: the list is wrong"
        assert callable(getattr(lib, name, None)), f"the simulated NVML lacks {name}"


def test_every_public_function_exists_in_pynvml_with_the_same_signature(lib: SimulatedNvml) -> None:
    functions = _functions(lib)
    assert len(functions) >= len(REQUIRED_FUNCTIONS)
    for name, fn in functions.items():
        real = getattr(pynvml, name, None)
        assert real is not None, f"{name} is not a pynvml function: a backend using it would fail on a real GPU"
        assert callable(real)
        assert _signature(fn) == _signature(real), name


def test_names_pynvml_lacks_are_absent(lib: SimulatedNvml) -> None:
    # The fixture's probe found these missing from the real module; a backend must not come to rely on them.
    for name in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetUuid", "nvmlDeviceGetTemperature_v2"):
        assert not hasattr(pynvml, name)
        assert not hasattr(lib, name)


def test_every_constant_has_pynvml_value(lib: SimulatedNvml) -> None:
    constants = {n: v for n, v in _public(lib).items() if isinstance(v, int)}
    assert len(constants) > 300
    for name, value in constants.items():
        assert hasattr(pynvml, name), name
        assert getattr(pynvml, name) == value, name
    # and the constants module itself, which the fields and the library are built from
    for name in dir(nvml_constants):
        value = getattr(nvml_constants, name)
        if not name.startswith("_") and isinstance(value, int):
            assert getattr(pynvml, name) == value, name


def test_constants_the_backend_uses_are_present(lib: SimulatedNvml) -> None:
    for name in (
        "NVML_SUCCESS",
        "NVML_TEMPERATURE_GPU",
        "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
        "NVML_CLOCK_SM",
        "NVML_PERF_POLICY_THERMAL",
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
        "NVML_AGGREGATE_ECC",
        "NVML_POWER_SOURCE_UNDERSIZED",
        "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS",
        "NVML_GPU_RECOVERY_ACTION_GPU_RESET",
        "NVML_FI_DEV_MEMORY_TEMP",
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
        "NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER",
        "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "nvmlMemory_v2",
        "nvmlClocksEventReasonHwPowerBrakeSlowdown",
        "nvmlClocksThrottleReasonSwThermalSlowdown",
        "nvmlEventTypeXidCriticalError",
        "NVML_ERROR_GPU_IS_LOST",
    ):
        assert getattr(lib, name) == getattr(pynvml, name), name


def test_error_classes_match_for_every_code(lib: SimulatedNvml) -> None:
    real_codes = {getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVML_ERROR_")}
    sim_codes = set(SimNVMLError._valClassMapping)
    assert sim_codes == real_codes
    for code in sim_codes:
        ours, theirs = lib.NVMLError(code), pynvml.NVMLError(code)
        assert type(ours).__name__ == type(theirs).__name__, code
        assert ours.value == theirs.value == code
        assert isinstance(ours, lib.NVMLError)
        assert lib.nvmlExceptionClass(code).__name__ == pynvml.nvmlExceptionClass(code).__name__
        cls = getattr(lib, type(ours).__name__)
        assert cls is type(ours)
        assert cls().value == code  # NVMLError_NotSupported() needs no argument, as in pynvml
        if code in pynvml.NVMLError._errcode_to_string:
            assert str(ours) == str(theirs)
    assert type(lib.NVMLError(123456)) is lib.NVMLError  # unknown code: the base class, as in pynvml
    with pytest.raises(ValueError):
        lib.nvmlExceptionClass(123456)


def test_error_class_names_exist_in_pynvml(lib: SimulatedNvml) -> None:
    classes = {n: v for n, v in _public(lib).items() if isinstance(v, type) and issubclass(v, BaseException)}
    assert "NVMLError_GpuIsLost" in classes and "NVMLLibraryMismatchError" in classes
    for name, cls in classes.items():
        real = getattr(pynvml, name)
        assert issubclass(cls, Exception) and issubclass(real, Exception)
        assert issubclass(cls, lib.NVMLError) == issubclass(real, pynvml.NVMLError), name


def test_struct_types_have_pynvml_field_names() -> None:
    for name, ours in STRUCTS.items():
        if name == "nvmlFriendlyObject":
            continue
        real = getattr(pynvml, name)
        assert [f[0] for f in ours._fields_] == [f[0] for f in real._fields_], name


def test_returned_objects_expose_the_struct_attributes(lib: SimulatedNvml) -> None:
    def fields(struct_name: str) -> list[str]:
        return [f[0] for f in getattr(pynvml, struct_name)._fields_]

    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    returned = {
        "c_nvmlMemory_t": lib.nvmlDeviceGetMemoryInfo(h),
        "c_nvmlMemory_v2_t": lib.nvmlDeviceGetMemoryInfo(h, version=lib.nvmlMemory_v2),
        "c_nvmlUtilization_t": lib.nvmlDeviceGetUtilizationRates(h),
        "nvmlPciInfo_t": lib.nvmlDeviceGetPciInfo(h),
        "c_nvmlViolationTime_t": lib.nvmlDeviceGetViolationStatus(h, lib.NVML_PERF_POLICY_POWER),
        "c_nvmlFieldValue_t": lib.nvmlDeviceGetFieldValues(h, [lib.NVML_FI_DEV_MEMORY_TEMP])[0],
    }
    for struct_name, obj in returned.items():
        for attr in fields(struct_name):
            assert hasattr(obj, attr), (struct_name, attr)
    value = returned["c_nvmlFieldValue_t"].value
    for attr in fields("c_nvmlValue_t"):
        assert hasattr(value, attr)
    processes = lib.nvmlDeviceGetComputeRunningProcesses(h)
    assert processes
    assert sorted(vars(processes[0])) == sorted(fields("c_nvmlProcessInfo_v3_t"))
    faults = lib._node.faults
    es = lib.nvmlEventSetCreate()
    faults.emit_xid(0, 79)  # before registration: never delivered
    lib.nvmlDeviceRegisterEvents(h, lib.nvmlEventTypeXidCriticalError, es)
    faults.emit_xid(0, 48)
    data = lib.nvmlEventSetWait_v2(es, 1000)
    for attr in fields("c_nvmlEventData_t"):
        assert hasattr(data, attr)
    assert data.eventData == 48


def test_pci_info_strings_are_str_like_pynvml(lib: SimulatedNvml) -> None:
    lib.nvmlInit()
    info = lib.nvmlDeviceGetPciInfo(lib.nvmlDeviceGetHandleByIndex(0))
    assert isinstance(info.busId, str) and info.busId == "00000000:18:00.0"
    assert isinstance(info.busIdLegacy, str) and info.busIdLegacy == "0000:18:00.0"
    real = pynvml.nvmlPciInfo_t()
    real.busId = "00000000:18:00.0"
    assert type(real.busId) is type(info.busId)
