"""The "Real utilization" rows: the fleet view (averages by model) and the node view (per GPU, per pipe).

Both read NVML GPM activity, which only some GPUs measure; they live apart from the dashboards that place them.
"""

from __future__ import annotations

from .board import Board, Q, steps
from .promql import (
    GPU_LEGEND,
    RULE_SM_ACTIVE,
    RULE_SM_WHEN_BUSY,
    RULE_TENSOR_ACTIVE,
    RULE_UTILIZATION,
    with_model,
)


def real_utilization_fleet(b: Board, s: str) -> None:
    """How much of the fleet's silicon works, against what utilization says, and the GPUs busy but barely working."""
    b.row("Real utilization")
    share = steps((None, "text"))
    b.stat(
        "Utilization says (5m)",
        "Mean utilization.gpu of the GPUs that also measure SM activity: the share of time a kernel ran, however "
        "little of the GPU it used.",
        "percentunit",
        [Q(f"avg({RULE_UTILIZATION}{{{s}}})")],
        share,
    )
    b.stat(
        "SM active (5m)",
        "Mean share of SM time with work resident (NVML GPM SM_UTIL), over the GPUs that measure it.",
        "percentunit",
        [Q(f"avg({RULE_SM_ACTIVE}{{{s}}})")],
        share,
    )
    b.stat(
        "Tensor active (5m)",
        "Mean share of time any tensor pipe was active (NVML GPM ANY_TENSOR_UTIL): matrix math, what training buys "
        "GPUs for.",
        "percentunit",
        [Q(f"avg({RULE_TENSOR_ACTIVE}{{{s}}})")],
        share,
    )
    b.stat(
        "Busy but barely working",
        "GPUs with a kernel in flight most of the last 5 minutes (utilization > 50 %) whose SMs worked less than half "
        "of that busy time: starved by their input pipeline, synchronising, or running tiny kernels.",
        "none",
        [Q(f"count({RULE_SM_WHEN_BUSY}{{{s}}} < 0.5 and on(instance, uuid) {RULE_UTILIZATION} > 0.5) or vector(0)")],
        steps((None, "green"), (1, "orange")),
    )
    b.table(
        "Busy but barely working (top $topn)",
        "The busy GPUs (utilization > 50 % over 5 minutes) whose SMs worked less than half of their busy time, the "
        "smallest share first.",
        "percentunit",
        [
            Q(
                f"bottomk($topn, max by (node, instance, gpu, uuid) ({RULE_SM_WHEN_BUSY}{{{s}}} < 0.5 "
                f"and on(instance, uuid) {RULE_UTILIZATION} > 0.5))",
                table=True,
            )
        ],
        columns={"ratio": ("SM active while busy", "percentunit")},
        hide=("Time", "uuid", "instance"),
        cell_thresholds={"SM active while busy": steps((None, "orange"), (0.5, "green"))},
        w=8,
        h=8,
        sort_by="SM active while busy",
    )
    b.timeseries(
        "Utilization against SM and tensor activity, by model",
        "Per GPU model: what utilization says (dashed), against the share of SM time with work and of time a tensor "
        "pipe ran. The gap between the dashed line and the others is time the GPUs were busy but not computing.",
        "percentunit",
        [
            Q(f"avg by (model) ({with_model(f'{RULE_UTILIZATION}{{{s}}}')})", "{{model}} utilization"),
            Q(f"avg by (model) ({with_model(f'{RULE_SM_ACTIVE}{{{s}}}')})", "{{model}} SM active"),
            Q(f"avg by (model) ({with_model(f'{RULE_TENSOR_ACTIVE}{{{s}}}')})", "{{model}} tensor active"),
        ],
        w=16,
        dashed_series=(".* utilization",),
        min_val=0,
        max_val=1,
    )


def real_utilization_node(b: Board, s: str) -> None:
    """Per GPU: SM and tensor activity against utilization, each pipe, DRAM bandwidth, PCIe and NVLink traffic."""
    b.row("Real utilization")
    b.timeseries(
        "SM active against utilization",
        "Share of SM time with work resident (NVML GPM) per GPU; dashed: utilization, the share of time any kernel "
        "ran. A GPU at 100 % utilization with low SM activity is starved, not busy.",
        "percentunit",
        [
            Q(
                f"max by (gpu) (rate(gpuwatch_gpu_sm_active_seconds_total{{{s}}}[$__rate_interval]))",
                GPU_LEGEND + " SM active",
            ),
            Q(f"max by (gpu) (gpuwatch_gpu_utilization_ratio{{{s}}})", GPU_LEGEND + " utilization"),
        ],
        dashed_series=(".* utilization",),
        min_val=0,
        max_val=1,
    )
    b.timeseries(
        "Tensor active",
        "Share of time any tensor pipe ran per GPU (rate of gpuwatch_gpu_tensor_active_seconds_total).",
        "percentunit",
        [
            Q(
                f"max by (gpu) (rate(gpuwatch_gpu_tensor_active_seconds_total{{{s}}}[$__rate_interval]))",
                GPU_LEGEND,
            )
        ],
        min_val=0,
        max_val=1,
    )
    b.timeseries(
        "Pipes at work",
        "Share of time each SM pipe ran, per GPU, for the pipes that did: hmma (FP16/BF16 tensor), imma (integer "
        "tensor), dmma and dfma (FP64 tensor), fp64, fp32, fp16, integer. Served where the agent's [nvml] "
        "gpm_per_pipe (or [compat] dcgm) asks for them.",
        "percentunit",
        [Q(f"max by (gpu, pipe) (gpuwatch_gpu_pipe_active_ratio{{{s}}}) > 0", GPU_LEGEND + " {{pipe}}")],
        min_val=0,
    )
    b.timeseries(
        "DRAM bandwidth used",
        "DRAM bandwidth used as a share of its peak, per GPU (NVML GPM DRAM_BW_UTIL); also SM occupancy, dashed: "
        "resident warps as a share of the maximum.",
        "percentunit",
        [
            Q(f"max by (gpu) (gpuwatch_gpu_dram_active_ratio{{{s}}})", GPU_LEGEND),
            Q(f"max by (gpu) (gpuwatch_gpu_sm_occupancy_ratio{{{s}}})", GPU_LEGEND + " occupancy"),
        ],
        dashed_series=(".* occupancy",),
        min_val=0,
        max_val=1,
    )
    b.timeseries(
        "PCIe traffic",
        "Bytes per second over PCIe per GPU: rx into the GPU, tx out of it.",
        "Bps",
        [
            Q(
                f"max by (gpu, direction) (rate(gpuwatch_gpu_pcie_bytes_total{{{s}}}[$__rate_interval]))",
                GPU_LEGEND + " {{direction}}",
            )
        ],
        min_val=0,
    )
    b.timeseries(
        "NVLink / XGMI traffic",
        "Bytes per second over all of a GPU's NVLink (XGMI on AMD) links, by direction.",
        "Bps",
        [
            Q(
                f"sum by (gpu, direction) (rate(gpuwatch_gpu_nvlinks_bytes_total{{{s}}}[$__rate_interval]))",
                GPU_LEGEND + " {{direction}}",
            )
        ],
        min_val=0,
    )
