"""The NVML backend's MIG tier: a MIG-enabled GPU's MIG devices (its GPU and compute instances), found on slow polls
and their memory read on every poll. Only reads: the agent never creates or destroys an instance.

nvml.h (13.3.29, as NVIDIA/go-nvml's gen/nvml/nvml.h transcribes it) is the reference:
- nvmlDeviceGetMaxMigDeviceCount (lines 13398-13414) bounds the indices, "zero if MIG is not supported or enabled";
- nvmlDeviceGetMigDeviceHandleByIndex (lines 13417-13441) answers NotFound "if no valid MIG device was found at
  index", so an index is skipped, not taken as the end;
- a MIG device handle "can be used (with some restrictions) interchangeably with a GPU device handle" (line 13337):
  nvmlDeviceGetUUID (MIG-…), nvmlDeviceGetName ("<GPU name> MIG 3g.40gb"), nvmlDeviceGetGpuInstanceId and
  nvmlDeviceGetComputeInstanceId (lines 13357-13395) and nvmlDeviceGetMemoryInfo answer for the instance;
- a destroyed instance's handle answers InvalidArgument: its memory reads as unknown until the next slow poll drops it.
A call that fails on one MIG device costs that device's reading, never the GPU's sample.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwatch.backends.nvml_slow import NvmlSlowTier, _Gpu
from gpuwatch.backends.nvml_tables import _text
from gpuwatch.core.model import GpuSample, MigDevice

# nvmlProcessInfo_v2_t's gpuInstanceId and computeInstanceId "set to 0xFFFFFFFF" where MIG is not enabled (nvml.h,
# struct nvmlProcessInfo_v2_st).
_NOT_IN_AN_INSTANCE = 0xFFFFFFFF


class NvmlMigTier(NvmlSlowTier):
    """MIG devices through the choke point; calls on a MIG device's own handle go without the GPU's (gpu=None), so
    their errors are that device's."""

    def _read_slow(self, gpu: _Gpu, sample: GpuSample, fields: dict[int, float | None]) -> None:
        super()._read_slow(gpu, sample, fields)
        gpu.mig = self._mig_devices(gpu) if sample.mig_enabled else ()
        sample.mig_devices = tuple(device for _handle, device in gpu.mig)

    def _mig_devices(self, gpu: _Gpu) -> tuple[tuple[Any, MigDevice], ...]:
        """(handle, identity) of each MIG device, in GPU then compute instance ID order."""
        found = []
        for index in range(int(self._call(gpu, "nvmlDeviceGetMaxMigDeviceCount") or 0)):
            handle = self._call(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", index)
            if handle is None:
                continue
            gi = self._call(None, "nvmlDeviceGetGpuInstanceId", handle)
            ci = self._call(None, "nvmlDeviceGetComputeInstanceId", handle)
            if gi is None or ci is None:
                continue  # destroyed between the two calls
            name = _text(self._call(None, "nvmlDeviceGetName", handle))
            uuid = _text(self._call(None, "nvmlDeviceGetUUID", handle))
            found.append(
                (handle, MigDevice(uuid, int(gi), int(ci), name.rpartition(" MIG ")[2] if " MIG " in name else ""))
            )
        return tuple(sorted(found, key=lambda item: (item[1].gpu_instance_id, item[1].compute_instance_id)))

    def _read_mig_fast(self, gpu: _Gpu, sample: GpuSample) -> None:
        """Each MIG device's memory, every poll (the processes' GPU instances come with the GPU's own process list,
        nvml.py's _read_usage)."""
        if gpu.mig:
            devices = []
            for handle, device in gpu.mig:
                memory = self._call(None, "nvmlDeviceGetMemoryInfo", handle)
                if memory is not None:
                    device = replace(device, memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total))
                devices.append(device)
            sample.mig_devices = tuple(devices)

    @staticmethod
    def _process_instances(processes: Any) -> dict[int, int]:
        """PID -> GPU instance ID for the processes running in a MIG instance."""
        found = {}
        for process in processes:
            instance = getattr(process, "gpuInstanceId", None)
            if instance is not None and int(instance) != _NOT_IN_AN_INSTANCE:
                found[int(process.pid)] = int(instance)
        return found
