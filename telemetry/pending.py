"""Marks hours as needing a rollup: cheap on the ingest path (one statement per batch)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.utils import timezone

# The mark itself: insert the hour, or bump its version if it is marked already. The version
# bump is what lets a running rollup tell that an hour was marked again while it was computing
# (it then leaves the mark in place). Ingest's own statements embed the same upsert.
MARK_INSERT = "INSERT INTO telemetry_rolluppending (hour, version, marked_at)"
MARK_CONFLICT = (
    "ON CONFLICT (hour) DO UPDATE SET version = telemetry_rolluppending.version + 1,"
    " marked_at = excluded.marked_at"
)


def hours_mark(hours: Iterable[dt.datetime]) -> None:
    """Mark these UTC hour starts out of date; bumps ``version`` of hours already marked."""
    unique = sorted({h for h in hours})
    if not unique:
        return
    # As Django stores datetimes (naive UTC text on SQLite), so that lookups by hour match.
    adapt = connection.ops.adapt_datetimefield_value
    now = adapt(timezone.now())
    params: list[Any] = []
    for hour in unique:
        params += [adapt(hour), now]
    placeholders = ", ".join(["(%s, 1, %s)"] * len(unique))
    with connection.cursor() as cursor:
        # One upsert for the whole batch.
        cursor.execute(f"{MARK_INSERT} VALUES {placeholders} {MARK_CONFLICT}", params)
