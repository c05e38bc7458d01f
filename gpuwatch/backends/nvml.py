"""The NVML backend: the only module of gpuwatch that speaks NVML.

It takes the ``pynvml`` module (or the simulated stand-in) as a parameter, so the code that runs on a
customer's H100 is the code the tests run. Every NVML call passes through one choke point,
``NvmlBackend._invoke``, which turns "this device cannot give that" into ``None`` and the two kinds of real
trouble into exceptions: the library failing (``BackendUnavailable``, the agent reopens it) and one GPU
failing (its reading has no sample while the other GPUs keep being read).

Readings come in tiers (design.md): static (identity, thresholds, max clocks, what the device supports; at
open and after a driver change), slow (limits, memory health, PCIe, NVLink, modes; kept and merged into every
sample) and fast (every poll, about 14 calls per GPU on an H100).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, NoReturn

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.nvml_gpm_mig import NvmlMigGpmTier
from gpuwatch.backends.nvml_slow import _Gpu
from gpuwatch.backends.nvml_tables import (
    _CLOCKS,
    _CORRUPTED_INFOROM,
    _FI_PCIE_ERRORS,
    _FI_PERF_POLICY_THERMAL,
    _FUNCTION_NOT_FOUND,
    _GPU_FAILURES,
    _INSUFFICIENT_POWER,
    _LIBRARY_PROBLEMS,
    _OPEN_HINTS,
    _PERMANENT,
    _REASON_BITS,
    _THRESHOLDS,
    _UNKNOWN_ERROR,
    _call_key,
    _constant,
    _field_value,
    _FieldIds,
    _handle_key,
    _plain_attr,
    _text,
)
from gpuwatch.backends.tiered import GpuFailed as _GpuFailed
from gpuwatch.backends.tiered import Unavailable as _Unavailable
from gpuwatch.core.model import GpuEvent, GpuIdentity, GpuSample, UnusableGpu, Vendor

log = logging.getLogger(__name__)

_Candidate = tuple[tuple[str, tuple[Any, ...]], Callable[..., Any]]  # ((name, keyword arguments), the function)


def load_pynvml() -> Any:
    """Import the real NVML binding; the backend itself takes the module as a parameter."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendUnavailable("nvidia-ml-py is not installed: pip install 'gpuwatch-agent[nvidia]'") from exc


