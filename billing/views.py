"""Dashboard views: thin, every figure from ``billing.selectors`` (one definition per metric).

Pages read hourly rollups through the selectors, never the raw table (except the recent hours
of one GPU on its detail page), so the number of queries per page does not grow with the
number of GPUs. Money is computed only for users who may see it (``fleet.view_costs``): a
viewer's page carries no money at all, not even hidden.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from decimal import Decimal
from operator import attrgetter
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import NoReverseMatch, Resolver404, resolve, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing import breakeven as be
from billing import charts, focus, selectors
from billing import cost_model as cm
from billing.dashboard import (
    FILTER_KEYS,
    MONEY_SORTS,
    SORTS,
    DashboardFilters,
    blocks,
    dashboard_filters,
    first_data_at,
    gpu_cost_profile,
    partial_days,
    pool_rental_rate,
    range_bounds,
    window_hours_to_now,
)
from billing.efficiency import EfficiencyFigures, efficiency_figures
from billing.focus_exports import (
    focus_export_filename,
    focus_export_months,
    focus_export_request,
)
from billing.formatting import count, money, money_exact, money_shown, num, pct
from billing.forms import FLEET_CHOICE, BreakevenForm
from billing.models import FocusExport
from billing.month_close import closed_months_between, month_parse
from billing.selectors.queue import QueueOverview, queue_overview
from billing.workloads import UNASSIGNED
from fleet.models import Gpu, Team
from fleet.selectors import gpus_with_attribution, team_cost_centers

RECENT_HOURS = 6  # raw samples shown on a GPU's page: recent enough to still be in the raw table


def _can_view_costs(request: HttpRequest) -> bool:
    return bool(request.user.has_perm("fleet.view_costs"))


def _context(
    request: HttpRequest, flt: DashboardFilters, page: str, **extra: Any
) -> dict[str, Any]:
    return {
        "page": page,
        "flt": flt,
        "qs": flt.querystring,
        "filter_options": flt.form.options(),
        "filter_errors": flt.form.errors,
        "presets": flt.presets(extra.get("keep", [])),
        "dark_colours": charts.DARK,
        "can_view_costs": _can_view_costs(request),
        "currency": flt.currency,
        "closed_months": closed_months_between(start=flt.start, end=flt.end_exclusive),
        "unassigned": UNASSIGNED,  # the users' and accounts' "(none)" row, said in words
        **extra,
    }


def _card(
    label: str,
    value: str,
    sub: str = "",
    *,
    accent: str = "",
    ident: str = "",
    unit: str = "",
    exact: str = "",
    period: str = "",
    status: str = "",
    good: bool | None = None,
) -> dict[str, Any]:
    """One KPI card. ``accent``: the colour of what it measures (static/css/app.css: air,
    offline, money, idle-money, energy, co2e, throttled, api), never a verdict; the verdict is
    ``status``, a few words (green only when ``good``: the target's colour). ``period``: the
    days it covers when not the page's (the template says the page's)."""
    return {
        "label": label,
        "value": value,
        "unit": unit,
        "exact": exact,
        "sub": sub,
        "accent": accent,
        "id": ident,
        "period": period,
        "status": status,
        "good": good,
    }


def _money_card(
    label: str, value: Decimal | None, currency: str, sub: str = "", **kwargs: Any
) -> dict[str, Any]:
    """A money card by the one rule (billing.formatting): separators, cents below 10,000,
    the currency beside it, the exact figure on hover."""
    kwargs.setdefault("accent", "money")
    return _card(
        label,
        money_shown(value),
        sub,
        unit=currency if value is not None else "",
        exact=money_exact(value, currency),
        **kwargs,
    )


def _row_money_cards(
    row: selectors.CostRow, currency: str, *, total_note: str = ""
) -> list[dict[str, Any]]:
    """The money cards of one cost row (the fleet's on the overview, a GPU's on its page):
    total cost, idle cost with its share of the total, cost per air hour against the nominal
    rate per GPU-hour."""
    idle_share = float(row.idle_cost / row.total_cost) if row.total_cost else None
    return [
        _money_card("Total cost", row.total_cost, currency, total_note, ident="kpi-total-cost"),
        _money_card(
            "Idle cost",
            row.idle_cost,
            currency,
            f"{pct(idle_share, 0)} of total" if idle_share is not None else "",
            accent="idle-money",
            ident="kpi-idle-cost",
        ),
        _money_card(
            "Cost per air hour",
            row.cost_per_air_hour,
            currency,
            f"nominal {money(row.nominal_rate_per_hour, currency)} / GPU-hour",
            ident="kpi-cost-per-air-hour",
        ),
    ]


def _queue_card(queue: QueueOverview, *, currency: str) -> dict[str, Any]:
    """GPU hours waited for capacity, and what the part of them wanted while GPUs of the
    partitions' pools sat held or parked cost (finance, admin) or amounts to (viewers)."""
    wanted = f"{num(queue.wanted_gpu_hours, 1)} GPU-h of it while GPUs sat held or parked"
    if queue.wanted_cost is not None:
        wanted += f": {money_shown(queue.wanted_cost)} {currency} of idle GPUs"
    return _card(
        "Waited for GPUs",
        num(queue.waited_gpu_hours, 0),
        wanted,
        accent="idle-money" if queue.wanted_gpu_hours else "",
        unit="GPU-h",
        ident="kpi-queue",
    )


def _efficiency_card(figures: EfficiencyFigures, *, show_money: bool) -> dict[str, Any]:
    """The fleet's job efficiency (docs/metrics.md, "Job efficiency"): MFU, then where the
    time of the training loops went and, for finance and admin, a million tokens' cost."""
    r = figures.row
    sub = (
        f"data-starved {pct(r.data_starved_share)}, checkpointing {pct(r.checkpoint_share)}, "
        f"{num(r.tokens_per_gpu_hour, 0)} tokens per GPU-hour"
    )
    if show_money and figures.cost_per_mtok is not None:
        sub += f", {money(figures.cost_per_mtok, figures.currency, places=3)} per M tokens"
    return _card(
        "Job efficiency (MFU)",
        pct(r.mfu) if r.mfu is not None else "no flops reported",
        sub,
        accent="air",
        ident="kpi-efficiency",
        exact=f"{num(r.gpu_hours, 0)} GPU-hours of training loops reporting",
    )


