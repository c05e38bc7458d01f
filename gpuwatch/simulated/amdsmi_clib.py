"""A simulated libamd_smi.so: the C functions of amdsmi.h as ctypes function pointers over a SimulatedNode.

The vendor's ``amdsmi`` package (imported by amdsmi_binding.py) calls these exactly as it calls the real shared
library: handles are opaque pointers (the address of a small buffer per processor), results are written through
the pointers it passes, and every function returns an ``amdsmi_status_t``. So the Python above (struct layouts,
"N/A" conversions, exception classes, the differences between releases) is AMD's own code.

The library exports every symbol the binding's wrapper binds at import (the wrapper binds all of them, amdsmi
7.0.2 amdsmi_wrapper.py:211 and on, and a missing one would fail the import); those not simulated here answer
AMDSMI_STATUS_NOT_SUPPORTED, as a real library does for a feature the device lacks. A name the wrapper does not bind
is an undefined symbol (AttributeError, as ``ctypes.CDLL`` raises).

Struct layouts are taken from the binding's own wrapper (its classes are generated from the amdsmi.h of its
release, which is what a libamd_smi.so of that release was compiled against). A Python exception inside a function
is returned as AMDSMI_STATUS_INTERNAL_EXCEPTION and logged: a ctypes callback that raises would return 0, success.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from enum import IntEnum
from types import ModuleType
from typing import Any

from gpuwatch.simulated import amdsmi_readings as r
from gpuwatch.simulated.amdsmi_readings import Processor
from gpuwatch.simulated.scenarios import GpuSpec, GpuState, SimulatedNode

log = logging.getLogger(__name__)


class Status(IntEnum):
    """``amdsmi_status_t`` codes this library returns itself (amdsmi.h; the same numbers in 6.4 and 7.0)."""

    SUCCESS = 0
    INVAL = 1
    NOT_SUPPORTED = 2
    INTERNAL_EXCEPTION = 16
    NOT_FOUND = 31
    NOT_INIT = 32
    DRIVER_NOT_LOADED = 34
    NO_DATA = 40
    INSUFFICIENT_SIZE = 41


PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
VIOLATION_SLEEP_S = 0.1  # amdsmi_get_violation_status samples twice, ~100 ms apart

# C prototypes (amdsmi.h): H a processor/socket handle, P any other pointer; all return amdsmi_status_t (uint32).
H = P = ctypes.c_void_p
U32, U64, I32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
PROTOTYPES: dict[str, tuple[Any, ...]] = {
    "amdsmi_init": (U64,),
    "amdsmi_shut_down": (),
    "amdsmi_get_socket_handles": (P, P),
    "amdsmi_get_processor_handles": (H, P, P),
    "amdsmi_get_lib_version": (P,),
    "amdsmi_get_gpu_device_bdf": (H, P),
    "amdsmi_get_gpu_device_uuid": (H, P, P),
    "amdsmi_get_gpu_kfd_info": (H, P),
    "amdsmi_get_gpu_asic_info": (H, P),
    "amdsmi_get_gpu_board_info": (H, P),
    "amdsmi_get_gpu_vbios_info": (H, P),
    "amdsmi_get_gpu_driver_info": (H, P),
    "amdsmi_get_temp_metric": (H, U32, U32, P),
    "amdsmi_get_clock_info": (H, U32, P),
    "amdsmi_get_power_info": (H, P),
    "amdsmi_get_power_info_v2": (H, U32, P),
    "amdsmi_get_power_cap_info": (H, U32, P),
    "amdsmi_get_energy_count": (H, P, P, P),
    "amdsmi_get_violation_status": (H, P),
    "amdsmi_get_gpu_metrics_info": (H, P),
    "amdsmi_get_gpu_activity": (H, P),
    "amdsmi_get_gpu_vram_usage": (H, P),
    "amdsmi_get_gpu_total_ecc_count": (H, P),
    "amdsmi_get_gpu_ecc_enabled": (H, P),
    "amdsmi_get_gpu_bad_page_info": (H, P, P),
    "amdsmi_get_gpu_bad_page_threshold": (H, P),  # 7.x; 6.x's wrapper never asks for it
    "amdsmi_get_pcie_info": (H, P),
    "amdsmi_get_gpu_xgmi_link_status": (H, P),
    "amdsmi_get_gpu_process_list": (H, P, P),
    "amdsmi_get_gpu_compute_partition": (H, P, U32),
    "amdsmi_get_gpu_memory_partition": (H, P, U32),
    "amdsmi_init_gpu_event_notification": (H,),
    "amdsmi_set_gpu_event_notification_mask": (H, U64),
    "amdsmi_get_gpu_event_notification": (I32, P, P),
    "amdsmi_stop_gpu_event_notification": (H,),
}
# Functions that read one struct of the device: C name -> (struct type in the wrapper, filler).
_Filler = Callable[[Any, GpuSpec, GpuState, Processor], None]
_STRUCT_GETTERS: dict[str, tuple[str, _Filler]] = {
    "amdsmi_get_gpu_device_bdf": ("amdsmi_bdf_t", lambda s, spec, _, p: r.bdf(s, spec, p)),
    "amdsmi_get_gpu_kfd_info": ("amdsmi_kfd_info_t", lambda s, _, __, p: r.kfd_info(s, p)),
    "amdsmi_get_gpu_asic_info": ("amdsmi_asic_info_t", lambda s, spec, _, p: r.asic_info(s, spec, p)),
    "amdsmi_get_gpu_board_info": ("amdsmi_board_info_t", lambda s, spec, _, __: r.board_info(s, spec)),
    "amdsmi_get_gpu_vbios_info": ("amdsmi_vbios_info_t", lambda s, spec, _, __: r.vbios_info(s, spec)),
    "amdsmi_get_gpu_driver_info": ("amdsmi_driver_info_t", lambda s, spec, _, __: r.driver_info(s, spec)),
    "amdsmi_get_power_info": ("amdsmi_power_info_t", lambda s, _, state, __: r.power_info(s, state)),
    "amdsmi_get_gpu_metrics_info": ("amdsmi_gpu_metrics_t", r.gpu_metrics),
    "amdsmi_get_gpu_activity": ("amdsmi_engine_usage_t", lambda s, _, state, __: r.engine_usage(s, state)),
    "amdsmi_get_gpu_vram_usage": ("amdsmi_vram_usage_t", r.vram_usage),
    "amdsmi_get_gpu_total_ecc_count": ("amdsmi_error_count_t", lambda s, _, state, __: r.error_count(s, state)),
    "amdsmi_get_pcie_info": ("amdsmi_pcie_info_t", lambda s, spec, state, _: r.pcie_info(s, spec, state)),
}


class CallFailed(Exception):
    """Return this status from the C function now."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = int(status)


