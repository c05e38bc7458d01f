"""The node detail dashboard (gpuwatch-node.json): one node's GPUs and host power delivery over time."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models import dashboard as dm

from gpuwatch.core.thresholds import threshold

from .board import ON_OFF, Board, Q, ds_variable, node_link, query_variable, steps
from .mig import mig_instances_node
from .promql import (
    GPU_LEGEND,
    HOST_SEL,
    NODE_SEL,
    RULE_FLEET_MEDIAN,
    RULE_RATIO_TO_BASELINE,
    RULE_RATIO_TO_FLEET,
)
from .utilization import real_utilization_node


def node_detail() -> dict[str, Any]:
    b = Board(
        "gpuwatch / Node detail",
        "gpuwatch-node",
        "One node's GPUs over time: temperatures, clocks and power against their limits, throttling and why, probe "
        "throughput against baseline, errors, and the host's power delivery.",
    )
    s = NODE_SEL
    b.row("Overview")
    b.stat(
        "GPUs up",
        "GPUs of this node whose last poll succeeded and is fresh.",
        "none",
        [Q(f"count(gpuwatch_gpu_up{{{s}}} == 1) or vector(0)")],
        steps((None, "green")),
    )
    b.stat(
        "GPUs lost",
        "Known GPUs of this node that stopped answering (gpuwatch_gpu_up == 0).",
        "none",
        [Q(f"count(gpuwatch_gpu_up{{{s}}} == 0) or vector(0)")],
        steps((None, "green"), (1, "red")),
    )
    b.stat(
        "Detected / expected",
        "GPUs the vendor libraries see, against those the node should have.",
        "percentunit",
        [Q(f"sum(gpuwatch_gpus_detected{{{HOST_SEL}}}) / sum(gpuwatch_gpus_expected{{{HOST_SEL}}})")],
        steps((None, "red"), (1, "green")),
    )
    b.stat(
        "Firing alerts",
        "gpuwatch alerts firing on this node.",
        "none",
        [Q(f'count(ALERTS{{alertstate="firing", {HOST_SEL}}}) or vector(0)')],
        steps((None, "green"), (1, "red")),
    )
    b.table(
        "GPUs",
        "Identity of each GPU (gpuwatch_gpu_info) and whether it answers.",
        "none",
        [
            Q(
                "max by (instance, gpu, uuid, model, pci_bus_id, driver_version, vbios_version) "
                f"(gpuwatch_gpu_info{{{s}}})"
                f" * on(instance, uuid) group_left max by (instance, uuid) (gpuwatch_gpu_up{{{s}}})",
                table=True,
            )
        ],
        columns={"up": ("Up", "none")},
        hide=("Time",),
        cell_thresholds={"Up": steps((None, "red"), (1, "green"))},
        w=24,
        h=7,
        sort_by="gpu",
    )
    b.table(
        "Verdict per GPU",
        "Each GPU's verdict (docs/verdicts.md): its state (healthy, degraded, unhealthy) and the one recommended "
        "action. A fault held in the fault ledger stays until `gpuwatch repair`; the status page and /health/gpus "
        "give the evidence.",
        "none",
        [
            Q(
                f"max by (instance, gpu, uuid, state) (gpuwatch_gpu_health{{{s}}} == 1) * on(instance, uuid) "
                f"group_left(action) max by (instance, uuid, action) (gpuwatch_gpu_recommended_action{{{s}}} == 1)",
                table=True,
            )
        ],
        hide=("Time", "Value"),
        h=6,
        sort_by="gpu",
    )

    b.row("Thermal")
    b.timeseries(
        "Core temperature and slowdown threshold",
        "Core (die / hotspot) temperature per GPU; dashed: each GPU's own slowdown threshold.",
        "celsius",
        [
            Q(f'max by (gpu) (gpuwatch_gpu_temperature_celsius{{sensor="core", {s}}})', GPU_LEGEND),
            Q(
                "max by (gpu) (gpuwatch_gpu_temperature_threshold_celsius"
                f'{{sensor="core", threshold="slowdown", {s}}})',
                GPU_LEGEND + " slowdown",
            ),
        ],
        dashed_series=(".* slowdown",),
    )
    b.timeseries(
        "Memory temperature and limit",
        "HBM / VRAM temperature per GPU; dashed: its max operating temperature.",
        "celsius",
        [
            Q(f'max by (gpu) (gpuwatch_gpu_temperature_celsius{{sensor="memory", {s}}})', GPU_LEGEND),
            Q(
                f"max by (gpu) (gpuwatch_gpu_temperature_threshold_celsius"
                f'{{sensor="memory", threshold="max_operating", {s}}})',
                GPU_LEGEND + " max operating",
            ),
        ],
        dashed_series=(".* max operating",),
    )

    b.row("Clocks and power")
    b.timeseries(
        "SM clock against max",
        "SM clock per GPU; dashed: the maximum the device allows. Under load at the power cap 65-70 % is normal.",
        "hertz",
        [
            Q(f'max by (gpu) (gpuwatch_gpu_clock_hertz{{clock="sm", {s}}})', GPU_LEGEND),
            Q(f'max by (gpu) (gpuwatch_gpu_clock_max_hertz{{clock="sm", {s}}})', GPU_LEGEND + " max"),
        ],
        dashed_series=(".* max",),
    )
    b.timeseries(
        "Power against limits",
        "Board power per GPU; dashed: the enforced limit and, when set, the configured one. An enforced limit "
        "below default means an underpowered GPU.",
        "watt",
        [
            Q(f"max by (gpu) (gpuwatch_gpu_power_watts{{{s}}})", GPU_LEGEND),
            Q(f'max by (gpu) (gpuwatch_gpu_power_limit_watts{{limit="enforced", {s}}})', GPU_LEGEND + " enforced"),
            Q(f'max by (gpu) (gpuwatch_gpu_power_limit_watts{{limit="default", {s}}})', GPU_LEGEND + " default"),
            Q(
                f'max by (gpu) (gpuwatch_gpu_power_limit_watts{{limit="configured", {s}}})',
                GPU_LEGEND + " configured",
            ),
        ],
        dashed_series=(".* enforced", ".* default", ".* configured"),
    )
    b.timeseries(
        "Utilization",
        "Compute busy share per GPU.",
        "percentunit",
        [Q(f"max by (gpu) (gpuwatch_gpu_utilization_ratio{{{s}}})", GPU_LEGEND)],
        min_val=0,
        max_val=1,
    )
    b.timeseries(
        "Memory used",
        "Device memory in use per GPU; dashed: total.",
        "bytes",
        [
            Q(f"max by (gpu) (gpuwatch_gpu_memory_used_bytes{{{s}}})", GPU_LEGEND),
            Q(f"max by (gpu) (gpuwatch_gpu_memory_total_bytes{{{s}}})", GPU_LEGEND + " total"),
        ],
        dashed_series=(".* total",),
    )

    real_utilization_node(b, s)
    mig_instances_node(b, s)

    b.row("Throttling")
    b.state_timeline(
        "Throttle reasons",
        "When each reason held the clocks down (red). gpu_idle and sw_power_cap are normal for idle and loaded "
        "GPUs; thermal, power brake and hw_slowdown are not. Only reasons active in the time range are shown.",
        [
            Q(
                f"max by (gpu, reason) (gpuwatch_gpu_throttle_active{{{s}}}) and on(gpu, reason) "
                f"(max by (gpu, reason) (max_over_time(gpuwatch_gpu_throttle_active{{{s}}}[$__range])) > 0)",
                "GPU {{gpu}} {{reason}}",
            )
        ],
        ON_OFF,
        h=10,
    )
    b.timeseries(
        "Throttle time",
        "Share of time each reason held the clocks down (rate of gpuwatch_gpu_throttle_seconds_total), so short "
        "events between scrapes still count.",
        "percentunit",
        [
            Q(
                f"sum by (gpu, reason) (rate(gpuwatch_gpu_throttle_seconds_total{{{s}}}[$__rate_interval])) > 0",
                "GPU {{gpu}} {{reason}}",
            )
        ],
        w=24,
        min_val=0,
    )

    b.row("Matmul probe")
    b.timeseries(
        "Probe throughput against baseline",
        "Median FLOP/s of each probe; dashed: this GPU's own healthy baseline and the fleet median of its model.",
        "flops",
        [
            Q(f"max by (gpu, dtype) (gpuwatch_probe_flops{{{s}}})", GPU_LEGEND + " {{dtype}}"),
            Q(f"max by (gpu, dtype) (gpuwatch_probe_baseline_flops{{{s}}})", GPU_LEGEND + " {{dtype}} baseline"),
            Q(
                f"max by (model, dtype) ({RULE_FLEET_MEDIAN} and on(model) gpuwatch_gpu_info{{{s}}})",
                "fleet median {{model}} {{dtype}}",
            ),
        ],
        dashed_series=(".* baseline", "fleet median .*"),
    )
    b.timeseries(
        "Probe against baseline and fleet",
        f"Last probe over the GPU's baseline (below {threshold('probe_baseline_ratio'):.0%} is slow), and over the "
        f"fleet median of its model (below {threshold('probe_fleet_ratio'):.0%}).",
        "percentunit",
        [
            Q(f"max by (gpu, dtype) ({RULE_RATIO_TO_BASELINE}{{{s}}})", GPU_LEGEND + " {{dtype}} / baseline"),
            Q(f"max by (gpu, dtype) ({RULE_RATIO_TO_FLEET}{{{s}}})", GPU_LEGEND + " {{dtype}} / fleet"),
        ],
        thresholds=steps((None, "red"), (threshold("probe_fleet_ratio"), "transparent")),
    )
    b.timeseries(
        "SM clock during probes",
        "Mean SM clock while the last probe ran: a slow GPU with low clocks is held down, with full clocks it is "
        "a hardware problem.",
        "hertz",
        [Q(f"max by (gpu) (gpuwatch_probe_sm_clock_hertz{{{s}}})", GPU_LEGEND)],
        w=8,
    )
    b.timeseries(
        "Power during probes",
        "Mean board power while the last probe ran.",
        "watt",
        [Q(f"max by (gpu) (gpuwatch_probe_power_watts{{{s}}})", GPU_LEGEND)],
        w=8,
    )
    b.timeseries(
        "Temperature during probes",
        "Peak core temperature while the last probe ran.",
        "celsius",
        [Q(f"max by (gpu) (gpuwatch_probe_temperature_celsius{{{s}}})", GPU_LEGEND)],
        w=8,
    )
    b.timeseries(
        "Host ↔ device bandwidth",
        "Pinned copy bandwidth measured by the probe: host to device and back (PCIe trouble a matmul never sees).",
        "Bps",
        [
            Q(f"max by (gpu) (gpuwatch_probe_h2d_bytes_per_second{{{s}}})", GPU_LEGEND + " host→device"),
            Q(f"max by (gpu) (gpuwatch_probe_d2h_bytes_per_second{{{s}}})", GPU_LEGEND + " device→host"),
        ],
    )
    b.timeseries(
        "Probe runs",
        "Probe runs per result in each interval; skips (busy GPU, MIG) are normal, failures and timeouts are not.",
        "short",
        [
            Q(
                f"sum by (result) (increase(gpuwatch_probe_runs_total{{{s}}}[$__rate_interval])) > 0",
                "{{result}}",
            )
        ],
        stack=True,
    )

    b.row("Errors and links")
    b.timeseries(
        "ECC errors",
        "New ECC errors per interval: corrected ones are routine in small numbers; uncorrected or deferred ones "
        "are not.",
        "short",
        [
            Q(
                f"sum by (gpu, type) (increase(gpuwatch_gpu_ecc_errors_total{{{s}}}[$__rate_interval]))",
                "GPU {{gpu}} {{type}}",
            )
        ],
        w=8,
    )
    b.timeseries(
        "XID errors",
        "XID errors per interval, by code (13, 31, 43, 45, 68 are application errors; the rest alert). The first XID "
        "of a code counts too: its counter appears at 1, which increase() would miss, so each interval counts the "
        "counter's value at its end less its value at its start, or 0 where the counter did not exist yet.",
        "short",
        [
            Q(
                "sum by (gpu, xid) (clamp_min("
                f"gpuwatch_gpu_xid_errors_total{{{s}}} - (gpuwatch_gpu_xid_errors_total{{{s}}} offset $__rate_interval"
                f" or gpuwatch_gpu_xid_errors_total{{{s}}} * 0), 0))",
                "GPU {{gpu}} XID {{xid}}",
            )
        ],
        w=8,
    )
    b.timeseries(
        "Memory repair",
        "Row remap pending (reset needed) or failed, retired pages, and the driver's requested recovery action "
        "(0 none, 1 reset, 2 reboot).",
        "short",
        [
            Q(f"max by (gpu) (gpuwatch_gpu_row_remap_pending{{{s}}})", GPU_LEGEND + " remap pending"),
            Q(f"max by (gpu) (gpuwatch_gpu_row_remap_failed{{{s}}})", GPU_LEGEND + " remap failed"),
            Q(f"max by (gpu) (gpuwatch_gpu_recovery_action{{{s}}})", GPU_LEGEND + " recovery action"),
        ],
        w=8,
    )
    b.timeseries(
        "PCIe link against max",
        "Current PCIe generation and width as a share of what the GPU in this slot can reach; idle GPUs lower "
        "the generation to save power, so judge it under load.",
        "percentunit",
        [
            Q(
                f'max by (gpu) (gpuwatch_gpu_pcie_link_generation{{link="current", {s}}}) / '
                f'max by (gpu) (gpuwatch_gpu_pcie_link_generation{{link="max", {s}}})',
                GPU_LEGEND + " generation",
            ),
            Q(
                f'max by (gpu) (gpuwatch_gpu_pcie_link_width{{link="current", {s}}}) / '
                f'max by (gpu) (gpuwatch_gpu_pcie_link_width{{link="max", {s}}})',
                GPU_LEGEND + " width",
            ),
        ],
        min_val=0,
    )
    b.timeseries(
        "PCIe replays and link recoveries",
        "Per second; steadily growing replays or recoveries mean a marginal link or riser.",
        "ops",
        [
            Q(
                f"sum by (gpu) (rate(gpuwatch_gpu_pcie_replays_total{{{s}}}[$__rate_interval]))",
                GPU_LEGEND + " replays",
            ),
            Q(
                f"sum by (gpu) (rate(gpuwatch_gpu_pcie_link_recoveries_total{{{s}}}[$__rate_interval]))",
                GPU_LEGEND + " recoveries",
            ),
        ],
    )

    b.row("Host power delivery")
    b.timeseries(
        "Supply rails against their minimum",
        "Each rail's voltage over its lower limit (declared by the chip or the BMC, else its nominal less the ATX "
        "tolerance, which the agent exports as the min); below 100 % (the line) the rail sags.",
        "percentunit",
        [
            Q(
                f"gpuwatch_host_voltage_volts{{{HOST_SEL}}} / on(instance, chip, sensor) "
                f"(gpuwatch_host_voltage_min_volts{{{HOST_SEL}}} or "
                f"(gpuwatch_host_voltage_nominal_volts{{{HOST_SEL}}} > 0)"
                " * scalar(gpuwatch:threshold:rail_voltage_ratio)"
                f" or (gpuwatch_host_voltage_nominal_volts{{{HOST_SEL}}} < 0)"
                " * scalar(gpuwatch:threshold:negative_rail_voltage_ratio))",
                "{{chip}} {{sensor}}",
            )
        ],
        thresholds=steps((None, "red"), (1, "transparent")),
    )
    b.timeseries(
        "Supply rails",
        "Rail voltages; dashed: their declared minimum.",
        "volt",
        [
            Q(f"gpuwatch_host_voltage_volts{{{HOST_SEL}}}", "{{chip}} {{sensor}}"),
            Q(f"gpuwatch_host_voltage_min_volts{{{HOST_SEL}}}", "{{chip}} {{sensor}} min"),
        ],
        dashed_series=(".* min",),
    )
    b.state_timeline(
        "Power supplies",
        "Each populated PSU bay: OK, or failed / AC lost / predictive failure.",
        [Q(f"max by (psu) (gpuwatch_host_psu_up{{{HOST_SEL}}})", "PSU {{psu}}")],
        [
            dm.ValueMap(
                options={
                    "0": dm.ValueMappingResult(text="failed", color="red", index=0),
                    "1": dm.ValueMappingResult(text="ok", color="green", index=1),
                }
            )
        ],
        w=12,
        h=6,
    )
    b.timeseries(
        "Host temperatures",
        "Host sensors (board, CPU, PSU), GPU drivers' own chips excluded.",
        "celsius",
        [Q(f"gpuwatch_host_temperature_celsius{{{HOST_SEL}}}", "{{chip}} {{sensor}}")],
    )
    b.row("Network and NVLink fabric")
    b.state_timeline(
        "RDMA ports",
        "Each InfiniBand or RoCE port (device/port, the GPU beside it): up, or down (HostNetworkPortDown once it was "
        "up).",
        [Q(f"max by (device, port, gpu) (gpuwatch_network_port_up{{{HOST_SEL}}})", "{{device}}/{{port}} GPU {{gpu}}")],
        [
            dm.ValueMap(
                options={
                    "0": dm.ValueMappingResult(text="down", color="red", index=0),
                    "1": dm.ValueMappingResult(text="up", color="green", index=1),
                }
            )
        ],
        w=12,
        h=8,
    )
    b.timeseries(
        "RDMA port rate against expected",
        "Each port's rate over the rate it should run at (network.expected_rate_gbps, else the best of the node's "
        "ports of its link layer); below 100 % a link trained at fewer lanes or a lower speed.",
        "percentunit",
        [
            Q(
                f"gpuwatch_network_port_rate_bits_per_second{{{HOST_SEL}}} / "
                f"gpuwatch_network_port_expected_rate_bits_per_second{{{HOST_SEL}}}",
                "{{device}}/{{port}}",
            )
        ],
        min_val=0,
    )
    b.timeseries(
        "RDMA link drops and errors",
        "Per interval: link drops (link_downed, a RoCE interface's carrier losses; two in 15 minutes is "
        "HostNetworkPortFlapping) and each error counter "
        "that grew (HostNetworkPortErrors: any link integrity or receive error, symbol errors past 100 in 10 minutes).",
        "short",
        [
            Q(
                f"sum by (device, port) (increase(gpuwatch_network_port_link_downed_total{{{HOST_SEL}}}"
                "[$__rate_interval]))",
                "{{device}}/{{port}} link downed",
            ),
            Q(
                f"sum by (device, port) (increase(gpuwatch_network_port_carrier_down_total{{{HOST_SEL}}}"
                "[$__rate_interval]))",
                "{{device}}/{{port}} carrier lost",
            ),
            Q(
                f"sum by (device, port, type) (increase(gpuwatch_network_port_errors_total{{{HOST_SEL}}}"
                "[$__rate_interval])) > 0",
                "{{device}}/{{port}} {{type}}",
            ),
        ],
    )
    b.timeseries(
        "NVLink fabric health",
        "NVSwitch systems: each fabric health condition that holds on a GPU (degraded bandwidth, route recovery, "
        "incorrect configuration, the summary's limited capacity…; GpuFabricDegraded), and whether the fabric "
        "manager runs (NvidiaFabricManagerDown).",
        "short",
        [
            Q(f"gpuwatch_gpu_fabric_health{{{s}}} == 1", "GPU {{gpu}} {{condition}}"),
            Q(f"max(gpuwatch_host_fabric_manager_running{{{HOST_SEL}}})", "fabric manager running"),
        ],
        min_val=0,
    )
    variables = [
        ds_variable(),
        query_variable("node", "Node", "label_values(gpuwatch_gpu_info, node)", multi=False, include_all=False),
        query_variable(
            "gpu", "GPU", 'label_values(gpuwatch_gpu_info{node="$node"}, gpu)', multi=True, include_all=True
        ),
    ]
    return b.build(variables, [node_link("Other gpuwatch dashboards")])