def _throttled_card(row: selectors.CostRow, *, unit: str) -> dict[str, Any]:
    """Hours with the clocks held down (any reason), the two common reasons beneath."""
    return _card(
        "Throttled",
        num(row.throttled_hours),
        f"power cap {num(row.throttled_power_cap_hours)} h · "
        f"thermal {num(row.throttled_thermal_hours)} h",
        accent="throttled",
        unit=unit,
        ident="kpi-throttled",
    )


# What a page says where no GPU of the selection sent profiling data (SM activity from NVML
# GPM or dcgm-exporter): never a 0, which would read as "the SMs did nothing".
NO_PROFILING = "no profiling data"


def _work_card(row: selectors.CostRow, *, show_money: bool, currency: str) -> dict[str, Any]:
    """Cost per work hour (finance) or work utilisation (everyone else): what the SMs really
    did, from profiling data; "no profiling data" where no GPU of the selection has any."""
    if row.work_utilization is None:
        label = "Cost per work hour" if show_money else "Work utilisation"
        ident = "kpi-cost-per-work-hour" if show_money else "kpi-work-utilization"
        return _card(
            label,
            NO_PROFILING,
            "no SM activity reported here (NVML GPM or dcgm-exporter)",
            ident=ident,
        )
    worked = f"SMs worked {pct(row.work_utilization)} of the time profiled"
    if not show_money:
        return _card(
            "Work utilisation",
            pct(row.work_utilization),
            "work hours / hours profiled",
            accent="air",
            status=worked,
            ident="kpi-work-utilization",
        )
    return _money_card(
        "Cost per work hour",
        row.cost_per_work_hour,
        currency,
        "cost of the profiled GPU-hours / their work hours",
        status=worked,
        ident="kpi-cost-per-work-hour",
    )


def _work_text(row: selectors.CostRow) -> str:
    """A row's work utilisation as a table shows it, or that it has no profiling data."""
    return NO_PROFILING if row.work_utilization is None else pct(row.work_utilization)


def _target_status(utilization: float | None, target: float) -> tuple[str, bool | None]:
    if utilization is None:
        return "", None
    if utilization >= target:
        return f"at or above the {target:.0%} target", True
    return f"below the {target:.0%} target", False


def _recoverable_words(
    flt: DashboardFilters, target: float, *, data_from: dt.datetime | None
) -> tuple[str, str]:
    """What the recoverable GPUs card counts, in words (docs/metrics.md): GPU-equivalents over
    the period's hours (cut off at now), so the same utilisation over a month and over 30
    days, or over a window that starts before the data, gives different counts."""
    start, end = range_bounds(flt)
    hours = window_hours_to_now(start, end, now=timezone.now())
    sub = f"at {target:.0%} utilisation, GPU-equivalents over the period's {num(hours, 0)} h"
    if data_from is not None and start < data_from < end:
        zone = flt.fleet_settings.report_zone
        sub += f" (data from {data_from.astimezone(zone):%-d %b %H:%M})"
    how = (
        f"(capacity hours − air hours / {target:.0%}) / the period's {num(hours, 0)} hours: "
        "the GPUs the same work would not need at the target, each counted over the whole "
        "period, so hours without data lower it"
    )
    return sub, how


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def overview(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); money cards and charts need
    fleet.view_costs (finance, admin).

    The Monday-morning page: fleet utilisation, hours in the air per GPU per day against the
    target, money, energy, throttling, offline and recoverable GPUs, the trends and the block
    hours. A range in which no GPU was in service says so instead of zeros and empty axes.
    """
    flt = dashboard_filters(request.GET)
    show_money = _can_view_costs(request)
    # The cards (the whole window) and the trend charts (the fleet per day by the pooled
    # path, per rate class, not per GPU-day), from one load of the GPUs and their terms.
    summary, daily = selectors.fleet_overview(
        start=flt.start, end=flt.end_exclusive, filters=flt.filters
    )
    row = summary.row
    has_data = row.capacity_hours > 0
    cur = flt.currency
    target = summary.target_utilization
    status, good = _target_status(row.utilization, target)
    offline = summary.gpus_offline_now
    data_from = first_data_at()
    recoverable_sub, recoverable_how = _recoverable_words(flt, target, data_from=data_from)
    cards = [
        _card(
            "Fleet utilisation",
            pct(row.utilization),
            "air hours / capacity hours",
            accent="air",
            status=status,
            good=good,
            ident="kpi-utilization",
        ),
        _card(
            "Hours in the air / GPU / day",
            num(row.hours_in_air_per_day),
            f"target {target * 24:.1f} h",
            accent="air",
            unit="h",
            ident="kpi-air-hours",
        ),
        _card(
            "GPUs offline now",
            str(offline),
            f"of {summary.gpus_in_service} in service",
            accent="offline" if offline else "",
            period="now",
            ident="kpi-offline",
        ),
        _throttled_card(row, unit="GPU-h"),
        _card(
            "Recoverable GPUs",
            num(summary.recoverable_gpus),
            recoverable_sub,
            exact=recoverable_how,
            ident="kpi-recoverable",
        ),
        _card(
            "Energy",
            num(row.energy_kwh, 0),
            f"{num(row.energy_per_gpu_hour_kwh, 3)} kWh per GPU-hour",
            accent="energy",
            unit="kWh",
            ident="kpi-energy",
        ),
        _card(
            "CO2e",
            num(row.co2e_kg / 1000, 2),
            f"{num(row.co2e_kg, 0)} kg",
            accent="co2e",
            unit="t",
            ident="kpi-co2e",
        ),
    ]
    if show_money:
        cards[5:5] = [
            *_row_money_cards(
                row, cur, total_note=f"{num(row.capacity_hours, 0)} GPU-hours in service"
            ),
            _money_card(
                "Recoverable money / year",
                summary.recoverable_money_per_year,
                cur,
                f"{num(summary.recoverable_gpus)} GPUs at {target:.0%}",
                ident="kpi-recoverable-money",
            ),
        ]
    # Beside the cost per air hour (finance), else beside the hours in the air.
    beside = "kpi-cost-per-air-hour" if show_money else "kpi-air-hours"
    at = next(i for i, c in enumerate(cards) if c["id"] == beside)
    cards.insert(at + 1, _work_card(row, show_money=show_money, currency=cur))
    # Queue pressure (every cluster; the queue is not the filter's): only where a collector
    # reported pending GPU jobs in the range.
    queue = (
        queue_overview(
            start=flt.start,
            end=flt.end_exclusive,
            zone_name=flt.fleet_settings.report_time_zone,
            money=show_money,
        )
        if has_data and flt.filters == selectors.Filters()
        else None
    )
    if queue is not None:
        cards.append(_queue_card(queue, currency=cur))
    # Job efficiency (every job whose training loop reports through gpufleet_hook): a card,
    # and the workloads most starved for data.
    efficiency: list[EfficiencyFigures] = []
    starved: list[EfficiencyFigures] = []
    if has_data and flt.filters == selectors.Filters():
        efficiency = efficiency_figures(start=flt.start, end=flt.end_exclusive, group_by="fleet")
    if efficiency:
        cards.append(_efficiency_card(efficiency[0], show_money=show_money))
        starved = sorted(
            (
                f
                for f in efficiency_figures(
                    start=flt.start, end=flt.end_exclusive, group_by="workload"
                )
                if f.row.workload_id is not None and f.row.data_starved_share is not None
            ),
            key=lambda f: (-(f.row.data_starved_share or 0.0), f.row.key),
        )[:3]
    figures: dict[str, Any] = {}
    if has_data:
        partial = partial_days(flt, data_from=data_from)
        figures = {
            "chart-air-hours": charts.air_hours_trend(
                daily, target_utilization=target, partial_days=partial
            ),
            "chart-utilization": charts.utilization_trend(
                daily, target_utilization=target, partial_days=partial
            ),
            "chart-blocks": charts.block_hours_stacked(daily, partial_days=partial),
            "chart-throttled": charts.throttled_trend(daily, partial_days=partial),
            "chart-energy": charts.energy_trend(daily, partial_days=partial),
        }
        working = charts.busy_vs_working_trend(daily, partial_days=partial)
        if working is not None:
            figures["chart-busy-working"] = working
        if queue is not None:
            figures["chart-queue"] = charts.queue_waited_trend(
                daily, queue.days, partial_days=partial
            )
        if show_money:
            figures["chart-cost"] = charts.cost_trend(daily, currency=cur, partial_days=partial)
            figures["chart-cost-per-air-hour"] = charts.cost_per_air_hour_trend(
                daily, currency=cur, partial_days=partial
            )
    return render(
        request,
        "billing/overview.html",
        _context(
            request,
            flt,
            "overview",
            summary=summary,
            row=row,
            has_data=has_data,
            cards=cards if has_data else [],
            figures=figures,
            blocks=blocks(row),
            priced=row.priced,
            starved=[
                {
                    "label": f"{f.row.kind} {f.row.key}",
                    "url": reverse("workload-detail", args=[f.row.workload_id]),
                    "share": pct(f.row.data_starved_share),
                    "mfu": pct(f.row.mfu),
                }
                for f in starved
            ],
        ),
    )


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def overview_workloads_panel(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); its money (the top accounts) needs
    fleet.view_costs.

    The overview's "Who held the GPUs" panel, as an HTML fragment the overview fetches once it
    has loaded: summing a large fleet's workload rows takes longer than the rest of the page
    (docs/benchmarks.md, "Workloads"), so the page never waits for it. Empty when no workload
    held a GPU in the range.
    """
    from billing.workload_views import overview_workloads  # it builds on this module's cards

    flt = dashboard_filters(request.GET)
    row = selectors.fleet_summary(start=flt.start, end=flt.end_exclusive, filters=flt.filters).row
    workloads = (
        overview_workloads(flt=flt, held_hours=row.held_hours, show_money=_can_view_costs(request))
        if row.capacity_hours > 0
        else None
    )
    return render(
        request,
        "billing/_workload_panel.html",
        {
            "workloads": workloads,
            "qs": flt.querystring,
            "can_view_costs": _can_view_costs(request),
            "currency": flt.currency,
            "unassigned": UNASSIGNED,
        },
    )


