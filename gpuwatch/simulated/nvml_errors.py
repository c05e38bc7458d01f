"""The NVMLError hierarchy, built the way pynvml builds it, so `except` clauses behave the same on both.

`NVMLError(code)` returns the `NVMLError_<CamelCase>` subclass for a known code (a plain NVMLError otherwise),
`.value` holds the code, `NVMLError_NotSupported()` needs no argument, and errors compare equal by code. Own
classes rather than pynvml's: the agent runs on machines without nvidia-ml-py.
"""

from __future__ import annotations

import string
from typing import Any, ClassVar

from gpuwatch.simulated import nvml_constants as c

# nvmlErrorString() of the driver, for the codes pynvml has no text for.
_ERROR_STRINGS: dict[int, str] = {
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
    c.NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: "The requested vgpu operation is not available on target device, "
    "because ECC is enabled",
    c.NVML_ERROR_INSUFFICIENT_RESOURCES: "Ran out of critical resources, other than memory",
    c.NVML_ERROR_FREQ_NOT_SUPPORTED: "The requested frequency is not supported",
    c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "The provided version is invalid/unsupported",
    c.NVML_ERROR_DEPRECATED: "Requested functionality has been deprecated",
    c.NVML_ERROR_NOT_READY: "The system is not ready for the request",
    c.NVML_ERROR_GPU_NOT_FOUND: "No GPUs were found",
    c.NVML_ERROR_INVALID_STATE: "Resource not in correct state to perform requested operation",
    c.NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: "Reset type not supported",
    c.NVML_ERROR_UNKNOWN: "Unknown Error",
}


def error_string(code: int) -> str:
    return _ERROR_STRINGS.get(code, f"NVML Error with code {code}")


class NVMLLibraryMismatchError(Exception):
    """Raised by pynvml's unversioned calls (running processes) when the driver lacks the `_v3` symbol."""


class NVMLError(Exception):
    """Base of every NVML error; `NVMLError(code)` is an instance of the matching subclass."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return error_string(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = None  # type: ignore[assignment]  # like pynvml's: __eq__ without __hash__


def _class_name(constant: str) -> str:
    """NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, exactly as pynvml derives it."""
    return "NVMLError_" + string.capwords(constant.replace("NVML_ERROR_", ""), "_").replace("_", "")


def _make_classes() -> dict[str, type[NVMLError]]:
    classes: dict[str, type[NVMLError]] = {}
    for constant in sorted(dir(c)):
        if not constant.startswith("NVML_ERROR_"):
            continue
        code: int = getattr(c, constant)

        def new(cls: type[NVMLError], *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        cls = type(_class_name(constant), (NVMLError,), {"__new__": new, "__module__": __name__})
        NVMLError._valClassMapping[code] = cls
        classes[cls.__name__] = cls
    return classes


ERROR_CLASSES: dict[str, type[NVMLError]] = _make_classes()
globals().update(ERROR_CLASSES)


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]
