"""The fast paths of issue 6 against the plain path, on a fleet with every awkward case.

The plain path is the selectors reading hourly rollups only (what they do when the daily
pre-aggregate is not in use: SQLite, or a report zone it was not built for). The fast paths:
the daily table (PostgreSQL), ``cost_rows_by`` (several groupings from one computation),
``fleet_trend`` (the overview's fleet per day, summed per rate class) and
``utilization_by_day`` (the heatmap). Each must give the figures of the plain path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from billing import selectors
from tests.billing.conftest import FleetBuilder, at

START = dt.date(2026, 3, 1)
END = dt.date(2026, 3, 11)  # exclusive
NOW = at("2026-03-10T13:25")  # inside the last day: a partial day up to now
H = dt.timedelta(hours=1)


def _wave(i: int, h: int) -> float:
    return 0.5 + 0.45 * math.sin(i * 1.7 + h / 5.0)


@pytest.fixture
def awkward(fleet: FleetBuilder) -> dict[str, Any]:
    """Six GPUs over ten days: steady owned and rented ones, one whose depreciation ends
    mid-window, one that enters service mid-day, one retired mid-day, one that moves to
    another pool (and site) mid-day, one without a profile; gaps (offline hours) and a day
    with overlapping samples (more observed than the day)."""
    fra = fleet.site("fra1", pue="1.4", price_per_kwh="0.21", grid_g_per_kwh=380.0)
    iad = fleet.site("iad1", pue="1.2", price_per_kwh="0.09", grid_g_per_kwh=390.0)
    research, product = fleet.team("research"), fleet.team("product")
    train = fleet.pool("train", site=fra, team=research)
    serve = fleet.pool("serve", site=iad, team=product)
    spare = fleet.pool("spare", site=fra, team=product)
    n1, n2, n3 = fleet.node("n1", pool=train), fleet.node("n2", pool=serve), fleet.node("n3")
    n3.pool = spare
    n3.save()
    h100, a100 = fleet.model("H100-SXM"), fleet.model("A100", max_power_w=400, idle_power_w=50)
    fleet.owned("pool:train", purchase_price="30000.00", depreciation_years="5")
    fleet.rented("pool:serve", rental_rate_per_hour="2.49")
    # Depreciated over 1 year from 2025-03-05 10:30: ends inside the window.
    fleet.owned("gpu:GPU-old", purchase_price="9000.00", depreciation_years="1")
    early = at("2026-01-01T00")
    gpus = {
        "steady": fleet.gpu("GPU-steady", node=n1, index=0, in_service_at=early, model=h100),
        "old": fleet.gpu(
            "GPU-old", node=n1, index=1, in_service_at=at("2025-03-05T10:30"), model=a100
        ),
        "late": fleet.gpu(
            "GPU-late", node=n1, index=2, in_service_at=at("2026-03-03T07:20"), model=h100
        ),
        "retired": fleet.gpu(
            "GPU-retired",
            node=n2,
            index=0,
            in_service_at=early,
            model=h100,
            retired_at=at("2026-03-06T15:40"),
        ),
        "mover": fleet.gpu("GPU-mover", node=n2, index=1, in_service_at=early, model=h100),
        "bare": fleet.gpu("GPU-bare", node=n3, index=0, in_service_at=early, model=a100),
    }
    rows = []
    hour = at("2026-03-01T00")
    i = 0
    while hour < at("2026-03-10T14"):
        for k, (name, gpu) in enumerate(gpus.items()):
            if name == "late" and hour < at("2026-03-03T07"):
                continue
            if name == "retired" and hour >= at("2026-03-06T16"):
                continue
            if (i + k) % 17 == 0:
                continue  # an offline hour
            u = _wave(k, i)
            observed = 3600.0 if (i + k) % 5 else 1800.0
            if name == "steady" and hour.date() == dt.date(2026, 3, 4):
                observed = 3900.0  # overlapping samples: more observed than the hour
            values = {
                "samples": 60,
                "observed_s": observed,
                "air_s": observed * u,
                "held_s": observed * (1 - u) * 0.6,
                "parked_s": observed * (1 - u) * 0.4,
                "energy_j": observed * (69 + 560 * u),
                "idle_energy_j": observed * 69 if u < 0.1 else 0.0,
                "idle_s": observed if u < 0.1 else 0.0,
                "throttle_any_s": 60.0 * (k % 2),
                "throttle_power_cap_s": 60.0 * (k % 2),
            }
            if k in (0, 1):  # profiling data (docs/metrics.md, "Work"), one with a rate change
                values.update(
                    sm_active_s=observed * u * 0.8,
                    sm_observed_s=observed,
                    sm_air_s=observed * u,
                    tensor_active_s=observed * u * 0.3 if k == 0 else 0.0,
                    tensor_observed_s=observed if k == 0 else 0.0,
                    sm_hours=1,
                    sm_hours_energy_j=values["energy_j"],
                )
            if name == "mover" and hour >= at("2026-03-05T11"):
                values.update(node=n1, pool=train, site=fra, team=research)
            rows.append(fleet.usage(gpu, hour, **values))
        hour += H
        i += 1
    fleet.save(rows)
    # The mover's current place is n1 now (its offline hours go there).
    gpus["mover"].node = n1
    gpus["mover"].save()
    return gpus


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, Decimal):
        return bool(abs(a - b) <= abs(b) * Decimal("1e-12") + Decimal("1e-18"))
    if isinstance(a, float):
        return bool(a == pytest.approx(b, rel=1e-12, abs=1e-9))
    return bool(a == b)


def assert_rows_equal(got: list[Any], want: list[Any]) -> None:
    assert [(r.period_start, r.key) for r in got] == [(r.period_start, r.key) for r in want]
    for g, w in zip(got, want, strict=True):
        for name in w.__dataclass_fields__:
            assert _close(getattr(g, name), getattr(w, name)), (w.key, w.period_start, name)


def plain_path() -> None:
    """Stop using the daily table: the selectors fall back to hourly rows only."""
    from telemetry.models import DailyUsageState

    DailyUsageState.objects.all().delete()


needs_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the daily table is kept on PostgreSQL only"
)

FILTERS = [
    selectors.Filters(),
    selectors.Filters(pools=("train",)),
    selectors.Filters(sites=("iad1",), models=("H100-SXM",)),
]


@needs_postgres
def test_daily_table_gives_the_figures_of_the_hourly_rows(awkward: dict[str, Any]) -> None:
    from telemetry.models import DailyUsageState

    assert DailyUsageState.objects.get().zone == "UTC"  # in use for these tests
    cases = [
        (group_by, period, flt)
        for group_by in selectors.GROUP_BY
        for period in selectors.PERIODS
        for flt in FILTERS
    ]
    fast = {
        c: selectors.cost_rows(
            start=START, end=END, group_by=c[0], period=c[1], filters=c[2], now=NOW
        )
        for c in cases
    }
    summary = selectors.fleet_summary(start=START, end=END, now=NOW)
    plain_path()
    for c in cases:
        want = selectors.cost_rows(
            start=START, end=END, group_by=c[0], period=c[1], filters=c[2], now=NOW
        )
        assert want, c
        assert_rows_equal(fast[c], want)
    plain = selectors.fleet_summary(start=START, end=END, now=NOW)
    assert_rows_equal([summary.row], [plain.row])
    assert summary.recoverable_gpus == pytest.approx(plain.recoverable_gpus, rel=1e-12)


@needs_postgres
def test_monthly_table_gives_the_figures_of_the_hourly_rows(awkward: dict[str, Any]) -> None:
    # Seen from 2 April: [25 February, 3 April) holds March whole (monthly rows: the mover's
    # two attributions, the retired and the late GPU; the GPU whose depreciation ends in March
    # is read by the hour), days before and after it (daily rows) and 2 April in progress.
    from django.test.utils import CaptureQueriesContext

    start, end, now = dt.date(2026, 2, 25), dt.date(2026, 4, 3), at("2026-04-02T09:10")
    cases = [
        (group_by, period, flt)
        for group_by in selectors.GROUP_BY
        for period in ("all", "month")
        for flt in FILTERS
    ]
    with CaptureQueriesContext(connection) as queries:
        fast = {
            c: selectors.cost_rows(
                start=start, end=end, group_by=c[0], period=c[1], filters=c[2], now=now
            )
            for c in cases
        }
    assert any("telemetry_monthlyusage" in q["sql"] for q in queries.captured_queries)
    plain_path()
    for c in cases:
        want = selectors.cost_rows(
            start=start, end=end, group_by=c[0], period=c[1], filters=c[2], now=now
        )
        assert want, c
        assert_rows_equal(fast[c], want)
    assert sum(r.capacity_hours for r in fast[("fleet", "all", FILTERS[0])]) > 6 * 24 * 30


@pytest.mark.parametrize("flt", FILTERS)
def test_fleet_trend_is_the_fleet_per_day(awkward: dict[str, Any], flt: selectors.Filters) -> None:
    got = selectors.fleet_trend(start=START, end=END, filters=flt, now=NOW)
    want = selectors.cost_rows(
        start=START, end=END, group_by="fleet", period="day", filters=flt, now=NOW
    )
    assert want and (flt.sites or len(want) == 10)
    assert_rows_equal(got, want)
    # A past range: no partial day, every day pooled where it can be.
    got = selectors.fleet_trend(start=START, end=dt.date(2026, 3, 8), filters=flt, now=NOW)
    want = selectors.cost_rows(
        start=START,
        end=dt.date(2026, 3, 8),
        group_by="fleet",
        period="day",
        filters=flt,
        now=NOW,
    )
    assert_rows_equal(got, want)


@pytest.mark.parametrize("flt", FILTERS)
def test_utilization_by_day_is_the_gpu_day_utilization(
    awkward: dict[str, Any], flt: selectors.Filters
) -> None:
    got = selectors.utilization_by_day(start=START, end=END, filters=flt, now=NOW)
    want = selectors.cost_rows(
        start=START, end=END, group_by="gpu", period="day", filters=flt, now=NOW
    )
    expected: dict[str, list[float | None]] = {}
    for r in want:
        cells = expected.setdefault(r.key, [None] * 10)
        cells[(r.period_start.date() - START).days] = r.utilization
    assert {r.key: r.name for r in got} == {r.key: r.name for r in want}
    for row in got:
        for value, wanted in zip(row.values, expected[row.key], strict=True):
            assert (value is None) == (wanted is None), row.key
            if value is not None:
                assert value == pytest.approx(wanted, rel=1e-12, abs=1e-12), row.key
    # The heatmap's offline days: each GPU-day's offline and capacity hours, as the cost
    # rows have them (per day; no GPU here observed more than a depreciation phase's hours).
    hours: dict[str, dict[int, tuple[float, float]]] = {}
    for r in want:
        day = (r.period_start.date() - START).days
        hours.setdefault(r.key, {})[day] = (r.offline_hours, r.capacity_hours)
    offline_days = 0
    for row in got:
        for day, (off, cap) in enumerate(zip(row.offline_hours, row.capacity_hours, strict=True)):
            want_off, want_cap = hours[row.key].get(day, (None, None))
            if cap is None:
                assert want_cap in (None, 0), (row.key, day)
                continue
            assert (off, cap) == (
                pytest.approx(want_off, abs=1e-9),
                pytest.approx(want_cap, abs=1e-9),
            ), (row.key, day)
            offline_days += off > 0
    assert offline_days > 0


@pytest.mark.parametrize(
    "group_bys", [("gpu", "model", "team", "pool"), ("model", "team", "pool", "site", "fleet")]
)
def test_cost_rows_by_is_cost_rows_for_each_grouping(
    awkward: dict[str, Any], group_bys: tuple[str, ...]
) -> None:
    # With GPUs among the groupings the one computation is per GPU; without, by price class
    # on PostgreSQL (as ``cost_rows`` of a team, pool, site, model or the fleet): then each
    # grouping's rows are those of ``cost_rows``, the same computation, identical. Per GPU,
    # the other groupings' rows are the same to the last digits of their float sums.
    got = selectors.cost_rows_by(start=START, end=END, group_bys=group_bys, now=NOW)
    by_class = "gpu" not in group_bys and connection.vendor == "postgresql"
    for group_by, rows in got.items():
        want = selectors.cost_rows(start=START, end=END, group_by=group_by, now=NOW)
        assert_rows_equal(rows, want)
        if by_class or group_by == "gpu" or connection.vendor != "postgresql":
            assert rows == want  # the same computation: identical, not just close


@pytest.mark.parametrize("flt", FILTERS)
def test_fleet_overview_is_the_summary_and_the_trend(
    awkward: dict[str, Any], flt: selectors.Filters
) -> None:
    """The overview's one load of GPUs and terms for both periods gives the same figures as
    ``fleet_summary`` and ``fleet_trend`` called apart."""
    summary, trend = selectors.fleet_overview(start=START, end=END, filters=flt, now=NOW)
    want = selectors.fleet_summary(start=START, end=END, filters=flt, now=NOW)
    assert_rows_equal([summary.row], [want.row])
    assert summary.row.total_cost == want.row.total_cost
    assert summary.row.idle_cost == want.row.idle_cost
    assert (summary.gpus_in_service, summary.gpus_offline_now) == (
        want.gpus_in_service,
        want.gpus_offline_now,
    )
    assert summary.recoverable_gpus == pytest.approx(want.recoverable_gpus, rel=1e-12)
    assert summary.recoverable_money_per_year == want.recoverable_money_per_year
    assert_rows_equal(trend, selectors.fleet_trend(start=START, end=END, filters=flt, now=NOW))


@pytest.fixture
def tidy(awkward: dict[str, Any]) -> dict[str, Any]:
    """The awkward fleet less what makes a GPU observe more than its capacity on a day: the
    steady GPU's overlapping samples, the late GPU's hour before its service start and the
    retired GPU's hour that runs past its retirement."""
    from telemetry.models import HourlyUsage

    HourlyUsage.objects.filter(gpu=awkward["steady"], observed_s__gt=3600).update(observed_s=3600.0)
    HourlyUsage.objects.filter(gpu=awkward["late"], hour=at("2026-03-03T07")).delete()
    HourlyUsage.objects.filter(gpu=awkward["retired"], hour=at("2026-03-06T15")).delete()
    return awkward


