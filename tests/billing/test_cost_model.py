"""docs/metrics.md cost formulas, checked against numbers computed by hand (no database)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from billing import cost_model as cm

UTC = dt.UTC
SIX = Decimal("0.000001")

# The worked example: owned, 30,000.00 over 5 years, opex 0.10/h; PUE 1.5, 0.20/kWh, 400 g/kWh.
EXAMPLE = cm.CostTerms(
    kind="owned",
    purchase_price=Decimal("30000.00"),
    depreciation_years=Decimal("5"),
    opex_per_hour=Decimal("0.10"),
)
PUE, PRICE, GRID = Decimal("1.5"), Decimal("0.20"), Decimal("400")


def six(value: Decimal) -> Decimal:
    return value.quantize(SIX)


def test_worked_example_fixed_rate():
    # 30000 / (5 × 8766) + 0.10 = 30000 / 43830 + 0.10 = 0.684463 + 0.10 = 0.784463
    assert six(cm.fixed_rate_per_hour(terms=EXAMPLE)) == Decimal("0.784463")
    assert cm.fixed_rate_per_hour(terms=EXAMPLE, depreciating=False) == Decimal("0.10")


def test_worked_example_day_to_the_cent():
    start = dt.datetime(2026, 3, 2, tzinfo=UTC)
    fixed = cm.fixed_cost(
        terms=EXAMPLE, service_start=start, start=start, end=start + dt.timedelta(days=1)
    )
    assert six(fixed) == Decimal("18.827105")  # 0.7844627 × 24
    energy = cm.energy_cost(kind="owned", energy_kwh=4.95, pue=PUE, price_per_kwh=PRICE)
    assert energy == Decimal("1.485")  # 4.95 × 1.5 × 0.20
    # The selectors price a stretch at one rate: rate × capacity hours, the same 18.827105.
    rate = cm.fixed_rate_per_hour(terms=EXAMPLE)
    assert cm.fixed_cost_at_rate(fixed_rate_per_hour=rate, capacity_hours=Decimal(24)) == fixed
    mean = cm.mean_rate_per_hour(fixed_cost=fixed, capacity_hours=Decimal(24))
    assert six(mean) == Decimal("0.784463")  # the rate again (to the last digit or two)
    assert cm.mean_rate_per_hour(fixed_cost=fixed, capacity_hours=Decimal(0)) == 0
    total = cm.total_cost(fixed_cost=fixed, energy_cost=energy)
    assert six(total) == Decimal("20.312105")
    assert cm.money_round(total) == Decimal("20.31")

    idle = cm.idle_cost(
        kind="owned",
        fixed_rate_per_hour=rate,
        capacity_hours=24,
        air_hours=9,
        idle_energy_kwh=0.95,
        pue=PUE,
        price_per_kwh=PRICE,
    )
    # 0.7844627 × 15 = 11.766940, + 0.95 × 1.5 × 0.20 = 0.285
    assert six(idle) == Decimal("12.051940")
    assert cm.money_round(idle) == Decimal("12.05")

    per_air = cm.cost_per_air_hour(total_cost=total, air_hours=9)
    assert per_air is not None and cm.money_round(per_air) == Decimal("2.26")  # 20.312105 / 9
    assert cm.co2e_kg(energy_kwh=4.95, pue=PUE, grid_g_per_kwh=GRID) == pytest.approx(2.97)
    assert cm.utilization(air_hours=9, capacity_hours=24) == 0.375
    assert cm.hours_in_air_per_day(air_hours=9, capacity_hours=24) == 9.0
    assert cm.offline_hours(capacity_hours=24, observed_hours=20) == 4
    assert cm.offline_hours(capacity_hours=20, observed_hours=20.5) == 0


def test_units():
    assert cm.kwh_from_joules(energy_j=17_820_000.0) == Decimal("4.95")
    assert cm.hours_from_seconds(seconds=32_400.0) == 9
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    assert cm.hours_between(start=start, end=start + dt.timedelta(minutes=90)) == Decimal("1.5")
    assert cm.hours_between(start=start, end=start - dt.timedelta(hours=1)) == 0
    assert cm.energy_per_gpu_hour_kwh(energy_kwh=4.95, observed_hours=20) == pytest.approx(0.2475)
    assert cm.kwh_per_air_hour(energy_kwh=4.95, air_hours=9) == pytest.approx(0.55)
    assert cm.kwh_per_air_hour(energy_kwh=4.95, air_hours=0) is None
    assert cm.utilization(air_hours=0, capacity_hours=0) is None


def test_depreciation_end_is_years_of_8766_hours():
    # 5 × 8,766 h = 43,830 h = 1,826 days + 6 h; 2021–2025 hold 1,826 days (2024 is a leap year).
    start = dt.datetime(2021, 1, 1, 0, 20, tzinfo=UTC)
    end = cm.depreciation_end(service_start=start, depreciation_years=Decimal("5"))
    assert end == dt.datetime(2026, 1, 1, 6, 20, tzinfo=UTC)
    # 0.5 years = 4,383 h = 182 days + 15 h
    half = cm.depreciation_end(service_start=start, depreciation_years=Decimal("0.5"))
    assert half == start + dt.timedelta(days=182, hours=15)


# Clean numbers for the pro-rata hour: 43,830 over 5 years = 1.00/h, opex 0.50 → 1.50 then 0.50.
CLEAN = cm.CostTerms(
    kind="owned",
    purchase_price=Decimal("43830"),
    depreciation_years=Decimal("5"),
    opex_per_hour=Decimal("0.50"),
)
CLEAN_START = dt.datetime(2021, 1, 1, 0, 20, tzinfo=UTC)  # fully depreciated 2026-01-01 06:20


def test_fixed_cost_splits_the_hour_depreciation_ends_in():
    hour = dt.datetime(2026, 1, 1, 6, tzinfo=UTC)
    cost = cm.fixed_cost(
        terms=CLEAN, service_start=CLEAN_START, start=hour, end=hour + dt.timedelta(hours=1)
    )
    # 20 minutes at 1.50 + 40 minutes at 0.50 = 0.50 + 0.333333 = 0.833333
    assert six(cost) == Decimal("0.833333")
    mean = cm.mean_fixed_rate_per_hour(
        terms=CLEAN, service_start=CLEAN_START, start=hour, end=hour + dt.timedelta(hours=1)
    )
    assert six(mean) == Decimal("0.833333")
    # The selectors price that hour at its mean rate: the same 0.833333.
    at_mean = cm.fixed_cost_at_rate(fixed_rate_per_hour=mean, capacity_hours=Decimal(1))
    assert six(at_mean) == Decimal("0.833333")
    # The whole day: 6 h 20 min at 1.50 (9.50) + 17 h 40 min at 0.50 (8.833333) = 18.333333
    day = cm.fixed_cost(
        terms=CLEAN,
        service_start=CLEAN_START,
        start=dt.datetime(2026, 1, 1, tzinfo=UTC),
        end=dt.datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert six(day) == Decimal("18.333333")
    # Entirely after: opex only; entirely before: the full rate.
    later = dt.datetime(2026, 2, 1, tzinfo=UTC)
    assert cm.fixed_cost(
        terms=CLEAN, service_start=CLEAN_START, start=later, end=later + dt.timedelta(hours=10)
    ) == Decimal("5.00")
    earlier = dt.datetime(2025, 2, 1, tzinfo=UTC)
    assert cm.fixed_cost(
        terms=CLEAN,
        service_start=CLEAN_START,
        start=earlier,
        end=earlier + dt.timedelta(hours=10),
    ) == Decimal("15.00")


def test_rented_and_unprofiled():
    rented = cm.CostTerms(kind="rented", rental_rate_per_hour=Decimal("2.35"))
    start = dt.datetime(2026, 3, 2, tzinfo=UTC)
    end = start + dt.timedelta(hours=10)
    assert cm.fixed_rate_per_hour(terms=rented) == Decimal("2.35")
    assert cm.fixed_cost(terms=rented, service_start=start, start=start, end=end) == Decimal(
        "23.50"
    )
    # Rented: energy costs nothing extra, but its carbon still counts.
    assert cm.energy_cost(kind="rented", energy_kwh=10, pue=PUE, price_per_kwh=PRICE) == 0
    assert cm.co2e_kg(energy_kwh=10, pue=PUE, grid_g_per_kwh=GRID) == pytest.approx(6.0)
    assert (
        cm.idle_cost(
            kind="rented",
            fixed_rate_per_hour=Decimal("2.35"),
            capacity_hours=10,
            air_hours=4,
            idle_energy_kwh=3,
            pue=PUE,
            price_per_kwh=PRICE,
        )
        == Decimal("14.10")  # 2.35 × 6, no energy
    )
    # No profile: no fixed cost, energy at the site's tariff.
    assert cm.fixed_cost(terms=None, service_start=start, start=start, end=end) == 0
    assert cm.energy_cost(kind=None, energy_kwh=10, pue=PUE, price_per_kwh=PRICE) == Decimal("3.0")


def test_money_round_is_half_up_to_cents():
    assert cm.money_round(Decimal("2.245")) == Decimal("2.25")  # banker's rounding gives 2.24
    assert cm.money_round(Decimal("0.125")) == Decimal("0.13")
    assert cm.money_round(Decimal("0.124999")) == Decimal("0.12")
    assert cm.money_round(Decimal("564.0891")) == Decimal("564.09")


def test_cost_profile_resolution_most_specific_wins():
    profiles = {("site", "fra1"): "site", ("pool", "train"): "pool", ("node", "gpu-07"): "node"}
    kw = {"gpu_uuid": "GPU-1", "hostname": "gpu-07", "pool_name": "train", "site_name": "fra1"}
    assert cm.cost_profile_resolve(profiles=profiles, **kw) == "node"
    assert cm.cost_profile_resolve(profiles={**profiles, ("gpu", "GPU-1"): "gpu"}, **kw) == "gpu"
    assert cm.cost_profile_resolve(profiles=profiles, **{**kw, "hostname": "other"}) == "pool"
    assert (
        cm.cost_profile_resolve(profiles=profiles, **{**kw, "hostname": "x", "pool_name": None})
        == "site"
    )
    assert cm.cost_profile_resolve(profiles={}, **kw) is None
    # The scopes the GPU page asks the database for: those with a name, most specific first.
    assert cm.cost_profile_scopes(**kw) == [
        ("gpu", "GPU-1"),
        ("node", "gpu-07"),
        ("pool", "train"),
        ("site", "fra1"),
    ]
    assert cm.cost_profile_scopes(**{**kw, "pool_name": None, "site_name": None}) == [
        ("gpu", "GPU-1"),
        ("node", "gpu-07"),
    ]


def test_capacity_interval_clips_to_service_and_now():
    day = dt.datetime(2026, 3, 2, tzinfo=UTC)
    end = day + dt.timedelta(days=1)
    noon = day + dt.timedelta(hours=12)
    assert cm.capacity_interval(
        service_start=day - dt.timedelta(days=9), retired_at=None, start=day, end=end, now=noon
    ) == (day, noon)
    assert cm.capacity_interval(
        service_start=day + dt.timedelta(hours=3),
        retired_at=day + dt.timedelta(hours=5),
        start=day,
        end=end,
        now=end,
    ) == (day + dt.timedelta(hours=3), day + dt.timedelta(hours=5))
    assert (
        cm.capacity_interval(service_start=None, retired_at=None, start=day, end=end, now=end)
        is None
    )
    assert (
        cm.capacity_interval(service_start=end, retired_at=None, start=day, end=end, now=end)
        is None
    )


def test_recoverable_gpus_and_money():
    # 10 GPUs for a day: 240 capacity hours, 36 air hours; at T = 0.6 the work needs 60 h,
    # so (240 − 60) / 24 = 7.5 GPUs are spare; × 1.50/h × 8,766 h = 98,617.50 a year.
    spare = cm.recoverable_gpus(
        capacity_hours=240, air_hours=36, period_hours=24, target_utilization=0.6
    )
    assert spare == pytest.approx(7.5)
    money = cm.recoverable_money_per_year(
        recoverable_gpus=spare, mean_fixed_rate_per_hour=Decimal("1.50")
    )
    assert cm.money_round(money) == Decimal("98617.50")
    # Busier than the target: nothing to recover, never negative.
    assert (
        cm.recoverable_gpus(
            capacity_hours=24, air_hours=20, period_hours=24, target_utilization=0.6
        )
        == 0
    )


def test_to_decimal_rejects_nan():
    with pytest.raises(ValueError):
        cm.to_decimal(float("nan"))


def test_segment_costs_prices_a_segment_as_the_single_formulas():
    # 2 h observed + 1 h offline = 3 h capacity, 1 h in the air, 1 kWh, 0.5 kWh idle, 2 h
    # profiled with 1 kWh; 2.00/h, PUE 1.5, 0.20/kWh, 400 g/kWh. By hand: fixed 2 × 3 = 6,
    # energy 1 × 1.5 × 0.2 = 0.30, idle 2 × (3 − 1) + 0.5 × 1.5 × 0.2 = 4.15, CO2e
    # 1 × 1.5 × 400 / 1000 = 0.6 kg, profiled 2 × 2 + 0.30 = 4.30.
    args = (Decimal(2), 7200.0, Decimal(1), 3600.0, 3.6e6, 1.8e6)
    site = (Decimal("1.5"), Decimal("0.2"), Decimal(400))
    owned = cm.segment_costs(cm.OWNED, *args, *site, 2.0, 3.6e6)
    assert owned == (
        Decimal(3),
        Decimal(1),
        Decimal("0.5"),
        Decimal(6),
        Decimal("0.30"),
        Decimal("4.15"),
        pytest.approx(0.6),
        Decimal("4.30"),
    )
    # Rented: the rate includes energy; CO2e all the same. No profiled hours: None.
    rented = cm.segment_costs(cm.RENTED, *args, *site, 0.0, 0.0)
    assert rented[3:] == (Decimal(6), Decimal(0), Decimal(4), pytest.approx(0.6), None)
    # The same figures, digit for digit, as the single-purpose functions.
    energy = cm.kwh_from_joules(energy_j=3.6e6)
    assert owned[5] == cm.idle_cost(
        kind=cm.OWNED,
        fixed_rate_per_hour=Decimal(2),
        capacity_hours=Decimal(3),
        air_hours=cm.hours_from_seconds(seconds=3600.0),
        idle_energy_kwh=cm.kwh_from_joules(energy_j=1.8e6),
        pue=Decimal("1.5"),
        price_per_kwh=Decimal("0.2"),
    )
    assert owned[6] == cm.co2e_kg(energy_kwh=energy, pue=1.5, grid_g_per_kwh=400)
