"""The simulator's scenarios as data: names, what each does, which GPU shows the fault.

Below the configuration so `[simulated] scenario` is validated against the one list, without importing the
simulator (gpuwatch/simulated/scenarios.py implements each scenario over time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FAULT_GPU", "SCENARIOS", "ScenarioInfo"]

FAULT_GPU = 2  # the GPU every single-GPU scenario breaks (clamped to the last GPU on smaller nodes)


@dataclass(frozen=True, slots=True)
class ScenarioInfo:
    """What a scenario does, as data: `--help` and the docs print it, tests assert against it."""

    name: str
    description: str
    fault_gpu: int | None  # the GPU that shows the fault; None for node-wide scenarios and for `mixed`
    node_wide: bool = False
    gpu_faults: dict[int, str] = field(default_factory=dict)  # GPU -> what is wrong with it
    probe_slowdown: dict[int, float] = field(default_factory=dict)  # GPU -> share of probe throughput lost
    probe_corrupt: dict[int, int] = field(default_factory=dict)  # GPU -> elements its probe's matmul gets wrong


def _single(name: str, description: str) -> ScenarioInfo:
    return ScenarioInfo(name, description, FAULT_GPU, gpu_faults={FAULT_GPU: description})


SCENARIOS: dict[str, ScenarioInfo] = {
    s.name: s
    for s in (
        ScenarioInfo("healthy", "every GPU idle and healthy", None),
        ScenarioInfo(
            "mixed",
            "the demo node: GPU 2 overheats (cooling failure), GPU 5 runs with its power limit at 500 W of "
            "700 W, GPU 6 probes 20 % slow; the others are idle and healthy",
            None,
            gpu_faults={
                2: "overheats: core temperature climbs past its slowdown threshold, hardware thermal slowdown",
                5: "enforced power limit 500 W, below the 700 W default",
                6: "computes 20 % slower than its baseline in the probe (telemetry healthy)",
            },
            probe_slowdown={6: 0.2},
        ),
        ScenarioInfo("busy", "every GPU under full load at its power cap (sw_power_cap active): healthy", None, True),
        ScenarioInfo(
            "mig",
            "GPU 2 runs in MIG mode, split into a 3g.40gb and two 2g.20gb instances, a training job in the "
            "3g.40gb: healthy, every instance watched (the probe skips the MIG GPU)",
            FAULT_GPU,
            gpu_faults={FAULT_GPU: "MIG mode: a 3g.40gb and two 2g.20gb instances, a job in the 3g.40gb (not a fault)"},
        ),
        _single(
            "overheating",
            "core temperature climbs past the slowdown threshold (89 °C) within ~8 s; "
            "hardware and software thermal slowdown active",
        ),
        _single("memory_overheating", "HBM temperature climbs to 92-97 °C, around its 95 °C limit, within ~9 s"),
        _single(
            "thermal_throttling",
            "software thermal slowdown 70 % of the time at 85-88 °C, never reaching the slowdown threshold",
        ),
        _single(
            "fabric_degraded",
            "an NVSwitch (HGX) node: the GPU's NVLink fabric reports degraded bandwidth and limited capacity "
            "(nvmlGpuFabricInfo_v3 health mask and summary) from the start; its links stay up",
        ),
        _single(
            "ib_port_down",
            "an HGX node with a ConnectX-7 InfiniBand NIC per GPU: the NIC beside the GPU loses its link at 1 s "
            "(port DOWN, physical state Polling) and stays down",
        ),
        _single(
            "ib_flapping",
            "an HGX node with a ConnectX-7 InfiniBand NIC per GPU: the NIC beside the GPU drops its link for 2 s "
            "every 20 s from 1 s on (link_downed and link_error_recovery grow, symbol errors with each retraining)",
        ),
        _single("power_brake", "the hardware power brake holds the clocks down (hw_power_brake) from 1 s"),
        _single("power_limit_low", "enforced power limit 450 W, below the 700 W default, under load"),
        ScenarioInfo(
            "psu_undervoltage",
            "every GPU power-braking (hw_power_brake + hw_slowdown, clocks cut, power source undersized) "
            "from 1 s, as when a power supply sags",
            None,
            True,
        ),
        ScenarioInfo(
            "underperforming",
            "GPU 2 probes 20 % slow; its telemetry is healthy",
            FAULT_GPU,
            gpu_faults={FAULT_GPU: "computes 20 % slower than its baseline in the probe"},
            probe_slowdown={FAULT_GPU: 0.2},
        ),
        ScenarioInfo(
            "corrupt",
            "GPU 2's matmul results are wrong in a few elements (silent data corruption); its telemetry and its "
            "speed are healthy: only the probe's checked result shows it",
            FAULT_GPU,
            gpu_faults={FAULT_GPU: "computes wrong results: 3 elements of each probe's matmul are corrupted"},
            probe_corrupt={FAULT_GPU: 3},
        ),
        _single(
            "pcie_degraded", "under load on a PCIe gen 3 x8 link of gen 5 x16, replays and link recoveries growing"
        ),
        _single("xid", "XID 13 (an application error, harmless) at 2 s, then XID 79 (fallen off the bus) at 5 s"),
        _single("ecc_uncorrectable", "uncorrectable ECC errors from the start, one more every 5 s"),
        ScenarioInfo(
            "training",
            "every GPU trains a model: utilization 100 %, SM active ~0.94, tensor pipes (HMMA) active ~0.8, "
            "at its power cap",
            None,
            True,
        ),
        ScenarioInfo(
            "dataloader_starved",
            "the others train; GPU 2 waits on its input pipeline: utilization 100 % (a kernel always in flight) "
            "but SM active ~0.13 and tensor ~0.05, far below its power cap",
            FAULT_GPU,
            gpu_faults={FAULT_GPU: "utilization 100 % while SM active is ~0.13: starved of input"},
        ),
        _single("idle_allocated", "a process holds 72 GiB of GPU memory and runs nothing: SM active 0, utilization 0"),
        _single("row_remap_failure", "a row remap failed, one pending, from the start; driver asks for a GPU reset"),
        _single("gpu_lost", "the GPU stops answering (GPU is lost) at 6 s; it stays on the PCI bus"),
        _single(
            "nvml_hang",
            "from 5 s a vendor library call on the GPU (its temperature) never returns: the poll hangs in the driver",
        ),
        ScenarioInfo("backend_down", "the vendor library is missing: init fails (NVML LibraryNotFound)", None, True),
    )
}
