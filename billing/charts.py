"""Plotly figures as plain dicts, built from selector rows and drawn by ``static/js/charts.js``.

Figures travel to the page with ``json_script`` (never inline script), so the strict Content
Security Policy (``script-src 'self'``) holds. Nothing here computes a metric: each value is a
field of a ``CostRow``/``FleetSummary``/``BreakevenResult``, or a change of units of one
(hours → hours per GPU per day, fraction → percent).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from billing import breakeven as be
from billing.selectors import BreakevenResult, CostRow

# Colours, each with one meaning on every page (static/css/app.css holds the same for the
# page itself). The four block-hour colours mean only their block; utilisation, the share of
# the hours in the air, is drawn in the air's colour.
AIR = "#1f6feb"
HELD = "#d29922"
PARKED = "#8c959f"
OFFLINE = "#cf222e"
TARGET = "#1a7f37"  # target lines
MONEY = "#24292f"  # cost of the hours in the air, own cost, the nominal rate
IDLE_MONEY = "#bc4c00"
API = "#8250df"
RENT = "#1b7c83"  # renting on demand
ENERGY = "#bf3989"  # energy and power (energy per second)
IDLE_ENERGY = "#e7a3cc"
CO2E = "#57606a"
TEMPERATURE = "#953800"
THROTTLED = "#6639ba"
WORK = "#0a3069"  # the SMs really working (profiling data): a deep shade of the air's colour
TENSOR = "#6cb6ff"  # tensor cores working: a light shade of it
DRAM = "#5a6d00"  # memory bandwidth used
INK = "#1b1f24"  # text
GRID = "#eaeef2"
HEAT = ("#f6f8fa", "#dbe9ff", "#79b0ff", "#1f6feb", "#0a2f6b")  # 0 % … 100 % utilisation
LABEL_BG = "rgba(255,255,255,0.85)"
PARTIAL_FILL = "rgba(140,149,159,0.14)"
BLOCK_COLOURS = {AIR, HELD, PARKED, OFFLINE}
# The same figures on a dark page (prefers-color-scheme: dark): static/js/charts.js swaps
# these before drawing, as app.css swaps its own. HELD, PARKED and IDLE_ENERGY read on both.
DARK = {
    INK: "#e6edf3",
    GRID: "#30363d",
    AIR: "#4493f8",  # also HEAT[3]
    OFFLINE: "#f85149",
    TARGET: "#3fb950",
    MONEY: "#d0d7de",
    IDLE_MONEY: "#db6d28",
    API: "#a371f7",
    RENT: "#39c5cf",
    ENERGY: "#db61a2",
    CO2E: "#9198a1",
    TEMPERATURE: "#f0883e",
    THROTTLED: "#8957e5",
    WORK: "#cae8ff",
    TENSOR: "#1f5fa8",
    DRAM: "#a8c23a",
    HEAT[0]: "#1c2128",
    HEAT[1]: "#12305f",
    HEAT[2]: "#1f5fc4",
    HEAT[4]: "#b6d8ff",
    LABEL_BG: "rgba(13,17,23,0.85)",
}

BLOCKS = (
    ("air_hours", "In the air", AIR),
    ("held_hours", "Held", HELD),
    ("parked_hours", "Parked", PARKED),
    ("offline_hours", "Offline", OFFLINE),
)

Figure = dict[str, Any]


def _num(value: Decimal | float | int | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def _pct(value: float | None) -> float | None:
    return None if value is None else round(value * 100, 2)


def _layout(**extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "margin": {"l": 56, "r": 16, "t": 28, "b": 40},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {
            "family": "system-ui, -apple-system, Segoe UI, sans-serif",
            "size": 12,
            "color": INK,
        },
        "hovermode": "x unified",
        # Above the plot, growing upwards: a legend that wraps on a narrow screen pushes the
        # top margin instead of covering the plot.
        "legend": {
            "orientation": "h",
            "y": 1.02,
            "yanchor": "bottom",
            "x": 0,
            "bgcolor": "rgba(0,0,0,0)",
            "traceorder": "normal",
        },
        "xaxis": {"gridcolor": GRID, "zeroline": False},
        "yaxis": {"gridcolor": GRID, "zeroline": False, "rangemode": "tozero"},
        "height": 300,
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def round_axis(values: Iterable[float | None], *, ticks: int = 4) -> dict[str, Any]:
    """An axis from 0 to a round top at or above every value, ticked every round step (1, 2,
    2.5 or 5 × 10^k; about ``ticks`` of them): the highest point is never above the top tick.
    Plotly's own ticks on a second y axis follow the first axis's grid ("sync"), which gave
    49.9, 99.9, 149.8 kg CO2e."""
    top = max((v for v in values if v is not None), default=0.0)
    if top <= 0:
        return {"rangemode": "tozero"}
    raw = top / ticks
    magnitude = 10.0 ** math.floor(math.log10(raw))
    # Rounded: 3 × 0.1 is 0.30000000000000004 in floats.
    step = round(next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), 12)
    top_tick = round(math.ceil(top / step) * step, 12)
    return {"range": [0, top_tick], "tickmode": "linear", "tick0": 0, "dtick": step}


def _days(rows: Sequence[CostRow]) -> list[str]:
    return [r.period_start.date().isoformat() for r in rows]


def _per_gpu_day(row: CostRow, hours: float) -> float | None:
    """Fleet hours of one kind as hours per GPU in service per day (the block-hours scale on
    which a day sums to 24)."""
    if not row.capacity_hours:
        return None
    return round(hours / (row.capacity_hours / 24), 3)


def _target_line(x: list[str], y: float, name: str) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines",
        "x": x,
        "y": [y] * len(x),
        "name": name,
        "line": {"color": TARGET, "dash": "dash", "width": 2},
        "hoverinfo": "skip",
    }


@dataclass(frozen=True)
class PartialDay:
    """A day of the daily charts whose figures cover only a part of it, and why, in a few
    words: today so far, or the day the data began ("partial day: data from 06:45")."""

    day: dt.date
    label: str


def _mark_partial(fig: Figure, x: list[str], partial_days: Sequence[PartialDay]) -> Figure:
    """A part of a day drawn as a part: its bars hatched, its column shaded and labelled, so a
    short first or last day does not read as a collapse."""
    marks = [(x.index(p.day.isoformat()), p) for p in partial_days if p.day.isoformat() in x]
    if not marks:
        return fig
    # Hatched bars, except a first column's: a legend's swatch takes the first bar's pattern,
    # and a hatched swatch would say the whole series is a part. Its shade and label say it.
    hatched = {at for at, _ in marks if at > 0}
    for trace in fig["data"] if hatched else []:
        if trace.get("type") == "bar" and trace.get("x") == x:
            trace.setdefault("marker", {})["pattern"] = {
                "shape": ["/" if i in hatched else "" for i in range(len(x))],
                "solidity": 0.45,
            }
    layout = fig["layout"]
    for at, mark in marks:
        noon = dt.datetime.combine(mark.day, dt.time(12))
        column = (noon - dt.timedelta(days=1), noon)  # a date axis centres a day's bar on 0:00
        # The label inside its column, towards the middle of the chart.
        first_half = at < len(x) / 2
        layout["shapes"] = [
            *layout.get("shapes", []),
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": column[0].isoformat(sep=" "),
                "x1": column[1].isoformat(sep=" "),
                "y0": 0,
                "y1": 1,
                "fillcolor": PARTIAL_FILL,
                "line": {"width": 0},
                "layer": "below",
            },
        ]
        layout["annotations"] = [
            *layout.get("annotations", []),
            {
                "x": column[0 if first_half else 1].isoformat(sep=" "),
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "xanchor": "left" if first_half else "right",
                "yanchor": "top",
                "text": mark.label,
                "showarrow": False,
                "bgcolor": LABEL_BG,
                "font": {"size": 10, "color": INK},
            },
        ]
    return fig


# --- overview -------------------------------------------------------------------------------
def air_hours_trend(
    rows: Sequence[CostRow], *, target_utilization: float, partial_days: Sequence[PartialDay] = ()
) -> Figure:
    """Hours in the air per GPU per day, each day of the period, against the target."""
    x = _days(rows)
    fig = {
        "data": [
            {
                "type": "bar",
                "x": x,
                "y": [_num(r.hours_in_air_per_day, 2) for r in rows],
                "name": "Hours in the air / GPU / day",
                "marker": {"color": AIR},
                "hovertemplate": "%{y:.1f} h<extra></extra>",
            },
            _target_line(
                x, round(target_utilization * 24, 2), f"Target {target_utilization * 24:.1f} h"
            ),
        ],
        "layout": _layout(yaxis={"title": {"text": "hours / GPU / day"}, "range": [0, 24]}),
    }
    return _mark_partial(fig, x, partial_days)


def utilization_trend(
    rows: Sequence[CostRow], *, target_utilization: float, partial_days: Sequence[PartialDay] = ()
) -> Figure:
    x = _days(rows)
    fig = {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": x,
                "y": [_pct(r.utilization) for r in rows],
                "name": "Utilisation",
                "line": {"color": AIR, "width": 2.5},
                "fill": "tozeroy",
                "fillcolor": "rgba(31,111,235,0.08)",
                "hovertemplate": "%{y:.1f} %<extra></extra>",
            },
            _target_line(x, round(target_utilization * 100, 1), f"Target {target_utilization:.0%}"),
        ],
        "layout": _layout(yaxis={"title": {"text": "%"}, "range": [0, 100]}),
    }
    return _mark_partial(fig, x, partial_days)


def block_hours_stacked(
    rows: Sequence[CostRow],
    *,
    x: list[str] | None = None,
    horizontal: bool = False,
    partial_days: Sequence[PartialDay] = (),
) -> Figure:
    """The block-hours breakdown (air / held / parked / offline), per GPU per day: each bar
    sums to 24 h."""
    labels = x if x is not None else _days(rows)
    data = []
    for attr, name, color in BLOCKS:
        values = [_per_gpu_day(r, getattr(r, attr)) for r in rows]
        trace: dict[str, Any] = {
            "type": "bar",
            "name": name,
            "marker": {"color": color},
            "hovertemplate": f"{name}: %{{{'x' if horizontal else 'y'}:.1f}} h<extra></extra>",
        }
        if horizontal:
            trace.update(orientation="h", x=values, y=labels)
        else:
            trace.update(x=labels, y=values)
        data.append(trace)
    axis = {"title": {"text": "hours / GPU / day"}, "range": [0, 24], "dtick": 6}
    layout = _layout(barmode="stack", bargap=0.15)
    if horizontal:
        layout["xaxis"] = {**layout["xaxis"], **axis}
        layout["yaxis"] = {"automargin": True, "autorange": "reversed"}
        layout["hovermode"] = "y unified"
        layout["height"] = max(220, 26 * len(labels) + 80)
    else:
        layout["yaxis"] = {**layout["yaxis"], **axis}
    return _mark_partial({"data": data, "layout": layout}, labels, partial_days)


def cost_trend(
    rows: Sequence[CostRow], *, currency: str, partial_days: Sequence[PartialDay] = ()
) -> Figure:
    """Per day: the cost of the hours in the air against the idle cost (together the total)."""
    x = _days(rows)
    busy = [_num(r.total_cost - r.idle_cost, 2) for r in rows]
    idle = [_num(r.idle_cost, 2) for r in rows]
    fig = {
        "data": [
            {
                "type": "bar",
                "x": x,
                "y": busy,
                "name": "Cost of hours in the air",
                "marker": {"color": MONEY},
                "hovertemplate": f"%{{y:,.2f}} {currency}<extra></extra>",
            },
            {
                "type": "bar",
                "x": x,
                "y": idle,
                "name": "Idle cost",
                "marker": {"color": IDLE_MONEY},
                "hovertemplate": f"%{{y:,.2f}} {currency}<extra></extra>",
            },
        ],
        "layout": _layout(barmode="stack", yaxis={"title": {"text": currency}}),
    }
    return _mark_partial(fig, x, partial_days)


def cost_per_air_hour_trend(
    rows: Sequence[CostRow], *, currency: str, partial_days: Sequence[PartialDay] = ()
) -> Figure:
    """What one hour of real GPU work cost, against the nominal hourly rate."""
    x = _days(rows)
    fig = {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": x,
                "y": [_num(r.cost_per_air_hour, 3) for r in rows],
                "name": "Cost per air hour",
                "line": {"color": IDLE_MONEY, "width": 2.5},
                "hovertemplate": f"%{{y:,.2f}} {currency}<extra></extra>",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": [_num(r.nominal_rate_per_hour, 3) for r in rows],
                "name": "Nominal rate / GPU-hour",
                "line": {"color": MONEY, "dash": "dot"},
                "hovertemplate": f"%{{y:,.2f}} {currency}<extra></extra>",
            },
        ],
        "layout": _layout(yaxis={"title": {"text": f"{currency} / hour"}}),
    }
    return _mark_partial(fig, x, partial_days)


def _per_profiled_day(hours: float | None, row: CostRow) -> float | None:
    """Hours of one kind among the hours with profiling data, per 24 of them: hours per GPU
    per day on the GPUs (and hours) that were profiled."""
    if hours is None or not row.profiled_hours:
        return None
    return round(hours / (row.profiled_hours / 24), 3)


def busy_vs_working_trend(
    rows: Sequence[CostRow], *, partial_days: Sequence[PartialDay] = ()
) -> Figure | None:
    """Per day, on the hours with profiling data (docs/metrics.md, "Work"): the hours a
    kernel ran (in the air), the hours the SMs really worked, and the hours the tensor cores
    did, each per GPU per day. ``None`` where no day has profiling data (the page says so)."""
    if not any(r.profiled_hours for r in rows):
        return None
    x = _days(rows)

    def bars(values: list[float | None], name: str, color: str) -> dict[str, Any]:
        return {
            "type": "bar",
            "x": x,
            "y": values,
            "name": name,
            "marker": {"color": color},
            "hovertemplate": "%{y:.1f} h<extra>" + name + "</extra>",
        }

    air = [
        _per_profiled_day(
            None if r.work_hours is None else r.work_hours + (r.busy_not_working_hours or 0), r
        )
        for r in rows
    ]
    fig = {
        "data": [
            bars(air, "Kernel running (in the air)", AIR),
            bars([_per_profiled_day(r.work_hours, r) for r in rows], "SMs working", WORK),
            bars(
                [_per_profiled_day(r.tensor_hours, r) for r in rows], "Tensor cores working", TENSOR
            ),
        ],
        "layout": _layout(
            barmode="group",
            bargap=0.2,
            yaxis={"title": {"text": "hours / GPU / day"}, "range": [0, 24], "dtick": 6},
        ),
    }
    return _mark_partial(fig, x, partial_days)


def energy_trend(rows: Sequence[CostRow], *, partial_days: Sequence[PartialDay] = ()) -> Figure:
    x = _days(rows)
    co2e = [_num(r.co2e_kg, 1) for r in rows]
    fig = {
        "data": [
            {
                "type": "bar",
                "x": x,
                "y": [_num(r.energy_kwh - r.idle_energy_kwh, 2) for r in rows],
                "name": "kWh (active)",
                "marker": {"color": ENERGY},
                "hovertemplate": "%{y:,.0f} kWh<extra></extra>",
            },
            {
                "type": "bar",
                "x": x,
                "y": [_num(r.idle_energy_kwh, 2) for r in rows],
                "name": "kWh (idle)",
                "marker": {"color": IDLE_ENERGY},
                "hovertemplate": "%{y:,.0f} kWh<extra></extra>",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": co2e,
                "name": "CO2e kg",
                "yaxis": "y2",
                "line": {"color": CO2E},
                "hovertemplate": "%{y:,.0f} kg<extra></extra>",
            },
        ],
        "layout": _layout(
            barmode="stack",
            yaxis={"title": {"text": "kWh"}},
            yaxis2={
                "title": {"text": "kg CO2e"},
                "overlaying": "y",
                "side": "right",
                "showgrid": False,
                **round_axis(co2e),
            },
            margin={"l": 56, "r": 56, "t": 28, "b": 40},
        ),
    }
    return _mark_partial(fig, x, partial_days)


def throttled_trend(rows: Sequence[CostRow], *, partial_days: Sequence[PartialDay] = ()) -> Figure:
    """GPU-hours with the clocks held down per day (any reason), the reasons on hover. A
    reason's hours may overlap another's: only the total is drawn."""
    x = _days(rows)
    reasons = [
        [
            _num(r.throttled_power_cap_hours, 1),
            _num(r.throttled_thermal_hours, 1),
            _num(r.throttled_hw_slowdown_hours, 1),
            _num(r.throttled_other_hours, 1),
        ]
        for r in rows
    ]
    fig = {
        "data": [
            {
                "type": "bar",
                "x": x,
                "y": [_num(r.throttled_hours, 2) for r in rows],
                "customdata": reasons,
                "name": "Throttled GPU-hours",
                "marker": {"color": THROTTLED},
                "hovertemplate": "%{y:,.1f} h: power cap %{customdata[0]} h, thermal "
                "%{customdata[1]} h, hardware slowdown %{customdata[2]} h, other "
                "%{customdata[3]} h<extra></extra>",
            }
        ],
        "layout": _layout(showlegend=False, yaxis={"title": {"text": "GPU-hours"}}),
    }
    return _mark_partial(fig, x, partial_days)


def queue_waited_trend(
    rows: Sequence[CostRow],
    days: Mapping[dt.date, tuple[float, float]],
    *,
    partial_days: Sequence[PartialDay] = (),
) -> Figure:
    """Waited vs held, per day: GPU-hours jobs waited for capacity (``days``: the queue's
    waited and wanted-while-held GPU-hours per report day, ``billing.selectors.queue``), the
    part of them wanted while the partitions' GPUs sat held or parked, and the fleet's held +
    parked GPU-hours (``rows``, the overview's days) as a line."""
    x = _days(rows)
    per_day = [days.get(r.period_start.date(), (0.0, 0.0)) for r in rows]
    fig = {
        "data": [
            {
                "type": "bar",
                "x": x,
                "y": [_num(w, 2) for w, _ in per_day],
                "name": "Waited for GPUs",
                "marker": {"color": API},
                "hovertemplate": "%{y:,.1f} GPU-h waited for capacity<extra></extra>",
            },
            {
                "type": "bar",
                "x": x,
                "y": [_num(h, 2) for _, h in per_day],
                "name": "of which while GPUs sat held or parked",
                "marker": {"color": IDLE_MONEY},
                "hovertemplate": "%{y:,.1f} GPU-h wanted while held<extra></extra>",
            },
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": x,
                "y": [_num(r.held_hours + r.parked_hours, 2) for r in rows],
                "name": "Held + parked GPU-hours",
                "line": {"color": HELD},
                "hovertemplate": "%{y:,.1f} GPU-h held or parked<extra></extra>",
            },
        ],
        "layout": _layout(barmode="overlay", yaxis={"title": {"text": "GPU-hours"}}),
    }
    return _mark_partial(fig, x, partial_days)


