"""Month close (docs/finance.md): freeze a month's figures, reopen it with a reason, and book
late data for closed months when it is written (DESIGN.md §9.1).

This module is the only way a month is closed or reopened (``close_month``, ``reopen_month``,
the admin's add form and actions): each records a ``MonthCloseEvent`` (who, when, why) and
a close is never deleted.

A close stores the month's segments (per GPU, local day, attribution and rate: the rollups'
sums and offline hours, and the terms they were priced at) as ``ClosedSegment`` rows, and
its days summed by price class as ``ClosedClassDay`` rows; from then on every figure of the
month is read from them (``billing.selectors.closing``). Closing twice changes nothing; an
incomplete month (not yet ended in the report time zone) is refused. The row lock on the
``MonthClose`` makes two closes at once one close.

Whatever changes a closed month's figures marks it stale (``ClosedMonthStale``: triggers on
the hourly rollup table, ``billing.signals`` for profiles, sites, attribution and service
dates); ``adjust_closed`` (the task every 5 minutes, ``manage.py adjust_closed``, and each
close first) books the difference as adjustment rows of its close in the first open month.
Reopening deletes the month's frozen rows and its adjustments.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from django.db import transaction
from django.utils import timezone

from billing.models import (
    ClosedClassDay,
    ClosedMonthStale,
    ClosedSegment,
    MonthClose,
    MonthCloseEvent,
)
from billing.selectors.calendar import month_after
from billing.selectors.closing import (
    _AT,
    _TERMS,
    booking_month,
    class_days_store,
    closed_months,
    late_data_of,
    segment_columns,
)
from billing.selectors.sums import _compute as compute_live
from billing.selectors.types import Filters, _Computation, _Segment
from fleet.models import FleetSettings
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS

logger = logging.getLogger(__name__)

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


def segment_row(segment: _Segment, computation: _Computation) -> dict[str, Any]:
    """The ``ClosedSegment`` fields of one segment of ``computation``: its GPU, node and
    attribution, the day it corrects (an adjustment's), its sums, offline hours and terms."""
    return {
        "gpu_id": segment.gpu.id,
        "node_id_at": segment.node_id,
        "pool_id_at": segment.pool_id,
        "team_id_at": segment.team_id,
        "site_id_at": segment.site_id,
        "adjusts": segment.adjusts,
        **segment_columns(segment, computation),
    }


def closing_rows(month: dt.date, computation: _Computation) -> list[dict[str, Any]]:
    """The ``ClosedSegment`` fields a close stores of its month's computation (per day): one
    row per segment, and those summed per GPU, attribution and terms over the month
    (``whole_month``, with the days they sum: ``days``)."""
    rows: list[dict[str, Any]] = []
    months: dict[tuple[Any, ...], dict[str, Any]] = {}
    for segment in computation.segments:
        fields = {"day": segment.bucket.key, **segment_row(segment, computation)}
        rows.append(fields)
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
    # Late data of earlier closed months not booked yet is booked first: in this month,
    # the first open one, before it is frozen with it.
    adjust_closed(now=now)
    with transaction.atomic():
        close, _ = MonthClose.objects.select_for_update().get_or_create(
            month=month,
            defaults={"closed": False, "closed_at": now, "closed_by": by, "zone": zone.key},
        )
        if close.closed:
            return CloseResult(close, False, f"{month:%Y-%m} was already closed")
        # The month as the rollups hold it now, per day: its adjustments (late data of
        # earlier closed months booked in it) are stored rows already and stay as they are.
        computation = compute_live(
            start=month, end=month_after(month), period="day", filters=Filters(), now=now
        )
        ClosedSegment.objects.filter(close=close).delete()
        rows = [ClosedSegment(close=close, **fields) for fields in closing_rows(month, computation)]
        ClosedSegment.objects.bulk_create(rows, batch_size=2000)
        ClosedMonthStale.objects.filter(month=month).delete()  # frozen as it is now
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
        # Its frozen rows and the adjustments booked for it: its figures are live again.
        ClosedSegment.objects.filter(close=close).delete()
        ClosedClassDay.objects.filter(close=close).delete()
        ClosedMonthStale.objects.filter(month=month).delete()
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


# --- late data, booked when it is written (DESIGN.md §9.1) --------------------------------------


def closed_stale_mark(*, months: Iterable[dt.date] | None = None) -> int:
    """Mark closed months stale (``months``, else every closed month): something their
    figures depend on changed. In the caller's transaction; → how many were marked."""
    closed = MonthClose.objects.filter(closed=True)
    if months is not None:
        closed = closed.filter(month__in=list(months))
    now = timezone.now()
    marks = [
        ClosedMonthStale(month=m, token=uuid.uuid4().hex, marked_at=now)
        for m in closed.values_list("month", flat=True)
    ]
    ClosedMonthStale.objects.bulk_create(
        marks, update_conflicts=True, unique_fields=["month"], update_fields=["token", "marked_at"]
    )
    return len(marks)


@dataclass(frozen=True)
class AdjustResult:
    booked: dict[dt.date, int]  # closed month → adjustment rows booked for it now
    message: str


def adjust_closed(*, every: bool = False, now: dt.datetime | None = None) -> AdjustResult:
    """Book the late data of the closed months marked stale (``every``: of every closed
    month, whether marked or not), oldest first, each in its own transaction: what the
    month computed now differs from its frozen rows plus the adjustments booked for it
    already, stored as adjustment rows in the first open month. Booking twice books nothing
    the second time; two runs at once book once (a row lock on the close)."""
    now = now or timezone.now()
    months = MonthClose.objects.filter(closed=True).values_list("month", flat=True)
    if not every:
        months = months.filter(month__in=ClosedMonthStale.objects.values("month"))
    # Marks of months no longer closed (reopened since) mean nothing.
    ClosedMonthStale.objects.exclude(
        month__in=MonthClose.objects.filter(closed=True).values("month")
    ).delete()
    booked = {month: _book(month, every=every, now=now) for month in sorted(months)}
    rows = sum(booked.values())
    message = ", ".join(f"{m:%Y-%m}: {n} rows" for m, n in booked.items()) or "nothing stale"
    return AdjustResult(booked, f"booked {rows} adjustment rows ({message})")


def _book(month: dt.date, *, every: bool, now: dt.datetime) -> int:
    """Book one closed month's late data under a row lock on its close → rows stored."""
    with transaction.atomic():
        close = MonthClose.objects.select_for_update().filter(month=month, closed=True).first()
        mark = ClosedMonthStale.objects.filter(month=month).first()
        if close is None or (mark is None and not every):
            return 0  # reopened, or booked by another run while this one waited
        booked_in = booking_month(month, closed_months())
        segments, computation = late_data_of(close, now=now)
        rows = [
            ClosedSegment(
                close=close,
                day=booked_in,
                booked_at=now,
                **segment_row(segment, computation),
            )
            for segment in segments
        ]
        ClosedSegment.objects.bulk_create(rows, batch_size=2000)
        if mark is not None:  # unless marked again meanwhile: then the next run books that
            ClosedMonthStale.objects.filter(pk=mark.pk, token=mark.token).delete()
    if rows:
        logger.info(
            "closed %s: %d adjustment rows booked in %s",
            f"{month:%Y-%m}",
            len(rows),
            f"{booked_in:%Y-%m}",
        )
    return len(rows)
