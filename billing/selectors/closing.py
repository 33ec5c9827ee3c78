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
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from django.db.models import Q

from billing import cost_model as cm
from billing.models import ClosedSegment, MonthClose
from billing.selectors.calendar import _bucket_key, _buckets, month_after
from billing.selectors.loading import _load, _Loaded
from billing.selectors.sums import _compute, _segment_kept
from billing.selectors.types import (
    Filters,
    _Acc,
    _Bucket,
    _Computation,
    _GpuInfo,
    _Segment,
    _SiteTerms,
)
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


def frozen_segments(
    *,
    where: Q,
    loaded: _Loaded,
    filters: Filters,
    bucket_for: Callable[[dt.date], _Bucket],
    sign: int = 1,
) -> list[_Segment]:
    """The stored segments of closed months that ``where`` selects, each GPU standing in with
    the rate it was priced at then. ``sign`` 1: as stored (an adjustment a closed month
    carried stays one); -1: negated, as the frozen part of a new adjustment, which adjusts
    the segment's own day."""
    rows = ClosedSegment.objects.filter(where, close__closed=True)
    stand_ins: dict[tuple[Any, ...], _GpuInfo] = {}
    names = loaded.names
    out: list[_Segment] = []
    fields = ("day", "gpu_id", "node_id_at", "pool_id_at", "team_id_at", "site_id_at")
    for *row, figures, carried in rows.values_list(*fields, "figures", "adjusts"):
        day, gpu_id, node_id, pool_id, team_id, site_id = row
        gpu = loaded.gpus.get(gpu_id)
        if gpu is None:  # filtered out, or retired before the query
            continue
        rate, kind = Decimal(figures["rate"]), figures["kind"]
        stand_in = stand_ins.get((gpu_id, rate, kind))
        if stand_in is None:
            stand_in = stand_ins[(gpu_id, rate, kind)] = dataclasses.replace(
                gpu,
                terms=cm.CostTerms(kind=kind) if kind else None,
                rates=(rate, rate, rate),
                boundary_hour=None,
            )
        segment = _Segment(
            gpu=stand_in,
            bucket=bucket_for(day),
            phase=0,
            node_id=node_id,
            pool_id=pool_id,
            team_id=team_id,
            site_id=site_id,
            sums={f: sign * float(figures["sums"].get(f, 0.0)) for f in _SUM_FIELDS},
            offline_h=sign * Decimal(figures["offline_h"]),
            site_terms=_SiteTerms(
                name=figures["site"],
                pue=Decimal(figures["pue"]),
                price_per_kwh=Decimal(figures["price_per_kwh"]),
                grid_g_per_kwh=Decimal(figures["grid_g_per_kwh"]),
            ),
            adjusts=carried if sign > 0 else (carried or day),
        )
        if _segment_kept(segment, filters, names):
            out.append(segment)
    missing = {s.node_id for s in out if s.node_id is not None} - names.nodes.keys()
    if missing:  # nodes a GPU has since left
        names.nodes.update(Node.objects.filter(pk__in=missing).values_list("id", "hostname"))
    return out


def segment_figures(segment: _Segment, computation: _Computation) -> dict[str, Any]:
    """What ``ClosedSegment.figures`` keeps of one live segment (see there)."""
    site = segment.site_terms or computation.names.site(segment.site_id)
    gpu = segment.gpu
    return {
        "sums": {f: segment.sums.get(f, 0.0) for f in _SUM_FIELDS},
        "offline_h": str(segment.offline_h),
        "rate": str(gpu.rates[segment.phase]),
        "kind": gpu.kind or "",
        "site": site.name,
        "pue": str(site.pue),
        "price_per_kwh": str(site.price_per_kwh),
        "grid_g_per_kwh": str(site.grid_g_per_kwh),
    }


def _closes(
    start: dt.date, end: dt.date
) -> tuple[dict[dt.date, int], dict[dt.date, dt.date], list[tuple[dt.date, dt.date, bool]]]:
    """The closed months; those whose late data is booked in [start, end) → the day it is
    booked on (the first day of the booking month); and [start, end) in open and closed runs."""
    closed = closed_months()
    bookings = {m: booking_month(m, closed) for m in closed}
    booked_here = {m: b for m, b in bookings.items() if start <= b < end}
    return closed, booked_here, list(_runs(start, end, closed))


def touched_by_closes(start: dt.date, end: dt.date) -> bool:
    """Whether a closed month lies in [start, end) or books its late data there: then the
    figures are not the live computation's alone."""
    _, booked_here, runs = _closes(start, end)
    return bool(booked_here) or any(is_closed for _, _, is_closed in runs)


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
    """``_compute``, with closed months frozen and their late data booked as adjustments
    (``by_class`` for the open months' own figures, never for the late data's)."""
    closed, booked_here, runs = _closes(start, end)
    if not booked_here and all(not is_closed for _, _, is_closed in runs):
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

    segments: list[_Segment] = []
    base: _Computation | None = None
    for run_start, run_end, is_closed in runs:
        if is_closed:
            segments += frozen_segments(
                where=Q(day__gte=run_start, day__lt=run_end),
                loaded=loaded,
                filters=filters,
                bucket_for=bucket_for,
            )
            continue
        part = _compute(
            start=run_start,
            end=run_end,
            period=period,
            filters=filters,
            now=now,
            loaded=loaded,
            by_class=by_class,
        )
        for segment in part.segments:
            segment.bucket = bucket_for(segment.bucket.key if period != "all" else run_start)
        segments += part.segments
        base = base or part
    for month, booked_on in booked_here.items():
        # Late data for ``month``: now less frozen, per day, GPU and attribution, booked on
        # the first day of the query in its booking month.
        bucket = bucket_for(booked_on)
        month_end = month_after(month)
        month_loaded = _load(start=month, end=month_end, filters=filters, now=now)
        live = _compute(
            start=month, end=month_end, period="day", filters=filters, now=now, loaded=month_loaded
        )
        for segment in live.segments:
            segment.adjusts = segment.bucket.key
            segment.bucket = bucket
        segments += live.segments
        # Less what was frozen: the month's own segments, and the adjustments for it that
        # later months carried when they closed (booked there already).
        segments += frozen_segments(
            where=Q(day__gte=month, day__lt=month_end, adjusts__isnull=True)
            | Q(adjusts__gte=month, adjusts__lt=month_end),
            loaded=month_loaded,
            filters=filters,
            bucket_for=lambda _day, bucket=bucket: bucket,  # type: ignore[misc]
            sign=-1,
        )
        loaded.names.nodes.update(month_loaded.names.nodes)
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
    )


def _wholly_closed(bucket: _Bucket, zone: dt.tzinfo, closed: dict[dt.date, int]) -> bool:
    day = bucket.local_start.date()
    last = bucket.local_end.date()
    while day < last:
        if day.replace(day=1) not in closed:
            return False
        day = month_after(day)
    return True