def _gpu_url(uuid: str) -> str | None:
    """The GPU's page, or None for a uuid no URL can hold (stored before fleet.identifiers
    refused such uuids): its row is then shown without a link rather than failing the page."""
    try:
        return reverse("gpu-detail", args=[uuid])
    except NoReverseMatch:
        return None


BOARD_PAGE_SIZE = 100  # GPUs per page of the fleet board and the heatmap


def _page_of(
    items: list[Any], request: HttpRequest, flt: Any, **keep: str
) -> tuple[list[Any], dict[str, Any]]:
    """One page of ``items`` (already in display order) and the pager's context. The whole
    list is computed and sorted; only the page is drawn, since drawing 1,000 GPUs' rows or
    heatmap lines took longer than computing them."""
    pages = max(1, -(-len(items) // BOARD_PAGE_SIZE))
    try:
        page = min(max(1, int(request.GET.get("page", "1"))), pages)
    except ValueError:
        page = 1
    first = (page - 1) * BOARD_PAGE_SIZE
    shown = items[first : first + BOARD_PAGE_SIZE]
    pager = {
        "board_page": page,
        "board_pages": pages,
        "first_shown": first + 1 if shown else 0,
        "last_shown": first + len(shown),
        "total_shown": len(items),
        "prev_qs": flt.with_params(**keep, page=str(page - 1)) if page > 1 else "",
        "next_qs": flt.with_params(**keep, page=str(page + 1)) if page < pages else "",
    }
    return shown, pager


# The deferred rows' attributes the board's sorts name otherwise (``SORTS``).
_BOARD_ATTRS = {"last_seen": "last_seen_at"}


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def fleet_board(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); the idle-cost column (and sorting by it)
    needs fleet.view_costs.

    Every GPU as a row of an airline's fleet table, worst first.
    """
    flt = dashboard_filters(request.GET)
    show_money = _can_view_costs(request)
    # GPUs and models from one computation over the rollups; each GPU's row deferred: every
    # GPU is ordered by its figures, the rows of the page drawn are made whole.
    grouped = selectors.cost_rows_deferred_by(
        start=flt.start,
        end=flt.end_exclusive,
        group_bys=("gpu", "model"),
        period="all",
        filters=flt.filters,
    )
    rows, by_model = grouped["gpu"], [d.row() for d in grouped["model"]]
    sort = request.GET.get("sort", "")
    if sort not in SORTS or (sort in MONEY_SORTS and not show_money):
        sort = "idle_cost" if show_money else "util"
    label, attr, worst = SORTS[sort]
    direction = request.GET.get("dir", worst)
    if direction not in ("asc", "desc"):
        direction = worst
    # Every GPU ordered by its deferred row's figure; the board's rows made for the page.
    value = attrgetter(_BOARD_ATTRS.get(attr, attr))
    present = [r for r in rows if value(r) is not None]
    missing = [r for r in rows if value(r) is None]
    present.sort(key=value, reverse=direction == "desc")
    # Unknowns last whichever way.
    ordered, pager = _page_of(present + missing, request, flt, sort=sort, dir=direction)
    now = timezone.now()
    shown: list[dict[str, Any]] = []
    for r in ordered:
        last_seen = r.last_seen_at
        shown.append(
            {
                "row": r,
                "name": r.name,
                "uuid": r.key,
                "utilization": r.utilization,
                "work_utilization": r.work_utilization,
                "hours_in_air_per_day": r.hours_in_air_per_day,
                "idle_cost": r.idle_cost if show_money else None,
                "offline_hours": r.offline_hours,
                "throttled_hours": r.throttled_hours,
                "last_seen": last_seen,
                "stale": selectors.offline_now(last_seen, now),
                "priced": r.priced,
            }
        )
    # What the rollups do not hold (model, node) for the rows drawn: plain values, one query.
    gpus = {
        uuid: (model_name if model_id is not None else gpu_name, hostname)
        for uuid, model_id, model_name, gpu_name, hostname in Gpu.objects.filter(
            uuid__in=[b["uuid"] for b in shown]
        ).values_list("uuid", "model_id", "model__name", "name", "node__hostname")
    }
    for b in shown:  # the text of the rows drawn only
        r = b.pop("row").row()
        b["model"], b["node"] = gpus.get(b["uuid"], ("", ""))
        b["utilization_text"] = pct(r.utilization)
        b["work_text"] = _work_text(r)
        b["air_text"] = num(r.hours_in_air_per_day)
        b["idle_cost_text"] = money(r.idle_cost) if show_money else ""
        b["throttled_text"] = num(r.throttled_hours)
        b["url"] = _gpu_url(b["uuid"])
        b["blocks"] = blocks(r)
        b["adjustment_for"] = r.adjustment_for
    columns = []
    for key, (col_label, _attr, col_worst) in SORTS.items():
        if key in MONEY_SORTS and not show_money:
            continue
        next_dir = ("asc" if direction == "desc" else "desc") if key == sort else col_worst
        columns.append(
            {
                "key": key,
                "label": col_label,
                "active": key == sort,
                "dir": direction if key == sort else "",
                "qs": flt.with_params(sort=key, dir=next_dir),
            }
        )
    figures = {}
    if by_model:
        figures["chart-model-blocks"] = charts.block_hours_stacked(
            by_model, x=[r.name for r in by_model], horizontal=True
        )
    return render(
        request,
        "billing/fleet.html",
        _context(
            request,
            flt,
            "fleet",
            board=shown,
            figures=figures,
            **pager,
            sort=sort,
            direction=direction,
            columns={c["key"]: c for c in columns},
            gpu_count=len(rows),
            sort_label=label,
            keep=[("sort", sort), ("dir", direction)],
        ),
    )


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def heatmap(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role).

    GPUs × days coloured by utilisation (air hours / capacity hours of each GPU-day).
    """
    flt = dashboard_filters(request.GET)
    days = [flt.start + dt.timedelta(days=i) for i in range(flt.days)]
    order = request.GET.get("order", "name")
    if order != "util":
        order = "name"
    start, end = flt.start, flt.end_exclusive

    def percents(values: list[float | None]) -> list[float | None]:
        return [None if u is None else round(u * 100, 1) for u in values]

    if order == "util":
        # Worst first: each GPU's utilisation over the window (air hours / capacity hours, the
        # fleet board's), its cost row's without the money, not from every GPU's value of
        # every day (a year of 1,000 GPUs took 1.4 s that way); no capacity first, then by
        # name.
        gpu_rows = selectors.gpu_utilizations(start=start, end=end, filters=flt.filters)
        labels = {key: name for key, name, _ in gpu_rows}
        gpu_rows.sort(key=lambda r: (-1.0 if r[2] is None else r[2], r[1]))
        keys = [key for key, _, _ in gpu_rows]
    else:
        # By name: every GPU's name, then the values of the page drawn only, where the
        # selectors can list the GPUs without their values (else every GPU's values).
        listed = selectors.utilization_listed(start=start, end=end, filters=flt.filters)
        if listed is None:
            every_row = selectors.utilization_by_day(start=start, end=end, filters=flt.filters)
            listed = [(r.key, r.name) for r in every_row]
        labels = dict(listed)
        keys = sorted(labels, key=lambda k: labels[k])
    shown, pager = _page_of(keys, request, flt, order=order)
    # The GPUs drawn: their values and offline hours per day, one statement.
    page_only = dataclasses.replace(flt.filters, gpus=tuple(shown))
    rows = selectors.utilization_by_day(start=start, end=end, filters=page_only) if shown else []
    values = {r.key: r.values for r in rows}
    offline = {r.key: r.offline_hours for r in rows}
    capacity = {r.key: r.capacity_hours for r in rows}
    blank: list[float | None] = [None] * len(days)
    figures = {}
    if shown:
        figures["chart-heatmap"] = charts.utilization_heatmap(
            gpu_labels=[labels[k] for k in shown],
            columns=[d.isoformat() for d in days],
            z=[percents(values.get(k, blank)) for k in shown],
            by="day",
            offline_hours=[offline.get(k, blank) for k in shown],
            capacity_hours=[capacity.get(k, blank) for k in shown],
        )
    return render(
        request,
        "billing/heatmap.html",
        _context(
            request,
            flt,
            "heatmap",
            figures=figures,
            order=order,
            gpu_count=len(keys),
            **pager,
            keep=[("order", order)],
            qs_name=flt.with_params(order="name"),
            qs_util=flt.with_params(order="util"),
        ),
    )


# The hourly rollup columns the GPU page's charts draw (_hourly_points, _activity_points).
_SERIES_FIELDS = (
    "hour",
    "air_s",
    "power_w_mean",
    "temp_c_max",
    "throttle_any_s",
    "sm_active_s",
    "sm_observed_s",
    "tensor_active_s",
    "tensor_observed_s",
    "dram_active_mean",
)


def _series_value(item: Any, name: str) -> Any:
    """A field of one point of a telemetry series: dicts and objects alike."""
    if isinstance(item, dict):
        return item[name]  # a column left out of _SERIES_FIELDS fails here, not blank
    return getattr(item, name, None)


def _hourly_points(series: Any) -> dict[str, Any]:
    x, util, power, temp, throttled = [], [], [], [], []
    for item in series:
        hour = _series_value(item, "hour")
        x.append(hour.isoformat() if hasattr(hour, "isoformat") else str(hour))
        air = _series_value(item, "air_s")
        # One hour in service is 3,600 capacity seconds (docs/metrics.md): air / capacity.
        util.append(round(air / 36, 1) if air is not None else None)
        power.append(_series_value(item, "power_w_mean"))
        temp.append(_series_value(item, "temp_c_max"))
        thr = _series_value(item, "throttle_any_s")
        throttled.append(round(thr / 36, 1) if thr is not None else None)
    return {"x": x, "util_pct": util, "power_w": power, "temp_c": temp, "throttled_pct": throttled}


def _activity_points(series: list[Any]) -> dict[str, Any] | None:
    """Per hour: the share of time a kernel ran, and what the SMs, the tensor cores and the
    memory bandwidth really did over the seconds profiled (docs/metrics.md, "Work"); ``None``
    where no hour has profiling data (the page says so)."""
    x: list[str] = []
    kernel: list[float | None] = []
    sm: list[float | None] = []
    tensor: list[float | None] = []
    dram: list[float | None] = []
    for item in series:
        hour = _series_value(item, "hour")
        x.append(hour.isoformat() if hasattr(hour, "isoformat") else str(hour))
        air = _series_value(item, "air_s")
        kernel.append(round(air / 36, 1) if air is not None else None)
        shares = (
            cm.activity_share(
                active_seconds=_series_value(item, "sm_active_s") or 0,
                measured_seconds=_series_value(item, "sm_observed_s") or 0,
            ),
            cm.activity_share(
                active_seconds=_series_value(item, "tensor_active_s") or 0,
                measured_seconds=_series_value(item, "tensor_observed_s") or 0,
            ),
            _series_value(item, "dram_active_mean"),
        )
        for values, share in zip((sm, tensor, dram), shares, strict=True):
            values.append(None if share is None else round(share * 100, 1))
    if not any(v is not None for v in (*sm, *tensor, *dram)):
        return None
    return {"x": x, "kernel_pct": kernel, "sm_pct": sm, "tensor_pct": tensor, "dram_pct": dram}


def _recent_points(samples: Any) -> dict[str, Any]:
    x, util, power, temp, throttled = [], [], [], [], []
    for s in samples:
        start = _series_value(s, "start")
        x.append(start.isoformat() if hasattr(start, "isoformat") else str(start))
        util.append(_series_value(s, "util_pct"))
        power.append(_series_value(s, "power_w"))
        temp.append(_series_value(s, "temp_c"))
        seconds = _series_value(s, "seconds") or 0
        thr = _series_value(s, "throttle_any_s")
        throttled.append(round(thr / seconds * 100, 1) if seconds and thr is not None else None)
    return {"x": x, "util_pct": util, "power_w": power, "temp_c": temp, "throttled_pct": throttled}


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def gpu_detail(request: HttpRequest, uuid: str) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); its cost profile and money need
    fleet.view_costs.

    One GPU: utilisation, power, temperature and throttling over time (hourly rollups over
    the range, raw samples of the last hours), its block hours per day and its money.
    """
    gpu = get_object_or_404(gpus_with_attribution(), uuid=uuid)
    flt = dashboard_filters(request.GET)
    show_money = _can_view_costs(request)
    only_this = selectors.Filters(gpus=(gpu.uuid,))
    totals = selectors.cost_rows(
        start=flt.start, end=flt.end_exclusive, group_by="gpu", period="all", filters=only_this
    )
    daily = selectors.cost_rows(
        start=flt.start, end=flt.end_exclusive, group_by="gpu", period="day", filters=only_this
    )
    row = totals[0] if totals else None
    figures: dict[str, Any] = {}
    if daily:
        partial = partial_days(flt, data_from=gpu.service_start)
        figures["chart-gpu-blocks"] = charts.block_hours_stacked(daily, partial_days=partial)
        if show_money:
            figures["chart-gpu-cost"] = charts.cost_trend(
                daily, currency=flt.currency, partial_days=partial
            )
    waiting: list[str] = []
    try:
        from telemetry.selectors import gpu_hourly_series, gpu_recent_samples
    except ImportError:  # telemetry's read side not installed yet
        waiting.append("telemetry.selectors")
    else:
        start, end = range_bounds(flt)
        # The charts' columns only, as dicts: a year is ~8,760 rows, and model instances of
        # every column cost the page ~0.4 s.
        series = list(
            gpu_hourly_series(gpu_id=gpu.pk, start=start, end=end).values(*_SERIES_FIELDS)
        )
        hourly = _hourly_points(series)
        if hourly["x"]:
            figures["chart-gpu-hourly"] = charts.gpu_timeseries(**hourly)
        activity = _activity_points(series)
        if activity is not None:
            figures["chart-gpu-activity"] = charts.gpu_activity(**activity)
        since = timezone.now() - dt.timedelta(hours=RECENT_HOURS)
        recent = _recent_points(gpu_recent_samples(gpu_id=gpu.pk, since=since))
        if recent["x"]:
            figures["chart-gpu-recent"] = charts.gpu_timeseries(**recent)
    cards = []
    if row is not None:
        cards = [
            _card("Utilisation", pct(row.utilization), accent="air", ident="kpi-utilization"),
            _card(
                "Hours in the air / day",
                num(row.hours_in_air_per_day),
                accent="air",
                unit="h",
                ident="kpi-air-hours",
            ),
            _card(
                "Energy",
                num(row.energy_kwh, 1),
                f"{num(row.kwh_per_air_hour, 2)} kWh per air hour",
                accent="energy",
                unit="kWh",
                ident="kpi-energy",
            ),
            _throttled_card(row, unit="h"),
        ]
        if show_money:
            cur = flt.currency
            cards += _row_money_cards(row, cur)
        cards.append(_work_card(row, show_money=show_money, currency=flt.currency))
    node = gpu.node
    site = node.effective_site
    from billing.workload_views import gpu_workloads  # it builds on this module's cards

    return render(
        request,
        "billing/gpu_detail.html",
        _context(
            request,
            flt,
            "fleet",
            gpu=gpu,
            dates_only=True,
            node=node,
            site=site,
            pool=node.pool if node.pool_id else None,
            team=gpu.team or (node.pool.team if node.pool_id and node.pool else None),
            row=row,
            cards=cards,
            blocks=blocks(row) if row else [],
            figures=figures,
            profile=_profile_text(gpu_cost_profile(gpu), flt.currency) if show_money else None,
            offline_since=_offline_since(gpu, flt),
            waiting=waiting,
            recent_hours=RECENT_HOURS,
            has_hourly="chart-gpu-hourly" in figures,
            has_activity="chart-gpu-activity" in figures,
            has_recent="chart-gpu-recent" in figures,
            workloads=gpu_workloads(flt=flt, uuid=gpu.uuid, show_money=show_money),
        ),
    )


def _profile_text(profile: Any, currency: str) -> str | None:
    """A cost profile in words, every money value with separators and the currency."""
    if profile is None:
        return None
    scope = f"set on {profile.scope_kind} {profile.scope_name}"
    if profile.kind == "owned":
        years = num(float(profile.depreciation_years), 1).removesuffix(".0")
        return (
            f"owned ({scope}): bought for {money(profile.purchase_price, currency)}, "
            f"depreciated over {years} years, opex {_rate(profile.opex_per_hour, currency)} / h"
        )
    return f"rented ({scope}): {_rate(profile.rental_rate_per_hour, currency)} per GPU-hour"


def _rate(value: Decimal, currency: str) -> str:
    """An hourly rate: cents, or as many places as it was given in (up to 4: 0.0125)."""
    return money(value, currency, 2 if value % Decimal("0.01") == 0 else 4)


def _offline_since(gpu: Gpu, flt: DashboardFilters) -> dict[str, Any] | None:
    """The GPU page's banner: since when an in-service GPU has sent nothing (None when it is
    reporting, or retired)."""
    now = timezone.now()
    if gpu.retired_at is not None and gpu.retired_at <= now:
        return None
    if not selectors.offline_now(gpu.last_seen_at, now):
        return None
    if gpu.last_seen_at is None:
        return {"never": True}
    zone = flt.fleet_settings.report_zone
    return {
        "never": False,
        "since": gpu.last_seen_at.astimezone(zone),
        "zone": flt.fleet_settings.report_time_zone,
    }


def _group_table(
    rows: list[selectors.CostRow],
    show_money: bool,
    cur: str,
    *,
    cost_centers: dict[str, str] | None = None,
    statement_qs: str | None = None,
) -> list[dict[str, Any]]:
    """The Teams or Pools table's rows; teams name their cost centre (``cost_centers``) and,
    with ``statement_qs``, link to their printable statement for this range."""
    return [
        {
            "name": r.name,
            "url": (
                reverse("team-statement", args=[r.key]) + f"?{statement_qs}"
                if statement_qs is not None and r.key
                else ""
            ),
            "cost_center": (cost_centers or {}).get(r.key, ""),
            "key": r.key,
            "gpus": r.gpu_count,
            "utilization": pct(r.utilization),
            "work_utilization": _work_text(r),
            "profiled": r.work_utilization is not None,
            "air": num(r.hours_in_air_per_day),
            "capacity": num(r.capacity_hours, 0),
            "air_hours": num(r.air_hours, 0),
            "energy": num(r.energy_kwh, 0),
            "co2e": num(r.co2e_kg, 0),
            "total_cost": money(r.total_cost) if show_money else "",
            "idle_cost": money(r.idle_cost) if show_money else "",
            "cost_per_air_hour": money(r.cost_per_air_hour) if show_money else "",
            "blocks": blocks(r),
            "priced": r.priced,
            "adjustment_for": r.adjustment_for,
        }
        for r in rows
    ]


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def chargeback(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); cost columns and charts need
    fleet.view_costs.

    The chargeback view: cost, idle cost and utilisation per team and per pool.
    """
    flt = dashboard_filters(request.GET)
    show_money = _can_view_costs(request)
    cur = flt.currency
    target = flt.target_utilization
    # Teams and pools from one computation over the rollups.
    groups = selectors.cost_rows_by(
        start=flt.start,
        end=flt.end_exclusive,
        group_bys=("team", "pool"),
        period="all",
        filters=flt.filters,
    )
    for rows in groups.values():
        rows.sort(key=lambda r: r.idle_cost if show_money else -(r.utilization or 0), reverse=True)
    figures: dict[str, Any] = {}
    for what in ("team", "pool"):
        if not groups[what]:  # no data for this period: the chart says so, no empty axes
            continue
        figures[f"chart-{what}-util"] = charts.group_util_bars(
            groups[what], target_utilization=target
        )
        if show_money:
            figures[f"chart-{what}-cost"] = charts.group_cost_bars(groups[what], currency=cur)
    api_start = flt.start.isoformat()
    api_end = flt.end_exclusive.isoformat()
    return render(
        request,
        "billing/chargeback.html",
        _context(
            request,
            flt,
            "chargeback",
            figures=figures,
            teams=_group_table(
                groups["team"],
                show_money,
                cur,
                cost_centers=team_cost_centers(),
                statement_qs=flt.range_querystring if show_money else None,
            ),
            pools=_group_table(groups["pool"], show_money, cur),
            csv_team=f"/api/v1/costs?group_by=team&start={api_start}&end={api_end}&format=csv",
            csv_pool=f"/api/v1/costs?group_by=pool&start={api_start}&end={api_end}&format=csv",
            csv_team_month=(
                f"/api/v1/costs?group_by=team&period=month&start={api_start}&end={api_end}"
                "&format=csv"
            ),
            focus_csv=f"/api/v1/focus?start={api_start}&end={api_end}",
            **(_focus_files() if show_money else {}),
        ),
    )


