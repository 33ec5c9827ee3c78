"""Daily partitions of the raw sample table and raw retention (telemetry.partitions)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from fleet.models import Gpu, Node
from telemetry.models import Sample
from telemetry.partitions import (
    DEFAULT_PARTITION,
    partition_name,
    partitions_list,
    partitions_maintain,
    retention_apply,
)


@pytest.fixture
def gpu(db: Any) -> Gpu:
    node = Node.objects.create(hostname="part-node")
    return Gpu.objects.create(uuid="GPU-part", node=node)


def _day(moment: dt.datetime) -> dt.date:
    return moment.astimezone(dt.UTC).date()


def _insert(gpu: Gpu, start: dt.datetime) -> None:
    """Straight into the table, past ingest's checks, as a stale partition set would see it."""
    Sample.objects.bulk_create(
        [Sample(gpu=gpu, start=start, seconds=60, util_pct=1.0, received_at=timezone.now())]
    )


def _count(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return int(cursor.fetchone()[0])


def test_migration_made_a_partitioned_table(postgres: Any, db: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT partstrat, pg_get_partkeydef('telemetry_sample'::regclass) "
            "FROM pg_partitioned_table WHERE partrelid = 'telemetry_sample'::regclass"
        )
        assert cursor.fetchone() == ("r", "RANGE (start)")
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'telemetry_sample'"
        )
        indexes = dict(cursor.fetchall())
    assert "PRIMARY KEY" not in indexes  # pg_indexes shows the index, not the constraint
    assert "(gpu_id, start)" in indexes["telemetry_sample_pkey"]
    assert "USING brin (start)" in indexes["telemetry_sample_start"]
    assert set(indexes) == {"telemetry_sample_pkey", "telemetry_sample_start"}
    today = _day(timezone.now())
    days = partitions_list()
    assert today in days and today + dt.timedelta(days=7) in days
    assert today - dt.timedelta(days=settings.RAW_RETENTION_DAYS) in days
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = %s",
            [DEFAULT_PARTITION],
        )
        assert cursor.fetchone() == ("DEFAULT",)


def test_maintain_creates_ahead_and_is_idempotent(postgres: Any, db: Any) -> None:
    later = timezone.now() + dt.timedelta(days=20)
    created = partitions_maintain(now=later)
    expected_last = _day(later) + dt.timedelta(days=7)
    assert partition_name(expected_last) in created
    assert partition_name(_day(later)) in created
    assert partitions_maintain(now=later) == []
    days = partitions_list()
    assert all(_day(later) + dt.timedelta(days=k) in days for k in range(-20, 8)), (
        "every day from now to the new horizon"
    )


def test_default_partition_keeps_rows_and_maintain_moves_them(postgres: Any, gpu: Any) -> None:
    """A day with no partition yet (maintenance stalled): the row is kept, then moved."""
    far = (timezone.now() + dt.timedelta(days=30)).replace(minute=0, second=0, microsecond=0)
    assert _day(far) not in partitions_list()
    _insert(gpu, far)
    assert _count(DEFAULT_PARTITION) == 1
    created = partitions_maintain(now=far)
    assert partition_name(_day(far)) in created
    assert _count(DEFAULT_PARTITION) == 0
    assert _count(partition_name(_day(far))) == 1
    assert Sample.objects.get().start == far


def test_retention_drops_whole_old_days(postgres: Any, gpu: Any) -> None:
    now = timezone.now()
    keep = now - dt.timedelta(days=2)
    old = now - dt.timedelta(days=settings.RAW_RETENTION_DAYS - 1)  # still within retention
    for start in (keep, old, old + dt.timedelta(minutes=1)):
        _insert(gpu, start.replace(second=0, microsecond=0))
    # Ten days on, the "old" day is past retention: its partition goes, "keep" stays.
    later = now + dt.timedelta(days=10)
    partitions_maintain(now=later)
    removed = retention_apply(now=later)
    assert removed == 2
    assert _day(old) not in partitions_list()
    assert list(Sample.objects.values_list("start", flat=True)) == [
        keep.replace(second=0, microsecond=0)
    ]
    cutoff_day = _day(later - dt.timedelta(days=settings.RAW_RETENTION_DAYS))
    assert min(partitions_list()) >= cutoff_day - dt.timedelta(days=1)
    assert retention_apply(now=later) == 0


def test_retention_also_cleans_the_default_partition(postgres: Any, gpu: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE " + partition_name(_day(timezone.now())))
    start = timezone.now().replace(second=0, microsecond=0)
    _insert(gpu, start)
    assert _count(DEFAULT_PARTITION) == 1
    assert retention_apply(now=start + dt.timedelta(days=settings.RAW_RETENTION_DAYS + 2)) >= 1
    assert _count(DEFAULT_PARTITION) == 0


@pytest.mark.smoke
def test_sqlite_retention_deletes_old_rows_and_maintain_is_a_noop(gpu: Any) -> None:
    if connection.vendor == "postgresql":
        pytest.skip("the SQLite behaviour")
    now = timezone.now().replace(second=0, microsecond=0)
    _insert(gpu, now - dt.timedelta(days=settings.RAW_RETENTION_DAYS + 1))
    _insert(gpu, now - dt.timedelta(days=1))
    assert partitions_maintain(now=now) == []
    assert retention_apply(now=now) == 1
    assert list(Sample.objects.values_list("start", flat=True)) == [now - dt.timedelta(days=1)]
