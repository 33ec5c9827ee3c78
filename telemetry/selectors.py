"""Reads of telemetry for the dashboard, the API and the service metrics."""

from __future__ import annotations

import datetime as dt

from django.db.models import Min, QuerySet
from django.utils import timezone

from telemetry.models import HourlyUsage, RollupPending, Sample


def gpu_hourly_series(
    *, gpu_id: int, start: dt.datetime, end: dt.datetime
) -> QuerySet[HourlyUsage]:
    """The hourly rollup rows of one GPU in ``[start, end)``, oldest first (for charts).

    Hours without samples have no row: a chart shows them as offline.
    """
    return HourlyUsage.objects.filter(gpu_id=gpu_id, hour__gte=start, hour__lt=end).order_by("hour")


def gpu_recent_samples(*, gpu_id: int, since: dt.datetime) -> QuerySet[Sample]:
    """The raw samples of one GPU that start at or after ``since``, oldest first.

    For the GPU detail page (the last hours at the agent's own resolution). Raw rows, as sent:
    fallbacks and the in-service window are the rollup's business, not applied here.
    """
    return Sample.objects.filter(gpu_id=gpu_id, start__gte=since).order_by("start")


def rollup_lag_seconds(*, now: dt.datetime | None = None) -> float:
    """Age in seconds of the oldest pending rollup mark; 0 when every rollup is up to date.

    A mark's ``marked_at`` moves on when the hour is marked again, so this is the time the
    oldest hour has been waiting since its latest change: what a dashboard is behind by. Marks
    set aside after failing are not waiting for the rollup (it passes them by): they are
    counted on their own (:func:`rollup_marks_set_aside`).
    """
    oldest = rollup_marks_queued().aggregate(oldest=Min("marked_at"))["oldest"]
    if oldest is None:
        return 0.0
    return max(float(((now or timezone.now()) - oldest).total_seconds()), 0.0)


def rollup_marks_queued() -> QuerySet[RollupPending]:
    """The marks the rollup will take: every pending hour but those set aside."""
    return RollupPending.objects.filter(set_aside_at__isnull=True)


def rollup_marks_set_aside() -> QuerySet[RollupPending]:
    """The marks set aside after ``ROLLUP_MAX_FAILURES`` failed recomputes, oldest hour first:
    the rollup passes them by until they are put back in the queue."""
    return RollupPending.objects.filter(set_aside_at__isnull=False).order_by("hour")
