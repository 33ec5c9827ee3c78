"""Daily range partitions of ``telemetry_sample`` on PostgreSQL, and raw-sample retention.

Why daily: retention (``RAW_RETENTION_DAYS``, 35 by default) then drops whole days, so no
sample lives more than a day past its retention and none is deleted row by row; a day of a
large fleet (1,000 GPUs × 1,440 one-minute samples ≈ 1.4 M rows) is a comfortable partition
size; an hourly rollup reads one partition; ~45 partitions (retention plus a week ahead)
cost the planner nothing measurable with pruning. Weekly partitions would keep up to 6 days
of samples past retention and make each drop seven times larger.

Partitions are named ``telemetry_sample_pYYYYMMDD`` and cover ``[day, day + 1)`` in UTC.
``telemetry_sample_default`` catches a sample for a day whose partition does not exist yet
(the periodic task has not run for a week), so nothing is ever lost; the next
:func:`partitions_maintain` moves such rows into their new partition.

On SQLite (the embedded default) the table is a plain table: :func:`partitions_maintain` does
nothing and :func:`retention_apply` deletes old rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import re

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

logger = logging.getLogger(__name__)

PARENT = "telemetry_sample"
DEFAULT_PARTITION = "telemetry_sample_default"
# Days created ahead of today: beat runs the maintenance task every 6 hours (config/celery.py),
# so a week of missed runs still finds its partitions ready.
AHEAD_DAYS = 7
_NAME = re.compile(r"^telemetry_sample_p(\d{8})$")
# DDL on the parent waits for running inserts; never wait long enough to stall ingest behind
# the lock queue. A maintenance run that times out is retried by the next one.
LOCK_TIMEOUT = "5s"


def partition_name(day: dt.date) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def _day_start(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


def _literal(moment: dt.datetime) -> str:
    """A UTC timestamp literal for partition bounds (DDL takes no bound parameters)."""
    return "'" + moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S+00") + "'"


def retention_cutoff(now: dt.datetime) -> dt.datetime:
    """Samples that start before this are past raw retention (ingest refuses them too)."""
    return now - dt.timedelta(days=settings.RAW_RETENTION_DAYS)


def partitions_list() -> dict[dt.date, str]:
    """The daily partitions that exist (the default partition is not listed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass",
            [PARENT],
        )
        names = [row[0] for row in cursor.fetchall()]
    days: dict[dt.date, str] = {}
    for name in names:
        match = _NAME.match(name)
        if match:
            days[dt.datetime.strptime(match.group(1), "%Y%m%d").date()] = name
    return days


def _partition_create(day: dt.date) -> None:
    """Create the partition of ``day``, moving any rows the default partition caught for it."""
    name = partition_name(day)
    lower, upper = _day_start(day), _day_start(day + dt.timedelta(days=1))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {DEFAULT_PARTITION} "  # noqa: S608
            "WHERE start >= %s AND start < %s)",
            [lower, upper],
        )
        caught = cursor.fetchone()[0]
        if not caught:
            cursor.execute(
                f"CREATE TABLE {name} PARTITION OF {PARENT} "
                f"FOR VALUES FROM ({_literal(lower)}) TO ({_literal(upper)})"
            )
            return
        # Rows for this day sit in the default partition: a new partition whose range they
        # fall in cannot be attached until they move (PostgreSQL checks the default).
        cursor.execute(
            f"CREATE TABLE {name} (LIKE {PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute(
            f"WITH moved AS (DELETE FROM {DEFAULT_PARTITION} "  # noqa: S608
            "WHERE start >= %s AND start < %s RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved",
            [lower, upper],
        )
        cursor.execute(
            f"ALTER TABLE {PARENT} ATTACH PARTITION {name} "
            f"FOR VALUES FROM ({_literal(lower)}) TO ({_literal(upper)})"
        )
        logger.info("partition %s created; rows moved from the default partition", name)


def partitions_maintain(*, now: dt.datetime | None = None) -> list[str]:
    """Create the daily partitions from the retention cutoff to ``AHEAD_DAYS`` ahead.

    Returns the names created (none on SQLite). Idempotent; safe while ingest runs.
    """
    if connection.vendor != "postgresql":
        return []
    now = now or timezone.now()
    first = retention_cutoff(now).astimezone(dt.UTC).date()
    last = now.astimezone(dt.UTC).date() + dt.timedelta(days=AHEAD_DAYS)
    existing = partitions_list()
    created: list[str] = []
    day = first
    while day <= last:
        if day not in existing:
            _partition_create(day)
            created.append(partition_name(day))
        day += dt.timedelta(days=1)
    return created


def retention_apply(*, now: dt.datetime | None = None) -> int:
    """Remove raw samples past ``RAW_RETENTION_DAYS``; returns how many rows went.

    PostgreSQL: drops each daily partition that ends at or before the cutoff (whole days, so
    a sample may outlive the cutoff by up to a day) and deletes old rows the default partition
    caught. SQLite: deletes the rows that start before the cutoff.
    """
    now = now or timezone.now()
    cutoff = retention_cutoff(now)
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {PARENT} WHERE start < %s",  # noqa: S608
                [connection.ops.adapt_datetimefield_value(cutoff)],
            )
            return max(int(cursor.rowcount), 0)
    removed = 0
    for day, name in sorted(partitions_list().items()):
        if _day_start(day + dt.timedelta(days=1)) > cutoff:
            continue
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute(f"SELECT count(*) FROM {name}")  # noqa: S608
            removed += int(cursor.fetchone()[0])
            cursor.execute(f"DROP TABLE {name}")
        logger.info("partition %s dropped (raw retention)", name)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {DEFAULT_PARTITION} WHERE start < %s", [cutoff])  # noqa: S608
        removed += max(int(cursor.rowcount), 0)
    return removed
