"""The fleet trend's pooled path: GPU-days at one rate summed per rate class and day."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from billing import cost_model as cm
from billing.selectors.calendar import _local_midnight
from billing.selectors.literals import array_literal, by_id, dates_literal
from billing.selectors.types import _Bucket, _GpuInfo, _Segment
from config.replica import read_cursor
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS


def _poolable(
    gpus: dict[int, _GpuInfo],
    split_ids: list[int],
    start: dt.date,
    end: dt.date,
    zone: dt.tzinfo,
) -> dict[int, tuple[dt.date, dt.date]]:
    """Per GPU at one rate throughout the window, the days [from, to) within [start, end) it
    is in service from midnight to midnight, or to now on the day in progress (each day's
    capacity is then the same for every such GPU): those GPU-days can be summed per rate
    class. GPUs bought together share their days: worked out once per service start and
    retirement."""
    split = set(split_ids)
    out: dict[int, tuple[dt.date, dt.date]] = {}
    spans: dict[tuple[dt.datetime, dt.datetime | None], tuple[dt.date, dt.date] | None] = {}
    for g in gpus.values():
        if g.id in split or g.service_start is None:
            continue
        key = (g.service_start, g.retired_at)
        if key in spans:
            span = spans[key]
        else:
            span = spans[key] = _whole_days(g.service_start, g.retired_at, start, end, zone)
        if span is not None:
            out[g.id] = span
    return out


def _whole_days(
    service_start: dt.datetime,
    retired_at: dt.datetime | None,
    start: dt.date,
    end: dt.date,
    zone: dt.tzinfo,
) -> tuple[dt.date, dt.date] | None:
    """The days [from, to) within [start, end) from the first local midnight in service to
    the day of retirement; None if there is none."""
    first = service_start.astimezone(zone).date()
    if _local_midnight(first, zone) < service_start:
        first += dt.timedelta(days=1)
    last = end if retired_at is None else min(end, retired_at.astimezone(zone).date())
    first = max(first, start)
    return (first, last) if first < last else None


def _phase_outside(gpu: _GpuInfo, window_start: dt.datetime) -> int:
    """The phase of a GPU whose depreciation does not end inside the window."""
    ends = gpu.boundary_hour
    return 2 if ends is not None and ends < window_start else 0


# Rollup columns summed per rate class and day (the fleet trend's pooled path).
_POOLED_SQL = """
    -- One row per local day, rate class and stored site: the daily sums of GPUs that share
    -- their rate, kind and nominal power, so the cost model runs once per class and day
    -- instead of once per GPU and day. A row's class is looked up by GPU id in an array that
    -- starts at the lowest pooled id, -1 where the GPU is not pooled (``klass``, see
    -- _KLASS_SQL), so the table is read once with no join (a hash join on the unnested ids
    -- hashed the whole table instead, as it cannot know the ids are distinct: 2-3x slower).
    -- The class is grouped on, not filtered on (the rows of class -1 are skipped by the
    -- caller): a filter on array lookups is estimated to keep a third of the rows, and the
    -- planner then sends all of them to one process to sum instead of summing in its workers
    -- (0.65 s against 0.4 s at 10,000 GPUs × 90 days).
    -- ``over``: a row observed more than it can (see _OVER_SQL).
    SELECT d.day, {klass} AS klass,
           d.site_id, bool_or({row_over}) AS over, {summed}
    FROM telemetry_dailyusage d
    WHERE d.gpu_id > %(base)s AND d.gpu_id <= %(top)s
      AND d.day >= %(from)s AND d.day < %(to)s
    GROUP BY 1, 2, 3
"""

# A row's class: where every pooled GPU has the same pooled days (the rule: a fleet in
# service before the window), the days are the statement's and one lookup is all; else the
# GPU's own days too, -1 outside them (three lookups a row: ~1.5x the statement's time).
_KLASS_SQL = "(%(classes)s::int[])[d.gpu_id - %(base)s]"
_KLASS_DAYS_SQL = f"""
    CASE WHEN d.day >= (%(firsts)s::date[])[d.gpu_id - %(base)s]
          AND d.day < (%(lasts)s::date[])[d.gpu_id - %(base)s]
         THEN {_KLASS_SQL} ELSE -1 END"""


# A daily row that observed more than 3600 s per hour it sums, on a day before the one in
# progress (``today``, checked on its own: its last hour is cut at now, and whether a row
# holds that hour is not stored). A GPU-day with no such row observed at most the day.
_ROW_OVER_SQL = "{d}.observed_s > 3600 * {d}.hours AND {d}.day IS DISTINCT FROM %(today)s::date"

# GPU-days that observed more than the day's length (overlapping samples): their offline
# hours are 0, not negative, so the pooled offline sum is corrected for exactly these. Only
# the days with a row that observed more than it can are summed, and only when the pooled
# sums saw one (``over``): never, as a rule.
_OVER_SQL = """
    SELECT d.gpu_id, d.day, sum(d.observed_s)
    FROM telemetry_dailyusage d
    JOIN (
        SELECT DISTINCT o.gpu_id, o.day
        FROM telemetry_dailyusage o
        JOIN unnest(%(ids)s::bigint[], %(firsts)s::date[], %(lasts)s::date[])
            AS c(gpu_id, first, last)
          ON c.gpu_id = o.gpu_id AND o.day >= c.first AND o.day < c.last
        WHERE {row_over}
    ) k ON k.gpu_id = d.gpu_id AND k.day = d.day
    GROUP BY d.gpu_id, d.day
    HAVING sum(d.observed_s) > extract(epoch FROM
        ((d.day + 1)::timestamp AT TIME ZONE %(zone)s) - (d.day::timestamp AT TIME ZONE %(zone)s))
