"""What each GPU of a simulated node does in a scenario: its GpuPlan (workload, fault, onset)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpuwatch.core.scenario_catalogue import FAULT_GPU, SCENARIOS
from gpuwatch.simulated.physics import GpuPlan

# nvml_hang: after the agent's first complete polls, so it starts with every GPU known.
HANG_AFTER_S = 5.0


def plans_for(scenario: str, gpus: int) -> list[GpuPlan]:
    """What each GPU of the node does in a scenario; faults aimed at GPUs the node lacks are dropped."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    # Some idle GPUs sit at PCIe gen 1 to save power (healthy; compare links under load only).
    plans = [GpuPlan(idle_pcie_generation=1 if i % 4 == 3 else None) for i in range(gpus)]
    if gpus == 0:
        return plans
    fault_gpu = min(FAULT_GPU, gpus - 1)

    def put(index: int, **changes: object) -> None:
        if index < gpus:
            plans[index] = replace(plans[index], **changes)  # type: ignore[arg-type]

    if scenario == "busy":
        plans = [replace(p, busy=True) for p in plans]
    elif scenario == "psu_undervoltage":
        plans = [replace(p, busy=True, fault="psu_undervoltage") for p in plans]
    elif scenario == "mixed":
        # Every GPU stays idle (no processes) so the probe, which runs only on an all-idle node, reaches GPU 6;
        # GPU 2's overheating is a cooling failure at idle.
        put(2, fault="overheating")
        put(5, power_limit_watts=500.0)
        put(6, probe_slowdown=0.2)
    elif scenario in ("overheating", "memory_overheating", "thermal_throttling", "power_brake", "pcie_degraded"):
        put(fault_gpu, busy=True, fault=scenario)
    elif scenario == "power_limit_low":
        put(fault_gpu, busy=True, power_limit_watts=450.0)
    elif scenario == "underperforming":
        put(fault_gpu, fault=scenario, probe_slowdown=0.2)
    elif scenario == "corrupt":
        put(fault_gpu, probe_corrupt=SCENARIOS[scenario].probe_corrupt[FAULT_GPU])
    elif scenario == "xid":
        put(fault_gpu, fault=scenario, events=((2.0, 13), (5.0, 79)))
    elif scenario in ("ecc_uncorrectable", "row_remap_failure"):
        # Present from the start: the agent reads memory health in its slow tier (every 30 s), and the first
        # poll, at start, must already show it.
        put(fault_gpu, fault=scenario, onset_s=0.0)
    elif scenario == "training":
        plans = [replace(p, busy=True, work="training") for p in plans]
    elif scenario == "dataloader_starved":
        plans = [replace(p, busy=True, work="training") for p in plans]
        put(fault_gpu, work="dataloader_starved")
    elif scenario == "idle_allocated":
        put(fault_gpu, work="idle_allocated")
    elif scenario == "fabric_degraded":
        put(fault_gpu, fault=scenario, onset_s=0.0)  # the slow tier reads the fabric: present at the first poll
    elif scenario in ("ib_port_down", "ib_flapping"):
        put(fault_gpu, fault=scenario)  # the NIC beside it (gpuwatch/simulated/rdma_ports.py)
    elif scenario == "gpu_lost":
        put(fault_gpu, fault=scenario, lost_after_s=6.0)
    elif scenario == "nvml_hang":
        put(fault_gpu, hang_after_s=HANG_AFTER_S)
    return plans


# Scenarios that cannot be given to one GPU of a node: they are about the whole node or several GPUs.
NODE_ONLY_SCENARIOS = frozenset({"mixed", "backend_down"})


def with_gpu_scenarios(plans: list[GpuPlan], gpu_scenarios: Mapping[int, str]) -> list[GpuPlan]:
    """Give single GPUs a scenario's fault: GPU `i` runs as that scenario's faulted GPU (a node-wide scenario's GPU
    `i`), the rest of the node as in `plans`. Used by simulate-fleet's `--fault NODE/GPU=SCENARIO`."""
    out = list(plans)
    for index, scenario in gpu_scenarios.items():
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r} for GPU {index}; known: {', '.join(SCENARIOS)}")
        if scenario in NODE_ONLY_SCENARIOS:
            raise ValueError(f"scenario {scenario!r} is about a whole node and cannot be given to one GPU")
        if not 0 <= index < len(plans):
            raise ValueError(f"no GPU {index} on a node of {len(plans)} GPUs")
        source = plans_for(scenario, max(len(plans), FAULT_GPU + 1))
        info = SCENARIOS[scenario]
        plan = source[index] if info.node_wide or info.fault_gpu is None else source[FAULT_GPU]
        out[index] = replace(plan, idle_pcie_generation=plans[index].idle_pcie_generation)
    return out
