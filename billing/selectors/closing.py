"""Closed months (docs/finance.md, DESIGN.md §9.1): frozen figures and the adjustments late
data made.

A closed month's figures come from the rows stored at its close (``ClosedSegment``), priced
with the terms stored with them, never from the rollups, so late data cannot move them. What
late data changes is booked when it is written (``billing.adjustments``): the month computed
now less its frozen rows and the adjustments booked for it already (``late_data_of``),
stored as rows of its close marked ``adjusts`` in the first open month. Every figure is
linear in the rows' sums and offline hours, so the difference is priced by the same
accumulator. Readers take frozen rows + stored adjustments + open months (``compute``); none
of them looks for late data.

``compute`` has ``_compute``'s signature and gives its computation unchanged when no closed
month or adjustment touches the query (one small query to find that out).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from operator import itemgetter, neg
from typing import Any

from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection
from django.db.models import DateField, F, FloatField, Min, Q, QuerySet, Sum, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, TruncMonth

from billing import cost_model as cm
from billing.models import ClosedClassDay, ClosedSegment, MonthClose
from billing.selectors.calendar import _bucket_key, _buckets, month_after
from billing.selectors.literals import array_literal, by_id
from billing.selectors.loading import _load, _Loaded
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

    ``sign`` 1: as stored (an adjustment stays one, for the day it corrects where
    ``period`` is "day", else for that day's month: summed over its days in SQL); -1:
    negated per day, as the frozen part of what is still to book (``late_data_of``), each
    row for its own day or the day it corrects.

    ``days`` (start, end): ``where`` selects the day rows of those closed days and nothing
    else; by class, their stored class rows are read instead where they can stand for them
    (``_class_day_rows``)."""
    per_day = not isinstance(bucket, _Bucket) or sign < 0
    by_class = by_class and connection.vendor == "postgresql" and bool(loaded.gpus)
    keys = [*(_AT[1:] if by_class else _AT), *_TERMS]
    rows = ClosedSegment.objects.filter(where, close__closed=True)
    truncated = _TRUNCATED.get(period) if not isinstance(bucket, _Bucket) else None
    if truncated is not None:  # each row's bucket's first day (as ``_bucket_key`` gives it)
        rows = rows.annotate(bucket_day=RawSQL(truncated, (), output_field=DateField()))
        keys.append("bucket_day")
    elif per_day:
        keys.append("day")
    carried_key = "adjusts"
    if sign > 0 and period != "day":  # a row adjusts a month: summed over its days
        rows = rows.annotate(adjusts_month=TruncMonth("adjusts"))
        carried_key = "adjusts_month"
    keys.append(carried_key)
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
        carried = row.get(carried_key)
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
            adjusts=carried if sign > 0 else (carried or day),
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
WHERE s.close_id = %(close)s AND NOT s.whole_month AND s.adjusts IS NULL
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


def _adjustments_in(start: dt.date, end: dt.date) -> Q:
    """The adjustments booked in [start, end): an adjustment's ``day`` is the first day of
    the month it is booked in, its ``adjusts`` the closed day it corrects."""
    return Q(adjusts__isnull=False, day__gte=start, day__lt=end)


def _closes(
    start: dt.date, end: dt.date, closed: dict[dt.date, int] | None = None
) -> tuple[dict[dt.date, int], bool, list[tuple[dt.date, dt.date, bool]]]:
    """The closed months (``closed``, where the caller read them already); whether any
    adjustment is booked in [start, end); and [start, end) in open and closed runs."""
    closed = closed_months() if closed is None else closed
    booked = bool(closed) and (
        ClosedSegment.objects.filter(_adjustments_in(start, end), close__closed=True).exists()
    )
    return closed, booked, list(_runs(start, end, closed))


@dataclasses.dataclass(frozen=True)
class BucketCloses:
    """How the closes touch the buckets of [start, end): ``touched``: a closed month lies in
    the range or an adjustment is booked there (the figures are not the live computation's
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
    closed, booked, runs = _closes(start, end, closed)
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
        touched=booked or bool(stretches),
        shut=shut,
        runs=stretches,
        close_ids=sorted(closed.values()),
    )


def _bucket_of(
    start: dt.date, end: dt.date, period: str, zone: dt.tzinfo
) -> tuple[list[_Bucket], Callable[[dt.date], _Bucket] | _Bucket]:
    """The buckets of [start, end), and how a stored row finds its own: by its day, or the
    one bucket of period "all"."""
    buckets = _buckets(start, end, period, zone)
    if period == "all":
        return buckets, buckets[0]
    by_key = {b.key: b for b in buckets}
    return buckets, lambda day: by_key[_bucket_key(day, period, start)]


def booked_segments(
    *,
    start: dt.date,
    end: dt.date,
    period: str,
    filters: Filters,
    loaded: _Loaded,
    by_class: bool = False,
) -> list[_Segment]:
    """The adjustments booked in [start, end) (late data of closed months, stored when it
    was written: ``billing.adjustments``), each in the bucket of the day it is booked on,
    per GPU (or price class), attribution, terms and the day it corrects (by day) or that
    day's month (by any longer period: a row adjusts a month)."""
    _, bucket = _bucket_of(start, end, period, loaded.zone)
    where = _adjustments_in(start, end)
    return frozen_segments(
        where=where,
        loaded=_with_gpus_of(where, loaded, filters),
        filters=filters,
        bucket=bucket,
        by_class=by_class,
        period=period,
    )