# --- heatmap --------------------------------------------------------------------------------
def utilization_heatmap(
    *,
    gpu_labels: list[str],
    columns: list[str],
    z: list[list[float | None]],
    by: str,
    offline_hours: list[list[float | None]] | None = None,
    capacity_hours: list[list[float | None]] | None = None,
) -> Figure:
    """GPUs × days (or hours) coloured by utilisation (%). A cell whose capacity was more
    than half offline (no data, still paid for) is drawn in the offline colour instead: an
    offline GPU is not an idle one."""
    offline_hours = offline_hours or [[None] * len(columns) for _ in gpu_labels]
    capacity_hours = capacity_hours or [[None] * len(columns) for _ in gpu_labels]

    def mostly_offline(off: float | None, cap: float | None) -> bool:
        return bool(off and cap and off > cap / 2)

    offline = [
        [mostly_offline(o, c) for o, c in zip(off_row, cap_row, strict=True)]
        for off_row, cap_row in zip(offline_hours, capacity_hours, strict=True)
    ]
    hours = [[round(o, 1) if o else 0.0 for o in row] for row in offline_hours]
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "name": "Utilisation",
            "x": columns,
            "y": gpu_labels,
            "z": [
                [None if off else v for v, off in zip(z_row, off_row, strict=True)]
                for z_row, off_row in zip(z, offline, strict=True)
            ],
            "customdata": hours,
            "zmin": 0,
            "zmax": 100,
            "colorscale": [
                [0, HEAT[0]],
                [0.05, HEAT[1]],
                [0.3, HEAT[2]],
                [0.6, HEAT[3]],
                [1, HEAT[4]],
            ],
            "colorbar": {"title": {"text": "util %"}, "thickness": 12},
            "xgap": 1,
            "ygap": 1,
            "hovertemplate": "%{y}<br>%{x}<br>%{z:.0f} %, offline %{customdata} h<extra></extra>",
        },
    ]
    if any(any(row) for row in offline):
        data.append(
            {
                "type": "heatmap",
                "name": "Offline",
                "x": columns,
                "y": gpu_labels,
                "z": [[1 if off else None for off in row] for row in offline],
                "customdata": hours,
                "zmin": 0,
                "zmax": 1,
                "colorscale": [[0, OFFLINE], [1, OFFLINE]],
                "showscale": False,
                "xgap": 1,
                "ygap": 1,
                "hovertemplate": "%{y}<br>%{x}<br>offline %{customdata} h: no data, still "
                "paid for<extra></extra>",
            }
        )
    return {
        "data": data,
        "layout": _layout(
            hovermode="closest",
            height=max(320, 14 * len(gpu_labels) + 90),
            yaxis={
                "autorange": "reversed",
                "automargin": True,
                "tickfont": {"size": 10},
                "gridcolor": "rgba(0,0,0,0)",
            },
            xaxis={
                # The title below the tick labels, however they turn on a narrow screen
                # (automargin makes room for both rather than cutting the labels).
                "title": {"text": "day" if by == "day" else "hour", "standoff": 8},
                "automargin": True,
                "gridcolor": "rgba(0,0,0,0)",
                "type": "category" if by == "hour" else "date",
                # Days as "5 Nov" on one line (Plotly's default adds the year on a second).
                **({"tickformat": "%-d %b"} if by == "day" else {}),
                # A few days: one tick a day, not Plotly's noon ticks between them.
                **({"dtick": 86_400_000} if by == "day" and len(columns) <= 14 else {}),
            },
            margin={"l": 120, "r": 16, "t": 16, "b": 48},
        ),
    }


