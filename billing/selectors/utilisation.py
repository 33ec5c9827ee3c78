"""Utilisation per GPU and day (the heatmap), without the money."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import QuerySet, Sum
from django.db.models.functions import TruncDay
from django.utils import timezone

from billing import cost_model as cm
from billing.selectors.calendar import _buckets, _local_midnight, _report_zone
from billing.selectors.loading import _daily_zone, _gpu_info, _gpu_rows, _names_load, _Rates
from billing.selectors.sums import _by_attribution, _filtered, _kept, _kept_now
from billing.selectors.types import Filters, _Bucket, _GpuInfo, _validate
from config.replica import read_cursor
from fleet.models import FleetSettings, Gpu
from telemetry.models import DailyUsage, HourlyUsage

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
        SELECT span.gpu_id, days.i, used.air_s, used.observed_s,
               used.observed_s IS NOT NULL AS has_rows,
               greatest(coalesce(used.observed_s, 0), greatest(0, extract(epoch FROM
                   least(span.hi, days.day_end) - greatest(span.lo, days.day_start)))) AS cap_s
        FROM span CROSS JOIN days
        LEFT JOIN used ON used.gpu_id = span.gpu_id AND used.day = days.day
    )
    SELECT gpu_id,
           array_agg(CASE WHEN cap_s > 0 THEN coalesce(air_s, 0) / cap_s END ORDER BY i),
           bool_or(has_rows OR cap_s > 0),
           -- Offline and capacity hours per day (capacity less observed: no samples).
           array_agg(CASE WHEN cap_s > 0 THEN (cap_s - coalesce(observed_s, 0)) / 3600.0 END
                     ORDER BY i),
           array_agg(CASE WHEN cap_s > 0 THEN cap_s / 3600.0 END ORDER BY i)
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
        gpus={g["id"]: _gpu_info(g, {}, now, rates) for g in _gpu_rows(gpu_qs)},
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
    with read_cursor(large=True) as cursor:  # a GPU-day hash of a large fleet (1,000 × 90)
        cursor.execute(_UTILIZATION_SQL, params)
        found = {row[0]: row[1:] for row in cursor.fetchall()}
    out = []
    for gpu in gpus.values():  # in the order of the GPU query, as the other path
        values, shown, offline, capacity = found.get(gpu.id, ([], False, [], []))
        if shown:
            out.append(
                UtilizationRow(
                    key=gpu.uuid,
                    name=gpu.label,
                    values=list(values),
                    offline_hours=list(offline),
                    capacity_hours=list(capacity),
                )
            )
    return out


@dataclass
class UtilizationRow:
    """One GPU's utilisation per day (the heatmap): ``values[i]`` is day ``start + i``, None
    where the GPU had no capacity that day."""

    key: str  # GPU UUID
    name: str  # "host#index"
    values: list[float | None]
    # Per day as ``values``: capacity hours with no samples, and capacity hours (None where
    # no capacity). Per day, not per depreciation phase, as ``values``.
    offline_hours: list[float | None]
    capacity_hours: list[float | None]


def utilization_by_day(
    *,
    start: dt.date,
    end: dt.date,
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[UtilizationRow]:
    """Per GPU and day over [start, end): air hours / capacity hours, the ``utilization`` of
    ``cost_rows(group_by="gpu", period="day")`` (and its offline and capacity hours) without
    the money (so no cost model per
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
        current_kept = _kept_now(gpu, filters, names)
        span = cm.capacity_interval(
            service_start=gpu.service_start,
            retired_at=gpu.retired_at,
            start=window_start,
            end=capacity_end,
            now=now,
        )
        lo, hi = (span[0].timestamp(), span[1].timestamp()) if span else (0.0, 0.0)
        values: list[float | None] = [None] * len(buckets)
        offline: list[float | None] = [None] * len(buckets)
        capacity: list[float | None] = [None] * len(buckets)
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
            capacity_s = (cell[1] if cell else 0.0) + offline_s
            if capacity_s > 0:
                offline[i], capacity[i] = offline_s / 3600, capacity_s / 3600
            if cell is None:
                values[i] = 0.0
                continue
            values[i] = cell[0] / capacity_s if capacity_s > 0 else None
        if shown:
            out.append(
                UtilizationRow(
                    key=gpu.uuid,
                    name=gpu.label,
                    values=values,
                    offline_hours=offline,
                    capacity_hours=capacity,
                )
            )
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
