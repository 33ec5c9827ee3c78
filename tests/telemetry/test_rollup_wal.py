"""The rollup's write cost (issue 46, PostgreSQL): the GPU rollups keep only the indexes their
reads use, leave room on their pages for HOT updates, and the open hour's, day's and month's
rows are rewritten in place (same row, no index entry), a day's row deleted only where its
attribution changed.

The figures themselves are checked elsewhere (test_rollup, test_daily_usage, the properties);
here the numbers are worked out by hand from the samples written.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection

from tests.telemetry.conftest import sample, samples_ingest

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="indexes, storage parameters and triggers: PostgreSQL"
)

M = dt.timedelta(minutes=1)
TABLES = ("telemetry_hourlyusage", "telemetry_dailyusage", "telemetry_monthlyusage")


def indexes(table: str) -> set[tuple[str, ...]]:
    """Each index of ``table`` as its columns, with ``"WHERE"`` added where it is partial."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT array_agg(a.attname ORDER BY k.i), i.indpred IS NOT NULL"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, i)"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
            " WHERE c.relname = %s GROUP BY i.indexrelid, i.indpred",
            [table],
        )
        return {(*columns, *(["WHERE"] if partial else [])) for columns, partial in cursor}


def xact_counts(table: str) -> dict[str, int]:
    """Rows this transaction has inserted, updated, HOT-updated and deleted in ``table``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_inserted(c.oid),"
            " pg_stat_get_xact_tuples_updated(c.oid),"
            " pg_stat_get_xact_tuples_hot_updated(c.oid),"
            " pg_stat_get_xact_tuples_deleted(c.oid)"
            " FROM pg_class c WHERE c.relname = %s",
            [table],
        )
        ins, upd, hot, dele = cursor.fetchone()
    return {"ins": ins, "upd": upd, "hot": hot, "del": dele}


def test_the_gpu_rollups_keep_the_indexes_their_reads_use_and_room_for_hot_updates(
    db: Any,
) -> None:
    # No index of the GPU alone (each table's (gpu, period) index starts with it) and no
    # partial index naming the sums: every other index is on a column the rollup never changes.
    attribution = {("node_id",), ("pool_id",), ("team_id",), ("site_id",)}
    assert indexes("telemetry_hourlyusage") == {
        ("id",),
        ("gpu_id", "hour"),
        ("hour",),
        *attribution,
    }
    assert indexes("telemetry_dailyusage") == {("id",), ("gpu_id", "day"), ("day",), *attribution}
    assert indexes("telemetry_monthlyusage") == {
        ("id",),
        ("gpu_id", "month"),
        ("month",),
        *attribution,
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)", [list(TABLES)]
        )
        assert dict(cursor.fetchall()) == dict.fromkeys(TABLES, ["fillfactor=50"])


def test_the_open_hour_rolled_again_updates_its_rows_in_place(
    make_gpu: Any, t0: dt.datetime
) -> None:
    from telemetry.models import DailyUsage, HourlyUsage, MonthlyUsage
    from telemetry.rollup import daily_usage_rebuild, rollup_run

    daily_usage_rebuild(zone_name="UTC")
    gpus = [make_gpu(), make_gpu()]
    hour = t0 + dt.timedelta(hours=10)
    samples_ingest(
        sample(g, hour + i * M, util=50, energy_j=600.0) for g in gpus for i in range(10)
    )
    rollup_run()
    models = (HourlyUsage, DailyUsage, MonthlyUsage)
    ids = {m: sorted(m.objects.values_list("id", flat=True)) for m in models}
    before = {t: xact_counts(t) for t in TABLES}

    # Ten more minutes of the same hour: every row of the GPUs' hour, day and month changes.
    samples_ingest(
        sample(g, hour + i * M, util=50, energy_j=600.0) for g in gpus for i in range(10, 20)
    )
    rollup_run()
    for table in TABLES:
        after = xact_counts(table)
        done = {k: after[k] - before[table][k] for k in after}
        # Two GPUs: two rows each, rewritten as HOT updates (no index entry), none deleted.
        assert done == {"ins": 0, "upd": 2, "hot": 2, "del": 0}, table
    for m in models:
        assert sorted(m.objects.values_list("id", flat=True)) == ids[m], m
        # 20 one-minute samples: 20 samples, 1,200 s observed, 600 s in the air, 12,000 J.
        assert (
            sorted(m.objects.values_list("samples", "observed_s", "air_s", "energy_j"))
            == [(20, 1200.0, 600.0, 12000.0)] * 2
        ), m

    # The same hour rolled again with nothing new writes nothing.
    samples_ingest([sample(gpus[0], hour + 5 * M, util=50, energy_j=600.0)])  # a duplicate
    before = {t: xact_counts(t) for t in TABLES}
    rollup_run()
    for table in TABLES:
        assert xact_counts(table) == before[table], table


def test_a_changed_attribution_replaces_only_the_rows_it_moved(
    make_gpu: Any, fleet: dict[str, Any], t0: dt.datetime
) -> None:
    from telemetry.models import DailyUsage, HourlyUsage, MonthlyUsage
    from telemetry.rollup import daily_usage_rebuild, rollup_run

    daily_usage_rebuild(zone_name="UTC")
    gpu = make_gpu()
    first, second = t0 + dt.timedelta(hours=3), t0 + dt.timedelta(hours=4)
    samples_ingest(sample(gpu, h + i * M, util=100) for h in (first, second) for i in range(30))
    rollup_run()
    a = (fleet["node_a"].pk, fleet["pool_a"].pk, fleet["team_a"].pk, fleet["site_a"].pk)
    b = (fleet["node_b"].pk, fleet["pool_b"].pk, fleet["team_b"].pk, fleet["site_b"].pk)
    fields = ("node_id", "pool_id", "team_id", "site_id", "hours", "observed_s")

    def rows(model: Any) -> dict[tuple[int, ...], tuple[int, float]]:
        return {r[:4]: r[4:] for r in model.objects.values_list(*fields)}

    def ids(model: Any) -> dict[tuple[int, ...], int]:
        return {r[1:]: r[0] for r in model.objects.values_list("id", *fields[:4])}

    assert rows(DailyUsage) == rows(MonthlyUsage) == {a: (2, 3600.0)}
    kept = {m: ids(m)[a] for m in (DailyUsage, MonthlyUsage)}

    # The second hour stored under another attribution (as a GPU moved would be).
    HourlyUsage.objects.filter(hour=second).update(
        node_id=b[0], pool_id=b[1], team_id=b[2], site_id=b[3]
    )
    for m in (DailyUsage, MonthlyUsage):
        assert rows(m) == {a: (1, 1800.0), b: (1, 1800.0)}, m
        assert ids(m)[a] == kept[m], m  # the old attribution's row updated, not replaced
    moved = {m: ids(m)[b] for m in (DailyUsage, MonthlyUsage)}

    # The first hour too: the old attribution's row goes, the new one's is updated.
    HourlyUsage.objects.filter(hour=first).update(
        node_id=b[0], pool_id=b[1], team_id=b[2], site_id=b[3]
    )
    for m in (DailyUsage, MonthlyUsage):
        assert rows(m) == {b: (2, 3600.0)}, m
        assert ids(m) == {b: moved[m]}, m


def test_the_open_hour_can_be_recomputed_less_often_and_closed_hours_never_wait(
    make_gpu: Any, t0: dt.datetime, settings: Any
) -> None:
    import time_machine

    from telemetry.models import HourlyUsage
    from telemetry.rollup import rollup_run

    settings.ROLLUP_OPEN_HOUR_EVERY_S = 300
    gpu = make_gpu()
    hour = t0 + dt.timedelta(hours=10)

    def samples(at: dt.datetime) -> int:
        # USAGE_SUMS' fields are added to the model at import: read as values.
        return int(HourlyUsage.objects.values_list("samples", flat=True).get(gpu=gpu, hour=at))

    with time_machine.travel(hour + 10 * M, tick=False):
        samples_ingest(sample(gpu, hour + i * M, util=50) for i in range(9))
        rollup_run()  # the hour's first recompute: done at once
        assert samples(hour) == 9
    with time_machine.travel(hour + 12 * M, tick=False):
        samples_ingest([sample(gpu, hour + 10 * M, util=50)])
        # A late sample of the hour before: closed hours are recomputed at every run.
        samples_ingest([sample(gpu, hour - 30 * M, util=50)])
        result = rollup_run()
        assert (result.hours, samples(hour), samples(hour - 60 * M)) == (1, 9, 1)
    with time_machine.travel(hour + 15 * M, tick=False):
        # Five minutes after the last recompute: the open hour's mark is taken.
        assert rollup_run().hours == 1
        assert samples(hour) == 10
    with time_machine.travel(hour + 61 * M, tick=False):
        # Closed now: recomputed at the first run, however recent its last recompute.
        samples_ingest([sample(gpu, hour + 59 * M, util=50)])
        assert rollup_run().hours == 1
        assert samples(hour) == 11