def _trend_additive(flt: selectors.Filters) -> bool:
    from billing.selectors.sums import _compute

    return _compute(
        start=START, end=END, period="day", filters=flt, now=NOW, pooled=True, by_class=True
    ).offline_additive


@pytest.mark.parametrize("flt", FILTERS)
def test_fleet_overview_summary_from_the_trend(
    tidy: dict[str, Any], flt: selectors.Filters
) -> None:
    """No GPU observed more than its capacity on a day: the overview's summary is its trend's
    days taken together (the rollups read once), the figures of ``fleet_summary`` but for
    the last digits of sums taken in another order."""
    from django.test.utils import CaptureQueriesContext

    assert _trend_additive(flt)
    with CaptureQueriesContext(connection) as queries:
        summary, trend = selectors.fleet_overview(start=START, end=END, filters=flt, now=NOW)
    rollup_reads = [q for q in queries.captured_queries if "usage" in q["sql"]]
    want = selectors.fleet_summary(start=START, end=END, filters=flt, now=NOW)
    assert_rows_equal([summary.row], [want.row])
    assert summary.row.total_cost.quantize(Decimal("0.01")) == want.row.total_cost.quantize(
        Decimal("0.01")
    )
    assert summary.row.offline_hours > 0 and summary.row.gpu_count == want.row.gpu_count
    assert summary.recoverable_gpus == pytest.approx(want.recoverable_gpus, rel=1e-12)
    assert_rows_equal(trend, selectors.fleet_trend(start=START, end=END, filters=flt, now=NOW))
    # The summary's own statements are not made: fewer rollup reads than the two calls'.
    with CaptureQueriesContext(connection) as apart:
        selectors.fleet_summary(start=START, end=END, filters=flt, now=NOW)
        selectors.fleet_trend(start=START, end=END, filters=flt, now=NOW)
    assert len(rollup_reads) < len([q for q in apart.captured_queries if "usage" in q["sql"]])


