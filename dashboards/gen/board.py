"""A dashboard under construction (`Board`), its grid layout, targets, thresholds, variables and links.

Every panel goes through `Board` so that all of them share a datasource variable, a unit, a unique id and a place
on the 24-column grid; the dashboard modules only say what each panel shows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


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
