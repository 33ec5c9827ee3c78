"""Period figures (DESIGN.md §3 and §7) for the dashboard, the finance API and the email.

How a figure is made, and why this way:
- Only hourly rollups (``telemetry.HourlyUsage``) are read, never the raw table; they are
  summed in SQL per GPU, period bucket, stored attribution (node, pool, team, site as it was
  in that hour) and depreciation phase. The number of queries is fixed (about eight),
  whatever the number of GPUs.
- Capacity, offline hours and every cost come from ``billing.cost_model`` per GPU, in Python;
  groups (node, pool, team, site, model, fleet) are sums of those per-GPU pieces, so a group's
  figure is always the sum of its parts and ratios are ratios of sums.
- Offline hours (capacity with no samples) belong to the GPU's *current* node, pool, team
  and site: nothing was stored for them.
- An owned GPU's rate drops when depreciation ends. The rollup hours are split in SQL into the
  hours before the one that contains that moment (phase 0), that hour (1) and the hours after
  (2); each phase has one rate, that of hour 1 being its pro-rata mean. Phase 0 is the only
  phase of rented GPUs and of GPUs without a profile.
- Buckets (day, ISO week, month) are in the report time zone. Rollups are UTC hours, so a zone
  whose offset is not a whole number of hours in the query is approximated by a fixed offset
  rounded to the hour (DESIGN.md §7).

Money is Decimal in full precision (round only when shown); hours are floats.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import Case, IntegerField, Q, QuerySet, Sum, Value, When
from django.db.models.functions import TruncDay, TruncMonth, TruncWeek
from django.utils import timezone

from billing import breakeven as be
from billing import cost_model as cm
from billing.models import CostProfile
from config.replica import read_cursor
from fleet.models import FleetSettings, Gpu, Node, Pool, Site, Team, zone_or_utc
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS
from telemetry.models import DailyUsage, DailyUsageState, HourlyUsage

GROUP_BY = ("gpu", "node", "pool", "team", "site", "model", "fleet")
PERIODS = ("day", "week", "month", "all")
THROTTLE_REASONS = ("power_cap", "thermal", "hw_slowdown", "other")
# A GPU in service that sent nothing for this long counts as offline now (offline_now).
OFFLINE_NOW_AFTER = dt.timedelta(minutes=15)


def offline_now(last_seen_at: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether a GPU last seen at ``last_seen_at`` (None: never) counts as offline at ``now``."""
    return last_seen_at is None or last_seen_at < now - OFFLINE_NOW_AFTER


UNASSIGNED_NAME = "(none)"


@dataclass(frozen=True)
class Filters:
    """Restricts which GPUs count; each tuple empty = no restriction. Site/pool/team filters
    use the attribution stored with each hourly rollup (offline hours: current attribution)."""

    sites: tuple[str, ...] = ()  # site names
    pools: tuple[str, ...] = ()  # pool names
    teams: tuple[str, ...] = ()  # team names
    models: tuple[str, ...] = ()  # GpuModel keys, e.g. "H100-SXM"
    gpus: tuple[str, ...] = ()  # GPU UUIDs


@dataclass
class CostRow:
    """One group over one period: every field of the finance API's rows (DESIGN.md §7)."""

    key: str  # GPU UUID, hostname, pool/team/site name, model key, or "fleet"
    name: str  # human label (GPU: "host#index", model: display name)
    period_start: dt.datetime  # aware, report time zone, clipped to the query
    period_end: dt.datetime
    gpu_count: int  # GPUs with capacity in this row
    capacity_hours: float
    observed_hours: float
    air_hours: float
    held_hours: float
    parked_hours: float
    offline_hours: float
    utilization: float | None  # air / capacity; None when capacity is 0
    hours_in_air_per_day: float | None
    energy_kwh: float
    idle_energy_kwh: float
    energy_per_gpu_hour_kwh: float | None  # kWh / observed hours
    kwh_per_air_hour: float | None
    fixed_cost: Decimal
    energy_cost: Decimal
    total_cost: Decimal
    idle_cost: Decimal
    cost_per_air_hour: Decimal | None
    co2e_kg: float
    throttled_hours: float
    throttled_power_cap_hours: float
    throttled_thermal_hours: float
    throttled_hw_slowdown_hours: float
    throttled_other_hours: float
    work_utilization: float | None
    priced: bool  # False when any GPU in the row has no cost profile or no site
    currency: str
    nominal_rate_per_hour: Decimal  # capacity-weighted mean fixed rate


# --- plain data the computation works on ----------------------------------------------------
@dataclass(frozen=True)
class _SiteTerms:
    name: str | None
    pue: Decimal
    price_per_kwh: Decimal
    grid_g_per_kwh: Decimal


# A GPU with no site: PUE 1, price 0, grid 0 (DESIGN.md §3), and not priced.
_NO_SITE = _SiteTerms(
    name=None, pue=Decimal(1), price_per_kwh=Decimal(0), grid_g_per_kwh=Decimal(0)
)


@dataclass
class _GpuInfo:
    id: int
    uuid: str
    label: str
    model_key: str
    model_name: str
    max_power_w: float | None
    idle_power_w: float | None
    node_id: int | None  # current attribution: where offline hours go
    pool_id: int | None
    team_id: int | None
    site_id: int | None
    service_start: dt.datetime | None
    retired_at: dt.datetime | None
    last_seen_at: dt.datetime | None
    terms: cm.CostTerms | None
    boundary_hour: dt.datetime | None = None  # the UTC hour depreciation ends in
    rates: tuple[Decimal, Decimal, Decimal] = (Decimal(0), Decimal(0), Decimal(0))

    @property
    def kind(self) -> str | None:
        return self.terms.kind if self.terms else None

    def phase_intervals(self) -> list[tuple[int, dt.datetime | None, dt.datetime | None]]:
        """(phase, from, to) with open ends as None."""
        if self.boundary_hour is None:
            return [(0, None, None)]
        after = self.boundary_hour + cm.ONE_HOUR
        return [(0, None, self.boundary_hour), (1, self.boundary_hour, after), (2, after, None)]


@dataclass(frozen=True)
class _Bucket:
    key: dt.date  # local start date of the (unclipped) day, ISO week or month
    start: dt.datetime  # UTC, clipped to the query
    end: dt.datetime
    local_start: dt.datetime  # the same, in the report time zone
    local_end: dt.datetime


@dataclass
class _Segment:
    """One GPU, one bucket, one attribution, one phase: observed sums or offline hours."""

    gpu: _GpuInfo
    bucket: _Bucket
    phase: int
    node_id: int | None
    pool_id: int | None
    team_id: int | None
    site_id: int | None
    sums: dict[str, float] = field(default_factory=dict)
    offline_h: Decimal = Decimal(0)


@dataclass
class _Acc:
    """Running sums of one group over one bucket."""

    gpu_ids: set[int] = field(default_factory=set)
    capacity_h: Decimal = Decimal(0)
    owned_capacity_h: Decimal = Decimal(0)  # not rented: their energy is paid for
    offline_h: Decimal = Decimal(0)
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SUM_FIELDS, 0.0))
    energy_kwh: Decimal = Decimal(0)
    idle_energy_kwh: Decimal = Decimal(0)
    fixed_cost: Decimal = Decimal(0)
    energy_cost: Decimal = Decimal(0)
    idle_cost: Decimal = Decimal(0)
    co2e_kg: float = 0.0
    priced: bool = True
    nominal_max_w_h: float = 0.0  # Σ nominal power × capacity hours, for break-even fallbacks
    nominal_idle_w_h: float = 0.0
    nominal_h: float = 0.0


@dataclass
class _Names:
    nodes: dict[int, str]
    pools: dict[int, str]
    teams: dict[int, str]
    sites: dict[int, _SiteTerms]

    def site(self, site_id: int | None) -> _SiteTerms:
        return self.sites.get(site_id, _NO_SITE) if site_id is not None else _NO_SITE


@dataclass
class _Computation:
    currency: str
    zone: dt.tzinfo
    target_utilization: float
    local_start: dt.datetime
    local_end: dt.datetime
    window_start: dt.datetime  # UTC
    window_end: dt.datetime  # UTC, the query's end
    now: dt.datetime
    gpus: dict[int, _GpuInfo]
    names: _Names
    segments: list[_Segment]
    # Pooled (fleet trend only): per GPU, the days [from, to) summed per rate class, not per
    # GPU; those segments carry a stand-in GPU of the class.
    pooled: dict[int, tuple[dt.date, dt.date]] = field(default_factory=dict)  # GPU: [from, to)

    @property
    def capacity_end(self) -> dt.datetime:
        return max(self.window_start, min(self.window_end, self.now))

    @property
    def window_hours(self) -> Decimal:
        """The window's hours, cut off at now."""
        return cm.hours_between(start=self.window_start, end=self.capacity_end)


# --- time zone and buckets ------------------------------------------------------------------
def _local_midnight(day: dt.date, zone: dt.tzinfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=zone)


def _report_zone(name: str, start: dt.date, end: dt.date) -> dt.tzinfo:
    """The report zone, or a fixed whole-hour offset where its midnights are not on UTC hours
    within the query (rollups are hourly, so buckets must be made of whole UTC hours)."""
    zone: dt.tzinfo = zone_or_utc(name)
    day = start
    while day <= end:
        offset = _local_midnight(day, zone).utcoffset() or dt.timedelta(0)
        if offset.total_seconds() % 3600:
            first = _local_midnight(start, zone).utcoffset() or dt.timedelta(0)
            hours = (Decimal(first.total_seconds()) / 3600).quantize(
                Decimal(1), rounding=ROUND_HALF_UP
            )
            return dt.timezone(dt.timedelta(hours=int(hours)))
        day += dt.timedelta(days=1)
    return zone


