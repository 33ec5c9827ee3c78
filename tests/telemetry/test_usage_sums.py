"""One list of usage sums (telemetry.models.USAGE_SUMS): the models' fields, the rollup's
statements, the daily rebuild and trigger all come from it, and the trigger function that the
migrations install is the one it generates."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from telemetry import rollup
from telemetry.models import (
    HOURLY_STATS,
    USAGE_SUM_COLUMNS,
    USAGE_SUMS,
    DailyUsage,
    HourlyUsage,
    RollupColumn,
)
from telemetry.pending import hours_mark
from tests.telemetry.conftest import sample, samples_ingest

pytestmark = pytest.mark.django_db

M = dt.timedelta(minutes=1)
KEYS = {"id", "gpu", "node", "pool", "team", "site"}


def value_fields(model: Any) -> set[str]:
    return {f.name for f in model._meta.concrete_fields} - KEYS


def test_both_usage_tables_hold_exactly_the_listed_sums() -> None:
    assert value_fields(DailyUsage) == {*USAGE_SUM_COLUMNS, "day", "hours"}
    stats = {c.name for c in HOURLY_STATS}
    assert value_fields(HourlyUsage) == {*USAGE_SUM_COLUMNS, *stats, "hour", "computed_at"}
    for name in USAGE_SUM_COLUMNS:  # the same field on both, made once
        hourly, daily = HourlyUsage._meta.get_field(name), DailyUsage._meta.get_field(name)
        assert hourly.deconstruct()[1:] == daily.deconstruct()[1:]
    assert HourlyUsage._meta.get_field("samples").get_internal_type() == "IntegerField"
    assert DailyUsage._meta.get_field("air_s").get_internal_type() == "FloatField"


def test_every_statement_lists_every_sum_and_no_placeholder_is_left() -> None:
    for path in sorted(rollup.SQL_DIR.glob("*.sql")):
        text = rollup._sql(path.stem)
        assert not re.search(r"\{[a-z_]+\}", text), path.name
    upsert = rollup._sql("rollup_upsert.postgresql")
    daily = rollup.daily_refresh_function_sql()
    for name in USAGE_SUM_COLUMNS:
        # In the upsert: computed, inserted, updated and compared by the no-op guard.
        assert f" AS {name}," in upsert or f" AS {name}\n" in upsert, name
        assert f"{name} = excluded.{name}" in upsert, name
        assert f"telemetry_hourlyusage.{name}" in upsert, name
        assert f"sum({name})" in daily, name
    # A list the code does not know is a loud error, not an empty list.
    with pytest.raises(KeyError):
        rollup._PLACEHOLDER.sub(rollup._column_list_fill, "SELECT {no_such_list}")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the triggers are PostgreSQL's")
def test_the_migrations_installed_the_refresh_function_the_sums_generate() -> None:
    def installed() -> str:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_get_functiondef('telemetry_dailyusage_refresh(bigint[], date[])'"
                "::regprocedure)"
            )
            return str(cursor.fetchone()[0])

    by_migrations = installed()
    generated = rollup.daily_refresh_function_sql()
    # Installed again in this test's transaction (rolled back): the database's own rendering
    # of both texts, so only a real difference counts.
    with connection.cursor() as cursor:
        cursor.execute(generated)
    assert installed() == by_migrations, (
        "USAGE_SUMS changed without a migration that installs its trigger function: add to the "
        "migration that adds the field a RunPython that executes this text, frozen in the "
        "migration (see telemetry/migrations/0103_usage_sums.py):\n" + generated
    )
    assert "sum(sm_observed_s)" in by_migrations  # the comparison reads real text


@pytest.fixture
def probe_sum(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A sum column added the way the list's comment says, inside this test's transaction:
    a column on both tables (what the migration's AddField does), its entry in USAGE_SUMS, and
    on PostgreSQL the trigger function generated again (what the migration's RunPython does)."""
    name = "probe_s"
    with connection.cursor() as cursor:
        for table in ("telemetry_hourlyusage", "telemetry_dailyusage", "telemetry_monthlyusage"):
            cursor.execute(f"ALTER TABLE {table} ADD COLUMN {name} real NOT NULL DEFAULT 0")
    column = RollupColumn(name, f"sum({name})", sample="s.seconds * 2 + 1")
    monkeypatch.setattr(rollup, "USAGE_SUMS", (*USAGE_SUMS, column))
    rollup._sql.cache_clear()
    rollup._column_lists.cache_clear()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(rollup.daily_refresh_function_sql())
    yield name
    monkeypatch.undo()
    rollup._sql.cache_clear()
    rollup._column_lists.cache_clear()


def test_a_sum_added_to_the_list_is_rolled_up_hourly_and_daily(
    probe_sum: str, make_gpu: Any, t0: dt.datetime
) -> None:
    gpu = make_gpu()
    # Two hours: 3 samples of 60 s, then 1 of 30 s. Per sample 2 × seconds + 1.
    samples_ingest(
        [
            sample(gpu, t0, util=10),
            sample(gpu, t0 + M, util=20),
            sample(gpu, t0 + 2 * M, util=30),
            sample(gpu, t0 + 60 * M, seconds=30, util=40),
        ]
    )
    assert rollup.rollup_run().hours == 2
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {probe_sum}, samples FROM telemetry_hourlyusage WHERE gpu_id = %s "
            "ORDER BY hour",
            [gpu.pk],
        )
        assert cursor.fetchall() == [(363.0, 3), (61.0, 1)]
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT {probe_sum}, hours FROM telemetry_dailyusage WHERE gpu_id = %s",
                [gpu.pk],
            )
            assert cursor.fetchall() == [(424.0, 2)]
    # The no-op guard compares the new column too: a re-roll rewrites a row only where it
    # differs, here in nothing but that column.
    hours_mark([t0, t0 + 60 * M])
    assert rollup.rollup_run().rows == 0
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE telemetry_hourlyusage SET {probe_sum} = 0 WHERE samples = 1")
    hours_mark([t0, t0 + 60 * M])
    assert rollup.rollup_run().rows == 1
