"""How many cost rows each period bucket of a query holds, without computing the rows: what a
limit/offset page needs for its ``count`` and to find the buckets its rows lie in.

A row is a group of segments (``costs._groups``). A GPU gives a bucket its segments where it
has rollup rows there (stored attribution) or offline hours (current attribution): every
bucket its capacity reaches, since without rows its offline hours are its capacity. So where
every rollup row of a GPU in the range carries its current attribution ("plain"), its rows
are those of the buckets its capacity reaches, under its current group, plus the buckets
outside them where it has rollup rows anyway (data before its service start, after its
retirement or with no service start: a short index read per GPU). That is arithmetic on the
buckets, not a computation of 24 × 365 GPU-hours. The other GPUs (moved between nodes,
pools, teams or sites within the months of the range, as the monthly pre-aggregate tells) are
computed the usual way, restricted to them.

Closed months: a closed bucket's rows are those its close stored (one per group of the
stored rows' attribution, read by one grouped statement, never priced), the moved GPUs'
computed, plus every adjustment row (late data booked in the range, adjustments the closed
months carried), which only their computation tells (it is what a page computes of them
anyway: the GPUs that moved). A bucket across a close's edge (a week, the whole range) is
counted in pieces split at the first day of each month in it, each wholly open or closed:
its rows are the union of its pieces' keys and of the moved GPUs' computed in it. The plain
path (SQLite, a report zone the pre-aggregates are not built for) has no such arithmetic:
``None``, and the caller computes every row as before.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from django.db.models import F, IntegerField, Q
from django.db.models.expressions import RawSQL

from billing import cost_model as cm
from billing.models import ClosedSegment
from billing.selectors.calendar import _buckets, _local_midnight, month_after
from billing.selectors.closing import BucketCloses, bucket_closes, closed_months
from billing.selectors.literals import array_literal, by_id, dates_literal
from billing.selectors.loading import _Loaded
from billing.selectors.sums import _kept_now
from billing.selectors.types import Filters, _Bucket, _GpuInfo, _NamesAndSiteTerms
from config.replica import read_cursor
from fleet.models import Node

# (bucket index, group key) of the rows of GPUs computed the usual way.
Computed = Callable[[Filters], set[tuple[int, str]]]
# The bucket index of each adjustment row (late data, a closed month's carried adjustments).
Adjustments = Callable[[], list[int]]
GroupKey = Callable[[_GpuInfo, _NamesAndSiteTerms], str]


@dataclasses.dataclass(frozen=True)
class BucketCounts:
    """The buckets of a query and how many rows each holds."""

    buckets: list[_Bucket]
    counts: list[int]


# The GPUs whose monthly rows in the months of the range carry another attribution than
# theirs now. Constant SQL: the values come as arrays.
# Each GPU's attribution now as dense arrays by GPU id (``literals.by_id``: 0 for none, -1
# for a GPU not asked about): one lookup a row, no join of 10,000 unnested ids.
_MOVED_SQL = """
SELECT DISTINCT m.gpu_id
FROM telemetry_monthlyusage m
WHERE m.month >= %(first)s AND m.month < %(last)s
  AND m.gpu_id > %(base)s AND m.gpu_id <= %(top)s
  AND (%(nodes)s::bigint[])[m.gpu_id - %(base)s] >= 0
  AND (coalesce(m.node_id, 0) <> (%(nodes)s::bigint[])[m.gpu_id - %(base)s]
       OR coalesce(m.pool_id, 0) <> (%(pools)s::bigint[])[m.gpu_id - %(base)s]
       OR coalesce(m.team_id, 0) <> (%(teams)s::bigint[])[m.gpu_id - %(base)s]
       OR coalesce(m.site_id, 0) <> (%(sites)s::bigint[])[m.gpu_id - %(base)s])
