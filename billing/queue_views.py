"""The Queue page (docs/dashboard.md, "Queue"): who waited for GPUs while GPUs of their
partition's pools sat held or parked, per partition, account or user, worst (most waited GPU
hours) first. Thin: every figure from ``billing.selectors.queue.queue_cost_rows``, the
function ``GET /api/v1/queue`` calls. Money only for users who may see it
(``fleet.view_costs``): a viewer's page carries hours, never money."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from billing.dashboard import dashboard_filters
from billing.formatting import MISSING, money, num
from billing.selectors.queue import queue_cost_rows, queue_window
from billing.views import _can_view_costs, _card, _context, _money_card

# The page's groupings, as tabs; the API also groups by cluster.
TABS = (("partition", "Per partition"), ("account", "Per account"), ("user", "Per user"))
NO_NAME = "(none)"  # the agent sent no user, account or partition


def _duration(seconds: float | None) -> str:
    """A wait in words a person reads at a glance: ``45 s``, ``12 min``, ``3.5 h``."""
    if seconds is None:
        return MISSING
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"


def queue_table(rows: list[dict[str, Any]], show_money: bool) -> list[dict[str, Any]]:
    """Rows as the table shows them; a viewer's carry no money."""
    return [
        {
            "key": r["key"] or NO_NAME,
            "cluster": r.get("cluster", ""),
            "waited": num(r["waited_gpu_hours"]),
            "capacity": num(r["waited_gpu_hours_capacity"]),
            "policy": num(r["waited_gpu_hours_policy"]),
            "user": num(r["waited_gpu_hours_user"]),
            "jobs": f"{r['jobs']:,}",
            "p50": _duration(r["wait_p50_s"]),
            "p95": _duration(r["wait_p95_s"]),
            "wanted": num(r["wanted_while_held_gpu_hours"]),
            "wanted_cost": money(r["wanted_while_held_cost"]) if show_money else "",
        }
        for r in rows
    ]


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def queue_page(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); money needs fleet.view_costs.

    One table of the groups chosen by ``?group_by=`` (partition, account or user; a bad
    value is reported and the partitions shown), the most waited GPU hours first."""
    flt = dashboard_filters(request.GET)
    show_money = _can_view_costs(request)
    group_by = request.GET.get("group_by", "partition")
    errors = {}
    if group_by not in dict(TABS):
        errors["group_by"] = f"one of {', '.join(dict(TABS))}"
        group_by = "partition"
    start, end = queue_window(
        start=flt.start, end=flt.end_exclusive, zone_name=flt.fleet_settings.report_time_zone
    )
    rows = queue_cost_rows(start=start, end=end, group_by=group_by, money=show_money)
    cards = [
        _card(
            "GPU hours waited",
            num(sum(r["waited_gpu_hours"] for r in rows), 0),
            f"{num(sum(r['waited_gpu_hours_capacity'] for r in rows), 0)} h for capacity",
            unit="h",
            ident="kpi-queue-waited",
        ),
        _card(
            "Wanted while held",
            num(sum(r["wanted_while_held_gpu_hours"] for r in rows), 1),
            "GPU hours waited for while the partition's GPUs sat held or parked",
            unit="h",
            ident="kpi-queue-wanted",
        ),
    ]
    if show_money:
        cards.append(
            _money_card(
                "Wanted while held, cost",
                sum((r["wanted_while_held_cost"] for r in rows), Decimal(0)),
                flt.currency,
                "of the GPUs that sat idle",
                accent="idle-money",
                ident="kpi-queue-wanted-cost",
            )
        )
    keep = [("group_by", group_by)]
    tabs = [
        {
            "key": key,
            "label": label,
            "qs": flt.with_params(group_by=key),
            "active": key == group_by,
        }
        for key, label in TABS
    ]
    api = urlencode(
        [
            ("start", flt.start.isoformat()),
            ("end", flt.end_exclusive.isoformat()),
            ("group_by", group_by),
            ("format", "csv"),
        ]
    )
    return render(
        request,
        "billing/queue.html",
        _context(
            request,
            flt,
            "queue",
            keep=keep,
            own_errors=errors,
            group_by=group_by,
            what=dict(TABS)[group_by].removeprefix("Per ").capitalize(),
            tabs=tabs,
            cards=cards,
            rows=queue_table(rows, show_money),
            csv_url=f"/api/v1/queue?{api}",
        ),
    )
