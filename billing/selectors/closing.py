"""Closed months (docs/finance.md): frozen figures and the adjustments late data makes.

A closed month's figures come from the segments stored at its close (``ClosedSegment``),
priced with the terms stored with them, never from the rollups, so late data cannot move
them. What late data changes (the month computed now, less what was frozen) is booked in the
first month after it that is open, as segments marked ``adjusts``: the live segments of the
closed month plus its frozen segments negated. Every figure is linear in the segments' sums
and offline hours, so summing the two is the difference, through the same accumulator.

``compute`` has ``_compute``'s signature and gives its computation unchanged when no closed
month touches the query (one small query to find that out).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from operator import itemgetter, neg
from typing import Any

from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection
from django.db.models import DateField, F, FloatField, Q, QuerySet, Sum, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from billing import cost_model as cm
from billing.models import ClosedClassDay, ClosedSegment, MonthClose
from billing.selectors.calendar import _bucket_key, _buckets, _local_midnight, month_after
from billing.selectors.literals import array_literal, by_id
from billing.selectors.loading import _load, _Loaded, _loaded_within
from billing.selectors.pooled import _phase_outside
from billing.selectors.sums import _compute, _segment_kept
from billing.selectors.types import (
    Filters,
    _Acc,
    _Bucket,
    _Computation,
    _GpuInfo,
    _NamesAndSiteTerms,
    _Segment,
    _SiteTerms,
)
from config.replica import read_beside, read_cursor
from fleet.models import Node
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS

# An adjustment smaller than this in every figure is the same data frozen and recomputed
# (floats summed in another order), not late data: no row.
_NEGLIGIBLE = 1e-9


def adjustment_negligible(acc: _Acc) -> bool:
    """Whether an adjustment's sums are all zero but for float and Decimal rounding."""
    money = (acc.fixed_cost, acc.energy_cost, acc.idle_cost)
    hours = (acc.capacity_h, acc.offline_h, acc.energy_kwh, acc.idle_energy_kwh)
    return all(abs(v) < _NEGLIGIBLE for v in (*money, *hours)) and all(
        abs(v) < _NEGLIGIBLE for v in acc.sums.values()
    )


def closed_months() -> dict[dt.date, int]:
    """The months closed now: first day → the close's id."""
    return dict(MonthClose.objects.filter(closed=True).values_list("month", "pk"))


def booking_month(month: dt.date, closed: dict[dt.date, int]) -> dt.date:
    """The first month after ``month`` that is open: where its late data is booked."""
    found = month_after(month)
    while found in closed:
        found = month_after(found)
    return found


def _runs(
    start: dt.date, end: dt.date, closed: dict[dt.date, int]
) -> Iterator[tuple[dt.date, dt.date, bool]]:
    """[start, end) cut into stretches of open and closed days: (from, to, closed)."""
    cursor = start
    while cursor < end:
        is_closed = cursor.replace(day=1) in closed
        edge = cursor
        while edge < end and (edge.replace(day=1) in closed) == is_closed:
            edge = min(month_after(edge), end)
        yield cursor, edge, is_closed
        cursor = edge


_AT = ("node_id_at", "pool_id_at", "team_id_at", "site_id_at")
_S_FIELDS = [(f, f"s_{f}") for f in _SUM_FIELDS]  # each sum and its column in a read
_S_VALUES = itemgetter(*(s_f for _, s_f in _S_FIELDS))  # a read row's sums, in that order
_TERMS = ("rate", "kind", "site_name", "pue", "price_per_kwh", "grid_g_per_kwh")


def frozen_segments(
    *,
    where: Q,
    loaded: _Loaded,
    filters: Filters,
    bucket: Callable[[dt.date], _Bucket] | _Bucket,
    sign: int = 1,
    adjusts: dt.date | None = None,
    by_class: bool = False,
    days: tuple[dt.date, dt.date] | None = None,
    period: str = "day",
) -> list[_Segment]:
    """The stored segments of closed months that ``where`` selects, summed in SQL per GPU,
    attribution and terms (``by_class``, on PostgreSQL: per price class of the GPUs, as
    ``sums._compute`` sums live ones, naming the GPUs; no node), each GPU standing in with
    the rate it was priced at then. ``bucket``: a day's bucket (the rows summed per day, or
    per ISO week or month with ``period`` "week" or "month", in SQL: the rows a page by week
    reads are 7 times fewer), or the one bucket of them all (summed over their days).

    ``sign`` 1: as stored (an adjustment a closed month carried stays one, for its day);
    -1: negated, as the frozen part of a new adjustment: for ``adjusts`` (the closed month,
    as the costs rows book it), or without it for each row's own day (per day: a FOCUS
    file's and a close's corrections).

    ``days`` (start, end): ``where`` selects the day rows of those closed days and nothing
    else; by class, their stored class rows are read instead where they can stand for them
    (``_class_day_rows``)."""
    per_day = not isinstance(bucket, _Bucket) or (sign < 0 and adjusts is None)
    by_class = by_class and connection.vendor == "postgresql" and bool(loaded.gpus)
    keys = [*(_AT[1:] if by_class else _AT), *_TERMS]
    rows = ClosedSegment.objects.filter(where, close__closed=True)
    truncated = _TRUNCATED.get(period) if not isinstance(bucket, _Bucket) else None
    if truncated is not None:  # each row's bucket's first day (as ``_bucket_key`` gives it)
        rows = rows.annotate(bucket_day=RawSQL(truncated, (), output_field=DateField()))
        keys.append("bucket_day")
    elif per_day:
        keys.append("day")
    if sign > 0 or adjusts is None:
        keys.append("adjusts")
    if filters.models or filters.gpus:  # few GPUs: the others' rows are not read
        rows = rows.filter(gpu_id__in=list(loaded.gpus))
    sums: dict[str, Any] = {f"s_{f}": Cast(Sum(f), FloatField()) for f in _SUM_FIELDS}
    sums["s_offline_h"] = Sum("offline_h")
    classes = None
    if by_class:
        # One statement per class: each row's class from a dense array by GPU id (SQL
        # arrays are 1-based: index = id - base; -1 where a GPU is not in the computation).
        classes = _frozen_classes(loaded)
        klass = RawSQL("(%s::int[])[gpu_id - %s]", (classes.at, classes.base))
        capacity = Q(observed_s__gt=0) | Q(offline_h__gt=0)
        sums["ids"] = ArrayAgg("gpu_id", filter=capacity)  # no DISTINCT: a hash, no sort
        summed = (
            rows.filter(gpu_id__gt=classes.base, gpu_id__lte=classes.top)
            .annotate(klass=klass)
            .values("klass", *keys)
            .annotate(**sums)
            .order_by()
        )
    else:
        summed = rows.values("gpu_id", *keys).annotate(**sums).order_by()
    read: list[dict[str, Any]] | None = None
    day_key = "day"  # the day a row's bucket is looked up by
    if classes is not None and days is not None and per_day and sign > 0:
        read = _class_day_rows(*days, classes)  # per day
    if read is None:
        read = _frozen_rows(summed, by_class=classes is not None)
        day_key = "bucket_day" if truncated else "day"
    stand_ins: dict[tuple[Any, ...], _GpuInfo] = {}
    priced_at: dict[
        tuple[Any, ...], tuple[cm.CostTerms | None, tuple[Decimal, Decimal, Decimal]]
    ] = {}
    sites: dict[tuple[Any, ...], _SiteTerms] = {}
    names = loaded.names
    out: list[_Segment] = []
    unfiltered = filters == Filters()
    for row in read:
        if classes is not None:
            if row["klass"] < 0:  # GPUs not in the computation (not filtered in SQL: the
                continue  # planner would take the filter to keep a third of the rows)
            owner, ids = classes.reps[row["klass"]], row["ids"] or []
        else:
            found = loaded.gpus.get(row["gpu_id"])
            if found is None:  # filtered out, or retired before the query
                continue
            owner, ids = found, None
        kind = row["kind"]
        place = (row.get("klass", owner.id), row["rate"], kind)
        stand_in = stand_ins.get(place)
        if stand_in is None:
            priced = priced_at.get(place[1:])
            if priced is None:  # a few per query: each parsed once
                rate = Decimal(row["rate"])
                terms_at = cm.CostTerms(kind=kind) if kind else None
                priced = priced_at[place[1:]] = (terms_at, (rate, rate, rate))
            stand_in = stand_ins[place] = owner.standing_in(*priced)
        terms = (row["site_name"], row["pue"], row["price_per_kwh"], row["grid_g_per_kwh"])
        site_terms = sites.get(terms)
        if site_terms is None:  # a few per query: each parsed once
            site_terms = sites[terms] = _SiteTerms(
                name=terms[0],
                pue=Decimal(terms[1]),
                price_per_kwh=Decimal(terms[2]),
                grid_g_per_kwh=Decimal(terms[3]),
            )
        day = row.get("day")
        carried = row.get("adjusts")
        values = _S_VALUES(row)
        if None in values:  # never (sums of stored columns), but 0 would stand for it
            values = tuple(v or 0.0 for v in values)
        segment = _Segment(
            gpu=stand_in,
            bucket=bucket if isinstance(bucket, _Bucket) else bucket(row[day_key]),
            phase=0,
            node_id=row.get("node_id_at"),
            pool_id=row["pool_id_at"],
            team_id=row["team_id_at"],
            site_id=row["site_id_at"],
            sums=dict(zip(_SUM_FIELDS, values if sign > 0 else map(neg, values), strict=True)),
            offline_h=sign * (row["s_offline_h"] or Decimal(0)),
            site_terms=site_terms,
            adjusts=carried if sign > 0 else (adjusts or carried or day),
            # Negated, a class's GPUs have no capacity in it (as one GPU's own sign says).
            # A set already (``_class_day_rows``: shared, read only) is taken as it is.
            gpu_ids=(
                None
                if ids is None
                else (ids if isinstance(ids, set) else set(ids))
                if sign > 0
                else set()
            ),
        )
        if unfiltered or _segment_kept(segment, filters, names):
            out.append(segment)
    missing = {s.node_id for s in out if s.node_id is not None} - names.nodes.keys()
    if missing:  # nodes a GPU has since left
        names.nodes.update(Node.objects.filter(pk__in=missing).values_list("id", "hostname"))
    return out


