"""GPM per MIG instance: the SM, tensor and DRAM activity of each GPU instance of a MIG-enabled GPU, read every poll.

A MIG-enabled GPU's utilization is not answered by NVML, and its whole-GPU GPM says nothing of which instance is
busy. nvml.h 13.3 (NVIDIA/go-nvml gen/nvml/nvml.h at 8b8585b, lines 13925-13943) has nvmlGpmMigSampleGet(device,
gpuInstanceId, sample): "a sample of GPM metrics ... for a MIG GPU Instance", taken through the parent GPU's handle,
read back with nvmlGpmMetricsGet like the GPU's own samples, and "the interval between two nvmlGpmMigSampleGet()
calls should be greater than 100ms". So each GPU instance gets two sample buffers of its own, as the GPU does in
nvml_gpm.py: a sample each poll, the shares of the interval between the last two. Compute instances of one GPU
instance share its samples and its shares, as they share its memory. An instance is known by its GPU instance ID and
the UUID of its first MIG device (a destroyed instance's ID is reused by the next one created, its UUID never), and
its buffers are freed when the slow poll no longer finds it, when MIG is disabled, when the GPU stops answering and
when the backend closes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.nvml_gpm import _GIVE_UP, SAMPLE_FLOOR_SECONDS, NvmlGpmTier
from gpuwatch.backends.nvml_slow import _Gpu
from gpuwatch.backends.tiered import Unavailable
from gpuwatch.core.model import GpuSample, MigDevice

# nvmlGpmMetricId_t: SM_UTIL, ANY_TENSOR_UTIL, DRAM_BW_UTIL (percent over the interval between the two samples).
_INSTANCE_SHARES: dict[int, str] = {2: "sm_active", 5: "tensor_active", 10: "dram_active"}
_INSTANCE_IDS = tuple(_INSTANCE_SHARES)


@dataclass
class _InstanceGpm:
    """One GPU instance's GPM between polls: its two sample buffers and the last measured interval's shares."""

    samples: list[Any]  # [previous, spare]
    previous_at: float | None = None  # when samples[0] was taken
    shares: dict[str, float] = field(default_factory=dict)


@dataclass
class _GpuMigGpm:
    """A GPU's instances' GPM: (GPU instance ID, first MIG device's UUID) -> its state; or why the GPU has none."""

    driver: str
    instances: dict[tuple[int, str], _InstanceGpm] = field(default_factory=dict)
    refused: str = ""  # nvmlGpmMigSampleGet answered that it never will (until the driver changes)


class NvmlMigGpmTier(NvmlGpmTier):
    """nvmlGpmMigSampleGet through the backend's choke point, after each poll's MIG memory (`_read_mig_fast`)."""

    def __init__(self, lib: Any, clock: Callable[[], float]) -> None:
        super().__init__(lib, clock)
        self._mig_gpm: dict[int, _GpuMigGpm] = {}  # NVML GPU index -> its instances' GPM

    def _read_mig_fast(self, gpu: _Gpu, sample: GpuSample) -> None:
        super()._read_mig_fast(gpu, sample)
        self._read_mig_gpm(gpu, sample)

    def _read_mig_gpm(self, gpu: _Gpu, sample: GpuSample) -> None:
        """Each GPU instance's shares into its MIG devices; the buffers of instances gone freed."""
        state = self._mig_gpm_state(gpu)
        if state is None:
            return
        first_of: dict[int, str] = {}  # GPU instance ID -> its lowest compute instance's UUID
        for device in sample.mig_devices:
            first_of.setdefault(device.gpu_instance_id, device.uuid)
        wanted = set(first_of.items())
        for key in [key for key in state.instances if key not in wanted]:
            self._free_samples(state.instances.pop(key).samples)
        if state.refused or not wanted:
            return
        shares: dict[int, dict[str, float]] = {}
        for gi, uuid in sorted(wanted):
            instance = state.instances.get((gi, uuid))
            if instance is None:
                instance = self._new_instance(state, gi, uuid)
            if instance is not None and self._sample_instance(gpu, state, gi, instance):
                shares[gi] = instance.shares
            if state.refused:
                return
        sample.mig_devices = tuple(
            _with_shares(device, shares.get(device.gpu_instance_id, {})) for device in sample.mig_devices
        )

    def _mig_gpm_state(self, gpu: _Gpu) -> _GpuMigGpm | None:
        """The GPU's instances' state, started afresh after a driver change; None (all freed) without MIG devices."""
        states = self._mig_gpm
        state = states.get(gpu.nvml_index)
        if state is not None and (state.driver != self._driver or not gpu.mig):
            self._free_mig_gpm(gpu)
            state = None
        if not gpu.mig:
            return None
        if state is None:
            state = states[gpu.nvml_index] = _GpuMigGpm(self._driver, refused=self._mig_gpm_refused(gpu))
            if state.refused:
                self.log.info("GPU %s: no GPM per MIG instance: %s", gpu.identity.index, state.refused)
        return state

    def _mig_gpm_refused(self, gpu: _Gpu) -> str:
        """Why this GPU can have no GPM per instance (asked once per driver, before any buffer is allocated)."""
        if not hasattr(self._lib, "nvmlGpmMigSampleGet"):
            return "this nvidia-ml-py has no nvmlGpmMigSampleGet: pip install -U nvidia-ml-py"
        support = self._call(gpu, "nvmlGpmQueryDeviceSupport")
        if support is None or not support.isSupportedDevice:
            return "NVML GPM is not supported on this GPU (it needs Hopper or newer: compute capability 9.0+)"
        return ""

    def _new_instance(self, state: _GpuMigGpm, gi: int, uuid: str) -> _InstanceGpm | None:
        buffers: list[Any] = []
        for _ in range(2):
            buffer = self._call(None, "nvmlGpmSampleAlloc")
            if buffer is None:
                self._free_samples(buffers)
                return None  # allocated again next poll
            buffers.append(buffer)
        instance = state.instances[(gi, uuid)] = _InstanceGpm(buffers)
        return instance

    def _sample_instance(self, gpu: _Gpu, state: _GpuMigGpm, gi: int, instance: _InstanceGpm) -> bool:
        """A sample of GPU instance `gi`, and the shares of the interval since its last (kept below the floor);
        False when it could not be sampled: no shares this poll, rather than the last interval's."""
        now = self._clock()
        if instance.previous_at is not None and now - instance.previous_at <= SAMPLE_FLOOR_SECONDS:
            return True
        previous, current = instance.samples
        try:
            self._invoke(gpu, "nvmlGpmMigSampleGet", (gi, current), {})
        except Unavailable as exc:
            if exc.code in _GIVE_UP:  # NotSupported (before Hopper), NoPermission: stop asking until a driver change
                state.refused = f"nvmlGpmMigSampleGet: {exc}: {_GIVE_UP[exc.code]}"
                self.log.info("GPU %s: no GPM per MIG instance: %s", gpu.identity.index, state.refused)
                for key in list(state.instances):
                    self._free_samples(state.instances.pop(key).samples)
            return False  # anything else (an instance destroyed since the slow poll): asked again next poll
        if instance.previous_at is not None:
            answers = self._metrics_get(previous, current, _INSTANCE_IDS)
            instance.shares = (
                {}
                if answers is None
                else {
                    name: min(1.0, max(0.0, answers[i] / 100)) for i, name in _INSTANCE_SHARES.items() if i in answers
                }
            )
        instance.samples, instance.previous_at = [current, previous], now
        return True

    # ----- release -----

    def _free_samples(self, buffers: list[Any]) -> None:
        for buffer in buffers:
            try:
                self._invoke(None, "nvmlGpmSampleFree", (buffer,), {})
            except (Unavailable, BackendUnavailable) as exc:  # a library already gone has nothing left to free
                self.log.debug("nvmlGpmSampleFree: %s", exc)

    def _free_mig_gpm(self, gpu: _Gpu) -> None:
        state = self._mig_gpm.pop(gpu.nvml_index, None)
        for instance in state.instances.values() if state is not None else ():
            self._free_samples(instance.samples)

    def _free_gpm(self, gpu: _Gpu) -> None:
        """The GPU's samples and its instances' (a GPU that stopped answering starts afresh when it answers again)."""
        super()._free_gpm(gpu)
        self._free_mig_gpm(gpu)

    def _close_gpm(self) -> None:
        super()._close_gpm()
        for gpu in self._gpus:
            self._free_mig_gpm(gpu)
        self._mig_gpm.clear()


def _with_shares(device: MigDevice, shares: dict[str, float]) -> MigDevice:
    return replace(
        device,
        sm_active_ratio=shares.get("sm_active"),
        tensor_active_ratio=shares.get("tensor_active"),
        dram_active_ratio=shares.get("dram_active"),
    )
