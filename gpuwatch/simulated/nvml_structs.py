"""ctypes structures laid out and named as pynvml's, so returned objects behave like the real ones.

Real ctypes (not look-alike classes) keep the details a backend can trip over: c_uint fields wrap, strings come
back as `str` through the same decoding wrapper, and the field value is a true union (reading `ullVal` of a
`uiVal` field gives the same number, reading `dVal` of it gives garbage). The only change: the event data's
`device` holds the simulated handle object instead of a pointer.
"""

from __future__ import annotations

from ctypes import (
    Structure,
    Union,
    c_char,
    c_double,
    c_int,
    c_int64,
    c_longlong,
    c_uint,
    c_uint32,
    c_ulong,
    c_ulonglong,
    c_ushort,
    py_object,
)
from typing import Any

from gpuwatch.simulated import nvml_constants as c


class _PrintableStructure(Structure):
    """pynvml's base: str fields decode to `str`, assigned `str` values encode to bytes."""

    _fmt_: dict[str, str] = {}  # noqa: RUF012 - ctypes convention, as in pynvml

    def __str__(self) -> str:
        parts = []
        for name, *_ in self._fields_:
            fmt = self._fmt_.get(name, self._fmt_.get("<default>", "%s"))
            parts.append(("%s: " + fmt) % (name, getattr(self, name)))
        return self.__class__.__name__ + "(" + ", ".join(parts) + ")"

    def __getattribute__(self, name: str) -> Any:
        res = super().__getattribute__(name)
        if isinstance(res, bytes):
            return res.decode()
        return res

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, str):
            value = value.encode()
        super().__setattr__(name, value)


class c_nvmlMemory_t(_PrintableStructure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]
    _fmt_ = {"<default>": "%d B"}


class c_nvmlMemory_v2_t(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]
    _fmt_ = {"<default>": "%d B"}


class c_nvmlUtilization_t(_PrintableStructure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]
    _fmt_ = {"<default>": "%d %%"}


class nvmlPciInfo_t(_PrintableStructure):
    _fields_ = [
        ("busIdLegacy", c_char * c.NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * c.NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]
    _fmt_ = {
        "domain": "0x%08X",
        "bus": "0x%02X",
        "device": "0x%02X",
        "pciDeviceId": "0x%08X",
        "pciSubSystemId": "0x%08X",
    }


class c_nvmlViolationTime_t(_PrintableStructure):
    _fields_ = [("referenceTime", c_ulonglong), ("violationTime", c_ulonglong)]


class c_nvmlValue_t(Union):
    _fields_ = [
        ("dVal", c_double),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("siVal", c_int),
        ("usVal", c_ushort),
    ]


class c_nvmlFieldValue_t(_PrintableStructure):
    _fields_ = [
        ("fieldId", c_uint32),
        ("scopeId", c_uint32),
        ("timestamp", c_int64),
        ("latencyUsec", c_int64),
        ("valueType", c_uint),
        ("nvmlReturn", c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_nvmlEventData_t(_PrintableStructure):
    _fields_ = [
        ("device", py_object),  # pynvml: c_nvmlDevice_t; here the simulated handle
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]
    _fmt_ = {"eventType": "0x%08X"}


class c_nvmlProcessInfo_v2_t(_PrintableStructure):
    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]
    _fmt_ = {"usedGpuMemory": "%d B"}


c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t
c_nvmlProcessInfo_t = c_nvmlProcessInfo_v3_t


class nvmlFriendlyObject:
    """What pynvml turns process structs into: plain attributes, `usedGpuMemory` None when unavailable."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return self.__dict__.__str__()

    def __getattr__(self, name: str) -> Any:  # for type checkers: attributes are set dynamically
        raise AttributeError(name)


def nvmlStructToFriendlyObject(struct: Structure) -> nvmlFriendlyObject:
    d: dict[str, Any] = {}
    for key, *_ in struct._fields_:
        value = getattr(struct, key)
        d[key] = value.decode() if isinstance(value, bytes) else value
    return nvmlFriendlyObject(d)


STRUCTS: dict[str, type] = {
    "c_nvmlMemory_t": c_nvmlMemory_t,
    "c_nvmlMemory_v2_t": c_nvmlMemory_v2_t,
    "c_nvmlUtilization_t": c_nvmlUtilization_t,
    "nvmlPciInfo_t": nvmlPciInfo_t,
    "c_nvmlViolationTime_t": c_nvmlViolationTime_t,
    "c_nvmlValue_t": c_nvmlValue_t,
    "c_nvmlFieldValue_t": c_nvmlFieldValue_t,
    "c_nvmlEventData_t": c_nvmlEventData_t,
    "c_nvmlProcessInfo_v2_t": c_nvmlProcessInfo_v2_t,
    "c_nvmlProcessInfo_v3_t": c_nvmlProcessInfo_v3_t,
    "c_nvmlProcessInfo_t": c_nvmlProcessInfo_t,
    "nvmlFriendlyObject": nvmlFriendlyObject,
}