# A stored row's bucket by ISO week (its Monday) or month (its first day), in SQL.
_TRUNCATED = {
    "week": "(day - (extract(isodow FROM day)::int - 1))",
    "month": "date_trunc('month', day)::date",
}


@dataclasses.dataclass
class _FrozenClasses:
    """The GPUs of a computation by what prices a frozen segment beside its stored terms
    (nominal power, model): ``reps[i]`` stands for class ``i``; ``at`` each GPU's class
    (an array literal, index = id - ``base``; -1: no GPU of the computation) up to ``top``;
    ``index``: each class's key → ``i``; ``members[i]``: its GPUs."""

    reps: list[_GpuInfo]
    at: str
    base: int
    top: int
    index: dict[tuple[Any, ...], int]
    members: list[set[int]]


def _frozen_classes(loaded: _Loaded) -> _FrozenClasses:
    of: dict[tuple[Any, ...], int] = {}
    reps: list[_GpuInfo] = []
    members: list[set[int]] = []
    class_of: dict[int, int] = {}
    for gpu in loaded.gpus.values():
        key = (gpu.max_power_w, gpu.idle_power_w, gpu.model_key, gpu.model_name)
        index = of.get(key)
        if index is None:
            index = of[key] = len(reps)
            reps.append(gpu)
            members.append(set())
        class_of[gpu.id] = index
        members[index].add(gpu.id)
    at, base, top = by_id(class_of, -1)
    return _FrozenClasses(
        reps=reps, at=array_literal(at), base=base, top=top, index=of, members=members
    )


def _frozen_rows(summed: QuerySet[Any], *, by_class: bool = False) -> list[dict[str, Any]]:
    """The rows of ``summed`` as dicts; on PostgreSQL its statement read in the binary
    format (``sums._summed``: Django's converters cost more than the query).

    ``by_class``: a few hundred groups of a row per GPU and day, which the planner takes
    for tens of thousands (it multiplies the keys' distinct values) and, with an array of
    GPUs per group, for more than memory: it sorted 610,000 rows by their text keys (5 s
    at 10,000 GPUs) where a hash of the groups takes 10 MB (1.7 s). Hashing only, in this
    statement's transaction."""
    if connection.vendor != "postgresql":
        return list(summed)
    sql, params = summed.query.sql_with_params()
    with read_cursor(binary=True, large=True) as cursor:
        if by_class:
            cursor.execute("SELECT set_config('enable_sort', 'off', true)")
        cursor.execute(sql, params)
        heads = [column.name for column in cursor.description]
        return [dict(zip(heads, values, strict=True)) for values in cursor.fetchall()]


# A close's day rows summed per day, price class, attribution and terms (``ClosedClassDay``):
# the class is the GPU's model and nominal power then (``_frozen_classes``' key, spelled as
# ``loading._gpu_info`` spells a GPU without a model). Constant column names spliced in.
_CLASS_DAYS_TEMPLATE = """
INSERT INTO billing_closedclassday (close_id, {keys}, max_power_w, idle_power_w, model_key,
                                    model_name, {sums}, offline_h, gpu_ids, counted_ids)
SELECT s.close_id, {s_keys}, m.max_power_w, m.idle_power_w, coalesce(m.key, ''),
       coalesce(m.name, %(unassigned)s), {s_sums}, sum(s.offline_h),
       to_jsonb(array_agg(s.gpu_id ORDER BY s.gpu_id)),
       CASE WHEN count(*) FILTER (WHERE s.observed_s > 0 OR s.offline_h > 0) < count(*)
            THEN coalesce(to_jsonb(array_agg(s.gpu_id ORDER BY s.gpu_id)
                                   FILTER (WHERE s.observed_s > 0 OR s.offline_h > 0)),
                          '[]'::jsonb) END
FROM billing_closedsegment s JOIN fleet_gpu g ON g.id = s.gpu_id
LEFT JOIN fleet_gpumodel m ON m.id = g.model_id
WHERE s.close_id = %(close)s AND NOT s.whole_month
GROUP BY s.close_id, {s_keys}, m.max_power_w, m.idle_power_w, m.key, m.name
"""
_CLASS_DAY_KEYS = ("day", "adjusts", *_AT[1:], *_TERMS)
_CLASS_DAYS_SQL = _CLASS_DAYS_TEMPLATE.format(
    keys=", ".join(_CLASS_DAY_KEYS),
    sums=", ".join(_SUM_FIELDS),
    s_keys=", ".join(f"s.{k}" for k in _CLASS_DAY_KEYS),
    s_sums=", ".join(f"sum(s.{f})" for f in _SUM_FIELDS),
)


