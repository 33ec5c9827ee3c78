"""Break-even of a pool against an API (the figures of ``billing.breakeven``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from billing import breakeven as be
from billing import cost_model as cm
from billing.selectors.costs import _fleet_acc
from billing.selectors.sums import _compute
from billing.selectors.types import _NO_SITE, Filters, _validate
from fleet.models import Pool


@dataclass
class BreakevenResult:
    """DESIGN.md §3 break-even and §7 /api/v1/breakeven fields."""

    pool: str
    currency: str
    window_start: dt.datetime
    window_end: dt.datetime
    tokens_per_s: float
    api_price_per_mtok: Decimal  # blended
    fixed_rate_per_hour: Decimal
    p_active_kw: float
    p_idle_kw: float
    pue: float
    price_per_kwh: Decimal
    utilization: float | None
    breakeven_utilization: float | None
    own_cost_per_mtok: Decimal | None  # at the measured utilisation
    own_cost_per_month: Decimal
    api_cost_per_month: Decimal
    savings_per_month: Decimal
    rent_breakeven_utilization: float | None
    rental_rate_per_hour: Decimal | None
    curve: list[tuple[float, Decimal]]  # (u, own cost per Mtok) at u = 0.05, 0.10, … 1.00
    owned_share: float = 1.0  # of the pool's capacity hours; scales PUE × price in C(u)
    capacity_hours: float = 0.0  # the pool's, in the window (cut off at now)


def _power_kw(energy_j: float, seconds: float) -> Decimal:
    return cm.to_decimal(energy_j) / cm.to_decimal(seconds) / 1000


def _api_price(
    *,
    api_price_per_mtok: Decimal | None,
    api_input_price_per_mtok: Decimal | None,
    api_output_price_per_mtok: Decimal | None,
    output_share: float | None,
) -> Decimal:
    if api_price_per_mtok is not None:
        if api_price_per_mtok < 0:
            raise ValueError("api_price_per_mtok: must be ≥ 0")
        return api_price_per_mtok
    parts = (api_input_price_per_mtok, api_output_price_per_mtok, output_share)
    if any(p is None for p in parts):
        raise ValueError(
            "api_price_per_mtok: required, or api_input_price_per_mtok, "
            "api_output_price_per_mtok and output_share together"
        )
    assert api_input_price_per_mtok is not None and api_output_price_per_mtok is not None
    assert output_share is not None
    if api_input_price_per_mtok < 0:
        raise ValueError("api_input_price_per_mtok: must be ≥ 0")
    if api_output_price_per_mtok < 0:
        raise ValueError("api_output_price_per_mtok: must be ≥ 0")
    return be.blended_api_price_per_mtok(
        input_price_per_mtok=api_input_price_per_mtok,
        output_price_per_mtok=api_output_price_per_mtok,
        output_share=output_share,
    )


def breakeven_compute(
    *,
    pool: str,
    start: dt.date,
    end: dt.date,
    tokens_per_s: float,
    api_price_per_mtok: Decimal | None = None,
    api_input_price_per_mtok: Decimal | None = None,
    api_output_price_per_mtok: Decimal | None = None,
    output_share: float | None = None,
    rental_rate_per_hour: Decimal | None = None,
    now: dt.datetime | None = None,
) -> BreakevenResult:
    """Raises LookupError for an unknown pool, ValueError naming the bad argument."""
    _validate(start=start, end=end, period="all")
    if not tokens_per_s > 0:
        raise ValueError("tokens_per_s: must be > 0")
    if rental_rate_per_hour is not None and rental_rate_per_hour < 0:
        raise ValueError("rental_rate_per_hour: must be ≥ 0")
    api_price = _api_price(
        api_price_per_mtok=api_price_per_mtok,
        api_input_price_per_mtok=api_input_price_per_mtok,
        api_output_price_per_mtok=api_output_price_per_mtok,
        output_share=output_share,
    )
    pool_obj = Pool.objects.filter(name=pool).first()
    if pool_obj is None:
        raise LookupError(f"pool: no pool named {pool!r}")
    computation = _compute(
        start=start, end=end, period="all", filters=Filters(pools=(pool,)), now=now
    )
    acc = _fleet_acc(computation)
    s = acc.sums
    members = [g for g in computation.gpus.values() if g.pool_id == pool_obj.pk]

    # P_act, P_idle from the rollups' seconds above and below the active threshold; the GPU
    # models' nominal power (capacity-weighted, else a plain mean) where there are none.
    def nominal(attr: str) -> Decimal:
        if acc.nominal_h > 0:
            total = acc.nominal_max_w_h if attr == "max_power_w" else acc.nominal_idle_w_h
            return cm.to_decimal(total / acc.nominal_h) / 1000
        powers = [getattr(g, attr) for g in members if getattr(g, attr) is not None]
        return cm.to_decimal(sum(powers) / len(powers)) / 1000 if powers else Decimal(0)

    active_s = s["observed_s"] - s["idle_s"]
    p_active = (
        _power_kw(s["energy_j"] - s["idle_energy_j"], active_s)
        if active_s > 0
        else nominal("max_power_w")
    )
    p_idle = (
        _power_kw(s["idle_energy_j"], s["idle_s"]) if s["idle_s"] > 0 else nominal("idle_power_w")
    )

    # PUE and tariff: the pool's site; else that of its GPUs' current site.
    site = computation.names.site(pool_obj.site_id)
    if pool_obj.site_id is None:
        site = next(
            (computation.names.site(g.site_id) for g in members if g.site_id is not None), _NO_SITE
        )
    capacity_h = acc.capacity_h
    fixed_rate = cm.mean_rate_per_hour(fixed_cost=acc.fixed_cost, capacity_hours=capacity_h)
    owned_share = acc.owned_capacity_h / capacity_h if capacity_h > 0 else Decimal(1)
    economics = be.pool_economics(
        fixed_rate_per_hour=fixed_rate,
        p_active_kw=p_active,
        p_idle_kw=p_idle,
        pue=site.pue,
        price_per_kwh=site.price_per_kwh,
        owned_share=owned_share,
    )
    air_h = cm.hours_from_seconds(seconds=s["air_s"])
    measured_u = air_h / capacity_h if capacity_h > 0 else None
    if measured_u is not None:
        month = be.monthly_comparison(
            economics=economics,
            utilization=measured_u,
            tokens_per_s=tokens_per_s,
            api_price_per_mtok=api_price,
            capacity_hours=capacity_h,
            window_hours=computation.window_hours,
        )
        own_month, api_month, savings = month.own_cost, month.api_cost, month.savings
        own_per_mtok = be.own_cost_per_mtok(
            economics=economics, utilization=measured_u, tokens_per_s=tokens_per_s
        )
    else:
        own_month = api_month = savings = Decimal(0)
        own_per_mtok = None
    return BreakevenResult(
        pool=pool,
        currency=computation.currency,
        window_start=computation.local_start,
        window_end=computation.local_end,
        tokens_per_s=tokens_per_s,
        api_price_per_mtok=api_price,
        fixed_rate_per_hour=fixed_rate,
        p_active_kw=float(p_active),
        p_idle_kw=float(p_idle),
        pue=float(site.pue),
        price_per_kwh=site.price_per_kwh,
        utilization=float(measured_u) if measured_u is not None else None,
        breakeven_utilization=be.breakeven_utilization(
            economics=economics, api_price_per_mtok=api_price, tokens_per_s=tokens_per_s
        ),
        own_cost_per_mtok=own_per_mtok,
        own_cost_per_month=own_month,
        api_cost_per_month=api_month,
        savings_per_month=savings,
        rent_breakeven_utilization=(
            be.rent_breakeven_utilization(
                economics=economics, rental_rate_per_hour=rental_rate_per_hour
            )
            if rental_rate_per_hour is not None
            else None
        ),
        rental_rate_per_hour=rental_rate_per_hour,
        curve=be.cost_curve(economics=economics, tokens_per_s=tokens_per_s),
        owned_share=float(owned_share),
        capacity_hours=float(capacity_h),
    )
