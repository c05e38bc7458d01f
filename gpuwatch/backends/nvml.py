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
import ctypes
import importlib
import importlib.metadata
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, cast

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.tiered import GpuFailed as _GpuFailed
from gpuwatch.backends.tiered import TieredBackend, TieredGpu
from gpuwatch.backends.tiered import Unavailable as _Unavailable
from gpuwatch.model import COMPUTE_MODES, GpuEvent, GpuIdentity, GpuSample, UnusableGpu, Vendor

log = logging.getLogger(__name__)

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
# nvmlGpuFabricState_t
_FABRIC_STATE_NOT_SUPPORTED = 0
_FABRIC_STATE_COMPLETED = 3

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


@dataclass
class _Gpu(TieredGpu):
    """What the backend keeps about one GPU between polls (unsupported: (function, arguments) keys)."""

    nvml_index: int = field(kw_only=True)
    supported_reasons: int | None = None
    event_types: int = 0
    nvlinks: tuple[int, ...] = ()
    fans: int | None = None
    fast_fields: tuple[int, ...] = ()  # fields the driver fills, read in the one batched call of every poll
    slow_fields: tuple[int, ...] = ()  # added to that call on slow polls
    counter_fields: dict[int, str] = field(default_factory=dict)  # field id -> throttle reason it counts
    violation_policies: dict[int, str] = field(default_factory=dict)  # policy -> reason no field counts
    persistence_warned: bool = False


