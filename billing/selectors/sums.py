"""The rollup sums, in SQL, turned into segments (one GPU, bucket, attribution, phase)
with the offline hours; and which segments the filters keep."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import reduce
from operator import add, or_
from typing import Any

from django.db import connection
from django.db.models import (
    Case,
    FloatField,
    IntegerField,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, TruncDay, TruncMonth, TruncWeek

from billing import cost_model as cm
from billing.selectors.calendar import _bucket_key, _buckets, _local_midnight, month_after
from billing.selectors.literals import array_literal
from billing.selectors.loading import _load, _Loaded
from billing.selectors.pooled import _phase_outside, _poolable, _pooled_segments
from billing.selectors.types import (
    Filters,
    _Bucket,
    _Computation,
    _GpuInfo,
    _NamesAndSiteTerms,
    _Segment,
)
from config.replica import read_cursor
from fleet.models import Node
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS
from telemetry.models import DailyUsage, HourlyUsage, MonthlyUsage

# What the rollup sums are summed per, from every table: the GPU and its stored attribution.
_BY_GPU = ("gpu_id", "node_id", "pool_id", "team_id", "site_id")


def _filtered(rows: QuerySet[Any], filters: Filters) -> QuerySet[Any]:
    if filters.models:
        rows = rows.filter(gpu__model__key__in=filters.models)
    if filters.gpus:
        rows = rows.filter(gpu__uuid__in=filters.gpus)
    return rows


def _summed(
    rows: QuerySet[Any] | list[QuerySet[Any]],
    fields: list[str],
    classes: _Classes | None = None,
    less: Sequence[QuerySet[Any]] = (),
    runs: int = 1,
) -> list[dict[str, Any]]:
    """The rollup sums of ``rows`` per ``fields``, as dicts of ``fields`` and ``"sums"`` (each
    of ``USAGE_SUM_COLUMNS`` as a float: the segment's sums). The statement is Django's, the
    values as PostgreSQL sends them, every sum a float8 already: Django's per-value
    converters (``float`` of a float, ``int`` of an integer, a bucket made aware and back)
    cost more than the query on a large fleet. A bucket is a date, or a local midnight as a
    datetime (see ``_compute``).

    Several querysets (of tables with the same sums: the monthly and the daily rows of one
    window) are summed together on PostgreSQL, in one statement over their union: one row per
    GPU and attribution for the whole window rather than one per table.

    ``classes`` (PostgreSQL): the per-GPU sums are summed again per price class, pool, team,
    site (and bucket) in the same statement (``_by_class``).

    ``less`` (PostgreSQL): querysets whose sums are taken away, in the same statement: a
    month's row less its days outside the window is the window's part of it
    (``_partial_months``). Those sums are differences of floats, so a key with no rollup row
    left (the hourly rows its parts sum, ``hours``, an exact integer: 0) is dropped, and a
    sum within a relative
    ``_RESIDUE`` of its largest part is taken as 0: what is left of rounding, not data
    (work figures are None, never 0, where no sample carries them).

    ``runs`` (PostgreSQL, more than one): each queryset is of one stretch of the window,
    tagged with its index (a ``run`` column); each row gives the observed seconds of each
    stretch beside its sums (``"runs"``), for its offline hours per stretch."""
    sets = rows if isinstance(rows, list) else [rows]
    assert runs == 1 or classes is None, "stretches are summed per GPU"
    tags = ["run"] if runs > 1 else []
    # With parts taken away, each part counts the hourly rows it sums (``hours``: exact).
    counted = {_HOURS: Sum("hours")} if less else {}
    summed = [
        qs.values(*fields, *tags)
        .annotate(**{f: Cast(Sum(f), FloatField()) for f in _SUM_FIELDS}, **counted)
        .order_by()
        for qs in sets
    ] + [
        qs.values(*fields, *tags)
        .annotate(
            **{f: Cast(Sum(f) * Value(-1), FloatField()) for f in _SUM_FIELDS},
            **{_HOURS: Sum("hours") * Value(-1)},
        )
        .order_by()
        for qs in less
    ]
    if connection.vendor != "postgresql":
        # SQLite sends dates and datetimes as text: it needs Django's converters (and its
        # fleets are small).
        out = []
        for qs in summed:
            for row in qs:
                row["sums"] = {f: float(row.pop(f) or 0) for f in _SUM_FIELDS}
                out.append(row)
        return out
    parts = [qs.query.sql_with_params() for qs in summed]
    sql, params = parts[0][0], list(parts[0][1])
    if len(parts) > 1 or tags:
        union = " UNION ALL ".join(f"({part})" for part, _ in parts)
        keys = ", ".join(connection.ops.quote_name(f) for f in fields)
        observed = _q("observed_s")
        if less:
            sums = ", ".join(
                f"CASE WHEN abs(sum({_q(f)})) <= max(abs({_q(f)})) * {_RESIDUE!r} THEN 0"
                f" ELSE sum({_q(f)}) END AS {_q(f)}"
                for f in _SUM_FIELDS
            )
            # Each stretch's observed seconds, its own rounding residue dropped likewise.
            sums += "".join(
                f", coalesce(CASE WHEN abs(sum({observed}) FILTER (WHERE run = {k}))"
                f" <= max(abs({observed})) FILTER (WHERE run = {k}) * {_RESIDUE!r}"
                f" THEN 0 ELSE sum({observed}) FILTER (WHERE run = {k}) END, 0)"
                for k in range(runs if tags else 0)
            )
            having = f" HAVING sum({_HOURS}) > 0"
        else:
            sums = ", ".join(f"sum({_q(f)}) AS {_q(f)}" for f in _SUM_FIELDS)
            sums += "".join(
                f", coalesce(sum({observed}) FILTER (WHERE run = {k}), 0)"
                for k in range(runs if tags else 0)
            )
            having = ""
        # Django's own statements and quoted constant names: no value is spliced in.
        sql = f"SELECT {keys}, {sums} FROM ({union}) AS parts GROUP BY {keys}{having}"  # noqa: S608
        params = [value for _, more in parts for value in more]
    if classes is not None:
        return _by_class(sql, params, fields, classes)
    n = len(fields)
    m = n + len(_SUM_FIELDS)
    out = []
    with read_cursor(binary=True) as cursor:
        cursor.execute(sql, params)
        for values in cursor.fetchall():
            row = dict(zip(fields, values[:n], strict=True))
            found = values[n:m]
            if None in found:  # never (the sum columns are NOT NULL), but 0 would stand for it
                found = tuple(v or 0.0 for v in found)
            row["sums"] = dict(zip(_SUM_FIELDS, found, strict=True))
            if tags:
                row["runs"] = values[m:]
            out.append(row)
    return out


def _of_run(rows: list[dict[str, Any]], run: int, runs: int) -> list[dict[str, Any]]:
    """``rows`` of one stretch of ``runs`` (``_summed``'s ``runs``): their observed seconds
    as that stretch's."""
    for row in rows:
        row["runs"] = tuple(row["sums"]["observed_s"] if k == run else 0.0 for k in range(runs))
    return rows


_OBSERVED = _SUM_FIELDS.index("observed_s")
_HOURS = "hourly_rows"  # ``_summed``'s count of the hourly rows a part sums
# What is left of a sum of floats less a part of it, relative to the largest part, below
# which it is rounding (``_summed``'s ``less``): the sums' own rounding is ~1e-16 relative.
_RESIDUE = 1e-9


def _q(name: str) -> str:
    return str(connection.ops.quote_name(name))


@dataclass
class _Classes:
    """The price classes of a computation's GPUs (all but those split at a depreciation
    boundary): ``reps[i]`` → a GPU of class ``i`` standing for all (kind, rate, profile,
    nominal power and model are the class's) and the phase it is priced in; ``ids``/
    ``indexes``: each GPU and its class, as array literals."""

    reps: list[tuple[_GpuInfo, int]]
    ids: str
    indexes: str


def _class_key(gpu: _GpuInfo, phase: int) -> tuple[Any, ...]:
    """What makes two GPUs' segments one price class, but for the site (the segments' own):
    the price class, and the model (the class's segments are grouped by it)."""
    return (*gpu.price_class(phase), gpu.model_key, gpu.model_name, phase)


def _classes_of(gpus: Iterable[tuple[_GpuInfo, int]]) -> _Classes:
    of: dict[tuple[Any, ...], int] = {}
    reps: list[tuple[_GpuInfo, int]] = []
    ids: list[int] = []
    indexes: list[int] = []
    for gpu, phase in gpus:
        key = _class_key(gpu, phase)
        index = of.get(key)
        if index is None:
            index = of[key] = len(reps)
            reps.append((gpu, phase))
        ids.append(gpu.id)
        indexes.append(index)
    return _Classes(reps=reps, ids=array_literal(ids), indexes=array_literal(indexes))


def _by_class(
    sql: str, params: list[Any], fields: list[str], classes: _Classes
) -> list[dict[str, Any]]:
    """The per-GPU statement ``sql`` (columns ``fields``, then the sums) summed again in
    PostgreSQL: one row per price class, pool, team, site and bucket (``kind`` 0, with the
    GPUs of it that observed anything: ``ids``), and each GPU's observed seconds per bucket
    (``kind`` 1: its offline hours). GPUs outside ``classes`` (not in the computation) are
    left out of the first and skipped by the caller in the second."""
    bucket = [f for f in fields if f not in _BY_GPU]
    attribution = ["pool_id", "team_id", "site_id"]
    keys = ", ".join(f"g.{_q(f)}" for f in [*attribution, *bucket])
    sums = ", ".join(f"sum(g.{_q(f)})" for f in _SUM_FIELDS)
    blanks = ", ".join("sum(g.observed_s)" if f == "observed_s" else "NULL" for f in _SUM_FIELDS)
    bucket_col = "".join(f", g.{_q(f)}" for f in bucket)
    # Django's statement and quoted constant names: no value is spliced in.
    wrapped = f"""
WITH g AS MATERIALIZED ({sql})
SELECT 0, NULL::bigint, c.class_id, {keys}, {sums},
       array_agg(g.gpu_id) FILTER (WHERE g.observed_s > 0)
FROM g JOIN unnest(%s::bigint[], %s::int[]) AS c(gpu_id, class_id) ON c.gpu_id = g.gpu_id
GROUP BY c.class_id, {keys}
UNION ALL
SELECT 1, g.gpu_id, NULL, NULL, NULL, NULL{bucket_col}, {blanks}, NULL
FROM g GROUP BY g.gpu_id{bucket_col}
"""  # noqa: S608
    heads = ["class", "pool_id", "team_id", "site_id", *bucket]
    n = len(heads)
    out = []
    with read_cursor(binary=True, large=True) as cursor:
        cursor.execute(wrapped, [*params, classes.ids, classes.indexes])
        first_bucket = n - len(bucket)
        for kind, gpu_id, *values in cursor.fetchall():
            if kind == 1:  # a GPU's observed seconds (in a bucket): one per GPU, keep it small
                row = {"kind": 1, "gpu_id": gpu_id, "observed_s": values[n + _OBSERVED] or 0.0}
                if bucket:
                    row.update(zip(bucket, values[first_bucket:n], strict=True))
            else:
                row = dict(zip(heads, values[:n], strict=True))
                found = values[n : n + len(_SUM_FIELDS)]
                row.update(kind=0, gpu_id=None, ids=values[-1] or [])
                row["sums"] = dict(zip(_SUM_FIELDS, (v or 0.0 for v in found), strict=True))
            out.append(row)
    return out


def _any_row(rows: QuerySet[Any]) -> bool:
    """Whether ``rows`` holds a row, read where ``_summed`` reads (the replica, if any)."""
    query = rows.values("pk")[:1].query
    with read_cursor() as cursor:
        cursor.execute(*query.sql_with_params())
        return cursor.fetchone() is not None


def _summed_hourly(
    rows: QuerySet[Any],
    filters: Filters,
    *,
    period: str,
    zone: dt.tzinfo,
    whens: list[When],
    classes: _Classes | None = None,
) -> list[dict[str, Any]]:
    """Hourly rows summed per GPU, attribution[, phase][, bucket in the report zone]."""
    rows = _filtered(rows, filters)
    fields = list(_BY_GPU)
    if whens:
        rows = rows.annotate(phase=Case(*whens, default=Value(-1), output_field=IntegerField()))
        fields.append("phase")
    if period != "all":
        trunc = {"day": TruncDay, "week": TruncWeek, "month": TruncMonth}[period]
        rows = rows.annotate(bucket=trunc("hour", tzinfo=zone))
        fields.append("bucket")
    return _summed(rows, fields, classes)


def _by_attribution(filters: Filters) -> bool:
    return bool(filters.sites or filters.pools or filters.teams)


def _compute(
    *,
    start: dt.date,
    end: dt.date,
    period: str,
    filters: Filters,
    now: dt.datetime | None,
    pooled: bool = False,
    loaded: _Loaded | None = None,
    by_class: bool = False,
    runs: list[tuple[dt.date, dt.date]] | None = None,
) -> _Computation:
    """The segments of [start, end) per ``period`` bucket: per GPU, phase and attribution,
    its rollup sums and its offline hours.

    ``runs`` (period "all", per GPU, not pooled): the stretches of [start, end) to read, the
    days between them left out (closed months, whose frozen figures stand for them): read
    in one statement, each stretch's offline hours its capacity less what it observed, as
    if each were computed alone (so where a GPU observed more than a stretch's capacity,
    that stretch's offline hours are 0, not the others' less the excess).

    ``by_class``: for rows grouped by neither GPU nor node (team, pool, site, model, fleet).
    On the daily tables the sums of the GPUs not split at a depreciation boundary are summed
    in SQL per price class, pool, team, site and bucket, and their offline hours per the same
    in Python: a few segments per class, each naming the GPUs it stands for (``gpu_ids``),
    instead of one per GPU. The same figures to the cent (floats added in another order);
    no node on those segments."""
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
    classes: _Classes | None = None
    if by_class and daily_zone:
        split = set(split_ids)
        classes = _classes_of(
            (info, _phase_outside(info, window_start))
            for info in gpus.values()
            if info.id not in split
        )
    # The stretches of [start, end) read (``runs``: the open ones, closed months between
    # them); the rows of each are tagged with its index where there are several.
    stretches = runs or [(start, end)]
    tagged = len(stretches) > 1
    if daily_zone:
        whole: list[QuerySet[Any]] = []  # period "all": the tables read, summed as one
        whole_less: list[QuerySet[Any]] = []  # and the parts taken from them

        def of_gpus(rows: QuerySet[Any]) -> QuerySet[Any]:
            return _filtered(rows.exclude(gpu_id__in=split_ids) if split_ids else rows, filters)

        def as_run(rows: QuerySet[Any], run: int) -> QuerySet[Any]:
            return rows.annotate(run=Value(run, output_field=IntegerField())) if tagged else rows

        for run, (run_start, run_end) in enumerate(stretches):
            # Whole local days, and the day in progress, from the daily pre-aggregate (24×
            # fewer rows), whole months from the monthly one, except for the GPUs whose
            # depreciation ends inside the window (that hour is split): hourly rows for those.
            run_first = _local_midnight(run_start, zone).astimezone(dt.UTC)
            run_capacity_end = max(
                run_first, min(_local_midnight(run_end, zone).astimezone(dt.UTC), now)
            )
            day = run_start
            while day < run_end and (
                _local_midnight(day + dt.timedelta(days=1), zone) <= run_capacity_end
            ):
                day += dt.timedelta(days=1)
            hourly_from = _local_midnight(day, zone).astimezone(dt.UTC)
            months_from = months_to = run_start
            if day > run_start and period in ("all", "month"):
                # The whole months inside [start, day) from the monthly pre-aggregate (~30×
                # fewer rows); the days before and after them from the daily one.
                months_from = run_start if run_start.day == 1 else month_after(run_start)
                months_to = max(months_from, day.replace(day=1))
            if months_to > months_from:
                monthlies = of_gpus(
                    MonthlyUsage.objects.filter(month__gte=months_from, month__lt=months_to)
                )
                if period == "all":  # summed with the daily rows below, in one statement
                    whole.append(as_run(monthlies, run))
                else:
                    for row in _summed(monthlies, [*_BY_GPU, "month"], classes):
                        row["bucket"] = row.pop("month")
                        sum_rows.append(row)
            # The day in progress (up to now) from its daily row too: the triggers keep that
            # row equal to the hours rolled up so far, in the rollup's own transaction, so it
            # is the sum of the day's hourly rows (10,000 rows at 10,000 GPUs, not up to
            # 240,000) -- unless the day has hours at or after now (a window seen as of an
            # earlier time, or samples from a clock ahead): then its hourly rows up to now,
            # as for every window.
            in_progress = hourly_from < run_capacity_end
            today_daily = in_progress and not _any_row(
                HourlyUsage.objects.filter(
                    hour__gte=run_capacity_end,
                    hour__lt=_local_midnight(day + dt.timedelta(days=1), zone),
                )
            )
            whole_end = day + dt.timedelta(days=1) if today_daily else day
            if pooled and day > start and period == "day" and not _by_attribution(filters):
                # The day in progress too where it is read from its daily rows: every GPU in
                # service since its midnight has the same capacity there, up to now.
                pooled_days = _poolable(gpus, split_ids, start, whole_end, zone)
            days = _less_whole(run_start, whole_end, months_from, months_to)
            if period in ("all", "month"):
                # A month only partly in the window, read as its monthly rows less its daily
                # rows outside the window, where those are fewer than its days inside it (the
                # first month of a quarter's window from its 5th: the rows of 4 days and one
                # month, not of 26 days; the month in progress: its monthly rows alone).
                today = now.astimezone(zone).date()
                for month, first, last in _partial_months(days, today):
                    days = _ranges_less(days, first, last)
                    monthly = of_gpus(MonthlyUsage.objects.filter(month=month))
                    outside = of_gpus(
                        DailyUsage.objects.filter(
                            Q(day__gte=month, day__lt=first)
                            | Q(day__gte=last, day__lt=month_after(month))
                        )
                    )
                    if period == "all":
                        whole.append(as_run(monthly, run))
                        whole_less.append(as_run(outside, run))
                    else:
                        for row in _summed([monthly], list(_BY_GPU), classes, less=[outside]):
                            row["bucket"] = month
                            sum_rows.append(row)
            if days:
                # The days not read from monthly rows, by the day index, range by range.
                dailies = of_gpus(
                    DailyUsage.objects.filter(
                        reduce(or_, (Q(day__gte=a, day__lt=b) for a, b in days))
                    )
                )
                if pooled_days:
                    # Only the GPU-days not pooled: the days outside each pooled GPU's span,
                    # and every day of the other GPUs (few spans: most GPUs share one, so the
                    # days outside it are read by the day index, not by scanning the table).
                    by_range: dict[tuple[dt.date, dt.date], list[int]] = defaultdict(list)
                    for gpu_id, gpu_days in pooled_days.items():
                        by_range[gpu_days].append(gpu_id)
                    unpooled = [g for g in gpus if g not in pooled_days]
                    if len(by_range) == 1 and not unpooled:
                        # Every GPU pooled over one span (the rule): the days outside it, with
                        # no list of ids (other GPUs' rows find no GPU below and are left
                        # out).
                        ((first, last),) = by_range
                        wanted = Q(day__lt=first) | Q(day__gte=last)
                    else:
                        wanted = Q(gpu_id__in=unpooled) if unpooled else Q(pk__in=[])
                        for (first, last), ids in by_range.items():
                            wanted |= Q(gpu_id__in=ids) & (Q(day__lt=first) | Q(day__gte=last))
                    dailies = dailies.filter(wanted)
                fields = list(_BY_GPU)
                if period == "all":
                    whole.append(as_run(dailies, run))
                else:
                    trunc = {"day": None, "week": TruncWeek, "month": TruncMonth}[period]
                    if trunc is None:
                        fields.append("day")
                    else:
                        dailies = dailies.annotate(bucket=trunc("day"))
                        fields.append("bucket")
                    for row in _summed(dailies, fields, classes):
                        if "day" in row:
                            row["bucket"] = row.pop("day")
                        sum_rows.append(row)
            if in_progress and not today_daily:
                rest = HourlyUsage.objects.filter(hour__gte=hourly_from, hour__lt=run_capacity_end)
                if split_ids:
                    rest = rest.exclude(gpu_id__in=split_ids)
                today_rows = _summed_hourly(
                    rest, filters, period=period, zone=zone, whens=[], classes=classes
                )
                sum_rows += _of_run(today_rows, run, len(stretches)) if tagged else today_rows
        if whole:
            sum_rows += _summed(whole, list(_BY_GPU), classes, less=whole_less, runs=len(stretches))
        hourly_spans = [
            (
                max(window_start, _local_midnight(a, zone).astimezone(dt.UTC)),
                min(capacity_end, _local_midnight(b, zone).astimezone(dt.UTC)),
            )
            for a, b in stretches
        ]
    else:
        hourly_spans = [(window_start, capacity_end)]
    if not daily_zone or split_ids:
        whens: list[When] = []
        for boundary, ids in by_boundary.items():
            whens += [
                When(gpu_id__in=ids, hour__lt=boundary, then=Value(0)),
                When(gpu_id__in=ids, hour=boundary, then=Value(1)),
                When(gpu_id__in=ids, then=Value(2)),
            ]
        for run, (hour_from, hour_to) in enumerate(hourly_spans):
            hourly = HourlyUsage.objects.filter(hour__gte=hour_from, hour__lt=hour_to)
            if daily_zone:
                hourly = hourly.filter(gpu_id__in=split_ids)
            split_rows = _summed_hourly(hourly, filters, period=period, zone=zone, whens=whens)
            sum_rows += _of_run(split_rows, run, len(stretches)) if tagged else split_rows

    buckets_by_key = {b.key: b for b in buckets}
    # The bucket of each value a row's bucket column takes (a few per query).
    bucket_of: dict[Any, _Bucket | None] = {}
    # One segment per GPU, bucket, phase and attribution, whichever table its sums came from;
    # by class: one per class, bucket and attribution, and each GPU's observed hours.
    merged: dict[tuple[Any, ...], _Segment] = {}
    by_classes: dict[tuple[Any, ...], _Segment] = {}
    observed_h: dict[tuple[Any, ...], Decimal] = defaultdict(Decimal)
    # Most GPUs observe the same seconds as others (the whole window, as a rule): each
    # seconds value converted once (the same float, the same Decimal).
    hours_of = _HoursOf()
    # With stretches: each segment's observed seconds per stretch, added up as its sums are.
    run_observed: dict[tuple[Any, ...], list[float]] = {}
    for row in sum_rows:
        kind = row.get("kind")
        owner = gpus.get(row["gpu_id"]) if kind != 0 else None
        if owner is None and kind != 0:
            continue
        if period == "all":
            bucket = buckets_by_key.get(start)
        else:
            # A day of the daily table; a week or month of it truncated in SQL (midnight of
            # the session's zone); or hourly rows truncated in the report zone (local time).
            found = row["bucket"]
            if found in bucket_of:
                bucket = bucket_of[found]
            else:
                day = found.date() if isinstance(found, dt.datetime) else found
                bucket = bucket_of[found] = buckets_by_key.get(_bucket_key(day, period, start))
        if bucket is None:
            continue
        key = bucket.key
        if kind == 0:
            assert classes is not None
            rep, phase = classes.reps[row["class"]]
            ident: tuple[Any, ...] = (row["class"], key, row["pool_id"], row["team_id"])
            ident += (row["site_id"],)
            segment = by_classes.get(ident)
            if segment is None:
                by_classes[ident] = _Segment(
                    gpu=rep,
                    bucket=bucket,
                    phase=phase,
                    node_id=None,
                    pool_id=row["pool_id"],
                    team_id=row["team_id"],
                    site_id=row["site_id"],
                    sums=row["sums"],
                    gpu_ids=set(row["ids"]),
                )
            else:
                found_sums = row["sums"]
                for f in _SUM_FIELDS:
                    segment.sums[f] += found_sums[f]
                assert segment.gpu_ids is not None
                segment.gpu_ids.update(row["ids"])
            continue
        assert owner is not None
        phase = row.get("phase", -1)
        if phase < 0:  # no depreciation boundary within the window
            phase = _phase_outside(owner, window_start)
        if kind == 1:
            observed_h[(owner.id, key, phase)] += hours_of[row["observed_s"]]
            continue
        ident = (owner.id, key, phase, row["node_id"], row["pool_id"])
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
                sums=row["sums"],
            )
            if tagged:
                run_observed[ident] = list(row["runs"])
        else:
            found_sums = row["sums"]
            for f in _SUM_FIELDS:
                segment.sums[f] += found_sums[f]
            if tagged:
                run_observed[ident] = list(map(add, run_observed[ident], row["runs"]))
    segments: list[_Segment] = list(merged.values())
    if tagged:
        for ident, observed_s in run_observed.items():
            for run, seconds in enumerate(observed_s):
                if seconds:
                    observed_h[(*ident[:3], run)] += hours_of[seconds]
    else:
        for segment in segments:
            observed_h[(segment.gpu.id, segment.bucket.key, segment.phase)] += hours_of[
                segment.sums["observed_s"]
            ]
    pooled_over = False
    if pooled_days:
        # After the GPUs' own observed hours: a pooled segment's stand-in is one GPU of its
        # class, and its sums are the class's (its offline hours are the segment's own), so
        # they must not count as observed by the stand-in on a day it is not pooled.
        by_pool, pooled_over = _pooled_segments(
            gpus=gpus,
            days=pooled_days,
            zone=zone,
            buckets=buckets_by_key,
            window_start=window_start,
            capacity_end=capacity_end,
        )
        segments += by_pool
    segments += by_classes.values()

    missing_nodes = {s.node_id for s in segments if s.node_id is not None} - names.nodes.keys()
    if missing_nodes:  # nodes a GPU has since left
        names.nodes.update(Node.objects.filter(pk__in=missing_nodes).values_list("id", "hostname"))

    # Offline hours: calendar capacity per phase less what was observed, to the current owner.
    position = {b.key: i for i, b in enumerate(buckets)}
    lengths: dict[tuple[dt.datetime, dt.datetime], Decimal] = {}  # most GPUs share a span
    offline_classes: dict[tuple[Any, ...], _Segment] = {}
    # Whether some GPU observed more than its capacity in a bucket and phase: more than the
    # capacity it has there (``over``), or anything where it has none (its observed hours
    # there are never read below: fewer read than there are).
    over, read = pooled_over, 0
    # Each GPU's capacity per bucket and phase (per stretch of the window, with several),
    # worked out once per service start, retirement, depreciation end and pooled days
    # (GPUs bought together share them).
    spans = buckets
    if tagged:  # the one bucket (period "all") in its stretches
        spans = [_stretch(buckets[0], a, b, zone) for a, b in stretches]
    cells_of: dict[tuple[Any, ...], list[tuple[int, _Bucket, int, Decimal]]] = {}
    zero = Decimal(0)
    for info in gpus.values():
        pooled_span = pooled_days.get(info.id)
        shape = (info.service_start, info.retired_at, info.boundary_hour, pooled_span)
        cells = cells_of.get(shape)
        if cells is None:
            own = spans
            if pooled_span is not None:  # its offline hours those days are in pooled segments
                cut = position[pooled_span[0]], position.get(pooled_span[1], len(buckets))
                own = buckets[: cut[0]] + buckets[cut[1] :]
            cells = cells_of[shape] = _capacity_cells(info, own, now, lengths)
        for run, bucket, phase, capacity_h in cells:
            if tagged:
                observed = observed_h.get((info.id, bucket.key, phase, run), zero)
                bucket = buckets[0]  # the stretch's bucket
            else:
                observed = observed_h.get((info.id, bucket.key, phase), zero)
            if observed > 0:
                read += 1
                over = over or observed > capacity_h
            offline_h = cm.offline_hours(capacity_hours=capacity_h, observed_hours=observed)
            if offline_h > 0 and classes is not None:
                place: tuple[Any, ...] = (bucket.key, _class_key(info, phase))
                place += (info.pool_id, info.team_id, info.site_id)
                found = offline_classes.get(place)
                if found is None:
                    offline_classes[place] = _Segment(
                        gpu=info,
                        bucket=bucket,
                        phase=phase,
                        node_id=None,
                        pool_id=info.pool_id,
                        team_id=info.team_id,
                        site_id=info.site_id,
                        sums=dict.fromkeys(_SUM_FIELDS, 0.0),
                        offline_h=offline_h,
                        gpu_ids={info.id},
                    )
                else:
                    found.offline_h += offline_h
                    assert found.gpu_ids is not None
                    found.gpu_ids.add(info.id)
            elif offline_h > 0:
                # Into the GPU's segment of the same bucket, phase and attribution where
                # it has one (the rule: it sent data at its current attribution), else a
                # segment of its own: every figure is linear in the sums and offline
                # hours, and its sums are the segment's plus zeros.
                ident = (info.id, bucket.key, phase, info.node_id, info.pool_id)
                ident += (info.team_id, info.site_id)
                found_segment = merged.get(ident)
                if found_segment is not None:
                    found_segment.offline_h += offline_h
                    continue
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

    segments += offline_classes.values()
    over = over or read < sum(1 for hours in observed_h.values() if hours > 0)
    if filters != Filters():
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
        pooled=_by_span(pooled_days),
        offline_additive=not over,
    )


