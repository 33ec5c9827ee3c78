"""telemetry.DailyUsage and MonthlyUsage: the per-GPU sums of the hourly rollups per local day
and per local month (PostgreSQL).

Checked against an independent path: the hourly rows summed in Python by local day and month.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import defaultdict
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from telemetry.models import USAGE_SUM_COLUMNS
from tests.telemetry.conftest import sample, samples_ingest

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the daily table is kept on PostgreSQL only"
)

H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)
SUMS = USAGE_SUM_COLUMNS
KEY = ("gpu_id", "day", "node_id", "pool_id", "team_id", "site_id")


def hourly_by_day(zone: str, *, month: bool = False) -> dict[tuple[Any, ...], dict[str, float]]:
    """The independent path: every hourly row summed in Python by local day (or month: the
    key's date is then the month's first day)."""
    from telemetry.models import HourlyUsage

    out: dict[tuple[Any, ...], dict[str, float]] = defaultdict(lambda: dict.fromkeys(SUMS, 0.0))
    tz = ZoneInfo(zone)
    for r in HourlyUsage.objects.values("gpu_id", "hour", *KEY[2:], *SUMS):
        day = r["hour"].astimezone(tz).date()
        key = (r["gpu_id"], day.replace(day=1) if month else day, *(r[k] for k in KEY[2:]))
        sums = out[key]
        sums["hours"] = sums.get("hours", 0) + 1
        for f in SUMS:
            sums[f] += r[f]
    return dict(out)


def daily() -> dict[tuple[Any, ...], dict[str, float]]:
    from telemetry.models import DailyUsage

    return {
        tuple(r[k] for k in KEY): {f: r[f] for f in ("hours", *SUMS)}
        for r in DailyUsage.objects.values(*KEY, "hours", *SUMS)
    }


def monthly() -> dict[tuple[Any, ...], dict[str, float]]:
    from telemetry.models import MonthlyUsage

    key = ("gpu_id", "month", *KEY[2:])
    return {
        tuple(r[k] for k in key): {f: r[f] for f in ("hours", *SUMS)}
        for r in MonthlyUsage.objects.values(*key, "hours", *SUMS)
    }


def assert_daily_equals_hourly(zone: str) -> None:
    """The daily rows, and the monthly rows kept from them, equal the hourly rows summed by
    local day and by local month."""
    from telemetry.models import DailyUsageState

    assert DailyUsageState.objects.get().zone == zone
    for want, got in ((hourly_by_day(zone), daily()), (hourly_by_day(zone, month=True), monthly())):
        assert got.keys() == want.keys()
        for key, sums in want.items():
            for f, value in sums.items():
                assert got[key][f] == pytest.approx(value, rel=1e-12), (key, f)


def hourly_row(gpu: Any, hour: dt.datetime, **values: Any) -> Any:
    from django.utils import timezone

    from telemetry.models import HourlyUsage

    node = gpu.node
    return HourlyUsage(
        gpu=gpu,
        hour=hour,
        node=node,
        pool=node.pool,
        team=node.pool.team,
        site=node.pool.site,
        computed_at=timezone.now(),
        **{"samples": 60, "observed_s": 3600.0, "air_s": 1800.0, **values},
    )


def test_rollup_keeps_daily_equal_to_hourly_and_rerolls_update_it(
    make_gpu: Any, t0: dt.datetime
) -> None:
    from telemetry.rollup import rollup_run
    from telemetry.services import gpu_hours_invalidate

    gpu, other = make_gpu(), make_gpu()
    # Two days and a bit, every 10 minutes, with varying utilisation.
    samples_ingest(
        sample(g, t0 + i * 10 * M, util=(i * 7) % 100, power_w=100 + i % 50, procs=i % 2)
        for g in (gpu, other)
        for i in range(0, 6 * 50)
    )
    rollup_run()
    assert_daily_equals_hourly("UTC")
    first_day = daily()[(gpu.pk, t0.date(), *daily_attribution(gpu))]
    assert first_day["hours"] == 24 and first_day["samples"] == 144

    # A late sample re-rolls its hour: the day follows.
    samples_ingest([sample(gpu, t0 + 5 * M, util=100, power_w=300, procs=1)])
    rollup_run()
    assert_daily_equals_hourly("UTC")
    assert daily()[(gpu.pk, t0.date(), *daily_attribution(gpu))]["samples"] == 145

    # The GPU's service starts on the third day: its first two days lose every row.
    gpu.in_service_at = t0 + dt.timedelta(days=2)
    gpu.save()
    gpu_hours_invalidate(gpu_ids=[gpu.pk])
    rollup_run()
    assert_daily_equals_hourly("UTC")
    assert {k[1] for k in daily() if k[0] == gpu.pk} == {(t0 + dt.timedelta(days=2)).date()}


def daily_attribution(gpu: Any) -> tuple[Any, ...]:
    node = gpu.node
    return (node.pk, node.pool_id, node.pool.team_id, node.pool.site_id)


def test_a_move_mid_day_gives_a_row_per_attribution(
    make_gpu: Any, fleet: dict[str, Any], t0: dt.datetime
) -> None:
    from telemetry.models import HourlyUsage

    gpu = make_gpu()
    HourlyUsage.objects.bulk_create([hourly_row(gpu, t0 + i * H) for i in range(10)])
    gpu.node = fleet["node_b"]
    gpu.save()
    HourlyUsage.objects.bulk_create([hourly_row(gpu, t0 + i * H) for i in range(10, 24)])
    assert_daily_equals_hourly("UTC")
    assert sorted(v["hours"] for v in daily().values()) == [10, 14]
    HourlyUsage.objects.filter(hour__lt=t0 + 10 * H).update(air_s=0.0)
    HourlyUsage.objects.filter(hour__gte=t0 + 20 * H).delete()
    assert_daily_equals_hourly("UTC")
    assert sorted(v["hours"] for v in daily().values()) == [10, 10]


def test_dst_days_in_berlin_have_23_and_25_hours_and_a_zone_change_rebuilds(
    make_gpu: Any,
) -> None:
    from fleet.models import FleetSettings
    from telemetry.models import HourlyUsage
    from telemetry.rollup import daily_usage_ensure, daily_usage_rebuild

    gpu = make_gpu()
    rows = []
    for first in (
        dt.datetime(2026, 3, 28, tzinfo=dt.UTC),
        dt.datetime(2026, 10, 24, tzinfo=dt.UTC),
    ):
        rows += [hourly_row(gpu, first + i * H) for i in range(24 * 3)]
    HourlyUsage.objects.bulk_create(rows)
    assert_daily_equals_hourly("UTC")

    fs = FleetSettings.load()
    fs.report_time_zone = "Europe/Berlin"
    fs.save()
    assert daily_usage_ensure() is True
    assert daily_usage_ensure() is False  # already in that zone: nothing to do
    assert_daily_equals_hourly("Europe/Berlin")
    hours = {k[1]: v["hours"] for k, v in daily().items()}
    assert hours[dt.date(2026, 3, 29)] == 23  # spring forward
    assert hours[dt.date(2026, 10, 25)] == 25  # fall back
    assert hours[dt.date(2026, 3, 30)] == 24
    # New hourly rows land on Berlin days now.
    HourlyUsage.objects.bulk_create([hourly_row(gpu, dt.datetime(2026, 11, 1, 23, tzinfo=dt.UTC))])
    assert_daily_equals_hourly("Europe/Berlin")
    assert hours != {k[1]: v["hours"] for k, v in daily().items()}
    assert {k[1] for k in daily()} >= {dt.date(2026, 11, 2)}

    assert daily_usage_rebuild(zone_name="Not/AZone") > 0  # what the selectors read as UTC
    assert_daily_equals_hourly("UTC")


@pytest.mark.django_db(transaction=True)
def test_two_rollups_at_once_equal_one_clean_run(make_gpu: Any, t0: dt.datetime) -> None:
    from django.db import connections

    from telemetry.models import DailyUsageState
    from telemetry.rollup import daily_usage_rebuild, rollup_run

    if not DailyUsageState.objects.exists():  # a flush before this test emptied the state
        daily_usage_rebuild(zone_name="UTC")
    gpus = [make_gpu() for _ in range(3)]
    samples_ingest(
        sample(g, t0 + i * 5 * M, util=(i * 13) % 100, power_w=150, procs=1)
        for g in gpus
        for i in range(12 * 60)
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            rollup_run(wait=True)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    concurrent = daily()
    assert_daily_equals_hourly("UTC")
    daily_usage_rebuild(zone_name="UTC")  # one clean pass over the same hourly rows
    assert daily().keys() == concurrent.keys()
    for key, sums in concurrent.items():
        assert sums == pytest.approx(daily()[key], rel=1e-12)


@pytest.fixture(autouse=True)
def _daily_state_present(request: Any) -> None:
    """The daily table's state row comes from a migration; a transactional test earlier in
    the run flushes every table, so put it back (what the periodic rollup does in production:
    ``daily_usage_ensure`` rebuilds when the state is missing)."""
    if connection.vendor != "postgresql":
        return
    marker = request.node.get_closest_marker("django_db")
    transactional = bool(marker and marker.kwargs.get("transaction"))
    request.getfixturevalue("transactional_db" if transactional else "db")
    from telemetry.rollup import daily_usage_ensure

    daily_usage_ensure()


def test_months_follow_their_days_across_a_month_edge_and_a_truncate(
    make_gpu: Any, fleet: dict[str, Any]
) -> None:
    from telemetry.models import HourlyUsage, MonthlyUsage

    gpu = make_gpu()
    # 30 January 12:00 to 2 February 12:00 UTC: two months, a move on 1 February.
    first = dt.datetime(2026, 1, 30, 12, tzinfo=dt.UTC)
    HourlyUsage.objects.bulk_create(
        [hourly_row(gpu, first + i * H, air_s=100.0 * (i % 7)) for i in range(36)]
    )
    gpu.node = fleet["node_b"]
    gpu.save()
    HourlyUsage.objects.bulk_create(
        [hourly_row(gpu, first + i * H, air_s=100.0 * (i % 7)) for i in range(36, 72)]
    )
    assert_daily_equals_hourly("UTC")
    hours = {(k[1], k[2]): v["hours"] for k, v in monthly().items()}
    assert hours == {
        (dt.date(2026, 1, 1), fleet["node_a"].pk): 36,
        (dt.date(2026, 2, 1), fleet["node_b"].pk): 36,
    }
    # A late edit of one January hour: January's row follows, February's is unchanged.
    HourlyUsage.objects.filter(hour=first).update(air_s=3600.0)
    assert_daily_equals_hourly("UTC")
    HourlyUsage.objects.filter(hour__gte=dt.datetime(2026, 2, 1, tzinfo=dt.UTC)).delete()
    assert_daily_equals_hourly("UTC")
    assert {k[1] for k in monthly()} == {dt.date(2026, 1, 1)}
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE telemetry_hourlyusage")
    assert not MonthlyUsage.objects.exists()
