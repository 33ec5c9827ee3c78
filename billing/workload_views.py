"""Dashboard pages of workloads (docs/dashboard.md, "Workloads"): the list with its per-user and
per-account tables, one workload's page, and the workload parts of the GPU page and the
overview. Thin: every figure from ``billing.workloads.workload_figures``. Money only for users
who may see it (``fleet.view_costs``): a viewer's page carries hours, never money, and is
sorted by held hours instead of idle cost."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from billing.dashboard import DashboardFilters, dashboard_filters
from billing.efficiency import EfficiencyFigures, efficiency_figures
from billing.formatting import count, money, num, pct
from billing.views import _can_view_costs, _card, _context, _money_card
from billing.workload_page import workload_account_figures, workload_page_figures
from billing.workloads import (
    UNASSIGNED,
    WorkloadFilters,
    WorkloadRow,
    workload_conflicting_claims,
    workload_figures,
    workload_figures_by,
)
from fleet.identifiers import text_error
from telemetry.models import WORKLOAD_KINDS, Workload

LIST_ROWS = 200  # the page lists the worst ones; the CSV has them all
GROUP_ROWS = 20
TOP_ACCOUNTS = 3


def _filters(
    flt: DashboardFilters, query: QueryDict
) -> tuple[WorkloadFilters, dict[str, str], dict[str, str]]:
    """The filter bar's site/pool/team/model and the page's own kind, user and account.
    A bad value is ignored and reported, like the bar's (``errors``)."""
    own: dict[str, str] = {}
    errors: dict[str, str] = {}
    for name in ("kind", "user", "account"):
        value = query.get(name, "").strip()
        if not value:
            continue
        error = (
            f"one of {', '.join(WORKLOAD_KINDS)}"
            if name == "kind" and value not in WORKLOAD_KINDS
            else text_error(value, max_length=200)
        )
        if error is None:
            own[name] = value
        else:
            errors[name] = error
    filters = WorkloadFilters(
        kinds=(own["kind"],) if "kind" in own else (),
        users=(own["user"],) if "user" in own else (),
        accounts=(own["account"],) if "account" in own else (),
        teams=flt.filters.teams,
        sites=flt.filters.sites,
        pools=flt.filters.pools,
        models=flt.filters.models,
    )
    return filters, own, errors


def workload_table(
    rows: list[WorkloadRow],
    show_money: bool,
    qs: str = "",
    limit: int | None = None,
    filter_by: str | None = None,
    efficiency: dict[int, EfficiencyFigures] | None = None,
) -> list[dict[str, Any]]:
    """Rows as the tables show them; a viewer's carry no money and come worst held first.
    ``filter_by`` ("user", "account"): rows of users or accounts, each linking to the
    Workloads page filtered by it (else a row of one workload links to its page).
    ``efficiency``: job efficiency by workload id (``workload_efficiency``), for the rows of
    workloads whose training loop reported."""
    if not show_money:
        rows = sorted(rows, key=lambda r: (-r.held_hours, r.key))
    out = []
    for r in rows[:limit]:
        url = ""
        if filter_by is not None:
            if r.key != UNASSIGNED:
                url = f"{reverse('workloads')}?{qs}{'&' if qs else ''}" + urlencode(
                    {filter_by: r.key}
                )
        elif r.workload_pk is not None and r.day is None and r.gpu_uuid is None:
            url = reverse("workload-detail", args=[r.workload_pk]) + (f"?{qs}" if qs else "")
        job = (efficiency or {}).get(r.workload_pk) if r.workload_pk is not None else None
        out.append(
            {
                "key": r.key,
                "url": url,
                "kind": r.kind or "",
                "name": r.name or "",
                "user": r.user or "",
                "account": r.account or "",
                "team": r.team or "",
                "site": r.site or "",
                "gpus": r.gpus,
                "workloads": r.workloads,
                "gpu_hours": num(r.gpu_hours),
                "air_hours": num(r.air_hours),
                "held_hours": num(r.held_hours),
                "utilization": pct(r.utilization),
                "energy": num(r.energy_kwh),
                "cost": money(r.cost) if show_money else "",
                "idle_cost": money(r.idle_cost) if show_money else "",
                "gpu_uuid": r.gpu_uuid or "",
                "gpu_label": r.gpu_label or "",
                "day": r.day,
                "mfu": pct(job.row.mfu) if job is not None else "",
                "data_starved": pct(job.row.data_starved_share) if job is not None else "",
                "checkpoint": pct(job.row.checkpoint_share) if job is not None else "",
            }
        )
    return out