class _HoursOf(dict[float, Decimal]):
    """``cost_model.hours_from_seconds`` of each seconds value looked up, worked out once."""

    def __missing__(self, seconds: float) -> Decimal:
        hours = self[seconds] = cm.hours_from_seconds(seconds=seconds)
        return hours


def _less_whole(
    start: dt.date, end: dt.date, months_from: dt.date, months_to: dt.date
) -> list[tuple[dt.date, dt.date]]:
    """The days [start, end) less the whole months [months_from, months_to) read from the
    monthly rows: the ranges [from, to) left to the daily ones."""
    return _ranges_less([(start, end)] if end > start else [], months_from, months_to)


def _ranges_less(
    ranges: list[tuple[dt.date, dt.date]], first: dt.date, last: dt.date
) -> list[tuple[dt.date, dt.date]]:
    """Day ranges [from, to) less the days [first, last)."""
    out = []
    for a, b in ranges:
        if b <= first or a >= last:
            out.append((a, b))
            continue
        if a < first:
            out.append((a, first))
        if b > last:
            out.append((last, b))
    return out


def _partial_months(
    ranges: list[tuple[dt.date, dt.date]], today: dt.date
) -> list[tuple[dt.date, dt.date, dt.date]]:
    """The months that the day ranges ``ranges`` cover in part, with their part ``(month,
    from, to)``, where the month's monthly rows less its daily rows outside the part read
    fewer rows than the part's daily rows: fewer days of the month outside it (up to
    ``today``; later days have no rows but from a clock ahead, and those are taken away
    too), and the month's own row, than days inside it."""
    out = []
    for a, b in ranges:
        cursor = a
        while cursor < b:
            month = cursor.replace(day=1)
            following = month_after(month)
            last = min(b, following)
            inside = (last - cursor).days
            after = (min(following, today + dt.timedelta(days=1)) - last).days
            if (cursor - month).days + max(0, after) + 1 < inside:
                out.append((month, cursor, last))
            cursor = last
    return out


