"""Late data for a closed month, booked when it is written (DESIGN.md §9.1, issue 40).

The fleet is test_perf_paths.py's awkward one, March closed on 3 April. Each case changes one
thing after the close; what changed marks March stale (the hourly table's triggers, or
``billing.signals``), and ``adjust_closed`` books the difference in April. The GPUs given an
adjustment are those the change touched, worked out by hand from the fixture; per group, the
frozen March plus the adjustment is what reopening March computes (to the cent: each row is
rounded on its own); booking again, or twice at once, books nothing more.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from billing import selectors
from tests.billing.conftest import at
from tests.billing.test_perf_paths import (  # noqa: F401 (fixtures)
    _daily_state_present,
    awkward,
    needs_postgres,
)

MARCH_1 = dt.date(2026, 3, 1)
NOW = at("2026-04-03T00")
MONEY = ("fixed_cost", "energy_cost", "idle_cost", "total_cost")


def _late_rows(gpus: dict[str, Any]) -> None:
    """A late hour for "steady": more in the air and more energy on 5 March, 10:00."""
    from telemetry.models import HourlyUsage

    late = HourlyUsage.objects.filter(hour=at("2026-03-05T10"), gpu=gpus["steady"])
    assert late.update(energy_j=2_000_000.0, air_s=3600.0) == 1


def _iad_tariff(gpus: dict[str, Any]) -> None:
    """iad1's tariff raised: "mover" was in serve (iad1) until 5 March, 11:00, and
    "retired" in it all along."""
    from fleet.models import Site

    site = Site.objects.get(name="iad1")
    site.price_per_kwh = Decimal("0.15")
    site.save()


def _train_rate(gpus: dict[str, Any]) -> None:
    """pool:train's purchase price raised: the rate of the GPUs in train now, "steady" and
    "late" on n1 and "mover" (moved there on 5 March); "old" has a profile of its own,
    "bare" none."""
    from billing.models import CostProfile

    profile = CostProfile.objects.get(scope_kind="pool", scope_name="train")
    profile.purchase_price = Decimal("36000.00")
    profile.save()


def _mover_moved(gpus: dict[str, Any]) -> None:
    """ "mover" moved to a new node n4 of its pool (train): the same rate and terms, but its
    offline hours go to n4 now, not to n1 where the close put them."""
    from fleet.models import Node, Pool

    mover = gpus["mover"]
    mover.node = Node.objects.create(hostname="n4", pool=Pool.objects.get(name="train"))
    mover.save()


def _nothing(gpus: dict[str, Any]) -> None:
    """Nothing after the close."""


CASES: list[tuple[Callable[[dict[str, Any]], None], set[str]]] = [
    (_nothing, set()),
    (_late_rows, {"steady"}),
    (_iad_tariff, {"mover", "retired"}),
    (_train_rate, {"steady", "mover", "late"}),
    (_mover_moved, {"mover"}),
]


def _month_sums(rows: list[Any], adjusted: bool) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in rows:
        if (r.adjustment_for == "2026-03") if adjusted else r.period_start.month == 3:
            sums = out.setdefault(r.key, [Decimal(0)] * len(MONEY) + [0.0])
            for i, name in enumerate(MONEY):
                sums[i] += getattr(r, name)
            sums[-1] += r.air_hours
    return out


@needs_postgres
@pytest.mark.parametrize(("change", "touched"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_what_changed_is_booked_once_and_exactly(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    change: Callable[[dict[str, Any]], None],
    touched: set[str],
) -> None:
    from billing.models import ClosedMonthStale, ClosedSegment
    from billing.month_close import adjust_closed, month_close, month_reopen
    from telemetry.models import HourlyUsage

    # The day of overlapping samples made whole: a closed month reads as the sum of its
    # days (test_month_close_storage.py).
    overlap = HourlyUsage.objects.filter(gpu=awkward["steady"], observed_s__gt=3600)
    assert overlap.update(observed_s=3600.0) > 0
    names = {gpu.pk: name for name, gpu in awkward.items()}
    query: dict[str, Any] = {"start": MARCH_1, "end": dt.date(2026, 5, 1), "now": NOW}
    with time_machine.travel(NOW, tick=False):
        month_close(month=MARCH_1, by="test")
        assert not ClosedMonthStale.objects.exists()
        change(awkward)
        assert ClosedMonthStale.objects.exists() == (change is not _nothing)
        frozen = {g: selectors.cost_rows(**query, group_by=g) for g in ("gpu", "pool", "fleet")}
        adjust_closed()
        adjust_closed()  # again: nothing more
        adjust_closed(every=True)  # every closed month, marked or not: nothing more
        booked = ClosedSegment.objects.filter(adjusts__isnull=False)
        assert {names[g] for g in booked.values_list("gpu_id", flat=True)} == touched
        assert set(booked.values_list("day", flat=True)) <= {dt.date(2026, 4, 1)}
        adjusted = {g: selectors.cost_rows(**query, group_by=g, period="month") for g in frozen}
        month_reopen(month=MARCH_1, by="test", reason="compare")
        live = {g: selectors.cost_rows(**query, group_by=g) for g in frozen}
    for group_by in frozen:
        before = _month_sums(frozen[group_by], adjusted=False)
        moved = _month_sums(adjusted[group_by], adjusted=True)
        after = _month_sums(live[group_by], adjusted=False)
        assert set(moved) <= set(after)
        for key, sums in after.items():
            extra = moved.get(key, [Decimal(0)] * len(MONEY) + [0.0])
            for i, name in enumerate(MONEY):
                assert abs(before[key][i] + extra[i] - sums[i]) <= Decimal("0.01"), (key, name)
            assert before[key][-1] + extra[-1] == pytest.approx(sums[-1], abs=1e-9), key


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_book_once(awkward: dict[str, Any]) -> None:  # noqa: F811
    """Two booking runs started together on PostgreSQL (each its own connection): the row
    lock on the close makes the second wait, then find nothing left to book."""
    from django.db import connection

    from billing.models import ClosedSegment
    from billing.month_close import adjust_closed, month_close

    with time_machine.travel(NOW, tick=False):
        month_close(month=MARCH_1, by="test")
    _late_rows(awkward)
    _train_rate(awkward)
    results: list[int] = []
    start = threading.Barrier(2)

    def run() -> None:
        try:
            start.wait()
            results.append(sum(adjust_closed(every=True, now=NOW).booked.values()))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = ClosedSegment.objects.filter(adjusts__isnull=False).count()
    assert rows > 0 and sorted(results) == [0, rows]


@pytest.mark.smoke
def test_rollup_rows_of_a_closed_month_mark_it_stale_on_either_database(
    worked_example: Any, fleet: Any
) -> None:
    """The hourly table's triggers (PostgreSQL: one per statement; SQLite: one per row, made
    again after each migrate) mark the closed month whose hours a write touched, and only it;
    the booking then stores the late hours in April (the first open month)."""
    from billing.models import ClosedMonthStale, ClosedSegment
    from billing.month_close import adjust_closed, month_close
    from tests.billing.test_month_close import CLOSE_NOW, late_batch

    with time_machine.travel(CLOSE_NOW, tick=False):
        month_close(month=MARCH_1, by="test")
        fleet.save([fleet.usage(worked_example, at("2026-04-02T05"), samples=60, observed_s=3600)])
        assert not ClosedMonthStale.objects.exists()  # April is open
        late_batch(fleet, worked_example)  # 2 March, 20:00-24:00
        assert list(ClosedMonthStale.objects.values_list("month", flat=True)) == [MARCH_1]
        assert sum(adjust_closed().booked.values()) == 1
    (late,) = ClosedSegment.objects.filter(adjusts__isnull=False)
    assert (late.adjusts, late.day, late.observed_s) == (
        dt.date(2026, 3, 2),
        dt.date(2026, 4, 1),
        14_400,
    )