class NvmlBackend(NvmlMigGpmTier):
    """NVIDIA GPUs through NVML; see the module docstring for the tiers and the choke point."""

    name: str = "nvml"
    vendor: Vendor = "nvidia"
    label = "NVML"
    gpu_label = "NVML GPU"
    log = log

    def __init__(self, lib: Any, *, index_offset: int = 0, clock: Callable[[], float] = time.time) -> None:
        super().__init__(lib, clock)
        self._index_offset = index_offset
        self._mismatch_error: Any = getattr(lib, "NVMLLibraryMismatchError", ())
        self._missing: frozenset[Hashable] = frozenset()  # functions the library or driver lacks
        self._resolved: dict[tuple[Any, ...], tuple[_Candidate, ...]] = {}  # names -> what to call: _resolve()
        self._unusable: list[UnusableGpu] = []
        self._fields = _FieldIds("")
        self._reason_bits = tuple(
            (bit, reason)
            for suffix, reason in _REASON_BITS
            if (bit := _constant(lib, f"nvmlClocksEventReason{suffix}", f"nvmlClocksThrottleReason{suffix}"))
            is not None
        )
        self._event_set: Any = None  # shared with the event thread under self._events_lock
        self._thermal_policy = _constant(lib, "NVML_PERF_POLICY_THERMAL")  # the combined thermal violation policy

    # ----- the choke point -----

    def _invoke(
        self, gpu: _Gpu | None, names: str | tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Call the first of ``names`` the library and driver have; every NVML call of the backend passes
        here. A later name is tried only where the earlier function does not exist (FunctionNotFound,
        NVMLLibraryMismatchError)."""
        if gpu is not None:  # the poll's reads (stuck_read); the event thread's wait (no GPU) must not overwrite it
            self.calling = names if names.__class__ is str else names[0]
        frozen_kwargs = tuple(sorted(kwargs.items())) if kwargs else ()
        candidates = self._resolved.get((names, frozen_kwargs))
        if candidates is None:
            candidates = self._resolve(names, frozen_kwargs)
        for variant, function in candidates:
            # The key of a remembered NotSupported is built only for a function that has one on this GPU.
            if gpu is not None and variant in gpu.unsupported_calls and _call_key(variant, args) in gpu.unsupported:
                raise _Unavailable(f"{variant[0]}: not supported (remembered)")
            try:
                return function(*((gpu.handle,) if gpu is not None else ()), *args, **kwargs)
            except self._mismatch_error:
                self._lacks(variant)
            except self._lib.NVMLError as exc:
                code = int(getattr(exc, "value", _UNKNOWN_ERROR))
                if code == _FUNCTION_NOT_FOUND:
                    self._lacks(variant)
                    continue
                self._raise_for(gpu, variant[0], _call_key(variant, args), code, exc)
        raise _Unavailable(f"{names}: function not found", _FUNCTION_NOT_FOUND)

    def _resolve(self, names: str | tuple[str, ...], frozen_kwargs: tuple[Any, ...]) -> tuple[_Candidate, ...]:
        """The functions to try for `names`, in order: those the binding defines and neither it nor the driver has
        refused. Looked up once, not on every call (16 a GPU a poll), until one is refused or the driver changes."""
        candidates = tuple(
            (variant, function)
            for name in ((names,) if names.__class__ is str else names)
            if (variant := (name, frozen_kwargs)) not in self._missing
            and (function := getattr(self._lib, name, None)) is not None
        )
        self._resolved[(names, frozen_kwargs)] = candidates
        return candidates

    def _lacks(self, variant: tuple[str, tuple[Any, ...]]) -> None:
        """The library or the driver does not have this function: never try it again (until a driver change)."""
        self._missing = self._missing | {variant}
        self._resolved = {}

    def _forget_missing(self) -> None:
        self._missing = frozenset()
        self._resolved = {}

    @staticmethod
    def _raise_for(gpu: _Gpu | None, name: str, key: tuple[Hashable, ...], code: int, exc: Exception) -> NoReturn:
        """Sort an NVML error into library failure, GPU failure, or a value that is not available."""
        if code in _LIBRARY_PROBLEMS:
            raise BackendUnavailable(f"NVML: {_LIBRARY_PROBLEMS[code]} ({name}: {exc})")
        if gpu is not None and code in _GPU_FAILURES:
            raise _GpuFailed(f"{_GPU_FAILURES[code]} ({name}: {exc})")
        if gpu is not None and code in _PERMANENT:
            gpu.unsupported.add(key)
            gpu.unsupported_calls.add(key[0])
        raise _Unavailable(f"{name}: {exc}", code)

    def _require(self, names: str, *args: Any) -> Any:
        """A value the backend cannot open without; its absence makes the whole backend unavailable."""
        try:
            return self._invoke(None, names, args, {})
        except _Unavailable as exc:
            hint = _OPEN_HINTS.get(exc.code or 0, "")
            raise BackendUnavailable(f"NVML cannot be used: {exc}" + (f": {hint}" if hint else "")) from exc

    # ----- Backend protocol -----

    def open(self) -> None:
        """nvmlInit, enumerate GPUs, read their static tier and register for XID events."""
        if self._open:
            return
        self._require("nvmlInit")
        self._open = True
        self._forget_missing()
        try:
            self._driver = _text(self._call(None, "nvmlSystemGetDriverVersion"))
            self._fields = _FieldIds(self._driver)
            count = int(self._require("nvmlDeviceGetCount"))
            self._gpus = [gpu for index in range(count) if (gpu := self._enumerate(index)) is not None]
            self._open_events()
        except BaseException:  # every nvmlInit is paired with an nvmlShutdown, whatever went wrong after it
            self.close()
            raise

    def close(self) -> None:
        """Free the event set and the GPM samples and shut NVML down; safe when not open."""
        if self._open:
            self._close_gpm()
        with self._events_lock:
            if self._event_set is not None:
                self._quietly("nvmlEventSetFree", self._event_set)
            self._event_set = None
            self._uuid_by_handle = {}
        if self._open:
            self._quietly("nvmlShutdown")
        self._open = False
        self._gpus = []
        self._unusable = []

    def unusable(self) -> list[UnusableGpu]:
        """GPUs whose handle NVML refused with InsufficientPower at open."""
        return list(self._unusable)

    def reset_uuids(self) -> list[str]:
        """NVML reports no reset events: no reset counters."""
        return []

    def version_problem(self) -> str | None:
        """No pairing to check: the bindings load the driver's own libnvidia-ml (missing calls fall back)."""
        return None

    def versions(self) -> dict[str, str]:
        """NVML, driver, CUDA driver and binding versions, for ``gpuwatch version`` and ``check``."""
        found: dict[str, str] = {}
        if self._open:
            found["nvml"] = _text(self._call(None, "nvmlSystemGetNVMLVersion"))
            found["driver"] = _text(self._call(None, "nvmlSystemGetDriverVersion"))
            cuda = self._call(None, ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
            found["cuda_driver"] = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda is not None else ""
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found["nvidia-ml-py"] = importlib.metadata.version("nvidia-ml-py")
        return {key: value for key, value in found.items() if value}

    # ----- open / close -----

    def _enumerate(self, index: int) -> _Gpu | None:
        """Track GPU ``index``; one without a handle or UUID is skipped (the state dir knows it as lost)."""
        try:
            handle = self._invoke(None, "nvmlDeviceGetHandleByIndex", (index,), {})
        except _Unavailable as exc:
            if exc.code == _INSUFFICIENT_POWER:  # nvml.h: external power cables not properly attached
                log.error(
                    "NVML GPU %d: its external power cables are not properly attached (%s): the GPU is "
                    "unusable until they are reseated; check the PSU and cabling",
                    index,
                    exc,
                )
                self._unusable.append(UnusableGpu(index + self._index_offset, "insufficient_power"))
            else:
                log.warning("NVML GPU %d: no handle (%s; not visible to this process?); skipped", index, exc)
            return None
        gpu = _Gpu(handle, GpuIdentity(uuid="", vendor="nvidia", index=index + self._index_offset), nvml_index=index)
        return self._first_read(gpu, index, keep_failed=True)

    def _open_events(self) -> None:
        """Create the XID event set, registering only GPUs that support XID events."""
        xid = self._lib.nvmlEventTypeXidCriticalError
        targets = [gpu for gpu in self._gpus if gpu.event_types & xid]
        event_set = self._call(None, "nvmlEventSetCreate") if targets else None
        if event_set is None:
            return
        for gpu in targets:
            try:
                self._call(gpu, "nvmlDeviceRegisterEvents", xid, event_set)
            except _GpuFailed as exc:
                log.warning("GPU %s: XID events not registered: %s", gpu.identity.uuid, exc)
        with self._events_lock:
            self._event_set = event_set
            self._uuid_by_handle = {_handle_key(gpu.handle): gpu.identity.uuid for gpu in targets}

    def _quietly(self, name: str, *args: Any) -> None:
        """Release something at close; a library already gone has nothing left to release."""
        try:
            self._call(None, name, *args)
        except BackendUnavailable as exc:
            log.debug("%s at close: %s", name, exc)

    # ----- events -----

    def _events_ready(self) -> bool:
        return self._event_set is not None

    def _wait_locked(self, timeout_s: float) -> list[GpuEvent] | None:
        """One nvmlEventSetWait_v2; None when it timed out or failed."""
        try:
            timeout_ms = max(0, int(timeout_s * 1000))
            data = self._call(None, ("nvmlEventSetWait_v2", "nvmlEventSetWait"), self._event_set, timeout_ms)
        except BackendUnavailable as exc:  # the poll reports it and the agent reopens
            log.debug("event wait: %s", exc)
            return None
        if data is None:
            return None
        uuid = self._event_uuid(data.device)
        if not uuid or not data.eventType & self._lib.nvmlEventTypeXidCriticalError:
            return []
        return [GpuEvent(uuid, "xid", timestamp=self._clock(), code=int(data.eventData), source="nvml")]

    def _event_uuid(self, device: Any) -> str:
        """The UUID of an event's device: by its handle's address, which still works on a lost GPU, else by
        asking NVML (a stand-in's handle objects have no address)."""
        uuid = self._uuid_by_handle.get(_handle_key(device))
        return uuid if uuid is not None else _text(self._call(None, "nvmlDeviceGetUUID", device))

    # ----- polling -----

    def _check_driver(self) -> None:
        """A new driver version means new capabilities: re-read every GPU's static tier."""
        driver = _text(self._call(None, "nvmlSystemGetDriverVersion"))
        if driver and driver != self._driver:
            log.info("NVIDIA driver changed from %s to %s: re-reading static readings", self._driver, driver)
            self._driver = driver
            self._fields = _FieldIds(driver)
            self._forget_missing()
            for gpu in self._gpus:
                gpu.needs_static = True

    def _begin(self, gpu: _Gpu, slow: bool) -> dict[int, float | None]:
        return self._read_fields(gpu, gpu.fast_fields + (gpu.slow_fields if slow else ()))

    def _read_fields(self, gpu: _Gpu, ids: tuple[int, ...]) -> dict[int, float | None]:
        """One batched nvmlDeviceGetFieldValues: id -> value, None where the driver did not fill it
        (timestamp 0); fields it does not support are left out."""
        if not ids:
            return {}
        answers = self._call(gpu, "nvmlDeviceGetFieldValues", list(ids))
        values: dict[int, float | None] = {}
        for field_id, answer in zip(ids, answers or (), strict=False):
            code = int(_plain_attr(answer, "nvmlReturn"))
            if code not in _PERMANENT:
                values[field_id] = _field_value(answer) if code == 0 else None
        return values

    # ----- static tier -----

    def _read_static(self, gpu: _Gpu) -> None:
        """Identity, limits the device declares and what it supports; forgets remembered NotSupported."""
        gpu.unsupported.clear()
        gpu.unsupported_calls.clear()
        gpu.identity = self._read_identity(gpu)
        static = GpuSample(gpu.identity.uuid, 0.0)
        lib = self._lib
        for key, threshold in _THRESHOLDS:
            if (celsius := self._call(gpu, "nvmlDeviceGetTemperatureThreshold", getattr(lib, threshold))) is not None:
                static.temperature_threshold_celsius[key] = float(celsius)
        for clock, clock_type in _CLOCKS:
            if (mhz := self._call(gpu, "nvmlDeviceGetMaxClockInfo", getattr(lib, clock_type))) is not None:
                static.clock_max_hertz[clock] = float(mhz) * 1e6
        gpu.supported_reasons = self._call(
            gpu, ("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons")
        )
        gpu.event_types = int(self._call(gpu, "nvmlDeviceGetSupportedEventTypes") or 0)
        gpu.fans = self._call(gpu, "nvmlDeviceGetNumFans")
        max_links = int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 0))
        gpu.nvlinks = tuple(
            link for link in range(max_links) if self._call(gpu, "nvmlDeviceGetNvLinkState", link) is not None
        )
        self._plan_fields(gpu)
        static.inforom_valid = self._inforom_valid(gpu)
        gpu.static = static
        gpu.needs_static, gpu.needs_slow = False, True

    def _inforom_valid(self, gpu: _Gpu) -> bool | None:
        """nvmlDeviceValidateInforom: success, or CorruptedInforom when a checksum fails (static tier: it checks
        the whole image)."""
        try:
            self._invoke(gpu, "nvmlDeviceValidateInforom", (), {})
        except _Unavailable as exc:
            return False if exc.code == _CORRUPTED_INFOROM else None
        return True

    def _read_identity(self, gpu: _Gpu) -> GpuIdentity:
        pci = self._call(gpu, "nvmlDeviceGetPciInfo")
        return replace(
            gpu.identity,
            uuid=_text(self._call(gpu, "nvmlDeviceGetUUID")) or gpu.identity.uuid,
            model=_text(self._call(gpu, "nvmlDeviceGetName")),
            serial=_text(self._call(gpu, "nvmlDeviceGetSerial")),
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            driver_version=self._driver,
            vbios_version=_text(self._call(gpu, "nvmlDeviceGetVbiosVersion")),
        )

    _INFOROM_OBJECTS = (("oem", "NVML_INFOROM_OEM"), ("ecc", "NVML_INFOROM_ECC"), ("power", "NVML_INFOROM_POWER"))

    def _read_case_identity_keys(self) -> tuple[str, ...]:
        objects = tuple(f"inforom_{name}_object_version" for name, _ in self._INFOROM_OBJECTS)
        return ("board_part_number", "inforom_image_version", *objects)

    def _read_case_identity(self, gpu: _Gpu) -> dict[str, str | None]:
        """nvmlDeviceGetBoardPartNumber, nvmlDeviceGetInforomImageVersion and nvmlDeviceGetInforomVersion of each
        object, keyed as nvidia-smi -q names them; NotSupported (a board without that object) is None."""
        found: dict[str, str | None] = {
            "board_part_number": _text(self._call(gpu, "nvmlDeviceGetBoardPartNumber")) or None,
            "inforom_image_version": _text(self._call(gpu, "nvmlDeviceGetInforomImageVersion")) or None,
        }
        for name, constant in self._INFOROM_OBJECTS:
            inforom_object = getattr(self._lib, constant, None)
            version = (
                self._call(gpu, "nvmlDeviceGetInforomVersion", inforom_object) if inforom_object is not None else None
            )
            found[f"inforom_{name}_object_version"] = _text(version) or None
        return found

    def _plan_fields(self, gpu: _Gpu) -> None:
        """Ask once which fields the driver supports, then choose each throttle counter's source."""
        supported = set(self._read_fields(gpu, self._fields.candidates))
        ids = self._fields
        gpu.counter_fields, gpu.violation_policies = {}, {}
        for reason, chain, policy in ids.counters:
            field_id = next((candidate for candidate in chain if candidate in supported), None)
            if field_id is not None:
                gpu.counter_fields[field_id] = reason
            elif policy is not None and (policy_type := getattr(self._lib, policy, None)) is not None:
                gpu.violation_policies[int(policy_type)] = reason
        memory_temp = tuple(i for i in (ids.memory_temp,) if i in supported)
        # The combined thermal counter too where sw_thermal has its own (R580.82 on): DCGM_FI_DEV_THERMAL_VIOLATION.
        thermal = tuple(i for i in (_FI_PERF_POLICY_THERMAL,) if i in supported and i not in gpu.counter_fields)
        gpu.fast_fields = memory_temp + tuple(gpu.counter_fields) + thermal
        slow = (ids.recovery_action, ids.l0_recovery, *_FI_PCIE_ERRORS)
        gpu.slow_fields = tuple(i for i in slow if i in supported)

    # ----- fast tier -----

    def _read_fast(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        self._read_thermal_power(gpu, sample, fields)
        self._read_clocks(gpu, sample)
        self._read_throttle(gpu, sample, fields)
        self._read_usage(gpu, sample)
        self._read_gpm(gpu, sample)  # nvml_gpm.py: real utilization
        self._read_mig_fast(gpu, sample)  # nvml_mig.py: MIG devices' memory

    def _forget(self, gpu: _Gpu) -> None:
        """A GPU that stopped answering: free its GPM samples; it starts afresh when it answers again."""
        self._free_gpm(gpu)

    def _read_thermal_power(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        lib = self._lib
        core = self._call(gpu, ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"), lib.NVML_TEMPERATURE_GPU)
        if core is not None:
            sample.temperature_celsius["core"] = float(core)
        if (memory := fields.get(self._fields.memory_temp)) is not None:
            sample.temperature_celsius["memory"] = float(memory)
        if (milliwatts := self._call(gpu, "nvmlDeviceGetPowerUsage")) is not None:
            sample.power_watts = milliwatts / 1000
        if (millijoules := self._call(gpu, "nvmlDeviceGetTotalEnergyConsumption")) is not None:
            sample.energy_joules = millijoules / 1000
        if (pstate := self._call(gpu, "nvmlDeviceGetPerformanceState")) is not None and pstate != getattr(
            lib, "NVML_PSTATE_UNKNOWN", 32
        ):
            sample.performance_state = int(pstate)
        if (source := self._call(gpu, "nvmlDeviceGetPowerSource")) is not None:
            sample.power_supply_undersized = source == lib.NVML_POWER_SOURCE_UNDERSIZED

    def _read_clocks(self, gpu: _Gpu, sample: GpuSample) -> None:
        for clock, clock_type in _CLOCKS:
            if (mhz := self._call(gpu, "nvmlDeviceGetClockInfo", getattr(self._lib, clock_type))) is not None:
                sample.clock_hertz[clock] = float(mhz) * 1e6

    def _read_throttle(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        """Active reasons from the bitmask, for every reason the device supports; its own counters."""
        current = self._call(
            gpu, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        )
        if current is not None:
            # A device that does not say which reasons it supports is taken to support all it reports on.
            supported = gpu.supported_reasons if gpu.supported_reasons is not None else ~0
            sample.throttle_active = {
                reason: bool(current & bit) for bit, reason in self._reason_bits if supported & bit
            }
        for field_id, reason in gpu.counter_fields.items():
            if (nanoseconds := fields.get(field_id)) is not None:
                sample.throttle_counter_seconds[reason] = nanoseconds / 1e9
        for policy, reason in gpu.violation_policies.items():
            if (violation := self._call(gpu, "nvmlDeviceGetViolationStatus", policy)) is not None:
                sample.throttle_counter_seconds[reason] = violation.violationTime / 1e9
                if policy == self._thermal_policy:
                    sample.thermal_violation_seconds = violation.violationTime / 1e9
        # The combined thermal counter, asked with the fields every poll (it stands in for sw_thermal on drivers
        # without the per-reason one, so it is always a candidate).
        if (nanoseconds := fields.get(_FI_PERF_POLICY_THERMAL)) is not None:
            sample.thermal_violation_seconds = nanoseconds / 1e9

    def _read_usage(self, gpu: _Gpu, sample: GpuSample) -> None:
        if (rates := self._call(gpu, "nvmlDeviceGetUtilizationRates")) is not None:
            sample.utilization_ratio = rates.gpu / 100
            sample.memory_utilization_ratio = rates.memory / 100
        if (memory := self._memory_info(gpu)) is not None:
            sample.memory_used_bytes, sample.memory_total_bytes = int(memory.used), int(memory.total)
        processes = self._call(gpu, ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"))
        if processes is not None:
            sample.process_pids = tuple(int(process.pid) for process in processes)
            # usedGpuMemory is None where NVML says NVML_VALUE_NOT_AVAILABLE (pynvml converts it; MIG, WDDM).
            sample.process_memory_bytes = {
                int(p.pid): int(p.usedGpuMemory) for p in processes if p.usedGpuMemory is not None
            }
            sample.process_gpu_instance = self._process_instances(processes)

    def _memory_info(self, gpu: _Gpu) -> Any:
        """Version 2 where the binding has it: its ``used`` leaves reserved memory out, as nvidia-smi does."""
        version = getattr(self._lib, "nvmlMemory_v2", None)
        memory = self._call(gpu, "nvmlDeviceGetMemoryInfo", version=version) if version is not None else None
        return memory if memory is not None else self._call(gpu, "nvmlDeviceGetMemoryInfo")
