"""One GPU's nvmlGpmMetricsGet request, built once and read back without pynvml's per-field cost.

A poll asks the same metric ids every time, so the request (version, numMetrics, each metricId) is filled once and
only its two sample handles change. Reading the answers through the binding's structures costs a Python object per
metric and pynvml's `_PrintableStructure.__getattribute__` per field (about 27 metrics x 3 fields a GPU a poll, the
largest share of the agent's own work per poll); the answers are read instead from one copy of the array's bytes, at
the offsets the binding's own structure declares, so a binding with another layout is read by its layout.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

_SUCCESS = 0  # NVML_SUCCESS


def _field_reader(owner: type[ctypes.Structure], name: str) -> tuple[int, struct.Struct]:
    """(offset, unpacker) of one scalar field of a ctypes structure, in native byte order, no padding."""
    kind: Any = dict((field[0], field[1]) for field in owner._fields_)[name]  # a simple ctypes type: c_uint, ...
    return getattr(owner, name).offset, struct.Struct("=" + kind._type_)


class MetricsRequest:
    """A c_nvmlGpmMetricsGet_t asking `ids`, reusable across polls; `answers()` reads what NVML filled in."""

    def __init__(self, lib: Any, ids: Sequence[int]) -> None:
        self.ids = tuple(ids)
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.ids)
        for i, metric in enumerate(self.ids):
            request.metrics[i].metricId = metric
        self.request = request
        array = type(request).metrics
        metric_type = request.metrics._type_
        self._base = ctypes.addressof(request) + array.offset
        self._stride = ctypes.sizeof(metric_type)
        self._return = _field_reader(metric_type, "nvmlReturn")
        self._value = _field_reader(metric_type, "value")

    def prepare(self, first: Any, second: Any) -> Any:
        """The request for the interval between two samples, for nvmlGpmMetricsGet."""
        self.request.sample1, self.request.sample2 = first, second
        return self.request

    def answers(self) -> dict[int, float]:
        """metricId -> value for every metric NVML answered with success."""
        raw = ctypes.string_at(self._base, self._stride * len(self.ids))
        (return_at, return_unpack), (value_at, value_unpack) = self._return, self._value
        found: dict[int, float] = {}
        for i, metric in enumerate(self.ids):
            start = i * self._stride
            if return_unpack.unpack_from(raw, start + return_at)[0] == _SUCCESS:
                found[metric] = value_unpack.unpack_from(raw, start + value_at)[0]
        return found