def class_days_store(close: MonthClose) -> bool:
    """Store ``close``'s day rows by price class (``ClosedClassDay``), from its
    ``ClosedSegment`` rows, in the caller's transaction; on PostgreSQL, where pages read
    closed days by class (elsewhere nothing is stored and False returned)."""
    if connection.vendor != "postgresql":
        return False
    from billing.selectors.types import UNASSIGNED_NAME

    ClosedClassDay.objects.filter(close=close).delete()
    with connection.cursor() as cursor:
        cursor.execute(_CLASS_DAYS_SQL, {"close": close.pk, "unassigned": UNASSIGNED_NAME})
    return True


def _class_day_rows(
    start: dt.date, end: dt.date, classes: _FrozenClasses
) -> list[dict[str, Any]] | None:
    """The rows the by-class statement of ``frozen_segments`` gives for the closed days
    [start, end) (each day's own rows and the adjustments carried on it), from the rows the
    closes stored by class: a few a day, not one per GPU. ``None`` where they cannot stand
    for it: a close of those days stored none, or a row's GPUs are not all in the
    computation in the class it was stored in (a GPU's model or its power changed since, a
    GPU retired before the window); then the caller sums the day rows itself."""
    closes = MonthClose.objects.filter(
        closed=True, month__gte=start.replace(day=1), month__lt=end
    ).values_list("pk", "by_class")
    if not all(by_class for _, by_class in closes):
        return None
    found = ClosedClassDay.objects.filter(
        close_id__in=[pk for pk, _ in closes], day__gte=start, day__lt=end
    ).values(*_CLASS_DAY_KEYS, "max_power_w", "idle_power_w", "model_key", "model_name")
    # The GPU lists as text: a class's rows name the same GPUs day after day, so each list is
    # parsed (and checked) once, not once a row (183 rows of 10,000 GPUs a quarter).
    found = found.annotate(
        gpus=Cast("gpu_ids", TextField()),
        ids=Cast("counted_ids", TextField()),
        s_offline_h=F("offline_h"),
    )
    lists: dict[str, set[int]] = {}
    checked: dict[tuple[int, str], bool] = {}
    rows = []
    for row in found.annotate(**{f"s_{f}": F(f) for f in _SUM_FIELDS}):
        key: tuple[Any, ...] = (row.pop("max_power_w"), row.pop("idle_power_w"))
        key += (row.pop("model_key"), row.pop("model_name"))
        klass = classes.index.get(key)
        text = row.pop("gpus")
        gpus = lists.get(text)
        if gpus is None:
            gpus = lists[text] = set(json.loads(text))
        if klass is None:
            return None
        inside = checked.get((klass, text))
        if inside is None:
            inside = checked[(klass, text)] = classes.members[klass].issuperset(gpus)
        if not inside:
            return None
        row["klass"] = klass
        # The GPUs with capacity, one set per distinct list: the segments only read it.
        counted = row["ids"]
        if counted is None:  # every GPU of it has capacity in it
            row["ids"] = gpus
        else:
            row["ids"] = lists.get(counted) or lists.setdefault(counted, set(json.loads(counted)))
        for name in _SUM_FIELDS:  # as the statement casts them (two are integers)
            row[f"s_{name}"] = float(row[f"s_{name}"])
        rows.append(row)
    return rows


def segment_columns(segment: _Segment, computation: _Computation) -> dict[str, Any]:
    """What a ``ClosedSegment`` keeps of one live segment (see there): its sums, offline
    hours and terms."""
    site = segment.site_terms or computation.names.site(segment.site_id)
    gpu = segment.gpu
    return {
        **{f: segment.sums.get(f, 0.0) for f in _SUM_FIELDS},
        "offline_h": segment.offline_h,
        "rate": str(gpu.rates[segment.phase]),
        "kind": gpu.kind or "",
        "site_name": site.name,
        "pue": str(site.pue),
        "price_per_kwh": str(site.price_per_kwh),
        "grid_g_per_kwh": str(site.grid_g_per_kwh),
    }


def _closes(
    start: dt.date, end: dt.date, closed: dict[dt.date, int] | None = None
) -> tuple[dict[dt.date, int], dict[dt.date, dt.date], list[tuple[dt.date, dt.date, bool]]]:
    """The closed months (``closed``, where the caller read them already); those whose late
    data is booked in [start, end) → the day it is booked on (the first day of the booking
    month); and [start, end) in open and closed runs."""
    closed = closed_months() if closed is None else closed
    bookings = {m: booking_month(m, closed) for m in closed}
    booked_here = {m: b for m, b in bookings.items() if start <= b < end}
    return closed, booked_here, list(_runs(start, end, closed))


@dataclasses.dataclass(frozen=True)
class BucketCloses:
    """How the closes touch the buckets of [start, end): ``touched``: a closed month lies in
    the range or books its late data there (the figures are not the live computation's
    alone); ``shut[i]``: bucket ``i`` lies wholly in closed months (the
    others have no closed day); ``runs``: the closed stretches ``(from, to)`` of the range;
    ``close_ids``: the closes of the months closed now."""

    touched: bool
    shut: list[bool]
    runs: list[tuple[dt.date, dt.date]]
    close_ids: list[int]


def bucket_closes(
    start: dt.date,
    end: dt.date,
    buckets: list[_Bucket],
    closed: dict[dt.date, int] | None = None,
) -> BucketCloses | None:
    """The closes of the buckets of [start, end), or None where a bucket lies partly in a
    closed month (a week or the whole range across a close's edge). ``closed``: the closed
    months, where the caller read them already."""
    closed, booked_here, runs = _closes(start, end, closed)
    shut = []
    for bucket in buckets:
        day, last = bucket.local_start.date(), bucket.local_end.date()
        kinds = set()
        while day < last:
            kinds.add(day.replace(day=1) in closed)
            day = month_after(day)
        if len(kinds) > 1:
            return None
        shut.append(kinds == {True})
    stretches = [(first, to) for first, to, is_closed in runs if is_closed]
    return BucketCloses(
        touched=bool(booked_here) or bool(stretches),
        shut=shut,
        runs=stretches,
        close_ids=sorted(closed.values()),
    )