def workload_efficiency(
    flt: DashboardFilters, workload_ids: list[int]
) -> dict[int, EfficiencyFigures]:
    """Job efficiency (MFU, data-starved and checkpoint shares) of these workloads over the
    page's range, by workload id: only those whose training loop reported (gpufleet_hook)."""
    rows = efficiency_figures(
        start=flt.start, end=flt.end_exclusive, group_by="workload", workload_ids=workload_ids
    )
    return {f.row.workload_id: f for f in rows if f.row.workload_id is not None}


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def workloads(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); money needs fleet.view_costs.

    Who held the GPUs: every workload (worst idle cost first), then per user and per account.
    """
    flt = dashboard_filters(request.GET)
    show_money = _can_view_costs(request)
    filters, own, errors = _filters(flt, request.GET)
    page = workload_page_figures(
        start=flt.start,
        end=flt.end_exclusive,
        filters=filters,
        limit=LIST_ROWS,
        worst="idle_cost" if show_money else "held_hours",
    )
    rows, users, accounts, total = page.workloads, page.users, page.accounts, page.total
    efficiency = workload_efficiency(flt, [r.workload_pk for r in rows if r.workload_pk])
    # The totals from the users' rows: every workload has exactly one user (or none), and
    # the workloads' list holds only the worst of them.
    keep = list(own.items())
    cur = flt.currency
    cards = [
        _card("Workloads", f"{total:,}", f"{len(users):,} users", ident="kpi-workloads"),
        _card(
            "GPU hours held by workloads",
            num(sum(r.gpu_hours for r in users), 0),
            f"{num(sum(r.air_hours for r in users), 0)} h in the air",
            accent="air",
            unit="h",
            ident="kpi-workload-gpu-hours",
        ),
        _card(
            "Held, no kernel running",
            num(sum(r.held_hours for r in users), 0),
            "GPU hours",
            unit="h",
            ident="kpi-workload-held-hours",
        ),
    ]
    if show_money:
        cards += [
            _money_card("Cost", sum((r.cost for r in users), Decimal(0)), cur, ident="kpi-cost"),
            _money_card(
                "Idle cost",
                sum((r.idle_cost for r in users), Decimal(0)),
                cur,
                "of held hours",
                accent="idle-money",
                ident="kpi-idle-cost",
            ),
        ]
    api = urlencode(
        [("start", flt.start.isoformat()), ("end", flt.end_exclusive.isoformat())]
        + [(k, v) for k, v in keep]
        + [("team", t) for t in flt.filters.teams]
        + [("site", s) for s in flt.filters.sites]
    )
    return render(
        request,
        "billing/workloads.html",
        _context(
            request,
            flt,
            "workloads",
            keep=keep,
            own=own,
            own_errors=errors,
            kinds=WORKLOAD_KINDS,
            cards=cards,
            rows=workload_table(rows, show_money, flt.querystring, efficiency=efficiency),
            efficiency=bool(efficiency),
            total=total,
            shown=len(rows),
            users=workload_table(
                users, show_money, flt.querystring, limit=GROUP_ROWS, filter_by="user"
            ),
            accounts=workload_table(
                accounts, show_money, flt.querystring, limit=GROUP_ROWS, filter_by="account"
            ),
            csv_url=f"/api/v1/workloads?{api}&format=csv",
        ),
    )


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def workload_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); money needs fleet.view_costs.

    One workload over the range: its figures, the GPUs it held and its hours per day, and
    the names other nodes claimed for it (docs/ingest.md, "Whose names count")."""
    workload = get_object_or_404(Workload.objects.select_related("site", "identity_node"), pk=pk)
    flt = dashboard_filters(request.GET)
    show_money = _can_view_costs(request)
    only = WorkloadFilters(workloads=(workload.pk,))

    figures = workload_figures_by(
        start=flt.start, end=flt.end_exclusive, group_bys=("workload", "gpu", "day"), filters=only
    )
    totals = figures["workload"]
    row = totals[0] if totals else None
    cards = []
    if row is not None:
        cur = flt.currency
        cards = [
            _card("GPU hours", num(row.gpu_hours), count(row.gpus, "GPU"), unit="h"),
            _card("Air hours", num(row.air_hours), accent="air", unit="h"),
            _card("Held hours", num(row.held_hours), "no kernel running", unit="h"),
            _card("Utilisation", pct(row.utilization), "air / GPU hours", accent="air"),
            _card("Energy", num(row.energy_kwh, 2), accent="energy", unit="kWh"),
        ]
        if show_money:
            cards += [
                _money_card("Cost", row.cost, cur, ident="kpi-cost"),
                _money_card(
                    "Idle cost", row.idle_cost, cur, accent="idle-money", ident="kpi-idle-cost"
                ),
            ]
    job = workload_efficiency(flt, [workload.pk]).get(workload.pk)
    job_cards = []
    if job is not None:
        job_cards = [
            _card("MFU", pct(job.row.mfu), "of the GPUs' dense bf16 peak", ident="kpi-mfu"),
            _card(
                "Data-starved",
                pct(job.row.data_starved_share),
                "of wall time waiting for data",
                ident="kpi-data-starved",
            ),
            _card(
                "Checkpointing",
                pct(job.row.checkpoint_share),
                "of wall time saving",
                ident="kpi-checkpoint",
            ),
            _card(
                "Tokens per GPU hour",
                num(job.row.tokens_per_gpu_hour, 0),
                f"{num(job.row.gpu_hours)} GPU h reported",
                ident="kpi-tokens-per-gpu-hour",
            ),
        ]
        if show_money:
            job_cards.append(
                _card(
                    "Cost per million tokens",
                    money(job.cost_per_mtok, flt.currency, 4),
                    "of the GPU hours reported",
                    accent="money",
                    ident="kpi-cost-per-mtok",
                )
            )
    return render(
        request,
        "billing/workload_detail.html",
        _context(
            request,
            flt,
            "workloads",
            dates_only=True,
            workload=workload,
            conflicting_claims=workload_conflicting_claims(workload_id=workload.pk),
            row=row,
            team=row.team if row is not None else "",
            cards=cards,
            job_cards=job_cards,
            gpus=workload_table(figures["gpu"], show_money),
            days=sorted(
                workload_table(figures["day"], show_money),
                key=lambda d: d["day"],
            ),
        ),
    )


