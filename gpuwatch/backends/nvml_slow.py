"""The NVML backend's per-GPU record and its slow tier (limits, memory health, PCIe, NVLink, fabric, modes, fans:
read on slow polls and merged into every sample); gpuwatch/backends/nvml.py is the rest of the backend."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.backends.nvml_tables import (
    _FABRIC_CONFIGURATION_MASK,
    _FABRIC_CONFIGURATION_SHIFT,
    _FABRIC_FALSE,
    _FABRIC_HEALTH_FLAGS,
    _FABRIC_MISCONFIGURATIONS,
    _FABRIC_STATE_COMPLETED,
    _FABRIC_STATE_NOT_SUPPORTED,
    _FABRIC_SUMMARY,
    _FABRIC_TRUE,
    _FI_NVLINK_COUNTS,
    _FI_PCIE_ERRORS,
    _NVLINK_COUNTERS,
    _REMAP_AVAILABILITY,
    _field_value,
    _FieldIds,
    _GpuFabricInfoV1,
)
from gpuwatch.backends.tiered import TieredBackend, TieredGpu
from gpuwatch.core.latch import Latch
from gpuwatch.core.model import COMPUTE_MODES, GpuSample, MigDevice

log = logging.getLogger(__name__)


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
    persistence_off: Latch = field(default_factory=lambda: Latch(log))
    mig: tuple[tuple[Any, MigDevice], ...] = ()  # a MIG-enabled GPU's MIG devices: (handle, identity), nvml_mig.py


class NvmlSlowTier(TieredBackend[_Gpu]):
    """The slow tier's reads, through the choke point (`_call`) NvmlBackend completes."""

    _fields: _FieldIds

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
        """NVSwitch systems: has the fabric manager registered this GPU, and how healthy is its fabric? Absent where
        there is no fabric. Asks nvmlDeviceGetGpuFabricInfoV at version 3 (the health summary), then 2 (the mask),
        then the unversioned nvmlDeviceGetGpuFabricInfo (registration alone) of a driver or binding without them;
        a refusal (FunctionNotFound, ArgumentVersionMismatch, NotSupported) is remembered, so each poll asks once."""
        info = None
        for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfoV_t"):
            struct = getattr(self._lib, name, None)
            if struct is None:
                continue
            candidate = struct()  # the binding's constructor sets its version
            if self._call(gpu, "nvmlDeviceGetGpuFabricInfoV", ctypes.byref(candidate)) is not None:
                info = candidate
                break
        if info is None:
            unversioned = _GpuFabricInfoV1()
            if self._call(gpu, "nvmlDeviceGetGpuFabricInfo", ctypes.byref(unversioned)) is None:
                return
            info = unversioned
        state = int(info.state) & 0xFF  # an unsigned char in nvml.h; 13.615.71's pynvml reads four bytes
        if state == _FABRIC_STATE_NOT_SUPPORTED:
            return
        sample.fabric_healthy = state == _FABRIC_STATE_COMPLETED and int(info.status) == 0
        if hasattr(info, "healthMask"):
            _fabric_health(int(info.healthMask), int(getattr(info, "healthSummary", 0)), sample)

    def _read_nvlinks(self, gpu: _Gpu, sample: GpuSample) -> None:
        """State and error counters of the links found in the static tier (absent links were never kept): those are
        the links the GPU has, its expected ones."""
        lib = self._lib
        sample.nvlink_expected = len(gpu.nvlinks) or None
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
            if not sample.persistence_mode_enabled:
                gpu.persistence_off.fail(
                    "GPU %s: persistence mode is off, so every NVML call re-initialises the GPU "
                    "(tens of ms): start nvidia-persistenced",
                    gpu.identity.uuid,
                )
            else:
                gpu.persistence_off.recover("GPU %s: persistence mode is on again", gpu.identity.uuid)
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


def _fabric_health(mask: int, summary: int, sample: GpuSample) -> None:
    """The conditions a fabric's health mask and summary report (NOT_SUPPORTED ones are left out)."""
    for condition, shift, width in _FABRIC_HEALTH_FLAGS:
        value = (mask >> shift) & width
        if value in (_FABRIC_TRUE, _FABRIC_FALSE):
            sample.fabric_health[condition] = value == _FABRIC_TRUE
    configuration = (mask >> _FABRIC_CONFIGURATION_SHIFT) & _FABRIC_CONFIGURATION_MASK
    if configuration:
        wrong = configuration != 1  # 1: NONE
        sample.fabric_health["incorrect_configuration"] = wrong
        if wrong:
            sample.fabric_misconfiguration = _FABRIC_MISCONFIGURATIONS.get(configuration, f"code {configuration}")
    if summary in _FABRIC_SUMMARY:
        for condition in ("unhealthy", "limited_capacity"):
            sample.fabric_health[condition] = _FABRIC_SUMMARY[summary] == condition
