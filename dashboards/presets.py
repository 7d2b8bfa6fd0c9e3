"""House style for every gpufeed dashboard: datasource, variables, units, colours, panels.

A `*.dashboard.py` file describes its panels row by row with the helpers here and calls
`dashboard(...)`; this module places them on the grid, names the datasource and gives every
panel the same defaults, so the four dashboards look and behave alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafanalib.core import (
    GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
    Annotations,
    Dashboard,
    GridPos,
    Heatmap,
    HeatmapColor,
    Panel,
    RowPanel,
    Stat,
    StateTimeline,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from gpufeed.vocabulary import Cause

# Every panel and variable queries the datasource the user picks in $datasource.
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 37  # Grafana 9; grafanalib's default (12) would trigger old migrations
TAGS = ["gpufeed"]

# Units (Grafana unit ids), named for what the contract's base units measure.
RATIO = "percentunit"
BYTES = "bytes"
BYTES_PER_SECOND = "Bps"
OPS_PER_SECOND = "ops"
SECONDS = "s"
HERTZ = "hertz"
WATTS = "watt"
CELSIUS = "celsius"
PER_SECOND = "short"
GPU_HOURS_PER_HOUR = "GPU-h/h"
GPU_HOURS = "GPU-h"

# One colour per correlator cause, on every dashboard (stacked series, annotations).
CAUSE_COLOURS: dict[str, str] = {
    Cause.DATA_LOADING.value: "orange",
    Cause.PREPROCESSING.value: "yellow",
    Cause.CHECKPOINTING.value: "purple",
    Cause.NETWORK.value: "blue",
    Cause.THROTTLING.value: "red",
    Cause.STARTUP.value: "green",
    Cause.IDLE.value: "text",
    Cause.GPU_ERROR.value: "dark-red",
    Cause.STRAGGLER.value: "dark-orange",
    Cause.LOW_DEMAND.value: "super-light-green",
    Cause.UNKNOWN.value: "light-blue",
}
WINDOW_ANNOTATION_COLOUR = "orange"

# Grid: 24 columns; panels of a row share one height.
GRID_WIDTH = 24
PANEL_HEIGHT = 8


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> Target:
    """One PromQL query; refIds are assigned per panel by `_with_ref_ids`."""
    return Target(
        expr=expr,
        legendFormat=legend,
        instant=instant,
        format="table" if table else "time_series",
        datasource=DATASOURCE,
        intervalFactor=1,
    )


def _with_ref_ids(targets: Sequence[Target]) -> list[Target]:
    out = []
    for i, t in enumerate(targets):
        t.refId = chr(ord("A") + i)
        out.append(t)
    return out


def cause_overrides() -> list[dict[str, Any]]:
    """Series whose name ends in a cause (legend "... {{cause}}") keep that cause's colour."""
    return [
        {
            "matcher": {"id": "byRegexp", "options": f"^(.* )?{cause}$"},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}],
        }
        for cause, colour in CAUSE_COLOURS.items()
    ]


def timeseries(
    title: str,
    targets: Sequence[Target],
    unit: str,
    *,
    description: str = "",
    stacked: bool = False,
    percent: bool = False,
    max_value: int | None = None,
    by_cause: bool = False,
) -> TimeSeries:
    """A time series panel; `stacked` stacks the series, `percent` stacks them to 100%."""
    stacking = {"mode": "none"}
    if stacked or percent:
        stacking = {"mode": "percent" if percent else "normal", "group": "A"}
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_ref_ids(targets),
        unit=unit,
        stacking=stacking,
        fillOpacity=40 if stacking["mode"] != "none" else 10,
        valueMin=0,
        valueMax=max_value,
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["mean", "max", "lastNotNull"],
        tooltipMode="multi",
        tooltipSort="desc",
        overrides=cause_overrides() if by_cause else [],
    )


def heatmap(title: str, targets: Sequence[Target], *, description: str = "") -> Heatmap:
    """One row per series (e.g. per GPU), coloured by value: every GPU at a glance."""
    return Heatmap(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_ref_ids(targets),
        dataFormat="timeseries",
        color=HeatmapColor(mode="spectrum", colorScheme="interpolateRdYlGn", colorScale="linear"),
        hideZeroBuckets=False,
        extraJson={
            "options": {
                "calculate": False,
                "color": {"scheme": "RdYlGn", "mode": "scheme", "min": 0, "max": 1},
                "yAxis": {"unit": "short"},
                "cellValues": {"unit": RATIO},
            }
        },
    )