def compute(
    *,
    start: dt.date,
    end: dt.date,
    period: str,
    filters: Filters,
    now: dt.datetime | None,
    pooled: bool = False,
    loaded: _Loaded | None = None,
    by_class: bool = False,
    adjust_days: bool = False,
    adjustments_only: bool = False,
    whole: tuple[dt.date, _Loaded] | None = None,
) -> _Computation:
    """``_compute``, with closed months frozen and their late data booked as adjustments
    (``by_class`` for the open months' own figures and the closed months' alike).

    An adjustment ``adjusts`` its closed month (its first day: the costs rows name the
    month), or with ``adjust_days`` each day it corrects (a FOCUS file's corrections, a
    close's carried adjustments), which finds the late data per GPU and day.
    ``adjustments_only``: the adjustments alone (those booked in the range, and those the
    closed months in it carried), what a count of the rows cannot tell without them
    (``counting.bucket_counts``). ``whole``: (its first day, the load) of a range this one
    is a part of, with the same filters: a month whose late data is booked here takes its
    GPUs from it where the month lies in that range (as from ``loaded`` where it lies in
    this one), not from a load of its own."""
    closed, booked_here, runs = _closes(start, end)
    untouched = not booked_here and all(not is_closed for _, _, is_closed in runs)
    if untouched and not adjustments_only:
        return _compute(
            start=start,
            end=end,
            period=period,
            filters=filters,
            now=now,
            pooled=pooled,
            loaded=loaded,
            by_class=by_class,
        )
    loaded = loaded or _load(start=start, end=end, filters=filters, now=now)
    now = loaded.now
    all_buckets = _buckets(start, end, period, loaded.zone)
    by_key = {b.key: b for b in all_buckets}

    def bucket_for(day: dt.date) -> _Bucket:
        return by_key[_bucket_key(day, period, start)]

    booked: list[_Segment] = []  # the late data's segments, after the stretches'
    base: _Computation | None = None
    additive = True  # the closed days and the late data add up over any buckets
    pooled_gpus: dict[tuple[dt.date, dt.date], set[int]] = {}
    # The open stretches around closed months read together where the rows are per GPU
    # (period "all"): one statement and a segment per GPU and attribution, not one per
    # stretch (each stretch's offline hours its own, as if computed alone).
    open_runs = [(a, b) for a, b, is_closed in runs if not is_closed]
    together = (
        period == "all" and len(open_runs) > 1 and not (by_class or pooled) and loaded.daily_zone
    )

    def open_part(run_start: dt.date, run_end: dt.date) -> _Computation:
        return _compute(
            start=start if together else run_start,
            end=end if together else run_end,
            period=period,
            filters=filters,
            now=now,
            pooled=pooled,
            loaded=loaded,
            by_class=by_class,
            runs=open_runs if together else None,
        )

    # Each stretch's segments, in the stretches' order: the closed ones' frozen segments, and
    # the open ones' computations, the first of them read beside (on a second connection,
    # while the frozen segments and the late data are read here) and taken last.
    parts: list[list[_Segment] | tuple[dt.date, Callable[[], _Computation]]] = []
    beside = False  # whether the first open stretch is being read beside
    for run_start, run_end, is_closed in runs:
        if is_closed:
            months = period in ("all", "month")
            where = _closed_run(run_start, run_end, months=months)
            if adjustments_only:  # the adjustments it carried
                where &= Q(adjusts__isnull=False)
            parts.append(
                frozen_segments(
                    where=where,
                    loaded=loaded,
                    filters=filters,
                    bucket=all_buckets[0] if period == "all" else bucket_for,
                    by_class=by_class,
                    days=None if months or adjustments_only else (run_start, run_end),
                    period=period,
                )
            )
            continue
        if adjustments_only or (together and run_start != open_runs[0][0]):
            continue  # (read with the first open stretch)
        made = functools.partial(open_part, run_start, run_end)
        parts.append((run_start, made if beside else read_beside(made)))
        beside = True
    for month, booked_on in booked_here.items():
        # Late data for ``month``: now less frozen, per GPU (or class), attribution and
        # terms, booked on the first day of the query in its booking month.
        bucket = bucket_for(booked_on)
        month_end = month_after(month)
        # What the window's load holds of the month where the month lies in the window (its
        # GPUs less those retired by the month's start), or the whole range's where this is
        # a part of one; else the month loaded on its own.
        source = loaded if month >= start else None
        if source is None and whole is not None and month >= whole[0]:
            source = whole[1]
        month_loaded = (
            _loaded_within(source, start=month, end=month_end) if source is not None else None
        ) or _load(start=month, end=month_end, filters=filters, now=now)
        whole_gpus = set() if adjust_days else _whole_month_gpus(month, month_loaded, filters)
        month_filters = filters
        unmoved = _unmoved_gpus(month, month_loaded, whole_gpus)
        if unmoved:  # nothing came late for them: only the others are computed
            whole_gpus -= unmoved
            moved = {i: g for i, g in month_loaded.gpus.items() if i not in unmoved}
            month_loaded = dataclasses.replace(month_loaded, gpus=moved)
            if not moved:
                continue
            if len(moved) <= _FEW_MOVED:  # their rows only, not the fleet's
                month_filters = dataclasses.replace(
                    filters, gpus=tuple(sorted(g.uuid for g in moved.values()))
                )
        live = _live_month(
            month, month_loaded, filters=month_filters, by_class=by_class, whole_gpus=whole_gpus
        )
        for segment in live:
            segment.adjusts = segment.bucket.key if adjust_days else month
            segment.bucket = bucket
        # Less what was frozen: the month's own segments, and the adjustments for it that
        # later months carried when they closed (booked there already).
        carried = Q(whole_month=False, adjusts__gte=month, adjusts__lt=month_end)
        own = Q(whole_month=True, day=month)
        if adjust_days:
            own = Q(whole_month=False, day__gte=month, day__lt=month_end, adjusts__isnull=True)
        frozen = frozen_segments(
            where=own | carried,
            loaded=month_loaded,
            filters=month_filters,
            bucket=bucket,
            sign=-1,
            adjusts=None if adjust_days else month,
            by_class=by_class,
        )
        booked += late_data(live + frozen, month_loaded.names, by_class=by_class)
        loaded.names.nodes.update(month_loaded.names.nodes)
    segments: list[_Segment] = []
    for found in parts:
        if isinstance(found, list):
            segments += found
            continue
        run_start, computing = found
        part = computing()
        for segment in part.segments:
            segment.bucket = bucket_for(segment.bucket.key if period != "all" else run_start)
        segments += part.segments
        base = base or part
        additive = additive and part.offline_additive
        for span, ids in part.pooled.items():  # each part's own days
            pooled_gpus.setdefault(span, set()).update(ids)
    segments += booked
    local_start, local_end = all_buckets[0].local_start, all_buckets[-1].local_end
    names = loaded.names
    if base is not None:
        names.nodes.update(base.names.nodes)
    return _Computation(
        currency=loaded.fleet_settings.currency,
        zone=loaded.zone,
        target_utilization=loaded.fleet_settings.target_utilization,
        local_start=local_start,
        local_end=local_end,
        window_start=local_start.astimezone(dt.UTC),
        window_end=local_end.astimezone(dt.UTC),
        now=now,
        gpus=loaded.gpus,
        names=names,
        segments=segments,
        closed_buckets=frozenset(
            b.key for b in all_buckets if _wholly_closed(b, loaded.zone, closed)
        ),
        pooled=pooled_gpus,
        offline_additive=additive,
    )


def late_data(
    segments: list[_Segment], names: _NamesAndSiteTerms, *, by_class: bool
) -> list[_Segment]:
    """A closed month's late data from its live segments and its frozen ones negated: summed
    per GPU and node (``by_class``: per price class, whichever GPUs its segments stand
    for: a GPU split at its depreciation's end is one of its own live, one of a class
    frozen), attribution, terms, bucket and corrected day, one segment each,
    left out where the two are equal but for float rounding (every sum and the offline hours
    within a relative ``_RELATIVE`` of the larger part: the same data summed in another
    order, from the monthly rows rather than the days). Every figure is linear in the sums
    and offline hours, so this is the money of the parts where anything came late, and no
    row of noise where nothing did. A netted segment counts the GPUs its live part has
    capacity in (``gpu_ids``), as the live segments would."""
    groups: dict[tuple[Any, ...], list[_Segment]] = {}
    for segment in segments:
        gpu = segment.gpu
        key: tuple[Any, ...] = (None, None) if by_class else (gpu.id, segment.node_id)
        key += (gpu.kind, gpu.rates[segment.phase])
        key += (segment.site_terms or names.site(segment.site_id), gpu.max_power_w)
        key += (gpu.idle_power_w, gpu.model_key, segment.pool_id, segment.team_id)
        key += (segment.site_id, segment.adjusts, segment.bucket.key)
        groups.setdefault(key, []).append(segment)
    out: list[_Segment] = []
    for members in groups.values():
        sums, scale = dict.fromkeys(_SUM_FIELDS, 0.0), dict.fromkeys(_SUM_FIELDS, 0.0)
        offline_h, offline_scale = Decimal(0), Decimal(0)
        counted: set[int] = set()
        for member in members:
            for name in _SUM_FIELDS:
                value = member.sums[name]
                sums[name] += value
                scale[name] = max(scale[name], abs(value))
            offline_h += member.offline_h
            offline_scale = max(offline_scale, abs(member.offline_h))
            if member.gpu_ids is not None:
                counted |= member.gpu_ids
            elif member.sums["observed_s"] > 0 or member.offline_h > 0:  # a live GPU's own
                counted.add(member.gpu.id)
        if abs(offline_h) <= offline_scale * _RELATIVE_D + _RELATIVE_D and all(
            abs(sums[name]) <= scale[name] * _RELATIVE + _RELATIVE for name in _SUM_FIELDS
        ):
            continue
        first = members[0]
        site = first.site_terms or names.site(first.site_id)
        netted = dataclasses.replace(
            first, sums=sums, offline_h=offline_h, site_terms=site, gpu_ids=counted
        )
        out.append(netted)
    return out


