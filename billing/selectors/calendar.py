"""The report time zone and the period buckets (day, ISO week, month) in it."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

from billing.selectors.types import _Bucket
from fleet.models import zone_or_utc


# --- time zone and buckets ------------------------------------------------------------------
def _local_midnight(day: dt.date, zone: dt.tzinfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=zone)


def month_after(day: dt.date) -> dt.date:
    """The first day of the month after ``day``'s."""
    return (day.replace(day=1) + dt.timedelta(days=32)).replace(day=1)


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
