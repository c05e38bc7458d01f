"""One GPU's nvmlGpmMetricsGet request, built once and read back without pynvml's per-field cost.

A poll asks the same metric ids every time, so the request (version, numMetrics, each metricId) is filled once and
only its two sample handles change. Reading the answers through the binding's structures costs a Python object per
metric and pynvml's `_PrintableStructure.__getattribute__` per field (about 27 metrics x 3 fields a GPU a poll, the
largest share of the agent's own work per poll); the answers are read instead in place, by one unpacker of the whole
array built from the offsets the binding's own structure declares, so a binding with another layout is read by its
layout (one unpack per field took 14.7 µs a GPU a poll, one for the array 4 µs).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

_SUCCESS = 0  # NVML_SUCCESS


def _field_reader(owner: type[ctypes.Structure], name: str) -> tuple[int, str]:
    """(offset, struct format character) of one scalar field of a ctypes structure: a simple type (c_uint, ...)."""
    kind: Any = dict((field[0], field[1]) for field in owner._fields_)[name]
    return getattr(owner, name).offset, kind._type_


def _array_unpacker(element: type[ctypes.Structure], count: int) -> tuple[struct.Struct, bool]:
    """One unpacker of the (nvmlReturn, value) pair of every element of a `count`-long array, in native byte order,
    with pad bytes for the rest; and whether the return comes before the value in each element."""
    returned, value = _field_reader(element, "nvmlReturn"), _field_reader(element, "value")
    (first_at, first), (second_at, second) = sorted((returned, value))
    tail = ctypes.sizeof(element) - second_at - struct.calcsize("=" + second)
    one = f"{first_at}x{first}{second_at - first_at - struct.calcsize('=' + first)}x{second}{tail}x"
    return struct.Struct("=" + one * count), returned[0] < value[0]


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
        element = request.metrics._type_
        self._unpack, return_first = _array_unpacker(element, len(self.ids))
        self._return_at, self._value_at = (0, 1) if return_first else (1, 0)
        # The asked part of the array, read in place (it lives as long as self.request).
        start = ctypes.addressof(request) + type(request).metrics.offset
        self._filled = (ctypes.c_char * (ctypes.sizeof(element) * len(self.ids))).from_address(start)

    def prepare(self, first: Any, second: Any) -> Any:
        """The request for the interval between two samples, for nvmlGpmMetricsGet."""
        self.request.sample1, self.request.sample2 = first, second
        return self.request

    def answers(self) -> dict[int, float]:
        """metricId -> value for every metric NVML answered with success."""
        pairs = self._unpack.unpack_from(self._filled)
        returns, values = pairs[self._return_at :: 2], pairs[self._value_at :: 2]
        return {
            metric: value for metric, code, value in zip(self.ids, returns, values, strict=True) if code == _SUCCESS
        }