def stat(
    title: str, targets: Sequence[Target], unit: str, *, description: str = "", red_above: float
) -> Stat:
    """A single number, green until `red_above`."""
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_ref_ids(targets),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="area",
        colorMode="value",
        noValue="0",
        thresholdType="absolute",
        thresholds=[
            {"color": "green", "value": None},
            {"color": "red", "value": red_above},
        ],
    )


def table(
    title: str, targets: Sequence[Target], unit: str, *, description: str = "", sort_by: str
) -> Table:
    """An instant query as a table, sorted by one column, with Time hidden."""
    return Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_ref_ids(targets),
        unit=unit,
        transformations=[
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "renameByName": {}},
            }
        ],
        extraJson={"options": {"sortBy": [{"displayName": sort_by, "desc": True}]}},
    )


def state_timeline(
    title: str, targets: Sequence[Target], *, description: str = ""
) -> StateTimeline:
    """Present/absent series (windows) as coloured bands, one lane per series."""
    return StateTimeline(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_with_ref_ids(targets),
        mergeValues=True,
        showValue="never",
        colorMode="fixed",
        overrides=cause_overrides(),
    )


# --- Variables -------------------------------------------------------------------------


def datasource_variable() -> Template:
    return Template(
        name="datasource",
        label="Data source",
        query="prometheus",
        type="datasource",
        default="Prometheus",
    )


def query_variable(
    name: str, label: str, query: str, *, multi: bool = True, include_all: bool = True
) -> Template:
    """A label-values variable; "All" matches everything (regex .*), also absent labels."""
    return Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        multi=multi,
        includeAll=include_all,
        allValue=".*",
        default="All" if include_all else None,
        refresh=2,  # on time range change: jobs come and go
        sort=1,
    )


def instance_variable(*, multi: bool = True) -> Template:
    return query_variable(
        "instance",
        "Node",
        "label_values(gpufeed_gpu_info, instance)",
        multi=multi,
        include_all=multi,
    )


def job_id_variable(*, multi: bool = True) -> Template:
    return query_variable(
        "job_id",
        "Job",
        'label_values(gpufeed_job_info{instance=~"$instance"}, job_id)',
        multi=multi,
        include_all=multi,
    )


def tier_variable() -> Template:
    return query_variable(
        "tier", "Tier", 'label_values(gpufeed_storage_capacity_bytes{instance=~"$instance"}, tier)'
    )


# --- Annotations -----------------------------------------------------------------------


def window_annotation(selector: str) -> dict[str, Any]:
    """Underutilization windows as annotation regions: one per open cause series."""
    return {
        "name": "Underutilization windows",
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": WINDOW_ANNOTATION_COLOUR,
        "expr": f"gpufeed_gpu_underutilization_cause{{{selector}}}",
        "step": "30s",
        "titleFormat": "GPU {{gpu}}: {{cause}}",
        "textFormat": "job {{job_id}}",
        "tagKeys": "cause,gpu,job_id",
        "useValueForTime": False,
    }


def builtin_alert_annotation() -> dict[str, Any]:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


# --- Layout ----------------------------------------------------------------------------

Row = tuple[str, Sequence[Panel]]


def _layout(rows: Sequence[Row]) -> list[Panel]:
    """Places each row's panels side by side at equal width, under a row header."""
    panels: list[Panel] = []
    y = 0
    for title, row_panels in rows:
        panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=GRID_WIDTH, x=0, y=y)))
        y += 1
        width = GRID_WIDTH // max(1, len(row_panels))
        for i, panel in enumerate(row_panels):
            panel.gridPos = GridPos(h=PANEL_HEIGHT, w=width, x=i * width, y=y)
            panels.append(panel)
        y += PANEL_HEIGHT
    return panels


def build_dashboard(
    *,
    title: str,
    uid: str,
    description: str,
    rows: Sequence[Row],
    variables: Sequence[Template],
    annotations: Sequence[dict[str, Any]] = (),
) -> Dashboard:
    return Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=list(TAGS),
        timezone="utc",
        refresh="30s",
        time=Time("now-3h", "now"),
        graphTooltip=GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
        templating=Templating(list=[datasource_variable(), *variables]),
        annotations=Annotations(list=[builtin_alert_annotation(), *annotations]),
        panels=_layout(rows),
    ).auto_panel_ids()