def _bucket_key(day: dt.date, period: str, start: dt.date) -> dt.date:
    if period == "day":
        return day
    if period == "week":  # ISO weeks start on Monday
        return day - dt.timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return start


def _buckets(start: dt.date, end: dt.date, period: str, zone: dt.tzinfo) -> list[_Bucket]:
    spans: dict[dt.date, list[dt.date]] = {}
    day = start
    while day < end:
        key = _bucket_key(day, period, start)
        span = spans.setdefault(key, [day, day])
        span[1] = day
        day += dt.timedelta(days=1)
    buckets = []
    for key, (first, last) in spans.items():
        local_start = _local_midnight(first, zone)
        local_end = _local_midnight(last + dt.timedelta(days=1), zone)
        buckets.append(
            _Bucket(
                key=key,
                start=local_start.astimezone(dt.UTC),
                end=local_end.astimezone(dt.UTC),
                local_start=local_start,
                local_end=local_end,
            )
        )
    return buckets


def _floor_hour(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


# --- loading --------------------------------------------------------------------------------
def _terms(profile: CostProfile | None) -> cm.CostTerms | None:
    if profile is None:
        return None
    return cm.CostTerms(
        kind=profile.kind,
        purchase_price=profile.purchase_price,
        depreciation_years=profile.depreciation_years,
        opex_per_hour=profile.opex_per_hour,
        rental_rate_per_hour=profile.rental_rate_per_hour,
    )


_GPU_COLUMNS = (
    "id",
    "uuid",
    "index",
    "team_id",
    "in_service_at",
    "first_seen_at",
    "retired_at",
    "last_seen_at",
    "node_id",
    "node__hostname",
    "node__pool_id",
    "node__pool__name",
    "node__pool__team_id",
    "node__pool__site_id",
    "node__pool__site__name",
    "node__site_id",
    "node__site__name",
    "model_id",
    "model__key",
    "model__name",
    "model__max_power_w",
    "model__idle_power_w",
)


def _gpu_rows(gpu_qs: QuerySet[Gpu]) -> list[SimpleNamespace]:
    """The GPUs with their node, pool, sites and model as plain attribute objects shaped like
    the models ``_gpu_info`` reads: one ``values()`` query, no model instances (a fifth of
    the time for a thousand GPUs)."""
    out = []
    for r in gpu_qs.values_list(*_GPU_COLUMNS):
        row = dict(zip(_GPU_COLUMNS, r, strict=True))
        pool_site = SimpleNamespace(
            pk=row["node__pool__site_id"], name=row["node__pool__site__name"]
        )
        pool = SimpleNamespace(
            pk=row["node__pool_id"],
            name=row["node__pool__name"],
            team_id=row["node__pool__team_id"],
            site_id=row["node__pool__site_id"],
            site=pool_site,
        )
        node = SimpleNamespace(
            pk=row["node_id"],
            hostname=row["node__hostname"],
            pool_id=row["node__pool_id"],
            pool=pool,
            site_id=row["node__site_id"],
            site=SimpleNamespace(pk=row["node__site_id"], name=row["node__site__name"]),
        )
        model = SimpleNamespace(
            key=row["model__key"],
            name=row["model__name"],
            max_power_w=row["model__max_power_w"],
            idle_power_w=row["model__idle_power_w"],
        )
        out.append(
            SimpleNamespace(
                pk=row["id"],
                uuid=row["uuid"],
                index=row["index"],
                team_id=row["team_id"],
                in_service_at=row["in_service_at"],
                first_seen_at=row["first_seen_at"],
                retired_at=row["retired_at"],
                last_seen_at=row["last_seen_at"],
                node_id=row["node_id"],
                node=node,
                model_id=row["model_id"],
                model=model,
            )
        )
    return out


# Per cost profile, service start and retirement: the terms, the rates of the three phases
# and the hour depreciation ends in (the same for a whole batch of GPUs bought together).
_Rates = tuple[cm.CostTerms | None, tuple[Decimal, Decimal, Decimal], dt.datetime | None]


def _rates(
    profile: CostProfile | None,
    service_start: dt.datetime | None,
    retired_at: dt.datetime | None,
    now: dt.datetime,
) -> _Rates:
    terms = _terms(profile)
    depreciating = cm.fixed_rate_per_hour(terms=terms, depreciating=True)
    if terms is None or not terms.owned or service_start is None:
        return terms, (depreciating, depreciating, depreciating), None
    end = cm.depreciation_end(
        service_start=service_start, depreciation_years=terms.depreciation_years
    )
    boundary_hour = _floor_hour(end)
    hour_end = boundary_hour + cm.ONE_HOUR
    # The pro-rata rate of the hour depreciation ends in, over the part of it in service.
    span = cm.capacity_interval(
        service_start=service_start,
        retired_at=retired_at,
        start=boundary_hour,
        end=hour_end,
        now=now,
    ) or (boundary_hour, hour_end)
    split = cm.mean_fixed_rate_per_hour(
        terms=terms, service_start=service_start, start=span[0], end=span[1]
    )
    after = cm.fixed_rate_per_hour(terms=terms, depreciating=False)
    return terms, (depreciating, split, after), boundary_hour


def _gpu_info(
    gpu: Gpu,
    profiles: dict[tuple[str, str], CostProfile],
    now: dt.datetime,
    rates: dict[tuple[Any, ...], _Rates] | None = None,
) -> _GpuInfo:
    """``rates``: a cache of ``_rates`` for the GPUs of one load (one ``now``)."""
    node = gpu.node
    pool = node.pool if node.pool_id else None
    site = node.site if node.site_id else (pool.site if pool is not None and pool.site_id else None)
    team_id = gpu.team_id or (pool.team_id if pool is not None else None)
    profile = cm.cost_profile_resolve(
        profiles=profiles,
        gpu_uuid=gpu.uuid,
        hostname=node.hostname,
        pool_name=pool.name if pool is not None else None,
        site_name=site.name if site is not None else None,
    )
    service_start = gpu.in_service_at or gpu.first_seen_at
    key = (profile.pk if profile is not None else None, service_start, gpu.retired_at)
    found = rates.get(key) if rates is not None else None
    if found is None:
        found = _rates(profile, service_start, gpu.retired_at, now)
        if rates is not None:
            rates[key] = found
    terms, phase_rates, boundary_hour = found
    model = gpu.model if gpu.model_id else None
    return _GpuInfo(
        id=gpu.pk,
        uuid=gpu.uuid,
        label=f"{node.hostname}#{gpu.index}" if gpu.index is not None else node.hostname,
        model_key=model.key if model is not None else "",
        model_name=model.name if model is not None else UNASSIGNED_NAME,
        max_power_w=model.max_power_w if model is not None else None,
        idle_power_w=model.idle_power_w if model is not None else None,
        node_id=node.pk,
        pool_id=pool.pk if pool is not None else None,
        team_id=team_id,
        site_id=site.pk if site is not None else None,
        service_start=service_start,
        retired_at=gpu.retired_at,
        last_seen_at=gpu.last_seen_at,
        terms=terms,
        boundary_hour=boundary_hour,
        rates=phase_rates,
    )


def _validate(*, start: dt.date, end: dt.date, period: str, group_by: str = "fleet") -> None:
    if end <= start:
        raise ValueError("end: must be after start")
    if period not in PERIODS:
        raise ValueError(f"period: must be one of {', '.join(PERIODS)}")
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by: must be one of {', '.join(GROUP_BY)}")


def _daily_zone(zone: dt.tzinfo) -> bool:
    """Whether ``telemetry.DailyUsage`` holds the local days of ``zone`` (PostgreSQL, built
    for this very zone); otherwise the selectors read hourly rows only."""
    if connection.vendor != "postgresql":
        return False
    if not isinstance(zone, ZoneInfo):  # a fixed offset standing in for a zone with
        return False  # non-whole-hour midnights
    name = zone.key
    state = DailyUsageState.objects.order_by("id").values_list("zone", flat=True).first()
    return state is not None and state == name


def _filtered(rows: QuerySet[Any], filters: Filters) -> QuerySet[Any]:
    if filters.models:
        rows = rows.filter(gpu__model__key__in=filters.models)
    if filters.gpus:
        rows = rows.filter(gpu__uuid__in=filters.gpus)
    return rows


def _summed(rows: QuerySet[Any], fields: list[str]) -> list[dict[str, Any]]:
    """The rollup sums of ``rows`` per ``fields``, as dicts. The statement is Django's, the
    values as PostgreSQL sends them: Django's per-value converters (``float`` of a float,
    ``int`` of an integer, a bucket made aware and back) cost more than the query on a large
    fleet. A bucket is a date, or a local midnight as a datetime (see ``_compute``)."""
    summed = rows.values(*fields).annotate(**{f: Sum(f) for f in _SUM_FIELDS}).order_by()
    if connection.vendor != "postgresql":
        # SQLite sends dates and datetimes as text: it needs Django's converters (and its
        # fleets are small).
        return list(summed)
    query = summed.query
    with read_cursor() as cursor:
        cursor.execute(*query.sql_with_params())
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _summed_hourly(
    rows: QuerySet[Any], filters: Filters, *, period: str, zone: dt.tzinfo, whens: list[When]
) -> list[dict[str, Any]]:
    """Hourly rows summed per GPU, attribution[, phase][, bucket in the report zone]."""
    rows = _filtered(rows, filters)
    fields = ["gpu_id", "node_id", "pool_id", "team_id", "site_id"]
    if whens:
        rows = rows.annotate(phase=Case(*whens, default=Value(-1), output_field=IntegerField()))
        fields.append("phase")
    if period != "all":
        trunc = {"day": TruncDay, "week": TruncWeek, "month": TruncMonth}[period]
        rows = rows.annotate(bucket=trunc("hour", tzinfo=zone))
        fields.append("bucket")
    return _summed(rows, fields)


def _by_attribution(filters: Filters) -> bool:
    return bool(filters.sites or filters.pools or filters.teams)


def _poolable(
    gpus: dict[int, _GpuInfo],
    split_ids: list[int],
    start: dt.date,
    end: dt.date,
    zone: dt.tzinfo,
) -> dict[int, tuple[dt.date, dt.date]]:
    """Per GPU at one rate throughout the window, the days [from, to) within [start, end) it
    is in service from midnight to midnight (each day's capacity is then the calendar day):
    those GPU-days can be summed per rate class."""
    split = set(split_ids)
    out: dict[int, tuple[dt.date, dt.date]] = {}
    for g in gpus.values():
        if g.id in split or g.service_start is None:
            continue
        first = g.service_start.astimezone(zone).date()
        if _local_midnight(first, zone) < g.service_start:
            first += dt.timedelta(days=1)
        last = end if g.retired_at is None else min(end, g.retired_at.astimezone(zone).date())
        first = max(first, start)
        if first < last:
            out[g.id] = (first, last)
    return out


def _phase_outside(gpu: _GpuInfo, window_start: dt.datetime) -> int:
    """The phase of a GPU whose depreciation does not end inside the window."""
    ends = gpu.boundary_hour
    return 2 if ends is not None and ends < window_start else 0


# Rollup columns summed per rate class and day (the fleet trend's pooled path).
_POOLED_SQL = """
    -- One row per local day, rate class and stored site: the daily sums of GPUs that share
    -- their rate, kind and nominal power, so the cost model runs once per class and day
    -- instead of once per GPU and day. A row's class and its GPU's pooled days [first, last)
    -- are looked up by GPU id in arrays that start at the lowest pooled id (class -1: not
    -- pooled), so the table is read once with no join (a hash join on the unnested ids
    -- hashed the whole table instead, as it cannot know the ids are distinct: 2-3x slower).
    -- ``over``: a row observed more than 3600 s per hour it sums (see _OVER_SQL).
    SELECT day, klass, site_id, bool_or(observed_s > 3600 * hours), {sums}
    FROM (
        SELECT d.*, (%(classes)s::int[])[d.gpu_id - %(base)s] AS klass,
               (%(firsts)s::date[])[d.gpu_id - %(base)s] AS first_day,
               (%(lasts)s::date[])[d.gpu_id - %(base)s] AS last_day
        FROM telemetry_dailyusage d
        WHERE d.gpu_id > %(base)s AND d.gpu_id <= %(top)s
          AND d.day >= %(from)s AND d.day < %(to)s
    ) rows
    WHERE klass >= 0 AND day >= first_day AND day < last_day
    GROUP BY day, klass, site_id
"""

# GPU-days that observed more than the day's length (overlapping samples): their offline
# hours are 0, not negative, so the pooled offline sum is corrected for exactly these. Such a
# day has a row that observed more than 3600 s per hour it sums (a day has at most its length
# in hours), so only the days with such a row are summed, and only when the pooled sums saw
# one (``over``): never, as a rule.
_OVER_SQL = """
    SELECT d.gpu_id, d.day, sum(d.observed_s)
    FROM telemetry_dailyusage d
    JOIN (
        SELECT DISTINCT o.gpu_id, o.day
        FROM telemetry_dailyusage o
        JOIN unnest(%(ids)s::bigint[], %(firsts)s::date[], %(lasts)s::date[])
            AS c(gpu_id, first, last)
          ON c.gpu_id = o.gpu_id AND o.day >= c.first AND o.day < c.last
        WHERE o.observed_s > 3600 * o.hours
    ) k ON k.gpu_id = d.gpu_id AND k.day = d.day
    GROUP BY d.gpu_id, d.day
    HAVING sum(d.observed_s) > extract(epoch FROM
        ((d.day + 1)::timestamp AT TIME ZONE %(zone)s) - (d.day::timestamp AT TIME ZONE %(zone)s))
"""


def _pooled_segments(
    *,
    gpus: dict[int, _GpuInfo],
    days: dict[int, tuple[dt.date, dt.date]],
    zone: dt.tzinfo,
    buckets: dict[dt.date, _Bucket],
    window_start: dt.datetime,
) -> list[_Segment]:
    """Day segments of the pooled GPUs, one per rate class, day and site: observed sums as
    stored, and offline hours (to the class's current site) = GPUs × the day's calendar
    hours − their observed hours, the same sum as per GPU since none observed more than the
    day (those that did are corrected below). Every GPU of a class has the same rate, kind,
    profile presence and nominal power, so ``_accumulate`` gives the same money."""
    classes: dict[tuple[object, ...], int] = {}
    members: dict[int, list[_GpuInfo]] = defaultdict(list)
    for gpu_id in sorted(days):
        gpu = gpus[gpu_id]
        phase = _phase_outside(gpu, window_start)
        key = (
            gpu.kind,
            gpu.rates[phase],
            phase,
            gpu.terms is None,
            gpu.max_power_w,
            gpu.idle_power_w,
            gpu.site_id,
        )
        klass = classes.setdefault(key, len(classes))
        members[klass].append(gpu)
    klass_of = {g.id: k for k, group in members.items() for g in group}
    zone_name = zone.key if isinstance(zone, ZoneInfo) else "UTC"
    ids = list(klass_of)
    base, top = min(ids) - 1, max(ids)  # SQL arrays are 1-based: index = id - base
    outside = min(first for first, _ in days.values())  # any date: class -1 is not read
    klass_at, first_at, last_at = (
        [-1] * (top - base),
        [outside] * (top - base),
        [outside] * (top - base),
    )
    for gpu_id, klass in klass_of.items():
        klass_at[gpu_id - base - 1] = klass
        first_at[gpu_id - base - 1], last_at[gpu_id - base - 1] = days[gpu_id]
    params: dict[str, Any] = {
        "classes": klass_at,
        "firsts": first_at,
        "lasts": last_at,
        "base": base,
        "top": top,
        "from": outside,
        "to": max(last for _, last in days.values()),
    }
    sums_sql = ", ".join(f"sum({f})" for f in _SUM_FIELDS)
    observed_s: dict[tuple[int, dt.date], float] = defaultdict(float)
    segments: list[_Segment] = []
    over: list[tuple[Any, ...]] = []
    with read_cursor(atomic=True) as cursor:
        # Hashing a large fleet's class-days (1,000 GPUs × 90 days) outgrows the default
        # 4 MB; and one process, not parallel workers, sums each group, so its sums are
        # taken in the same order on every run. This statement's transaction only.
        cursor.execute(
            "SELECT set_config('work_mem', '64MB', true),"
            " set_config('max_parallel_workers_per_gather', '0', true)"
        )
        cursor.execute(_POOLED_SQL.format(sums=sums_sql), params)
        any_over = False
        for day, klass, site_id, day_over, *values in cursor.fetchall():
            any_over = any_over or day_over
            stand_in = members[klass][0]
            sums = {f: float(v or 0) for f, v in zip(_SUM_FIELDS, values, strict=True)}
            observed_s[(klass, day)] += sums["observed_s"]
            segments.append(
                _Segment(
                    gpu=stand_in,
                    bucket=buckets[day],
                    phase=_phase_outside(stand_in, window_start),
                    node_id=None,
                    pool_id=None,
                    team_id=None,
                    site_id=site_id,
                    sums=sums,
                )
            )
        if any_over:
            cursor.execute(
                _OVER_SQL,
                {
                    "ids": ids,
                    "firsts": [days[i][0] for i in ids],
                    "lasts": [days[i][1] for i in ids],
                    "zone": zone_name,
                },
            )
            over = cursor.fetchall()
    excess: dict[tuple[int, dt.date], Decimal] = defaultdict(Decimal)
    for gpu_id, day, observed in over:
        bucket = buckets[day]
        excess[(klass_of[gpu_id], day)] += cm.hours_from_seconds(seconds=observed) - (
            cm.hours_between(start=bucket.start, end=bucket.end)
        )
    # GPUs of each class in service on each day: +1 on its first day, −1 after its last.
    changes: dict[int, dict[dt.date, int]] = defaultdict(lambda: defaultdict(int))
    for gpu_id, klass in klass_of.items():
        changes[klass][days[gpu_id][0]] += 1
        changes[klass][days[gpu_id][1]] -= 1
    start = min(first for first, _ in days.values())
    end = max(last for _, last in days.values())
    for klass, group in members.items():
        stand_in = group[0]
        count = 0
        day = start
        while day < end:
            count += changes[klass].get(day, 0)
            bucket = buckets[day]
            calendar_h = cm.hours_between(start=bucket.start, end=bucket.end) * count
            observed_h = cm.hours_from_seconds(seconds=observed_s.get((klass, day), 0.0))
            offline_h = calendar_h - observed_h + excess.get((klass, day), Decimal(0))
            if offline_h > 0:
                segments.append(
                    _Segment(
                        gpu=stand_in,
                        bucket=bucket,
                        phase=_phase_outside(stand_in, window_start),
                        node_id=stand_in.node_id,
                        pool_id=stand_in.pool_id,
                        team_id=stand_in.team_id,
                        site_id=stand_in.site_id,
                        sums=dict.fromkeys(_SUM_FIELDS, 0.0),
                        offline_h=offline_h,
                    )
                )
            day += dt.timedelta(days=1)
    return segments


def _names_load() -> _Names:
    return _Names(
        nodes={},
        pools=dict(Pool.objects.values_list("id", "name")),
        teams=dict(Team.objects.values_list("id", "name")),
        sites={
            s.pk: _SiteTerms(
                name=s.name,
                pue=s.pue,
                price_per_kwh=s.price_per_kwh,
                grid_g_per_kwh=cm.to_decimal(s.grid_g_per_kwh),
            )
            for s in Site.objects.all()
        },
    )


@dataclass
class _Loaded:
    """What a computation reads before the rollups (settings, zone, names, GPUs and their
    cost terms): the same for every period of one query, so a page that needs two periods
    (the overview: the whole window and each day) loads it once."""

    now: dt.datetime
    fleet_settings: FleetSettings
    zone: dt.tzinfo
    names: _Names
    gpus: dict[int, _GpuInfo]
    daily_zone: bool
    # The day in progress from hourly rows, summed per GPU and attribution (period "all"):
    # one bucket of any period, so the overview's trend reuses its summary's. Key: (from,
    # to, split GPUs).
    in_progress: dict[tuple[Any, ...], list[dict[str, Any]]] = field(default_factory=dict)


def _load(*, start: dt.date, end: dt.date, filters: Filters, now: dt.datetime | None) -> _Loaded:
    now = now or timezone.now()
    fleet_settings = FleetSettings.load()
    zone = _report_zone(fleet_settings.report_time_zone, start, end)
    window_start = _local_midnight(start, zone).astimezone(dt.UTC)
    names = _names_load()
    profiles = {(p.scope_kind, p.scope_name): p for p in CostProfile.objects.all()}
    gpu_qs = Gpu.objects.exclude(retired_at__lte=window_start)
    if filters.models:
        gpu_qs = gpu_qs.filter(model__key__in=filters.models)
    if filters.gpus:
        gpu_qs = gpu_qs.filter(uuid__in=filters.gpus)
    gpus: dict[int, _GpuInfo] = {}
    rates: dict[tuple[Any, ...], _Rates] = {}
    for gpu in _gpu_rows(gpu_qs):
        gpus[gpu.pk] = _gpu_info(gpu, profiles, now, rates)  # type: ignore[arg-type]
        names.nodes[gpu.node_id] = gpu.node.hostname
    return _Loaded(
        now=now,
        fleet_settings=fleet_settings,
        zone=zone,
        names=names,
        gpus=gpus,
        daily_zone=_daily_zone(zone),
    )


def _compute(
    *,
    start: dt.date,
    end: dt.date,
    period: str,
    filters: Filters,
    now: dt.datetime | None,
    pooled: bool = False,
    loaded: _Loaded | None = None,
) -> _Computation:
    loaded = loaded or _load(start=start, end=end, filters=filters, now=now)
    now, fleet_settings, zone = loaded.now, loaded.fleet_settings, loaded.zone
    names, gpus, daily_zone = loaded.names, loaded.gpus, loaded.daily_zone
    buckets = _buckets(start, end, period, zone)
    local_start, local_end = _local_midnight(start, zone), _local_midnight(end, zone)
    window_start, window_end = local_start.astimezone(dt.UTC), local_end.astimezone(dt.UTC)
    capacity_end = max(window_start, min(window_end, now))

    # The rollup sums, in SQL: per GPU, bucket, attribution (as stored) and phase.
    by_boundary: dict[dt.datetime, list[int]] = defaultdict(list)
    for info in gpus.values():
        if info.boundary_hour is not None and window_start <= info.boundary_hour < capacity_end:
            by_boundary[info.boundary_hour].append(info.id)
    split_ids = [i for ids in by_boundary.values() for i in ids]
    pooled_days: dict[int, tuple[dt.date, dt.date]] = {}
    sum_rows: list[dict[str, Any]] = []
    if daily_zone:
        # Whole local days from the daily pre-aggregate (24× fewer rows), except for the GPUs
        # whose depreciation ends inside the window (that hour is split); hourly rows for
        # those GPUs and for the day still in progress (up to now).
        day = start
        while day < end and _local_midnight(day + dt.timedelta(days=1), zone) <= capacity_end:
            day += dt.timedelta(days=1)
        hourly_from = _local_midnight(day, zone).astimezone(dt.UTC)
        if pooled and day > start and period == "day" and not _by_attribution(filters):
            pooled_days = _poolable(gpus, split_ids, start, day, zone)
        if day > start:
            dailies = DailyUsage.objects.filter(day__gte=start, day__lt=day)
            if split_ids:
                dailies = dailies.exclude(gpu_id__in=split_ids)
            if pooled_days:
                # Only the GPU-days not pooled: the days outside each pooled GPU's span, and
                # every day of the other GPUs (few spans: most GPUs share one, so the days
                # outside it are read by the day index, not by scanning the table).
                by_range: dict[tuple[dt.date, dt.date], list[int]] = defaultdict(list)
                for gpu_id, days in pooled_days.items():
                    by_range[days].append(gpu_id)
                unpooled = [g for g in gpus if g not in pooled_days]
                if len(by_range) == 1 and not unpooled:
                    # Every GPU pooled over one span (the rule): the days outside it, with no
                    # list of ids (other GPUs' rows find no GPU below and are left out).
                    ((first, last),) = by_range
                    wanted = Q(day__lt=first) | Q(day__gte=last)
                else:
                    wanted = Q(gpu_id__in=unpooled) if unpooled else Q(pk__in=[])
                    for (first, last), ids in by_range.items():
                        wanted |= Q(gpu_id__in=ids) & (Q(day__lt=first) | Q(day__gte=last))
                dailies = dailies.filter(wanted)
            dailies = _filtered(dailies, filters)
            fields = ["gpu_id", "node_id", "pool_id", "team_id", "site_id"]
            if period != "all":
                trunc = {"day": None, "week": TruncWeek, "month": TruncMonth}[period]
                if trunc is None:
                    fields.append("day")
                else:
                    dailies = dailies.annotate(bucket=trunc("day"))
                    fields.append("bucket")
            for row in _summed(dailies, fields):
                if "day" in row:
                    row["bucket"] = row.pop("day")
                sum_rows.append(row)
        if hourly_from < capacity_end:
            # The day in progress: hourly rows of one local day (``day``), up to now. Read
            # per period as ever, except that the overview's trend takes its summary's.
            progress_key = (hourly_from, capacity_end, tuple(split_ids))
            rest_rows = loaded.in_progress.get(progress_key)
            if rest_rows is not None and period != "all":
                sum_rows += [{**r, "bucket": day} for r in rest_rows]
            else:
                rest = HourlyUsage.objects.filter(hour__gte=hourly_from, hour__lt=capacity_end)
                if split_ids:
                    rest = rest.exclude(gpu_id__in=split_ids)
                rest_rows = _summed_hourly(rest, filters, period=period, zone=zone, whens=[])
                if period == "all":
                    loaded.in_progress[progress_key] = rest_rows
                sum_rows += rest_rows
        hourly = HourlyUsage.objects.filter(
            gpu_id__in=split_ids, hour__gte=window_start, hour__lt=capacity_end
        )
    else:
        hourly = HourlyUsage.objects.filter(hour__gte=window_start, hour__lt=capacity_end)
    if not daily_zone or split_ids:
        whens: list[When] = []
        for boundary, ids in by_boundary.items():
            whens += [
                When(gpu_id__in=ids, hour__lt=boundary, then=Value(0)),
                When(gpu_id__in=ids, hour=boundary, then=Value(1)),
                When(gpu_id__in=ids, then=Value(2)),
            ]
        sum_rows += _summed_hourly(hourly, filters, period=period, zone=zone, whens=whens)

    buckets_by_key = {b.key: b for b in buckets}
    # One segment per GPU, bucket, phase and attribution, whichever table its sums came from.
    merged: dict[tuple[Any, ...], _Segment] = {}
    for row in sum_rows:
        owner = gpus.get(row["gpu_id"])
        if owner is None:
            continue
        if period == "all":
            key = start
        else:
            # A day of the daily table; a week or month of it truncated in SQL (midnight of
            # the session's zone); or hourly rows truncated in the report zone (local time).
            found = row["bucket"]
            if isinstance(found, dt.datetime):
                found = found.date()
            key = _bucket_key(found, period, start)
        bucket = buckets_by_key.get(key)
        if bucket is None:
            continue
        phase = row.get("phase", -1)
        if phase < 0:  # no depreciation boundary within the window
            ends = owner.boundary_hour
            phase = 2 if ends is not None and ends < window_start else 0
        ident: tuple[Any, ...] = (owner.id, key, phase, row["node_id"], row["pool_id"])
        ident += (row["team_id"], row["site_id"])
        segment = merged.get(ident)
        if segment is None:
            merged[ident] = _Segment(
                gpu=owner,
                bucket=bucket,
                phase=phase,
                node_id=row["node_id"],
                pool_id=row["pool_id"],
                team_id=row["team_id"],
                site_id=row["site_id"],
                sums={f: float(row[f] or 0) for f in _SUM_FIELDS},
            )
        else:
            for f in _SUM_FIELDS:
                segment.sums[f] += float(row[f] or 0)
    segments: list[_Segment] = list(merged.values())
    if pooled_days:
        segments += _pooled_segments(
            gpus=gpus,
            days=pooled_days,
            zone=zone,
            buckets=buckets_by_key,
            window_start=window_start,
        )
    observed_h: dict[tuple[int, dt.date, int], Decimal] = defaultdict(Decimal)
    for segment in segments:
        observed_h[(segment.gpu.id, segment.bucket.key, segment.phase)] += cm.hours_from_seconds(
            seconds=segment.sums["observed_s"]
        )

    missing_nodes = {s.node_id for s in segments if s.node_id is not None} - names.nodes.keys()
    if missing_nodes:  # nodes a GPU has since left
        names.nodes.update(Node.objects.filter(pk__in=missing_nodes).values_list("id", "hostname"))

    # Offline hours: calendar capacity per phase less what was observed, to the current owner.
    position = {b.key: i for i, b in enumerate(buckets)}
    for info in gpus.values():
        own = buckets
        pooled_span = pooled_days.get(info.id)
        if pooled_span is not None:  # its offline hours on those days are in pooled segments
            cut = position[pooled_span[0]], position.get(pooled_span[1], len(buckets))
            own = buckets[: cut[0]] + buckets[cut[1] :]
        for bucket in own:
            span = cm.capacity_interval(
                service_start=info.service_start,
                retired_at=info.retired_at,
                start=bucket.start,
                end=bucket.end,
                now=now,
            )
            if span is None:
                continue
            for phase, lo, hi in info.phase_intervals():
                if (lo and lo >= span[1]) or (hi and hi <= span[0]):
                    continue  # no capacity in this phase: no offline hours
                capacity_h = cm.hours_between(
                    start=max(span[0], lo) if lo else span[0],
                    end=min(span[1], hi) if hi else span[1],
                )
                offline_h = cm.offline_hours(
                    capacity_hours=capacity_h,
                    observed_hours=observed_h.get((info.id, bucket.key, phase), Decimal(0)),
                )
                if offline_h > 0:
                    segments.append(
                        _Segment(
                            gpu=info,
                            bucket=bucket,
                            phase=phase,
                            node_id=info.node_id,
                            pool_id=info.pool_id,
                            team_id=info.team_id,
                            site_id=info.site_id,
                            sums=dict.fromkeys(_SUM_FIELDS, 0.0),
                            offline_h=offline_h,
                        )
                    )

    segments = [s for s in segments if _segment_kept(s, filters, names)]
    return _Computation(
        currency=fleet_settings.currency,
        zone=zone,
        target_utilization=fleet_settings.target_utilization,
        local_start=local_start,
        local_end=local_end,
        window_start=window_start,
        window_end=window_end,
        now=now,
        gpus=gpus,
        names=names,
        segments=segments,
        pooled=pooled_days,
    )


def _kept(
    gpu: _GpuInfo,
    *,
    site_id: int | None,
    pool_id: int | None,
    team_id: int | None,
    filters: Filters,
    names: _Names,
) -> bool:
    """Whether the filters keep this GPU with this attribution."""
    if filters.sites and names.site(site_id).name not in filters.sites:
        return False
    if filters.pools and names.pools.get(pool_id or 0) not in filters.pools:
        return False
    if filters.teams and names.teams.get(team_id or 0) not in filters.teams:
        return False
    if filters.models and gpu.model_key not in filters.models:
        return False
    return not (filters.gpus and gpu.uuid not in filters.gpus)


def _segment_kept(segment: _Segment, filters: Filters, names: _Names) -> bool:
    return _kept(
        segment.gpu,
        site_id=segment.site_id,
        pool_id=segment.pool_id,
        team_id=segment.team_id,
        filters=filters,
        names=names,
    )


# --- grouping -------------------------------------------------------------------------------
def _group(segment: _Segment, group_by: str, names: _Names) -> tuple[str, str]:
    """(key, name) of the group a segment belongs to."""
    gpu = segment.gpu
    if group_by == "gpu":
        return gpu.uuid, gpu.label
    if group_by == "model":
        return gpu.model_key, gpu.model_name
    if group_by == "fleet":
        return "fleet", "Fleet"
    if group_by == "site":
        found: str | None = names.site(segment.site_id).name
    else:
        ids = {"node": segment.node_id, "pool": segment.pool_id, "team": segment.team_id}
        table = {"node": names.nodes, "pool": names.pools, "team": names.teams}[group_by]
        found = table.get(ids[group_by] or 0)
    return (found, found) if found else ("", UNASSIGNED_NAME)


_ZERO = Decimal(0)


def _accumulate(acc: _Acc, segment: _Segment, names: _Names) -> None:
    """Add one segment's hours and money to ``acc`` through the cost model.

    The cost model's formulas (``hours_from_seconds``, ``kwh_from_joules``,
    ``fixed_cost_at_rate``, ``energy_cost``, ``idle_cost``, ``co2e_kg``) are written out
    here operation for operation, on the same Decimals in the same order, so the figures are
    identical; this runs once per GPU, bucket and phase, and the calls and repeated
    float → Decimal conversions were most of a dashboard page's time."""
    gpu, sums = segment.gpu, segment.sums
    site = names.site(segment.site_id)
    rate = gpu.rates[segment.phase]
    terms = gpu.terms
    rented = terms is not None and terms.kind == cm.RENTED
    offline_h = segment.offline_h
    capacity_h = cm.to_decimal(sums["observed_s"]) / cm.SECONDS_PER_HOUR + offline_h
    energy_kwh = cm.to_decimal(sums["energy_j"]) / cm.JOULES_PER_KWH
    idle_energy_kwh = cm.to_decimal(sums["idle_energy_j"]) / cm.JOULES_PER_KWH
    air_h = cm.to_decimal(sums["air_s"]) / cm.SECONDS_PER_HOUR
    if capacity_h > 0:
        acc.gpu_ids.add(gpu.id)
    acc.capacity_h += capacity_h
    if not rented:
        acc.owned_capacity_h += capacity_h
    acc.offline_h += offline_h
    acc_sums = acc.sums
    for name in _SUM_FIELDS:
        acc_sums[name] += sums[name]
    acc.energy_kwh += energy_kwh
    acc.idle_energy_kwh += idle_energy_kwh
    acc.fixed_cost += rate * capacity_h
    pue = cm.to_decimal(site.pue)
    if rented:  # the rate includes energy
        energy_cost = idle_energy_cost = _ZERO
    else:
        price = cm.to_decimal(site.price_per_kwh)
        energy_cost = energy_kwh * pue * price
        idle_energy_cost = idle_energy_kwh * pue * price
    acc.energy_cost += energy_cost
    acc.idle_cost += rate * (capacity_h - air_h) + idle_energy_cost
    acc.co2e_kg += float(energy_kwh * pue * cm.to_decimal(site.grid_g_per_kwh) / cm.GRAMS_PER_KG)
    if terms is None or site.name is None:
        acc.priced = False
    if gpu.max_power_w is not None and gpu.idle_power_w is not None:
        capacity_f = float(capacity_h)
        acc.nominal_max_w_h += gpu.max_power_w * capacity_f
        acc.nominal_idle_w_h += gpu.idle_power_w * capacity_f
        acc.nominal_h += capacity_f


def _hours(seconds: float) -> float:
    return float(cm.hours_from_seconds(seconds=seconds))


def _cost_row(
    acc: _Acc,
    *,
    key: str,
    name: str,
    local_start: dt.datetime,
    local_end: dt.datetime,
    currency: str,
) -> CostRow:
    s = acc.sums
    air_h = cm.hours_from_seconds(seconds=s["air_s"])
    observed_h = cm.hours_from_seconds(seconds=s["observed_s"])
    total = cm.total_cost(fixed_cost=acc.fixed_cost, energy_cost=acc.energy_cost)
    return CostRow(
        key=key,
        name=name,
        period_start=local_start,
        period_end=local_end,
        gpu_count=len(acc.gpu_ids),
        capacity_hours=float(acc.capacity_h),
        observed_hours=float(observed_h),
        air_hours=float(air_h),
        held_hours=_hours(s["held_s"]),
        parked_hours=_hours(s["parked_s"]),
        offline_hours=float(acc.offline_h),
        utilization=cm.utilization(air_hours=air_h, capacity_hours=acc.capacity_h),
        hours_in_air_per_day=cm.hours_in_air_per_day(
            air_hours=air_h, capacity_hours=acc.capacity_h
        ),
        energy_kwh=float(acc.energy_kwh),
        idle_energy_kwh=float(acc.idle_energy_kwh),
        energy_per_gpu_hour_kwh=cm.energy_per_gpu_hour_kwh(
            energy_kwh=acc.energy_kwh, observed_hours=observed_h
        ),
        kwh_per_air_hour=cm.kwh_per_air_hour(energy_kwh=acc.energy_kwh, air_hours=air_h),
        fixed_cost=acc.fixed_cost,
        energy_cost=acc.energy_cost,
        total_cost=total,
        idle_cost=acc.idle_cost,
        cost_per_air_hour=cm.cost_per_air_hour(total_cost=total, air_hours=air_h),
        co2e_kg=acc.co2e_kg,
        throttled_hours=_hours(s["throttle_any_s"]),
        throttled_power_cap_hours=_hours(s["throttle_power_cap_s"]),
        throttled_thermal_hours=_hours(s["throttle_thermal_s"]),
        throttled_hw_slowdown_hours=_hours(s["throttle_hw_slowdown_s"]),
        throttled_other_hours=_hours(s["throttle_other_s"]),
        work_utilization=(
            s["sm_active_s"] / s["sm_observed_s"] if s["sm_observed_s"] > 0 else None
        ),
        priced=acc.priced,
        currency=currency,
        nominal_rate_per_hour=acc.fixed_cost / acc.capacity_h if acc.capacity_h > 0 else Decimal(0),
    )


def _grouped(
    computation: _Computation, group_by: str
) -> dict[tuple[_Bucket, str], tuple[str, _Acc]]:
    groups: dict[tuple[_Bucket, str], tuple[str, _Acc]] = {}
    for segment in computation.segments:
        key, name = _group(segment, group_by, computation.names)
        entry = groups.get((segment.bucket, key))
        if entry is None:
            entry = groups[(segment.bucket, key)] = (name, _Acc())
        _accumulate(entry[1], segment, computation.names)
    return groups


# --- public ---------------------------------------------------------------------------------
def cost_rows(
    *,
    start: dt.date,
    end: dt.date,
    group_by: str = "gpu",
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[CostRow]:
    """Rows per group and period over [start, end) (dates in the report time zone).

    Ordered by period_start, then key. Reads hourly rollups only (never the raw table); the
    number of queries does not grow with the number of GPUs. Raises ValueError naming a bad
    argument.
    """
    _validate(start=start, end=end, period=period, group_by=group_by)
    computation = _compute(
        start=start, end=end, period=period, filters=filters or Filters(), now=now
    )
    return _rows(computation, group_by)


def cost_rows_by(
    *,
    start: dt.date,
    end: dt.date,
    group_bys: tuple[str, ...],
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> dict[str, list[CostRow]]:
    """``cost_rows`` for several groupings of the same period and filters, from one
    computation (a page that shows GPUs and models, or teams and pools, reads the rollups
    once): ``{group_by: rows}``, each list as ``cost_rows`` returns it."""
    for group_by in group_bys:
        _validate(start=start, end=end, period=period, group_by=group_by)
    computation = _compute(
        start=start, end=end, period=period, filters=filters or Filters(), now=now
    )
    return {group_by: _rows(computation, group_by) for group_by in group_bys}


def _rows(computation: _Computation, group_by: str) -> list[CostRow]:
    grouped = _grouped(computation, group_by)
    if computation.pooled:
        assert group_by == "fleet", "pooled segments stand for a class of GPUs, not one"
        by_span: dict[tuple[dt.date, dt.date], set[int]] = defaultdict(set)
        for gpu_id, span in computation.pooled.items():
            by_span[span].add(gpu_id)  # few spans: most GPUs share one
        for (bucket, _key), (_name, acc) in grouped.items():
            for (first, last), ids in by_span.items():
                if first <= bucket.key < last:
                    acc.gpu_ids |= ids
    rows = [
        _cost_row(
            acc,
            key=key,
            name=name,
            local_start=bucket.local_start,
            local_end=bucket.local_end,
            currency=computation.currency,
        )
        for (bucket, key), (name, acc) in grouped.items()
    ]
    rows.sort(key=lambda r: (r.period_start, r.key))
    return rows


def fleet_trend(
    *,
    start: dt.date,
    end: dt.date,
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[CostRow]:
    """The fleet's rows per day over [start, end): ``cost_rows(group_by="fleet",
    period="day")`` by a faster path for the overview's trend charts. The GPUs in service
    over the whole window at one rate are summed per rate class and day in SQL (so the cost
    model runs per class, not per GPU-day); the rest per GPU. Same figures up to the last
    digits of float and 28-digit Decimal sums taken in another order."""
    _validate(start=start, end=end, period="day")
    computation = _compute(
        start=start, end=end, period="day", filters=filters or Filters(), now=now, pooled=True
    )
    return _rows(computation, "fleet")


_UTILIZATION_SQL = """
    -- Utilisation per GPU and local day, as arrays over the days: air / capacity, capacity
    -- = observed + offline = greatest(observed, calendar seconds in service). Whole days
    -- from the daily table, the day in progress from hourly rows. A day with no rows and no
    -- calendar seconds is NULL (no capacity: not shown).
    WITH span AS (
        SELECT * FROM unnest(%(ids)s::bigint[], %(lo)s::timestamptz[], %(hi)s::timestamptz[])
            AS s(gpu_id, lo, hi)
    ), days AS (
        SELECT i, %(start)s::date + i AS day,
               (%(start)s::date + i)::timestamp AT TIME ZONE %(zone)s AS day_start,
               (%(start)s::date + i + 1)::timestamp AT TIME ZONE %(zone)s AS day_end
        FROM generate_series(0, %(days)s - 1) AS i
    ), used AS (
        SELECT gpu_id, day, sum(air_s) AS air_s, sum(observed_s) AS observed_s
        FROM (
            -- The GPUs asked for only (a page of the heatmap reads a tenth of the table;
            -- ANY of a long array is hashed, one lookup a row).
            SELECT gpu_id, day, air_s, observed_s FROM telemetry_dailyusage
            WHERE day >= %(start)s AND day < %(whole_end)s AND gpu_id = ANY(%(ids)s::bigint[])
            UNION ALL
            SELECT gpu_id, (hour AT TIME ZONE %(zone)s)::date, air_s, observed_s
            FROM telemetry_hourlyusage
            WHERE hour >= %(hourly_from)s AND hour < %(capacity_end)s
              AND gpu_id = ANY(%(ids)s::bigint[])
        ) rows
        GROUP BY gpu_id, day
    ), cells AS (
        SELECT span.gpu_id, days.i, used.air_s, used.observed_s IS NOT NULL AS has_rows,
               greatest(coalesce(used.observed_s, 0), greatest(0, extract(epoch FROM
                   least(span.hi, days.day_end) - greatest(span.lo, days.day_start)))) AS cap_s
        FROM span CROSS JOIN days
        LEFT JOIN used ON used.gpu_id = span.gpu_id AND used.day = days.day
    )
    SELECT gpu_id,
           array_agg(CASE WHEN cap_s > 0 THEN coalesce(air_s, 0) / cap_s END ORDER BY i),
           bool_or(has_rows OR cap_s > 0)
    FROM cells
    GROUP BY gpu_id
"""


@dataclass
class _UtilizationLoad:
    """What ``utilization_by_day`` reads before the rollups: the report zone's days, the
    GPUs the filters keep, and whether the one-statement path applies."""

    zone: dt.tzinfo
    buckets: list[_Bucket]
    window_start: dt.datetime  # UTC
    capacity_end: dt.datetime  # UTC, the window cut off at now
    now: dt.datetime
    gpus: dict[int, _GpuInfo]
    sql: bool  # daily table in use, no attribution filter: ``_utilization_sql``


def _utilization_load(
    *, start: dt.date, end: dt.date, filters: Filters, now: dt.datetime | None
) -> _UtilizationLoad:
    now = now or timezone.now()
    zone = _report_zone(FleetSettings.load().report_time_zone, start, end)
    window_start = _local_midnight(start, zone).astimezone(dt.UTC)
    capacity_end = max(window_start, min(_local_midnight(end, zone).astimezone(dt.UTC), now))
    gpu_qs = Gpu.objects.exclude(retired_at__lte=window_start)
    if filters.models:
        gpu_qs = gpu_qs.filter(model__key__in=filters.models)
    if filters.gpus:
        gpu_qs = gpu_qs.filter(uuid__in=filters.gpus)
    rates: dict[tuple[Any, ...], _Rates] = {}  # no money here: no profiles
    return _UtilizationLoad(
        zone=zone,
        buckets=_buckets(start, end, "day", zone),
        window_start=window_start,
        capacity_end=capacity_end,
        now=now,
        gpus={g.pk: _gpu_info(g, {}, now, rates) for g in _gpu_rows(gpu_qs)},  # type: ignore[arg-type]
        sql=_daily_zone(zone) and not _by_attribution(filters),
    )


def _utilization_params(
    load: _UtilizationLoad, *, start: dt.date, end: dt.date
) -> tuple[dict[str, Any], dict[int, bool]]:
    """The parameters of ``_UTILIZATION_SQL`` (and ``_UTILIZATION_ROWS_SQL``) for the load's
    GPUs, and per GPU whether it is in service at some time in the window."""
    zone, window_start, capacity_end = load.zone, load.window_start, load.capacity_end
    whole_end = start
    while (
        whole_end < end and _local_midnight(whole_end + dt.timedelta(days=1), zone) <= capacity_end
    ):
        whole_end += dt.timedelta(days=1)
    ids, lows, highs = [], [], []
    in_service: dict[int, bool] = {}
    for gpu in load.gpus.values():
        span = cm.capacity_interval(
            service_start=gpu.service_start,
            retired_at=gpu.retired_at,
            start=window_start,
            end=capacity_end,
            now=load.now,
        )
        ids.append(gpu.id)
        lows.append(span[0] if span else window_start)
        highs.append(span[1] if span else window_start)
        in_service[gpu.id] = span is not None
    params: dict[str, Any] = {
        "ids": ids,
        "lo": lows,
        "hi": highs,
        "start": start,
        "days": (end - start).days,
        "whole_end": whole_end,
        "hourly_from": _local_midnight(whole_end, zone).astimezone(dt.UTC),
        "capacity_end": capacity_end,
        "zone": zone.key if isinstance(zone, ZoneInfo) else "UTC",
    }
    return params, in_service


def _utilization_sql(
    load: _UtilizationLoad, *, start: dt.date, end: dt.date
) -> list[UtilizationRow]:
    """``utilization_by_day`` in one statement (daily table in use, no attribution filter)."""
    gpus = load.gpus
    if not gpus:
        return []
    params, _ = _utilization_params(load, start=start, end=end)
    with read_cursor(atomic=True) as cursor:
        # A GPU-day hash of a large fleet (1,000 × 90) outgrows the default 4 MB and would
        # spill to disk; this statement only, in this transaction.
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(_UTILIZATION_SQL, params)
        found = {gpu_id: (values, shown) for gpu_id, values, shown in cursor.fetchall()}
    out = []
    for gpu in gpus.values():  # in the order of the GPU query, as the other path
        values, shown = found.get(gpu.id, ([], False))
        if shown:
            out.append(UtilizationRow(key=gpu.uuid, name=gpu.label, values=list(values)))
    return out


@dataclass
class UtilizationRow:
    """One GPU's utilisation per day (the heatmap): ``values[i]`` is day ``start + i``, None
    where the GPU had no capacity that day."""

    key: str  # GPU UUID
    name: str  # "host#index"
    values: list[float | None]


def utilization_by_day(
    *,
    start: dt.date,
    end: dt.date,
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[UtilizationRow]:
    """Per GPU and day over [start, end): air hours / capacity hours, the ``utilization`` of
    ``cost_rows(group_by="gpu", period="day")`` without the money (so no cost model per
    GPU-day): sums of two columns in SQL, capacity from each GPU's service window. Offline
    hours are taken per day, not per depreciation phase (the same unless a phase observed
    more than its own calendar hours). Floats throughout: a heatmap shows 0.1 %."""
    _validate(start=start, end=end, period="day")
    filters = filters or Filters()
    load = _utilization_load(start=start, end=end, filters=filters, now=now)
    if load.sql:
        return _utilization_sql(load, start=start, end=end)
    zone, buckets, gpus, now = load.zone, load.buckets, load.gpus, load.now
    window_start, capacity_end = load.window_start, load.capacity_end
    names = _names_load()
    index = {b.key: i for i, b in enumerate(buckets)}

    # (gpu, day index) → [air s kept by the filters, observed s kept, observed s in all]
    sums: dict[tuple[int, int], list[float]] = {}
    fields = ["gpu_id", "site_id", "pool_id", "team_id"]
    queries: list[tuple[QuerySet[Any], str]] = []
    hourly_from = window_start
    if _daily_zone(zone):
        day = start
        while day < end and _local_midnight(day + dt.timedelta(days=1), zone) <= capacity_end:
            day += dt.timedelta(days=1)
        hourly_from = _local_midnight(day, zone).astimezone(dt.UTC)
        queries.append((DailyUsage.objects.filter(day__gte=start, day__lt=day), "day"))
    if hourly_from < capacity_end:
        hourly = HourlyUsage.objects.filter(hour__gte=hourly_from, hour__lt=capacity_end)
        queries.append((hourly.annotate(bucket=TruncDay("hour", tzinfo=zone)), "bucket"))
    attribution = _by_attribution(filters)
    for rows, by in queries:
        rows = (
            _filtered(rows, filters)
            .values(*fields, by)
            .annotate(air=Sum("air_s"), observed=Sum("observed_s"))
        )
        for gpu_id, site_id, pool_id, team_id, key, air, observed in rows.values_list(
            *fields, by, "air", "observed"
        ).order_by():
            gpu = gpus.get(gpu_id)
            if gpu is None:
                continue
            if isinstance(key, dt.datetime):
                key = key.astimezone(zone).date()
            i = index.get(key)
            if i is None:
                continue
            cell = sums.get((gpu_id, i))
            if cell is None:
                cell = sums[(gpu_id, i)] = [0.0, 0.0, 0.0, 0.0]
            kept = not attribution or _kept(
                gpu,
                site_id=site_id,
                pool_id=pool_id,
                team_id=team_id,
                filters=filters,
                names=names,
            )
            observed = float(observed or 0)
            cell[2] += observed
            if kept:
                cell[0] += float(air or 0)
                cell[1] += observed
                cell[3] = 1.0  # a row the filters keep: the GPU-day is shown

    starts = [b.start.timestamp() for b in buckets]
    ends = [b.end.timestamp() for b in buckets]
    out: list[UtilizationRow] = []
    for gpu in gpus.values():
        # Offline hours go to the current attribution; the filters decide on that.
        current_kept = _kept(
            gpu,
            site_id=gpu.site_id,
            pool_id=gpu.pool_id,
            team_id=gpu.team_id,
            filters=filters,
            names=names,
        )
        span = cm.capacity_interval(
            service_start=gpu.service_start,
            retired_at=gpu.retired_at,
            start=window_start,
            end=capacity_end,
            now=now,
        )
        lo, hi = (span[0].timestamp(), span[1].timestamp()) if span else (0.0, 0.0)
        values: list[float | None] = [None] * len(buckets)
        shown = False
        for i in range(len(buckets)):
            cell = sums.get((gpu.id, i))
            calendar_s = max(0.0, min(hi, ends[i]) - max(lo, starts[i])) if span else 0.0
            offline_s = max(0.0, calendar_s - (cell[2] if cell else 0.0))
            if not current_kept:
                offline_s = 0.0
            if cell is None and offline_s <= 0:
                continue
            if offline_s > 0 or (cell is not None and cell[3]):
                shown = True
            if cell is None:
                values[i] = 0.0
                continue
            capacity_s = cell[1] + offline_s
            values[i] = cell[0] / capacity_s if capacity_s > 0 else None
        if shown:
            out.append(UtilizationRow(key=gpu.uuid, name=gpu.label, values=values))
    return out


_UTILIZATION_ROWS_SQL = """
    -- Which of these GPUs (none in service in the window) have rollup rows there: the
    -- heatmap shows them too. The tables and ranges of _UTILIZATION_SQL.
    SELECT gpu_id FROM telemetry_dailyusage
    WHERE day >= %(start)s AND day < %(whole_end)s AND gpu_id = ANY(%(ids)s::bigint[])
    UNION
    SELECT gpu_id FROM telemetry_hourlyusage
    WHERE hour >= %(hourly_from)s AND hour < %(capacity_end)s AND gpu_id = ANY(%(ids)s::bigint[])
"""


def utilization_listed(
    *,
    start: dt.date,
    end: dt.date,
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[tuple[str, str]] | None:
    """``(key, name)`` of the rows ``utilization_by_day`` returns, in its order, without
    their values, where that needs no rollup sums (the daily table in use, no site, pool or
    team filter: a GPU is listed when in service in the window or with rows there); ``None``
    otherwise. A heatmap drawn by name needs every GPU's name but one page's values:
    ``utilization_by_day`` with ``Filters(gpus=…)`` gives those GPUs' rows alone."""
    _validate(start=start, end=end, period="day")
    load = _utilization_load(start=start, end=end, filters=filters or Filters(), now=now)
    if not load.sql:
        return None
    params, in_service = _utilization_params(load, start=start, end=end)
    idle = [gpu_id for gpu_id, serving in in_service.items() if not serving]
    with_rows: set[int] = set()
    if idle:
        with read_cursor() as cursor:
            cursor.execute(_UTILIZATION_ROWS_SQL, {**params, "ids": idle})
            with_rows = {gpu_id for (gpu_id,) in cursor.fetchall()}
    return [
        (gpu.uuid, gpu.label)
        for gpu in load.gpus.values()
        if in_service[gpu.id] or gpu.id in with_rows
    ]


@dataclass
class FleetSummary:
    row: CostRow  # group_by="fleet", period="all"
    target_utilization: float
    recoverable_gpus: float
    recoverable_money_per_year: Decimal
    gpus_in_service: int
    gpus_offline_now: int  # in service, no sample in the last 15 minutes


def _fleet_acc(computation: _Computation) -> _Acc:
    acc = _Acc()
    for segment in computation.segments:
        _accumulate(acc, segment, computation.names)
    return acc


def fleet_summary(
    *, start: dt.date, end: dt.date, filters: Filters | None = None, now: dt.datetime | None = None
) -> FleetSummary:
    """The fleet row over [start, end), recoverable GPUs and money, GPUs in service now."""
    _validate(start=start, end=end, period="all")
    filters = filters or Filters()
    computation = _compute(start=start, end=end, period="all", filters=filters, now=now)
    return _summary(computation, filters)


def fleet_overview(
    *, start: dt.date, end: dt.date, filters: Filters | None = None, now: dt.datetime | None = None
) -> tuple[FleetSummary, list[CostRow]]:
    """``(fleet_summary(...), fleet_trend(...))`` for the overview page, with the settings,
    GPUs and cost terms loaded once for both (and one ``now``): the same figures as the two
    calls."""
    _validate(start=start, end=end, period="all")
    filters = filters or Filters()
    loaded = _load(start=start, end=end, filters=filters, now=now)
    summary = _summary(
        _compute(start=start, end=end, period="all", filters=filters, now=now, loaded=loaded),
        filters,
    )
    trend = _compute(
        start=start,
        end=end,
        period="day",
        filters=filters,
        now=now,
        pooled=True,
        loaded=loaded,
    )
    return summary, _rows(trend, "fleet")


def _summary(computation: _Computation, filters: Filters) -> FleetSummary:
    acc = _fleet_acc(computation)
    row = _cost_row(
        acc,
        key="fleet",
        name="Fleet",
        local_start=computation.local_start,
        local_end=computation.local_end,
        currency=computation.currency,
    )
    recoverable = cm.recoverable_gpus(
        capacity_hours=acc.capacity_h,
        air_hours=cm.hours_from_seconds(seconds=acc.sums["air_s"]),
        period_hours=computation.window_hours,
        target_utilization=computation.target_utilization,
    )
    in_service = offline = 0
    current = computation.now
    for info in computation.gpus.values():
        if not _kept(
            info,
            site_id=info.site_id,
            pool_id=info.pool_id,
            team_id=info.team_id,
            filters=filters,
            names=computation.names,
        ):
            continue
        if info.service_start is None or info.service_start > current:
            continue
        if info.retired_at is not None and info.retired_at <= current:
            continue
        in_service += 1
        if offline_now(info.last_seen_at, current):
            offline += 1
    return FleetSummary(
        row=row,
        target_utilization=computation.target_utilization,
        recoverable_gpus=recoverable,
        recoverable_money_per_year=cm.recoverable_money_per_year(
            recoverable_gpus=recoverable, mean_fixed_rate_per_hour=row.nominal_rate_per_hour
        ),
        gpus_in_service=in_service,
        gpus_offline_now=offline,
    )


@dataclass
class BreakevenResult:
    """DESIGN.md §3 break-even and §7 /api/v1/breakeven fields."""

    pool: str
    currency: str
    window_start: dt.datetime
    window_end: dt.datetime
    tokens_per_s: float
    api_price_per_mtok: Decimal  # blended
    fixed_rate_per_hour: Decimal
    p_active_kw: float
    p_idle_kw: float
    pue: float
    price_per_kwh: Decimal
    utilization: float | None
    breakeven_utilization: float | None
    own_cost_per_mtok: Decimal | None  # at the measured utilisation
    own_cost_per_month: Decimal
    api_cost_per_month: Decimal
    savings_per_month: Decimal
    rent_breakeven_utilization: float | None
    rental_rate_per_hour: Decimal | None
    curve: list[tuple[float, Decimal]]  # (u, own cost per Mtok) at u = 0.05, 0.10, … 1.00
    owned_share: float = 1.0  # of the pool's capacity hours; scales PUE × price in C(u)
    capacity_hours: float = 0.0  # the pool's, in the window (cut off at now)


def _power_kw(energy_j: float, seconds: float) -> Decimal:
    return cm.to_decimal(energy_j) / cm.to_decimal(seconds) / 1000


def _api_price(
    *,
    api_price_per_mtok: Decimal | None,
    api_input_price_per_mtok: Decimal | None,
    api_output_price_per_mtok: Decimal | None,
    output_share: float | None,
) -> Decimal:
    if api_price_per_mtok is not None:
        if api_price_per_mtok < 0:
            raise ValueError("api_price_per_mtok: must be ≥ 0")
        return api_price_per_mtok
    parts = (api_input_price_per_mtok, api_output_price_per_mtok, output_share)
    if any(p is None for p in parts):
        raise ValueError(
            "api_price_per_mtok: required, or api_input_price_per_mtok, "
            "api_output_price_per_mtok and output_share together"
        )
    assert api_input_price_per_mtok is not None and api_output_price_per_mtok is not None
    assert output_share is not None
    if api_input_price_per_mtok < 0:
        raise ValueError("api_input_price_per_mtok: must be ≥ 0")
    if api_output_price_per_mtok < 0:
        raise ValueError("api_output_price_per_mtok: must be ≥ 0")
    return be.blended_api_price_per_mtok(
        input_price_per_mtok=api_input_price_per_mtok,
        output_price_per_mtok=api_output_price_per_mtok,
        output_share=output_share,
    )


def breakeven_compute(
    *,
    pool: str,
    start: dt.date,
    end: dt.date,
    tokens_per_s: float,
    api_price_per_mtok: Decimal | None = None,
    api_input_price_per_mtok: Decimal | None = None,
    api_output_price_per_mtok: Decimal | None = None,
    output_share: float | None = None,
    rental_rate_per_hour: Decimal | None = None,
    now: dt.datetime | None = None,
) -> BreakevenResult:
    """Raises LookupError for an unknown pool, ValueError naming the bad argument."""
    _validate(start=start, end=end, period="all")
    if not tokens_per_s > 0:
        raise ValueError("tokens_per_s: must be > 0")
    if rental_rate_per_hour is not None and rental_rate_per_hour < 0:
        raise ValueError("rental_rate_per_hour: must be ≥ 0")
    api_price = _api_price(
        api_price_per_mtok=api_price_per_mtok,
        api_input_price_per_mtok=api_input_price_per_mtok,
        api_output_price_per_mtok=api_output_price_per_mtok,
        output_share=output_share,
    )
    pool_obj = Pool.objects.filter(name=pool).first()
    if pool_obj is None:
        raise LookupError(f"pool: no pool named {pool!r}")
    computation = _compute(
        start=start, end=end, period="all", filters=Filters(pools=(pool,)), now=now
    )
    acc = _fleet_acc(computation)
    s = acc.sums
    members = [g for g in computation.gpus.values() if g.pool_id == pool_obj.pk]

    # P_act, P_idle from the rollups' seconds above and below the active threshold; the GPU
    # models' nominal power (capacity-weighted, else a plain mean) where there are none.
    def nominal(attr: str) -> Decimal:
        if acc.nominal_h > 0:
            total = acc.nominal_max_w_h if attr == "max_power_w" else acc.nominal_idle_w_h
            return cm.to_decimal(total / acc.nominal_h) / 1000
        powers = [getattr(g, attr) for g in members if getattr(g, attr) is not None]
        return cm.to_decimal(sum(powers) / len(powers)) / 1000 if powers else Decimal(0)

    active_s = s["observed_s"] - s["idle_s"]
    p_active = (
        _power_kw(s["energy_j"] - s["idle_energy_j"], active_s)
        if active_s > 0
        else nominal("max_power_w")
    )
    p_idle = (
        _power_kw(s["idle_energy_j"], s["idle_s"]) if s["idle_s"] > 0 else nominal("idle_power_w")
    )

    # PUE and tariff: the pool's site; else that of its GPUs' current site.
    site = computation.names.site(pool_obj.site_id)
    if pool_obj.site_id is None:
        site = next(
            (computation.names.site(g.site_id) for g in members if g.site_id is not None), _NO_SITE
        )
    capacity_h = acc.capacity_h
    fixed_rate = acc.fixed_cost / capacity_h if capacity_h > 0 else Decimal(0)
    owned_share = acc.owned_capacity_h / capacity_h if capacity_h > 0 else Decimal(1)
    economics = be.pool_economics(
        fixed_rate_per_hour=fixed_rate,
        p_active_kw=p_active,
        p_idle_kw=p_idle,
        pue=site.pue,
        price_per_kwh=site.price_per_kwh,
        owned_share=owned_share,
    )
    air_h = cm.hours_from_seconds(seconds=s["air_s"])
    measured_u = air_h / capacity_h if capacity_h > 0 else None
    if measured_u is not None:
        month = be.monthly_comparison(
            economics=economics,
            utilization=measured_u,
            tokens_per_s=tokens_per_s,
            api_price_per_mtok=api_price,
            capacity_hours=capacity_h,
            window_hours=computation.window_hours,
        )
        own_month, api_month, savings = month.own_cost, month.api_cost, month.savings
        own_per_mtok = be.own_cost_per_mtok(
            economics=economics, utilization=measured_u, tokens_per_s=tokens_per_s
        )
    else:
        own_month = api_month = savings = Decimal(0)
        own_per_mtok = None
    return BreakevenResult(
        pool=pool,
        currency=computation.currency,
        window_start=computation.local_start,
        window_end=computation.local_end,
        tokens_per_s=tokens_per_s,
        api_price_per_mtok=api_price,
        fixed_rate_per_hour=fixed_rate,
        p_active_kw=float(p_active),
        p_idle_kw=float(p_idle),
        pue=float(site.pue),
        price_per_kwh=site.price_per_kwh,
        utilization=float(measured_u) if measured_u is not None else None,
        breakeven_utilization=be.breakeven_utilization(
            economics=economics, api_price_per_mtok=api_price, tokens_per_s=tokens_per_s
        ),
        own_cost_per_mtok=own_per_mtok,
        own_cost_per_month=own_month,
        api_cost_per_month=api_month,
        savings_per_month=savings,
        rent_breakeven_utilization=(
            be.rent_breakeven_utilization(
                economics=economics, rental_rate_per_hour=rental_rate_per_hour
            )
            if rental_rate_per_hour is not None
            else None
        ),
        rental_rate_per_hour=rental_rate_per_hour,
        curve=be.cost_curve(economics=economics, tokens_per_s=tokens_per_s),
        owned_share=float(owned_share),
        capacity_hours=float(capacity_h),
    )