def _breakeven_scope(result: selectors.BreakevenResult) -> str:
    """Which view the page shows, in words: the fleet, an owned, rented or mixed pool."""
    gpus = count(result.gpus, "GPU")
    if result.pool is None:
        if not result.gpus:
            return "Whole fleet: no GPU that is not rented was in service in this period"
        return f"Whole fleet: all {gpus} not rented, as one pool"
    if result.comparison == be.RENTED:
        return f"Pool {result.pool} ({gpus}, rented)"
    if result.owned_share < 1:
        return f"Pool {result.pool} ({gpus}, {pct(result.owned_share)} of its capacity owned)"
    return f"Pool {result.pool} ({gpus}, owned)"


def _breakeven_cards(result: selectors.BreakevenResult, cur: str) -> list[dict[str, Any]]:
    """u*, the measured utilisation, the cost per million tokens and the month: of owning
    (the fleet, an owned pool) or of renting (a rented pool: no figure says "own"), each
    against the API; for a rented pool also owning its GPUs instead, where the fleet owns
    that model (``BreakevenResult.owning_instead``)."""
    rented = result.comparison == be.RENTED
    what = "renting" if rented else "owning"
    u_star, u = result.breakeven_utilization, result.utilization
    scope = "the whole fleet" if result.pool is None else f"pool {result.pool}"
    cards = [
        _card(
            f"Break-even u*: {what} vs API",
            pct(u_star) if u_star is not None else "never",
            f"{what} beats the API above this"
            if u_star is not None
            else f"{what} never beats this API price",
            accent="api",
            ident="kpi-ustar",
        ),
        _card(
            "Measured utilisation",
            pct(u),
            scope,
            accent="air",
            status=""
            if u_star is None or u is None
            else (f"above u*: {what} pays" if u >= u_star else "below u*"),
            good=None if u_star is None or u is None else u >= u_star,
            ident="kpi-measured",
        ),
        _money_card(
            f"{what.capitalize()} cost / M tokens",
            result.own_cost_per_mtok,
            cur,
            f"API {money_shown(result.api_price_per_mtok, cur)}",
            accent="rent" if rented else "money",
            ident="kpi-own-mtok",
        ),
        _money_card(
            f"Savings / month (API − {what})",
            result.savings_per_month,
            cur,
            f"{what} {money_shown(result.own_cost_per_month, cur)} · "
            f"API {money_shown(result.api_cost_per_month, cur)}",
            status=f"{what} is cheaper" if result.savings_per_month >= 0 else "the API is cheaper",
            good=result.savings_per_month >= 0,
            ident="kpi-savings",
        ),
    ]
    instead = result.owning_instead
    if rented and instead is not None:
        u_own = instead.breakeven_utilization
        cards.append(
            _money_card(
                "Owning instead / month",
                instead.cost_per_month,
                cur,
                f"at {money_shown(instead.fixed_rate_per_hour, cur)} / GPU-h, as the fleet owns "
                f"{', '.join(instead.models)}; u* vs API "
                f"{pct(u_own) if u_own is not None else 'never'}",
                status="owning would be cheaper"
                if instead.savings_per_month > 0
                else "renting is cheaper",
                good=instead.savings_per_month > 0,
                ident="kpi-owning-instead",
            )
        )
    elif rented:
        cards.append(
            _card(
                "Owning instead",
                "unknown",
                "the fleet owns no GPU of this model in this period to price it by",
                ident="kpi-owning-instead",
            )
        )
    if not rented and result.rental_rate_per_hour is not None:
        u_rent = result.rent_breakeven_utilization
        cards.append(
            _card(
                "Owning vs renting u*",
                pct(u_rent) if u_rent is not None else "never",
                f"renting on demand at {money_shown(result.rental_rate_per_hour, cur)} / h",
                accent="rent",
                ident="kpi-rent",
            )
        )
    return cards


