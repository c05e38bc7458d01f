"""Generate gpuwatch's Grafana dashboards from code (grafana-foundation-sdk, Grafana 10.1 schema).

    python dashboards/generate.py          # rewrite dashboards/*.json
    python dashboards/generate.py --check  # exit 1 if the committed JSON differs from what this file generates

The JSON is committed so operators import it without Python; a test regenerates it and diffs. The agent never
imports this file. Every query selects a datasource variable, joins on `uuid`, and uses only the metrics of
docs/metrics.md and the recording rules of deploy/prometheus/gpuwatch-rules.yml.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

HERE = Path(__file__).resolve().parent
GRAFANA_TARGET = "10.1"  # the schema grafana-foundation-sdk==1769699998!10.1.0 generates (schemaVersion 36)

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

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


@dataclass(frozen=True)
class Q:
    """One PromQL target: the expression, its legend, and whether it is an instant table query."""

    expr: str
    legend: str = ""
    table: bool = False


@dataclass
class Layout:
    """Places panels left to right on a 24-column grid, wrapping to a new line."""

    x: int = 0
    y: int = 0
    row_h: int = 0
    ids: int = 0

    def place(self, w: int, h: int) -> dm.GridPos:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = dm.GridPos(h=h, w=w, x=self.x, y=self.y)
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self) -> dm.GridPos:
        self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = dm.GridPos(h=1, w=24, x=0, y=self.y)
        self.y += 1
        return pos

    def next_id(self) -> int:
        self.ids += 1
        return self.ids


def targets(queries: Sequence[Q]) -> list[prometheus.Dataquery]:
    out = []
    for i, q in enumerate(queries):
        t = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DS)
        t = t.legend_format(q.legend or "__auto")
        t = t.instant().format(PromQueryFormat.TABLE) if q.table else t.range()
        out.append(t)
    return out


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(value=v, color=c) for v, c in pairs])
    )


def dashed(*names: str) -> list[tuple[str, list[dm.DynamicConfigValue]]]:
    """Overrides drawing the named (regex) series as dashed lines: limits and thresholds beside the readings."""
    props = [
        dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
        dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
    ]
    return [(name, props) for name in names]


@dataclass
class Board:
    """A dashboard under construction; panels are added in reading order."""

    title: str
    uid: str
    description: str
    layout: Layout = field(default_factory=Layout)
    builder: db.Dashboard = field(init=False)

    def __post_init__(self) -> None:
        self.builder = (
            db.Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags(["gpuwatch", "gpu"])
            .refresh("30s")
            .time("now-3h", "now")
            .timezone("browser")
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .editable()
        )

    def row(self, title: str) -> None:
        self.builder = self.builder.with_row(
            db.Row(title).grid_pos(self.layout.row()).id(self.layout.next_id()).collapsed(False)
        )

    def _common(self, panel: Any, title: str, desc: str, unit: str, w: int, h: int) -> Any:
        return (
            panel.title(title)
            .description(desc)
            .datasource(DS)
            .unit(unit)
            .grid_pos(self.layout.place(w, h))
            .id(self.layout.next_id())
        )

    def timeseries(
        self,
        title: str,
        desc: str,
        unit: str,
        queries: Sequence[Q],
        *,
        w: int = 12,
        h: int = 8,
        thresholds: db.ThresholdsConfig | None = None,
        dashed_series: Sequence[str] = (),
        min_val: float | None = None,
        max_val: float | None = None,
        stack: bool = False,
    ) -> None:
        p = self._common(timeseries.Panel(), title, desc, unit, w, h).targets(targets(queries))
        p = p.legend(
            cb.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        ).tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
        p = p.line_width(1).fill_opacity(10 if stack else 0).show_points(common.VisibilityMode.NEVER)
        if stack:
            p = p.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
        if thresholds is not None:
            p = p.thresholds(thresholds).thresholds_style(
                cb.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
            )
        if min_val is not None:
            p = p.min(min_val)
        if max_val is not None:
            p = p.max(max_val)
        for regex, props in dashed(*dashed_series):
            p = p.override_by_regexp(regex, props)
        self.builder = self.builder.with_panel(p)

    def stat(
        self,
        title: str,
        desc: str,
        unit: str,
        queries: Sequence[Q],
        thresholds: db.ThresholdsConfig,
        *,
        w: int = 4,
        h: int = 4,
    ) -> None:
        p = self._common(stat.Panel(), title, desc, unit, w, h).targets(targets(queries))
        p = (
            p.thresholds(thresholds)
            .color_mode(common.BigValueColorMode.BACKGROUND)
            .graph_mode(common.BigValueGraphMode.NONE)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        )
        self.builder = self.builder.with_panel(p)

    def table(
        self,
        title: str,
        desc: str,
        unit: str,
        queries: Sequence[Q],
        *,
        columns: dict[str, tuple[str, str]] | None = None,
        hide: Sequence[str] = ("Time", "__name__", "job", "instance"),
        cell_thresholds: dict[str, db.ThresholdsConfig] | None = None,
        w: int = 24,
        h: int = 10,
        sort_by: str | None = None,
        desc_sort: bool = False,
    ) -> None:
        """An instant table; several queries are merged on their labels (node, gpu, uuid, model)."""
        p = self._common(table.Panel(), title, desc, unit, w, h).targets(targets(queries))
        if len(queries) > 1:
            p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        renames = {f"Value #{chr(ord('A') + i)}": label for i, (label, _) in enumerate((columns or {}).values())}
        if len(queries) == 1 and columns:
            renames = {"Value": next(iter(columns.values()))[0]}
        p = p.with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": dict.fromkeys(hide, True), "renameByName": renames},
            )
        )
        for i, (_, (label, col_unit)) in enumerate((columns or {}).items()):
            props = [dm.DynamicConfigValue(id_val="unit", value=col_unit)]
            if cell_thresholds and label in cell_thresholds:
                props += [
                    dm.DynamicConfigValue(id_val="thresholds", value=cell_thresholds[label].build()),
                    dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
                ]
            p = p.override_by_name(label, props)
            del i
        if sort_by:
            p = p.sort_by([cb.TableSortByFieldState().display_name(sort_by).desc(desc_sort)])
        self.builder = self.builder.with_panel(p)

    def state_timeline(
        self, title: str, desc: str, queries: Sequence[Q], mappings: list[dm.ValueMap], *, w: int = 24, h: int = 8
    ) -> None:
        p = self._common(statetimeline.Panel(), title, desc, "none", w, h).targets(targets(queries))
        p = p.mappings(mappings).show_value(common.VisibilityMode.NEVER).merge_values(True).row_height(0.8)
        p = p.thresholds(steps((None, "green"), (1, "red")))
        self.builder = self.builder.with_panel(p)

    def build(self, variables: list[Any], links: list[db.DashboardLink]) -> dict[str, Any]:
        b = self.builder
        for v in variables:
            b = b.with_variable(v)
        for link in links:
            b = b.link(link)
        encoded: dict[str, Any] = json.loads(json.dumps(b.build(), cls=JSONEncoder))
        return encoded


def ds_variable() -> db.DatasourceVariable:
    return (
        db.DatasourceVariable("datasource")
        .id("datasource")
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes the gpuwatch agents")
    )


def query_variable(name: str, label: str, query: str, *, multi: bool, include_all: bool) -> db.QueryVariable:
    v = (
        db.QueryVariable(name)
        .id(name)
        .label(label)
        .datasource(DS)
        .query({"query": query, "refId": f"{name}-query"})
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
    )
    if include_all:
        v = v.all_value(".*")
    return v


def node_link(title: str) -> db.DashboardLink:
    return (
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.DASHBOARDS)
        .tags(["gpuwatch"])
        .as_dropdown(False)
        .include_vars(True)
        .keep_time(True)
    )


ON_OFF = [
    dm.ValueMap(
        options={
            "0": dm.ValueMappingResult(text="off", color="transparent", index=0),
            "1": dm.ValueMappingResult(text="active", color="red", index=1),
        }
    )
]


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


# ----------------------------------------------------------------------------------------------------------------
# Real utilization (docs/reading-the-metrics.md): recording rules of the group gpuwatch-utilization. Only GPUs that
# measure SM activity (NVIDIA Hopper and newer) have these series; fleet figures average over them alone.
RULE_SM_ACTIVE = "gpuwatch:gpu_sm_active:ratio_rate5m"
RULE_TENSOR_ACTIVE = "gpuwatch:gpu_tensor_active:ratio_rate5m"
RULE_UTILIZATION = "gpuwatch:gpu_utilization:ratio_avg5m"
RULE_SM_WHEN_BUSY = "gpuwatch:gpu_sm_active_when_busy:ratio_avg5m"


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
        "tensor), dmma and dfma (FP64 tensor), fp64, fp32, fp16, integer.",
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
                f"sum by (gpu, direction) (rate(gpuwatch_gpu_nvlink_bytes_total{{{s}}}[$__rate_interval]))",
                GPU_LEGEND + " {{direction}}",
            )
        ],
        min_val=0,
    )


# ----------------------------------------------------------------------------------------------------------------
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
        steps((None, "red"), (0, "orange"), (5, "green")),
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
            "Headroom to slowdown": steps((None, "red"), (0, "orange"), (5, "green")),
            "Limit / default": steps((None, "orange"), (0.95, "green")),
            "Throttled (5m)": steps((None, "green"), (0.1, "orange"), (0.5, "red")),
            "Probe / baseline": steps((None, "red"), (0.95, "green")),
            "Probe / fleet": steps((None, "red"), (0.9, "green")),
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
        "GPUs whose enforced power limit is below 95 % of the configured limit (when set) or the default one.",
        "watt",
        [
            Q(
                f'max by (node, instance, gpu, uuid) (gpuwatch_gpu_power_limit_watts{{limit="enforced", {s}}}'
                " < on(instance, uuid) group_left 0.95 * ("
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
        cell_thresholds={"Headroom to slowdown": steps((None, "red"), (0, "orange"), (5, "green"))},
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
        cell_thresholds={"Probe / fleet": steps((None, "red"), (0.9, "green"))},
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
        thresholds=steps((None, "red"), (0, "orange"), (5, "transparent")),
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
        thresholds=steps((None, "orange"), (0.95, "transparent")),
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
        thresholds=steps((None, "red"), (0.95, "transparent")),
    )
    b.timeseries(
        "Probe throughput against fleet median",
        "Each probe's FLOP/s over the median of the same model, dtype and engine across the fleet.",
        "percentunit",
        [Q(f"max by (node, instance, gpu, uuid, dtype) ({RULE_RATIO_TO_FLEET}{{{s}}})", FLEET_LEGEND + " {{dtype}}")],
        thresholds=steps((None, "red"), (0.9, "transparent")),
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


# ----------------------------------------------------------------------------------------------------------------
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
        "Last probe over the GPU's baseline (below 95 % is slow), and over the fleet median of its model (below 90 %).",
        "percentunit",
        [
            Q(f"max by (gpu, dtype) ({RULE_RATIO_TO_BASELINE}{{{s}}})", GPU_LEGEND + " {{dtype}} / baseline"),
            Q(f"max by (gpu, dtype) ({RULE_RATIO_TO_FLEET}{{{s}}})", GPU_LEGEND + " {{dtype}} / fleet"),
        ],
        thresholds=steps((None, "red"), (0.9, "transparent")),
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
        "Each rail's voltage over its declared lower critical threshold (or 95 % of nominal where none is "
        "declared); below 100 % (the line) the rail sags.",
        "percentunit",
        [
            Q(
                f"gpuwatch_host_voltage_volts{{{HOST_SEL}}} / on(instance, chip, sensor) "
                f"(gpuwatch_host_voltage_min_volts{{{HOST_SEL}}} or "
                f"0.95 * gpuwatch_host_voltage_nominal_volts{{{HOST_SEL}}})",
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
    variables = [
        ds_variable(),
        query_variable("node", "Node", "label_values(gpuwatch_gpu_info, node)", multi=False, include_all=False),
        query_variable(
            "gpu", "GPU", 'label_values(gpuwatch_gpu_info{node="$node"}, gpu)', multi=True, include_all=True
        ),
    ]
    return b.build(variables, [node_link("Other gpuwatch dashboards")])


# ----------------------------------------------------------------------------------------------------------------
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
                " * on(instance, uuid, kind, id) group_left(user) gpuwatch_gpu_workload_info)",
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


DASHBOARDS = {
    "gpuwatch-fleet.json": fleet_overview,
    "gpuwatch-node.json": node_detail,
    "gpuwatch-workloads.json": workloads,
}


def render() -> dict[str, str]:
    """File name -> JSON text, stable (sorted keys, trailing newline) so the diff test is meaningful."""
    return {
        name: json.dumps(make(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, make in DASHBOARDS.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing")
    parser.add_argument("--out", type=Path, default=HERE, help="directory for the JSON files (default: dashboards/)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run: python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
