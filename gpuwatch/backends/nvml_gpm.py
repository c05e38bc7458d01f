"""Real utilization on NVIDIA GPUs: GPM (GPU performance monitoring, Hopper and newer), read on every poll.

`utilization.gpu` says only that a kernel ran; GPM counts what the SMs did. nvml.h's recipe ("GPM Functions"):
allocate two sample buffers, take a sample each poll, and let nvmlGpmMetricsGet compute the metrics from the last
two, so every share covers exactly the time between two polls. The backend keeps the previous sample per GPU and
frees both when the GPU stops answering or the backend closes. Where NVML also has the counters since reboot
(NVML 13.2 on), they are exported as they are; the shares are summed into seconds counters either way, so
`rate()` gives exact shares over any window. A GPU without GPM (before Hopper, or an old binding) has none of
these series, never zeros; `activity_support` says why, for `gpuwatch check`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.nvml_gpm_request import MetricsRequest
from gpuwatch.backends.nvml_mig import NvmlMigTier
from gpuwatch.backends.nvml_slow import _Gpu
from gpuwatch.backends.tiered import Unavailable
from gpuwatch.core.model import GpuSample

_MIB = float(1 << 20)
_INVALID_ARGUMENT = 2
# nvmlGpmMetricId_t values (nvml.h; an enum, so fixed once published): asked by number, because a binding may not
# name every one its driver knows (nvidia-ml-py 12.570 lacks DMMA_TENSOR_UTIL and every since-reboot counter).
# Windowed (percent 0-100 over the interval between the two samples): id -> name.
_SHARES: dict[int, str] = {
    2: "sm_active",  # SM_UTIL
    3: "sm_occupancy",  # SM_OCCUPANCY
    5: "tensor_active",  # ANY_TENSOR_UTIL
    10: "dram_active",  # DRAM_BW_UTIL
    7: "hmma",  # HMMA_TENSOR_UTIL
    8: "dmma",  # DMMA_TENSOR_UTIL
    9: "imma",  # IMMA_TENSOR_UTIL
    6: "dfma",  # DFMA_TENSOR_UTIL
    11: "fp64",  # FP64_UTIL
    12: "fp32",  # FP32_UTIL
    13: "fp16",  # FP16_UTIL
    4: "integer",  # INTEGER_UTIL
}
PIPES: tuple[str, ...] = ("hmma", "dmma", "imma", "dfma", "fp64", "fp32", "fp16", "integer")
_PCIE_PER_SEC = {"tx": 20, "rx": 21}  # MiB/s
_NVLINK_L0_PER_SEC = {"rx": 62, "tx": 63}  # link n: + 2n, MiB/s
# Since reboot (NVML 13.2 on; go-nvml gen/nvml/nvml.h of 13.2.82): SM_CYCLES_ELAPSED, then active cycles by pipe.
_SM_CYCLES_ELAPSED = 248
_CYCLES: dict[int, str] = {
    249: "sm",  # SM_CYCLES_ACTIVE
    250: "tensor",  # MMA_CYCLES_ACTIVE
    251: "dmma",
    252: "hmma",
    253: "imma",
    254: "dfma",
    257: "integer",
    258: "fp64",
    259: "fp32",
    260: "fp16",
}
_PCIE_BYTES = {"tx": 255, "rx": 256}
_NVLINK_L0_BYTES = {"rx": 261, "tx": 262}  # link n: + 2n
# nvmlGpmSampleGet answers that stop the agent asking until the driver changes: what each means for the operator.
_GIVE_UP: dict[int | None, str] = {
    3: "this GPU or its mode (vGPU, MIG) has no GPM sampling",  # NVML_ERROR_NOT_SUPPORTED
    4: "the driver keeps performance counters to administrators (NVreg_RestrictProfilingToAdminUsers=1): run the "
    "agent as root, or load nvidia with NVreg_RestrictProfilingToAdminUsers=0",  # NVML_ERROR_NO_PERMISSION
}
_NVLINK_GPM_LINKS = 18  # NVML_GPM_METRIC_NVLINK_L0..L17_*_PER_SEC
# "The interval between two nvmlGpmSampleGet() calls should be greater than 100ms due to the internal sample refresh
# rate" (nvml.h of NVML 13.3, go-nvml gen/nvml/nvml.h 13861 and 13911): a poll sooner than this after the last
# sample takes none, and keeps the last interval's readings.
SAMPLE_FLOOR_SECONDS = 0.1
_KEPT_REQUESTS = 8  # metric-id sets whose request structure is kept


@dataclass(frozen=True)
class _Plan:
    """What one nvmlGpmMetricsGet asks: the same for every poll of a GPU until its links or the driver change."""

    rates: dict[tuple[str, str], int]  # ("pcie" | link, rx | tx) -> per-second metric id
    counters: dict[tuple[str, str], int]  # since reboot: ("cycles", pipe), ("pcie_total" | "nvlink_total:N", rx | tx)
    wanted: tuple[int, ...]  # every id asked, in order: shares, rates, counters, cut to the binding's array


@functools.lru_cache(maxsize=64)
def _plan(links: tuple[int, ...], cumulative: bool, room: int) -> _Plan:
    """The ids for a GPU with NVLink `links`; the since-reboot ones unless the driver already said it has none."""
    rates = {("pcie", direction): metric for direction, metric in _PCIE_PER_SEC.items()}
    for link in links:
        for direction, metric in _NVLINK_L0_PER_SEC.items():
            rates[(str(link), direction)] = metric + 2 * link
    counters: dict[tuple[str, str], int] = {}
    if cumulative:
        counters[("cycles", "elapsed")] = _SM_CYCLES_ELAPSED
        counters.update({("cycles", pipe): metric for metric, pipe in _CYCLES.items()})
        counters.update({("pcie_total", direction): metric for direction, metric in _PCIE_BYTES.items()})
        for link in links:
            for direction, metric in _NVLINK_L0_BYTES.items():
                counters[(f"nvlink_total:{link}", direction)] = metric + 2 * link
    wanted = (*_SHARES, *rates.values(), *counters.values())[:room]
    return _Plan(rates, counters, wanted)


@dataclass
class _GpmState:
    """One GPU's GPM between polls: its two sample buffers, when the last was taken, and the running sums."""

    driver: str
    supported: bool = False
    reason: str = ""  # why there is no real utilization, while there is none
    samples: list[Any] = field(default_factory=list)  # [previous, spare] once allocated
    previous_at: float | None = None  # when samples[0] was taken
    shares: dict[str, float] = field(default_factory=dict)  # the last measured interval's, kept below the floor
    cumulative: bool | None = None  # the since-reboot counters answer (None: not asked yet)
    seconds: dict[str, float] = field(default_factory=dict)  # sm, tensor
    cycles: dict[str, float] = field(default_factory=dict)  # elapsed and active by pipe: the device's, as read
    pcie: dict[str, float] = field(default_factory=dict)  # rx, tx: the device's counter, else the rates summed
    nvlink: dict[tuple[str, str], float] = field(default_factory=dict)  # (link, rx|tx), likewise