_RELATIVE = 1e-9
_RELATIVE_D = Decimal("1e-9")
# A few GPUs: up to this many (those whose late data is checked, or computed), a statement
# reads their rows by id rather than every GPU's, the others skipped in Python.
_FEW_MOVED = 500


def _closed_run(start: dt.date, end: dt.date, *, months: bool) -> Q:
    """The stored rows of the closed days [start, end): a row per GPU and day, or with
    ``months`` the month rows of the whole months among them and the day rows of the rest
    (and of the adjustments carried, which have no month rows)."""
    days = Q(whole_month=False, day__gte=start, day__lt=end)
    first = start if start.day == 1 else month_after(start)
    last = end.replace(day=1)
    if not months or last <= first:
        return days
    inside = Q(day__gte=first, day__lt=last)
    if (first, last) == (start, end):  # whole months only: read by their partial index
        return inside & (Q(whole_month=True) | Q(adjusts__isnull=False))
    return (Q(whole_month=True) & inside) | (days & (~inside | Q(adjusts__isnull=False)))


# GPUs with a daily row of the month that observed more than 3600 s per hour it sums
# (overlapping samples): only there can a day observe more than its length (an hour has one
# row per GPU), and clamping its offline hours at 0 makes the day's not add up to the month's.
# Read by the partial index of those rows (telemetry_daily_over: the condition spelled as
# it is there, so PostgreSQL proves it).
_OVER_SQL = """
    SELECT DISTINCT gpu_id FROM telemetry_dailyusage
    WHERE day >= %s AND day < %s AND observed_s > hours * 3600
"""


def _whole_month_gpus(month: dt.date, loaded: _Loaded, filters: Filters) -> set[int]:
    """The GPUs of ``loaded`` whose days add up to closed ``month`` (on PostgreSQL, where
    the report zone is the daily table's): in service the whole month, no depreciation
    boundary in it, no day that observed more than it has hours (checked in SQL). Their
    month is computed whole, from the monthly rows; the others' day by day."""
    if not loaded.daily_zone or connection.vendor != "postgresql":
        return set()
    end = month_after(month)
    first = _local_midnight(month, loaded.zone).astimezone(dt.UTC)
    last = _local_midnight(end, loaded.zone).astimezone(dt.UTC)
    sql = _OVER_SQL.strip()
    params: list[Any] = [month, end]
    if filters.gpus or filters.models:  # a few GPUs: their rows only
        sql += " AND gpu_id = ANY(%s::bigint[])"
        params.append(array_literal(list(loaded.gpus)))
    with read_cursor() as cursor:
        cursor.execute(sql, params)
        over = {gpu_id for (gpu_id,) in cursor.fetchall()}
    return {
        gpu_id
        for gpu_id, info in loaded.gpus.items()
        if gpu_id not in over
        and info.service_start is not None
        and info.service_start <= first
        and (info.retired_at is None or info.retired_at >= last)
        and (info.boundary_hour is None or not first <= info.boundary_hour < last)
    }


# Per GPU and attribution, a closed month's sums now (its monthly rows) beside what is
# frozen of it (its month rows and the adjustments later closes carried for it): whether any
# sum differs by more than late_data's rounding allowance, and what the offline hours and
# terms need to be checked against in Python (``_unmoved_gpus``). Keys compared through
# coalesce: a full join needs plain equality, and a node or site may be none. Constant column
# names and the allowance spliced in, no value.
_MOVED_TEMPLATE = """
WITH live AS (
    SELECT gpu_id, node_id, pool_id, team_id, site_id, {live_sums}
    FROM telemetry_monthlyusage
    WHERE month = %(month)s {live_ids}
    GROUP BY gpu_id, node_id, pool_id, team_id, site_id
), frozen AS (
    SELECT s.gpu_id, s.node_id_at AS node_id, s.pool_id_at AS pool_id,
           s.team_id_at AS team_id, s.site_id_at AS site_id, {frozen_sums},
           sum(s.offline_h)::float8 AS offline_h, max(abs(s.offline_h))::float8 AS offline_max,
           -- 1: every row at one set of terms (each column one value), 2: more than one
           CASE WHEN min(s.rate) = max(s.rate) AND min(s.kind) = max(s.kind)
                 AND min(s.pue) = max(s.pue) AND min(s.price_per_kwh) = max(s.price_per_kwh)
                 AND min(s.grid_g_per_kwh) = max(s.grid_g_per_kwh)
                 AND (count(s.site_name) = 0 OR (count(s.site_name) = count(*)
                      AND min(s.site_name) = max(s.site_name)))
                THEN 1 ELSE 2 END AS terms,
           min(s.rate) AS rate, min(s.kind) AS kind, min(s.site_name) AS site_name,
           min(s.pue) AS pue, min(s.price_per_kwh) AS price_per_kwh,
           min(s.grid_g_per_kwh) AS grid_g_per_kwh
    FROM billing_closedsegment s JOIN billing_monthclose c ON c.id = s.close_id
    WHERE c.closed {frozen_ids}
      AND ((s.whole_month AND s.day = %(month)s)
           OR (NOT s.whole_month AND s.adjusts >= %(month)s AND s.adjusts < %(end)s))
    GROUP BY s.gpu_id, s.node_id_at, s.pool_id_at, s.team_id_at, s.site_id_at
)
SELECT coalesce(l.gpu_id, f.gpu_id), coalesce(l.node_id, f.node_id),
       coalesce(l.pool_id, f.pool_id), coalesce(l.team_id, f.team_id),
       coalesce(l.site_id, f.site_id), NOT ({equal}) AS moved,
       coalesce(l.observed_s, 0), f.offline_h, f.offline_max, coalesce(f.terms, 0), f.rate,
       f.kind, f.site_name, f.pue, f.price_per_kwh, f.grid_g_per_kwh
{paired}
"""
# The live and frozen rows of one GPU and attribution side by side (``_MOVED_TEMPLATE`` and
# ``_UNTOUCHED_TEMPLATE``).
_PAIRED = """FROM live l FULL JOIN frozen f
  ON l.gpu_id = f.gpu_id AND coalesce(l.node_id, 0) = coalesce(f.node_id, 0)
 AND coalesce(l.pool_id, 0) = coalesce(f.pool_id, 0)
 AND coalesce(l.team_id, 0) = coalesce(f.team_id, 0)
 AND coalesce(l.site_id, 0) = coalesce(f.site_id, 0)"""