# --- GPU detail -----------------------------------------------------------------------------
def gpu_timeseries(
    *,
    x: list[str],
    util_pct: list[float | None],
    power_w: list[float | None],
    temp_c: list[float | None],
    throttled_pct: list[float | None],
    title_suffix: str = "",
) -> Figure:
    """Four stacked panels sharing the time axis: utilisation, power, temperature, throttling."""

    def line(
        y: list[float | None], name: str, color: str, axis: str, unit: str, kind: str = "scatter"
    ) -> dict[str, Any]:
        trace: dict[str, Any] = {
            "type": kind,
            "x": x,
            "y": y,
            "name": name,
            "yaxis": axis,
            "marker": {"color": color},
            "hovertemplate": f"%{{y:.1f}} {unit}<extra>{name}</extra>",
        }
        if kind == "scatter":
            trace.update(mode="lines", line={"color": color, "width": 1.8})
        return trace

    layout = _layout(
        height=560,
        showlegend=False,
        margin={"l": 64, "r": 16, "t": 16, "b": 40},
        xaxis={"anchor": "y4", "gridcolor": GRID},
        yaxis={"domain": [0.78, 1], "title": {"text": "util %"}, "range": [0, 100]},
        yaxis2={
            "domain": [0.52, 0.74],
            "title": {"text": "W"},
            "gridcolor": GRID,
            **round_axis(power_w, ticks=3),  # the highest power at or below the top tick
        },
        yaxis3={"domain": [0.26, 0.48], "title": {"text": "°C"}, "gridcolor": GRID},
        yaxis4={
            "domain": [0, 0.22],
            "title": {"text": "throttled %"},
            "range": [0, 100],
            "gridcolor": GRID,
        },
    )
    return {
        "data": [
            line(util_pct, "Utilisation" + title_suffix, AIR, "y", "%"),
            line(power_w, "Power", ENERGY, "y2", "W"),
            line(temp_c, "Temperature", TEMPERATURE, "y3", "°C"),
            line(throttled_pct, "Throttled", THROTTLED, "y4", "%", kind="bar"),
        ],
        "layout": layout,
    }


