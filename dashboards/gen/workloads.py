"""The workloads dashboard (gpuwatch-workloads.json): whose job holds each GPU, and what it does with it."""

from __future__ import annotations

from typing import Any

from .board import Board, Q, ds_variable, node_link, query_variable, steps

WORK_SEL = 'node=~"$node", kind=~"$kind"'
WORKLOAD = "kind, id, user"
# GPU-hours and joules over the dashboard's range: a 1-minute subquery, divided by its own number of steps (60 or 61
# per hour: Prometheus 3 made subquery ranges left-open) and scaled to the range, as the recording rules do.
RANGE_HOURS = "/ scalar(count_over_time(vector(1)[$__range:1m])) * $__range_s / 3600"


def workloads() -> dict[str, Any]:
    b = Board(
        "gpuwatch / Workloads",
        "gpuwatch-workloads",
        "Whose job runs on each GPU (docs/workloads.md): Slurm jobs, Kubernetes pods, containers, systemd units and "
        "processes; the GPUs, memory, power and energy each holds, how busy it keeps them, and GPUs held but idle.",
    )
    s = WORK_SEL
    b.row("Now")
    b.stat(
        "GPUs held",
        "GPUs with at least one compute process (gpuwatch_gpu_workload_info).",
        "none",
        [Q(f"count(group by (instance, uuid) (gpuwatch_gpu_workload_info{{{s}}})) or vector(0)")],
        steps((None, "green")),
    )
    b.stat(
        "Workloads",
        "Distinct workloads (kind and id) holding GPUs.",
        "none",
        [Q(f"count(group by (kind, id) (gpuwatch_gpu_workload_info{{{s}}})) or vector(0)")],
        steps((None, "green")),
    )
    b.stat(
        "Allocated but idle (1 h)",
        "GPUs a workload has held for the last hour with SM activity below 5 % all along (gpuwatch:gpu_allocated_idle;"
        " the opt-in alert GpuAllocatedButIdle).",
        "none",
        [Q(f"count(gpuwatch:gpu_allocated_idle{{{s}}}) or vector(0)")],
        steps((None, "green"), (1, "orange")),
    )
    b.table(
        "Workloads: GPUs, memory, power, GPU-hours and energy over the range",
        "One row per workload. GPUs: a GPU shared by n workloads counts 1/n for each. GPU-hours and energy: over the "
        "dashboard's time range, sampled each minute (gpuwatch-workloads recording rules).",
        "none",
        [
            Q(f"sum by ({WORKLOAD}) (gpuwatch:gpu_workload:share{{{s}}})", table=True),
            Q(
                f"sum by ({WORKLOAD}) (gpuwatch_gpu_workload_memory_bytes{{{s}}}"
                " * on(instance, uuid, kind, id, gpu_instance_id) group_left(user) gpuwatch_gpu_workload_info)",
                table=True,
            ),
            Q(f"sum by ({WORKLOAD}) (gpuwatch:gpu_workload:power_watts{{{s}}})", table=True),
            Q(
                f"sum by ({WORKLOAD}) (sum_over_time(gpuwatch:gpu_workload:share{{{s}}}[$__range:1m])) {RANGE_HOURS}",
                table=True,
            ),
            Q(
                f"sum by ({WORKLOAD}) (sum_over_time(gpuwatch:gpu_workload:power_watts{{{s}}}[$__range:1m]))"
                f" {RANGE_HOURS} * 3600",
                table=True,
            ),
        ],
        columns={
            "gpus": ("GPUs", "none"),
            "memory": ("GPU memory", "bytes"),
            "power": ("Power", "watt"),
            "hours": ("GPU-hours", "none"),
            "energy": ("Energy", "joule"),
        },
        sort_by="GPUs",
        desc_sort=True,
    )
    b.row("Activity (NVML GPM, AMD SMI activity)")
    b.timeseries(
        "Tensor activity by workload",
        "Mean tensor-core activity over the GPUs each workload holds (gpuwatch:workload_tensor_active_ratio:mean): "
        "a job at 100 % utilization and 10 % tensor activity spends its GPUs on something else.",
        "percentunit",
        [Q('gpuwatch:workload_tensor_active_ratio:mean{kind=~"$kind"}', "{{kind}} {{id}}")],
        min_val=0,
        max_val=1,
    )
    b.timeseries(
        "SM activity of held GPUs",
        "Each held GPU's SM activity (0-1, last 5 minutes), with the workload holding it.",
        "percentunit",
        [
            Q(
                f"max by (node, gpu, kind, id) (gpuwatch:gpu_workload:sm_active_ratio{{{s}}}"
                f" / gpuwatch:gpu_workload:share{{{s}}})",
                "{{node}} GPU {{gpu}} {{kind}} {{id}}",
            )
        ],
        thresholds=steps((None, "orange"), (0.05, "green")),
        min_val=0,
        max_val=1,
    )
    b.table(
        "GPUs allocated but idle for an hour",
        "GPUs a workload has held at every minute of the last hour whose SM activity stayed below "
        "gpuwatch:threshold:allocated_idle_sm_active_ratio (5 %) the whole hour.",
        "none",
        [Q(f"gpuwatch:gpu_allocated_idle{{{s}}}", table=True)],
        hide=("Time", "__name__", "job", "instance", "Value"),
        h=6,
    )
    b.row("Over time")
    b.timeseries(
        "GPUs held by workload",
        "GPUs each workload holds (a shared GPU counts 1/n for each of its n workloads).",
        "none",
        [Q(f"sum by (kind, id) (gpuwatch:gpu_workload:share{{{s}}})", "{{kind}} {{id}}")],
        stack=True,
    )
    b.timeseries(
        "GPU memory by workload",
        "GPU memory each workload's processes hold, where the vendor reports it per process.",
        "bytes",
        [Q(f"sum by (kind, id) (gpuwatch_gpu_workload_memory_bytes{{{s}}})", "{{kind}} {{id}}")],
        stack=True,
    )
    b.timeseries(
        "Power by workload",
        "Board power attributed to each workload (gpuwatch_gpu_energy_joules_total's rate, split among a GPU's "
        "workloads).",
        "watt",
        [Q(f"sum by (kind, id) (gpuwatch:gpu_workload:power_watts{{{s}}})", "{{kind}} {{id}}")],
        stack=True,
    )
    b.table(
        "GPUs and their workloads",
        "One row per GPU and workload holding it: kind, id (job id, pod UID, runtime://container id, unit, command) "
        "and user. Join the pod UID to kube-state-metrics' kube_pod_info{uid} for names (docs/workloads.md).",
        "none",
        [Q(f"max by (node, gpu, uuid, kind, id, user) (gpuwatch_gpu_workload_info{{{s}}})", table=True)],
        hide=("Time", "Value"),
    )
    variables = [
        ds_variable(),
        query_variable("node", "Node", "label_values(gpuwatch_gpu_info, node)", multi=True, include_all=True),
        query_variable("kind", "Kind", "label_values(gpuwatch_gpu_workload_info, kind)", multi=True, include_all=True),
    ]
    return b.build(variables, [node_link("Other gpuwatch dashboards")])