class NvmlGpmTier(NvmlMigTier):
    """GPM reads through the backend's choke point; NvmlBackend calls `_read_gpm` in its fast tier."""

    _gpm: dict[int, _GpmState]

    def _gpm_states(self) -> dict[int, _GpmState]:
        states: dict[int, _GpmState] = self.__dict__.setdefault("_gpm", {})
        return states

    def _gpm_request(self, ids: tuple[int, ...]) -> MetricsRequest:
        """The request asking `ids`, kept for the next poll and shared by the GPUs that ask the same (a structure of
        ~9 KB each; the poll reads GPUs one after another, and each reads its answers before the next asks)."""
        requests: dict[tuple[int, ...], MetricsRequest] = self.__dict__.setdefault("_gpm_requests", {})
        request = requests.get(ids)
        if request is None:
            if len(requests) >= _KEPT_REQUESTS:  # link sets seen come and go: keep a few
                requests.clear()
            request = requests[ids] = MetricsRequest(self._lib, ids)
        return request

    def activity_support(self) -> tuple[int, list[tuple[int, str]]]:
        """GPUs with real utilization, and (gpu, why not) for each GPU without it."""
        states = self._gpm_states()
        found = [(gpu, states.get(gpu.nvml_index)) for gpu in self._gpus]
        missing = [
            (gpu.identity.index, state.reason if state else "not read yet")
            for gpu, state in found
            if state is None or not state.supported
        ]
        return len(found) - len(missing), missing

    # ----- per poll -----

    def _read_gpm(self, gpu: _Gpu, sample: GpuSample) -> None:
        state = self._gpm_state(gpu)
        if not state.supported:
            return
        now = self._clock()
        if state.previous_at is not None and now - state.previous_at <= SAMPLE_FLOOR_SECONDS:
            self._keep_last_interval(state, sample)  # too soon for a new sample: NVML's counters have not refreshed
            return
        previous, current = state.samples
        try:
            self._invoke(gpu, "nvmlGpmSampleGet", (current,), {})
        except Unavailable as exc:
            if exc.code in _GIVE_UP:  # asked again after a driver change or when the GPU is read afresh
                self._free_gpm(gpu)
                self._gpm_states()[gpu.nvml_index] = _GpmState(self._driver, reason=f"{exc}: {_GIVE_UP[exc.code]}")
            return  # anything else: the next poll tries again, measuring from the last sample taken
        if state.previous_at is not None:
            self._gpm_metrics(gpu, state, previous, current, now - state.previous_at)
        state.samples, state.previous_at = [current, previous], now
        self._keep_last_interval(state, sample)

    @staticmethod
    def _keep_last_interval(state: _GpmState, sample: GpuSample) -> None:
        """The last measured interval's shares and the totals so far, into a sample that measured none (or one that
        just did): the series hold steady between samples instead of vanishing."""
        shares = state.shares
        sample.sm_active_ratio = shares.get("sm_active")
        sample.sm_occupancy_ratio = shares.get("sm_occupancy")
        sample.tensor_active_ratio = shares.get("tensor_active")
        sample.dram_active_ratio = shares.get("dram_active")
        sample.pipe_active_ratio = {pipe: shares[pipe] for pipe in PIPES if pipe in shares}
        sample.active_seconds_total = dict(state.seconds)
        sample.sm_cycles_total = state.cycles.get("elapsed")
        sample.active_cycles_total = {pipe: v for pipe, v in state.cycles.items() if pipe != "elapsed"}
        sample.pcie_bytes_total = dict(state.pcie)
        sample.nvlink_bytes_total = dict(state.nvlink)

    def _gpm_state(self, gpu: _Gpu) -> _GpmState:
        """The GPU's GPM state, asking NVML whether it supports GPM on the first poll and after a driver change."""
        states = self._gpm_states()
        state = states.get(gpu.nvml_index)
        if state is not None and state.driver == self._driver:
            return state
        if state is not None:
            self._free_gpm(gpu)
        state = states[gpu.nvml_index] = _GpmState(self._driver)
        if not hasattr(self._lib, "nvmlGpmQueryDeviceSupport"):
            state.reason = "this nvidia-ml-py has no GPM functions (NVML 11.8 added them): pip install -U nvidia-ml-py"
            return state
        try:
            support = self._invoke(gpu, "nvmlGpmQueryDeviceSupport", (), {})
        except Unavailable as exc:
            state.reason = f"nvmlGpmQueryDeviceSupport: {exc} (GPM needs a driver of NVML 11.8, R520, or newer)"
            return state
        if not support.isSupportedDevice:
            state.reason = (
                "NVML GPM is not supported on this GPU (it needs Hopper or newer: compute capability 9.0+); "
                "only gpuwatch_gpu_utilization_ratio, which counts time a kernel ran, is available"
            )
            return state
        for _ in range(2):
            buffer = self._call(None, "nvmlGpmSampleAlloc")
            if buffer is None:
                self._free_gpm(gpu)
                state.samples, state.reason = [], "nvmlGpmSampleAlloc failed"
                states[gpu.nvml_index] = state
                return state
            state.samples.append(buffer)
        state.supported = True
        return state

    def _gpm_metrics(self, gpu: _Gpu, state: _GpmState, first: Any, second: Any, seconds: float) -> None:
        """One nvmlGpmMetricsGet over the interval between two samples; its shares, rates and counters into the
        GPU's state (no shares when it was refused: a refused interval is not the last one's)."""
        state.shares = {}
        links = tuple(link for link in gpu.nvlinks if link < _NVLINK_GPM_LINKS)
        room = int(getattr(self._lib, "NVML_GPM_METRIC_MAX", 98))  # the binding's metrics[] array
        plan = _plan(links, state.cumulative is not False, room)
        answers = self._metrics_get(first, second, plan.wanted)
        if answers is None and plan.counters:  # a driver that refuses the ids it does not know: ask without them
            state.cumulative = False
            plan = _plan(links, False, room)
            answers = self._metrics_get(first, second, plan.wanted)
        if answers is None:
            return
        shares = {name: min(1.0, max(0.0, answers[i] / 100)) for i, name in _SHARES.items() if i in answers}
        state.shares = shares
        for key, share in (("sm", shares.get("sm_active")), ("tensor", shares.get("tensor_active"))):
            if share is not None:
                state.seconds[key] = state.seconds.get(key, 0.0) + share * seconds
        self._gpm_counters(state, answers, plan.counters, plan.rates, seconds)

    def _metrics_get(self, first: Any, second: Any, ids: tuple[int, ...]) -> dict[int, float] | None:
        """metricId -> value for every metric NVML answered; None when the call itself was refused."""
        request = self._gpm_request(ids)
        try:
            self._invoke(None, "nvmlGpmMetricsGet", (request.prepare(first, second),), {})
        except Unavailable as exc:
            self.log.debug("nvmlGpmMetricsGet: %s", exc)
            return None
        return request.answers()

    @staticmethod
    def _gpm_counters(
        state: _GpmState,
        answers: dict[int, float],
        counters: dict[tuple[str, str], int],
        rates: dict[tuple[str, str], int],
        seconds: float,
    ) -> None:
        """Bytes and cycles into the GPU's totals: the device's since-reboot counters where it has them, else the
        rates times the interval, summed."""
        found = {key: answers[i] for key, i in counters.items() if i in answers}
        if counters and state.cumulative is None:
            state.cumulative = bool(found)  # a driver without them: stop asking
        state.cycles.update({pipe: v for (kind, pipe), v in found.items() if kind == "cycles"})
        for (where, direction), metric in rates.items():
            total = found.get(("pcie_total", direction) if where == "pcie" else (f"nvlink_total:{where}", direction))
            if where == "pcie":
                if total is not None or metric in answers:
                    summed = state.pcie.get(direction, 0.0) + answers.get(metric, 0.0) * _MIB * seconds
                    state.pcie[direction] = total if total is not None else summed
            elif total is not None or metric in answers:
                summed = state.nvlink.get((where, direction), 0.0) + answers.get(metric, 0.0) * _MIB * seconds
                state.nvlink[(where, direction)] = total if total is not None else summed

    # ----- release -----

    def _free_gpm(self, gpu: _Gpu) -> None:
        """Free the GPU's sample buffers (a GPU that stopped answering starts afresh when it answers again)."""
        state = self._gpm_states().pop(gpu.nvml_index, None)
        for buffer in state.samples if state is not None else ():
            try:
                self._invoke(None, "nvmlGpmSampleFree", (buffer,), {})
            except (Unavailable, BackendUnavailable) as exc:  # a library already gone has nothing left to free
                self.log.debug("nvmlGpmSampleFree: %s", exc)

    def _close_gpm(self) -> None:
        for gpu in self._gpus:
            self._free_gpm(gpu)
        self._gpm_states().clear()