def gpu_activity(
    *,
    x: list[str],
    kernel_pct: list[float | None],
    sm_pct: list[float | None],
    tensor_pct: list[float | None],
    dram_pct: list[float | None],
) -> Figure:
    """One GPU per hour: the share of time a kernel ran (NVML utilisation) against what the
    SMs, the tensor cores and the memory bandwidth really did (profiling data)."""

    def line(y: list[float | None], name: str, color: str, dash: str = "solid") -> dict[str, Any]:
        return {
            "type": "scatter",
            "mode": "lines",
            "x": x,
            "y": y,
            "name": name,
            "line": {"color": color, "width": 1.8, "dash": dash},
            "connectgaps": False,
            "hovertemplate": "%{y:.1f} %<extra>" + name + "</extra>",
        }

    return {
        "data": [
            line(kernel_pct, "Kernel running (utilisation)", AIR, "dot"),
            line(sm_pct, "SMs active", WORK),
            line(tensor_pct, "Tensor cores active", TENSOR),
            line(dram_pct, "Memory bandwidth used", DRAM),
        ],
        "layout": _layout(yaxis={"title": {"text": "% of the hour"}, "range": [0, 100]}),
    }


# --- teams and pools ------------------------------------------------------------------------
def _group_names(rows: Sequence[CostRow]) -> list[str]:
    """The bars' names: an adjustment row (late data for a closed month) says so, or its bar
    would fall on the team's own."""
    return [
        f"{r.name} (adjustment for {r.adjustment_for})" if r.adjustment_for else r.name
        for r in rows
    ]


