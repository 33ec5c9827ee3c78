"""Writes of telemetry that other apps call."""

from __future__ import annotations

from collections.abc import Iterable

from telemetry.models import HourlyUsage
from telemetry.pending import hours_mark


def gpu_hours_invalidate(*, gpu_ids: Iterable[int]) -> int:
    """Re-mark every rolled-up hour of these GPUs (their in-service window changed)."""
    hours = list(
        HourlyUsage.objects.filter(gpu_id__in=list(gpu_ids))
        .values_list("hour", flat=True)
        .distinct()
    )
    hours_mark(hours)
    return len(hours)