_MOVED_PARTS = dict(
    paired=_PAIRED,
    live_sums=", ".join(f"sum({f})::float8 AS {f}" for f in _SUM_FIELDS),
    frozen_sums=", ".join(
        f"sum(s.{f})::float8 AS {f}, max(abs(s.{f}))::float8 AS {f}_max" for f in _SUM_FIELDS
    ),
    equal=" AND ".join(
        f"abs(coalesce(l.{f}, 0) - coalesce(f.{f}, 0)) <= greatest(abs(coalesce(l.{f}, 0)),"
        f" coalesce(f.{f}_max, 0)) * {_RELATIVE!r} + {_RELATIVE!r}"
        for f in _SUM_FIELDS
    ),
)
# Every GPU's rows, or (a few GPUs, ``_FEW_MOVED``) those of the GPUs asked for.
_MOVED_SQL = _MOVED_TEMPLATE.format(**_MOVED_PARTS, live_ids="", frozen_ids="")
_MOVED_FEW_SQL = _MOVED_TEMPLATE.format(
    **_MOVED_PARTS,
    live_ids="AND gpu_id = ANY(%(ids)s::bigint[])",
    frozen_ids="AND s.gpu_id = ANY(%(ids)s::bigint[])",
)


# What nothing touched since the month closed, judged in SQL: per GPU of the whole ones
# (``_unmoved_gpus``), given its attribution and price terms now (arrays by GPU id, 0 for
# none; ``terms`` an index into the few distinct rates and kinds of the fleet, -1 for a GPU
# not asked about), whose monthly rows were all last written before the month's close began
# (their xmin, an xid made whole with the epoch of now, older than the close's oldest
# running transaction). The close saw those rows as they are, so their sums equal the
# frozen ones wherever each side has its attribution; where one side lacks it, the GPU moved
# unless the frozen row is all zeros (as ``_MOVED_SQL`` finds a live row against none).
# Their offline hours are checked here as ``_unmoved_gpus`` checks the others' (capacity
# less observed, at the attribution now, the same allowance); what is left is their terms, a
# few distinct ones a fleet: each set of frozen terms comes back once with the GPUs that
# passed all else (``compared`` 0), checked in Python. The GPUs to compare instead come back
# by what sent them: 1, touched (a monthly row written since or while the month closed, or
# an adjustment a later close carried for it); 2, more than one row (an attribution on one
# side only, more than one attribution in the month, or frozen rows at two sets of terms).
# A raw xmin made whole is never older than the row's write, so a row written since the
# close is always touched. Constant column names and the allowance spliced in, no value.
_CURRENT_XID = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS x"
# A monthly row ``m`` written by a transaction no older than the close's oldest running one
# (``xmin`` made whole with the epoch of now, ``cur.x``: never older than the write).
_WRITTEN_SINCE = """((CASE WHEN m.xmin::text::bigint <= (cur.x & 4294967295) THEN cur.x >> 32
                  ELSE (cur.x >> 32) - 1 END) << 32 | m.xmin::text::bigint)
               >= %(xmin)s"""
_UNTOUCHED_TEMPLATE = """
WITH cur AS ({current_xid}), live AS (
    SELECT m.gpu_id, m.node_id, m.pool_id, m.team_id, m.site_id,
           m.observed_s::float8 AS observed_s, {written_since} AS new
    FROM telemetry_monthlyusage m, cur
    WHERE m.month = %(month)s {live_ids}
), frozen AS (
    SELECT s.gpu_id, s.node_id_at AS node_id, s.pool_id_at AS pool_id,
           s.team_id_at AS team_id, s.site_id_at AS site_id, s.offline_h::float8 AS offline_h,
           s.rate, s.kind, s.site_name, s.pue, s.price_per_kwh, s.grid_g_per_kwh,
           ({zero}) = 0 AS zero
    FROM billing_closedsegment s
    WHERE s.close_id = %(close)s AND s.whole_month AND s.day = %(month)s {frozen_ids}
), carried AS (
    SELECT DISTINCT s.gpu_id FROM billing_closedsegment s
    JOIN billing_monthclose c ON c.id = s.close_id
    WHERE c.closed AND NOT s.whole_month AND s.adjusts >= %(month)s AND s.adjusts < %(end)s
      {frozen_ids}
), pairs AS (
    SELECT coalesce(l.gpu_id, f.gpu_id) AS gpu_id, coalesce(l.node_id, f.node_id) AS node_id,
           coalesce(l.pool_id, f.pool_id) AS pool_id, coalesce(l.team_id, f.team_id) AS team_id,
           coalesce(l.site_id, f.site_id) AS site_id,
           f.gpu_id IS NULL OR (l.gpu_id IS NULL AND NOT f.zero) AS differs,
           greatest(0, %(capacity)s - coalesce(l.observed_s, 0) / 3600) AS live, f.offline_h,
           f.rate, f.kind, f.site_name, f.pue, f.price_per_kwh, f.grid_g_per_kwh,
           CASE WHEN coalesce(l.new, false) OR c.gpu_id IS NOT NULL THEN 1
                WHEN count(*) OVER (PARTITION BY coalesce(l.gpu_id, f.gpu_id)) > 1 THEN 2
                ELSE 0 END AS compared
    {paired}
    LEFT JOIN carried c ON c.gpu_id = coalesce(l.gpu_id, f.gpu_id)
), judged AS (
    SELECT p.*, (%(terms)s::int[])[p.gpu_id - %(base)s] AS terms_now,
           coalesce(p.node_id, 0) = (%(nodes)s::bigint[])[p.gpu_id - %(base)s]
           AND coalesce(p.pool_id, 0) = (%(pools)s::bigint[])[p.gpu_id - %(base)s]
           AND coalesce(p.team_id, 0) = (%(teams)s::bigint[])[p.gpu_id - %(base)s]
           AND coalesce(p.site_id, 0) = (%(sites)s::bigint[])[p.gpu_id - %(base)s] AS at_now
    FROM pairs p WHERE p.gpu_id > %(base)s AND p.gpu_id <= %(top)s
)
SELECT compared, array_agg(gpu_id), site_id, terms_now, rate, kind, site_name, pue,
       price_per_kwh, grid_g_per_kwh
FROM judged j, LATERAL (SELECT CASE WHEN at_now THEN live ELSE 0 END AS own) o
WHERE terms_now >= 0 AND (compared > 0 OR (
    NOT differs AND (at_now OR live <= {r})
    AND abs(own - offline_h) <= greatest(abs(own), abs(offline_h)) * {r} + {r}))
GROUP BY compared, site_id, terms_now, rate, kind, site_name, pue, price_per_kwh, grid_g_per_kwh
"""
_UNTOUCHED_PARTS = dict(
    current_xid=_CURRENT_XID,
    written_since=_WRITTEN_SINCE,
    paired=_PAIRED,
    zero=" + ".join(f"abs(s.{f})" for f in _SUM_FIELDS),
    r=repr(_RELATIVE),
)
_UNTOUCHED_SQL = _UNTOUCHED_TEMPLATE.format(**_UNTOUCHED_PARTS, live_ids="", frozen_ids="")
_UNTOUCHED_FEW_SQL = _UNTOUCHED_TEMPLATE.format(  # a few GPUs (``_FEW_MOVED``): theirs only
    **_UNTOUCHED_PARTS,
    live_ids="AND m.gpu_id = ANY(%(ids)s::bigint[])",
    frozen_ids="AND s.gpu_id = ANY(%(ids)s::bigint[])",
)


def close_snapshot() -> tuple[int | None, int | None]:
    """(the oldest transaction running now, the cluster's system identifier): what a close
    keeps (``MonthClose.snapshot_xmin``, ``snapshot_system``) before it reads; (None, None)
    off PostgreSQL."""
    if connection.vendor != "postgresql":
        return None, None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, system_identifier"
            " FROM pg_control_system()"
        )
        xmin, system = cursor.fetchone()
    return int(xmin), int(system)


