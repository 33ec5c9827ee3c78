"""Month close (docs/finance.md): freeze a month's figures, reopen it with a reason.

This module is the only way a month is closed or reopened (``close_month``, ``reopen_month``,
the admin's add form and actions): each records a ``MonthCloseEvent`` (who, when, why) and
a close is never deleted.

A close stores the month's segments (per GPU, local day, attribution and rate: the rollups'
sums and offline hours, and the terms they were priced at) as ``ClosedSegment`` rows, and
its days summed by price class as ``ClosedClassDay`` rows; from then on every figure of the
month is read from them (``billing.selectors.closing``). Closing
twice changes nothing; an incomplete month (not yet ended in the report time zone) is
refused. The row lock on the ``MonthClose`` makes two closes at once one close.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from django.db import transaction
from django.utils import timezone

from billing.models import ClosedClassDay, ClosedSegment, MonthClose, MonthCloseEvent
from billing.selectors.calendar import month_after
from billing.selectors.closing import (
    _AT,
    _TERMS,
    class_days_store,
    close_snapshot,
    close_state,
    compute,
    segment_columns,
)
from billing.selectors.loading import _load
from billing.selectors.types import Filters, _Computation
from fleet.models import FleetSettings
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS

MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


def month_parse(text: str) -> dt.date:
    """``"2026-03"`` → 1 March 2026; ValueError naming ``month`` otherwise."""
    found = MONTH_RE.match(text.strip())
    if not found or not 1 <= int(found.group(2)) <= 12 or int(found.group(1)) < 2000:
        raise ValueError(f"month: {text!r} is not a month (YYYY-MM)")
    return dt.date(int(found.group(1)), int(found.group(2)), 1)


def month_has_ended(*, month: dt.date, zone: ZoneInfo, now: dt.datetime | None = None) -> bool:
    """Whether ``month`` (its first day) has ended in ``zone`` at ``now``."""
    return dt.datetime.combine(month_after(month), dt.time(), tzinfo=zone) <= (
        now or timezone.now()
    )


def month_ended_check(*, month: dt.date, now: dt.datetime | None = None) -> ZoneInfo:
    """The report time zone, once ``month`` has ended in it; ValueError naming ``month``
    before (an incomplete month cannot be closed)."""
    zone = FleetSettings.load().report_zone
    if not month_has_ended(month=month, zone=zone, now=now):
        raise ValueError(f"month: {month:%Y-%m} has not ended in the report time zone ({zone.key})")
    return zone


def closing_rows(month: dt.date, computation: _Computation) -> list[dict[str, Any]]:
    """The ``ClosedSegment`` fields a close stores of its month's computation: one row per
    segment of the month's own, and those summed per GPU, attribution and terms over the
    month (``whole_month``, with the days they sum: ``days``); and its late data for earlier
    closed months as the computation found it (netted per GPU, corrected day, attribution
    and terms: ``closing.late_data``)."""
    rows: list[dict[str, Any]] = []
    months: dict[tuple[Any, ...], dict[str, Any]] = {}
    for segment in computation.segments:
        fields = {
            "day": segment.bucket.key,
            "gpu_id": segment.gpu.id,
            "node_id_at": segment.node_id,
            "pool_id_at": segment.pool_id,
            "team_id_at": segment.team_id,
            "site_id_at": segment.site_id,
            "adjusts": segment.adjusts,
            **segment_columns(segment, computation),
        }
        rows.append(fields)
        if segment.adjusts is None:
            day_bit = 1 << (segment.bucket.key.day - 1)
            month_row = {**fields, "day": month, "whole_month": True, "days": day_bit}
            key = tuple(month_row[k] for k in _MONTH_ROW_BY)
            found = months.get(key)
            if found is None:
                months[key] = month_row
            else:
                for name in (*_SUM_FIELDS, "offline_h"):
                    found[name] += month_row[name]
                found["days"] |= day_bit
    return rows + list(months.values())


# A month row per GPU, attribution and terms: what a closed month is read by.
_MONTH_ROW_BY = ("gpu_id", *_AT, *_TERMS)


@dataclass(frozen=True)
class CloseResult:
    close: MonthClose
    changed: bool  # False: it was closed already (or open already, for a reopen)
    message: str


def month_close(*, month: dt.date, by: str, now: dt.datetime | None = None) -> CloseResult:
    """Freeze ``month`` (its first day). Raises ValueError naming ``month`` when it has not
    ended in the report time zone."""
    now = now or timezone.now()
    zone = month_ended_check(month=month, now=now)
    with transaction.atomic():
        close, _ = MonthClose.objects.select_for_update().get_or_create(
            month=month,
            defaults={"closed": False, "closed_at": now, "closed_by": by, "zone": zone.key},
        )
        if close.closed:
            return CloseResult(close, False, f"{month:%Y-%m} was already closed")
        close.snapshot_xmin, close.snapshot_system = close_snapshot()
        # The month as it stands, with the adjustments booked in it for late data of
        # earlier closed months: frozen with it, with the fleet it was computed for.
        loaded = _load(start=month, end=month_after(month), filters=Filters(), now=now)
        computation = compute(
            start=month,
            end=month_after(month),
            period="day",
            filters=Filters(),
            now=now,
            loaded=loaded,
            adjust_days=True,
        )
        close.gpu_states, close.site_terms = close_state(loaded)
        ClosedSegment.objects.filter(close=close).delete()
        rows = [ClosedSegment(close=close, **fields) for fields in closing_rows(month, computation)]
        ClosedSegment.objects.bulk_create(rows, batch_size=2000)
        close.by_class = class_days_store(close)
        close.closed, close.closed_at, close.closed_by, close.zone = True, now, by, zone.key
        close.segments_count = len(rows)
        close.save()
        MonthCloseEvent.objects.create(close=close, action=MonthCloseEvent.CLOSED, at=now, by=by)
    return CloseResult(close, True, f"closed {month:%Y-%m}: {len(rows)} segments frozen")


def month_reopen(
    *, month: dt.date, by: str, reason: str, now: dt.datetime | None = None
) -> CloseResult:
    """Reopen a closed month: its figures are live again until it is closed again. The
    reason is recorded with who and when (``MonthCloseEvent``); a month with a closed month
    after it is refused (reopen the latest first). Raises ValueError naming ``reason``,
    ``by`` or ``month``."""
    reason = reason.strip()
    if not reason:
        raise ValueError("reason: a reopen needs a reason")
    if not by.strip():
        raise ValueError("by: a reopen needs who reopens it")
    now = now or timezone.now()
    with transaction.atomic():
        close = MonthClose.objects.select_for_update().filter(month=month).first()
        if close is None:
            raise ValueError(f"month: {month:%Y-%m} has never been closed")
        if not close.closed:
            return CloseResult(close, False, f"{month:%Y-%m} is open already")
        later = MonthClose.objects.filter(closed=True, month__gt=month).order_by("-month").first()
        if later is not None:
            # A later closed month may carry adjustments for this one: reopening this alone
            # would count that late data twice. Periods reopen from the latest back.
            raise ValueError(
                f"month: {later.month:%Y-%m} is closed after it; reopen {later.month:%Y-%m} first"
            )
        ClosedSegment.objects.filter(close=close).delete()
        ClosedClassDay.objects.filter(close=close).delete()
        close.closed, close.segments_count, close.by_class = False, 0, False
        close.save()
        MonthCloseEvent.objects.create(
            close=close, action=MonthCloseEvent.REOPENED, at=now, by=by, reason=reason
        )
    return CloseResult(close, True, f"reopened {month:%Y-%m}")


def closed_months_between(*, start: dt.date, end: dt.date) -> list[MonthClose]:
    """The closes of the months that [start, end) touches (the dashboard marks them)."""
    return list(
        MonthClose.objects.filter(closed=True, month__lt=end, month__gte=start.replace(day=1))
    )