class SimulatedLibAmdSmi:
    """libamd_smi.so over ``node``, as loaded by the binding at ``symbols`` (the names its wrapper binds).

    ``calls`` counts the C calls by name (``unsupported_calls`` those of symbols not simulated);
    ``latency_scale`` > 0 makes violation status sleep that share of its ~100 ms; ``partition`` ("SPX", "CPX", …)
    splits every socket into that many processors.
    """

    def __init__(
        self,
        node: SimulatedNode,
        symbols: frozenset[str],
        *,
        partition: str = "SPX",
        latency_scale: float = 0.0,
        lib_version: tuple[int, int, int] = (25, 5, 1),
    ) -> None:
        if partition not in PARTITIONS:
            raise ValueError(f"unknown compute partition {partition!r}; known: {', '.join(PARTITIONS)}")
        self._node = node
        self._symbols = symbols
        self._functions: dict[str, Any] = {}
        self._structs: ModuleType | None = None
        self.partition = partition
        self.latency_scale = latency_scale
        self.lib_version = lib_version
        self.calls: Counter[str] = Counter()
        self.unsupported_calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._initialised = False
        self._buffers: list[Any] = []  # the memory our handles point at, kept alive while initialised
        self._processors: dict[int, Processor] = {}  # handle address -> processor
        self._sockets: dict[int, list[int]] = {}  # socket handle address -> its processor handles
        self._build = ctypes.create_string_buffer(b"%d.%d.%d.0" % lib_version)
        self._registered: dict[int, int] = {}  # socket index -> event mask
        self._delivered: set[int] = set()  # event sequence numbers already read

    # ----- the symbol table -----

    def attach(self, wrapper: ModuleType) -> None:
        """The binding's amdsmi_wrapper module, whose struct classes are the layouts this library writes."""
        self._structs = wrapper

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._symbols:
            raise AttributeError(f"libamd_smi.so: undefined symbol: {name}")
        function = self._functions.get(name)
        if function is None:
            function = self._functions[name] = self._function(name)
        return function

    def _function(self, name: str) -> Any:
        argtypes = PROTOTYPES.get(name)
        implementation = (
            self._read_struct if name in _STRUCT_GETTERS else getattr(self, "_c_" + name.removeprefix("amdsmi_"), None)
        )
        if argtypes is None or implementation is None:
            return ctypes.CFUNCTYPE(U32)(self._unsupported(name))
        return ctypes.CFUNCTYPE(U32, *argtypes)(self._entry(name, implementation))

    def _unsupported(self, name: str) -> Callable[[], int]:
        """A symbol not simulated: NOT_SUPPORTED, counted in ``unsupported_calls`` (extra C arguments are ignored,
        as a C callee ignores what it does not declare)."""

        def call() -> int:
            self.unsupported_calls[name] += 1
            return int(Status.NOT_SUPPORTED)

        return call

    def _entry(self, name: str, implementation: Callable[..., None]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            self.calls[name] += 1
            try:
                implementation(name, *args)
            except CallFailed as failed:
                return failed.status
            except Exception:
                log.exception("simulated libamd_smi.so: %s failed", name)
                return int(Status.INTERNAL_EXCEPTION)
            return int(Status.SUCCESS)

        return call

    # ----- the gate every call passes, in the order the real library checks -----

    def _enter(self, names: Sequence[str], handle: int | None = None, *, device: bool = True) -> Processor | None:
        node = self._node
        if node.library_missing:  # the driver went away underneath a running library
            raise CallFailed(Status.DRIVER_NOT_LOADED)
        with self._lock:
            if not self._initialised:
                raise CallFailed(Status.NOT_INIT)
            proc = self._processors.get(handle or 0) if device else None
        if device and proc is None:
            raise CallFailed(Status.INVAL)
        code = node.faults.before_call(names, proc.index if proc else None)
        if code is not None:
            raise CallFailed(code)
        if proc is not None and node.is_lost(proc.index):
            raise CallFailed(Status.NOT_FOUND)
        return proc

    def _device(self, name: str, handle: int | None) -> tuple[Processor, GpuSpec, GpuState]:
        proc = self._enter((name,), handle)
        assert proc is not None
        return proc, self._node.spec(proc.index), self._node.state(proc.index)

    def _struct(self, type_name: str, address: int | None) -> Any:
        if not address:
            raise CallFailed(Status.INVAL)
        assert self._structs is not None, "attach() the binding's wrapper first"
        return getattr(self._structs, type_name).from_address(address)

    @staticmethod
    def _out(ctype: Any, address: int | None) -> Any:
        if not address:
            raise CallFailed(Status.INVAL)
        return ctype.from_address(address)

    # ----- init and discovery -----

    def _c_init(self, name: str, flags: int) -> None:
        if self._node.library_missing:
            raise CallFailed(Status.DRIVER_NOT_LOADED)
        code = self._node.faults.before_call((name,), None)
        if code is not None:
            raise CallFailed(code)
        with self._lock:
            if self._initialised:
                return
            per = PARTITIONS[self.partition]
            self._buffers, self._processors, self._sockets = [], {}, {}
            for index in range(self._node.gpu_count):
                procs = []
                for partition in range(per):
                    procs.append(self._allocate())
                    self._processors[procs[-1]] = Processor(index, partition, per)
                self._sockets[self._allocate()] = procs
            self._initialised = True

    def _allocate(self) -> int:
        buffer = ctypes.create_string_buffer(16)
        self._buffers.append(buffer)
        return ctypes.addressof(buffer)

    def _c_shut_down(self, name: str) -> None:
        with self._lock:
            self._initialised = False
            self._processors, self._sockets, self._buffers = {}, {}, []
            self._registered.clear()

    def _c_get_socket_handles(self, name: str, count: int | None, handles: int | None) -> None:
        self._enter((name,), device=False)
        with self._lock:
            sockets = list(self._sockets)
        self._fill_handles(sockets, count, handles)

    def _c_get_processor_handles(self, name: str, socket: int | None, count: int | None, handles: int | None) -> None:
        self._enter((name,), device=False)
        with self._lock:
            procs = self._sockets.get(socket or 0)
        if procs is None:
            raise CallFailed(Status.INVAL)
        self._fill_handles(procs, count, handles)

    def _fill_handles(self, found: list[int], count: int | None, handles: int | None) -> None:
        """amdsmi.h: with a NULL array, *count says how many there are; else up to *count are written."""
        n = self._out(U32, count)
        if handles:
            written = found[: n.value]
            array = (ctypes.c_void_p * len(written)).from_address(handles)
            for slot, handle in enumerate(written):
                array[slot] = handle
            n.value = len(written)
        else:
            n.value = len(found)

    def _c_get_lib_version(self, name: str, version: int | None) -> None:
        out = self._struct("amdsmi_version_t", version)
        major, minor, release = self.lib_version
        r.put(out, {"year": 2025, "major": major, "minor": minor, "release": release}, optional=("year",))
        out.build = ctypes.cast(self._build, ctypes.POINTER(ctypes.c_char))

    # ----- per-device readings -----

    def _read_struct(self, name: str, handle: int | None, pointer: int | None) -> None:
        type_name, filler = _STRUCT_GETTERS[name]
        proc, spec, state = self._device(name, handle)
        filler(self._struct(type_name, pointer), spec, state, proc)

    def _c_get_gpu_device_uuid(self, name: str, handle: int | None, length: int | None, buffer: int | None) -> None:
        proc, spec, _ = self._device(name, handle)
        size = self._out(U32, length)
        text = r.uuid(spec, proc).encode() + b"\0"
        if not buffer or size.value < len(text):
            raise CallFailed(Status.INSUFFICIENT_SIZE)
        ctypes.memmove(buffer, text, len(text))
        size.value = len(text) - 1

    def _c_get_temp_metric(self, name: str, handle: int | None, sensor: int, metric: int, out: int | None) -> None:
        _, spec, state = self._device(name, handle)
        value = r.temperature(spec, state, sensor, metric)
        if value is None:
            raise CallFailed(Status.NOT_SUPPORTED)
        self._out(ctypes.c_int64, out).value = value

    def _c_get_clock_info(self, name: str, handle: int | None, clock: int, out: int | None) -> None:
        _, spec, state = self._device(name, handle)
        clock_name = r.CLOCKS.get(clock)
        if clock_name is None:
            raise CallFailed(Status.NOT_SUPPORTED)
        r.clock_info(self._struct("amdsmi_clk_info_t", out), spec, state, clock_name)

    def _c_get_power_info_v2(self, name: str, handle: int | None, sensor: int, out: int | None) -> None:
        proc = self._enter((name, "amdsmi_get_power_info"), handle)
        assert proc is not None
        if sensor != 0:
            raise CallFailed(Status.INVAL)
        r.power_info(self._struct("amdsmi_power_info_t", out), self._node.state(proc.index))

    def _c_get_power_cap_info(self, name: str, handle: int | None, sensor: int, out: int | None) -> None:
        _, spec, state = self._device(name, handle)
        if sensor != 0:
            raise CallFailed(Status.INVAL)
        r.power_cap_info(self._struct("amdsmi_power_cap_info_t", out), spec, state)

    def _c_get_energy_count(
        self, name: str, handle: int | None, energy: int | None, resolution: int | None, stamp: int | None
    ) -> None:
        _, _, state = self._device(name, handle)
        counts, per_count, nanoseconds = r.energy_count(state)
        self._out(U64, energy).value = counts
        self._out(ctypes.c_float, resolution).value = per_count
        self._out(U64, stamp).value = nanoseconds

    def _c_get_violation_status(self, name: str, handle: int | None, out: int | None) -> None:
        _, _, state = self._device(name, handle)
        if self.latency_scale > 0:
            time.sleep(VIOLATION_SLEEP_S * self.latency_scale)
        r.violation_status(self._struct("amdsmi_violation_status_t", out), state)

    def _c_get_gpu_ecc_enabled(self, name: str, handle: int | None, out: int | None) -> None:
        self._device(name, handle)
        self._out(U64, out).value = 0x3FFF  # every RAS block

    def _c_get_gpu_bad_page_threshold(self, name: str, handle: int | None, out: int | None) -> None:
        _, spec, _ = self._device(name, handle)
        self._out(U32, out).value = r.bad_page_threshold(spec)

    def _c_get_gpu_bad_page_info(self, name: str, handle: int | None, count: int | None, out: int | None) -> None:
        _, _, state = self._device(name, handle)
        pages = r.bad_pages(state)
        n = self._out(U32, count)
        if out:
            record = self._record_type("amdsmi_retired_page_record_t")
            written = pages[: n.value]
            array = (record * len(written)).from_address(out)
            for slot, (address, size, status) in zip(array, written, strict=True):
                r.put(slot, {"page_address": address, "page_size": size, "status": status})
            n.value = len(written)
        else:
            n.value = len(pages)

    def _c_get_gpu_xgmi_link_status(self, name: str, handle: int | None, out: int | None) -> None:
        _, spec, state = self._device(name, handle)
        if not spec.nvlink_links:
            raise CallFailed(Status.NOT_SUPPORTED)
        r.xgmi_link_status(self._struct("amdsmi_xgmi_link_status_t", out), spec, state)

    def _c_get_gpu_process_list(self, name: str, handle: int | None, count: int | None, out: int | None) -> None:
        proc, _, state = self._device(name, handle)
        found = r.processes(state, proc)
        n = self._out(U32, count)
        if out:
            written = found[: n.value]
            array = (self._record_type("amdsmi_proc_info_t") * len(written)).from_address(out)
            for slot, (pid, vram) in zip(array, written, strict=True):
                r.process_info(slot, pid, vram)
            n.value = len(written)
        else:
            n.value = len(found)

    def _c_get_gpu_compute_partition(self, name: str, handle: int | None, out: int | None, length: int) -> None:
        self._device(name, handle)
        self._string(self.partition, out, length)

    def _c_get_gpu_memory_partition(self, name: str, handle: int | None, out: int | None, length: int) -> None:
        self._device(name, handle)
        self._string("NPS4" if self.partition == "CPX" else "NPS1", out, length)

    @staticmethod
    def _string(text: str, out: int | None, length: int) -> None:
        data = text.encode() + b"\0"
        if not out or length < len(data):
            raise CallFailed(Status.INSUFFICIENT_SIZE)
        ctypes.memmove(out, data, len(data))

    def _record_type(self, type_name: str) -> Any:
        assert self._structs is not None, "attach() the binding's wrapper first"
        return getattr(self._structs, type_name)

    # ----- reset events (amdsmi.h: mask bit (type - 1); one queue for every registered device) -----

    def _c_init_gpu_event_notification(self, name: str, handle: int | None) -> None:
        proc = self._enter((name,), handle)
        assert proc is not None
        node = self._node
        with self._lock:
            if proc.index not in self._registered:
                # What happened before the GPU was registered is never delivered.
                self._delivered.update(e.seq for e in node.events_until(node.elapsed()) if e.gpu == proc.index)
                self._registered[proc.index] = 0

    def _c_set_gpu_event_notification_mask(self, name: str, handle: int | None, mask: int) -> None:
        proc = self._enter((name,), handle)
        assert proc is not None
        with self._lock:
            if proc.index not in self._registered:
                raise CallFailed(Status.INVAL)
            self._registered[proc.index] = mask

    def _c_stop_gpu_event_notification(self, name: str, handle: int | None) -> None:
        proc = self._enter((name,), handle)
        assert proc is not None
        with self._lock:
            self._registered.pop(proc.index, None)

    def _c_get_gpu_event_notification(self, name: str, timeout_ms: int, count: int | None, out: int | None) -> None:
        """Block up to ``timeout_ms`` (real time) for reset events of any registered GPU; NO_DATA when none came."""
        self._enter((name,), device=False)
        n = self._out(U32, count)
        if not out:
            raise CallFailed(Status.INVAL)
        record = self._record_type("amdsmi_evt_notification_data_t")
        node = self._node
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            found = self._take_events(n.value)
            if found:
                array = (record * len(found)).from_address(out)
                for slot, (handle, kind, message) in zip(array, found, strict=True):
                    slot.processor_handle, slot.event = handle, kind
                    slot.message = message[: len(slot.message)]
                n.value = len(found)
                return
            left = deadline - time.monotonic()
            if left <= 0:
                n.value = 0
                raise CallFailed(Status.NO_DATA)
            node.wait_for_change(min(left, 0.1 if node.clock_is_real else 0.005))

    def _take_events(self, room: int) -> list[tuple[int, int, bytes]]:
        node, found = self._node, list[tuple[int, int, bytes]]()
        with self._lock:
            primary = {p.index: h for h, p in self._processors.items() if p.primary}
            for event in node.events_until(node.elapsed()):
                mask = self._registered.get(event.gpu, 0)
                if event.seq in self._delivered or event.kind != "reset" or not mask:
                    continue
                self._delivered.add(event.seq)
                for kind in r.RESET_EVENTS:
                    if mask & (1 << (kind - 1)) and len(found) < room:
                        found.append((primary[event.gpu], kind, f"reset seq={event.seq}".encode()))
        return found