# The month's close and its snapshot, where it was taken on this cluster (a replica shares
# its primary's identifier and transaction ids; a restored dump or an upgrade does not).
_STAMP_SQL = """
SELECT c.id, c.snapshot_xmin FROM billing_monthclose c, pg_control_system() s
WHERE c.month = %s AND c.closed AND c.snapshot_xmin IS NOT NULL
  AND c.snapshot_system = s.system_identifier
"""


def _gpu_states(loaded: _Loaded) -> dict[int, bytes]:
    """Each GPU's state: what a closed month's figures of it depend on beside its rollup rows
    and the terms of the sites those lie at (its attribution now, where its offline hours
    go; its service dates and depreciation, its capacity and whether the month is whole for
    it; its rates and kind), as an 8-byte digest (``close_state``). Worked out once per load
    (the loads made of it share the cache), the dates and terms once per distinct value
    (GPUs bought together share them)."""
    states = loaded.states
    terms: dict[tuple[Any, ...], str] = {}
    for gpu_id, info in loaded.gpus.items():
        if gpu_id in states:
            continue
        key = (info.service_start, info.retired_at, info.boundary_hour, info.rates, info.kind)
        text = terms.get(key)
        if text is None:
            text = terms[key] = "|".join(map(str, (*key[:3], key[3][0], key[3][2], key[4])))
        state = f"{info.node_id}|{info.pool_id}|{info.team_id}|{info.site_id}|{text}"
        states[gpu_id] = hashlib.blake2b(state.encode(), digest_size=8).digest()
    return states


def _site_terms(names: _NamesAndSiteTerms) -> dict[str, list[str | None]]:
    """Each site's terms, as text: ``{site id: [name, PUE, tariff, grid]}``."""
    return {
        str(site_id): [t.name, str(t.pue), str(t.price_per_kwh), str(t.grid_g_per_kwh)]
        for site_id, t in names.sites.items()
    }


def close_state(loaded: _Loaded) -> tuple[bytes, dict[str, list[str | None]]]:
    """What a close keeps of the fleet it loaded (``MonthClose.gpu_states`` and
    ``site_terms``): each GPU's ``_gpu_state``, packed as its id (8 bytes) and digest, and
    each site's terms. A later page spares the late-data check of a GPU whose state and
    sites' terms are these still and whose monthly rows nothing wrote since (``_spared``):
    its month computed now is the one the close froze."""
    states = _gpu_states(loaded)
    ids = array("q", states)
    return ids.tobytes() + b"".join(states.values()), _site_terms(loaded.names)


def _stored_states(packed: bytes) -> dict[int, bytes]:
    """``close_state``'s packed digests, by GPU id."""
    count = len(packed) // 16
    ids = array("q")
    ids.frombytes(packed[: 8 * count])
    return dict(zip(ids, (packed[k : k + 8] for k in range(8 * count, 16 * count, 8)), strict=True))


# The month's close, its snapshot (where taken on this cluster) and what it kept of the
# fleet (``close_state``).
_CLOSE_STATE_SQL = """
SELECT c.id, c.snapshot_xmin, c.gpu_states, c.site_terms
FROM billing_monthclose c, pg_control_system() s
WHERE c.month = %s AND c.closed AND c.snapshot_xmin IS NOT NULL
  AND c.snapshot_system = s.system_identifier AND length(c.gpu_states) > 0
"""

# The GPUs whose closed month cannot be spared the comparison: a monthly row written since
# the close began reading (late data rolled up), an adjustment a later close carried for the
# month, or a month row at a site whose terms changed since (``sites``). Constant pieces
# spliced in, no value.
_TOUCHED_SQL = f"""
WITH cur AS ({_CURRENT_XID})
SELECT m.gpu_id FROM telemetry_monthlyusage m, cur
WHERE m.month = %(month)s AND {_WRITTEN_SINCE}
UNION
SELECT s.gpu_id FROM billing_closedsegment s JOIN billing_monthclose c ON c.id = s.close_id
WHERE c.closed AND NOT s.whole_month AND s.adjusts >= %(month)s AND s.adjusts < %(end)s
UNION
SELECT s.gpu_id FROM billing_closedsegment s
WHERE s.close_id = %(close)s AND s.whole_month AND s.day = %(month)s
  AND s.site_id_at = ANY(%(sites)s::bigint[])
"""  # noqa: S608


def _spared(month: dt.date, loaded: _Loaded, whole_gpus: set[int]) -> set[int] | None:
    """The GPUs of ``whole_gpus`` whose late data for closed ``month`` is nil because
    nothing it depends on changed since the close: their monthly rows were all written
    before the close began reading (so it saw them as they are), no later close carried an
    adjustment for them, their ``_gpu_state`` is the one the close kept, and so are the
    terms of the sites their month rows lie at. Their month computed now is the one frozen.
    None where the close kept no state of this cluster (made before closes kept it, or
    restored elsewhere): ``_untouched`` then."""
    if connection.vendor != "postgresql":
        return None
    with read_cursor(binary=True) as cursor:
        cursor.execute(_CLOSE_STATE_SQL, [month])
        found = cursor.fetchone()
        if found is None:
            return None
        close_id, xmin, packed, stored_sites = found
        now_sites = _site_terms(loaded.names)
        changed = {int(k) for k in stored_sites.keys() | now_sites.keys()}
        changed -= {int(k) for k, v in now_sites.items() if stored_sites.get(k) == v}
        params = {"month": month, "end": month_after(month), "close": close_id, "xmin": xmin}
        cursor.execute(_TOUCHED_SQL, {**params, "sites": array_literal(sorted(changed))})
        touched = {gpu_id for (gpu_id,) in cursor.fetchall()}
    stored = _stored_states(bytes(packed))
    states = _gpu_states(loaded)
    return {
        gpu_id
        for gpu_id in whole_gpus
        if gpu_id not in touched and stored.get(gpu_id) == states[gpu_id]
    }


def _rows_of(
    cursor: Any, every: str, few: str, params: dict[str, Any], gpus: set[int]
) -> list[Any]:
    """The rows of ``gpus`` that a statement of every GPU's rows gives (``every``), or where
    they are a few (``_FEW_MOVED``) its twin that reads theirs only (``few``, given them as
    ``ids``)."""
    if len(gpus) <= _FEW_MOVED:
        cursor.execute(few, {**params, "ids": array_literal(sorted(gpus))})
    else:
        cursor.execute(every, params)
    return [row for row in cursor.fetchall() if row[0] in gpus]


def _priced_as_now(
    site_now: _SiteTerms,
    rate_now: Decimal,
    kind_now: str | None,
    rate: str,
    kind: str,
    site_name: str | None,
    pue: str,
    price_per_kwh: str,
    grid_g_per_kwh: str,
) -> bool:
    """Whether the terms a close froze (its rate, kind and site terms, as stored) are a GPU's
    now: its rate and kind, its site's terms (of the frozen row's site)."""
    return (
        Decimal(rate) == rate_now
        and (kind or None) == kind_now
        and _SiteTerms(site_name, Decimal(pue), Decimal(price_per_kwh), Decimal(grid_g_per_kwh))
        == site_now
    )


_NOW_COLUMNS = ("nodes", "pools", "teams", "sites", "terms")  # ``_UNTOUCHED_SQL``'s arrays


