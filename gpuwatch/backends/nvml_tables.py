"""NVML's numbers for the NVML backend (gpuwatch/backends/nvml.py): return codes and what the operator should do
about each, throttle-reason bits, the driver's field ids and which of them this driver speaks, and the small
conversions of NVML's answers."""

from __future__ import annotations

import ctypes
from collections.abc import Hashable
from typing import Any, cast

# NVML return codes (nvml.h): the same numbers in every pynvml version.
_INSUFFICIENT_POWER = 8
_CORRUPTED_INFOROM = 14
_FUNCTION_NOT_FOUND = 13
_UNKNOWN_ERROR = 999

# Library-level failures: NVML as a whole cannot be used; what the operator should do about each.
_LIBRARY_PROBLEMS: dict[int, str] = {
    1: "NVML is not initialised (it was shut down underneath the agent); the agent reopens it",
    9: "the NVIDIA kernel driver is not loaded: load it (modprobe nvidia) or reboot; see dmesg",
    12: "libnvidia-ml.so.1 was not found: install the NVIDIA driver on this host "
    "(or mount its libraries into the container)",
    18: "the NVML library and the loaded kernel driver differ in version (the driver was upgraded): "
    "reboot, or unload and reload the nvidia kernel modules",
}
# Hints for failures of the calls the backend cannot open without (nvmlInit, nvmlDeviceGetCount).
_OPEN_HINTS: dict[int, str] = {
    4: "no permission to open /dev/nvidia*: run the agent as root or as a member of the group that owns them",
    10: "the driver did not answer in time: start nvidia-persistenced so the GPUs stay initialised",
}
# Failures of one GPU: it stopped answering, so it gets a reading without a sample.
_GPU_FAILURES: dict[int, str] = {
    _INSUFFICIENT_POWER: "the GPU's external power cables are not properly attached",
    10: "the GPU did not answer in time",
    11: "the GPU has an interrupt problem",
    15: "the GPU is lost (fallen off the bus: look for XID 79 in the kernel log; reset the GPU or reboot)",
    16: "the GPU requires a reset (nvidia-smi -r, or reboot)",
    28: "the GPU is no longer found (gone from the PCI bus)",
    _UNKNOWN_ERROR: "NVML returned an unknown error for the GPU",
}
# Answers that will not change until the driver changes: remembered per GPU so they are not asked every poll.
# NotSupported, InvalidArgument (e.g. an NVLink that does not exist), ArgumentVersionMismatch, Deprecated.
_PERMANENT = frozenset({3, 2, 25, 26})