def test_data_outside_capacity_sends_the_summary_apart(
    tidy: dict[str, Any], fleet: FleetBuilder
) -> None:
    """An hour of the late GPU the day before its service start (7:20 on 3 March): observed
    where it has no capacity, which the window's offline hours take off and the day's do
    not. The overview computes its summary apart."""
    flt = selectors.Filters()
    assert _trend_additive(flt)
    fleet.save([fleet.usage(tidy["late"], at("2026-03-02T05"), samples=60, observed_s=3600.0)])
    assert not _trend_additive(flt)
    summary, _trend = selectors.fleet_overview(start=START, end=END, now=NOW)
    want = selectors.fleet_summary(start=START, end=END, now=NOW)
    assert summary.row == want.row


@pytest.mark.parametrize(
    ("gpu", "hour"),
    [
        ("steady", "2026-03-04T10"),  # on a pooled day
        ("late", "2026-03-03T09"),  # on the day it enters service (not pooled)
        ("retired", "2026-03-06T12"),  # on the day it retires
        ("old", "2026-03-05T10"),  # the hour its depreciation ends (a split GPU)
    ],
)
def test_overlapping_samples_send_the_summary_apart(
    tidy: dict[str, Any], gpu: str, hour: str
) -> None:
    """One hour holding more than a day of samples (overlapping samples, at most 24 hours
    of the others that day): the GPU observed more than its capacity that day."""
    from telemetry.models import HourlyUsage

    HourlyUsage.objects.filter(gpu=tidy[gpu], hour=at(hour)).update(observed_s=90000.0)
    assert not _trend_additive(selectors.Filters())
    summary, _trend = selectors.fleet_overview(start=START, end=END, now=NOW)
    want = selectors.fleet_summary(start=START, end=END, now=NOW)
    assert summary.row == want.row  # computed apart: identical


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


