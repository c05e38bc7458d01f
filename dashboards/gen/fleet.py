"""The fleet overview dashboard (gpuwatch-fleet.json): which node is hot, throttling, underpowered or slow."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from gpuwatch.core.thresholds import threshold

from .board import Board, Q, ds_variable, node_link, query_variable, steps
from .promql import (
    BENIGN_REASONS,
    FLEET_LEGEND,
    FLEET_SEL,
    RULE_RATIO_TO_BASELINE,
    RULE_RATIO_TO_FLEET,
    per_gpu,
)
from .utilization import real_utilization_fleet

# The numbers the alerts page on (the rules' gpuwatch:threshold:* records, held equal to gpuwatch/core/thresholds.py by
# tests/test_thresholds.py): a panel turns red where an alert would fire.
MARGIN_C = threshold("core_temperature_margin_celsius")
POWER_LIMIT_RATIO = threshold("power_limit_ratio")
BASELINE_RATIO = threshold("probe_baseline_ratio")
FLEET_RATIO = threshold("probe_fleet_ratio")


def fleet_overview() -> dict[str, Any]:
    b = Board(
        "gpuwatch / Fleet overview",
        "gpuwatch-fleet",
        "Which node is hot, throttling, underpowered or slow, and why: every GPU of the fleet against its own limits.",
    )
    s = FLEET_SEL
    b.row("At a glance")
    b.stat(
        "GPUs up",
        "GPUs whose last poll succeeded and is fresh (gpuwatch_gpu_up == 1).",
        "none",
        [Q(f"count(gpuwatch_gpu_up{{{s}}} == 1)")],
        steps((None, "green")),
    )
    b.stat(
        "GPUs lost",
        "Known GPUs that stopped answering or went stale (gpuwatch_gpu_up == 0). Open the node detail dashboard.",
        "none",
        [Q(f"count(gpuwatch_gpu_up{{{s}}} == 0) or vector(0)")],
        steps((None, "green"), (1, "red")),
    )
    b.stat(
        "RDMA ports down",
        "InfiniBand or RoCE ports down after having been up within a day (HostNetworkPortDown's condition): a rail "
        "of a node's network. Open the node detail dashboard's Network row.",
        "none",
        [
            Q(
                f"count(gpuwatch_network_port_up{{{s}}} == 0 and on (instance, device, port) "
                f"max_over_time(gpuwatch_network_port_up{{{s}}}[1d]) == 1) or vector(0)"
            )
        ],
        steps((None, "green"), (1, "red")),
    )
    b.stat(
        "Agents down",
        "gpuwatch scrape targets Prometheus cannot reach (up == 0 for job gpuwatch).",
        "none",
        [Q(f'count(up{{job="gpuwatch", {s}}} == 0) or vector(0)')],
        steps((None, "green"), (1, "red")),
    )
    b.stat(
        "Critical alerts",
        "Firing gpuwatch alerts of severity critical.",
        "none",
        [Q(f'count(ALERTS{{alertstate="firing", severity="critical", {s}}}) or vector(0)')],
        steps((None, "green"), (1, "red")),
    )
    b.stat(
        "Warnings",
        "Firing gpuwatch alerts of severity warning.",
        "none",
        [Q(f'count(ALERTS{{alertstate="firing", severity="warning", {s}}}) or vector(0)')],
        steps((None, "green"), (1, "orange")),
    )
    b.stat(
        "Hottest GPU headroom",
        "The smallest distance of any GPU's core temperature to its own slowdown threshold.",
        "celsius",
        [
            Q(
                f'min(gpuwatch_gpu_temperature_threshold_celsius{{sensor="core", threshold="slowdown", {s}}}'
                f' - on(instance, uuid) group_left gpuwatch_gpu_temperature_celsius{{sensor="core", {s}}})'
            )
        ],
        steps((None, "red"), (0, "orange"), (MARGIN_C, "green")),
    )
    b.table(
        "Firing alerts",
        "Alerts Prometheus is firing now (the ALERTS series); the rules are deploy/prometheus/gpuwatch-alerts.yml.",
        "none",
        [Q(f'ALERTS{{alertstate="firing", {s}}}', table=True)],
        hide=("Time", "__name__", "job", "alertstate", "Value", "uuid"),
        h=7,
        sort_by="severity",
    )
    verdicts = (
        f"max by (node, instance, gpu, uuid, state) (gpuwatch_gpu_health{{{s}}} == 1) * on(instance, uuid) "
        f"group_left(action) max by (instance, uuid, action) "
        f'(gpuwatch_gpu_recommended_action{{action!~"none|restart_app", {s}}} == 1)'
    )
    b.table(
        "GPUs that need an action",
        "Each GPU whose verdict (docs/verdicts.md) asks for more than restarting the application: its state and the "
        "one recommended action (reset_gpu, reboot_node, inspect_hardware, replace_gpu). A fault held in the node's "
        "fault ledger stays here until `gpuwatch repair` (or, for a reset or reboot, a clean probe after a reboot).",
        "none",
        [Q(verdicts, table=True)],
        hide=("Time", "__name__", "job", "Value"),
        h=6,
        sort_by="node",
    )

    b.row("Every GPU")
    headroom = (
        f'gpuwatch_gpu_temperature_threshold_celsius{{sensor="core", threshold="slowdown", {s}}}'
        f' - on(instance, uuid) group_left gpuwatch_gpu_temperature_celsius{{sensor="core", {s}}}'
    )
    columns = {
        "temp": ("Core °C", "celsius"),
        "headroom": ("Headroom to slowdown", "celsius"),
        "power": ("Power", "watt"),
        "limit": ("Power limit", "watt"),
        "limit_ratio": ("Limit / default", "percentunit"),
        "clock": ("SM clock / max", "percentunit"),
        "throttle": ("Throttled (5m)", "percentunit"),
        "probe_base": ("Probe / baseline", "percentunit"),
        "probe_fleet": ("Probe / fleet", "percentunit"),
        "up": ("Up", "none"),
    }
    b.table(
        "GPUs: temperature, power, clocks, throttling, probe",
        "One row per GPU. Headroom: degrees below the GPU's own slowdown threshold. Limit / default: the enforced "
        "power limit against the default (or configured) one — below 95 % the GPU runs underpowered. Throttled: "
        "share of the last 5 minutes with a throttle reason other than idle or the power cap. Probe: the last "
        "matmul probe against this GPU's baseline and against the median of its model in the fleet.",
        "none",
        [
            Q(per_gpu(f'gpuwatch_gpu_temperature_celsius{{sensor="core", {s}}}'), table=True),
            Q(per_gpu(headroom), table=True),
            Q(per_gpu(f"gpuwatch_gpu_power_watts{{{s}}}"), table=True),
            Q(per_gpu(f'gpuwatch_gpu_power_limit_watts{{limit="enforced", {s}}}'), table=True),
            Q(
                per_gpu(
                    f'gpuwatch_gpu_power_limit_watts{{limit="enforced", {s}}} / on(instance, uuid) group_left() '
                    f'(max by (instance, uuid) (gpuwatch_gpu_power_limit_watts{{limit="configured", {s}}}) or '
                    f'max by (instance, uuid) (gpuwatch_gpu_power_limit_watts{{limit="default", {s}}}))'
                ),
                table=True,
            ),
            Q(
                per_gpu(
                    f'gpuwatch_gpu_clock_hertz{{clock="sm", {s}}}'
                    f' / on(instance, uuid) group_left gpuwatch_gpu_clock_max_hertz{{clock="sm", {s}}}'
                ),
                table=True,
            ),
            Q(
                per_gpu(
                    f"sum by (node, instance, gpu, uuid) (rate(gpuwatch_gpu_throttle_seconds_total"
                    f'{{reason!~"{BENIGN_REASONS}", {s}}}[5m]))'
                ),
                table=True,
            ),
            Q(f"max by (node, instance, gpu, uuid, model) ({RULE_RATIO_TO_BASELINE}{{{s}}})", table=True),
            Q(f"max by (node, instance, gpu, uuid, model) ({RULE_RATIO_TO_FLEET}{{{s}}})", table=True),
            Q(per_gpu(f"gpuwatch_gpu_up{{{s}}}"), table=True),
        ],
        columns=columns,
        hide=("Time", "uuid", "instance"),
        cell_thresholds={
            "Headroom to slowdown": steps((None, "red"), (0, "orange"), (MARGIN_C, "green")),
            "Limit / default": steps((None, "orange"), (POWER_LIMIT_RATIO, "green")),
            "Throttled (5m)": steps((None, "green"), (0.1, "orange"), (0.5, "red")),
            "Probe / baseline": steps((None, "red"), (BASELINE_RATIO, "green")),
            "Probe / fleet": steps((None, "red"), (FLEET_RATIO, "green")),
            "Up": steps((None, "red"), (1, "green")),
        },
        h=12,
        sort_by="Headroom to slowdown",
    )
    b.table(
        "Throttling now (reasons that matter)",
        f"GPUs with a throttle reason active at the last poll, other than {BENIGN_REASONS.replace('|', ', ')} "
        "(normal for idle or power-capped GPUs under load).",
        "none",
        [
            Q(
                "max by (node, instance, gpu, uuid, reason) "
                f'(gpuwatch_gpu_throttle_active{{reason!~"{BENIGN_REASONS}", {s}}} == 1)',
                table=True,
            )
        ],
        hide=("Time", "uuid", "instance", "Value"),
        w=12,
        h=8,
    )
    b.table(
        "Power-capped below default",
        f"GPUs whose enforced power limit is below {POWER_LIMIT_RATIO:.0%} of the configured limit (when set) or the "
        "default one (gpuwatch:threshold:power_limit_ratio).",
        "watt",
        [
            Q(
                f'max by (node, instance, gpu, uuid) (gpuwatch_gpu_power_limit_watts{{limit="enforced", {s}}}'
                " < on(instance, uuid) group_left scalar(gpuwatch:threshold:power_limit_ratio) * ("
                f'max by (instance, uuid) (gpuwatch_gpu_power_limit_watts{{limit="configured", {s}}}) or '
                f'max by (instance, uuid) (gpuwatch_gpu_power_limit_watts{{limit="default", {s}}})))',
                table=True,
            )
        ],
        columns={"limit": ("Enforced limit", "watt")},
        hide=("Time", "uuid", "instance"),
        w=12,
        h=8,
    )

    b.row("Worst GPUs")
    b.table(
        "Closest to slowdown (top $topn)",
        "The GPUs with the least headroom between core temperature and their own slowdown threshold.",
        "celsius",
        [Q(f"bottomk($topn, max by (node, instance, gpu, uuid) ({headroom}))", table=True)],
        columns={"headroom": ("Headroom to slowdown", "celsius")},
        hide=("Time", "uuid", "instance"),
        cell_thresholds={"Headroom to slowdown": steps((None, "red"), (0, "orange"), (MARGIN_C, "green"))},
        w=8,
        h=8,
        sort_by="Headroom to slowdown",
    )
    b.table(
        "Most throttled (top $topn)",
        "Share of the last hour with a throttle reason other than idle or the power cap.",
        "percentunit",
        [
            Q(
                f"topk($topn, sum by (node, instance, gpu, uuid) (rate(gpuwatch_gpu_throttle_seconds_total"
                f'{{reason!~"{BENIGN_REASONS}", {s}}}[1h])) > 0)',
                table=True,
            )
        ],
        columns={"share": ("Throttled (1h)", "percentunit")},
        hide=("Time", "uuid", "instance"),
        cell_thresholds={"Throttled (1h)": steps((None, "green"), (0.1, "orange"), (0.5, "red"))},
        w=8,
        h=8,
        sort_by="Throttled (1h)",
        desc_sort=True,
    )
    b.table(
        "Slowest against the fleet (top $topn)",
        "Last probe throughput against the fleet median of the same model, dtype and engine.",
        "percentunit",
        [Q(f"bottomk($topn, max by (node, instance, gpu, uuid, model) ({RULE_RATIO_TO_FLEET}{{{s}}}))", table=True)],
        columns={"ratio": ("Probe / fleet", "percentunit")},
        hide=("Time", "uuid", "instance"),
        cell_thresholds={"Probe / fleet": steps((None, "red"), (FLEET_RATIO, "green"))},
        w=8,
        h=8,
        sort_by="Probe / fleet",
    )

    real_utilization_fleet(b, s)

    b.row("Over time")
    b.timeseries(
        "Core temperature below slowdown threshold",
        "Degrees between each GPU's core temperature and its own slowdown threshold; at 0 the GPU slows down.",
        "celsius",
        [Q(f"max by (node, instance, gpu, uuid) ({headroom})", FLEET_LEGEND)],
        thresholds=steps((None, "red"), (0, "orange"), (MARGIN_C, "transparent")),
    )
    b.timeseries(
        "Power against enforced limit",
        "Board power as a share of the enforced power limit; 100 % under load is a GPU at its power cap (normal).",
        "percentunit",
        [
            Q(
                f"max by (node, instance, gpu, uuid) (gpuwatch_gpu_power_watts{{{s}}} / on(instance, uuid) group_left "
                f'gpuwatch_gpu_power_limit_watts{{limit="enforced", {s}}})',
                FLEET_LEGEND,
            )
        ],
        min_val=0,
    )
    b.timeseries(
        "Throttle time by reason",
        "Share of time clocks were held down, per node and reason (idle and power cap left out).",
        "percentunit",
        [
            Q(
                f"sum by (node, reason) (rate(gpuwatch_gpu_throttle_seconds_total"
                f'{{reason!~"{BENIGN_REASONS}", {s}}}[$__rate_interval]))',
                "{{node}} {{reason}}",
            )
        ],
        min_val=0,
    )
    b.timeseries(
        "Enforced power limit against default",
        "The enforced power limit against the configured limit (when set) or the default one, as the "
        "GpuPowerLimitBelowDefault alert judges it. Below 95 % (the line) the GPU runs underpowered: someone or "
        "something lowered its limit.",
        "percentunit",
        [
            Q(
                f'max by (node, instance, gpu, uuid) (gpuwatch_gpu_power_limit_watts{{limit="enforced", {s}}}'
                " / on(instance, uuid) group_left() ("
                f'max by (instance, uuid) (gpuwatch_gpu_power_limit_watts{{limit="configured", {s}}}) or '
                f'max by (instance, uuid) (gpuwatch_gpu_power_limit_watts{{limit="default", {s}}})))',
                FLEET_LEGEND,
            )
        ],
        thresholds=steps((None, "orange"), (POWER_LIMIT_RATIO, "transparent")),
    )
    b.timeseries(
        "Probe throughput against own baseline",
        "Each probe's FLOP/s over the GPU's own healthy baseline; below 95 % (the line) the GPU is slow.",
        "percentunit",
        [
            Q(
                f"max by (node, instance, gpu, uuid, dtype) ({RULE_RATIO_TO_BASELINE}{{{s}}})",
                FLEET_LEGEND + " {{dtype}}",
            )
        ],
        thresholds=steps((None, "red"), (BASELINE_RATIO, "transparent")),
    )
    b.timeseries(
        "Probe throughput against fleet median",
        "Each probe's FLOP/s over the median of the same model, dtype and engine across the fleet.",
        "percentunit",
        [Q(f"max by (node, instance, gpu, uuid, dtype) ({RULE_RATIO_TO_FLEET}{{{s}}})", FLEET_LEGEND + " {{dtype}}")],
        thresholds=steps((None, "red"), (FLEET_RATIO, "transparent")),
    )
    variables = [
        ds_variable(),
        query_variable("node", "Node", "label_values(gpuwatch_gpu_info, node)", multi=True, include_all=True),
        db.CustomVariable("topn")
        .id("topn")
        .label("Worst N")
        .values("5,10,20")
        .current(dm.VariableOption(selected=True, text="10", value="10")),
    ]
    return b.build(variables, [node_link("Other gpuwatch dashboards")])