def gpu_workloads(
    *, flt: DashboardFilters, uuid: str, show_money: bool, limit: int = 10
) -> list[dict[str, Any]]:
    """The workloads that held one GPU over the range, for its page."""
    rows = workload_figures(
        start=flt.start, end=flt.end_exclusive, filters=WorkloadFilters(gpus=(uuid,))
    )
    return workload_table(rows, show_money, flt.querystring, limit)


def overview_workloads(
    *, flt: DashboardFilters, held_hours: float, show_money: bool
) -> dict[str, Any]:
    """The overview's workload panel: the share of the fleet's held hours that workloads
    explain, and (money) the three accounts with the most idle cost of held hours."""
    filters = WorkloadFilters(
        sites=flt.filters.sites,
        pools=flt.filters.pools,
        teams=flt.filters.teams,
        models=flt.filters.models,
    )
    accounts = workload_account_figures(start=flt.start, end=flt.end_exclusive, filters=filters)
    explained = sum(r.held_hours for r in accounts)
    share = min(1.0, explained / held_hours) if held_hours > 0 else None
    return {
        "any": bool(accounts),
        "explained_hours": num(explained, 0),
        "held_hours": num(held_hours, 0),
        "share": pct(share, 0),
        "top_accounts": workload_table(accounts, show_money, limit=TOP_ACCOUNTS)
        if show_money
        else [],
    }