def group_cost_bars(rows: Sequence[CostRow], *, currency: str) -> Figure:
    """Per team or pool: the cost of the hours in the air and the idle cost, stacked."""
    names = _group_names(rows)
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": names,
                "x": [_num(r.total_cost - r.idle_cost, 2) for r in rows],
                "name": "Cost of hours in the air",
                "marker": {"color": MONEY},
                "hovertemplate": f"%{{x:,.2f}} {currency}<extra></extra>",
            },
            {
                "type": "bar",
                "orientation": "h",
                "y": names,
                "x": [_num(r.idle_cost, 2) for r in rows],
                "name": "Idle cost",
                "marker": {"color": IDLE_MONEY},
                "hovertemplate": f"%{{x:,.2f}} {currency}<extra></extra>",
            },
        ],
        "layout": _layout(
            barmode="stack",
            hovermode="y unified",
            height=max(220, 34 * len(rows) + 90),
            yaxis={"autorange": "reversed", "automargin": True},
            xaxis={"title": {"text": currency}},
        ),
    }


def group_util_bars(rows: Sequence[CostRow], *, target_utilization: float) -> Figure:
    names = _group_names(rows)
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": names,
                "x": [_pct(r.utilization) for r in rows],
                "name": "Utilisation",
                "marker": {"color": AIR},
                "hovertemplate": "%{x:.1f} %<extra></extra>",
            },
        ],
        "layout": _layout(
            hovermode="y unified",
            height=max(220, 34 * len(rows) + 90),
            showlegend=False,
            yaxis={"autorange": "reversed", "automargin": True},
            xaxis={"title": {"text": "utilisation %"}, "range": [0, 100]},
            shapes=[
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": target_utilization * 100,
                    "x1": target_utilization * 100,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": TARGET, "dash": "dash", "width": 2},
                }
            ],
        ),
    }


