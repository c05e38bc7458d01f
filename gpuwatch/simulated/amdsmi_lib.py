"""A stand-in for the ``amdsmi`` module over a SimulatedNode: same functions, parameters, enums, dict keys, "N/A"
strings and exception classes, so ``backends/amdsmi.py`` runs unchanged on it.

    lib = import_simulated_amdsmi(SimulatedNode("overheating", vendor="amd"))
    lib.amdsmi_init(lib.AmdSmiInitFlags.INIT_AMD_GPUS); h = lib.amdsmi_get_processor_handles()[2]
    lib.amdsmi_get_temp_metric(h, lib.AmdSmiTemperatureType.HOTSPOT, lib.AmdSmiTemperatureMetric.CURRENT)

Faithful where a backend can go wrong (../shared/reference/vendor-apis.md, "AMD SMI"): the import itself fails with
``KeyError: 'libamd_smi.so'`` when the library is missing; init takes an enum member (a plain int raises
AmdSmiParameterException); getters type-check handles and enums; "N/A" strings where a value is unavailable; µW
power caps, MiB VRAM, MT/s PCIe speeds, °C temperatures; violation status sleeps ~100 ms; the event reader raises
NO_DATA (40) when nothing arrived before the timeout. ``shape`` picks the key set of a release:

- ``"7.0"``: power_info has ``socket_power``; the current default.
- ``"6.4"``: power_info(processor_handle, sensor_ind=0) without ``socket_power``.
- ``"6.1"``: also ``cur_clk`` in clock_info, energy under ``power``, ``throttle_status`` an int bitmask, and no
  violation status (NOT_SUPPORTED).

``partition="CPX"`` splits every MI300X into 8 compute partitions that repeat the socket-level readings, as the
real library does.
"""

from __future__ import annotations

import ctypes
import inspect
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal

from gpuwatch.simulated import amdsmi_types as t
from gpuwatch.simulated.amdsmi_types import (
    AmdSmiClkType,
    AmdSmiComputePartitionType,
    AmdSmiEvtNotificationType,
    AmdSmiInitFlags,
    AmdSmiLibraryException,
    AmdSmiParameterException,
    AmdSmiTemperatureMetric,
    AmdSmiTemperatureType,
    check_res,
)
from gpuwatch.simulated.scenarios import GpuSpec, GpuState, SimulatedNode

Shape = Literal["7.0", "6.4", "6.1"]
SHAPES: tuple[Shape, ...] = ("7.0", "6.4", "6.1")
_LIB_VERSION = {"7.0": (25, 5, 1), "6.4": (25, 3, 0), "6.1": (24, 5, 1)}  # libamd_smi of ROCm 7.0.2 / 6.4.3 / 6.1
_PACKAGE_VERSION = {"7.0": "7.0.2", "6.4": "6.4.3", "6.1": "6.1.2"}
_NA = "N/A"
_PCIE_MTS = {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}
_ENERGY_RESOLUTION_UJ = 15.3  # µJ per energy-accumulator count on an MI300X
_ACC_HZ = 1000  # gpu_metrics accumulation_counter ticks per second
_PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
_VIOLATION_SLEEP_S = 0.1  # amdsmi_get_violation_status samples twice, ~100 ms apart


class _Gpu:
    """What one handle stands for: a socket of the node and a compute partition of it."""

    __slots__ = ("index", "partition", "partitions")

    def __init__(self, index: int, partition: int, partitions: int) -> None:
        self.index = index
        self.partition = partition
        self.partitions = partitions


