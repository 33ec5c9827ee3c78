"""Hypothesis: block hours add up to capacity in every group and period, and every group-by
splits the fleet's hours and money exactly (a fleet figure is the sum of its parts)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.selectors import GROUP_BY, cost_rows
from tests.billing.conftest import FleetBuilder, at

WINDOW_START = dt.date(2026, 3, 1)  # a Sunday: weeks get clipped
WINDOW_END = dt.date(2026, 3, 5)
HOURS = 4 * 24
MONEY_TOLERANCE = Decimal("1e-18")


def _calendar_hours(start: dt.datetime, end: dt.datetime) -> float:
    return max(0.0, (end - start).total_seconds() / 3600)


@pytest.mark.django_db
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_block_hours_sum_to_capacity_and_groups_sum_to_the_fleet(data):
    zone = data.draw(st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]))
    period = data.draw(st.sampled_from(["day", "week", "month", "all"]))
    with transaction.atomic():
        fleet = FleetBuilder()
        fleet.settings(report_time_zone=zone)
        sites = [fleet.site("s0"), fleet.site("s1", pue="1.2", price_per_kwh="0.1")]
        teams = [fleet.team("t0"), fleet.team("t1")]
        pools = [
            fleet.pool("p0", site=sites[0], team=teams[0]),
            fleet.pool("p1", site=sites[1], team=teams[1]),
        ]
        nodes = [
            fleet.node("n0", pool=pools[0]),
            fleet.node("n1", pool=pools[1]),
            fleet.node("n2", site=sites[0]),  # no pool, no team
        ]
        models = [fleet.model("H100-SXM"), None]
        fleet.owned("pool:p0", purchase_price="43830", depreciation_years="0.01")
        fleet.owned("site:s0", purchase_price="30000", depreciation_years="5")
        fleet.rented("pool:p1", rental_rate_per_hour="2.35")

        # The query window is in the report zone; samples are laid out over UTC hours that
        # cover it generously, and in-service windows end anywhere.
        base = at("2026-02-28T12")
        now = base + dt.timedelta(hours=data.draw(st.integers(12, HOURS + 24)))
        expected_capacity = 0.0
        window_start_utc = None
        rows = []
        n_gpus = data.draw(st.integers(1, 4))
        for i in range(n_gpus):
            start_h = data.draw(st.integers(-200, HOURS))
            start_min = data.draw(st.sampled_from([0, 20]))
            service_start = base + dt.timedelta(hours=start_h, minutes=start_min)
            retired = None
            if data.draw(st.booleans()):
                retired = service_start + dt.timedelta(hours=data.draw(st.integers(1, 300)))
            node = nodes[data.draw(st.integers(0, 2))]
            gpu = fleet.gpu(
                f"G{i}",
                node=node,
                index=i,
                in_service_at=service_start,
                retired_at=retired,
                team=data.draw(st.sampled_from([None, teams[0]])),
                model=data.draw(st.sampled_from(models)),
            )
            # Rollup rows only for hours wholly in service and past (the rollup excludes the
            # rest); attribution as it was: any node.
            specs = data.draw(
                st.lists(
                    st.tuples(
                        st.integers(0, HOURS + 35),  # hour from base
                        st.integers(0, 3600),  # air seconds
                        st.integers(0, 3600),  # held seconds (capped below)
                        st.integers(0, 3600),  # parked seconds (capped below)
                        st.integers(0, 2_520_000),  # energy J
                        st.integers(0, 2),  # the node it was on then
                    ),
                    max_size=40,
                    unique_by=lambda spec: spec[0],
                )
            )
            for h, air, held, parked, energy_j, node_then in specs:
                hour = base + dt.timedelta(hours=h)
                end = hour + dt.timedelta(hours=1)
                if hour < service_start or (retired and end > retired) or end > now:
                    continue
                held = min(held, 3600 - air)
                parked = min(parked, 3600 - air - held)
                observed = float(air + held + parked)
                rows.append(
                    fleet.usage(
                        gpu,
                        hour,
                        node=nodes[node_then],
                        samples=60,
                        observed_s=observed,
                        air_s=float(air),
                        held_s=float(held),
                        parked_s=float(parked),
                        energy_j=float(energy_j),
                        idle_energy_j=float(energy_j) if air == 0 else 0.0,
                        idle_s=observed if air == 0 else 0.0,
                        throttle_any_s=float(held),
                    )
                )
        fleet.save(rows)

        by_group = {
            g: cost_rows(start=WINDOW_START, end=WINDOW_END, group_by=g, period=period, now=now)
            for g in GROUP_BY
        }
        # Independent capacity: calendar overlap of each GPU's service window with the query.
        (whole,) = cost_rows(start=WINDOW_START, end=WINDOW_END, group_by="fleet", now=now) or [
            None
        ]
        if whole is not None:
            window_start_utc = whole.period_start.astimezone(dt.UTC)
            window_end_utc = whole.period_end.astimezone(dt.UTC)
            from fleet.models import Gpu

            for gpu in Gpu.objects.all():
                lo = max(gpu.in_service_at, window_start_utc)
                hi = min(window_end_utc, now, gpu.retired_at or now)
                expected_capacity += _calendar_hours(lo, hi)
            assert whole.capacity_hours == pytest.approx(expected_capacity, abs=1e-9)

        for group_by, group_rows in by_group.items():
            for row in group_rows:
                blocks = row.air_hours + row.held_hours + row.parked_hours + row.offline_hours
                assert blocks == pytest.approx(row.capacity_hours, abs=1e-9), (group_by, row)
                assert row.offline_hours >= 0
                if row.capacity_hours > 0:
                    assert 0 <= row.utilization <= 1 + 1e-12

        fleet_rows = {r.period_start: r for r in by_group["fleet"]}
        for group_by in GROUP_BY:
            totals: dict = {}
            for row in by_group[group_by]:
                t = totals.setdefault(row.period_start, dict.fromkeys(_SUMMED, 0))
                for name in _SUMMED:
                    t[name] += getattr(row, name)
            assert totals.keys() == fleet_rows.keys(), group_by
            if group_by in ("gpu", "model"):  # a GPU is in one of these; it may move between others
                for start, fleet_row in fleet_rows.items():
                    count = sum(r.gpu_count for r in by_group[group_by] if r.period_start == start)
                    assert count == fleet_row.gpu_count
            for start, t in totals.items():
                f = fleet_rows[start]
                for name in _SUMMED:
                    if isinstance(t[name], Decimal):
                        assert abs(t[name] - getattr(f, name)) < MONEY_TOLERANCE, (group_by, name)
                    else:
                        assert t[name] == pytest.approx(getattr(f, name), abs=1e-9), (
                            group_by,
                            name,
                        )
        transaction.set_rollback(True)


_SUMMED = (
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
    "fixed_cost",
    "energy_cost",
    "total_cost",
    "idle_cost",
)