@needs_postgres
@pytest.mark.parametrize("flt", FILTERS)
def test_utilization_listed_is_the_heatmap_rows_without_values(
    awkward: dict[str, Any], fleet: FleetBuilder, flt: selectors.Filters
) -> None:
    """The heatmap by name lists every GPU, then reads the values of one page only: the
    same GPUs, names and order as the whole computation, and a page's rows are its rows."""
    # In no service (no start, never seen) but with rows: listed because of its rows.
    unserved = fleet.gpu("GPU-unserved", node=awkward["steady"].node, index=7)
    fleet.save([fleet.usage(unserved, at("2026-03-04T05"), samples=60, observed_s=3600)])
    fleet.gpu("GPU-empty", node=awkward["steady"].node, index=8)  # no service, no rows
    full = selectors.utilization_by_day(start=START, end=END, filters=flt, now=NOW)
    listed = selectors.utilization_listed(start=START, end=END, filters=flt, now=NOW)
    if flt.sites or flt.pools or flt.teams:
        assert listed is None  # the filters decide per row: only the whole computation
        return
    assert listed == [(r.key, r.name) for r in full]
    assert "GPU-unserved" in dict(listed) and "GPU-empty" not in dict(listed)
    page = tuple(key for key, _name in listed[::2])
    part = selectors.utilization_by_day(
        start=START, end=END, filters=dataclasses.replace(flt, gpus=page), now=NOW
    )
    want = [r for r in full if r.key in page]
    assert [(r.key, r.name) for r in part] == [(r.key, r.name) for r in want]
    for got, wanted in zip(part, want, strict=True):
        # Sums of the same rows, read in another order when fewer GPUs are asked for.
        for value, expected in zip(got.values, wanted.values, strict=True):
            assert (value is None) == (expected is None), got.key
            if value is not None:
                assert value == pytest.approx(expected, rel=1e-12, abs=1e-12), got.key