def _stretch(bucket: _Bucket, start: dt.date, end: dt.date, zone: dt.tzinfo) -> _Bucket:
    """The part [start, end) of ``bucket`` (its key kept): a stretch of a window read with
    closed months between its stretches (``_compute``'s ``runs``)."""
    local_start = max(bucket.local_start, _local_midnight(start, zone))
    local_end = min(bucket.local_end, _local_midnight(end, zone))
    return dataclasses.replace(
        bucket,
        start=local_start.astimezone(dt.UTC),
        end=local_end.astimezone(dt.UTC),
        local_start=local_start,
        local_end=local_end,
    )


def _capacity_cells(
    info: _GpuInfo,
    buckets: list[_Bucket],
    now: dt.datetime,
    lengths: dict[tuple[dt.datetime, dt.datetime], Decimal],
) -> list[tuple[int, _Bucket, int, Decimal]]:
    """(index in ``buckets``, bucket, phase, capacity hours) where the GPU has capacity: its
    service, cut at now, in each bucket and depreciation phase. ``lengths``: the hours of
    each span, shared."""
    cells = []
    phases = info.phase_intervals()
    for i, bucket in enumerate(buckets):
        span = cm.capacity_interval(
            service_start=info.service_start,
            retired_at=info.retired_at,
            start=bucket.start,
            end=bucket.end,
            now=now,
        )
        if span is None:
            continue
        for phase, lo, hi in phases:
            if (lo and lo >= span[1]) or (hi and hi <= span[0]):
                continue  # no capacity in this phase: no offline hours
            edges = (max(span[0], lo) if lo else span[0], min(span[1], hi) if hi else span[1])
            capacity_h = lengths.get(edges)
            if capacity_h is None:
                capacity_h = lengths[edges] = cm.hours_between(start=edges[0], end=edges[1])
            cells.append((i, bucket, phase, capacity_h))
    return cells


def _by_span(
    days: dict[int, tuple[dt.date, dt.date]],
) -> dict[tuple[dt.date, dt.date], set[int]]:
    spans: dict[tuple[dt.date, dt.date], set[int]] = defaultdict(set)
    for gpu_id, span in days.items():
        spans[span].add(gpu_id)
    return dict(spans)


def _kept(
    gpu: _GpuInfo,
    *,
    site_id: int | None,
    pool_id: int | None,
    team_id: int | None,
    filters: Filters,
    names: _NamesAndSiteTerms,
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


def _kept_now(gpu: _GpuInfo, filters: Filters, names: _NamesAndSiteTerms) -> bool:
    """Whether the filters keep this GPU at its current attribution (where its offline hours
    go)."""
    return _kept(
        gpu,
        site_id=gpu.site_id,
        pool_id=gpu.pool_id,
        team_id=gpu.team_id,
        filters=filters,
        names=names,
    )


def _segment_kept(segment: _Segment, filters: Filters, names: _NamesAndSiteTerms) -> bool:
    return _kept(
        segment.gpu,
        site_id=segment.site_id,
        pool_id=segment.pool_id,
        team_id=segment.team_id,
        filters=filters,
        names=names,
    )
