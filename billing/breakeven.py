"""Break-even against an API (DESIGN.md §3): pure functions over plain data, no ORM.

A pool of GPUs is described by ``PoolEconomics``: its capacity-weighted fixed rate, its active
and idle power, its site's PUE and tariff, and the owned share of its capacity hours (rented
GPUs' energy costs nothing extra, so the energy price is scaled by that share). Money is
``Decimal``; utilisations are returned as floats (they are fractions, not money).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from billing.cost_model import Number, to_decimal

SECONDS_PER_HOUR = Decimal(3600)
TOKENS_PER_MTOK = Decimal(1_000_000)
HOURS_PER_MONTH = Decimal(730)  # 8,760 / 12: DESIGN.md's month
CURVE_UTILIZATIONS: tuple[Decimal, ...] = tuple(Decimal(k) / 20 for k in range(1, 21))


@dataclass(frozen=True)
class PoolEconomics:
    """What owning one GPU-hour of the pool costs, as inputs to C(u)."""

    fixed_rate_per_hour: Decimal
    p_active_kw: Decimal
    p_idle_kw: Decimal
    pue: Decimal
    price_per_kwh: Decimal
    owned_share: Decimal = Decimal(1)  # of the pool's capacity hours

    @property
    def energy_price_per_kwh(self) -> Decimal:
        """``PUE × price`` scaled by the owned share: what one kWh at the GPU costs the pool."""
        return self.pue * self.price_per_kwh * self.owned_share


def pool_economics(
    *,
    fixed_rate_per_hour: Decimal,
    p_active_kw: Number,
    p_idle_kw: Number,
    pue: Number,
    price_per_kwh: Number,
    owned_share: Number = 1,
) -> PoolEconomics:
    """Build ``PoolEconomics`` from floats or Decimals (floats through their shortest repr)."""
    return PoolEconomics(
        fixed_rate_per_hour=fixed_rate_per_hour,
        p_active_kw=to_decimal(p_active_kw),
        p_idle_kw=to_decimal(p_idle_kw),
        pue=to_decimal(pue),
        price_per_kwh=to_decimal(price_per_kwh),
        owned_share=to_decimal(owned_share),
    )


def blended_api_price_per_mtok(
    *,
    input_price_per_mtok: Decimal,
    output_price_per_mtok: Decimal,
    output_share: Number,
) -> Decimal:
    """One price per million tokens from input and output prices and the output share."""
    share = to_decimal(output_share)
    if not 0 <= share <= 1:
        raise ValueError("output_share: must be within 0–1")
    return input_price_per_mtok * (1 - share) + output_price_per_mtok * share


def own_cost_per_hour(*, economics: PoolEconomics, utilization: Number) -> Decimal:
    """``C(u) = fixed_rate + (u·P_act + (1−u)·P_idle) × PUE × price`` per GPU-hour."""
    u = to_decimal(utilization)
    power_kw = u * economics.p_active_kw + (1 - u) * economics.p_idle_kw
    return economics.fixed_rate_per_hour + power_kw * economics.energy_price_per_kwh


def tokens_per_hour(*, tokens_per_s: Number, utilization: Number) -> Decimal:
    return to_decimal(utilization) * to_decimal(tokens_per_s) * SECONDS_PER_HOUR


def own_cost_per_mtok(
    *, economics: PoolEconomics, utilization: Number, tokens_per_s: Number
) -> Decimal | None:
    """``C(u) / (u × tps × 3600) × 1e6``; ``None`` at u = 0 (no tokens)."""
    tokens = tokens_per_hour(tokens_per_s=tokens_per_s, utilization=utilization)
    if tokens <= 0:
        return None
    return (
        own_cost_per_hour(economics=economics, utilization=utilization) / tokens * TOKENS_PER_MTOK
    )


def _breakeven(
    *, economics: PoolEconomics, price_per_gpu_hour_at_full_load: Decimal
) -> float | None:
    numerator = economics.fixed_rate_per_hour + economics.p_idle_kw * economics.energy_price_per_kwh
    denominator = price_per_gpu_hour_at_full_load - (
        (economics.p_active_kw - economics.p_idle_kw) * economics.energy_price_per_kwh
    )
    if denominator <= 0:
        return None
    u_star = numerator / denominator
    return float(u_star) if u_star <= 1 else None


def breakeven_utilization(
    *, economics: PoolEconomics, api_price_per_mtok: Decimal, tokens_per_s: Number
) -> float | None:
    """``u* = (fixed + P_idle·PUE·price) / (api × tps × 3600 / 1e6 − (P_act − P_idle)·PUE·price)``.

    ``None`` where the denominator is ≤ 0 or ``u* > 1``: owning never beats that API price.
    """
    api_per_gpu_hour = (
        api_price_per_mtok * to_decimal(tokens_per_s) * SECONDS_PER_HOUR / TOKENS_PER_MTOK
    )
    return _breakeven(economics=economics, price_per_gpu_hour_at_full_load=api_per_gpu_hour)


def rent_breakeven_utilization(
    *, economics: PoolEconomics, rental_rate_per_hour: Decimal
) -> float | None:
    """``u*_rent`` against renting on demand (only the air hours rented); ``None`` likewise."""
    return _breakeven(economics=economics, price_per_gpu_hour_at_full_load=rental_rate_per_hour)


@dataclass(frozen=True)
class MonthlyComparison:
    """Own against API for one month (730 h) at a measured utilisation."""

    capacity_hours: Decimal  # the pool's capacity scaled to 730 h
    tokens: Decimal
    own_cost: Decimal
    api_cost: Decimal

    @property
    def savings(self) -> Decimal:
        """API − own: positive when owning is cheaper."""
        return self.api_cost - self.own_cost


def monthly_comparison(
    *,
    economics: PoolEconomics,
    utilization: Number,
    tokens_per_s: Number,
    api_price_per_mtok: Decimal,
    capacity_hours: Number,
    window_hours: Number,
) -> MonthlyComparison:
    """``cap = capacity × 730 / window hours`` (the window cut off at now by the caller);
    own = ``C(u) × cap``; tokens = ``u × tps × 3600 × cap``; API = tokens / 1e6 × price."""
    window = to_decimal(window_hours)
    cap = to_decimal(capacity_hours) * HOURS_PER_MONTH / window if window > 0 else Decimal(0)
    tokens = tokens_per_hour(tokens_per_s=tokens_per_s, utilization=utilization) * cap
    return MonthlyComparison(
        capacity_hours=cap,
        tokens=tokens,
        own_cost=own_cost_per_hour(economics=economics, utilization=utilization) * cap,
        api_cost=tokens / TOKENS_PER_MTOK * api_price_per_mtok,
    )


def cost_curve(*, economics: PoolEconomics, tokens_per_s: Number) -> list[tuple[float, Decimal]]:
    """Own cost per million tokens at u = 0.05, 0.10, …, 1.00 (``tokens_per_s`` > 0)."""
    tps = to_decimal(tokens_per_s)
    if tps <= 0:
        raise ValueError("tokens_per_s: must be > 0")
    curve: list[tuple[float, Decimal]] = []
    for u in CURVE_UTILIZATIONS:
        cost = own_cost_per_mtok(economics=economics, utilization=u, tokens_per_s=tps)
        if cost is not None:  # always: u > 0 and tps > 0
            curve.append((float(u), cost))
    return curve
