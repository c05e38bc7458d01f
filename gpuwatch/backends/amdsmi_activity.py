"""Real utilization on AMD GPUs: what amdsmi measures that means the same as the vendor-neutral names.

amdsmi_get_gpu_activity's gfx_activity is how busy the GFX engine is (the meaning of utilization.gpu, already
gpuwatch_gpu_utilization_ratio) and umc_activity the memory controller's busy share (memory_utilization_ratio);
neither counts CU (SM) residency, matrix-core (tensor) cycles or DRAM bandwidth against its peak, so those series
stay NVIDIA-only. gpu_metrics' XGMI counters are per-link bytes, the meaning of NVLink's: they are exported as
gpuwatch_gpu_nvlink_bytes_total. Its pcie_bandwidth_acc sums GB/s readings (ROCm/amdsmi include/amd_smi/amdsmi.h:
"PCIE accumulated bandwidth (GB/sec)"), not bytes moved, so it is not a byte counter and is left out.
"""

from __future__ import annotations

from typing import Any

from gpuwatch.core.model import GpuSample

NO_SM_ACTIVITY = (
    "amdsmi reports how busy the GFX engine is (gfx_activity: gpuwatch_gpu_utilization_ratio), not CU (SM), "
    "matrix-core (tensor) or DRAM-bandwidth activity; XGMI bytes are exported"
)


def read_xgmi_traffic(metrics: dict[str, Any], sample: GpuSample) -> None:
    """Per-link XGMI bytes from gpu_metrics' xgmi_read_data_acc / xgmi_write_data_acc ("XGMI accumulated data
    transfer size (KiloBytes)", ROCm/amdsmi include/amd_smi/amdsmi.h:1576-1578, gpu_metrics v1.4 on), for the
    links the slow tier found up or down; "N/A" (a link the GPU lacks) is skipped."""
    for direction, key in (("rx", "xgmi_read_data_acc"), ("tx", "xgmi_write_data_acc")):
        values = metrics.get(key)
        if not isinstance(values, list):
            continue
        for link in sample.nvlink_up:
            index = int(link)
            if index < len(values) and isinstance(values[index], int) and not isinstance(values[index], bool):
                sample.nvlink_bytes_total[(link, direction)] = float(values[index]) * 1024
