"""The selectors over hourly rollups written by hand: docs/metrics.md numbers to the cent."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import selectors
from billing.cost_model import money_round
from billing.selectors import Filters, breakeven_compute, cost_rows, fleet_summary
from tests.billing.conftest import EXAMPLE_DAY, EXAMPLE_NOW, at

NEXT_DAY = EXAMPLE_DAY + dt.timedelta(days=1)
SIX = Decimal("0.000001")


@pytest.mark.smoke
def test_worked_example_through_cost_rows(worked_example):
    (row,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW)
    assert (row.key, row.name, row.gpu_count) == ("GPU-example", "gpu-07#0", 1)
    assert row.period_start == at("2026-03-02T00") and row.period_end == at("2026-03-03T00")
    assert row.capacity_hours == 24
    assert row.observed_hours == 20
    assert (row.air_hours, row.held_hours, row.parked_hours, row.offline_hours) == (9, 6, 5, 4)
    assert row.utilization == 0.375
    assert row.hours_in_air_per_day == 9.0
    assert row.energy_kwh == pytest.approx(4.95)
    assert row.idle_energy_kwh == pytest.approx(0.95)
    assert row.fixed_cost.quantize(SIX) == Decimal("18.827105")
    assert row.energy_cost == Decimal("1.485")
    assert money_round(row.total_cost) == Decimal("20.31")
    assert row.total_cost.quantize(SIX) == Decimal("20.312105")
    assert money_round(row.idle_cost) == Decimal("12.05")
    assert row.idle_cost.quantize(SIX) == Decimal("12.051940")
    assert row.cost_per_air_hour is not None
    assert money_round(row.cost_per_air_hour) == Decimal("2.26")
    assert row.co2e_kg == pytest.approx(2.97)
    assert row.priced is True
    assert row.currency == "USD"
    assert row.nominal_rate_per_hour.quantize(SIX) == Decimal("0.784463")
    assert row.work_utilization is None
    # The same numbers by team, pool, site and for the fleet.
    for group_by, key in [("team", "research"), ("pool", "inference"), ("site", "fra1")]:
        (grouped,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by=group_by, now=EXAMPLE_NOW)
        assert (grouped.key, grouped.capacity_hours) == (key, 24)
        assert grouped.total_cost == row.total_cost and grouped.idle_cost == row.idle_cost


@pytest.mark.smoke
def test_worked_example_through_breakeven_compute(worked_example):
    result = breakeven_compute(
        pool="inference",
        start=EXAMPLE_DAY,
        end=NEXT_DAY,
        tokens_per_s=2000,
        api_price_per_mtok=Decimal("0.60"),
        rental_rate_per_hour=Decimal("2.35"),
        now=EXAMPLE_NOW,
    )
    assert result.fixed_rate_per_hour.quantize(SIX) == Decimal("0.784463")
    # (17,820,000 − 3,420,000) J / (72,000 − 36,000) s = 400 W; 3,420,000 J / 36,000 s = 95 W
    assert result.p_active_kw == pytest.approx(0.400)
    assert result.p_idle_kw == pytest.approx(0.095)
    assert (result.pue, result.price_per_kwh) == (1.5, Decimal("0.20"))
    assert result.utilization == 0.375
    assert result.breakeven_utilization is not None
    assert round(result.breakeven_utilization, 6) == 0.192258
    assert result.own_cost_per_mtok is not None
    assert result.own_cost_per_mtok.quantize(SIX) == Decimal("0.313806")
    assert money_round(result.own_cost_per_month) == Decimal("618.51")
    assert money_round(result.api_cost_per_month) == Decimal("1182.60")
    assert money_round(result.savings_per_month) == Decimal("564.09")
    assert result.rent_breakeven_utilization is not None
    assert round(result.rent_breakeven_utilization, 6) == 0.359957
    assert len(result.curve) == 20 and result.curve[0][0] == pytest.approx(0.05)
    assert result.curve[-1][1].quantize(SIX) == Decimal("0.125620")  # 0.904463 / 7.2


def test_breakeven_blended_price_and_errors(worked_example):
    # 0.30 × 0.5 + 0.90 × 0.5 = 0.60: the same answer as the blended 0.60.
    result = breakeven_compute(
        pool="inference",
        start=EXAMPLE_DAY,
        end=NEXT_DAY,
        tokens_per_s=2000,
        api_input_price_per_mtok=Decimal("0.30"),
        api_output_price_per_mtok=Decimal("0.90"),
        output_share=0.5,
        now=EXAMPLE_NOW,
    )
    assert result.api_price_per_mtok == Decimal("0.60")
    assert money_round(result.savings_per_month) == Decimal("564.09")
    assert result.rent_breakeven_utilization is None
    with pytest.raises(LookupError):
        breakeven_compute(
            pool="nope", start=EXAMPLE_DAY, end=NEXT_DAY, tokens_per_s=1, api_price_per_mtok=API1
        )
    with pytest.raises(ValueError, match="api_price_per_mtok"):
        breakeven_compute(pool="inference", start=EXAMPLE_DAY, end=NEXT_DAY, tokens_per_s=1)
    with pytest.raises(ValueError, match="tokens_per_s"):
        breakeven_compute(
            pool="inference",
            start=EXAMPLE_DAY,
            end=NEXT_DAY,
            tokens_per_s=0,
            api_price_per_mtok=API1,
        )
    with pytest.raises(ValueError, match="end"):
        cost_rows(start=NEXT_DAY, end=EXAMPLE_DAY)
    with pytest.raises(ValueError, match="group_by"):
        cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="rack")


API1 = Decimal("1")


def test_breakeven_falls_back_to_nominal_power(fleet):
    # No samples at all: P_act, P_idle are the model's nominal 700 W and 69 W.
    site = fleet.site("fra1")
    pool = fleet.pool("train", site=site)
    node = fleet.node("n1", pool=pool)
    fleet.gpu("G1", node=node, in_service_at=at("2026-03-01T00"), model=fleet.model("H100-SXM"))
    fleet.owned("pool:train")
    result = breakeven_compute(
        pool="train",
        start=EXAMPLE_DAY,
        end=NEXT_DAY,
        tokens_per_s=1000,
        api_price_per_mtok=API1,
        now=EXAMPLE_NOW,
    )
    assert (result.p_active_kw, result.p_idle_kw) == (pytest.approx(0.7), pytest.approx(0.069))
    assert result.utilization == 0  # 24 h of capacity, all offline


def test_now_cuts_capacity_and_the_month_scales_to_730_hours(worked_example):
    # At 12:00 on the example day: capacity 12 h (hours 00–11), observed 12, air 10 × 0.9 = 9 h.
    noon = at("2026-03-02T12")
    (row,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=noon)
    assert (row.capacity_hours, row.observed_hours, row.offline_hours) == (12, 12, 0)
    assert row.air_hours == 9 and row.held_hours == 3  # 10 × 0.1 h + 2 × 1 h
    result = breakeven_compute(
        pool="inference",
        start=EXAMPLE_DAY,
        end=NEXT_DAY,
        tokens_per_s=2000,
        api_price_per_mtok=Decimal("0.60"),
        now=noon,
    )
    assert result.utilization == 0.75
    # 12 capacity hours in a 12-hour window → 730 h a month; tokens 0.75 × 7.2e6 × 730 / 1e6
    # = 3,942 Mtok → API 2,365.20.
    assert money_round(result.api_cost_per_month) == Decimal("2365.20")


@pytest.mark.smoke
def test_depreciation_ends_mid_period_pro_rata(fleet):
    """43,830 over 5 years (1.00/h) + opex 0.50: 1.50/h until 2026-01-01 06:20, then 0.50/h."""
    site = fleet.site("fra1", price_per_kwh="0")
    node = fleet.node("n1", site=site)
    gpu = fleet.gpu("G1", node=node, in_service_at=at("2021-01-01T00:20"))
    fleet.owned("gpu:G1", purchase_price="43830", depreciation_years="5", opex_per_hour="0.50")
    fleet.save(
        [
            fleet.usage(gpu, at("2026-01-01T05"), samples=60, observed_s=3600, air_s=3600),
            fleet.usage(
                gpu, at("2026-01-01T06"), samples=60, observed_s=3600, air_s=1800, held_s=1800
            ),
            fleet.usage(gpu, at("2026-01-01T07"), samples=60, observed_s=3600, air_s=3600),
        ]
    )
    rows = cost_rows(
        start=dt.date(2025, 12, 31),
        end=dt.date(2026, 1, 2),
        period="day",
        now=at("2026-01-05T00"),
    )
    assert [r.period_start.date() for r in rows] == [dt.date(2025, 12, 31), dt.date(2026, 1, 1)]
    before, during = rows
    assert before.fixed_cost == Decimal("36.00")  # 24 h × 1.50
    assert before.idle_cost == Decimal("36.00")  # all offline
    # 6 h 20 min × 1.50 = 9.50; 17 h 40 min × 0.50 = 8.833333 → 18.333333
    assert during.fixed_cost.quantize(SIX) == Decimal("18.333333")
    # Air: 05:00 1 h × 1.50 + 06:00 0.5 h × (1.50/3 + 0.50 × 2/3 = 0.833333) + 07:00 1 h × 0.50
    # = 1.50 + 0.416667 + 0.50 = 2.416667; idle = 18.333333 − 2.416667 = 15.916667
    assert during.idle_cost.quantize(SIX) == Decimal("15.916667")
    assert money_round(during.idle_cost) == Decimal("15.92")
    assert during.air_hours == 2.5 and during.offline_hours == 21
    (whole,) = cost_rows(
        start=dt.date(2025, 12, 31), end=dt.date(2026, 1, 2), now=at("2026-01-05T00")
    )
    assert whole.fixed_cost == before.fixed_cost + during.fixed_cost
    assert whole.idle_cost == before.idle_cost + during.idle_cost


def test_gpu_moving_between_teams(fleet):
    """History stays with the old team; hours without samples go to the current team."""
    site = fleet.site("fra1")
    team_a, team_b = fleet.team("alpha"), fleet.team("beta")
    pool_a = fleet.pool("pa", site=site, team=team_a)
    pool_b = fleet.pool("pb", site=site, team=team_b)
    node_a, node_b = fleet.node("na", pool=pool_a), fleet.node("nb", pool=pool_b)
    gpu = fleet.gpu("G1", node=node_b, in_service_at=at("2026-03-01T00"))  # now on node nb
    fleet.rented("gpu:G1", rental_rate_per_hour="2.00")
    rows = [
        fleet.usage(
            gpu,
            at(f"2026-03-02T{h:02d}"),
            node=node_a,
            pool=pool_a,
            team=team_a,
            site=site,
            samples=60,
            observed_s=3600,
            air_s=1800,
            parked_s=1800,
        )
        for h in range(10)
    ] + [
        fleet.usage(gpu, at(f"2026-03-02T{h:02d}"), samples=60, observed_s=3600, air_s=3600)
        for h in range(10, 14)
    ]
    fleet.save(rows)
    by_team = {
        r.key: r
        for r in cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="team", now=EXAMPLE_NOW)
    }
    # alpha: hours 00–09 (10 h, 5 h air); beta: 10–13 observed (4 h air) + 14–23 offline (10 h).
    assert by_team["alpha"].capacity_hours == 10 and by_team["alpha"].offline_hours == 0
    assert by_team["alpha"].air_hours == 5
    assert by_team["beta"].capacity_hours == 14 and by_team["beta"].offline_hours == 10
    assert by_team["beta"].air_hours == 4
    assert by_team["alpha"].fixed_cost == Decimal("20.00")  # 10 h × 2.00
    assert by_team["beta"].fixed_cost == Decimal("28.00")  # 14 h × 2.00
    assert by_team["beta"].idle_cost == Decimal("20.00")  # (14 − 4) h × 2.00
    by_node = {
        r.key: r.capacity_hours
        for r in cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="node", now=EXAMPLE_NOW)
    }
    assert by_node == {"na": 10, "nb": 14}
    (only_alpha,) = cost_rows(
        start=EXAMPLE_DAY, end=NEXT_DAY, filters=Filters(teams=("alpha",)), now=EXAMPLE_NOW
    )
    assert (only_alpha.key, only_alpha.capacity_hours) == ("G1", 10)


def test_rented_and_owned_side_by_side(fleet):
    site = fleet.site("fra1", pue="1.5", price_per_kwh="0.20", grid_g_per_kwh=400.0)
    pool = fleet.pool("mixed", site=site)
    node = fleet.node("n1", pool=pool)
    owned = fleet.gpu("OWN", node=node, index=0, in_service_at=at("2026-03-01T00"))
    rented = fleet.gpu("RENT", node=node, index=1, in_service_at=at("2026-03-01T00"))
    fleet.owned("gpu:OWN", purchase_price="43830", depreciation_years="5", opex_per_hour="0.50")
    fleet.rented("gpu:RENT", rental_rate_per_hour="2.35")
    rows = []
    for gpu in (owned, rented):
        # 24 hours, each 1,800 s air + 1,800 s held at 400 W average: 1,440,000 J = 0.4 kWh;
        # 24 × 0.4 = 9.6 kWh each.
        rows += [
            fleet.usage(
                gpu,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                air_s=1800,
                held_s=1800,
                energy_j=1_440_000,
            )
            for h in range(24)
        ]
    fleet.save(rows)
    by_gpu = {r.key: r for r in cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW)}
    own, rent = by_gpu["OWN"], by_gpu["RENT"]
    assert own.fixed_cost == Decimal("36.00")  # 24 × 1.50
    assert own.energy_cost == Decimal("2.88")  # 9.6 kWh × 1.5 × 0.20
    assert rent.fixed_cost == Decimal("56.40")  # 24 × 2.35
    assert rent.energy_cost == 0
    assert own.co2e_kg == pytest.approx(5.76) and rent.co2e_kg == pytest.approx(5.76)
    assert own.idle_cost == Decimal("18.00")  # 12 × 1.50; no idle samples
    assert rent.idle_cost == Decimal("28.20")  # 12 × 2.35
    result = breakeven_compute(
        pool="mixed",
        start=EXAMPLE_DAY,
        end=NEXT_DAY,
        tokens_per_s=1000,
        api_price_per_mtok=API1,
        now=EXAMPLE_NOW,
    )
    assert result.owned_share == 0.5
    assert result.fixed_rate_per_hour == Decimal("1.925")  # (36.00 + 56.40) / 48


def test_gpu_page_and_selectors_resolve_the_same_profile(fleet):
    """The GPU page names the profile the selectors price with: the most specific scope
    (GPU > node > pool > site), the site being the node's own before its pool's."""
    from billing.dashboard import gpu_cost_profile

    pool_site = fleet.site("fra1")
    node_site = fleet.site("ams1")
    pool = fleet.pool("train", site=pool_site)
    node = fleet.node("n1", pool=pool, site=node_site)
    gpu = fleet.gpu("GPU-1", node=node, in_service_at=at("2026-03-01T00"))
    profiles = {
        "site:fra1": fleet.rented("site:fra1", rental_rate_per_hour="1.00"),  # not its site
        "site:ams1": fleet.rented("site:ams1", rental_rate_per_hour="2.00"),
        "pool:train": fleet.rented("pool:train", rental_rate_per_hour="3.00"),
        "node:n1": fleet.rented("node:n1", rental_rate_per_hour="4.00"),
        "gpu:GPU-1": fleet.rented("gpu:GPU-1", rental_rate_per_hour="5.00"),
    }
    # 24 capacity hours on 2026-03-02 (offline: no rollups): fixed cost = 24 × the rate.
    for scope, fixed in (
        ("gpu:GPU-1", "120.00"),
        ("node:n1", "96.00"),
        ("pool:train", "72.00"),
        ("site:ams1", "48.00"),
    ):
        assert gpu_cost_profile(gpu) == profiles[scope]
        (row,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW)
        assert row.fixed_cost == Decimal(fixed)
        profiles.pop(scope).delete()
    # Left: the profile of a site the GPU is not at.
    assert gpu_cost_profile(gpu) is None
    (row,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW)
    assert row.fixed_cost == 0 and not row.priced


def test_gpus_of_one_node_take_their_own_profile_or_the_node_s(fleet):
    """The load resolves a node's profile once for its GPUs without one of their own: a GPU
    with its own profile keeps it whichever comes first, before or after such a GPU."""
    node = fleet.node("n1", pool=fleet.pool("train", site=fleet.site("fra1")))
    for uuid in ("GPU-A", "GPU-B", "GPU-C"):
        fleet.gpu(uuid, node=node, in_service_at=at("2026-03-01T00"))
    fleet.rented("node:n1", rental_rate_per_hour="4.00")
    fleet.rented("gpu:GPU-A", rental_rate_per_hour="5.00")
    fleet.rented("gpu:GPU-C", rental_rate_per_hour="6.00")
    # 24 capacity hours each on 2026-03-02 (offline: no rollups): 24 × the rate.
    rows = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW, group_by="gpu")
    got = {row.key: row.fixed_cost for row in rows}
    assert got == {
        "GPU-A": Decimal("120.00"),
        "GPU-B": Decimal("96.00"),
        "GPU-C": Decimal("144.00"),
    }


def test_no_profile_or_no_site_is_not_priced(fleet):
    site = fleet.site("fra1", pue="1.5", price_per_kwh="0.20", grid_g_per_kwh=400.0)
    node = fleet.node("n1", site=site)
    bare = fleet.node("n2")  # no site at all
    free = fleet.gpu("FREE", node=node, in_service_at=at("2026-03-01T00"))
    nowhere = fleet.gpu("NOWHERE", node=bare, in_service_at=at("2026-03-01T00"))
    fleet.owned("gpu:NOWHERE")
    fleet.save(
        [
            fleet.usage(free, at("2026-03-02T00"), samples=60, observed_s=3600, energy_j=3_600_000),
            fleet.usage(
                nowhere, at("2026-03-02T00"), samples=60, observed_s=3600, energy_j=3_600_000
            ),
        ]
    )
    rows = {r.key: r for r in cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW)}
    assert rows["FREE"].priced is False
    assert rows["FREE"].fixed_cost == 0
    assert rows["FREE"].energy_cost == Decimal("0.30")  # 1 kWh at its site's 1.5 × 0.20
    assert rows["NOWHERE"].priced is False
    assert rows["NOWHERE"].energy_cost == 0  # no site: price 0
    assert rows["NOWHERE"].co2e_kg == 0  # grid 0
    assert rows["NOWHERE"].fixed_cost.quantize(SIX) == Decimal("18.827105")  # priced fixed part
    (fleet_row,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="fleet", now=EXAMPLE_NOW)
    assert fleet_row.priced is False and fleet_row.gpu_count == 2


def test_report_time_zone_buckets(fleet):
    # Europe/Berlin is UTC+1 in early March: the local day 2026-03-02 is
    # 2026-03-01 23:00Z – 2026-03-02 23:00Z.
    fleet.settings(report_time_zone="Europe/Berlin", currency="EUR")
    site = fleet.site("fra1")
    node = fleet.node("n1", site=site)
    gpu = fleet.gpu("G1", node=node, in_service_at=at("2026-02-01T00"))
    fleet.rented("gpu:G1", rental_rate_per_hour="1.00")
    fleet.save(
        [
            fleet.usage(gpu, at("2026-03-01T22"), samples=60, observed_s=3600, air_s=3600),
            fleet.usage(
                gpu, at("2026-03-01T23"), samples=60, observed_s=3600, air_s=1200, held_s=2400
            ),
            fleet.usage(
                gpu, at("2026-03-02T23"), samples=60, observed_s=3600, air_s=600, parked_s=3000
            ),
        ]
    )
    rows = cost_rows(
        start=dt.date(2026, 3, 1), end=dt.date(2026, 3, 4), period="day", now=EXAMPLE_NOW
    )
    assert [r.period_start.isoformat() for r in rows] == [
        "2026-03-01T00:00:00+01:00",
        "2026-03-02T00:00:00+01:00",
        "2026-03-03T00:00:00+01:00",
    ]
    assert [r.air_hours * 60 for r in rows] == [60, 20, 10]  # minutes
    assert all(r.capacity_hours == 24 for r in rows)
    assert rows[0].currency == "EUR"
    # ISO week from Monday 2026-03-02: clipped to the query's Sunday 03-01 and Mon–Tue 03-02…03.
    weeks = cost_rows(
        start=dt.date(2026, 3, 1), end=dt.date(2026, 3, 4), period="week", now=EXAMPLE_NOW
    )
    assert [(w.period_start.date(), w.period_end.date(), w.capacity_hours) for w in weeks] == [
        (dt.date(2026, 3, 1), dt.date(2026, 3, 2), 24),
        (dt.date(2026, 3, 2), dt.date(2026, 3, 4), 48),
    ]
    (month,) = cost_rows(
        start=dt.date(2026, 3, 1), end=dt.date(2026, 3, 4), period="month", now=EXAMPLE_NOW
    )
    assert month.capacity_hours == 72 and month.air_hours * 60 == 90


def test_fleet_summary(fleet):
    site = fleet.site("fra1")
    node = fleet.node("n1", site=site)
    fleet.rented("node:n1", rental_rate_per_hour="2.00")
    gpus = [
        fleet.gpu(
            f"G{i}",
            node=node,
            index=i,
            in_service_at=at("2026-03-01T00"),
            last_seen_at=EXAMPLE_NOW - dt.timedelta(minutes=5 if i < 3 else 60),
        )
        for i in range(4)
    ]
    # 4 GPUs over one day: 96 capacity hours; 12 air hours (3 each).
    fleet.save(
        [
            fleet.usage(g, at(f"2026-03-02T{h:02d}"), samples=60, observed_s=3600, air_s=3600)
            for g in gpus
            for h in range(3)
        ]
    )
    summary = fleet_summary(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW)
    assert summary.row.capacity_hours == 96 and summary.row.air_hours == 12
    # (96 − 12 / 0.6) / 24 = 76 / 24 = 3.1667 GPUs; × 2.00 × 8,766 = 55,518.00 a year
    assert summary.recoverable_gpus == pytest.approx(76 / 24)
    assert money_round(summary.recoverable_money_per_year) == Decimal("55518.00")
    assert (summary.gpus_in_service, summary.gpus_offline_now) == (4, 1)


def _count_queries(fleet, n_gpus, tag):
    site = fleet.site(f"s{tag}")
    team = fleet.team(f"t{tag}")
    pool = fleet.pool(f"p{tag}", site=site, team=team)
    fleet.owned(f"pool:p{tag}")
    rows = []
    for i in range(n_gpus):
        node = fleet.node(f"n{tag}-{i}", pool=pool)
        gpu = fleet.gpu(f"G{tag}-{i}", node=node, in_service_at=at("2026-03-01T00"))
        rows += [
            fleet.usage(gpu, at(f"2026-03-02T{h:02d}"), samples=60, observed_s=3600, air_s=60)
            for h in range(3)
        ]
    fleet.save(rows)
    counts = {}
    for group_by in ("gpu", "node", "team"):
        with CaptureQueriesContext(connection) as ctx:
            out = cost_rows(
                start=EXAMPLE_DAY,
                end=NEXT_DAY,
                group_by=group_by,
                period="day",
                now=EXAMPLE_NOW,
                filters=Filters(pools=(f"p{tag}",)),
            )
        assert sum(r.capacity_hours for r in out) == 24 * n_gpus
        counts[group_by] = len(ctx.captured_queries)
    return counts


def test_query_count_does_not_grow_with_gpus(fleet, django_assert_max_num_queries):
    fleet.settings(currency="USD")
    few = _count_queries(fleet, 3, "a")
    many = _count_queries(fleet, 30, "b")
    assert few == many
    # Nine: eight for the figures, one for the closed months (docs/finance.md); rows per
    # team by price class on PostgreSQL: three more, the transaction that turns JIT off for
    # the sums' statement (begin, set, commit).
    by_class = 3 if connection.vendor == "postgresql" else 0
    with django_assert_max_num_queries(9 + by_class):
        cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="team", period="week", now=EXAMPLE_NOW)
    with django_assert_max_num_queries(9):
        breakeven_compute(
            pool="pb",
            start=EXAMPLE_DAY,
            end=NEXT_DAY,
            tokens_per_s=100,
            api_price_per_mtok=API1,
            now=EXAMPLE_NOW,
        )


def test_throttle_and_work_utilization(fleet):
    node = fleet.node("n1", site=fleet.site("fra1"))
    gpu = fleet.gpu("G1", node=node, in_service_at=at("2026-03-01T00"))
    fleet.save(
        [
            fleet.usage(
                gpu,
                at("2026-03-02T00"),
                samples=60,
                observed_s=3600,
                air_s=3600,
                throttle_power_cap_s=720,
                throttle_thermal_s=360,
                throttle_any_s=900,
                sm_active_s=1800,
                sm_observed_s=3600,
            ),
            fleet.usage(gpu, at("2026-03-02T01"), samples=60, observed_s=3600, air_s=3600),
        ]
    )
    (row,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, now=EXAMPLE_NOW)
    assert row.throttled_hours == 0.25  # 900 s
    assert (row.throttled_power_cap_hours, row.throttled_thermal_hours) == (0.2, 0.1)
    assert row.throttled_hw_slowdown_hours == 0
    assert row.work_utilization == 0.5  # 1,800 / 3,600 s of samples that carry sm_active
    assert row.energy_per_gpu_hour_kwh == 0 and row.kwh_per_air_hour == 0


def test_selectors_interface_constants():
    assert selectors.GROUP_BY == ("gpu", "node", "pool", "team", "site", "model", "fleet")
    assert selectors.PERIODS == ("day", "week", "month", "all")