# --- break-even -----------------------------------------------------------------------------
def _log_ticks(values: Iterable[float | None]) -> dict[str, Any]:
    """A log axis's ticks at 1, 2 and 5 of each decade the values span, each labelled in full
    ("0.2", "2", "20"): Plotly's own minor labels read "2" for 0.2 and 2.0 alike."""
    shown = [v for v in values if v is not None and v > 0]
    if not shown:
        return {}
    low = math.floor(math.log10(min(shown)))
    high = math.ceil(math.log10(max(shown)))
    ticks = [m * 10.0**e for e in range(low, high + 1) for m in (1, 2, 5) if e < high or m == 1]
    return {
        "tickmode": "array",
        "tickvals": ticks,
        "ticktext": [f"{t:,.{max(0, -math.floor(math.log10(t)))}f}" for t in ticks],
    }


def _vline(
    x: float, color: str, text: str, dash: str = "dash"
) -> tuple[dict[str, Any], dict[str, Any]]:
    shape = {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": color, "dash": dash, "width": 2},
    }
    # On the side of the line with room for the label: a mark near the right edge (u* at
    # 98.8 %) labelled to its right was cut off by the plot's edge.
    right_half = x > 50
    note = {
        "x": x,
        "y": 0.98,
        "xref": "x",
        "yref": "paper",
        "text": text,
        "showarrow": False,
        "yanchor": "top",
        "xanchor": "right" if right_half else "left",
        "xshift": -4 if right_half else 4,
        "bgcolor": LABEL_BG,
        "font": {"color": color, "size": 11},
    }
    return shape, note