# The field value union, by valueType.
_FIELD_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# Clock-event ("throttle") reason bits, by their pynvml suffix, and the schema's name for each.
_REASON_BITS: tuple[tuple[str, str], ...] = (
    ("GpuIdle", "gpu_idle"),
    ("ApplicationsClocksSetting", "applications_clocks"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal"),
    ("HwThermalSlowdown", "hw_thermal"),
    ("HwPowerBrakeSlowdown", "hw_power_brake"),
    ("DisplayClockSetting", "display_clock"),
    ("BoardLimit", "board_limit"),  # newer bits, reported only where the supported mask has them
    ("Reliability", "reliability"),
)

# Field ids from nvml.h. They are the driver's numbers, not the binding's: a binding only names them, and one
# release renumbered some (below), so the ids are chosen by the driver's version, whatever nvidia-ml-py is installed.
_FI_PERF_POLICY_POWER = 74  # = NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
_FI_PERF_POLICY_THERMAL = 75
_FI_PERF_POLICY_SYNC_BOOST = 76  # = NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST
_FI_PERF_POLICY_BOARD_LIMIT = 77
_FI_PERF_POLICY_LOW_UTILIZATION = 78
_FI_PERF_POLICY_RELIABILITY = 79
_FI_MEMORY_TEMP = 82
_FI_PCIE_L0_TO_RECOVERY_COUNTER = 169
# NVML_FI_DEV_NVLINK_COUNT_*, scoped to a link: LINK_RECOVERY_EVENTS, LINK_RECOVERY_FAILED_EVENTS,
# EFFECTIVE_ERRORS (left after forward error correction) and SYMBOL_ERRORS.
_FI_NVLINK_COUNTS = {215: "recovery", 214: "recovery_failed", 219: "effective", 221: "symbol"}
# NVML_FI_DEV_PCIE_COUNT_*: errors the GPU's PCIe port counted, by AER class.
_FI_PCIE_ERRORS = {173: "correctable", 179: "non_fatal", 180: "fatal"}
_FI_GET_GPU_RECOVERY_ACTION = 230
# NVML_FI_DEV_CLOCKS_EVENT_REASON_{SW_THERM,HW_THERM,HW_POWER_BRAKE}_SLOWDOWN: absent before R575; 251-253 in
# R575 and 580.65 (nvml.h of nvidia-ml-py 12.575.51, 13.580.65); 269-271 from 580.82 (13.580.82 on), where
# 251-253 are power-smoothing settings again, as in R570 (12.570.86).
_THROTTLE_TIME_FIELDS: tuple[tuple[tuple[int, ...], tuple[int, int, int] | None], ...] = (
    ((575,), None),
    ((580, 82), (251, 252, 253)),
)
_THROTTLE_TIME_FIELDS_NEWEST = (269, 270, 271)

# nvmlRowRemapperHistogramValues_t: banks by how many spare rows they have left.
_REMAP_AVAILABILITY = ("max", "high", "partial", "low", "none")
# The NVLink fabric, as nvml.h lays it out: line numbers are NVIDIA/go-nvml pkg/nvml/nvml.h at 2f9e261 (NVML 13.x).
# nvmlGpuFabricState_t, an unsigned char (3829): NOT_SUPPORTED 0 ... COMPLETED 3 (3821-3824).
_FABRIC_STATE_NOT_SUPPORTED = 0
_FABRIC_STATE_COMPLETED = 3
# nvmlGpuFabricInfo_v2/_v3 healthMask (3952, 3970): condition, SHIFT and WIDTH, each two bits whose values are
# NOT_SUPPORTED 0, TRUE 1, FALSE 2: DEGRADED_BW (values 3845-3847, shift 0 and width 0x3 at 3849-3850),
# ROUTE_RECOVERY (3855-3857; 2, 0x3 at 3859-3860), ROUTE_UNHEALTHY (3865-3867; 4, 0x3 at 3869-3870),
# ACCESS_TIMEOUT_RECOVERY (3875-3877; 6, 0x3 at 3879-3880); read as NVML_GPU_FABRIC_HEALTH_GET does,
# (mask >> SHIFT) & WIDTH (3921-3923). The masks are ours: 12.570.86's pynvml.py spells the WIDTHs 0x11.
_FABRIC_HEALTH_FLAGS = (
    ("degraded_bandwidth", 0, 0x3),
    ("route_recovery", 2, 0x3),
    ("route_unhealthy", 4, 0x3),
    ("access_timeout_recovery", 6, 0x3),
)
_FABRIC_TRUE, _FABRIC_FALSE = 1, 2
# INCORRECT_CONFIGURATION: shift 8, width 0xf (3895-3896); NOT_SUPPORTED 0, NONE 1, else what is wrong (3885-3893).
# PARTITION_ASSIGNED (shift 12, 3901-3906) is a multi-node partition's, not a fault: not read.
_FABRIC_CONFIGURATION_SHIFT, _FABRIC_CONFIGURATION_MASK = 8, 0xF
_FABRIC_MISCONFIGURATIONS = {
    2: "incorrect system GUID",
    3: "incorrect chassis serial number",
    4: "no partition",
    5: "insufficient NVLinks",
    6: "incompatible GPU firmware",
    7: "invalid location",
    8: "GPU state invalid",
}
# healthSummary (v3, an unsigned char, 3971): NOT_SUPPORTED 0, HEALTHY 1, UNHEALTHY 2, LIMITED_CAPACITY 3 (3911-3914).
_FABRIC_SUMMARY = {1: None, 2: "unhealthy", 3: "limited_capacity"}


class _GpuFabricInfoV1(ctypes.Structure):
    """nvmlGpuFabricInfo_t (3834-3840), what nvmlDeviceGetGpuFabricInfo fills on drivers without the versioned call
    (525-545: R535, a long-term branch of many HGX H100 nodes). Ours, not the binding's: nvidia-ml-py 12.570.86
    sizes clusterUuid by NVML_DEVICE_UUID_BUFFER_SIZE (80, pynvml.py 5775) where nvml.h has
    NVML_GPU_FABRIC_UUID_LEN (16), so its status and state sit past the 28 bytes the driver writes and read 0."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


_CLOCKS = (
    ("sm", "NVML_CLOCK_SM"),
    ("memory", "NVML_CLOCK_MEM"),
    ("graphics", "NVML_CLOCK_GRAPHICS"),
    ("video", "NVML_CLOCK_VIDEO"),
)
_THRESHOLDS = (
    (("core", "slowdown"), "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
    (("core", "shutdown"), "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
    (("core", "max_operating"), "NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
    (("memory", "max_operating"), "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
)
_NVLINK_COUNTERS = (
    ("replay", ("NVML_NVLINK_ERROR_DL_REPLAY",)),
    ("recovery", ("NVML_NVLINK_ERROR_DL_RECOVERY",)),
    ("crc", ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA")),
    ("ecc", ("NVML_NVLINK_ERROR_DL_ECC_DATA",)),
)


class _FieldIds:
    """The field ids this driver speaks (see _THROTTLE_TIME_FIELDS): which counts each throttle reason's time,
    first choice first, and the violation-status policy to ask where no field does."""

    def __init__(self, driver_version: str) -> None:
        self.memory_temp = _FI_MEMORY_TEMP
        self.recovery_action = _FI_GET_GPU_RECOVERY_ACTION
        self.l0_recovery = _FI_PCIE_L0_TO_RECOVERY_COUNTER
        sw_thermal, hw_thermal, power_brake = throttle_time_fields(driver_version) or (-1, -1, -1)
        # The combined THERMAL counter stands in for sw_thermal only where the per-reason field is missing, so the
        # two are never counted twice.
        chains: tuple[tuple[str, tuple[int, ...], str | None], ...] = (
            ("sw_power_cap", (_FI_PERF_POLICY_POWER,), "NVML_PERF_POLICY_POWER"),
            ("sync_boost", (_FI_PERF_POLICY_SYNC_BOOST,), "NVML_PERF_POLICY_SYNC_BOOST"),
            ("sw_thermal", (sw_thermal, _FI_PERF_POLICY_THERMAL), "NVML_PERF_POLICY_THERMAL"),
            ("hw_thermal", (hw_thermal,), None),
            ("hw_power_brake", (power_brake,), None),
            ("board_limit", (_FI_PERF_POLICY_BOARD_LIMIT,), "NVML_PERF_POLICY_BOARD_LIMIT"),
            ("low_utilization", (_FI_PERF_POLICY_LOW_UTILIZATION,), "NVML_PERF_POLICY_LOW_UTILIZATION"),
            ("reliability", (_FI_PERF_POLICY_RELIABILITY,), "NVML_PERF_POLICY_RELIABILITY"),
        )
        self.counters = tuple((reason, tuple(i for i in ids if i >= 0), policy) for reason, ids, policy in chains)
        counters = (i for c in self.counters for i in c[1])
        every = (self.memory_temp, self.recovery_action, self.l0_recovery, *_FI_PCIE_ERRORS, *counters)
        self.candidates: tuple[int, ...] = tuple(dict.fromkeys(every))


def throttle_time_fields(driver_version: str) -> tuple[int, int, int] | None:
    """The SW-thermal, HW-thermal and power-brake throttle-time field ids of this driver, None where it has none."""
    try:
        release = tuple(int(part) for part in driver_version.split(".")[:2])
    except ValueError:
        return None  # an unknown driver: ask nothing rather than misread another field
    for below, ids in _THROTTLE_TIME_FIELDS:
        if release < below:
            return ids
    return _THROTTLE_TIME_FIELDS_NEWEST


def _constant(lib: Any, *names: str) -> Any:
    """The first of ``names`` the binding defines (newer names first, older spellings after)."""
    return next((value for name in names if (value := getattr(lib, name, None)) is not None), None)


# pynvml's structures override __getattribute__ in Python only to decode bytes to str (pynvml.py,
# _PrintableStructure); a field value has no bytes, and going around it saves ~0.3 µs per read, 36 reads per GPU poll.
_plain_attr = object.__getattribute__


def _field_value(answer: Any) -> float | None:
    """Read the union by valueType; a field the driver did not fill has timestamp 0 (and reads as 0)."""
    value_type = int(_plain_attr(answer, "valueType"))
    if _plain_attr(answer, "timestamp") == 0 or not 0 <= value_type < len(_FIELD_MEMBERS):
        return None
    return float(getattr(_plain_attr(answer, "value"), _FIELD_MEMBERS[value_type]))


def _text(value: Any) -> str:
    """NVML strings as str (older bindings return bytes); '' where not available."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _call_key(variant: tuple[str, tuple[Any, ...]], args: tuple[Any, ...]) -> tuple[Hashable, ...]:
    """The key a remembered NotSupported is kept under: the function with its keyword arguments, then the arguments
    after the handle (a sensor, clock or policy number is its own key)."""
    if not args:
        return (variant,)
    if len(args) == 1 and args[0].__class__ is int:
        return (variant, args[0])
    return (variant, *_hashable(args))


def _hashable(args: tuple[Any, ...]) -> tuple[Hashable, ...]:
    """Arguments as a key for the remembered NotSupported calls: the field-id list becomes a tuple, a ctypes
    pointer (an event set, a device) its address; ctypes objects claim to be Hashable and raise TypeError."""
    return tuple(_arg_key(arg) for arg in args)


_BYREF = type(ctypes.byref(ctypes.c_int()))  # ctypes' CArgObject, which it does not export


def _arg_key(arg: Any) -> Hashable:
    if isinstance(arg, ctypes._Pointer):
        return ("pointer", ctypes.cast(arg, ctypes.c_void_p).value)
    if isinstance(arg, _BYREF):  # byref(struct): a fresh struct each call, the same question
        return ("byref", type(getattr(arg, "_obj", None)).__name__)
    if isinstance(arg, list):
        return tuple(arg)
    try:
        hash(arg)
    except TypeError:
        return ("object", id(arg))
    return cast(Hashable, arg)


def _handle_key(handle: Any) -> Hashable:
    """Identify a device handle: two ctypes pointers to one device compare unequal, their addresses do not."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle if isinstance(handle, Hashable) else id(handle)