@needs_postgres
def test_daily_table_in_a_zone_behind_utc(awkward: dict[str, Any], fleet: FleetBuilder) -> None:
    """Days, weeks and months of the daily table built for a zone behind UTC (the database
    truncates its days to weeks and months at the session's midnight), across a daylight
    saving change (New York, 2026-03-08), are those of the hourly rows."""
    from telemetry.models import DailyUsageState
    from telemetry.rollup import daily_usage_rebuild

    fleet.settings(report_time_zone="America/New_York")
    daily_usage_rebuild()
    assert DailyUsageState.objects.get().zone == "America/New_York"
    cases = [(g, p) for g in ("fleet", "gpu", "pool") for p in selectors.PERIODS]
    fast = {
        c: selectors.cost_rows(start=START, end=END, group_by=c[0], period=c[1], now=NOW)
        for c in cases
    }
    plain_path()
    for c in cases:
        want = selectors.cost_rows(start=START, end=END, group_by=c[0], period=c[1], now=NOW)
        assert want, c
        assert_rows_equal(fast[c], want)


@needs_postgres
def test_the_day_in_progress_is_read_from_its_daily_row(
    awkward: dict[str, Any], fleet: FleetBuilder
) -> None:
    # Today's hourly rows changed behind the triggers' back: the figures follow the daily row
    # (what the triggers keep), so today is read from it. An hour at or after now (a clock
    # ahead) sends today back to the hourly rows up to now, which leave that hour out.
    from telemetry.models import HourlyUsage

    today = dt.date(2026, 3, 10)
    before = selectors.cost_rows(start=today, end=END, group_by="fleet", now=NOW)[0]
    assert before.air_hours > 0
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE telemetry_hourlyusage DISABLE TRIGGER USER")
        cursor.execute(
            "UPDATE telemetry_hourlyusage SET air_s = 0 WHERE hour >= %s", [at("2026-03-10T00")]
        )
        cursor.execute("ALTER TABLE telemetry_hourlyusage ENABLE TRIGGER USER")
    daily = selectors.cost_rows(start=today, end=END, group_by="fleet", now=NOW)[0]
    assert daily.air_hours == before.air_hours
    ahead = fleet.usage(awkward["steady"], at("2026-03-10T15"), observed_s=3600, air_s=3600)
    HourlyUsage.objects.bulk_create([ahead])
    hourly = selectors.cost_rows(start=today, end=END, group_by="fleet", now=NOW)[0]
    assert hourly.air_hours == 0 and hourly.observed_hours == before.observed_hours