def _own_against_line(
    result: BreakevenResult,
    *,
    own: list[float | None],
    own_name: str,
    line_y: float,
    line_name: str,
    line_color: str,
    breakeven: float | None,
    breakeven_label: str,
    unit: str,
    hover_format: str,
    height: int,
    own_color: str = MONEY,
    extra_values: Sequence[float | None] = (),
    **layout: Any,
) -> Figure:
    """Own cost against utilisation beside a flat alternative (an API price, a rental rate),
    with the break-even and today's utilisation marked: the two break-even charts.
    ``extra_values``: those of a curve the caller adds, for the axis's ticks."""
    us = [round(u * 100, 1) for u, _ in result.curve]
    marks = [
        (breakeven, line_color, breakeven_label, "dash"),
        (result.utilization, AIR, "today", "solid"),
    ]
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    for u, color, label, dash in marks:
        if u is not None:
            s, n = _vline(u * 100, color, f"{label} {u:.0%}", dash)
            # One label a line lower than the other: two close marks would write over each
            # other.
            n["y"] = 0.98 - 0.09 * len(notes)
            shapes.append(s)
            notes.append(n)
    hover = f"%{{y:{hover_format}}} {result.currency}{unit}"
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines",
                "x": us,
                "y": own,
                "name": own_name,
                "line": {"color": own_color, "width": 2.5},
                "hovertemplate": hover + f"<extra>{own_name}</extra>",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "x": [0, 100],
                "y": [line_y, line_y],
                "name": line_name,
                "line": {"color": line_color, "width": 2.5},
                "hovertemplate": hover + f"<extra>{line_name}</extra>",
            },
        ],
        "layout": _layout(
            height=height,
            shapes=shapes,
            annotations=notes,
            xaxis={"title": {"text": "utilisation %"}, "range": [0, 100]},
            yaxis={
                "title": {"text": f"{result.currency} per {unit.strip(' /')}"},
                "type": "log",
                **_log_ticks([*own, line_y, *extra_values]),
            },
            margin={"l": 64, "r": 16, "t": 40, "b": 44},
            **layout,
        ),
    }