def load_pynvml() -> Any:
    """Import the real NVML binding; the backend itself takes the module as a parameter."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendUnavailable("nvidia-ml-py is not installed: pip install 'gpuwatch[nvidia]'") from exc


class NvmlBackend(TieredBackend[_Gpu]):
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
        self._unusable: list[UnusableGpu] = []
        self._fields = _FieldIds("")
        self._reason_bits = tuple(
            (bit, reason)
            for suffix, reason in _REASON_BITS
            if (bit := _constant(lib, f"nvmlClocksEventReason{suffix}", f"nvmlClocksThrottleReason{suffix}"))
            is not None
        )
        self._event_set: Any = None  # shared with the event thread under self._events_lock

    # ----- the choke point -----

    def _invoke(
        self, gpu: _Gpu | None, names: str | tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Call the first of ``names`` the library and driver have; every NVML call of the backend passes
        here. A later name is tried only where the earlier function does not exist (FunctionNotFound,
        NVMLLibraryMismatchError)."""
        frozen_kwargs = tuple(sorted(kwargs.items()))
        for name in (names,) if isinstance(names, str) else names:
            variant = (name, frozen_kwargs)
            key = (variant, *_hashable(args))
            if variant in self._missing:
                continue
            if gpu is not None and key in gpu.unsupported:
                raise _Unavailable(f"{name}: not supported (remembered)")
            function = getattr(self._lib, name, None)
            if function is None:
                self._missing = self._missing | {variant}
                continue
            try:
                return function(*((gpu.handle,) if gpu is not None else ()), *args, **kwargs)
            except self._mismatch_error:
                self._missing = self._missing | {variant}
            except self._lib.NVMLError as exc:
                code = int(getattr(exc, "value", _UNKNOWN_ERROR))
                if code == _FUNCTION_NOT_FOUND:
                    self._missing = self._missing | {variant}
                    continue
                self._raise_for(gpu, name, key, code, exc)
        raise _Unavailable(f"{names}: function not found", _FUNCTION_NOT_FOUND)

    @staticmethod
    def _raise_for(gpu: _Gpu | None, name: str, key: Hashable, code: int, exc: Exception) -> NoReturn:
        """Sort an NVML error into library failure, GPU failure, or a value that is not available."""
        if code in _LIBRARY_PROBLEMS:
            raise BackendUnavailable(f"NVML: {_LIBRARY_PROBLEMS[code]} ({name}: {exc})")
        if gpu is not None and code in _GPU_FAILURES:
            raise _GpuFailed(f"{_GPU_FAILURES[code]} ({name}: {exc})")
        if gpu is not None and code in _PERMANENT:
            gpu.unsupported.add(key)
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
        self._missing = frozenset()
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
        """Free the event set and shut NVML down; safe when not open."""
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
            self._missing = frozenset()
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
            code = int(answer.nvmlReturn)
            if code not in _PERMANENT:
                values[field_id] = _field_value(answer) if code == 0 else None
        return values

    # ----- static tier -----

    def _read_static(self, gpu: _Gpu) -> None:
        """Identity, limits the device declares and what it supports; forgets remembered NotSupported."""
        gpu.unsupported.clear()
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
        gpu.fast_fields = memory_temp + tuple(gpu.counter_fields)
        slow = (ids.recovery_action, ids.l0_recovery, *_FI_PCIE_ERRORS)
        gpu.slow_fields = tuple(i for i in slow if i in supported)

    # ----- slow tier -----

    def _read_slow(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        self._read_power_limits(gpu, sample)
        self._read_memory_health(gpu, sample, fields)
        self._read_pcie(gpu, sample, fields)
        self._read_nvlinks(gpu, sample)
        self._read_fabric(gpu, sample)
        self._read_modes(gpu, sample)

    def _read_power_limits(self, gpu: _Gpu, sample: GpuSample) -> None:
        """Limits by their own calls: the POWER_*_LIMIT fields come back unfilled (timestamp 0) on an H100."""
        limits = sample.power_limit_watts
        if (enforced := self._call(gpu, "nvmlDeviceGetEnforcedPowerLimit")) is not None:
            limits["enforced"] = enforced / 1000
        if (default := self._call(gpu, "nvmlDeviceGetPowerManagementDefaultLimit")) is not None:
            limits["default"] = default / 1000
        if (constraints := self._call(gpu, "nvmlDeviceGetPowerManagementLimitConstraints")) is not None:
            limits["min"], limits["max"] = constraints[0] / 1000, constraints[1] / 1000

    def _read_memory_health(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        lib = self._lib
        if (ecc := self._call(gpu, "nvmlDeviceGetEccMode")) is not None:
            sample.ecc_enabled = ecc[0] == lib.NVML_FEATURE_ENABLED
        if sample.ecc_enabled:
            for kind, error_type in (
                ("corrected", lib.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ):
                count = self._call(gpu, "nvmlDeviceGetTotalEccErrors", error_type, lib.NVML_AGGREGATE_ECC)
                if count is not None:
                    sample.ecc_errors_total[kind] = int(count)
        if (rows := self._call(gpu, "nvmlDeviceGetRemappedRows")) is not None:
            correctable, uncorrectable, pending, failed = rows
            sample.remapped_rows_total.update(correctable=int(correctable), uncorrectable=int(uncorrectable))
            sample.row_remap_pending, sample.row_remap_failed = bool(pending), bool(failed)
        sample.retired_pages = self._retired_pages(gpu)
        sample.sram_ecc_threshold_exceeded = self._sram_threshold_exceeded(gpu)
        if (banks := self._call(gpu, "nvmlDeviceGetRowRemapperHistogram")) is not None:
            sample.row_remap_banks = {name: int(getattr(banks, name)) for name in _REMAP_AVAILABILITY}
        if (action := fields.get(self._fields.recovery_action)) is not None:
            sample.recovery_action = int(action)

    def _retired_pages(self, gpu: _Gpu) -> int | None:
        """Pages retired for either cause (pre-Ampere; NotSupported and remembered on row-remapping GPUs)."""
        lib = self._lib
        counts = [
            self._call(gpu, "nvmlDeviceGetRetiredPages", cause)
            for cause in (
                lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            )
        ]
        found = [len(pages) for pages in counts if pages is not None]
        return sum(found) if found else None

    def _read_pcie(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        """The current link and what this GPU in this slot can reach (MaxPcieLinkGeneration)."""
        for target, link, name in (
            (sample.pcie_link_generation, "current", "nvmlDeviceGetCurrPcieLinkGeneration"),
            (sample.pcie_link_generation, "max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            (sample.pcie_link_width, "current", "nvmlDeviceGetCurrPcieLinkWidth"),
            (sample.pcie_link_width, "max", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            if (value := self._call(gpu, name)) is not None:
                target[link] = int(value)
        if (replays := self._call(gpu, "nvmlDeviceGetPcieReplayCounter")) is not None:
            sample.pcie_replays_total = int(replays)
        if (recoveries := fields.get(self._fields.l0_recovery)) is not None:
            sample.pcie_link_recoveries_total = int(recoveries)
        for field_id, kind in _FI_PCIE_ERRORS.items():
            if (count := fields.get(field_id)) is not None:
                sample.pcie_errors_total[kind] = int(count)

    def _sram_threshold_exceeded(self, gpu: _Gpu) -> bool | None:
        """nvmlDeviceGetSramEccErrorStatus: have on-die SRAM ECC errors passed the driver's threshold (Ampere on)?"""
        struct = getattr(self._lib, "c_nvmlEccSramErrorStatus_v1_t", None)
        if struct is None:
            return None
        status = struct()  # the binding's constructor sets its version
        if self._call(gpu, "nvmlDeviceGetSramEccErrorStatus", ctypes.byref(status)) is None:
            return None
        return bool(status.bThresholdExceeded)

    def _read_fabric(self, gpu: _Gpu, sample: GpuSample) -> None:
        """NVSwitch systems: has the fabric manager registered this GPU? Absent where there is no fabric."""
        struct = getattr(self._lib, "c_nvmlGpuFabricInfoV_t", None)
        if struct is None:
            return
        info = struct()  # the binding's constructor sets its version
        if self._call(gpu, "nvmlDeviceGetGpuFabricInfoV", ctypes.byref(info)) is None:
            return
        state = int(info.state)
        if state == _FABRIC_STATE_NOT_SUPPORTED:
            return
        sample.fabric_healthy = state == _FABRIC_STATE_COMPLETED and int(info.status) == 0

    def _read_nvlinks(self, gpu: _Gpu, sample: GpuSample) -> None:
        """State and error counters of the links found in the static tier (absent links were never kept)."""
        lib = self._lib
        for link in gpu.nvlinks:
            label = str(link)
            if (state := self._call(gpu, "nvmlDeviceGetNvLinkState", link)) is not None:
                sample.nvlink_up[label] = state == lib.NVML_FEATURE_ENABLED
            for kind, counters in _NVLINK_COUNTERS:
                found = [
                    self._call(gpu, "nvmlDeviceGetNvLinkErrorCounter", link, getattr(lib, counter))
                    for counter in counters
                    if hasattr(lib, counter)
                ]
                if values := [int(value) for value in found if value is not None]:
                    sample.nvlink_errors_total[(label, kind)] = sum(values)
        self._read_nvlink_count_fields(gpu, sample)

    def _read_nvlink_count_fields(self, gpu: _Gpu, sample: GpuSample) -> None:
        """Links without per-link DL counters (Blackwell answers NotSupported there) count their errors in the
        NVML_FI_DEV_NVLINK_COUNT_* fields, scoped to the link: one batched call for all of them."""
        counted = {link for link, _kind in sample.nvlink_errors_total}
        links = [link for link in gpu.nvlinks if str(link) not in counted]
        if not links:
            return
        requests = [(field_id, link) for link in links for field_id in _FI_NVLINK_COUNTS]
        answers = self._call(gpu, "nvmlDeviceGetFieldValues", requests)
        for (field_id, link), answer in zip(requests, answers or (), strict=False):
            if int(answer.nvmlReturn) == 0 and (value := _field_value(answer)) is not None:
                sample.nvlink_errors_total[(str(link), _FI_NVLINK_COUNTS[field_id])] = int(value)

    def _read_modes(self, gpu: _Gpu, sample: GpuSample) -> None:
        lib = self._lib
        if (mig := self._call(gpu, "nvmlDeviceGetMigMode")) is not None:
            sample.mig_enabled = mig[0] == lib.NVML_DEVICE_MIG_ENABLE
        if (mode := self._call(gpu, "nvmlDeviceGetComputeMode")) is not None and 0 <= mode < len(COMPUTE_MODES):
            sample.compute_mode = COMPUTE_MODES[mode]
        if (persistence := self._call(gpu, "nvmlDeviceGetPersistenceMode")) is not None:
            sample.persistence_mode_enabled = persistence == lib.NVML_FEATURE_ENABLED
            if not sample.persistence_mode_enabled and not gpu.persistence_warned:
                gpu.persistence_warned = True
                log.warning(
                    "GPU %s: persistence mode is off, so every NVML call re-initialises the GPU "
                    "(tens of ms): start nvidia-persistenced",
                    gpu.identity.uuid,
                )
        self._read_fans(gpu, sample)

    def _read_fans(self, gpu: _Gpu, sample: GpuSample) -> None:
        """Per-fan speed where the board has fans (passively cooled SXM boards have none)."""
        if gpu.fans is None:
            if (speed := self._call(gpu, "nvmlDeviceGetFanSpeed")) is not None:
                sample.fan_speed_ratio["0"] = speed / 100
            return
        for fan in range(gpu.fans):
            if (speed := self._call(gpu, "nvmlDeviceGetFanSpeed_v2", fan)) is not None:
                sample.fan_speed_ratio[str(fan)] = speed / 100

    # ----- fast tier -----

    def _read_fast(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        self._read_thermal_power(gpu, sample, fields)
        self._read_clocks(gpu, sample)
        self._read_throttle(gpu, sample, fields)
        self._read_usage(gpu, sample)

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

    def _read_usage(self, gpu: _Gpu, sample: GpuSample) -> None:
        if (rates := self._call(gpu, "nvmlDeviceGetUtilizationRates")) is not None:
            sample.utilization_ratio = rates.gpu / 100
            sample.memory_utilization_ratio = rates.memory / 100
        if (memory := self._memory_info(gpu)) is not None:
            sample.memory_used_bytes, sample.memory_total_bytes = int(memory.used), int(memory.total)
        processes = self._call(gpu, ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"))
        if processes is not None:
            sample.process_pids = tuple(int(process.pid) for process in processes)

    def _memory_info(self, gpu: _Gpu) -> Any:
        """Version 2 where the binding has it: its ``used`` leaves reserved memory out, as nvidia-smi does."""
        version = getattr(self._lib, "nvmlMemory_v2", None)
        memory = self._call(gpu, "nvmlDeviceGetMemoryInfo", version=version) if version is not None else None
        return memory if memory is not None else self._call(gpu, "nvmlDeviceGetMemoryInfo")


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


def _field_value(answer: Any) -> float | None:
    """Read the union by valueType; a field the driver did not fill has timestamp 0 (and reads as 0)."""
    value_type = int(answer.valueType)
    if answer.timestamp == 0 or not 0 <= value_type < len(_FIELD_MEMBERS):
        return None
    return float(getattr(answer.value, _FIELD_MEMBERS[value_type]))


def _text(value: Any) -> str:
    """NVML strings as str (older bindings return bytes); '' where not available."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _hashable(args: tuple[Any, ...]) -> tuple[Hashable, ...]:
    """Arguments as a key for the remembered NotSupported calls: the field-id list becomes a tuple, a ctypes
    pointer (an event set, a device) its address; ctypes objects claim to be Hashable and raise TypeError."""
    return tuple(_arg_key(arg) for arg in args)


def _arg_key(arg: Any) -> Hashable:
    if isinstance(arg, ctypes._Pointer):
        return ("pointer", ctypes.cast(arg, ctypes.c_void_p).value)
    if type(arg).__name__ == "CArgObject":  # byref(struct): a fresh struct each call, the same question
        return ("byref", type(arg._obj).__name__)
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
