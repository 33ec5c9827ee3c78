"""How a close is stored and read at scale (issue 19; docs/finance.md, "Month close").

The worked example (tests/billing/conftest.py) in service from 2 March 2026, 00:00 UTC: March
holds 30 days (720 h), 20 of them observed on 2 March; the late batch of test_month_close.py
fills 2 March 20:00-24:00 (4 h observed and in the air, 5,760,000 J).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from billing import selectors
from tests.billing.conftest import at, migrated_back
from tests.billing.test_month_close import CLOSE_NOW, book, close, late_batch, rows
from tests.billing.test_perf_paths import (  # noqa: F401 (fixtures)
    _daily_state_present,
    assert_rows_equal,
    awkward,
)

MARCH_1 = dt.date(2026, 3, 1)
APRIL = {"start": "2026-04-01", "end": "2026-05-01", "period": "month"}


def test_a_close_keeps_a_month_row_per_gpu_and_only_the_late_data(
    worked_example: Any, fleet: Any, role_client: Any
) -> None:
    """March's close: a row per GPU and day, and one for the month that sums them (what a
    page reading whole months sums). March's late data, booked as April closes (each close
    books what is stale first), is a row of March's close booked in April: the live day less
    the frozen one, one row for 2 March, none for the 29 days that did not move."""
    from billing.models import ClosedSegment

    with time_machine.travel(CLOSE_NOW, tick=False):
        close("2026-03")
        late_batch(fleet, worked_example)
    march = ClosedSegment.objects.filter(close__month=MARCH_1)
    (month,) = march.filter(whole_month=True)
    days = march.filter(whole_month=False)
    assert (month.day, month.adjusts) == (MARCH_1, None)
    assert month.observed_s == sum(d.observed_s for d in days) == 20 * 3600
    assert month.energy_j == sum(d.energy_j for d in days) == 17_820_000
    # 720 h in service, 20 observed: 700 offline, 4 of them on 2 March, 24 on each later day.
    assert month.offline_h == sum(d.offline_h for d in days) == Decimal(700)
    assert sorted({d.day.day for d in days}) == list(range(2, 32))
    # Its days: 2 to 31 March, a bit each (bit d - 1 for day d).
    assert month.days == sum(1 << (d - 1) for d in range(2, 32)) == 2**31 - 2
    assert {d.days for d in days} == {None}

    with time_machine.travel(at("2026-05-03T00"), tick=False):
        close("2026-04")
    (late,) = ClosedSegment.objects.filter(adjusts__isnull=False)
    assert (late.close.month, late.adjusts, late.day, late.whole_month) == (
        MARCH_1,
        dt.date(2026, 3, 2),
        dt.date(2026, 4, 1),
        False,
    )
    assert late.booked_at == at("2026-05-03T00")
    assert (late.observed_s, late.air_s, late.energy_j) == (14_400, 14_400, 5_760_000)
    assert late.offline_h == Decimal(-4)
    assert late.samples == 240


def test_a_close_without_late_data_carries_nothing(worked_example: Any) -> None:
    from billing.models import ClosedSegment

    with time_machine.travel(CLOSE_NOW, tick=False):
        close("2026-03")
    with time_machine.travel(at("2026-05-03T00"), tick=False):
        close("2026-04")
    assert not ClosedSegment.objects.filter(adjusts__isnull=False).exists()
    assert ClosedSegment.objects.filter(whole_month=True).count() == 2  # March's and April's


@pytest.mark.parametrize("group_by", ["fleet", "team", "pool", "site", "model", "gpu", "node"])
def test_late_data_is_the_same_by_price_class_and_per_gpu(
    worked_example: Any, fleet: Any, role_client: Any, group_by: str
) -> None:
    """April's adjustment for March, read by class (fleet, team, pool, site, model: from the
    monthly rows and the month rows of the close, summed per class in SQL) and per GPU or
    node: 0.48 of energy and -3.14 of idle cost every way (test_month_close.py's docstring);
    and the fleet summary's April total is its rows' (April's own and the adjustment)."""
    from billing.selectors import fleet_summary

    with time_machine.travel(CLOSE_NOW, tick=False):
        close("2026-03")
        late_batch(fleet, worked_example)
        book()
        finance = role_client("finance")
        found = rows(finance, {**APRIL, "group_by": group_by})
        (adjustment,) = [r for r in found if r["adjustment_for"] == "2026-03"]
        assert (adjustment["energy_cost"], adjustment["idle_cost"]) == ("0.48", "-3.14")
        assert (adjustment["fixed_cost"], adjustment["total_cost"]) == ("0.00", "0.48")
        assert adjustment["offline_hours"] == -4.0 and adjustment["air_hours"] == 4.0
        summary = fleet_summary(start=dt.date(2026, 4, 1), end=dt.date(2026, 5, 1))
        total = sum(Decimal(r["total_cost"]) for r in found)  # April's 4.5 days, the late 0.48
        assert abs(summary.row.total_cost - total) <= Decimal("0.01")  # rows rounded apart


def test_overlapping_samples_in_a_closed_month_book_no_adjustment(
    worked_example: Any, fleet: Any, role_client: Any
) -> None:
    """2 March observed 25 h (the late batch, and one hour of overlapping samples: 7,200 s):
    its offline hours are 0, not -1, so March's 696 offline hours are not the month's 720 h
    less 25 observed. The late data of a month is found from its monthly rows only for the
    GPUs whose days add up to it; this one is recomputed day by day, and the close, made
    with that day already there, has nothing to adjust."""
    from telemetry.models import HourlyUsage

    with time_machine.travel(CLOSE_NOW, tick=False):
        late_batch(fleet, worked_example)
        HourlyUsage.objects.filter(hour=at("2026-03-02T03")).update(observed_s=7200)
        close("2026-03")
        finance = role_client("finance")
        for group_by in ("fleet", "gpu"):
            (march,) = rows(finance, {**APRIL, "start": "2026-03-01", "group_by": group_by})[:1]
            assert march["offline_hours"] == 696.0 and march["closed"] is True
            found = rows(finance, {**APRIL, "group_by": group_by})
            assert [r["adjustment_for"] for r in found] == [None]


@pytest.mark.parametrize("group_by", ["fleet", "team", "model", "gpu", "node"])
@pytest.mark.parametrize("period", ["month", "day"])
def test_an_awkward_closed_month_reads_as_computed_and_books_late_data_exactly(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    group_by: str,
    period: str,
) -> None:
    """test_perf_paths.py's six GPUs in March (a depreciation ending, service starting and
    ending mid-day, a GPU moving pool and site, one without a profile, a day of overlapping
    samples), March closed on 3 April: every March and April row as the live computation
    gave it before the close, and no adjustment. Then late data for two GPUs (one read from
    its monthly rows, the retired one day by day) is booked in April, per group, as exactly
    what reopening March adds to it (to the cent: each row is rounded on its own).

    Its day of overlapping samples is made whole first: a closed month reads as the sum of
    its days, and that day's offline hours are 0, where the live month of that GPU counts
    the excess against the others (test_overlapping_samples_in_a_closed_month_book_no_
    adjustment keeps one)."""
    from billing.month_close import adjust_closed, month_close, month_reopen
    from telemetry.models import HourlyUsage

    overlap = HourlyUsage.objects.filter(gpu=awkward["steady"], observed_s__gt=3600)
    assert overlap.update(observed_s=3600.0) > 0

    query = {
        "start": MARCH_1,
        "end": dt.date(2026, 5, 1),
        "group_by": group_by,
        "period": period,
        "now": at("2026-04-03T00"),
    }
    with time_machine.travel(query["now"], tick=False):
        live = selectors.cost_rows(**query)
        month_close(month=MARCH_1, by="test")
        frozen = selectors.cost_rows(**query)
        assert all(r.closed == (r.period_start.month == 3) for r in frozen)
        assert_rows_equal([dataclasses.replace(r, closed=False) for r in frozen], live)

        late = HourlyUsage.objects.filter(hour=at("2026-03-05T10"))
        assert late.filter(gpu=awkward["retired"]).update(energy_j=2_000_000.0, air_s=3600.0)
        assert late.filter(gpu=awkward["steady"]).update(energy_j=2_000_000.0, air_s=3600.0)
        assert selectors.cost_rows(**query) == frozen  # nothing booked yet
        adjust_closed()
        booked = selectors.cost_rows(**query)
        adjustments = {r.key: r for r in booked if r.adjustment_for == "2026-03"}
        assert adjustments  # booked on April's first day (its first bucket)
        assert {r.period_start.date() for r in adjustments.values()} == {dt.date(2026, 4, 1)}
        month_reopen(month=MARCH_1, by="test", reason="late rows")
        reopened = selectors.cost_rows(**query)
    money = ("fixed_cost", "energy_cost", "idle_cost", "total_cost", "air_hours")

    def march(found: list[Any]) -> dict[str, list[Any]]:
        """Per group, its March rows' figures summed (rows of a day or of the month)."""
        out: dict[str, list[Any]] = {}
        for r in found:
            if r.period_start.month == 3 and r.adjustment_for is None:
                sums = out.setdefault(r.key, [0] * len(money))
                for i, name in enumerate(money):
                    sums[i] += getattr(r, name)
        return out

    before, after = march(frozen), march(reopened)
    rounding = Decimal("0.01") * (31 if period == "day" else 1)  # each row rounded
    assert set(adjustments) <= set(after)
    for key, sums in after.items():
        extra = adjustments.get(key)
        for i, name in enumerate(money):
            moved = getattr(extra, name) if extra else 0
            if name == "air_hours":
                assert before[key][i] + moved == pytest.approx(sums[i], abs=1e-9), key
            else:
                assert abs(before[key][i] + moved - sums[i]) <= rounding, (key, name)


@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_stored_documents_into_columns_and_month_rows(fleet: Any) -> None:
    """A close stored before issue 19's columns (its figures one JSON document per row)
    reads the same after ``migrate``: each value in its column, the decimals as they were
    written, and a month row per GPU, attribution and terms summing the month's own rows
    (not the adjustment it carried)."""
    site = fleet.site("fra1")
    node = fleet.node("gpu-07", pool=fleet.pool("inference", site=site))
    gpu = fleet.gpu("GPU-old", node=node, in_service_at=at("2026-03-01T00"))
    with migrated_back("billing", "0004_month_close_focus_export") as old:
        close = old.get_model("billing", "MonthClose").objects.create(
            month=MARCH_1, closed_at=at("2026-04-02T00"), closed_by="alice", zone="UTC"
        )

        def figures(observed_s: float, offline_h: str) -> dict[str, Any]:
            return {
                "sums": {"observed_s": observed_s, "energy_j": observed_s * 100, "sm_hours": 2},
                "offline_h": offline_h,
                "rate": "0.7844626967830253251197809719",
                "kind": "owned",
                "site": "fra1",
                "pue": "1.50",
                "price_per_kwh": "0.2000",
                "grid_g_per_kwh": "400.0",
            }

        segment = old.get_model("billing", "ClosedSegment").objects
        for day, observed, offline, adjusts in (
            (dt.date(2026, 3, 1), 86_400.0, "0", None),
            (dt.date(2026, 3, 2), 72_000.0, "4", None),
            (dt.date(2026, 3, 1), 3_600.0, "-1", dt.date(2026, 2, 27)),
        ):
            segment.create(
                close=close,
                day=day,
                gpu_id=gpu.pk,
                site_id_at=site.pk,
                figures=figures(observed, offline),
                adjusts=adjusts,
            )
    from billing.models import ClosedSegment

    stored = {(r.day, r.adjusts, r.whole_month): r for r in ClosedSegment.objects.filter(gpu=gpu)}
    assert len(stored) == 4
    month = stored[(MARCH_1, None, True)]
    assert (month.observed_s, month.energy_j, month.sm_hours) == (158_400, 15_840_000, 4)
    assert month.offline_h == Decimal(4)
    late = stored[(MARCH_1, dt.date(2026, 2, 27), False)]
    assert (late.observed_s, late.offline_h, late.samples) == (3_600, Decimal(-1), 0)
    for row in stored.values():
        assert (row.rate, row.kind, row.site_name) == (
            "0.7844626967830253251197809719",
            "owned",
            "fra1",
        )
        assert (row.pue, row.price_per_kwh, row.grid_g_per_kwh) == ("1.50", "0.2000", "400.0")


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_month_rows_stored_before_their_days(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
) -> None:
    """Month rows stored before a close kept their days get them from their day rows
    (billing 0011, PostgreSQL): each the days of its GPU's day rows at its attribution and
    terms, as a close keeps them. On the awkward fleet "mover" has a month row per pool
    (in serve until 5 March, 11:00, in train from then: days 1-5 and 5-31), "late" its
    days from its service start, "retired" those to its retirement."""
    from django.db import connection

    from billing.models import ClosedSegment
    from billing.month_close import month_close

    with time_machine.travel(at("2026-04-03T00"), tick=False):
        month_close(month=MARCH_1, by="test")
    month_rows = ClosedSegment.objects.filter(whole_month=True)
    kept = dict(month_rows.values_list("pk", "days"))
    assert kept and None not in kept.values()
    day_rows = ClosedSegment.objects.filter(whole_month=False, adjusts__isnull=True)
    for row in month_rows:
        same = day_rows.filter(
            gpu_id=row.gpu_id,
            node_id_at=row.node_id_at,
            pool_id_at=row.pool_id_at,
            rate=row.rate,
            site_name=row.site_name,
        )
        assert row.days == sum({1 << (d.day.day - 1) for d in same}), row.gpu_id
    assert len(set(kept.values())) > 1  # not every GPU has every day
    if connection.vendor != "postgresql":
        return
    month_rows.update(days=None)
    with migrated_back("billing", "0010_close_state"):
        pass
    assert dict(month_rows.values_list("pk", "days")) == kept
