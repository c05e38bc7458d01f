"""PromQL pieces every dashboard shares: label selectors, legends, recording-rule names and the model join.

Kept in one place so that a query on any dashboard joins and names things the way the recording rules of
deploy/prometheus/gpuwatch-rules.yml do.
"""

from __future__ import annotations

# Throttle reasons that are normal (an idle GPU, a loaded GPU at its power cap, NVML's low-utilization policy time,
# which an idle GPU accrues all the time): the fleet view shows the others.
BENIGN_REASONS = "gpu_idle|low_utilization|sw_power_cap|applications_clocks|display_clock|sync_boost"

# Recording rules of deploy/prometheus/gpuwatch-rules.yml: fresh probe results only (older ones count for nothing),
# each series keeping the agent's labels plus model, dtype and engine. Joins are `on(instance, uuid)`, as in the rules.
RULE_RATIO_TO_BASELINE = "gpuwatch:probe_ratio_to_baseline:fresh"
RULE_RATIO_TO_FLEET = "gpuwatch:probe_flops:ratio_to_fleet_median"
RULE_FLEET_MEDIAN = "gpuwatch:probe_flops:fleet_median"

FLEET_SEL = 'node=~"$node"'
NODE_SEL = 'node=~"$node", gpu=~"$gpu"'
HOST_SEL = 'node=~"$node"'
GPU_LEGEND = "GPU {{gpu}}"
FLEET_LEGEND = "{{node}} GPU {{gpu}}"

# Real utilization (docs/reading-the-metrics.md): recording rules of the group gpuwatch-utilization. Only GPUs that
# measure SM activity (NVIDIA Hopper and newer) have these series; fleet figures average over them alone.
RULE_SM_ACTIVE = "gpuwatch:gpu_sm_active:ratio_rate5m"
RULE_TENSOR_ACTIVE = "gpuwatch:gpu_tensor_active:ratio_rate5m"
RULE_UTILIZATION = "gpuwatch:gpu_utilization:ratio_avg5m"
RULE_SM_WHEN_BUSY = "gpuwatch:gpu_sm_active_when_busy:ratio_avg5m"


def with_model(expr: str) -> str:
    """Attach the GPU model from the info metric, joined on uuid: identity strings live only there.

    The expression is parenthesized (`*` binds tighter than `-` or `/`), and the info side reduced to one series per
    GPU: two info series of one GPU (a driver upgrade) would otherwise be a many-to-many error."""
    return (
        f"({expr}) * on(instance, uuid) group_left(model) "
        "topk by (instance, uuid) (1, group by (instance, uuid, model) (gpuwatch_gpu_info))"
    )


def per_gpu(expr: str) -> str:
    """One value per GPU with the table's join labels (node, gpu, uuid, model)."""
    return f"max by (node, instance, gpu, uuid, model) ({with_model(expr)})"
