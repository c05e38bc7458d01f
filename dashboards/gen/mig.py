"""The node dashboard's "MIG instances" row (docs/mig.md): each MIG instance of the node's MIG-enabled GPUs, its
memory and its activity, and whose job runs in it.

Compute instances of one GPU instance share its memory and its GPM samples, so the panels take one value per GPU
instance (`max by (gpu, gpu_instance_id, ...)`), never a sum over its compute instances. A node without MIG has no
gpuwatch_mig_* series: the row stays empty there.
"""

from __future__ import annotations

from .board import Board, Q

INSTANCE = "gpu, gpu_instance_id, mig_profile"
INSTANCE_LEGEND = "GPU {{gpu}} GI {{gpu_instance_id}} {{mig_profile}}"
# One MIG device: its parent GPU (within its agent) and its instance IDs.
DEVICE_JOIN = "instance, uuid, gpu_instance_id, compute_instance_id"


def mig_instances_node(b: Board, s: str) -> None:
    b.row("MIG instances")
    b.table(
        "MIG instances",
        "Each MIG device of the node's MIG-enabled GPUs (gpuwatch_mig_device_info): its GPU, GPU and compute instance "
        "IDs, profile as nvidia-smi names it, MIG UUID, and its GPU instance's memory in use.",
        "none",
        [
            Q(
                "max by (gpu, gpu_instance_id, compute_instance_id, mig_profile, mig_uuid) "
                f"(gpuwatch_mig_device_info{{{s}}})",
                table=True,
            ),
            Q(
                "max by (gpu, gpu_instance_id, compute_instance_id, mig_profile, mig_uuid) "
                f"(gpuwatch_mig_memory_used_bytes{{{s}}} / gpuwatch_mig_memory_total_bytes{{{s}}}"
                f" * on({DEVICE_JOIN}) group_left(mig_uuid) gpuwatch_mig_device_info{{{s}}})",
                table=True,
            ),
        ],
        columns={"device": ("Device", "none"), "memory": ("Memory used", "percentunit")},
        hide=("Time", "Value #A"),  # the info series' 1
        w=12,
        h=8,
        sort_by="gpu",
    )
    b.table(
        "Jobs per instance",
        "The workloads whose processes run in each MIG GPU instance (gpuwatch_gpu_workload_info's gpu_instance_id), "
        "and the memory they hold there.",
        "bytes",
        [
            Q(
                "max by (gpu, gpu_instance_id, kind, id) "
                f'(gpuwatch_gpu_workload_memory_bytes{{{s}, gpu_instance_id!=""}})',
                table=True,
            ),
        ],
        columns={"memory": ("Memory held", "bytes")},
        hide=("Time",),
        w=12,
        h=8,
        sort_by="gpu",
    )
    b.timeseries(
        "Memory per instance",
        "Memory in use in each GPU instance; dashed: the instance's memory. Compute instances of one GPU instance "
        "share it.",
        "bytes",
        [
            Q(f"max by ({INSTANCE}) (gpuwatch_mig_memory_used_bytes{{{s}}})", INSTANCE_LEGEND),
            Q(f"max by ({INSTANCE}) (gpuwatch_mig_memory_total_bytes{{{s}}})", INSTANCE_LEGEND + " total"),
        ],
        dashed_series=(".* total",),
        min_val=0,
    )
    b.timeseries(
        "SM activity per instance",
        "Share of each GPU instance's SM time with work resident, over the last poll interval (NVML GPM SM_UTIL "
        "through nvmlGpmMigSampleGet; Hopper and newer). NVML gives a MIG-enabled GPU no utilization: this is it.",
        "percentunit",
        [Q(f"max by ({INSTANCE}) (gpuwatch_mig_sm_active_ratio{{{s}}})", INSTANCE_LEGEND)],
        min_val=0,
        max_val=1,
    )
    b.timeseries(
        "Tensor and DRAM activity per instance",
        "Share of time any tensor pipe of each GPU instance ran (NVML GPM ANY_TENSOR_UTIL), and dashed its DRAM "
        "bandwidth as a share of the peak (DRAM_BW_UTIL).",
        "percentunit",
        [
            Q(f"max by ({INSTANCE}) (gpuwatch_mig_tensor_active_ratio{{{s}}})", INSTANCE_LEGEND + " tensor"),
            Q(f"max by ({INSTANCE}) (gpuwatch_mig_dram_active_ratio{{{s}}})", INSTANCE_LEGEND + " DRAM"),
        ],
        dashed_series=(".* DRAM",),
        min_val=0,
        max_val=1,
        w=24,
    )