def _month_basis(result: selectors.BreakevenResult) -> str:
    """What the break-even's month counts, in words: the window's capacity scaled to 730 h
    (docs/metrics.md), as the GPUs in service all month it amounts to, which is fewer than the
    GPUs the scope names when some were in service for a part of the window only."""
    hours = window_hours_to_now(result.window_start, result.window_end, now=timezone.now())
    gpus = result.capacity_hours / hours if hours else 0.0
    return (
        f"Per month: the {num(result.capacity_hours, 0)} GPU-hours in service over the "
        f"{num(hours, 0)} h of the window, scaled to {be.HOURS_PER_MONTH} h: {num(gpus)} GPUs in "
        f"service all month (of the {count(result.gpus, 'GPU')}; a GPU in "
        "service for a part of the window counts in part)."
    )


def _breakeven_initial(pool: str | None, flt: Any) -> dict[str, Any]:
    """The form's defaults for ``pool`` over the filter's days (``BreakevenForm.
    initial_query``), its on-demand rate that of the pool's own rented cost profile where it
    has one."""
    data = BreakevenForm.initial_query(pool, start=flt.start, end=flt.end_exclusive)
    rate = pool_rental_rate(pool)
    if rate is not None:
        # As the fleet file gives it (2.49), not as the database keeps it (2.490000).
        cents = rate.quantize(Decimal("0.01"))
        data["rental_rate_per_hour"] = cents if cents == rate else rate.normalize()
    return data