def _with_gpus_of(where: Q, loaded: _Loaded, filters: Filters) -> _Loaded:
    """``loaded`` with the GPUs of the adjustments ``where`` selects that it lacks: a GPU
    retired before the range still has its late data booked in it."""
    rows = ClosedSegment.objects.filter(where, close__closed=True)
    missing = set(rows.values_list("gpu_id", flat=True).distinct()) - loaded.gpus.keys()
    if not missing:
        return loaded
    rows = rows.filter(gpu_id__in=missing)
    first = rows.aggregate(first=Min("adjusts"))["first"]
    uuids = set(rows.values_list("gpu__uuid", flat=True).distinct())
    if filters.gpus:
        uuids &= set(filters.gpus)
    if not uuids:
        return loaded
    more = _load(
        start=first,
        end=first + dt.timedelta(days=1),
        filters=dataclasses.replace(filters, gpus=tuple(sorted(uuids))),
        now=loaded.now,
    )
    loaded.names.nodes.update(more.names.nodes)
    return dataclasses.replace(loaded, gpus={**more.gpus, **loaded.gpus})


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
) -> _Computation:
    """``_compute``, with closed months' frozen rows standing for their days and the
    adjustments booked in the range added (``by_class`` for the open months' own figures
    and the closed months' alike). Nothing here looks for late data: it was booked when it
    was written."""
    closed, booked, runs = _closes(start, end)
    if not booked and all(not is_closed for _, _, is_closed in runs):
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
    all_buckets, bucket_of = _bucket_of(start, end, period, loaded.zone)

    def bucket_for(day: dt.date) -> _Bucket:
        return bucket_of if isinstance(bucket_of, _Bucket) else bucket_of(day)

    base: _Computation | None = None
    additive = True  # the closed days and the adjustments add up over any buckets
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
    # while the frozen segments are read here) and taken last.
    parts: list[list[_Segment] | tuple[dt.date, Callable[[], _Computation]]] = []
    beside = False  # whether the first open stretch is being read beside
    for run_start, run_end, is_closed in runs:
        if is_closed:
            months = period in ("all", "month")
            parts.append(
                frozen_segments(
                    where=_closed_run(run_start, run_end, months=months),
                    loaded=loaded,
                    filters=filters,
                    bucket=bucket_of,
                    by_class=by_class,
                    days=None if months else (run_start, run_end),
                    period=period,
                )
            )
            continue
        if together and run_start != open_runs[0][0]:
            continue  # (read with the first open stretch)
        made = functools.partial(open_part, run_start, run_end)
        parts.append((run_start, made if beside else read_beside(made)))
        beside = True
    if booked:
        parts.append(
            booked_segments(
                start=start,
                end=end,
                period=period,
                filters=filters,
                loaded=loaded,
                by_class=by_class,
            )
        )
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


def late_data_of(close: MonthClose, *, now: dt.datetime) -> tuple[list[_Segment], _Computation]:
    """What is still to book for closed ``close``: its month computed from the rollups now,
    per GPU and day, less its frozen day rows and the adjustments booked for it already,
    netted per GPU, node, attribution, terms and day corrected (``late_data``); and the
    computation (names, terms) the segments are priced in. Nothing: an empty list."""
    month, end = close.month, month_after(close.month)
    loaded = _load(start=month, end=end, filters=Filters(), now=now)
    live = _compute(start=month, end=end, period="day", filters=Filters(), now=now, loaded=loaded)
    (bucket,) = _buckets(month, end, "all", loaded.zone)
    for segment in live.segments:
        segment.adjusts, segment.bucket = segment.bucket.key, bucket
    frozen = frozen_segments(
        where=Q(close=close, whole_month=False),
        loaded=loaded,
        filters=Filters(),
        bucket=bucket,
        sign=-1,
    )
    return late_data(live.segments + frozen, loaded.names, by_class=False), live


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
        key += (*gpu.price_class(segment.phase), segment.site_terms or names.site(segment.site_id))
        key += (gpu.model_key, segment.pool_id, segment.team_id)
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


def _closed_run(start: dt.date, end: dt.date, *, months: bool) -> Q:
    """The closes' own rows of the closed days [start, end) (not the adjustments booked
    there): a row per GPU and day, or with ``months`` the month rows of the whole months
    among them and the day rows of the rest."""
    days = Q(whole_month=False, adjusts__isnull=True, day__gte=start, day__lt=end)
    first = start if start.day == 1 else month_after(start)
    last = end.replace(day=1)
    if not months or last <= first:
        return days
    inside = Q(day__gte=first, day__lt=last)
    if (first, last) == (start, end):  # whole months only: read by their partial index
        return inside & Q(whole_month=True)
    return (Q(whole_month=True) & inside) | (days & ~inside)


def _wholly_closed(bucket: _Bucket, zone: dt.tzinfo, closed: dict[dt.date, int]) -> bool:
    day = bucket.local_start.date()
    last = bucket.local_end.date()
    while day < last:
        if day.replace(day=1) not in closed:
            return False
        day = month_after(day)
    return True
