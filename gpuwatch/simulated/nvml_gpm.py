"""GPM (GPU performance monitoring) of the simulated libnvidia-ml: samples of the GPU's activity counters, and
metrics computed from two of them, as nvml.h's GPM functions describe (go-nvml gen/nvml/nvml.h, NVML 13.3.29:
"Calculate GPM metrics from two samples", nvmlGpmSampleAlloc / nvmlGpmSampleGet / nvmlGpmMetricsGet).

A sample is real memory the library allocates (its address is the ``nvmlGpmSample_t``) holding the counters since
boot at one moment: SM cycles elapsed, each activity channel's active cycles, PCIe and NVLink bytes
(activity.py). nvmlGpmMetricsGet divides the differences of two samples (utilizations in percent, bandwidths in
MiB/s) and answers the "since reboot" counters (NVML 13.2 on) from the second sample; each metric has its own
nvmlReturn. Only Hopper and newer support GPM ("For Hopper or newer fully supported devices"): elsewhere
nvmlGpmQueryDeviceSupport says isSupportedDevice 0 and nvmlGpmSampleGet answers NotSupported.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import POINTER, Structure, c_double, c_int32, c_uint, c_uint32, c_uint64, c_void_p, cast
from typing import Any, TypeVar

from gpuwatch.simulated import nvml_constants as c
from gpuwatch.simulated.activity import CHANNELS
from gpuwatch.simulated.mig import MigDevice
from gpuwatch.simulated.nvml_errors import NvmlFailure
from gpuwatch.simulated.nvml_structs import nvmlGpmMetric_t, nvmlGpmMetricsGetHeader_t, nvmlGpmSupport_t
from gpuwatch.simulated.scenarios import GpuSpec, SimulatedNode

_P = c_void_p
_Impl = TypeVar("_Impl", bound=Callable[..., Any])
GPM_PROTOTYPES: dict[str, tuple[tuple[Any, ...], str]] = {}
_LINKS = 18  # NVLink links a GPM sample has room for (NVML_GPM_METRIC_NVLINK_L0..L17_*_PER_SEC)
_MAGIC = 0x47504D53414D504C  # "GPMSAMPL": a sample this library allocated
_MIB = float(1 << 20)
# "The interval between two nvmlGpmSampleGet() calls should be greater than 100ms due to the internal sample refresh
# rate" (nvml.h of NVML 13.3, go-nvml gen/nvml/nvml.h 13861 and 13911): the counters a sample copies are refreshed
# this often, so two samples closer than this may hold the same counters.
_REFRESH_SECONDS = 0.1
# The first driver whose NVML has the counters since reboot (NVML 13.2, CUDA 13.2's R595 driver; absent from
# 13.1.115's nvml.h, present in 13.2.82's: go-nvml commits 2a1f6c3 and 2976179).
CUMULATIVE_SINCE_DRIVER = 595


def _export(*argtypes: Any) -> Callable[[_Impl], _Impl]:
    def register(method: _Impl) -> _Impl:
        GPM_PROTOTYPES[method.__name__] = (argtypes, method.__name__)
        return method

    return register


class _GpmSample(Structure):
    """What an nvmlGpmSample_t points at (library-private: nvml.h declares ``struct nvmlGpmSample_st`` opaque)."""

    _fields_ = [
        ("magic", c_uint64),
        ("filled", c_uint32),
        ("gpu", c_int32),
        ("gpu_instance", c_int32),  # the MIG GPU instance sampled, -1 for the whole GPU
        ("compute_instance", c_int32),  # the MIG device's compute instance, -1 for a whole GPU instance
        ("elapsed", c_double),  # node seconds when sampled
        ("cycles_elapsed", c_double),  # SM cycles since boot, counted at the SM's maximum clock
        ("graphics_active", c_double),  # cycles any context was active (utilization.gpu's meaning)
        ("active", c_double * len(CHANNELS)),  # cycles each activity channel was active (share-weighted)
        ("pcie_tx", c_double),  # bytes since the driver loaded
        ("pcie_rx", c_double),
        ("nvlink_rx", c_double * _LINKS),
        ("nvlink_tx", c_double * _LINKS),
    ]


_PERCENT = {
    c.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    c.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    c.NVML_GPM_METRIC_INTEGER_UTIL: "integer",
    c.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
    c.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: "dfma",
    c.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: "hmma",
    c.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: "dmma",
    c.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: "imma",
    c.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active",
    c.NVML_GPM_METRIC_FP64_UTIL: "fp64",
    c.NVML_GPM_METRIC_FP32_UTIL: "fp32",
    c.NVML_GPM_METRIC_FP16_UTIL: "fp16",
}
_CYCLES = {
    c.NVML_GPM_METRIC_SM_CYCLES_ACTIVE: "sm_active",
    c.NVML_GPM_METRIC_MMA_CYCLES_ACTIVE: "tensor_active",
    c.NVML_GPM_METRIC_DMMA_CYCLES_ACTIVE: "dmma",
    c.NVML_GPM_METRIC_HMMA_CYCLES_ACTIVE: "hmma",
    c.NVML_GPM_METRIC_IMMA_CYCLES_ACTIVE: "imma",
    c.NVML_GPM_METRIC_DFMA_CYCLES_ACTIVE: "dfma",
    c.NVML_GPM_METRIC_INTEGER_CYCLES_ACTIVE: "integer",
    c.NVML_GPM_METRIC_FP64_CYCLES_ACTIVE: "fp64",
    c.NVML_GPM_METRIC_FP32_CYCLES_ACTIVE: "fp32",
    c.NVML_GPM_METRIC_FP16_CYCLES_ACTIVE: "fp16",
}
# metricInfo (shortName, longName, unit) as the 580.159.04 driver filled it on an H100 (tests/fixtures/h100/
# nvml-backend-calls.json): DMMA has a unit and no names there; an id the driver does not know gets none of the three.
_METRIC_INFO: dict[int, tuple[str | None, str | None, str | None]] = {
    c.NVML_GPM_METRIC_GRAPHICS_UTIL: ("gr_util", "graphics utilization", "%"),  # not read on the H100: made up
    c.NVML_GPM_METRIC_SM_UTIL: ("smutil", "SM_UTIL", "%"),
    c.NVML_GPM_METRIC_SM_OCCUPANCY: ("smocc", "SM_OCCUPANCY", "%"),
    c.NVML_GPM_METRIC_INTEGER_UTIL: ("intutil", "INTEGER_UTIL", "%"),
    c.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("mmaact", "ANY_TENSOR_UTIL", "%"),
    c.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: ("dfmat", "DFMA_TENSOR_UTIL", "%"),
    c.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: ("hmmat", "HMMA_TENSOR_UTIL", "%"),
    c.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: (None, None, "%"),
    c.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: ("immat", "IMMA_TENSOR_UTIL", "%"),
    c.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram", "DRAM_BW_UTIL", "%"),
    c.NVML_GPM_METRIC_FP64_UTIL: ("fp64", "FP64_UTIL", "%"),
    c.NVML_GPM_METRIC_FP32_UTIL: ("fp32", "FP32_UTIL", "%"),
    c.NVML_GPM_METRIC_FP16_UTIL: ("fp16", "FP16_UTIL", "%"),
    c.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcitx", "PCIE_TX_PER_SEC", "MiB/s"),
    c.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcirx", "PCIE_RX_PER_SEC", "MiB/s"),
}
# What a MIG instance's samples have no share of: PCIe and NVLink traffic belong to the whole GPU (the simulation's
# choice: nvml.h says nothing of per-instance PCIe or NVLink metrics).
_WHOLE_GPU_ONLY = frozenset(
    {
        c.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        c.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        c.NVML_GPM_METRIC_PCIE_TX,
        c.NVML_GPM_METRIC_PCIE_RX,
        c.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
        c.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        *range(c.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC, c.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC + 2 * _LINKS),
        *range(c.NVML_GPM_METRIC_NVLINK_L0_RX, c.NVML_GPM_METRIC_NVLINK_L0_RX + 2 * 72),  # links 0-71
    }
)
# The strings live as long as the library: metricInfo holds pointers into them.
_NAMES: dict[int, tuple[ctypes.Array[ctypes.c_char] | None, ...]] = {
    metric: tuple(None if text is None else ctypes.create_string_buffer(text.encode()) for text in info)
    for metric, info in _METRIC_INFO.items()
}


def _major(driver_version: str) -> int:
    head = driver_version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


class GpmFunctions:
    """The GPM C functions, mixed into the library's driver (libnvml._Driver), which provides the gate every call
    passes (`_enter`, `_spec`), the node and the driver version."""

    node: SimulatedNode
    compute_capability_override: tuple[int, int] | None = None

    @property
    def driver_version(self) -> str:
        raise NotImplementedError

    def _enter(
        self, names: tuple[str, ...], device: int | None = None, *, needs_device: bool = False, about: int | None = None
    ) -> int:
        raise NotImplementedError

    def _spec(self, name: str, device: int | None, *aliases: str) -> GpuSpec:
        raise NotImplementedError

    def _enter_any(
        self, names: tuple[str, ...], device: int | None = None, *, about: int | None = None
    ) -> tuple[int, MigDevice | None]:
        raise NotImplementedError

    @property
    def _gpm_samples(self) -> dict[int, _GpmSample]:
        """Samples allocated and not yet freed, by address (what keeps their memory alive)."""
        found: dict[int, _GpmSample] | None = self.__dict__.get("_gpm_sample_memory")
        if found is None:
            found = self.__dict__["_gpm_sample_memory"] = {}
        return found

    def gpm_supported(self, index: int) -> bool:
        """Hopper (compute capability 9) and newer."""
        major = (self.compute_capability_override or self.node.spec(index).compute_capability)[0]
        return major >= 9

    @_export(_P, _P)
    def nvmlGpmQueryDeviceSupport(self, device: int, out: int) -> None:
        """nvml.h line 13950: "This API supports the device handle and MIG device handle"."""
        index, _ = self._enter_any(("nvmlGpmQueryDeviceSupport",), device)
        support = _struct(out, nvmlGpmSupport_t)
        if support.version != c.NVML_GPM_SUPPORT_VERSION:
            raise NvmlFailure(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        support.isSupportedDevice = int(self.gpm_supported(index))

    @_export(_P)
    def nvmlGpmSampleAlloc(self, out: int) -> None:
        self._enter(("nvmlGpmSampleAlloc",))
        if not out:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        sample = _GpmSample(magic=_MAGIC, gpu=-1)
        self._gpm_samples[ctypes.addressof(sample)] = sample
        cast(out, POINTER(c_void_p))[0] = ctypes.addressof(sample)

    @_export(_P)
    def nvmlGpmSampleFree(self, sample: int) -> None:
        self._enter(("nvmlGpmSampleFree",))
        if self._gpm_samples.pop(sample or 0, None) is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)

    @_export(_P, _P)
    def nvmlGpmSampleGet(self, device: int, sample: int) -> None:
        """A GPU's counters, or a MIG device's (nvml.h line 13913: "This API supports the device handle and MIG device
        handle"): its compute instance's."""
        index, mig = self._enter_any(("nvmlGpmSampleGet",), device)
        scope = (-1, -1) if mig is None else (mig.gpu_instance.id, mig.compute_instance.id)
        self._fill(index, sample, scope)

    @_export(_P, c_uint, _P)
    def nvmlGpmMigSampleGet(self, device: int, gpu_instance: int, sample: int) -> None:
        """One MIG GPU instance's counters, by the parent GPU's handle and the instance's ID (nvml.h lines
        13925-13943). With MIG disabled, or no GPU instance of that ID, there is none to sample: InvalidArgument
        (nvml.h names no code for it; unverified)."""
        index = self._enter(("nvmlGpmMigSampleGet",), device, needs_device=True)
        if not self.gpm_supported(index):
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        view = self.node.mig(index)
        if view is None or not view.enabled or view.gpu_instance(gpu_instance) is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        self._fill(index, sample, (gpu_instance, -1))

    def _fill(self, index: int, address: int, scope: tuple[int, int] = (-1, -1)) -> None:
        if not self.gpm_supported(index):
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        sample = self._gpm_samples.get(address or 0)
        if sample is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        refreshes: dict[tuple[int, int, int], _GpmSample] = self.__dict__.setdefault("_gpm_refreshes", {})
        key = (index, *scope)
        counters = refreshes.get(key)
        if counters is None or self.node.elapsed() - counters.elapsed >= _REFRESH_SECONDS:
            counters = refreshes[key] = _GpmSample(magic=_MAGIC, gpu=-1)
            if scope == (-1, -1):
                self._refresh(index, counters)
            else:
                self._refresh_instance(index, scope, counters)
        ctypes.pointer(sample)[0] = counters  # a copy of the counters as last refreshed

    def _refresh_instance(self, index: int, scope: tuple[int, int], sample: _GpmSample) -> None:
        """A MIG instance's counters now: its jobs' activity (SimulatedNode.mig_activity), SM cycles at the SM's
        maximum clock as for the whole GPU; no PCIe or NVLink bytes of its own (the metrics answer NotSupported)."""
        gi, ci = scope
        hz = self.node.spec(index).clock_max_mhz["sm"] * 1e6
        activity = self.node.mig_activity(index, gi, None if ci < 0 else ci)
        sample.filled, sample.gpu, sample.elapsed = 1, index, activity.elapsed
        sample.gpu_instance, sample.compute_instance = gi, ci
        sample.cycles_elapsed = activity.uptime_s * hz
        sample.graphics_active = activity.busy_s * hz
        for i, channel in enumerate(CHANNELS):
            sample.active[i] = activity.active_s[channel] * hz

    def _refresh(self, index: int, sample: _GpmSample) -> None:
        """The GPU's counters now, as its internal refresh reads them every _REFRESH_SECONDS."""
        spec, state = self.node.spec(index), self.node.state(index)
        plan = self.node.plan(index)
        hz = spec.clock_max_mhz["sm"] * 1e6
        now = state.activity
        sample.filled, sample.gpu, sample.elapsed = 1, index, state.elapsed
        sample.gpu_instance = sample.compute_instance = -1
        sample.cycles_elapsed = now.uptime_s * hz
        sample.graphics_active = (state.elapsed if plan.busy else 0.0) * hz  # utilization.gpu is 0 or 1 here
        for i, channel in enumerate(CHANNELS):
            sample.active[i] = now.active_s[channel] * hz
        sample.pcie_tx, sample.pcie_rx = float(state.pcie_tx_bytes), float(state.pcie_rx_bytes)
        for link in range(_LINKS):
            sample.nvlink_rx[link] = now.nvlink_rx_bytes[link] if link < len(now.nvlink_rx_bytes) else 0.0
            sample.nvlink_tx[link] = now.nvlink_tx_bytes[link] if link < len(now.nvlink_tx_bytes) else 0.0

    @_export(_P)
    def nvmlGpmMetricsGet(self, address: int) -> None:
        self._enter(("nvmlGpmMetricsGet",))
        header = _struct(address, nvmlGpmMetricsGetHeader_t)
        if header.version != c.NVML_GPM_METRICS_GET_VERSION:
            raise NvmlFailure(c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if header.numMetrics > c.NVML_GPM_METRIC_MAX:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        first = self._gpm_samples.get(header.sample1 or 0)
        second = self._gpm_samples.get(header.sample2 or 0)
        if first is None or second is None or not (first.filled and second.filled) or first.gpu != second.gpu:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        if (first.gpu_instance, first.compute_instance) != (second.gpu_instance, second.compute_instance):
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)  # two samples of different MIG instances
        links = min(self.node.spec(second.gpu).nvlink_links, _LINKS)
        instance = second.gpu_instance >= 0
        cumulative = _major(self.driver_version) >= CUMULATIVE_SINCE_DRIVER
        metrics = cast(address + ctypes.sizeof(nvmlGpmMetricsGetHeader_t), POINTER(nvmlGpmMetric_t))
        for i in range(header.numMetrics):
            metric = metrics[i]
            value = _metric(int(metric.metricId), first, second, links, cumulative)
            if instance and isinstance(value, float) and int(metric.metricId) in _WHOLE_GPU_ONLY:
                value = (c.NVML_ERROR_NOT_SUPPORTED,)
            metric.nvmlReturn = c.NVML_SUCCESS if isinstance(value, float) else value[0]
            metric.value = value if isinstance(value, float) else 0.0
            names = _NAMES.get(int(metric.metricId))
            metric.metricInfo.shortName, metric.metricInfo.longName, metric.metricInfo.unit = (
                tuple(None if text is None else ctypes.addressof(text) for text in names)
                if names and metric.nvmlReturn == c.NVML_SUCCESS
                else (None, None, None)
            )


def _metric(metric: int, s1: _GpmSample, s2: _GpmSample, links: int, cumulative: bool) -> float | tuple[int]:
    """One metric's value, or (nvmlReturn,) where the GPU or driver has none."""
    not_supported = (c.NVML_ERROR_NOT_SUPPORTED,)
    seconds = float(s2.elapsed - s1.elapsed)
    cycles = float(s2.cycles_elapsed - s1.cycles_elapsed)
    if metric == c.NVML_GPM_METRIC_GRAPHICS_UTIL or metric in _PERCENT:
        if cycles <= 0:
            return (c.NVML_ERROR_INVALID_ARGUMENT,)  # the same sample twice, or in the wrong order
        if metric == c.NVML_GPM_METRIC_GRAPHICS_UTIL:
            return 100.0 * float(s2.graphics_active - s1.graphics_active) / cycles
        i = CHANNELS.index(_PERCENT[metric])
        return 100.0 * float(s2.active[i] - s1.active[i]) / cycles
    rates = {
        c.NVML_GPM_METRIC_PCIE_TX_PER_SEC: s2.pcie_tx - s1.pcie_tx,
        c.NVML_GPM_METRIC_PCIE_RX_PER_SEC: s2.pcie_rx - s1.pcie_rx,
    }
    if links:
        rates[c.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] = sum(s2.nvlink_rx[:links]) - sum(s1.nvlink_rx[:links])
        rates[c.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = sum(s2.nvlink_tx[:links]) - sum(s1.nvlink_tx[:links])
        for link in range(links):
            rates[c.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC + 2 * link] = s2.nvlink_rx[link] - s1.nvlink_rx[link]
            rates[c.NVML_GPM_METRIC_NVLINK_L0_TX_PER_SEC + 2 * link] = s2.nvlink_tx[link] - s1.nvlink_tx[link]
    if metric in rates:
        return rates[metric] / seconds / _MIB if seconds > 0 else (c.NVML_ERROR_INVALID_ARGUMENT,)
    if not cumulative:
        # A metric id its driver does not know: the H100 on 580.159.04 answered InvalidArgument for each of them
        # (tests/fixtures/h100/nvml-backend-calls.json, ids 248-260), not NotSupported.
        return (c.NVML_ERROR_INVALID_ARGUMENT,)
    if metric == c.NVML_GPM_METRIC_SM_CYCLES_ELAPSED:
        return float(s2.cycles_elapsed)
    if metric in _CYCLES:
        return float(s2.active[CHANNELS.index(_CYCLES[metric])])
    if metric == c.NVML_GPM_METRIC_PCIE_TX:
        return float(s2.pcie_tx)
    if metric == c.NVML_GPM_METRIC_PCIE_RX:
        return float(s2.pcie_rx)
    link, direction = divmod(metric - c.NVML_GPM_METRIC_NVLINK_L0_RX, 2)
    if 0 <= link < links:
        return float(s2.nvlink_tx[link] if direction else s2.nvlink_rx[link])
    return not_supported


_S = TypeVar("_S", bound=Structure)


def _struct(address: int | None, struct: type[_S]) -> _S:
    if not address:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    return struct.from_address(address)