def _untouched(
    month: dt.date, loaded: _Loaded, whole_gpus: set[int], capacity_h: float
) -> tuple[set[int], set[int], set[int]] | None:
    """(the GPUs of ``whole_gpus`` that nothing touched since the month closed and whose
    late data is nil, the GPUs that something touched, those with more than one
    attribution in the month: ``_UNTOUCHED_SQL``; the last two are to be compared); None
    where the close kept no snapshot of this cluster (made before it kept one, or
    elsewhere): then every GPU is compared. ``capacity_h``: each whole GPU's capacity, all
    month."""
    if connection.vendor != "postgresql":
        return None
    first = _local_midnight(month, loaded.zone).astimezone(dt.UTC)
    terms: dict[tuple[Decimal, str | None], int] = {}  # a few distinct terms: each an index
    now: dict[str, dict[int, int]] = {column: {} for column in _NOW_COLUMNS}
    for gpu_id in whole_gpus:
        info = loaded.gpus[gpu_id]
        now["nodes"][gpu_id] = info.node_id or 0
        now["pools"][gpu_id] = info.pool_id or 0
        now["teams"][gpu_id] = info.team_id or 0
        now["sites"][gpu_id] = info.site_id or 0
        rate_kind = (info.rates[_phase_outside(info, first)], info.kind)
        now["terms"][gpu_id] = terms.setdefault(rate_kind, len(terms))
    with read_cursor(binary=True, large=True) as cursor:
        cursor.execute(_STAMP_SQL, [month])
        stamp = cursor.fetchone()
        if stamp is None:
            return None
        params = {"month": month, "end": month_after(month), "close": stamp[0], "xmin": stamp[1]}
        params["capacity"] = capacity_h
        for column, values in now.items():  # dense by GPU id: -1 for a GPU not asked about
            dense, params["base"], params["top"] = by_id(values, -1 if column == "terms" else 0)
            params[column] = array_literal(dense)
        few = len(whole_gpus) <= _FEW_MOVED
        if few:
            params["ids"] = array_literal(sorted(whole_gpus))
        cursor.execute(_UNTOUCHED_FEW_SQL if few else _UNTOUCHED_SQL, params)
        found = cursor.fetchall()
    names, now_terms = loaded.names, list(terms)
    touched: set[int] = set()
    several: set[int] = set()
    same: set[int] = set()
    differ: set[int] = set()
    for compared, gpu_ids, site, index, rate, kind, site_name, pue, price, grid in found:
        if compared:
            (touched if compared == 1 else several).update(gpu_ids)
            continue
        rate_now, kind_now = now_terms[index]
        frozen = (rate, kind, site_name, pue, price, grid)
        alike = _priced_as_now(names.site(site), rate_now, kind_now, *frozen)
        (same if alike else differ).update(gpu_ids)
    return same - differ, touched, several


def _unmoved_gpus(month: dt.date, loaded: _Loaded, whole_gpus: set[int]) -> set[int]:
    """The GPUs of ``whole_gpus`` whose late data for closed ``month`` is nil: ``late_data``
    would net their live and frozen segments to nothing (every sum and the offline hours
    equal within its rounding allowance, per attribution; the same terms), so they need not
    be computed. One statement compares the monthly rows with the month rows in SQL; the
    offline hours (capacity less observed, at the GPU's current attribution) and the terms
    (its rate and kind now, its site's terms now) are compared here. A GPU with frozen rows
    at more than one set of terms, or an attribution on one side only, counts as moved: the
    exact path nets it.

    Where the close kept its snapshot, the GPUs whose monthly rows nothing wrote since are
    judged in SQL but for their terms, a few distinct ones, checked once each
    (``_untouched``): their sums are not compared (the close saw them as they are), their
    offline hours are; the statement that compares sums reads the others' (the GPUs late
    data touched, a few as a rule), checked here."""
    if not whole_gpus:
        return set()
    end = month_after(month)
    first = _local_midnight(month, loaded.zone).astimezone(dt.UTC)
    last = _local_midnight(end, loaded.zone).astimezone(dt.UTC)
    # Every whole GPU's capacity, all month. The offline hours are compared in floats: their
    # rounding is far inside the allowance.
    capacity_h = float(cm.hours_between(start=first, end=last))
    rows: list[Any] = []
    spared: set[int] = set()
    compared = whole_gpus
    found = _spared(month, loaded, whole_gpus)
    if found is not None:
        spared, compared = found, whole_gpus - found
    else:
        untouched = _untouched(month, loaded, whole_gpus, capacity_h)
        if untouched is not None:
            spared, compared = untouched[0], untouched[1] | untouched[2]
    if compared:
        with read_cursor(binary=True, large=True) as cursor:
            params = {"month": month, "end": end}
            rows += _rows_of(cursor, _MOVED_SQL, _MOVED_FEW_SQL, params, compared)
    moved: set[int] = set()
    observed_h: dict[int, float] = defaultdict(float)
    frozen_offline: dict[int, list[tuple[tuple[Any, ...], float, float]]] = defaultdict(list)
    names = loaded.names
    same_terms: dict[tuple[Any, ...], bool] = {}  # a few distinct terms per fleet: each once
    for gpu_id, node, pool, team, site, differs, observed_s, offline_h, offline_max, *terms in rows:
        info = loaded.gpus[gpu_id]
        observed_h[gpu_id] += observed_s / 3600
        if differs:
            moved.add(gpu_id)
            continue
        if terms[0]:  # frozen rows at this attribution: their terms are the GPU's now?
            key = (site, info.rates[_phase_outside(info, first)], info.kind, *terms)
            same = same_terms.get(key)
            if same is None:
                count, *frozen = terms
                same = same_terms[key] = count == 1 and _priced_as_now(
                    names.site(site), key[1], key[2], *frozen
                )
            if not same:
                moved.add(gpu_id)
                continue
            frozen_offline[gpu_id].append(((node, pool, team, site), offline_h, offline_max))
    unmoved = spared
    for gpu_id in compared - moved:
        info = loaded.gpus[gpu_id]
        live = max(0.0, capacity_h - observed_h[gpu_id])  # cost_model.offline_hours
        at_now = (info.node_id, info.pool_id, info.team_id, info.site_id)
        seen_now = False
        for at, offline_h, offline_max in frozen_offline.get(gpu_id, []):
            own = live if at == at_now else 0.0
            seen_now = seen_now or at == at_now
            if abs(own - offline_h) > max(abs(own), offline_max) * _RELATIVE + _RELATIVE:
                break
        else:
            if seen_now or live <= _RELATIVE:
                unmoved.add(gpu_id)
    return unmoved


def _live_month(
    month: dt.date,
    loaded: _Loaded,
    *,
    filters: Filters,
    by_class: bool,
    whole_gpus: set[int],
) -> list[_Segment]:
    """The closed ``month`` computed from the rollups now (filtered as ``loaded`` is), in
    segments whose sums less the frozen ones are its late data.

    The frozen segments are per day, so the live ones must add up as days do: the GPUs of
    ``whole_gpus`` (``_whole_month_gpus``) are computed over the whole month, from the
    monthly rows; the others day by day (all of them for a FOCUS file's or a close's
    corrections, which are per day)."""
    end = month_after(month)
    per_gpu_day = {i: g for i, g in loaded.gpus.items() if i not in whole_gpus}
    whole = {i: g for i, g in loaded.gpus.items() if i in whole_gpus}
    segments: list[_Segment] = []
    for gpus, period in ((whole, "all"), (per_gpu_day, "day")):
        if gpus:
            part = _compute(
                start=month,
                end=end,
                period=period,
                filters=filters,
                now=loaded.now,
                loaded=dataclasses.replace(loaded, gpus=gpus),
                by_class=by_class,
            )
            segments += part.segments
    return segments


def _wholly_closed(bucket: _Bucket, zone: dt.tzinfo, closed: dict[dt.date, int]) -> bool:
    day = bucket.local_start.date()
    last = bucket.local_end.date()
    while day < last:
        if day.replace(day=1) not in closed:
            return False
        day = month_after(day)
    return True