"""

# The hours with rollup rows of each GPU in [window start, capacity end) outside its capacity
# [lo, hi): two index ranges per GPU (empty as a rule).
_OUTSIDE_SQL = """
SELECT c.gpu_id, u.hour
FROM (
    SELECT gpu_id, 'epoch'::timestamptz + lo_us * interval '1 microsecond' AS lo,
           'epoch'::timestamptz + hi_us * interval '1 microsecond' AS hi
    FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS a(gpu_id, lo_us, hi_us)
) c
CROSS JOIN LATERAL (
    SELECT h.hour FROM telemetry_hourlyusage h
    WHERE h.gpu_id = c.gpu_id AND h.hour >= %s AND h.hour < LEAST(c.lo, %s)
    UNION ALL
    SELECT h.hour FROM telemetry_hourlyusage h
    WHERE h.gpu_id = c.gpu_id AND h.hour >= GREATEST(c.hi, %s) AND h.hour < %s
) u
"""


def bucket_counts(
    *,
    loaded: _Loaded,
    start: dt.date,
    end: dt.date,
    parts: Sequence[tuple[dt.date, dt.date]],
    period: str,
    filters: Filters,
    group_by: str,
    group_key: GroupKey,
    computed: Computed,
    adjustments: Adjustments,
) -> BucketCounts | None:
    """The rows per bucket of ``cost_rows_in_parts`` over ``parts`` (GPUs retired before a
    part's start are not in it), or None where only computing them tells. ``group_key``: a
    GPU's group at its current attribution; ``computed(filters)``: the (bucket index, key)
    of the rows (not the adjustments) the usual computation gives under ``filters`` (for
    the moved GPUs); ``adjustments()``: the bucket index of each adjustment row."""
    if not loaded.daily_zone:
        return None
    zone, now, names = loaded.zone, loaded.now, loaded.names
    buckets = _buckets(start, end, period, zone)
    # A bucket across a close's edge (a week, the whole range) is counted in pieces, each
    # wholly open or wholly closed, and its rows are the union of its pieces' keys.
    closed = closed_months()
    pieces, owner = _pieces(buckets, set(closed), zone)
    closes = bucket_closes(start, end, pieces, closed)
    if closes is None:
        return None
    starts = [b.start for b in pieces]
    ends = [b.end for b in pieces]
    window_start, window_end = starts[0], ends[-1]
    capacity_end = max(window_start, min(window_end, now))
    # The window start of the part each piece is computed in (a bucket's, parts' edges are
    # buckets' edges).
    part_starts = [_local_midnight(first, zone).astimezone(dt.UTC) for first, _ in parts]
    part_of = [max(0, bisect.bisect_right(part_starts, b.start) - 1) for b in pieces]
    of_bucket: list[list[int]] = [[] for _ in buckets]  # each bucket's pieces
    for i, j in enumerate(owner):
        of_bucket[j].append(i)

    gpus = loaded.gpus
    moved = _moved(gpus, start, end)
    if closes.touched:
        # Closed days' rows come from their stored rows: a GPU retired inside the window
        # (in some parts and not others) is counted as the moved ones are.
        moved |= {g.id for g in gpus.values() if g.retired_at and g.retired_at > window_start}
    plain = [g for g in gpus.values() if g.id not in moved]
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    reach: dict[int, tuple[int, int, str]] = {}  # kept plain GPU → its buckets and key
    caps: dict[int, tuple[dt.datetime, dt.datetime]] = {}
    for gpu in plain:
        if not _kept_now(gpu, filters, names):
            continue  # every row of it carries this attribution: none is kept
        cap = cm.capacity_interval(
            service_start=gpu.service_start,
            retired_at=gpu.retired_at,
            start=window_start,
            end=window_end,
            now=now,
        )
        lo, hi = cap or (capacity_end, capacity_end)
        first, last = bisect.bisect_right(ends, lo), bisect.bisect_left(starts, hi)
        key = group_key(gpu, names)
        if cap is not None and first < last:
            spans[key].append((first, last))
        reach[gpu.id] = (first, last if cap is not None else first, key)
        if lo > window_start or hi < capacity_end:  # else no hour is outside its capacity
            caps[gpu.id] = (lo, hi)

    more: set[tuple[int, str]] = set()
    for gpu_id, hour in _outside(caps, window_start, capacity_end):
        i = bisect.bisect_right(starts, hour) - 1
        first, last, key = reach[gpu_id]
        if i < 0 or hour >= ends[i] or first <= i < last or closes.shut[i]:
            continue
        retired = gpus[gpu_id].retired_at
        if retired is None or retired > part_starts[part_of[i]]:
            more.add((i, key))
    across: dict[int, set[str]] = defaultdict(set)  # a bucket in pieces → moved GPUs' keys
    if moved:
        uuids = tuple(sorted(gpus[g].uuid for g in moved))
        for j, key in computed(dataclasses.replace(filters, gpus=uuids)):
            if len(of_bucket[j]) == 1:
                more.add((of_bucket[j][0], key))
            else:
                across[j].add(key)

    steps = [0] * (len(pieces) + 1)
    covered: dict[str, list[tuple[int, int]]] = {}
    for key, found in spans.items():
        merged = covered[key] = _merged(found)
        for first, last in merged:
            steps[first] += 1
            steps[last] -= 1
    counts, running = [], 0
    for step in steps[:-1]:
        running += step
        counts.append(running)
    shut_more: dict[int, set[str]] = defaultdict(set)
    for i, key in more:
        if closes.shut[i]:
            shut_more[i].add(key)
        elif not any(first <= i < last for first, last in covered.get(key, ())):
            counts[i] += 1
    stored: dict[int, int | set[str]] = {}
    if closes.touched:
        # By GPU a piece of a bucket across a close's edge lists its GPUs (the bucket's
        # rows are the union of its pieces' keys); every other closed bucket counts them.
        across_edge = {i for ids in of_bucket if len(ids) > 1 for i in ids}
        stored = _closed_keys(
            loaded, pieces, closes, filters, group_by, skip=moved, listed=across_edge
        )
        for i, shut in enumerate(closes.shut):
            if shut:
                held = stored.get(i, 0)
                if isinstance(held, int):  # by GPU: the moved GPUs' keys are their own
                    counts[i] = held + len(shut_more[i])
                else:
                    counts[i] = len(held | shut_more[i])
    totals = [counts[ids[0]] for ids in of_bucket]
    for j, ids in enumerate(of_bucket):
        if len(ids) > 1:  # the keys of its pieces, and of the moved GPUs' rows in it
            keys = set(across[j])
            for i in ids:
                if closes.shut[i]:
                    held = stored.get(i, set())
                    assert isinstance(held, set)
                    keys |= held | shut_more[i]
                else:
                    keys |= {k for k, spans in covered.items() if any(a <= i < b for a, b in spans)}
                    keys |= {k for at, k in more if at == i}
            totals[j] = len(keys)
    if closes.touched:
        for j in adjustments():
            totals[j] += 1
    return BucketCounts(buckets=buckets, counts=totals)


def _pieces(
    buckets: list[_Bucket], closed: set[dt.date], zone: dt.tzinfo
) -> tuple[list[_Bucket], list[int]]:
    """``buckets`` with each one that lies partly in a closed month split at the first day of
    each month in it, and the index of the bucket each piece is of."""
    pieces, owner = [], []
    for j, bucket in enumerate(buckets):
        first, last = bucket.local_start.date(), bucket.local_end.date()
        edges, day = [first], month_after(first.replace(day=1))
        while day < last:
            edges.append(day)
            day = month_after(day)
        if len({e.replace(day=1) in closed for e in edges}) == 1:  # wholly open or closed
            pieces.append(bucket)
            owner.append(j)
            continue
        for a, b in zip(edges, [*edges[1:], last], strict=True):
            local_start = bucket.local_start if a == first else _local_midnight(a, zone)
            local_end = bucket.local_end if b == last else _local_midnight(b, zone)
            pieces.append(
                dataclasses.replace(
                    bucket,
                    start=local_start.astimezone(dt.UTC),
                    end=local_end.astimezone(dt.UTC),
                    local_start=local_start,
                    local_end=local_end,
                )
            )
            owner.append(j)
    return pieces, owner


# The closed days' rows, as ``closing.frozen_segments`` reads them for a page, per bucket
# and group: the rows (not the adjustments) a close stored, of the GPUs of the computation
# (a dense array by GPU id: the group's code of each, or -1), at the filters' attribution.
# They are read from the month rows (``m``, ``closing_rows``) by the days each holds (a bit
# per day, ``ClosedSegment.days``; every day where a row of a close made before them has
# none): a month row stands for its day rows. Per group (``key``) and month, the days of
# its rows together; by GPU counted per set of days (``n``: a few sets, not a row per GPU)
# but in the months of the buckets whose GPUs are listed (``listed``). Constant SQL around
# Django's statement.
_CLOSED_KEYS_SQL = """
WITH g AS (
    SELECT m.key, m.day, bit_or(coalesce(m.days, 2147483647)) AS days
    FROM ({rows}) AS m GROUP BY 1, 2
)
SELECT NULL, day, days, count(*) FROM g WHERE %s GROUP BY 2, 3
UNION ALL
SELECT key, day, days, 1 FROM g WHERE NOT %s OR day = ANY(%s::date[])
"""


def _closed_keys(
    loaded: _Loaded,
    buckets: list[_Bucket],
    closes: BucketCloses,
    filters: Filters,
    group_by: str,
    *,
    skip: set[int],
    listed: set[int],
) -> dict[int, int | set[str]]:
    """Per closed bucket index: by GPU the number of its rows (``listed``, or a bucket across
    two closed months: their keys), else the keys of its rows."""
    names = loaded.names
    members = [
        g
        for g in loaded.gpus.values()
        if g.id not in skip
        and (not filters.models or g.model_key in filters.models)
        and (not filters.gpus or g.uuid in filters.gpus)
    ]
    if not members:
        return {}
    # Each closed bucket's days, by the months it lies in: {index: [(month, days)]}.
    wanted: dict[int, list[tuple[dt.date, int]]] = {}
    for i, shut in enumerate(closes.shut):
        if not shut:
            continue
        day, last = buckets[i].local_start.date(), buckets[i].local_end.date()
        parts = wanted[i] = []
        while day < last:
            upto = min(last, month_after(day))
            parts.append((day.replace(day=1), ((1 << (upto - day).days) - 1) << (day.day - 1)))
            day = upto
    counted = group_by == "gpu"
    if counted:  # a bucket across two months must not count a GPU twice: listed too
        listed = listed | {i for i, parts in wanted.items() if len(parts) > 1}
    # A model's rows are its GPUs' (the model they have now, as the frozen rows are priced).
    models = sorted({g.model_key for g in members}) if group_by == "model" else []
    codes, base, top = by_id(
        {g.id: models.index(g.model_key) if models else 0 for g in members}, -1
    )
    code = RawSQL("(%s::int[])[gpu_id - %s]", (array_literal(codes), base), IntegerField())
    column = {"node": "node_id_at", "team": "team_id_at", "pool": "pool_id_at"}
    column |= {"site": "site_id_at", "model": "code", "fleet": "code", "gpu": "gpu_id"}
    months = sorted({month for parts in wanted.values() for month, _ in parts})
    rows = (
        ClosedSegment.objects.filter(
            close_id__in=closes.close_ids, whole_month=True, day__in=months
        )
        .filter(_kept_at(filters, names), gpu_id__gt=base, gpu_id__lte=top)
        .annotate(code=code, key=F(column[group_by]))
        .filter(code__gte=0)
        .values("key", "day", "days")
    )
    sql, params = rows.query.sql_with_params()
    listed_months = sorted({month for i in listed if i in wanted for month, _ in wanted[i]})
    with read_cursor() as cursor:
        cursor.execute(
            _CLOSED_KEYS_SQL.format(rows=sql),
            [*params, counted, counted, dates_literal(listed_months)],
        )
        found = cursor.fetchall()
    if group_by == "node":
        missing = {n for n, _, _, _ in found if n is not None} - names.nodes.keys()
        if missing:  # nodes a GPU has since left
            names.nodes.update(Node.objects.filter(pk__in=missing).values_list("id", "hostname"))
    by_month: dict[dt.date, list[tuple[Any, int, int]]] = defaultdict(list)
    for key, month, days, count in found:
        by_month[month].append((key, days, count))
    out: dict[int, int | set[str]] = {}
    uuids = {g.id: g.uuid for g in members} if counted else {}
    for i, parts in wanted.items():
        if counted and i not in listed:
            out[i] = sum(
                n for key, days, n in by_month[parts[0][0]] if key is None and days & parts[0][1]
            )
            continue
        out[i] = {
            uuids[key] if uuids else _key_at(group_by, key, models, names)
            for month, mask in parts
            for key, days, _ in by_month[month]
            if key is not None and days & mask
        }
    return out


def _bools(values: list[bool]) -> str:
    """Booleans as a PostgreSQL array literal."""
    return "{" + ",".join("t" if v else "f" for v in values) + "}"


def _key_at(group_by: str, value: Any, models: list[str], names: _NamesAndSiteTerms) -> str:
    """The key of a stored row's group (``costs._group_of`` of its segment) from its code."""
    if group_by == "model":
        return models[int(value)]
    if group_by == "fleet":
        return "fleet"
    found = {
        "node": lambda: names.nodes.get(value or 0),
        "team": lambda: names.teams.get(value or 0),
        "pool": lambda: names.pools.get(value or 0),
        "site": lambda: names.site(value).name,
    }[group_by]()
    return found or ""


def _kept_at(filters: Filters, names: _NamesAndSiteTerms) -> Q:
    """The stored rows whose attribution the site, pool and team filters keep
    (``sums._kept`` of their segments)."""
    kept = Q()
    if filters.sites:
        site = Q(site_id_at__in=[i for i, s in names.sites.items() if s.name in filters.sites])
        if names.site(None).name in filters.sites:  # no site, or one not known
            site |= Q(site_id_at__isnull=True) | ~Q(site_id_at__in=list(names.sites))
        kept &= site
    if filters.pools:
        kept &= Q(pool_id_at__in=[i for i, n in names.pools.items() if n in filters.pools])
    if filters.teams:
        kept &= Q(team_id_at__in=[i for i, n in names.teams.items() if n in filters.teams])
    return kept


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    spans.sort()
    out = [spans[0]]
    for first, last in spans[1:]:
        if first <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def _moved(gpus: dict[int, _GpuInfo], start: dt.date, end: dt.date) -> set[int]:
    """The GPUs with a monthly row of another attribution in the months [start, end) touches
    (a superset of the range: a GPU moved just outside it is computed, which is exact too)."""
    if not gpus:
        return set()
    params: dict[str, Any] = {
        "first": start.replace(day=1),
        "last": month_after(end - dt.timedelta(days=1)),
    }
    now_at = {"nodes": "node_id", "pools": "pool_id", "teams": "team_id", "sites": "site_id"}
    for column, name in now_at.items():
        dense, params["base"], params["top"] = by_id(
            {i: getattr(g, name) or 0 for i, g in gpus.items()}, -1
        )
        params[column] = array_literal(dense)
    with read_cursor() as cursor:
        cursor.execute(_MOVED_SQL, params)
        return {row[0] for row in cursor.fetchall()}


def _epoch_us(moment: dt.datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _outside(
    caps: dict[int, tuple[dt.datetime, dt.datetime]],
    window_start: dt.datetime,
    capacity_end: dt.datetime,
) -> list[tuple[int, dt.datetime]]:
    ids = list(caps)  # read even when empty: the queries of a page are the same for any fleet
    with read_cursor() as cursor:
        cursor.execute(
            _OUTSIDE_SQL,
            [
                array_literal(ids),
                array_literal([_epoch_us(caps[i][0]) for i in ids]),
                array_literal([_epoch_us(caps[i][1]) for i in ids]),
                window_start,
                capacity_end,
                window_start,
                capacity_end,
            ],
        )
        return list(cursor.fetchall())