@login_required
@permission_required("fleet.view_costs", raise_exception=True)
def breakeven(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_costs (finance, admin); viewers get 403.

    Opens on the whole fleet (every GPU not rented, as one pool), or the filter bar's pool.
    Cost per million tokens against utilisation, the API line, u* and the measured
    utilisation; the money per month either way; owning against renting on demand. A rented
    pool is renting against the API, and against owning its GPUs where the price is known.
    """
    flt = dashboard_filters(request.GET)
    # The form was submitted when its own fields are in the query; a pool alone is the filter
    # bar's (the same name): that pool's defaults, as on first load.
    data: Any = (
        request.GET
        if "tokens_per_s" in request.GET
        else _breakeven_initial(flt.filters.pools[0] if flt.filters.pools else None, flt)
    )
    form = BreakevenForm(data)
    measured = None
    result = None
    figures: dict[str, Any] = {}
    if form.is_valid():
        d = form.cleaned_data
        blended = d["price_mode"] == "blended"
        _, measured = selectors.breakeven_workload_measured(
            pool=d["pool"] or None, start=flt.start, end=flt.end_exclusive
        )
        try:
            result = selectors.breakeven_compute(
                pool=d["pool"] or None,
                start=flt.start,
                end=flt.end_exclusive,
                tokens_per_s=d["tokens_per_s"],
                api_price_per_mtok=d["api_price_per_mtok"] if blended else None,
                api_input_price_per_mtok=None if blended else d["api_input_price_per_mtok"],
                api_output_price_per_mtok=None if blended else d["api_output_price_per_mtok"],
                output_share=None if blended else d["output_share"],
                rental_rate_per_hour=d.get("rental_rate_per_hour"),
            )
        except LookupError as exc:
            form.add_error("pool", str(exc))
        except ValueError as exc:
            form.add_error(None, str(exc))
    cards: list[dict[str, Any]] = []
    if result is not None:
        figures["chart-breakeven"] = charts.breakeven_curve(result)
        figures["chart-breakeven-month"] = charts.breakeven_month(result)
        rent = charts.rent_curve(result)
        if rent is not None:
            figures["chart-rent"] = rent
        cards = _breakeven_cards(result, flt.currency)
    return render(
        request,
        "billing/breakeven.html",
        _context(
            request,
            flt,
            "breakeven",
            form=form,
            result=result,
            cards=cards,
            figures=figures,
            scope=_breakeven_scope(result) if result is not None else "",
            month_basis=_month_basis(result) if result is not None else "",
            rented=result is not None and result.comparison == be.RENTED,
            fleet_choice=FLEET_CHOICE[1],
            measured=_measured_words(measured, form) if form.is_valid() else "",
        ),
    )


def _measured_words(measured: Any, form: BreakevenForm) -> str:
    """What the page says of the jobs' own tokens per second (issue 43): used, or overridden
    by the form, or none reported."""
    if measured is None:
        return (
            "No training loop of these GPUs reported tokens in this range: tokens/s per GPU "
            "is the fleet file's (gpufleet_hook reports them, docs/agent.md)."
        )
    said = (
        f"Measured: {num(measured.tokens_per_s)} tokens/s per GPU while computing, from "
        f"{num(measured.gpu_hours)} GPU-hours of the jobs' own reports"
    )
    if round(measured.tokens_per_s, 1) == round(form.cleaned_data["tokens_per_s"], 1):
        return f"{said}; used above."
    return f"{said}; the form's {num(form.cleaned_data['tokens_per_s'])} is used above."


# --- errors ---------------------------------------------------------------------------------
# Pages that need more than fleet.view_dashboard, and why, for the 403 page: a viewer who
# opens a link a finance colleague shared is told what the page holds and whom to ask.
RESTRICTED_PAGES = {
    "breakeven": (
        "fleet.view_costs",
        "It shows money (costs and prices), which your role may not see.",
    ),
    "weekly-report-subscription": (
        "fleet.view_costs",
        "The weekly report shows money (costs), which your role may not see.",
    ),
    "weekly-report-preview": ("fleet.manage_fleet", "Previewing the weekly report is for admins."),
    "admin:index": ("fleet.manage_fleet", "The admin site is for admins."),
}
request_logger = logging.getLogger("django.request")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler403: the page in the site's frame (navigation, a way back) saying why. Logged
    as one line: Django logs a PermissionDenied with its traceback, which for an expected
    refusal is noise in the server log."""
    try:
        url_name = resolve(request.path_info).view_name
    except Resolver404:
        url_name = ""
    needed, why = RESTRICTED_PAGES.get(url_name, ("", ""))
    user = request.user
    role = "no role"
    if user.is_authenticated:
        from fleet.roles import ROLES

        groups = list(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        role = groups[0] if groups else "no role"
    if not why:
        why = (
            "Your account has no role yet: an admin gives it one (viewer, finance or admin)."
            if role == "no role"
            else "Your role may not open this page."
        )
    # The shared link's period and filters, carried to the pages this user may open.
    keep = [(k, v) for k, v in request.GET.items() if k in ("from", "to", "period", *FILTER_KEYS)]
    referer = request.headers.get("Referer", "")
    back = referer if referer and urlsplit(referer).netloc == request.get_host() else ""
    response = render(
        request,
        "403.html",
        {
            "why": why,
            "role": role,
            "needs_costs": needed == "fleet.view_costs",
            "back": back,
            "qs": urlencode(keep),
        },
        status=403,
    )
    request_logger.warning(
        "Forbidden (Permission denied): %s (user %s, %s)",
        request.path,
        getattr(user, "username", "") or "anonymous",
        role,
        extra={"status_code": 403},
    )
    # Django's own line for this response would carry the exception's traceback: ours above
    # replaces it (django.utils.log.log_response skips a response marked as logged).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


@login_required
@permission_required("fleet.view_costs", raise_exception=True)
@require_POST
def focus_export_create(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_costs (finance, admin). POST ``month=YYYY-MM`` and
    ``version`` (1.2 or 1.0): a worker builds that month's FOCUS file; the Teams and pools
    page lists it, and the redirect back keeps the page's query string (its filters), which
    the form posts along. A bad month or version answers 400 naming it."""
    try:
        month = month_parse(request.POST.get("month", ""))
        focus_export_request(
            month=month,
            version=request.POST.get("version", focus.DEFAULT_VERSION),
            by=request.user.get_username(),
        )
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    # Only the query string comes from the request: the path is ours (no open redirect).
    query = request.GET.urlencode()
    return redirect(reverse("chargeback") + (f"?{query}" if query else "") + "#focus-files")


@login_required
@permission_required("fleet.view_costs", raise_exception=True)
def focus_export_download(request: HttpRequest, pk: int) -> HttpResponse:
    """Permission: fleet.view_costs (finance, admin). A built FOCUS file (gzip CSV)."""
    export = get_object_or_404(FocusExport, pk=pk, state=FocusExport.DONE)
    response = HttpResponse(bytes(export.content), content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="{focus_export_filename(export)}"'
    return response


def _focus_files() -> dict[str, Any]:
    """The Teams and pools page's FOCUS section: recent files and the months to ask for."""
    return {
        "focus_exports": list(FocusExport.objects.defer("content")[:12]),
        "focus_months": focus_export_months(),
        "focus_versions": focus.VERSIONS,
    }


@login_required
@permission_required("fleet.view_costs", raise_exception=True)
def team_statement(request: HttpRequest, name: str) -> HttpResponse:
    """Permission: fleet.view_costs (finance, admin): it is money. One team's chargeback for
    the filter bar's range, made to be printed (the browser's print; a print stylesheet
    leaves out the navigation): cost centre, GPU hours, air hours, idle cost and total, per
    pool and per GPU, and any adjustments for closed months booked in the range."""
    team = get_object_or_404(Team, name=name)
    flt = dashboard_filters(request.GET)
    cur = flt.currency
    filters = dataclasses.replace(flt.filters, teams=(team.name,))
    groups = selectors.cost_rows_by(
        start=flt.start,
        end=flt.end_exclusive,
        group_bys=("team", "pool", "gpu"),
        period="all",
        filters=filters,
    )

    def lines(rows: list[selectors.CostRow]) -> list[dict[str, Any]]:
        return [
            {
                "name": r.name,
                "adjustment_for": r.adjustment_for,
                "gpu_hours": num(r.capacity_hours, 1),
                "air_hours": num(r.air_hours, 1),
                "utilization": pct(r.utilization),
                "idle_cost": money(r.idle_cost),
                "total_cost": money(r.total_cost),
            }
            for r in sorted(rows, key=lambda r: (-r.total_cost, r.name))
        ]

    return render(
        request,
        "billing/team_statement.html",
        _context(
            request,
            flt,
            "chargeback",
            team=team,
            totals=lines(groups["team"]),
            pools=lines(groups["pool"]),
            gpus=lines(groups["gpu"]),
            currency=cur,
        ),
    )
