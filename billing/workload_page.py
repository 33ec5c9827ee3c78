"""The Workloads page's figures at scale (docs/benchmarks.md, "Workloads"): the worst workloads,
every user and every account, from one read of the daily workload rows.

``workload_figures_by`` prices every workload of the window in Python, which at 45,000
workloads takes seconds. The page lists 200 of them. Here one PostgreSQL statement sums the
window's daily rows (``telemetry.WorkloadDailyUsage``) per workload, rate class and site, and
from those sums:

* per workload, a lower and an upper bound of its idle cost: held seconds × the idle cost of
  one held second of its GPU, plus held joules × the cost of one joule at its site. Both
  coefficients come from ``billing.cost_model.workload_cost`` (the money is defined there
  only; the statement multiplies and adds). The bounds are equal except on GPUs whose rate
  changes inside the window (their depreciation ends), where they are its lowest and highest
  hourly rate. The *candidates* are the workloads whose upper bound reaches the ``limit``-th
  largest lower bound: at least ``limit`` workloads cost at least that much, so no workload
  outside the candidates can be among the worst ``limit``. Their exact figures then come
  from ``workload_figures_by``, which sorts them and keeps ``limit``: the same rows, in the
  same order, as pricing every workload would give.
* per user and per account, rate class and site: the sums ``workload_figures_by`` prices,
  priced the same way (``billing.workloads`` ``_buckets``), so their money is exact; and
  their workloads, counted. Not their distinct GPUs: counting those needs every (workload,
  GPU) pair of the window, which costs more than the rest of the page (the rows carry 0; the
  page shows workloads there, and the API's ``group_by=user`` has the GPUs).

SQLite, a window the daily rows cannot answer, or no daily rows: ``workload_figures_by``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connections, transaction
from django.db.models import BigIntegerField, Func

from billing import cost_model as cm
from billing.workloads import (
    UNASSIGNED,
    WorkloadFilters,
    WorkloadRow,
    _buckets,
    _daily_days,
    _filtered,
    _owner_rows,
    _Part,
    _parts,
    _Pricing,
    _rate,
    _rate_classes,
    _split,
    _window,
    pricing_load,
    team_filtered,
    workload_accounts,
    workload_figures,
    workload_figures_by,
)
from config.replica import LARGE_READ_SQL
from fleet.models import FleetSettings, Site
from telemetry.models import WorkloadDailyUsage, WorkloadNodeDailyUsage

# How far below the limit-th lower bound an upper bound may fall and still make a candidate:
# float sums of the same terms in another order (relative 1e-12 at most), never money.
TOLERANCE = 1e-9


@dataclass
class WorkloadPage:
    """The page's three tables: the worst ``limit`` workloads, every user and every account
    (worst first), and how many workloads the window has."""

    workloads: list[WorkloadRow]
    users: list[WorkloadRow]
    accounts: list[WorkloadRow]
    total: int


def workload_page_figures(
    *,
    start: dt.date,
    end: dt.date,
    filters: WorkloadFilters,
    limit: int,
    worst: str = "idle_cost",
) -> WorkloadPage:
    """The Workloads page over the local days [start, end): the worst ``limit`` workloads by
    ``worst`` (``idle_cost``, or ``held_hours`` for a page without money), exactly as
    ``workload_figures(group_by="workload")`` ranks them; users and accounts with the figures
    the page shows (no kind, name, team or seen times: those are the workloads')."""
    settings = FleetSettings.load()
    days = _statement_days(start, end, settings)
    if days is None:
        return _page_in_full(start=start, end=end, filters=filters, limit=limit, worst=worst)
    window = _window(start, end, settings.report_zone)
    pricing = pricing_load()
    split = _split(pricing, *window)
    sums = _grouped_sums(
        days=days,
        filters=filters,
        pricing=pricing,
        split=split,
        window=window,
        limit=limit,
        worst=worst,
    )
    candidates = [int(key) for key in sums.candidates]
    rows: list[WorkloadRow] = []
    if candidates and limit > 0:
        exact = workload_figures_by(
            start=start,
            end=end,
            group_bys=("workload",),
            filters=dataclasses.replace(filters, workloads=tuple(candidates)),
            limits={"workload": limit},
            worst=worst,
            pricing=pricing,
        )
        rows = exact["workload"]
    owner_rows = {}
    for owner, parts in (("user", sums.user_parts), ("account", sums.account_parts)):
        if split:  # their hours, per hour, as workload_figures_by reads them
            parts = parts + _parts(
                window_start=window[0],
                window_end=window[1],
                filters=filters,
                split_gpu_ids=split,
                per_hour=True,
                owner=f"workload__{'user_name' if owner == 'user' else 'account'}",
                gpu_ids=split,
                teams_in_sql=True,
            )
        buckets = _buckets(
            parts,
            workloads={},
            pricing=pricing,
            window=window,
            zone=settings.report_zone,
            per_gpu=False,
            teams_allowed=frozenset(),
            lean=True,
        )
        owner_rows[owner] = _owner_rows(
            buckets,
            currency=settings.currency,
            field=owner,
            gpus={},
            workloads=sums.workloads[owner],
        )
        if worst == "held_hours":  # as workload_figures_by sorts a page without money
            owner_rows[owner].sort(key=lambda r: r.key)
            owner_rows[owner].sort(key=lambda r: r.held_hours, reverse=True)
    return WorkloadPage(
        workloads=rows,
        users=owner_rows["user"],
        accounts=owner_rows["account"],
        total=sum(sums.workloads["user"].values()),
    )


def workload_account_figures(
    *, start: dt.date, end: dt.date, filters: WorkloadFilters
) -> list[WorkloadRow]:
    """Every account's hours and money over the local days [start, end), worst idle cost
    first (the overview's panel): from the page's statement where it can run, else summed per
    account (``workload_accounts``), or per workload where a team filter needs each
    workload's rules."""
    if _statement_days(start, end, FleetSettings.load()) is not None:
        return workload_page_figures(start=start, end=end, filters=filters, limit=0).accounts
    if filters.teams:
        return workload_figures(start=start, end=end, group_by="account", filters=filters)
    return workload_accounts(start=start, end=end, filters=filters)


def _statement_days(
    start: dt.date, end: dt.date, settings: FleetSettings
) -> tuple[dt.date, dt.date] | None:
    """The local days the statement reads, where it can run: PostgreSQL, and daily rows that
    answer for the window; else None."""
    if connections[WorkloadDailyUsage.objects.db].vendor != "postgresql":
        return None
    return _daily_days(start, end, settings.report_time_zone)


def _page_in_full(
    *, start: dt.date, end: dt.date, filters: WorkloadFilters, limit: int, worst: str
) -> WorkloadPage:
    figures = workload_figures_by(
        start=start,
        end=end,
        group_bys=("workload", "user", "account"),
        filters=filters,
        limits={"workload": limit},
        worst=worst,
    )
    users = figures["user"]
    return WorkloadPage(
        workloads=figures["workload"],
        users=users,
        accounts=figures["account"],
        total=sum(u.workloads for u in users),
    )


# --- the statement ------------------------------------------------------------------------------
@dataclass
class _Sums:
    candidates: list[Any]
    user_parts: list[_Part]
    account_parts: list[_Part]
    workloads: dict[str, dict[str, int]]  # "user"/"account" → key → workloads


@dataclass
class _Coefficients:
    """The ranking's coefficients as arrays the statement indexes by GPU id (PostgreSQL arrays
    count from 1; a GPU past the end reads NULL: no rate, its own class): each GPU's class
    representative, kind of profile (a code), idle cost of one held second (lowest and highest
    over the window) and whether its rate changes in the window; and the cost of one held
    joule of each kind of profile at each site, at [kind × stride + site id + 1]."""

    rep: list[int]
    kind: list[int]
    idle_lo: list[float]
    idle_hi: list[float]
    split: list[bool]
    per_joule: list[float]
    stride: int

    def params(self) -> list[Any]:
        return [
            self.rep, self.split, self.idle_lo, self.idle_hi, self.per_joule, self.kind,
            self.stride,
        ]  # fmt: skip


def _coefficients(
    pricing: dict[int, _Pricing],
    split: Sequence[int],
    window: tuple[dt.datetime, dt.datetime],
    classes: dict[int, int],
    worst: str,
) -> _Coefficients:
    """``classes``: each GPU's class representative (``_class_of``). For ``held_hours``, a
    held second counts 1 and a joule 0: the bounds are held seconds."""
    # No NULL in the arrays: PostgreSQL finds an element of an array with NULLs by counting
    # the ones before it. A GPU id without a GPU (a gap): its own class, no rate.
    size = max(pricing, default=0)
    kinds: dict[str | None, int] = {None: 0}
    out = _Coefficients(list(range(1, size + 1)), [0] * size, [0.0] * size, [0.0] * size,
                        [False] * size, [], 0)  # fmt: skip
    second = cm.hours_from_seconds(seconds=1)
    for gpu_id, price in pricing.items():
        hours = [None] if gpu_id not in split else [window[0], window[1] - cm.ONE_HOUR]
        costs = []
        kind = None
        for hour in hours:
            rate, kind, _ = _rate(price, hour, window)
            costs.append(
                cm.workload_cost(
                    kind=kind,
                    fixed_rate_per_hour=rate,
                    gpu_hours=second,
                    energy_kwh=0,
                    pue=1,
                    price_per_kwh=0,
                )
            )
        if worst != "idle_cost":
            costs = [Decimal(1)]
        at = gpu_id - 1
        out.rep[at] = classes.get(gpu_id, gpu_id)
        out.kind[at] = kinds.setdefault(kind, len(kinds))
        out.idle_lo[at], out.idle_hi[at] = float(min(costs)), float(max(costs))
        out.split[at] = gpu_id in split
    sites = list(Site.objects.all())
    out.stride = max((site.pk for site in sites), default=0) + 1
    out.per_joule = [0.0] * (out.stride * len(kinds))
    joule = cm.kwh_from_joules(energy_j=1)
    for site in sites:
        for kind, code in kinds.items():
            cost = cm.workload_cost(
                kind=kind,
                fixed_rate_per_hour=Decimal(0),
                gpu_hours=0,
                energy_kwh=joule,
                pue=site.pue,
                price_per_kwh=site.price_per_kwh,
            )
            out.per_joule[code * out.stride + site.pk] = (
                float(cost) if worst == "idle_cost" else 0.0
            )
    return out


_STATEMENT = """
WITH b AS (
    SELECT r.workload_id, r.site_id, r.gpu_s, r.air_s, r.energy_j, r.held_energy_j,
           COALESCE((%s::bigint[])[r.gpu_id], r.gpu_id) AS rep,
           COALESCE((%s::bool[])[r.gpu_id], false) AS split,
           (r.gpu_s - r.air_s) * COALESCE((%s::float8[])[r.gpu_id], 0) AS held_lo,
           (r.gpu_s - r.air_s) * COALESCE((%s::float8[])[r.gpu_id], 0) AS held_hi,
           r.held_energy_j
               * COALESCE((%s::float8[])[(%s::int[])[r.gpu_id] * %s + r.site_id + 1], 0)
               AS held_energy
    FROM ({rows}) AS r(workload_id, gpu_id, site_id, gpu_s, air_s, energy_j, held_energy_j)
),
-- Per workload, rate class and site: the bounds, and the sums the users and accounts are
-- priced from (GPUs whose rate changes in the window: read per hour instead, so NULL here),
-- with the workload's user and account.
p AS MATERIALIZED (
    SELECT p.*, wl.user_name, wl.account
    FROM (
        SELECT workload_id, rep, site_id,
               sum(held_lo) + sum(held_energy) AS lo, sum(held_hi) + sum(held_energy) AS hi,
               sum(gpu_s) FILTER (WHERE NOT split) AS gpu_s,
               sum(air_s) FILTER (WHERE NOT split) AS air_s,
               sum(energy_j) FILTER (WHERE NOT split) AS energy_j,
               sum(held_energy_j) FILTER (WHERE NOT split) AS held_energy_j
        FROM b
        GROUP BY workload_id, rep, site_id
    ) AS p
    JOIN telemetry_workload AS wl ON wl.id = p.workload_id
),
w AS MATERIALIZED (
    SELECT workload_id, min(user_name) AS user_name, min(account) AS account,
           sum(lo) AS lo, sum(hi) AS hi
    FROM p
    GROUP BY workload_id
),
floor AS (SELECT lo FROM w ORDER BY lo DESC OFFSET %s LIMIT 1)
SELECT 1, workload_id::text, NULL::bigint, NULL::bigint, 0, 0, 0, 0, 0
FROM w
WHERE NOT EXISTS (SELECT 1 FROM floor) OR hi >= (SELECT lo - %s * (abs(lo) + 1) FROM floor)
UNION ALL
SELECT CASE WHEN GROUPING(user_name) = 0 THEN 2 ELSE 3 END, COALESCE(user_name, account),
       rep, site_id, sum(gpu_s), sum(air_s), sum(energy_j), sum(held_energy_j), 0
FROM p
WHERE gpu_s IS NOT NULL
GROUP BY GROUPING SETS ((user_name, rep, site_id), (account, rep, site_id))
UNION ALL
SELECT CASE WHEN GROUPING(user_name) = 0 THEN 4 ELSE 5 END, COALESCE(user_name, account),
       NULL, NULL, 0, 0, 0, 0, count(*)
FROM w
GROUP BY GROUPING SETS ((user_name), (account))
"""


_SUMS = ("gpu_s", "air_s", "energy_j", "held_energy_j")

# The window's rows where some node rows' GPUs have more than one rate: those node rows' GPU
# rows instead (columns as _STATEMENT's `r`; the node rows' part is built in _rows).
_NODE_ROWS_MIXED = """
SELECT n.workload_id, n.gpu_ids[1], n.site_id, n.gpu_s, n.air_s, n.energy_j, n.held_energy_j
FROM nr AS n
WHERE NOT n.gpu_ids::text = ANY(%s::text[])
UNION ALL
SELECT d.workload_id, d.gpu_id, d.site_id, d.gpu_s, d.air_s, d.energy_j, d.held_energy_j
FROM nr AS n
JOIN telemetry_workloaddailyusage AS d
    ON d.workload_id = n.workload_id AND d.day = n.day AND d.gpu_id = ANY(n.gpu_ids)
    AND d.node_id IS NOT DISTINCT FROM n.node_id AND d.pool_id IS NOT DISTINCT FROM n.pool_id
    AND d.team_id IS NOT DISTINCT FROM n.team_id AND d.site_id IS NOT DISTINCT FROM n.site_id
WHERE n.gpu_ids::text = ANY(%s::text[])
"""


def _class_of(
    pricing: dict[int, _Pricing], split: Sequence[int], window: tuple[dt.datetime, dt.datetime]
) -> dict[int, int]:
    """Each GPU whose rate does not change in the window → the representative of its rate
    class (``_rate_classes``); the others are not in it."""
    classes = _rate_classes(pricing, list(split), window)
    return {gpu: rep for rep, members in classes.items() for gpu in members}


def _rows(
    *, days: tuple[dt.date, dt.date], filters: WorkloadFilters, classes: dict[int, int]
) -> tuple[str, list[Any], str]:
    """The statement's rows of the window, filtered: (SQL, parameters, database alias).

    From ``WorkloadNodeDailyUsage`` (a row per job and node) where a node row's GPUs all have
    one rate in the window, else from ``WorkloadDailyUsage`` (a row per job and GPU); from the
    GPUs' rows alone where the filter names GPUs or models, which node rows do not carry."""
    per_gpu = _filtered(WorkloadDailyUsage.objects.filter(day__gte=days[0], day__lt=days[1]),
                        filters)  # fmt: skip
    if filters.models or filters.gpus:
        rows = team_filtered(per_gpu, filters.teams).values_list(
            "workload_id", "gpu_id", "site_id", *_SUMS
        )
        sql, params = rows.query.get_compiler(using=rows.db).as_sql()
        return sql, list(params), rows.db
    nodes = WorkloadNodeDailyUsage.objects.filter(day__gte=days[0], day__lt=days[1])
    mixed = []  # the GPU lists of node rows whose GPUs do not all have one rate
    for ids in nodes.values_list("gpu_ids", flat=True).distinct():
        reps = {classes.get(g) for g in ids}
        if len(reps) != 1 or None in reps:
            mixed.append("{" + ",".join(str(g) for g in ids) + "}")
    if not mixed:
        # A node row stands for its GPUs: the statement prices it as its first GPU.
        node_rows = (
            team_filtered(_filtered(nodes, filters), filters.teams)
            .annotate(first_gpu=_ArrayFirst("gpu_ids"))
            .values_list("workload_id", "first_gpu", "site_id", *_SUMS)
        )
        sql, params = node_rows.query.get_compiler(using=node_rows.db).as_sql()
        return sql, list(params), node_rows.db
    node_rows = team_filtered(_filtered(nodes, filters), filters.teams).values_list(
        "workload_id", "day", "node_id", "pool_id", "team_id", "site_id", "gpu_ids", *_SUMS
    )
    sql, params = node_rows.query.get_compiler(using=node_rows.db).as_sql()
    names = "workload_id, day, node_id, pool_id, team_id, site_id, gpu_ids, " + ", ".join(_SUMS)
    return (
        f"WITH nr({names}) AS MATERIALIZED ({sql})" + _NODE_ROWS_MIXED,
        [*params, mixed, mixed],
        node_rows.db,
    )


class _ArrayFirst(Func):
    """An array column's first element (PostgreSQL)."""

    template = "(%(expressions)s)[1]"
    output_field = BigIntegerField()


def _grouped_sums(
    *,
    days: tuple[dt.date, dt.date],
    filters: WorkloadFilters,
    pricing: dict[int, _Pricing],
    split: Sequence[int],
    window: tuple[dt.datetime, dt.datetime],
    limit: int,
    worst: str,
) -> _Sums:
    classes = _class_of(pricing, split, window)
    rows_sql, rows_params, db = _rows(days=days, filters=filters, classes=classes)
    coefficients = _coefficients(pricing, split, window, classes, worst)
    params = [*coefficients.params(), *rows_params, max(limit - 1, 0), TOLERANCE]
    out = _Sums([], [], [], {"user": {}, "account": {}})
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        # The window's rows hashed per workload, rate class and site (some 50,000 groups at
        # 45,000 workloads), a large read (``read_cursor``'s settings) on the rows' database.
        cursor.execute(LARGE_READ_SQL)
        cursor.execute(_STATEMENT.replace("{rows}", rows_sql), params)
        fetched = cursor.fetchall()
    for part, key, rep, site_id, gpu_s, air_s, energy_j, held_energy_j, count in fetched:
        if part == 1:
            out.candidates.append(key)
        elif part in (2, 3):
            (out.user_parts if part == 2 else out.account_parts).append(
                _Part(
                    workload_id=key,
                    gpu_id=int(rep),
                    team_id=None,
                    site_id=site_id,
                    hour=None,
                    gpu_s=float(gpu_s),
                    air_s=float(air_s),
                    energy_j=float(energy_j),
                    idle_energy_j=float(held_energy_j),
                )
            )
        else:
            out.workloads["user" if part == 4 else "account"][key or UNASSIGNED] = int(count)
    return out