def breakeven_curve(result: BreakevenResult) -> Figure:
    """Cost per million tokens against utilisation (owning, or renting for a rented pool),
    the API price, u* and the measured u; a rented pool's owning-instead curve beside."""
    rented = result.comparison == be.RENTED
    instead = result.owning_instead if rented else None
    instead_y = [_num(c, 4) for _, c in instead.curve] if instead is not None else []
    figure = _own_against_line(
        result,
        own=[_num(c, 4) for _, c in result.curve],
        own_name="Renting (this pool)" if rented else "Own GPUs",
        own_color=RENT if rented else MONEY,
        line_y=float(result.api_price_per_mtok),
        line_name="API price",
        line_color=API,
        breakeven=result.breakeven_utilization,
        breakeven_label="u*",
        unit=" / million tokens",
        hover_format=",.3f",
        height=380,
        hovermode="x unified",
        extra_values=instead_y,
    )
    if instead is not None:
        figure["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": [round(u * 100, 1) for u, _ in instead.curve],
                "y": instead_y,
                "name": "Owning instead",
                "line": {"color": MONEY, "width": 2, "dash": "dot"},
                "hovertemplate": f"%{{y:,.3f}} {result.currency} / million tokens"
                "<extra>owning instead</extra>",
            }
        )
    return figure


def breakeven_month(result: BreakevenResult) -> Figure:
    """Money per month at the measured utilisation: owning (or renting, for a rented pool)
    against the API; a rented pool's owning instead beside, where known."""
    rented = result.comparison == be.RENTED
    bars = [
        ("Renting" if rented else "Own GPUs", result.own_cost_per_month, RENT if rented else MONEY),
        ("API", result.api_cost_per_month, API),
    ]
    if rented and result.owning_instead is not None:
        bars.append(("Owning instead", result.owning_instead.cost_per_month, MONEY))
    return {
        "data": [
            {
                "type": "bar",
                "x": [name for name, _, _ in bars],
                "y": [_num(value, 2) for _, value, _ in bars],
                "marker": {"color": [color for _, _, color in bars]},
                "text": [f"{float(value):,.0f}" for _, value, _ in bars],
                "textposition": "outside",
                "hovertemplate": f"%{{y:,.2f}} {result.currency}<extra></extra>",
            },
        ],
        "layout": _layout(
            height=300,
            showlegend=False,
            hovermode="closest",
            yaxis={"title": {"text": f"{result.currency} / month"}},
        ),
    }


def rent_curve(result: BreakevenResult) -> Figure | None:
    """Own cost per air hour against renting on demand (only the air hours rented)."""
    if result.rental_rate_per_hour is None or not result.tokens_per_s:
        return None
    mtok_per_air_hour = result.tokens_per_s * 3600 / 1e6  # unit change: M tokens per air hour
    return _own_against_line(
        result,
        own=[_num(float(c) * mtok_per_air_hour, 4) for _, c in result.curve],
        own_name="Own, per air hour",
        line_y=float(result.rental_rate_per_hour),
        line_name="Rent on demand",
        line_color=RENT,
        breakeven=result.rent_breakeven_utilization,
        breakeven_label="u* rent",
        unit=" / air hour",
        hover_format=",.2f",
        height=320,
    )


def iso_hours(hours: Iterable[dt.datetime]) -> list[str]:
    return [h.isoformat() for h in hours]
