"""docs/metrics.md break-even, checked against the worked example computed by hand."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing import breakeven as be

SIX = Decimal("0.000001")
CENT = Decimal("0.01")

# The worked example as a one-GPU pool: fixed 30000/43830 + 0.10 = 0.7844627/h, P_act 0.400 kW,
# P_idle 0.095 kW, PUE 1.5, 0.20/kWh (PUE × price = 0.30), 2,000 tokens/s, 0.60 per Mtok.
EXAMPLE = be.pool_economics(
    fixed_rate_per_hour=Decimal(30000) / Decimal(43830) + Decimal("0.10"),
    p_active_kw=0.400,
    p_idle_kw=0.095,
    pue=Decimal("1.5"),
    price_per_kwh=Decimal("0.20"),
)
TPS = 2000
API = Decimal("0.60")


def test_breakeven_utilization():
    # (0.784463 + 0.095 × 0.30) / (0.60 × 2000 × 3600 / 1e6 − 0.305 × 0.30)
    # = 0.812963 / (4.32 − 0.0915) = 0.812963 / 4.2285 = 0.192258
    u_star = be.breakeven_utilization(economics=EXAMPLE, api_price_per_mtok=API, tokens_per_s=TPS)
    assert u_star is not None and round(u_star, 6) == 0.192258


def test_own_cost_at_measured_utilization():
    # C(0.375) = 0.784463 + (0.375 × 0.4 + 0.625 × 0.095) × 0.30 = 0.784463 + 0.0628125
    c = be.own_cost_per_hour(economics=EXAMPLE, utilization=0.375)
    assert c.quantize(SIX) == Decimal("0.847275")
    # per Mtok: 0.847275 / (0.375 × 2000 × 3600) × 1e6 = 0.847275 / 2.7 = 0.313806
    per_mtok = be.own_cost_per_mtok(economics=EXAMPLE, utilization=0.375, tokens_per_s=TPS)
    assert per_mtok is not None and per_mtok.quantize(SIX) == Decimal("0.313806")
    assert be.own_cost_per_mtok(economics=EXAMPLE, utilization=0, tokens_per_s=TPS) is None


def test_month_at_measured_utilization():
    # One day, 24 capacity hours → cap = 24 × 730 / 24 = 730 h.
    month = be.monthly_comparison(
        economics=EXAMPLE,
        utilization=0.375,
        tokens_per_s=TPS,
        api_price_per_mtok=API,
        capacity_hours=24,
        window_hours=24,
    )
    assert month.capacity_hours == 730
    assert month.tokens == Decimal("1971000000")  # 0.375 × 2000 × 3600 × 730
    assert month.own_cost.quantize(CENT) == Decimal("618.51")  # 0.847275 × 730
    assert month.api_cost.quantize(CENT) == Decimal("1182.60")  # 1,971 × 0.60
    assert month.savings.quantize(CENT) == Decimal("564.09")


def test_rent_breakeven():
    # 0.812963 / (2.35 − 0.0915) = 0.812963 / 2.2585 = 0.359957
    u = be.rent_breakeven_utilization(economics=EXAMPLE, rental_rate_per_hour=Decimal("2.35"))
    assert u is not None and round(u, 6) == 0.359957


def test_breakeven_is_null_when_owning_never_wins():
    # Denominator ≤ 0: 0.01 × 2000 × 3600 / 1e6 = 0.072 < 0.0915.
    assert (
        be.breakeven_utilization(
            economics=EXAMPLE, api_price_per_mtok=Decimal("0.01"), tokens_per_s=TPS
        )
        is None
    )
    # u* > 1: 0.812963 / (0.1 × 7.2 − 0.0915) = 1.29 > 1.
    assert (
        be.breakeven_utilization(
            economics=EXAMPLE, api_price_per_mtok=Decimal("0.10"), tokens_per_s=TPS
        )
        is None
    )
    assert (
        be.rent_breakeven_utilization(economics=EXAMPLE, rental_rate_per_hour=Decimal("0.5"))
        is None
    )


def test_owned_share_scales_energy():
    # A fully rented pool pays no energy: C(u) is its fixed rate at any u.
    rented = be.pool_economics(
        fixed_rate_per_hour=Decimal("2.00"),
        p_active_kw=0.7,
        p_idle_kw=0.07,
        pue=Decimal("1.5"),
        price_per_kwh=Decimal("0.20"),
        owned_share=0,
    )
    assert be.own_cost_per_hour(economics=rented, utilization=0.9) == Decimal("2.00")
    # Half owned: PUE × price counts half: 2.00 + 0.7 × 0.15 at u = 1 = 2.105
    half = be.pool_economics(
        fixed_rate_per_hour=Decimal("2.00"),
        p_active_kw=0.7,
        p_idle_kw=0.07,
        pue=Decimal("1.5"),
        price_per_kwh=Decimal("0.20"),
        owned_share=0.5,
    )
    assert be.own_cost_per_hour(economics=half, utilization=1) == Decimal("2.105")


def test_curve():
    curve = be.cost_curve(economics=EXAMPLE, tokens_per_s=TPS)
    assert [u for u, _ in curve] == pytest.approx([k / 20 for k in range(1, 21)])
    # u = 1: (0.784463 + 0.4 × 0.30) / 7.2 = 0.904463 / 7.2 = 0.125620
    assert curve[-1][1].quantize(SIX) == Decimal("0.125620")
    # u = 0.05: (0.784463 + (0.02 + 0.09025) × 0.30) / 0.36 = 0.817538 / 0.36 = 2.270938
    assert curve[0][1].quantize(SIX) == Decimal("2.270938")
    with pytest.raises(ValueError, match="tokens_per_s"):
        be.cost_curve(economics=EXAMPLE, tokens_per_s=0)


def test_blended_api_price():
    # 0.30 × 0.75 + 1.20 × 0.25 = 0.225 + 0.30 = 0.525
    blended = be.blended_api_price_per_mtok(
        input_price_per_mtok=Decimal("0.30"),
        output_price_per_mtok=Decimal("1.20"),
        output_share=0.25,
    )
    assert blended == Decimal("0.525")
    with pytest.raises(ValueError, match="output_share"):
        be.blended_api_price_per_mtok(
            input_price_per_mtok=Decimal("1"), output_price_per_mtok=Decimal("1"), output_share=1.5
        )


# --- fleet-wide and rented views (issue 18) -------------------------------------------------
def test_energy_terms_of_several_sites_by_hand():
    # 300 kWh at fra1 (PUE 1.35, 0.21/kWh) and 100 kWh at ams1 (PUE 1.25, 0.17/kWh):
    # PUE = (300 × 1.35 + 100 × 1.25) / 400 = 530 / 400 = 1.325;
    # price = (405 × 0.21 + 125 × 0.17) / 530 = (85.05 + 21.25) / 530 = 106.30 / 530;
    # PUE × price = 106.30 / 400 = 0.26575: the energy bill over the kWh drawn.
    pue, price = be.energy_terms_blended(
        [(300, Decimal("1.35"), Decimal("0.21")), (100, Decimal("1.25"), Decimal("0.17"))]
    )
    assert pue == Decimal("1.325")
    assert (price * 530).quantize(SIX) == Decimal("106.300000")
    assert (pue * price).quantize(SIX) == Decimal("0.265750")
    assert be.energy_terms_blended([]) == (Decimal(1), Decimal(0))
    assert be.energy_terms_blended([(0, Decimal("1.4"), Decimal("0.2"))]) == (1, 0)


def test_comparison_kind():
    assert be.comparison_kind(owned_capacity_hours=0, capacity_hours=72) == be.RENTED
    assert be.comparison_kind(owned_capacity_hours=1, capacity_hours=72) == be.OWNED
    assert be.comparison_kind(owned_capacity_hours=0, capacity_hours=0) == be.OWNED


def test_a_rented_pool_against_the_api_by_hand():
    # Rented at 0.69/h, energy included (owned share 0): C(u) = 0.69 whatever the power.
    rented = be.pool_economics(
        fixed_rate_per_hour=Decimal("0.69"),
        p_active_kw=0.4,
        p_idle_kw=0.07,
        pue=Decimal("1.2"),
        price_per_kwh=Decimal("0.09"),
        owned_share=0,
    )
    api = be.blended_api_price_per_mtok(
        input_price_per_mtok=Decimal("0.20"),
        output_price_per_mtok=Decimal("0.80"),
        output_share=0.25,
    )
    assert api == Decimal("0.35")  # 0.75 × 0.20 + 0.25 × 0.80
    # u* = 0.69 / (0.35 × 2000 × 3600 / 1e6) = 0.69 / 2.52 = 0.273810
    u_star = be.breakeven_utilization(economics=rented, api_price_per_mtok=api, tokens_per_s=TPS)
    assert u_star is not None and round(u_star, 6) == 0.273810
    # at u = 0.5: 0.69 / (0.5 × 2000 × 3600) × 1e6 = 0.69 / 3.6 = 0.191667 per M tokens
    per_mtok = be.own_cost_per_mtok(economics=rented, utilization=0.5, tokens_per_s=TPS)
    assert per_mtok is not None and per_mtok.quantize(SIX) == Decimal("0.191667")
    # a month (72 h of 72 → 730 h): renting 0.69 × 730 = 503.70; tokens 0.5 × 2000 × 3600 ×
    # 730 = 2,628 M → API 2,628 × 0.35 = 919.80; the API costs 416.10 more.
    month = be.monthly_comparison(
        economics=rented,
        utilization=0.5,
        tokens_per_s=TPS,
        api_price_per_mtok=api,
        capacity_hours=72,
        window_hours=72,
    )
    assert month.own_cost.quantize(CENT) == Decimal("503.70")
    assert month.api_cost.quantize(CENT) == Decimal("919.80")
    assert month.savings.quantize(CENT) == Decimal("416.10")


def test_workload_defaults_pool_over_fleet_over_product():
    product = be.workload_defaults(fleet={})
    assert product == be.PRODUCT_WORKLOAD
    fleet = {"tokens_per_s_per_gpu": 1000.0, "api_price_per_mtok": "0.60"}
    assert be.workload_defaults(fleet=fleet, pool={"tokens_per_s_per_gpu": 4000.0}) == {
        **be.PRODUCT_WORKLOAD,
        "tokens_per_s_per_gpu": 4000.0,
        "api_price_per_mtok": "0.60",  # the fleet's blended price is in force
    }
    # A pool naming a price brings its prices, none of the fleet's: the product's fill in.
    assert be.workload_defaults(fleet=fleet, pool={"api_input_price_per_mtok": "0.30"}) == {
        **be.PRODUCT_WORKLOAD,
        "tokens_per_s_per_gpu": 1000.0,
        "api_input_price_per_mtok": "0.30",
    }


def test_owning_a_rented_pool_instead_by_hand():
    rented = be.pool_economics(
        fixed_rate_per_hour=Decimal("0.69"),
        p_active_kw=0.4,
        p_idle_kw=0.07,
        pue=Decimal("1.2"),
        price_per_kwh=Decimal("0.09"),
        owned_share=0,
    )
    # Owned at 0.30/h fixed, PUE 1.25 × 0.16/kWh = 0.20 per kWh at the GPU, same power.
    instead = be.owning_instead(
        rented=rented,
        owned_fixed_rate_per_hour=Decimal("0.30"),
        owned_pue=Decimal("1.25"),
        owned_price_per_kwh=Decimal("0.16"),
        utilization=0.5,
        tokens_per_s=TPS,
        api_price_per_mtok=Decimal("0.35"),
        capacity_hours=72,
        window_hours=72,
        models=("NVIDIA RTX 4090",),
        gpus=3,
    )
    # u* = (0.30 + 0.07 × 0.20) / (2.52 − 0.33 × 0.20) = 0.314 / 2.454 = 0.127954
    assert instead.breakeven_utilization is not None
    assert round(instead.breakeven_utilization, 6) == 0.127954
    # C(0.5) = 0.30 + (0.5 × 0.4 + 0.5 × 0.07) × 0.20 = 0.347; / 3.6 M tokens = 0.096389
    assert instead.cost_per_mtok is not None
    assert instead.cost_per_mtok.quantize(SIX) == Decimal("0.096389")
    # a month: owning 0.347 × 730 = 253.31; renting 0.69 × 730 = 503.70; 250.39 saved
    assert instead.cost_per_month.quantize(CENT) == Decimal("253.31")
    assert instead.rent_per_month.quantize(CENT) == Decimal("503.70")
    assert instead.savings_per_month.quantize(CENT) == Decimal("250.39")
    assert (instead.models, instead.gpus) == (("NVIDIA RTX 4090",), 3)