def _offset_pages_match(flt: selectors.Filters, group_by: str, period: str, start: dt.date) -> int:
    """Every limit/offset page of the query against the rows of the whole, computed part by
    part; the count without computing every row (the fast path taken, not the fallback).
    Returns the number of rows."""
    from unittest import mock

    from billing.api.views import period_chunks
    from billing.selectors import costs as costs_selectors

    parts = list(period_chunks(start, END, period))
    query = {"start": start, "end": END, "group_by": group_by, "period": period}
    whole = list(selectors.cost_rows_in_parts(**query, parts=parts, filters=flt, now=NOW))
    counted = []
    real = costs_selectors.bucket_counts

    def spy(**kwargs: Any) -> Any:
        counted.append(real(**kwargs))
        return counted[-1]

    with (
        mock.patch.object(costs_selectors, "bucket_counts", spy),
        mock.patch.object(costs_selectors.logger, "warning", side_effect=AssertionError),
    ):
        for offset, limit in ((0, 3), (4, 7), (max(0, len(whole) - 2), 10), (len(whole), 5)):
            count, page = selectors.cost_rows_counted(
                **query, parts=parts, offset=offset, limit=limit, filters=flt, now=NOW
            )
            assert count == len(whole), (group_by, period, offset)
            assert_rows_equal(page, whole[offset : offset + limit])
    assert counted and all(c is not None for c in counted)
    return len(whole)


@needs_postgres
@pytest.mark.parametrize("flt", FILTERS)
@pytest.mark.parametrize("group_by", selectors.GROUP_BY)
@pytest.mark.parametrize("period", ["day", "week", "all"])
def test_offset_pages_are_counted_without_computing_every_row(
    awkward: dict[str, Any], flt: selectors.Filters, group_by: str, period: str
) -> None:
    # The mover's rows carry two attributions (computed the usual way); the others are
    # counted by the buckets their capacity reaches.
    assert _offset_pages_match(flt, group_by, period, START) > 0


