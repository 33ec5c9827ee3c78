"""A window with a closed month in the middle, per GPU and period "all" (issue 19): the open
stretches on both sides are read in one statement (``sums._compute``'s ``runs``), each
stretch's offline hours its own, as if each were computed alone.

Six GPUs from 20 February to 9 April 2026 (now: 9 April, 12:00 UTC), March closed on
2 April: an owned GPU that observed three times the hours of 25 February (overlapping
samples) and is offline every fifth hour of April; one whose depreciation ends in March
(closed) and one whose ends in April (open: its hour is split); one entering service on
3 April; one retired on 25 February; one moving to another pool (and site) on 2 April.
Each GPU's and node's row over the window must be the sum of its rows over the three
stretches computed alone (every figure that adds up), and the over-observed GPU's offline
hours March's and April's alone: a window read as one stretch would net February's
excess against April's gaps.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from billing import selectors
from billing.selectors import sums
from tests.billing.conftest import FleetBuilder, at
from tests.billing.test_perf_paths import (  # noqa: F401 (fixtures)
    _daily_state_present,
    _wave,
    needs_postgres,
)

START, END = dt.date(2026, 2, 20), dt.date(2026, 4, 10)
NOW = at("2026-04-09T12")
STRETCHES = [(START, dt.date(2026, 3, 1)), (dt.date(2026, 3, 1), dt.date(2026, 4, 1))]
STRETCHES += [(dt.date(2026, 4, 1), END)]
H = dt.timedelta(hours=1)
# The figures of a row that add up over stretches.
ADDED = (
    "capacity_hours",
    "observed_hours",
    "air_hours",
    "held_hours",
    "parked_hours",
    "offline_hours",
    "energy_kwh",
    "idle_energy_kwh",
    "co2e_kg",
    "throttled_hours",
    "profiled_hours",
)
MONEY = ("fixed_cost", "energy_cost", "total_cost", "idle_cost")


@pytest.fixture
def stretched(fleet: FleetBuilder) -> dict[str, Any]:
    fra = fleet.site("fra1", pue="1.4", price_per_kwh="0.21", grid_g_per_kwh=380.0)
    iad = fleet.site("iad1", pue="1.2", price_per_kwh="0.09", grid_g_per_kwh=390.0)
    train = fleet.pool("train", site=fra, team=fleet.team("research"))
    serve = fleet.pool("serve", site=iad, team=fleet.team("product"))
    n1, n2 = fleet.node("n1", pool=train), fleet.node("n2", pool=serve)
    h100 = fleet.model("H100-SXM")
    fleet.owned("pool:train", purchase_price="30000.00", depreciation_years="5")
    fleet.rented("pool:serve", rental_rate_per_hour="2.49")
    # Depreciated over a year: ends on 15 March 2026, 10:30 (closed), and 6 April, 06:00.
    fleet.owned("gpu:GPU-march", purchase_price="9000.00", depreciation_years="1")
    fleet.owned("gpu:GPU-april", purchase_price="9000.00", depreciation_years="1")
    early = at("2026-01-01T00")
    gpus = {
        "over": fleet.gpu("GPU-over", node=n1, index=0, in_service_at=early, model=h100),
        "march": fleet.gpu(
            "GPU-march", node=n1, index=1, in_service_at=at("2025-03-15T04:30"), model=h100
        ),
        "april": fleet.gpu(
            "GPU-april", node=n1, index=2, in_service_at=at("2025-04-06T00"), model=h100
        ),
        "late": fleet.gpu(
            "GPU-late", node=n1, index=3, in_service_at=at("2026-04-03T07:20"), model=h100
        ),
        "retired": fleet.gpu(
            "GPU-retired",
            node=n2,
            index=0,
            in_service_at=early,
            retired_at=at("2026-02-25T15:40"),
            model=h100,
        ),
        "mover": fleet.gpu("GPU-mover", node=n2, index=1, in_service_at=early, model=h100),
    }
    rows = []
    hour, i = at("2026-02-20T00"), 0
    while hour < NOW:
        for k, (name, gpu) in enumerate(gpus.items()):
            if name == "late" and hour < at("2026-04-03T07"):
                continue
            if name == "retired" and hour >= at("2026-02-25T16"):
                continue
            if (i + k) % 13 == 0 or (name == "over" and hour.month == 4 and i % 5 == 0):
                continue  # an offline hour
            u = _wave(k, i)
            observed = 3600.0
            if name == "over" and hour.date() == dt.date(2026, 2, 25):
                observed = 10800.0  # overlapping samples: three times the hour
            values: dict[str, Any] = {
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
            if name == "mover" and hour >= at("2026-04-02T11"):
                values.update(node=n1, pool=train, site=fra, team=train.team)
            rows.append(fleet.usage(gpu, hour, **values))
        hour += H
        i += 1
    fleet.save(rows)
    mover = gpus["mover"]
    mover.node = n1
    mover.save()
    return gpus


@needs_postgres
@pytest.mark.parametrize("group_by", ["gpu", "node"])
def test_open_stretches_around_a_closed_month_are_each_computed_alone(
    stretched: dict[str, Any], group_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from billing.month_close import month_close

    with time_machine.travel(at("2026-04-02T00"), tick=False):
        month_close(month=dt.date(2026, 3, 1), by="test")
    read: list[Any] = []
    real = sums._compute

    def recorded(**kwargs: Any) -> Any:
        read.append(kwargs.get("runs"))
        return real(**kwargs)

    monkeypatch.setattr(sums, "_compute", recorded)
    monkeypatch.setattr("billing.selectors.closing._compute", recorded)
    query: dict[str, Any] = {"group_by": group_by, "period": "all", "now": NOW}
    window = {r.key: r for r in selectors.cost_rows(start=START, end=END, **query)}
    # Both open stretches in one computation (then March's late data, looked for: none).
    assert read[0] == [STRETCHES[0], STRETCHES[2]]
    assert all(runs is None for runs in read[1:])
    parts = [selectors.cost_rows(start=a, end=b, **query) for a, b in STRETCHES]
    assert not any(r.adjustment_for for rows in parts for r in rows)
    assert set(window) == {r.key for rows in parts for r in rows}
    for key, row in window.items():
        alone = [r for rows in parts for r in rows if r.key == key]
        for name in ADDED:
            added = sum(getattr(r, name) for r in alone)
            assert getattr(row, name) == pytest.approx(added, rel=1e-9, abs=1e-9), (key, name)
        for name in MONEY:
            added_money = sum((getattr(r, name) for r in alone), Decimal(0))
            assert abs(getattr(row, name) - added_money) < Decimal("1e-9"), (key, name)
    if group_by == "gpu":
        # GPU-over observed 48 h more than 25 February has, more than its February gaps
        # (every 13th hour): its February offline hours are 0, and the excess is not netted
        # against its April gaps (every 5th hour and the 13th).
        over = window["GPU-over"]
        april = next(r for r in parts[2] if r.key == "GPU-over")
        assert over.offline_hours == pytest.approx(
            april.offline_hours + next(r for r in parts[1] if r.key == "GPU-over").offline_hours
        )
        assert next(r for r in parts[0] if r.key == "GPU-over").offline_hours == 0
        assert april.offline_hours > 0


@needs_postgres
def test_each_gpu_s_utilisation_alone_is_its_row_s(stretched: dict[str, Any]) -> None:
    """``gpu_utilizations`` (the heatmap's order): each GPU once, with its row's utilisation
    to the last digit, over a window with March closed and late data for it: GPU-over's
    late hour makes it a row of its own and an adjustment row, GPU-march (split in March)
    and GPU-april (split in April) price two phases, GPU-late has capacity only in April."""
    from billing.month_close import adjust_closed, month_close
    from telemetry.models import HourlyUsage

    with time_machine.travel(at("2026-04-02T00"), tick=False):
        month_close(month=dt.date(2026, 3, 1), by="test")
    late = HourlyUsage.objects.filter(hour=at("2026-03-05T10"), gpu=stretched["over"])
    assert late.update(air_s=3600.0, energy_j=2_000_000.0) == 1
    adjust_closed()  # the task's run: books it in April
    rows = selectors.cost_rows_deferred_by(
        start=START, end=END, group_bys=("gpu",), period="all", now=NOW
    )["gpu"]
    adjusted = [r.key for r in rows if r.row().adjustment_for]
    assert adjusted == ["GPU-over"]
    first: dict[str, Any] = {}
    for r in rows:
        first.setdefault(r.key, r)
    found = selectors.gpu_utilizations(start=START, end=END, now=NOW)
    assert [key for key, _, _ in found] == list(first)
    assert len(found) == len(stretched)
    for key, name, utilization in found:
        assert (name, utilization) == (first[key].name, first[key].utilization), key
        assert utilization is not None and 0 < utilization < 1


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_open_stretches_read_beside_give_the_rows_read_inline(
    stretched: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a transaction the open stretches are computed on a second connection, in a
    thread of their own, while the closed month's frozen segments and the adjustments booked
    are read (``config.replica.read_beside``); inside one (a second connection would not see
    its data) in the caller's thread. The rows are the same to the last digit, in the same order."""
    import threading

    from django.db import transaction

    from billing.month_close import adjust_closed, month_close
    from telemetry.models import HourlyUsage

    with time_machine.travel(at("2026-04-02T00"), tick=False):
        month_close(month=dt.date(2026, 3, 1), by="test")
    late = HourlyUsage.objects.filter(hour=at("2026-03-05T10"), gpu=stretched["over"])
    assert late.update(air_s=3600.0, energy_j=2_000_000.0) == 1
    adjust_closed()  # the task's run: books it in April
    threads: list[str] = []
    real = sums._compute

    def recorded(**kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(**kwargs)

    monkeypatch.setattr("billing.selectors.closing._compute", recorded)
    query: dict[str, Any] = {"start": START, "end": END, "now": NOW}
    for group_by, period in (("gpu", "all"), ("node", "week"), ("team", "month")):
        threads.clear()
        beside = selectors.cost_rows(group_by=group_by, period=period, **query)
        assert threads[0].startswith("gpufleet-reads"), threads
        assert all(t == threading.main_thread().name for t in threads[1:])
        threads.clear()
        with transaction.atomic():
            inline = selectors.cost_rows(group_by=group_by, period=period, **query)
        assert threads and all(t == threading.main_thread().name for t in threads)
        assert [r.adjustment_for for r in beside].count("2026-03") >= 1
        assert repr(beside) == repr(inline)
