"""The AMD SMI backend: the only module of gpuwatch that speaks AMD SMI.

It takes the ``amdsmi`` module as a parameter (the simulation passes AMD's own package over a simulated
libamd_smi.so), so the code that runs on a customer's MI300X is the code the tests run. Every library call passes
through one choke point, ``AmdSmiBackend._invoke``, which turns "this device cannot give that" (NOT_SUPPORTED,
remembered per GPU) into ``None`` and real trouble into exceptions: the library failing (``BackendUnavailable``; the
agent reopens it) and one GPU failing (its reading has no sample while the other GPUs keep being read). amdsmi's own
Python failing on an answer (bytes it cannot decode) costs that value only. Every dict value is type-checked: AMD
SMI answers ``"N/A"`` strings where a value is unavailable.

Tiers as for NVML: static (identity, temperature limits, max clocks, PCIe maxima, partition; at open and after a
driver change), slow (power caps, ECC, bad pages, PCIe link and counters, XGMI, partition mode, the token
ROCR_VISIBLE_DEVICES selects the GPU by) and fast (every poll: temperatures, clocks, power, energy, activity, VRAM,
processes, and one ``gpu_metrics`` read for the throttle residency counters). ``amdsmi_get_violation_status``
sleeps ~100 ms per call, so it is read only in the slow tier and only where ``gpu_metrics`` lacks the residency
counters.

Throttle mapping (spec/metrics.md, "Throttling"): AMD counts, per cause, how many ticks of the accumulation
counter the clocks were held down. The agent turns each poll's share (Δresidency / Δaccumulation_counter) into
seconds (share × the time between polls) and keeps them as the device's own cumulative counter:

    PPT (package power tracking)      ppt_residency_acc          -> sw_power_cap
    PROCHOT (external slowdown)       prochot_residency_acc      -> hw_slowdown
    socket thermal                    socket_thm_residency_acc   -> sw_thermal
    HBM thermal                       hbm_thm_residency_acc      -> sw_thermal
    VR (voltage regulator) thermal    vr_thm_residency_acc       -> sw_thermal
    (no power-brake signal on AMD: hw_power_brake is never reported)

The thermal residencies are the firmware keeping the socket, its HBM and its voltage regulators at their own
temperature limits (amdsmi.h calls socket thermal "TVIOL", a violation % of the time): NVIDIA's software thermal
slowdown. NVIDIA's hw_thermal is something else, the hardware cutting the clocks by half or more past its slowdown
temperature; AMD SMI has no such signal, so hw_thermal is never reported (an AMD GPU past its slowdown limit shows
as a hotspot temperature at or above ``threshold="slowdown"``). The three causes overlap in time, so sw_thermal takes
the largest of their shares, never their sum. A reason is ``throttle_active`` only when it held the clocks at least
ACTIVE_SHARE of the time since the last poll (see there); its seconds count every tick.

Compute partitions (MI300X CPX / NPS modes) show one processor handle per partition, each repeating the socket's
power, energy, temperatures, limits, ECC, PCIe and XGMI readings; only partition 0 of a socket exports those, so
nothing is counted twice. Resets are reported by the event reader (GPU_PRE_RESET) for partition 0 likewise, and
partition 0 says how many partitions its GPU has (``compute_partitions``: the processors at its PCI device, where the
kernel puts the partition in the function bits). The exporter counts a GPU once in gpuwatch_gpus_detected.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, NoReturn

from gpuwatch.backends.amdsmi_activity import NO_SM_ACTIVITY, read_xgmi_traffic
from gpuwatch.backends.amdsmi_tables import (
    _LIBRARY_PROBLEMS,
    _NO_DATA,
    _PERMANENT,
    _RESIDENCY,
    _UNAVAILABLE,
    _celsius,
    _code,
    _generation,
    _Gpu,
    _handle_key,
    _hex,
    _number,
    _one_line,
    _package_version,
    _pci_device,
    _Residency,
    _text,
    update_residency,
)
from gpuwatch.backends.amdsmi_tables import load_amdsmi as load_amdsmi  # the backend's loader, re-exported
from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.tiered import GpuFailed as _GpuFailed
from gpuwatch.backends.tiered import TieredBackend
from gpuwatch.backends.tiered import Unavailable as _Unavailable
from gpuwatch.core.model import GpuEvent, GpuIdentity, GpuSample, UnusableGpu, Vendor

log = logging.getLogger(__name__)


class AmdSmiBackend(TieredBackend[_Gpu]):
    """AMD GPUs through AMD SMI; see the module docstring for tiers, throttle mapping and partitions.

    ``index_offset`` numbers the GPUs after the NVIDIA ones on a node with both vendors (spec/metrics.md); a
    callable is asked at every open, when the NVIDIA count is known.
    """

    name: str = "amdsmi"
    vendor: Vendor = "amd"
    label = "AMD SMI"
    gpu_label = "AMD GPU"
    log = log

    def __init__(
        self,
        lib: Any,
        *,
        index_offset: int | Callable[[], int] = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(lib, clock)
        self._index_offset = index_offset
        self._library_error: type[BaseException] = getattr(lib, "AmdSmiLibraryException", RuntimeError)
        self._any_error: type[BaseException] = getattr(lib, "AmdSmiException", RuntimeError)
        self._readers: list[Any] = []  # shared with the event thread under self._events_lock

    # ----- the choke point -----

    def _invoke(self, gpu: _Gpu | None, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Every AMD SMI call of the backend passes here."""
        if gpu is not None:  # the poll's reads (stuck_read), not another thread's library-wide calls
            self.calling = name
        key = (name, *args)
        if gpu is not None and key in gpu.unsupported:
            raise _Unavailable(f"{name}: not supported (remembered)")
        function = getattr(self._lib, name, None)
        if function is None:
            raise _Unavailable(f"{name}: not in this amdsmi version")
        try:
            return function(*((gpu.handle,) if gpu is not None else ()), *args, **kwargs)
        except self._library_error as exc:
            self._raise_for(gpu, name, key, _code(exc), exc)
        except self._any_error as exc:  # parameter / key exceptions: this call cannot work with this version
            if gpu is not None:
                gpu.unsupported.add(key)
            raise _Unavailable(f"{name}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # amdsmi's Python choking on what the library gave (bytes that are not UTF-8,
            # a serial that is not hex, an enum value it does not know): that value is unavailable on this GPU
            if gpu is not None:
                gpu.unsupported.add(key)
            raise _Unavailable(f"{name}: amdsmi failed on the library's answer: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _raise_for(gpu: _Gpu | None, name: str, key: Hashable, code: int, exc: BaseException) -> NoReturn:
        """Sort an AMD SMI status into library failure, GPU failure, or a value that is not available."""
        if code in _LIBRARY_PROBLEMS:
            raise BackendUnavailable(f"AMD SMI: {_LIBRARY_PROBLEMS[code]} ({name}: status {code})")
        if code in _UNAVAILABLE:
            if gpu is not None and code in _PERMANENT:
                gpu.unsupported.add(key)
            raise _Unavailable(f"{name}: status {code}")
        if gpu is None:
            raise _Unavailable(f"{name}: status {code}: {_one_line(exc)}")
        raise _GpuFailed(f"the GPU does not answer ({name}: {_one_line(exc)})")

    def _dict(self, gpu: _Gpu, name: str, *args: Any) -> dict[str, Any]:
        value = self._call(gpu, name, *args)
        return value if isinstance(value, dict) else {}

    # ----- Backend protocol -----

    def open(self) -> None:
        """amdsmi_init for GPUs, enumerate processors, read their static tier and start the reset event readers."""
        if self._open:
            return
        init_flags = getattr(self._lib, "AmdSmiInitFlags", None)
        if init_flags is None:
            raise BackendUnavailable("the amdsmi module has no AmdSmiInitFlags: install the amdsmi package of ROCm")
        try:
            self._invoke(None, "amdsmi_init", (init_flags.INIT_AMD_GPUS,), {})
        except _Unavailable as exc:
            raise BackendUnavailable(f"AMD SMI cannot be initialised: {exc}") from exc
        self._open = True
        try:
            handles = self._call(None, "amdsmi_get_processor_handles")
            if handles is None:
                raise BackendUnavailable("AMD SMI lists no processors (amdsmi_get_processor_handles failed)")
            offset = self._index_offset() if callable(self._index_offset) else self._index_offset
            self._gpus = [gpu for i, h in enumerate(handles) if (gpu := self._enumerate(i + offset, h)) is not None]
            devices = Counter(_pci_device(gpu) for gpu in self._gpus)
            for gpu in self._gpus:
                gpu.partitions = devices[_pci_device(gpu)]
            self._open_events()
        except BackendUnavailable:
            self.close()
            raise

    def close(self) -> None:
        """Stop the event readers and shut AMD SMI down; safe when not open."""
        with self._events_lock:
            for reader in self._readers:
                with contextlib.suppress(Exception):
                    reader.stop()
            self._readers = []
            self._uuid_by_handle = {}
        if self._open:
            with contextlib.suppress(Exception):
                self._lib.amdsmi_shut_down()
        self._open = False
        self._gpus = []

    def unusable(self) -> list[UnusableGpu]:
        """AMD SMI opens every GPU it counts: none."""
        return []

    def reset_uuids(self) -> list[str]:
        """GPUs whose resets this backend reports (partition 0 of each socket): their counters exist from 0."""
        return [gpu.identity.uuid for gpu in self._gpus if gpu.primary]

    def versions(self) -> dict[str, str]:
        """The amdsmi package, the host's libamd_smi, ROCm and the amdgpu driver, for ``version`` and ``check``."""
        found: dict[str, str] = {"amdsmi": _package_version(self._lib)}
        lib_version = self._call(None, "amdsmi_get_lib_version")
        if isinstance(lib_version, dict):
            found["amd_smi_lib"] = ".".join(str(lib_version.get(k, "")) for k in ("major", "minor", "release"))
        rocm = self._call(None, "amdsmi_get_rocm_version")
        if isinstance(rocm, tuple) and len(rocm) == 2 and rocm[0]:
            found["rocm"] = str(rocm[1])
        found["amdgpu_driver"] = self._driver
        return {key: value for key, value in found.items() if value}

    def version_problem(self) -> str | None:
        """The amdsmi package must come from the host's ROCm release (major.minor), or calls fail or mis-read."""
        versions = self.versions()
        package, rocm = versions.get("amdsmi", ""), versions.get("rocm", "")
        if package and rocm and package.split(".")[:2] != rocm.split(".")[:2]:
            return (
                f"the amdsmi Python package is {package} but the host's ROCm is {rocm}: "
                f"pip install 'amdsmi=={'.'.join(rocm.split('.')[:2])}.*'"
            )
        return None

    # ----- open -----

    def _enumerate(self, index: int, handle: Any) -> _Gpu | None:
        gpu = _Gpu(handle, GpuIdentity(uuid="", vendor="amd", index=index))
        return self._first_read(gpu, index, keep_failed=False)

    def _open_events(self) -> None:
        """One reader per socket for GPU_PRE_RESET; the library delivers every registered GPU's events to any."""
        kinds = getattr(self._lib, "AmdSmiEvtNotificationType", None)
        reader_class = getattr(self._lib, "AmdSmiEventReader", None)
        if kinds is None or reader_class is None:
            return
        readers, uuids = [], {}
        for gpu in self._gpus:
            if not gpu.primary:
                continue
            try:
                readers.append(reader_class(gpu.handle, [kinds.GPU_PRE_RESET]))
                uuids[_handle_key(gpu.handle)] = gpu.identity.uuid
            except Exception as exc:  # a reader is a bonus: resets also show as a GPU that stopped answering
                log.warning("GPU %s: reset events not available: %s", gpu.identity.uuid, _one_line(exc))
        with self._events_lock:
            self._readers, self._uuid_by_handle = readers, uuids

    def _events_ready(self) -> bool:
        return bool(self._readers)

    def _wait_locked(self, timeout_s: float) -> list[GpuEvent] | None:
        try:
            found = self._readers[0].read(max(0, int(timeout_s * 1000)))
        except self._library_error as exc:
            if _code(exc) == _NO_DATA:  # nothing before the timeout
                return []
            log.debug("event read: %s", _one_line(exc))
            return None
        except Exception as exc:
            log.debug("event read: %s", _one_line(exc))
            return None
        events = []
        for event in found if isinstance(found, list) else []:
            uuid = self._uuid_by_handle.get(_handle_key(event.get("processor_handle")))
            if uuid and event.get("event") == "GPU_PRE_RESET":
                events.append(GpuEvent(uuid, "reset", timestamp=self._clock(), source="amdsmi"))
        return events

    # ----- polling -----

    def _check_driver(self) -> None:
        """A new amdgpu driver means new capabilities: re-read every GPU's static tier."""
        driver = ""
        for gpu in self._gpus:  # the first GPU that answers: a lost GPU 0 must not stop the others' polls
            try:
                driver = _text(self._dict(gpu, "amdsmi_get_gpu_driver_info").get("driver_version"))
            except _GpuFailed:
                continue
            break
        if driver and driver != self._driver:
            if self._driver:
                log.info("amdgpu driver changed from %s to %s: re-reading static readings", self._driver, driver)
            self._driver = driver
            for gpu in self._gpus:
                gpu.needs_static = True

    def _forget(self, gpu: _Gpu) -> None:
        gpu.residency = _Residency()

    def _begin(self, gpu: _Gpu, slow: bool) -> float:
        return self._clock()

    def _stamp(self, tick: float) -> float:
        return tick

    # ----- static tier -----

    def _read_case_identity_keys(self) -> tuple[str, ...]:
        return ("board_part_number", "vbios_part_number", "inforom_image_version")

    def _read_case_identity(self, gpu: _Gpu) -> dict[str, str | None]:
        """amdsmi_get_gpu_board_info's model_number (the board part number) and amdsmi_get_gpu_vbios_info's
        part_number; an AMD GPU has no InfoROM (None: not available)."""
        board = self._dict(gpu, "amdsmi_get_gpu_board_info")
        vbios = self._dict(gpu, "amdsmi_get_gpu_vbios_info")
        return {
            "board_part_number": _text(board.get("model_number")) or None,
            "vbios_part_number": _text(vbios.get("part_number")) or None,
            "inforom_image_version": None,
        }

    def _read_static(self, gpu: _Gpu) -> None:
        """Identity, the limits the device declares, maxima; forgets remembered NotSupported."""
        gpu.unsupported.clear()
        lib = self._lib
        asic = self._dict(gpu, "amdsmi_get_gpu_asic_info")
        board = self._dict(gpu, "amdsmi_get_gpu_board_info")
        driver = _text(self._dict(gpu, "amdsmi_get_gpu_driver_info").get("driver_version"))
        self._driver = self._driver or driver
        bdf = _text(self._call(gpu, "amdsmi_get_gpu_device_bdf"))
        gpu.identity = replace(
            gpu.identity,
            uuid=_text(self._call(gpu, "amdsmi_get_gpu_device_uuid")) or gpu.identity.uuid,
            model=_text(asic.get("market_name")) or _text(board.get("product_name")),
            serial=_text(board.get("product_serial")) or _text(asic.get("asic_serial")),
            pci_bus_id=bdf,
            driver_version=driver,
            vbios_version=_text(self._dict(gpu, "amdsmi_get_gpu_vbios_info").get("version")),
        )
        kfd_info = self._dict(gpu, "amdsmi_get_gpu_kfd_info")
        kfd = _number(kfd_info.get("current_partition_id"))
        gpu.primary = int(kfd) == 0 if kfd is not None else not bdf or bdf.endswith(".0")
        node = _number(kfd_info.get("node_id"))
        gpu.kfd_node = int(node) if node is not None else None
        gpu.unique_id = _hex(asic.get("asic_serial"))
        static = GpuSample(gpu.identity.uuid, 0.0)
        temp_type, metric = lib.AmdSmiTemperatureType, lib.AmdSmiTemperatureMetric
        if gpu.primary:
            for key, sensor, limit in (
                (("core", "slowdown"), temp_type.HOTSPOT, metric.CRITICAL),
                (("core", "shutdown"), temp_type.HOTSPOT, metric.EMERGENCY),
                (("memory", "max_operating"), temp_type.VRAM, metric.CRITICAL),
            ):
                if (celsius := _celsius(self._call(gpu, "amdsmi_get_temp_metric", sensor, limit))) is not None:
                    static.temperature_threshold_celsius[key] = celsius
            edge_limit = self._call(gpu, "amdsmi_get_temp_metric", temp_type.EDGE, metric.CRITICAL)
            gpu.edge_limit_zero = _number(edge_limit) == 0
            pcie = self._dict(gpu, "amdsmi_get_pcie_info").get("pcie_static")
            if isinstance(pcie, dict):
                if (width := _number(pcie.get("max_pcie_width"))) is not None:
                    static.pcie_link_width["max"] = int(width)
                generation = _number(pcie.get("pcie_interface_version")) or _generation(pcie.get("max_pcie_speed"))
                if generation:
                    static.pcie_link_generation["max"] = int(generation)
            links = self._dict(gpu, "amdsmi_get_gpu_xgmi_link_status").get("status")
            gpu.xgmi_links = len(links) if isinstance(links, list) else 0
        for clocks, clock_type in ((("sm", "graphics"), lib.AmdSmiClkType.GFX), (("memory",), lib.AmdSmiClkType.MEM)):
            if (mhz := _number(self._dict(gpu, "amdsmi_get_clock_info", clock_type).get("max_clk"))) is not None:
                for clock in clocks:
                    static.clock_max_hertz[clock] = mhz * 1e6
        gpu.static = static
        gpu.needs_static, gpu.needs_slow = False, True

    # ----- slow tier -----

    def _read_slow(self, gpu: _Gpu, sample: GpuSample, now: float) -> None:
        sample.runtime_device = self._rocr_device(gpu)
        partition = _text(self._call(gpu, "amdsmi_get_gpu_compute_partition"))
        if partition:
            sample.mig_enabled = partition.upper() not in ("SPX", "N/A")
        if not gpu.primary:
            return
        sample.compute_partitions = gpu.partitions
        self._read_power_caps(gpu, sample)
        self._read_memory_health(gpu, sample)
        self._read_pcie(gpu, sample)
        self._read_xgmi(gpu, sample)
        if not gpu.residency.from_metrics:
            self._read_violation_status(gpu, now)

    def activity_support(self) -> tuple[int, list[tuple[int, str]]]:
        """No AMD GPU has SM/tensor/DRAM activity (amdsmi_activity.py says why)."""
        return 0, [(gpu.identity.index, NO_SM_ACTIVITY) for gpu in self._gpus]

    def _rocr_device(self, gpu: _Gpu) -> str | None:
        """What ROCR_VISIBLE_DEVICES selects this GPU by: ``GPU-<unique id>`` in 16 hex digits, where the unique id is
        the GPU's own (ROCR-Runtime amd_filter_device.cpp: a token matching two devices selects none, a unique id of
        0 never matches), else its index among the GPUs in KFD node order, the order ROCr enumerates them in. amdsmi's
        UUID is neither: ROCr matches it to no GPU."""
        if gpu.unique_id and sum(other.unique_id == gpu.unique_id for other in self._gpus) == 1:
            return f"GPU-{gpu.unique_id:016X}"
        if gpu.kfd_node is None:
            return None
        return str(sorted({other.kfd_node for other in self._gpus if other.kfd_node is not None}).index(gpu.kfd_node))

    def _read_power_caps(self, gpu: _Gpu, sample: GpuSample) -> None:
        """Power caps come in µW."""
        caps = self._dict(gpu, "amdsmi_get_power_cap_info")
        for limit, key in (("enforced", "power_cap"), ("default", "default_power_cap"), ("min", "min_power_cap"),
                           ("max", "max_power_cap")):  # fmt: skip
            if (microwatts := _number(caps.get(key))) is not None:
                sample.power_limit_watts[limit] = microwatts / 1e6

    def _read_memory_health(self, gpu: _Gpu, sample: GpuSample) -> None:
        enabled = _number(self._call(gpu, "amdsmi_get_gpu_ecc_enabled"))
        if enabled is not None:
            sample.ecc_enabled = enabled != 0
        counts = self._dict(gpu, "amdsmi_get_gpu_total_ecc_count")
        for kind, key in (("corrected", "correctable_count"), ("uncorrected", "uncorrectable_count"),
                          ("deferred", "deferred_count")):  # fmt: skip
            if (count := _number(counts.get(key))) is not None:
                sample.ecc_errors_total[kind] = int(count)
        pages = self._call(gpu, "amdsmi_get_gpu_bad_page_info")
        if isinstance(pages, list):
            sample.retired_pages = len(pages)
        if (limit := _number(self._call(gpu, "amdsmi_get_gpu_bad_page_threshold"))) is not None and limit > 0:
            sample.retired_pages_limit = int(limit)  # amdsmi 7.x; 0 would mean "not set", never a limit

    def _read_pcie(self, gpu: _Gpu, sample: GpuSample) -> None:
        metric = self._dict(gpu, "amdsmi_get_pcie_info").get("pcie_metric")
        if not isinstance(metric, dict):
            return
        if (width := _number(metric.get("pcie_width"))) is not None:
            sample.pcie_link_width["current"] = int(width)
        if (generation := _generation(metric.get("pcie_speed"))) is not None:
            sample.pcie_link_generation["current"] = generation
        if (replays := _number(metric.get("pcie_replay_count"))) is not None:
            sample.pcie_replays_total = int(replays)
        if (recoveries := _number(metric.get("pcie_l0_to_recovery_count"))) is not None:
            sample.pcie_link_recoveries_total = int(recoveries)

    def _read_xgmi(self, gpu: _Gpu, sample: GpuSample) -> None:
        """XGMI links by position: 'U' up, 'D' down; disabled ('X') and unknown links are not exported."""
        if not gpu.xgmi_links:
            return
        status = self._dict(gpu, "amdsmi_get_gpu_xgmi_link_status").get("status")
        for link, state in enumerate(status if isinstance(status, list) else []):
            if state in ("U", "D"):
                sample.nvlink_up[str(link)] = state == "U"

    def _read_violation_status(self, gpu: _Gpu, now: float) -> None:
        """Residency from violation status (sleeps ~100 ms): only where gpu_metrics has no residency counters."""
        status = self._dict(gpu, "amdsmi_get_violation_status")
        counters = {key: int(v) for _, key, _ in _RESIDENCY if (v := _number(status.get(key))) is not None}
        self._update_residency(gpu, _number(status.get("acc_counter")), counters, now, keys=1)

    # ----- fast tier -----

    def _read_fast(self, gpu: _Gpu, sample: GpuSample, now: float) -> None:
        lib = self._lib
        if gpu.primary:
            self._read_thermal_power(gpu, sample)
            self._read_throttle(gpu, sample, now)
        for clock, clock_type in (("graphics", lib.AmdSmiClkType.GFX), ("memory", lib.AmdSmiClkType.MEM)):
            info = self._dict(gpu, "amdsmi_get_clock_info", clock_type)
            mhz = _number(info.get("clk", info.get("cur_clk")))  # cur_clk in 6.0/6.1
            if mhz is not None:
                sample.clock_hertz[clock] = mhz * 1e6
                if clock == "graphics":
                    sample.clock_hertz["sm"] = mhz * 1e6
        activity = self._dict(gpu, "amdsmi_get_gpu_activity")
        if (gfx := _number(activity.get("gfx_activity"))) is not None:
            sample.utilization_ratio = gfx / 100
        if (umc := _number(activity.get("umc_activity"))) is not None:
            sample.memory_utilization_ratio = umc / 100
        vram = self._dict(gpu, "amdsmi_get_gpu_vram_usage")
        total, used = _number(vram.get("vram_total")), _number(vram.get("vram_used"))
        if total is not None and used is not None:  # MiB
            sample.memory_total_bytes, sample.memory_used_bytes = int(total) * 2**20, int(used) * 2**20
        processes = self._call(gpu, "amdsmi_get_gpu_process_list")
        if isinstance(processes, list):
            sample.process_pids = tuple(int(p["pid"]) for p in processes if isinstance(p, dict) and "pid" in p)
            sample.process_memory_bytes = {}  # amdsmi.h amdsmi_proc_info_t: memory_usage.vram_mem, in bytes
            for p in processes:
                usage = p.get("memory_usage") if isinstance(p, dict) and "pid" in p else None
                if isinstance(usage, dict) and (bytes_ := _number(usage.get("vram_mem"))) is not None:
                    sample.process_memory_bytes[int(p["pid"])] = int(bytes_)

    def _read_thermal_power(self, gpu: _Gpu, sample: GpuSample) -> None:
        temp_type, current = self._lib.AmdSmiTemperatureType, self._lib.AmdSmiTemperatureMetric.CURRENT
        for sensor, kind in (("core", temp_type.HOTSPOT), ("edge", temp_type.EDGE), ("memory", temp_type.VRAM)):
            if sensor == "edge" and gpu.edge_limit_zero:
                continue
            if (celsius := _celsius(self._call(gpu, "amdsmi_get_temp_metric", kind, current))) is not None:
                sample.temperature_celsius[sensor] = celsius
        power = self._dict(gpu, "amdsmi_get_power_info")
        for key in ("socket_power", "current_socket_power", "average_socket_power"):  # 7.0, MI300+, older
            if (watts := _number(power.get(key))) is not None:
                sample.power_watts = watts
                break
        energy = self._dict(gpu, "amdsmi_get_energy_count")
        counts = _number(energy.get("energy_accumulator", energy.get("power")))  # "power" before 6.3
        resolution = _number(energy.get("counter_resolution"))
        if counts is not None and resolution is not None:
            sample.energy_joules = counts * resolution / 1e6  # µJ

    def _read_throttle(self, gpu: _Gpu, sample: GpuSample, now: float) -> None:
        residency = gpu.residency
        if residency.from_metrics:
            metrics = self._dict(gpu, "amdsmi_get_gpu_metrics_info")
            read_xgmi_traffic(metrics, sample)  # amdsmi_activity.py
            counters = {key: int(v) for key, _, _ in _RESIDENCY if (v := _number(metrics.get(key))) is not None}
            accumulation = _number(metrics.get("accumulation_counter"))
            if counters and accumulation is not None:
                self._update_residency(gpu, accumulation, counters, now, keys=0)
            elif residency.accumulation is None:  # no residency here: violation status, in the slow tier
                residency.from_metrics = False
                gpu.needs_slow = True
        if residency.accumulation is not None:
            sample.throttle_active = dict(residency.active)
            sample.throttle_counter_seconds = dict(residency.seconds)

    _update_residency = staticmethod(update_residency)  # amdsmi_tables: share of time held -> seconds
