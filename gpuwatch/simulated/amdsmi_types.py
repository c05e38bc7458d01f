"""The names the simulated ``amdsmi`` module shares with the real one: status codes, enums and exception classes.

Copied by value from amdsmi 7.0.2 and 6.4.3 (``amdsmi_wrapper.py``, ``amdsmi_interface.py``,
``amdsmi_exception.py``); tests/test_amdsmi_conformance.py reads those files as source and holds these to them.
Enums carry only the members gpuwatch and its simulation use, each with the real value.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from types import SimpleNamespace


class _Status:
    """``amdsmi_wrapper.AMDSMI_STATUS_*``: the same numbers in 6.x and 7.x."""

    SUCCESS = 0
    INVAL = 1
    NOT_SUPPORTED = 2
    NOT_YET_IMPLEMENTED = 3
    FAIL_LOAD_MODULE = 4
    FAIL_LOAD_SYMBOL = 5
    DRM_ERROR = 6
    API_FAILED = 7
    TIMEOUT = 8
    RETRY = 9
    NO_PERM = 10
    INTERRUPT = 11
    IO = 12
    FILE_ERROR = 14
    INIT_ERROR = 18
    BUSY = 30
    NOT_FOUND = 31
    NOT_INIT = 32
    DRIVER_NOT_LOADED = 34
    NO_DATA = 40
    UNKNOWN_ERROR = 4294967295


STATUS: dict[str, int] = {
    f"AMDSMI_STATUS_{name}": value for name, value in vars(_Status).items() if not name.startswith("_")
}

_ERROR_TEXT: dict[int, str] = {
    _Status.INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    _Status.NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    _Status.NOT_YET_IMPLEMENTED: "AMDSMI_STATUS_NOT_YET_IMPLEMENTED - Feature not yet implemented",
    _Status.FAIL_LOAD_MODULE: "AMDSMI_STATUS_FAIL_LOAD_MODULE - Fail to load lib",
    _Status.FAIL_LOAD_SYMBOL: "AMDSMI_STATUS_FAIL_LOAD_SYMBOL - Fail to load symbol",
    _Status.DRM_ERROR: "AMDSMI_STATUS_DRM_ERROR - Error when called libdrm",
    _Status.API_FAILED: "AMDSMI_STATUS_API_FAILED - API call failed",
    _Status.TIMEOUT: "AMDSMI_STATUS_TIMEOUT - Timeout in API call",
    _Status.RETRY: "AMDSMI_STATUS_RETRY - Retry operation",
    _Status.NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    _Status.INTERRUPT: "AMDSMI_STATUS_INTERRUPT - Interrupt ocurred during execution",
    _Status.IO: "AMDSMI_STATUS_IO - I/O Error",
    _Status.FILE_ERROR: "AMDSMI_STATUS_FILE_ERROR - Error opening file",
    _Status.INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    _Status.BUSY: "AMDSMI_STATUS_BUSY - Device busy",
    _Status.NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    _Status.NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    _Status.DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
    _Status.NO_DATA: "AMDSMI_STATUS_NO_DATA - No data was found for given input",
}

# ``amdsmi.amdsmi_wrapper`` as far as callers see it: the handle type getters check, and the status codes.
amdsmi_wrapper = SimpleNamespace(amdsmi_processor_handle=ctypes.c_void_p, **STATUS)


# ----- exceptions (amdsmi_exception.py) -----


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.set_err_info()

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self, detailed: bool = True) -> str:
        return self.err_info if detailed else str(self.err_info).split(" - ")[0]

    def get_error_code(self) -> int:
        return self.err_code

    def set_err_info(self) -> None:
        self.err_info = _ERROR_TEXT.get(self.err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(_Status.RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(_Status.TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, receivedValue: object, expectedType: object, msg: str | None = None) -> None:
        super().__init__(msg)
        self.err_code = None
        self.actualType = type(receivedValue)
        self.expectedType = expectedType
        self.set_err_msg()
        if msg is not None:
            self.err_msg = msg

    def set_err_msg(self) -> None:
        self.err_msg = f"Invalid parameter:\nActual type: {self.actualType}\nExpected type: {self.expectedType}"

    def __str__(self) -> str:
        return self.err_msg


class AmdSmiKeyException(AmdSmiException):
    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.set_err_msg()

    def set_err_msg(self) -> None:
        self.err_msg = "Key " + self.key + " is missing from dictionary"

    def __str__(self) -> str:
        return self.err_msg


class AmdSmiBdfFormatException(AmdSmiException):
    def __init__(self, bdf: str) -> None:
        super().__init__()
        self.bdf = bdf

    def __str__(self) -> str:
        return f"Wrong BDF format: {self.bdf}."


def check_res(code: int) -> None:
    """``amdsmi_interface._check_res``: the exception the real module raises for a status code."""
    if code == _Status.RETRY:
        raise AmdSmiRetryException()
    if code == _Status.TIMEOUT:
        raise AmdSmiTimeoutException()
    if code != _Status.SUCCESS:
        raise AmdSmiLibraryException(code)


# ----- enums (amdsmi_interface.py), members gpuwatch uses, with the real values -----


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 4294967295
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_AMD_APUS = 3
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4
    PCIE = 5
    VCLK0 = 6
    VCLK1 = 7
    DCLK0 = 8
    DCLK1 = 9


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6
    PLX = 7


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2
    MAX_HYST = 3
    MIN_HYST = 4
    CRITICAL = 5
    CRITICAL_HYST = 6
    EMERGENCY = 7
    EMERGENCY_HYST = 8
    CRIT_MIN = 9
    CRIT_MIN_HYST = 10
    OFFSET = 11
    LOWEST = 12
    HIGHEST = 13


class AmdSmiEvtNotificationType(IntEnum):
    NONE = 0
    VMFAULT = 1
    THERMAL_THROTTLE = 2
    GPU_PRE_RESET = 3
    GPU_POST_RESET = 4
    # 5 and up differ: RING_HANG in 6.4, MIGRATE_START … PROCESS_END in 7.0 (neither is simulated)


class AmdSmiComputePartitionType(IntEnum):
    SPX = 1
    DPX = 2
    TPX = 3
    QPX = 4
    CPX = 5
    INVALID = 0


class AmdSmiMemoryPartitionType(IntEnum):
    NPS1 = 1
    NPS2 = 2
    NPS4 = 4
    NPS8 = 8
    UNKNOWN = 0


ENUMS: tuple[type[IntEnum], ...] = (
    AmdSmiInitFlags,
    AmdSmiClkType,
    AmdSmiTemperatureType,
    AmdSmiTemperatureMetric,
    AmdSmiEvtNotificationType,
    AmdSmiComputePartitionType,
    AmdSmiMemoryPartitionType,
)
EXCEPTIONS: tuple[type[Exception], ...] = (
    AmdSmiException,
    AmdSmiLibraryException,
    AmdSmiRetryException,
    AmdSmiTimeoutException,
    AmdSmiParameterException,
    AmdSmiKeyException,
    AmdSmiBdfFormatException,
)