"""

# The same on the day in progress, where it is pooled: the GPUs that observed more than the
# seconds from its midnight to now (``today_s``), its rows alone (one day, by its index).
_TODAY_OVER_SQL = """
    SELECT d.gpu_id, d.day, sum(d.observed_s)
    FROM telemetry_dailyusage d
    WHERE d.day = %(today)s AND d.gpu_id > %(base)s AND d.gpu_id <= %(top)s
    GROUP BY d.gpu_id, d.day
    HAVING sum(d.observed_s) > %(today_s)s::float8
"""


def _pooled_segments(
    *,
    gpus: dict[int, _GpuInfo],
    days: dict[int, tuple[dt.date, dt.date]],
    zone: dt.tzinfo,
    buckets: dict[dt.date, _Bucket],
    window_start: dt.datetime,
    capacity_end: dt.datetime,
) -> tuple[list[_Segment], bool]:
    """Day segments of the pooled GPUs, one per rate class, day and site: observed sums as
    stored, and offline hours (to the class's current site) = GPUs × the day's calendar
    hours (up to ``capacity_end``, now, on the day in progress) − their observed hours, the
    same sum as per GPU since none observed more than that (those that did are corrected
    below). Every GPU of a class has the same rate, kind, profile presence and nominal
    power, so ``_accumulate`` gives the same money. A segment names no GPU (``gpu_ids``
    empty): the stand-in need not be in service that day, and the GPUs pooled on a day are
    counted from the pooled spans (``costs._row_acc``). And whether some pooled GPU
    observed more than its capacity on a day."""
    classes: dict[tuple[object, ...], int] = {}
    members: dict[int, list[_GpuInfo]] = defaultdict(list)
    for gpu_id in sorted(days):
        gpu = gpus[gpu_id]
        phase = _phase_outside(gpu, window_start)
        key = (*gpu.price_class(phase), phase, gpu.site_id)
        klass = classes.setdefault(key, len(classes))
        members[klass].append(gpu)
    klass_of = {g.id: k for k, group in members.items() for g in group}
    zone_name = zone.key if isinstance(zone, ZoneInfo) else "UTC"
    ids = list(klass_of)
    outside = min(first for first, _ in days.values())  # any date: class -1 is not read
    klass_at, base, top = by_id(klass_of, -1)
    first_at, _, _ = by_id({g: days[g][0] for g in klass_of}, outside)
    last_at, _, _ = by_id({g: days[g][1] for g in klass_of}, outside)
    spans = set(days.values())
    params: dict[str, Any] = {
        "classes": array_literal(klass_at),
        "base": base,
        "top": top,
        "from": outside,
        "to": max(last for _, last in spans),
    }
    # The day in progress, where it is pooled: its capacity ends at now.
    last_day = params["to"] - dt.timedelta(days=1)
    today = last_day if buckets[last_day].end > capacity_end else None
    params["today"] = today
    klass_sql = _KLASS_SQL
    if len(spans) > 1:
        klass_sql = _KLASS_DAYS_SQL
        params.update(firsts=dates_literal(first_at), lasts=dates_literal(last_at))
    summed_sql = ", ".join(f"sum(d.{f}) AS {f}" for f in _SUM_FIELDS)
    observed_s: dict[tuple[int, dt.date], float] = defaultdict(float)
    segments: list[_Segment] = []
    over: list[tuple[Any, ...]] = []
    with read_cursor(large=True) as cursor:
        # A large fleet's class-days (1,000 GPUs × 90 days) hashed. Parallel workers may
        # share the scan, as in every other statement of the selectors: their partial sums
        # make the last digits of a float vary between runs, never a cent
        # (bench/figures_compare.py turns them off for its identical-figures check).
        cursor.execute(
            _POOLED_SQL.format(
                klass=klass_sql, summed=summed_sql, row_over=_ROW_OVER_SQL.format(d="d")
            ),
            params,
        )
        any_over = False
        for day, klass, site_id, day_over, *values in cursor.fetchall():
            if klass < 0:
                continue  # GPUs or days not pooled
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
                    gpu_ids=set(),
                )
            )
        if any_over:
            cursor.execute(
                _OVER_SQL.format(row_over=_ROW_OVER_SQL.format(d="o")),
                {
                    "ids": array_literal(ids),
                    "firsts": dates_literal([days[i][0] for i in ids]),
                    "lasts": dates_literal([days[i][1] for i in ids]),
                    "zone": zone_name,
                    "today": today,
                },
            )
            over = cursor.fetchall()
        if today is not None:
            cursor.execute(
                _TODAY_OVER_SQL,
                {
                    "today": today,
                    "base": base,
                    "top": top,
                    "today_s": (capacity_end - buckets[today].start).total_seconds(),
                },
            )
            over += [
                row
                for row in cursor.fetchall()
                if row[0] in days and days[row[0]][0] <= today < days[row[0]][1]
            ]
    excess: dict[tuple[int, dt.date], Decimal] = defaultdict(Decimal)
    for gpu_id, day, observed in over:
        bucket = buckets[day]
        excess[(klass_of[gpu_id], day)] += cm.hours_from_seconds(seconds=observed) - (
            cm.hours_between(start=bucket.start, end=min(bucket.end, capacity_end))
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
            calendar_h = cm.hours_between(start=bucket.start, end=min(bucket.end, capacity_end))
            calendar_h *= count
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
                        gpu_ids=set(),
                    )
                )
            day += dt.timedelta(days=1)
    return segments, bool(over)