@needs_postgres
@pytest.mark.parametrize("group_by", ["gpu", "team", "site"])
@pytest.mark.parametrize(
    ("start", "retired_at"),
    [
        (START, "2026-03-04T12"),
        # Two parts (February, March): a GPU retired in February is not in March's part,
        # so its March rows are no rows, as when each part is computed.
        (dt.date(2026, 2, 20), "2026-03-04T12"),
        (dt.date(2026, 2, 20), "2026-02-25T12"),
    ],
)
def test_rows_outside_capacity_are_counted(
    awkward: dict[str, Any],
    fleet: FleetBuilder,
    group_by: str,
    start: dt.date,
    retired_at: str,
) -> None:
    # Rollup rows where the GPU has no capacity still make rows: GPU-late's days before a
    # service start moved to 5 March, GPU-retired's days after an earlier retirement, and a
    # GPU with no service start at all (its rows only).
    late, retired = awkward["late"], awkward["retired"]
    late.in_service_at = at("2026-03-05T09")
    late.save()
    retired.retired_at = at(retired_at)
    retired.save()
    node = awkward["bare"].node
    loose = fleet.gpu("GPU-loose", node=node, index=1, model=fleet.model("A100"))
    fleet.save([fleet.usage(loose, at("2026-03-02T05"), observed_s=3600, air_s=100)])
    for period in ("day", "month", "all"):
        count = _offset_pages_match(selectors.Filters(), group_by, period, start)
        if group_by == "gpu" and period == "day" and start == START:
            # 6 GPUs' days with rows or capacity (the retired one's up to 6 March), and
            # GPU-loose's one day.
            assert count == 4 * 10 + (10 - 2) + 6 + 1
        if group_by == "gpu" and period == "day" and retired_at.startswith("2026-02"):
            # From 20 February: 4 GPUs' 19 days, the late one's 8, the retired one's 6 in
            # February (its March rows are after it left, in a part without it), GPU-loose's.
            assert count == 4 * 19 + 8 + 6 + 1


@needs_postgres
@pytest.mark.parametrize("group_by", ["gpu", "pool", "team"])
def test_offset_pages_counted_in_a_zone_behind_utc(
    awkward: dict[str, Any], fleet: FleetBuilder, group_by: str
) -> None:
    # The report zone New York (its daily table rebuilt for it), from 20 February: parts of
    # two months, a daylight saving change on 8 March, local days of 23 and 25 UTC hours.
    from telemetry.rollup import daily_usage_rebuild

    fleet.settings(report_time_zone="America/New_York")
    daily_usage_rebuild()
    for period in ("day", "week", "month"):
        assert _offset_pages_match(selectors.Filters(), group_by, period, dt.date(2026, 2, 20))


def test_trend_class_stand_in_entering_service_mid_day(fleet: FleetBuilder) -> None:
    """Two GPUs of one rate class: the first made (the class's stand-in in the pooled sums)
    enters service at noon on 3 March, the other is in service throughout. On 3 March the
    first is not pooled (not in service from midnight) and observes 6 of its 12 hours: 6
    offline hours, whatever the other GPU observed that day (24 of 24)."""
    site = fleet.site("fra1")
    node = fleet.node("n1", pool=fleet.pool("train", site=site))
    fleet.owned("pool:train")
    model = fleet.model("H100-SXM")
    first = fleet.gpu("GPU-a", node=node, index=0, in_service_at=at("2026-03-03T12"), model=model)
    other = fleet.gpu("GPU-b", node=node, index=1, in_service_at=at("2026-01-01T00"), model=model)
    assert first.id < other.id
    rows = []
    hour = at("2026-03-01T00")
    while hour < at("2026-03-05T00"):
        rows.append(fleet.usage(other, hour, samples=60, observed_s=3600.0, air_s=1800.0))
        if at("2026-03-03T12") <= hour < at("2026-03-03T18") or hour >= at("2026-03-04T00"):
            rows.append(fleet.usage(first, hour, samples=60, observed_s=3600.0, air_s=900.0))
        hour += H
    fleet.save(rows)
    now = at("2026-03-06T00")
    end = dt.date(2026, 3, 5)
    trend = selectors.fleet_trend(start=START, end=end, now=now)
    assert [r.offline_hours for r in trend] == [0.0, 0.0, 6.0, 0.0]
    assert [r.capacity_hours for r in trend] == [24.0, 24.0, 36.0, 48.0]
    want = selectors.cost_rows(start=START, end=end, group_by="fleet", period="day", now=now)
    assert_rows_equal(trend, want)