class SimulatedAmdSmi:
    """The ``amdsmi`` module over a simulated node; every amdsmi_* method mirrors the real function of that name.

    ``calls`` counts the calls by name (tests check what the fast poll asks); ``latency_scale`` > 0 makes
    violation status sleep that share of its real ~100 ms.
    """

    AmdSmiInitFlags = t.AmdSmiInitFlags
    AmdSmiClkType = t.AmdSmiClkType
    AmdSmiTemperatureType = t.AmdSmiTemperatureType
    AmdSmiTemperatureMetric = t.AmdSmiTemperatureMetric
    AmdSmiEvtNotificationType = t.AmdSmiEvtNotificationType
    AmdSmiComputePartitionType = t.AmdSmiComputePartitionType
    AmdSmiMemoryPartitionType = t.AmdSmiMemoryPartitionType
    AmdSmiException = t.AmdSmiException
    AmdSmiLibraryException = t.AmdSmiLibraryException
    AmdSmiRetryException = t.AmdSmiRetryException
    AmdSmiTimeoutException = t.AmdSmiTimeoutException
    AmdSmiParameterException = t.AmdSmiParameterException
    AmdSmiKeyException = t.AmdSmiKeyException
    AmdSmiBdfFormatException = t.AmdSmiBdfFormatException
    amdsmi_wrapper = t.amdsmi_wrapper

    def __init__(
        self, node: SimulatedNode, *, shape: Shape = "7.0", partition: str = "SPX", latency_scale: float = 0.0
    ) -> None:
        if shape not in SHAPES:
            raise ValueError(f"unknown amdsmi shape {shape!r}; known: {', '.join(SHAPES)}")
        if partition not in _PARTITIONS:
            raise ValueError(f"unknown compute partition {partition!r}; known: {', '.join(_PARTITIONS)}")
        self._node = node
        self.shape: Shape = shape
        self.partition = partition
        self.__version__ = _PACKAGE_VERSION[shape]
        self._latency_scale = latency_scale
        self._lock = threading.Lock()
        self._initialised = False
        self.calls: Counter[str] = Counter()
        per = _PARTITIONS[partition]
        self._gpus = [_Gpu(i, p, per) for i in range(node.gpu_count) for p in range(per)]
        self._base = (id(self) & 0xFFFF_FFFF) << 16
        self._registered: dict[int, set[AmdSmiEvtNotificationType]] = {}  # socket -> event types asked for
        self._delivered: set[int] = set()  # event sequence numbers already read
        if shape != "7.0":
            # 6.x: power_info takes a sensor index and has no socket_power.
            self.amdsmi_get_power_info = self._power_info_v6  # type: ignore[method-assign]

    # --- the gate every call passes ---------------------------------------------------------------------------
    def _enter(self, name: str, handle: object = None, *, device: bool = True) -> _Gpu | None:
        """Parameter check, library state, injected faults, lost GPUs, in the order the real module meets them."""
        self.calls[name] += 1
        gpu = None
        if device:
            if not isinstance(handle, ctypes.c_void_p):
                raise AmdSmiParameterException(handle, t.amdsmi_wrapper.amdsmi_processor_handle)
            offset = (handle.value or 0) - self._base
            if not 0 <= offset < len(self._gpus):
                check_res(t.STATUS["AMDSMI_STATUS_INVAL"])
            gpu = self._gpus[offset]
        if self._node.library_missing:  # the driver went away underneath a running library
            check_res(t.STATUS["AMDSMI_STATUS_DRIVER_NOT_LOADED"])
        with self._lock:
            if not self._initialised:
                check_res(t.STATUS["AMDSMI_STATUS_NOT_INIT"])
        code = self._node.faults.before_call((name,), gpu.index if gpu else None)
        if code is not None:
            check_res(code)
        if gpu is not None and self._node.is_lost(gpu.index):
            check_res(t.STATUS["AMDSMI_STATUS_NOT_FOUND"])
        return gpu

    def _dev(self, name: str, handle: object) -> tuple[_Gpu, GpuSpec, GpuState]:
        gpu = self._enter(name, handle)
        assert gpu is not None
        return gpu, self._node.spec(gpu.index), self._node.state(gpu.index)

    def _handle(self, offset: int) -> ctypes.c_void_p:
        return ctypes.c_void_p(self._base + offset)

    # --- init, discovery, versions ----------------------------------------------------------------------------
    def amdsmi_init(self, flag: object = t.AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        self.calls["amdsmi_init"] += 1
        if self._node.library_missing:
            check_res(t.STATUS["AMDSMI_STATUS_DRIVER_NOT_LOADED"])
        code = self._node.faults.before_call(("amdsmi_init",), None)
        if code is not None:
            check_res(code)
        with self._lock:
            self._initialised = True

    def amdsmi_shut_down(self) -> None:
        self.calls["amdsmi_shut_down"] += 1
        with self._lock:
            self._initialised = False

    def amdsmi_get_processor_handles(self) -> list[ctypes.c_void_p]:
        self._enter("amdsmi_get_processor_handles", device=False)
        return [self._handle(i) for i in range(len(self._gpus))]

    def amdsmi_get_lib_version(self) -> dict[str, Any]:
        major, minor, release = _LIB_VERSION[self.shape]
        return {"major": major, "minor": minor, "release": release, "build": f"{major}.{minor}.{release}.0"}

    def amdsmi_get_rocm_version(self) -> tuple[bool, str]:
        return True, {"7.0": "7.0.2", "6.4": "6.4.3", "6.1": "6.1.2"}[self.shape]

    # --- identity ---------------------------------------------------------------------------------------------
    def amdsmi_get_gpu_device_bdf(self, processor_handle: object) -> str:
        gpu, spec, _ = self._dev("amdsmi_get_gpu_device_bdf", processor_handle)
        return spec.pci_bus_id[:-1] + str(gpu.partition)  # partitions differ in the PCI function

    def amdsmi_get_gpu_device_uuid(self, processor_handle: object) -> str:
        gpu, spec, _ = self._dev("amdsmi_get_gpu_device_uuid", processor_handle)
        return spec.uuid if gpu.partition == 0 else f"{spec.uuid[:-2]}{gpu.partition:02x}"

    def amdsmi_get_gpu_kfd_info(self, processor_handle: object) -> dict[str, Any]:
        gpu, _, _ = self._dev("amdsmi_get_gpu_kfd_info", processor_handle)
        n = gpu.index * gpu.partitions + gpu.partition
        return {"kfd_id": 18000 + 1000 * n, "node_id": 2 + n, "current_partition_id": gpu.partition}

    def amdsmi_get_gpu_asic_info(self, processor_handle: object) -> dict[str, Any]:
        _, spec, _ = self._dev("amdsmi_get_gpu_asic_info", processor_handle)
        return {
            "market_name": spec.model,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{spec.serial}",
            "oam_id": spec.index,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
            "subsystem_id": "0x74a1",
        }

    def amdsmi_get_gpu_board_info(self, processor_handle: object) -> dict[str, Any]:
        _, spec, _ = self._dev("amdsmi_get_gpu_board_info", processor_handle)
        return {
            "model_number": spec.board_part_number,
            "product_serial": spec.serial,
            "fru_id": _NA,
            "product_name": "AMD Instinct MI300X OAM",
            "manufacturer_name": "AMD",
        }

    def amdsmi_get_gpu_vbios_info(self, processor_handle: object) -> dict[str, Any]:
        _, spec, _ = self._dev("amdsmi_get_gpu_vbios_info", processor_handle)
        return {"name": "AMD MI300X_HW_SRIOV_CVS_1VF", "build_date": "2024/05/29 15:24",
                "part_number": spec.vbios_version, "version": "022.040.003.042.000001"}  # fmt: skip

    def amdsmi_get_gpu_driver_info(self, processor_handle: object) -> dict[str, Any]:
        _, spec, _ = self._dev("amdsmi_get_gpu_driver_info", processor_handle)
        return {"driver_name": "amdgpu", "driver_version": spec.driver_version, "driver_date": "2015/01/01 00:00"}

    # --- thermal, clocks, power -------------------------------------------------------------------------------
    def amdsmi_get_temp_metric(self, processor_handle: object, sensor_type: object, metric: object) -> int:
        if not isinstance(sensor_type, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor_type, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        _, spec, state = self._dev("amdsmi_get_temp_metric", processor_handle)
        # MI300X: no edge sensor; hotspot and VRAM with their critical and emergency limits (°C, whole degrees).
        metric_values = {
            AmdSmiTemperatureType.HOTSPOT: {
                AmdSmiTemperatureMetric.CURRENT: state.temperature_core_celsius,
                AmdSmiTemperatureMetric.CRITICAL: spec.temp_slowdown_celsius,
                AmdSmiTemperatureMetric.EMERGENCY: spec.temp_shutdown_celsius,
            },
            AmdSmiTemperatureType.VRAM: {
                AmdSmiTemperatureMetric.CURRENT: state.temperature_memory_celsius,
                AmdSmiTemperatureMetric.CRITICAL: spec.temp_memory_max_celsius,
                AmdSmiTemperatureMetric.EMERGENCY: spec.temp_memory_max_celsius + 10,
            },
        }.get(AmdSmiTemperatureType(int(sensor_type)), {})
        value = metric_values.get(AmdSmiTemperatureMetric(int(metric)))
        if value is None:
            check_res(t.STATUS["AMDSMI_STATUS_NOT_SUPPORTED"])
        return round(float(value or 0))

    def amdsmi_get_clock_info(self, processor_handle: object, clock_type: object) -> dict[str, Any]:
        if not isinstance(clock_type, AmdSmiClkType):
            raise AmdSmiParameterException(clock_type, AmdSmiClkType)
        _, spec, state = self._dev("amdsmi_get_clock_info", processor_handle)
        name = {AmdSmiClkType.GFX: "graphics", AmdSmiClkType.MEM: "memory", AmdSmiClkType.VCLK0: "video"}.get(
            AmdSmiClkType(int(clock_type))
        )
        if name is None:
            check_res(t.STATUS["AMDSMI_STATUS_NOT_SUPPORTED"])
        assert name is not None
        current = round(state.clocks_mhz[name])
        key = "cur_clk" if self.shape == "6.1" else "clk"
        return {key: current, "min_clk": min(current, 500 if name == "graphics" else 900 if name == "memory" else 914),
                "max_clk": spec.clock_max_mhz[name], "clk_locked": False, "clk_deep_sleep": current < 200}  # fmt: skip

    def _power(self, name: str, processor_handle: object) -> dict[str, Any]:
        _, _, state = self._dev(name, processor_handle)
        watts = round(state.power_watts)
        # MI300X: the current socket power is filled, the average is not (0xFFFF -> "N/A").
        return {"socket_power": watts, "current_socket_power": watts, "average_socket_power": _NA,
                "gfx_voltage": _NA, "soc_voltage": _NA, "mem_voltage": _NA,
                "power_limit": int(state.power_limit_enforced_watts * 1e6)}  # fmt: skip

    def amdsmi_get_power_info(self, processor_handle: object) -> dict[str, Any]:
        return self._power("amdsmi_get_power_info", processor_handle)

    def _power_info_v6(self, processor_handle: object, sensor_ind: int = 0) -> dict[str, Any]:
        info = self._power("amdsmi_get_power_info", processor_handle)
        del info["socket_power"]
        return info

    def amdsmi_get_power_cap_info(self, processor_handle: object) -> dict[str, Any]:
        _, spec, state = self._dev("amdsmi_get_power_cap_info", processor_handle)
        return {"power_cap": int(state.power_limit_enforced_watts * 1e6),
                "default_power_cap": int(spec.power_limit_default_watts * 1e6),
                "dpm_cap": 1, "min_power_cap": int(spec.power_limit_min_watts * 1e6),
                "max_power_cap": int(spec.power_limit_max_watts * 1e6)}  # fmt: skip

    def amdsmi_get_energy_count(self, processor_handle: object) -> dict[str, Any]:
        _, _, state = self._dev("amdsmi_get_energy_count", processor_handle)
        counts = int(state.energy_joules * 1e6 / _ENERGY_RESOLUTION_UJ)
        key = "power" if self.shape == "6.1" else "energy_accumulator"
        return {key: counts, "counter_resolution": _ENERGY_RESOLUTION_UJ, "timestamp": int(state.timestamp * 1e9)}

    # --- throttling -------------------------------------------------------------------------------------------
    def amdsmi_get_violation_status(self, processor_handle: object) -> dict[str, Any]:
        _, _, state = self._dev("amdsmi_get_violation_status", processor_handle)
        if self.shape == "6.1":
            check_res(t.STATUS["AMDSMI_STATUS_NOT_SUPPORTED"])
        if self._latency_scale > 0:
            time.sleep(_VIOLATION_SLEEP_S * self._latency_scale)
        acc, residency, active = _residency(state)
        out: dict[str, Any] = {"reference_timestamp": int(state.timestamp * 1e6), "violation_timestamp": 100_000,
                               "acc_counter": acc}  # fmt: skip
        for key in ("prochot_thrm", "ppt_pwr", "socket_thrm", "vr_thrm", "hbm_thrm"):
            out[f"acc_{key}"] = residency[key]
            out[f"per_{key}"] = 100 if active[key] else 0
            out[f"active_{key}"] = active[key]
        return out

    def amdsmi_get_gpu_metrics_info(self, processor_handle: object) -> dict[str, Any]:
        gpu, spec, state = self._dev("amdsmi_get_gpu_metrics_info", processor_handle)
        acc, residency, active = _residency(state)
        throttling = any(active.values())
        out: dict[str, Any] = dict.fromkeys(_METRICS_KEYS, _NA)
        out.update(
            temperature_hotspot=round(state.temperature_core_celsius),
            temperature_mem=round(state.temperature_memory_celsius),
            average_gfx_activity=round(state.utilization * 100),
            average_umc_activity=round(state.memory_utilization * 100),
            current_socket_power=round(state.power_watts),
            energy_accumulator=int(state.energy_joules * 1e6 / _ENERGY_RESOLUTION_UJ),
            system_clock_counter=int(state.elapsed * 1e8),
            current_gfxclk=round(state.clocks_mhz["graphics"]),
            current_uclk=round(state.clocks_mhz["memory"]),
            throttle_status=int(throttling) if self.shape == "6.1" else throttling,
            pcie_link_width=state.pcie_width,
            pcie_link_speed=_PCIE_MTS.get(state.pcie_generation, 0) // 100,  # 0.1 GT/s units
            pcie_l0_to_recov_count_acc=state.counters.pcie_l0_recoveries,
            pcie_replay_count_acc=state.counters.pcie_replays,
            accumulation_counter=acc,
            prochot_residency_acc=residency["prochot_thrm"],
            ppt_residency_acc=residency["ppt_pwr"],
            socket_thm_residency_acc=residency["socket_thrm"],
            vr_thm_residency_acc=residency["vr_thrm"],
            hbm_thm_residency_acc=residency["hbm_thrm"],
            num_partition=gpu.partitions,
            xgmi_link_width=16 if spec.nvlink_links else _NA,
            xgmi_link_speed=32 if spec.nvlink_links else _NA,
        )
        return out

    # --- activity, memory, errors, PCIe, links, processes, partitions ------------------------------------------
    def amdsmi_get_gpu_activity(self, processor_handle: object) -> dict[str, Any]:
        _, _, state = self._dev("amdsmi_get_gpu_activity", processor_handle)
        return {"gfx_activity": round(state.utilization * 100),
                "umc_activity": round(state.memory_utilization * 100), "mm_activity": _NA}  # fmt: skip

    def amdsmi_get_gpu_vram_usage(self, processor_handle: object) -> dict[str, Any]:
        gpu, spec, state = self._dev("amdsmi_get_gpu_vram_usage", processor_handle)
        total = spec.memory_total_bytes // gpu.partitions
        used = (spec.memory_reserved_bytes + state.memory_used_bytes) // gpu.partitions
        return {"vram_total": total // 2**20, "vram_used": used // 2**20}

    def amdsmi_get_gpu_total_ecc_count(self, processor_handle: object) -> dict[str, Any]:
        _, _, state = self._dev("amdsmi_get_gpu_total_ecc_count", processor_handle)
        c = state.counters
        return {"correctable_count": c.ecc_corrected, "uncorrectable_count": c.ecc_uncorrected,
                "deferred_count": c.ecc_uncorrected}  # fmt: skip  # HBM poison is deferred before it is consumed

    def amdsmi_get_gpu_ecc_enabled(self, processor_handle: object) -> int:
        self._dev("amdsmi_get_gpu_ecc_enabled", processor_handle)
        return 0x3FFF  # every RAS block

    def amdsmi_get_gpu_bad_page_info(self, processor_handle: object) -> list[dict[str, Any]]:
        _, _, state = self._dev("amdsmi_get_gpu_bad_page_info", processor_handle)
        # AMD retires pages where NVIDIA remaps rows: the row-remap scenario shows up here.
        pages = state.counters.remapped_uncorrectable + state.counters.remapped_correctable
        return [{"value": i, "page_address": 0x3_F000_0000 + 4096 * i, "page_size": 4096, "status": 0}
                for i in range(pages)]  # fmt: skip

    def amdsmi_get_pcie_info(self, processor_handle: object) -> dict[str, Any]:
        _, spec, state = self._dev("amdsmi_get_pcie_info", processor_handle)
        c = state.counters
        return {
            "pcie_static": {"max_pcie_width": spec.pcie_max_width,
                            "max_pcie_speed": _PCIE_MTS[spec.pcie_max_generation],
                            "pcie_interface_version": spec.pcie_max_generation, "slot_type": "OAM"},
            "pcie_metric": {"pcie_width": state.pcie_width, "pcie_speed": _PCIE_MTS.get(state.pcie_generation, 0),
                            "pcie_bandwidth": _NA, "pcie_replay_count": c.pcie_replays,
                            "pcie_l0_to_recovery_count": c.pcie_l0_recoveries, "pcie_replay_roll_over_count": 0,
                            "pcie_nak_sent_count": 0, "pcie_nak_received_count": 0,
                            "pcie_lc_perf_other_end_recovery_count": _NA},
        }  # fmt: skip

    def amdsmi_get_gpu_xgmi_link_status(self, processor_handle: object) -> dict[str, Any]:
        _, spec, state = self._dev("amdsmi_get_gpu_xgmi_link_status", processor_handle)
        if not spec.nvlink_links:
            check_res(t.STATUS["AMDSMI_STATUS_NOT_SUPPORTED"])
        return {"status": ["U" if up else "D" for up in state.nvlink_up], "total_links": spec.nvlink_links}

    def amdsmi_get_gpu_process_list(self, processor_handle: object) -> list[dict[str, Any]]:
        gpu, _, state = self._dev("amdsmi_get_gpu_process_list", processor_handle)
        if gpu.partition != 0:
            return []
        return [{"name": "python3", "pid": p.pid, "mem": p.used_memory_bytes,
                 "engine_usage": {"gfx": 0, "enc": 0},
                 "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": p.used_memory_bytes},
                 "cu_occupancy": _NA} for p in state.processes]  # fmt: skip

    def amdsmi_get_gpu_compute_partition(self, processor_handle: object) -> str:
        self._dev("amdsmi_get_gpu_compute_partition", processor_handle)
        return self.partition

    def amdsmi_get_gpu_memory_partition(self, processor_handle: object) -> str:
        self._dev("amdsmi_get_gpu_memory_partition", processor_handle)
        return "NPS4" if self.partition == "CPX" else "NPS1"

    # --- events -----------------------------------------------------------------------------------------------
    def _handle_of(self, socket: int) -> ctypes.c_void_p:
        return self._handle(socket * _PARTITIONS[self.partition])

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"module 'amdsmi' has no attribute {name!r}")


class AmdSmiEventReader:
    """``amdsmi.AmdSmiEventReader`` over the simulated node: GPU_PRE_RESET / POST_RESET for the node's resets."""

    def __init__(self, processor_handle: object, event_types: Iterable[object]) -> None:
        lib: SimulatedAmdSmi | None = getattr(type(self), "_owner", None)
        if lib is None:  # pragma: no cover - only through SimulatedAmdSmi.AmdSmiEventReader
            raise RuntimeError("use the event reader of a SimulatedAmdSmi instance")
        if not isinstance(processor_handle, ctypes.c_void_p):
            raise AmdSmiParameterException(processor_handle, t.amdsmi_wrapper.amdsmi_processor_handle)
        if not isinstance(event_types, Iterable):
            raise AmdSmiParameterException(event_types, Iterable)
        types = list(event_types)
        for event_type in types:
            if not isinstance(event_type, AmdSmiEvtNotificationType):
                raise AmdSmiParameterException(event_type, AmdSmiEvtNotificationType)
        gpu = lib._enter("amdsmi_init_gpu_event_notification", processor_handle)
        assert gpu is not None
        self._lib = lib
        self.processor_handle = processor_handle
        node = lib._node
        with lib._lock:
            if gpu.partition == 0 and gpu.index not in lib._registered:
                # What happened before the GPU was registered is never delivered.
                lib._delivered.update(e.seq for e in node.events_until(node.elapsed()) if e.gpu == gpu.index)
                lib._registered[gpu.index] = {e for e in types if isinstance(e, AmdSmiEvtNotificationType)}
        self._gpu = gpu

    def read(self, timestamp: int, num_elem: int = 10) -> list[dict[str, Any]]:
        """Block up to ``timestamp`` ms (real time) for events of every registered GPU (the library keeps one
        queue, whichever reader reads it); NO_DATA when none arrived."""
        lib, node = self._lib, self._lib._node
        lib._enter("amdsmi_get_gpu_event_notification", device=False)
        deadline = time.monotonic() + max(0, timestamp) / 1000.0
        while True:
            found: list[dict[str, Any]] = []
            with lib._lock:
                for event in node.events_until(node.elapsed()):
                    types = lib._registered.get(event.gpu, set())
                    if event.seq in lib._delivered or event.kind != "reset" or not types:
                        continue
                    lib._delivered.add(event.seq)
                    for kind in (AmdSmiEvtNotificationType.GPU_PRE_RESET, AmdSmiEvtNotificationType.GPU_POST_RESET):
                        if kind in types and len(found) < num_elem:
                            found.append({"processor_handle": lib._handle_of(event.gpu), "event": kind.name,
                                          "message": f"reset seq={event.seq}"})  # fmt: skip
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                check_res(t.STATUS["AMDSMI_STATUS_NO_DATA"])
            node.wait_for_change(min(left, 0.1 if node.clock_is_real else 0.005))

    def stop(self) -> None:
        with self._lib._lock:
            self._lib._registered.pop(self._gpu.index, None)

    def __enter__(self) -> AmdSmiEventReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_READER_IDS = itertools.count()


def import_simulated_amdsmi(
    node: SimulatedNode, *, shape: Shape = "7.0", partition: str = "SPX", latency_scale: float = 0.0
) -> SimulatedAmdSmi:
    """``import amdsmi`` on the simulated node: KeyError('libamd_smi.so') when the library is missing, as the
    real import raises; otherwise a module object whose event reader reads this node."""
    if node.library_missing or node.vendor != "amd":
        print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")
        raise KeyError("libamd_smi.so")
    lib = SimulatedAmdSmi(node, shape=shape, partition=partition, latency_scale=latency_scale)
    # A reader class per library instance (it lives and dies with it), as the real module's reader reads its library.
    reader = type(
        f"AmdSmiEventReader_{next(_READER_IDS)}", (AmdSmiEventReader,), {"__module__": __name__, "_owner": lib}
    )
    reader.__name__ = reader.__qualname__ = "AmdSmiEventReader"
    lib.AmdSmiEventReader = reader  # type: ignore[attr-defined]
    return lib


def _residency(state: GpuState) -> tuple[int, dict[str, int], dict[str, bool]]:
    """gpu_metrics residency counters (ticks of the accumulation counter) from the node's throttle time.

    The node keeps time per schema reason; AMD counts PPT (power cap), PROCHOT (external slowdown, which the
    node's power brake asserts), socket thermal (the node's software and hardware thermal slowdown: MI300X has one
    socket thermal limit), HBM thermal and VR thermal.
    """
    s, active = state.throttle_seconds, state.throttle_active
    seconds = {
        "ppt_pwr": s["sw_power_cap"],
        "prochot_thrm": s["hw_slowdown"],
        "socket_thrm": s["sw_thermal"],  # the node raises sw_thermal whenever it raises hw_thermal
        "hbm_thrm": 0.0,
        "vr_thrm": 0.0,
    }
    on = {
        "ppt_pwr": "sw_power_cap" in active,
        "prochot_thrm": "hw_slowdown" in active,
        "socket_thrm": bool({"sw_thermal", "hw_thermal"} & active),
        "hbm_thrm": False,
        "vr_thrm": False,
    }
    base = 5_000_000  # ticks since the driver loaded, before the node started
    return base + int(state.elapsed * _ACC_HZ), {k: int(v * _ACC_HZ) for k, v in seconds.items()}, on


_METRICS_KEYS = [
    "temperature_edge",
    "temperature_hotspot",
    "temperature_mem",
    "temperature_vrgfx",
    "temperature_vrsoc",
    "temperature_vrmem",
    "average_gfx_activity",
    "average_umc_activity",
    "average_mm_activity",
    "average_socket_power",
    "energy_accumulator",
    "system_clock_counter",
    "average_gfxclk_frequency",
    "average_socclk_frequency",
    "average_uclk_frequency",
    "average_vclk0_frequency",
    "average_dclk0_frequency",
    "average_vclk1_frequency",
    "average_dclk1_frequency",
    "current_gfxclk",
    "current_socclk",
    "current_uclk",
    "current_vclk0",
    "current_dclk0",
    "current_vclk1",
    "current_dclk1",
    "throttle_status",
    "current_fan_speed",
    "pcie_link_width",
    "pcie_link_speed",
    "gfx_activity_acc",
    "mem_activity_acc",
    "temperature_hbm",
    "firmware_timestamp",
    "voltage_soc",
    "voltage_gfx",
    "voltage_mem",
    "indep_throttle_status",
    "current_socket_power",
    "vcn_activity",
    "gfxclk_lock_status",
    "xgmi_link_width",
    "xgmi_link_speed",
    "pcie_bandwidth_acc",
    "pcie_bandwidth_inst",
    "pcie_l0_to_recov_count_acc",
    "pcie_replay_count_acc",
    "pcie_replay_rover_count_acc",
    "xgmi_read_data_acc",
    "xgmi_write_data_acc",
    "current_gfxclks",
    "current_socclks",
    "current_vclk0s",
    "current_dclk0s",
    "jpeg_activity",
    "pcie_nak_sent_count_acc",
    "pcie_nak_rcvd_count_acc",
    "accumulation_counter",
    "prochot_residency_acc",
    "ppt_residency_acc",
    "socket_thm_residency_acc",
    "vr_thm_residency_acc",
    "hbm_thm_residency_acc",
    "num_partition",
    "pcie_lc_perf_other_end_recovery",
    "vram_max_bandwidth",
    "xgmi_link_status",
]
METRICS_KEYS: tuple[str, ...] = tuple(_METRICS_KEYS)

# The public functions of the module, for the conformance test (signatures as the shape exposes them).
PUBLIC_FUNCTIONS: tuple[str, ...] = tuple(
    name for name, _ in inspect.getmembers(SimulatedAmdSmi, inspect.isfunction) if name.startswith("amdsmi_")
)
_ = AmdSmiComputePartitionType, AmdSmiLibraryException  # re-exported names the backend reads off the module