@needs_postgres
@pytest.mark.parametrize("flt", FILTERS[:2])  # nothing is at iad1 from the 7th
def test_fleet_trend_with_one_pooled_span(awkward: dict[str, Any], flt: selectors.Filters) -> None:
    """From 7 March every GPU left is in service from midnight to midnight (the late one
    since the 3rd; the retired one gone, the old one's depreciation over): every pooled GPU
    has the same days, and the pooled statement looks up each row's class alone."""
    from django.test.utils import CaptureQueriesContext

    start = dt.date(2026, 3, 7)
    with CaptureQueriesContext(connection) as queries:
        got = selectors.fleet_trend(start=start, end=END, filters=flt, now=NOW)
    pooled = [q["sql"] for q in queries.captured_queries if "AS klass" in q["sql"]]
    if flt.pools:
        assert not pooled  # filters on the attribution: per GPU
    else:
        assert len(pooled) == 1 and "::date[])[d.gpu_id" not in pooled[0]
    want = selectors.cost_rows(
        start=start, end=END, group_by="fleet", period="day", filters=flt, now=NOW
    )
    assert len(want) == 4 and [r.period_start.day for r in got] == [7, 8, 9, 10]
    assert_rows_equal(got, want)


def test_trend_day_in_progress_pooled_up_to_now(fleet: FleetBuilder) -> None:
    """Three GPUs of one class in service for months; now is 10:30 on 4 March, the day in
    progress (10.5 h since midnight). A: hours 0-9 whole and 30 minutes of hour 10
    (10.5 h, none offline). B: hour 5 missing, hour 10 whole (a clock ahead: more than the
    30 minutes gone, but 10 h in all: 0.5 h offline). C: hours 0-10 whole (11 h: more than
    its capacity, none offline, not -0.5). The day: 31.5 h observed, 0.5 h offline."""
    from django.test.utils import CaptureQueriesContext

    site = fleet.site("fra1")
    node = fleet.node("n1", pool=fleet.pool("train", site=site))
    fleet.owned("pool:train")
    model = fleet.model("H100-SXM")
    early = at("2026-01-01T00")
    a, b, c = (
        fleet.gpu(f"GPU-{n}", node=node, index=i, in_service_at=early, model=model)
        for i, n in enumerate("abc")
    )
    rows = []
    hour = at("2026-03-02T00")
    while hour < at("2026-03-04T11"):
        for gpu in (a, b, c):
            observed = 3600.0
            if hour == at("2026-03-04T10") and gpu == a:
                observed = 1800.0
            if hour == at("2026-03-04T05") and gpu == b:
                hour_skipped = True
                continue
            rows.append(fleet.usage(gpu, hour, samples=60, observed_s=observed, air_s=900.0))
        hour += H
    assert hour_skipped
    fleet.save(rows)
    now = at("2026-03-04T10:30")
    start, end = dt.date(2026, 3, 2), dt.date(2026, 3, 5)
    with CaptureQueriesContext(connection) as queries:
        trend = selectors.fleet_trend(start=start, end=end, now=now)
    if connection.vendor == "postgresql":  # the day in progress among the pooled days
        pooled = [q["sql"] for q in queries.captured_queries if "AS klass" in q["sql"]]
        assert len(pooled) == 1 and "d.day < '2026-03-05'::date" in pooled[0]
    assert [r.offline_hours for r in trend] == [0.0, 0.0, 0.5]
    assert trend[2].observed_hours == 31.5  # 10.5 + 10 + 11
    # Capacity is observed + offline hours: C's 11 observed count whole (docs/metrics.md).
    assert [r.capacity_hours for r in trend] == [72.0, 72.0, 32.0]
    want = selectors.cost_rows(start=start, end=end, group_by="fleet", period="day", now=now)
    assert_rows_equal(trend, want)
    summary, _ = selectors.fleet_overview(start=start, end=end, now=now)
    assert summary.row == selectors.fleet_summary(start=start, end=end, now=now).row
