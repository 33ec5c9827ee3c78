"""Break-even against an API (docs/metrics.md, "Break-even"): pure functions over plain
data, no ORM.

A pool of GPUs is described by ``PoolEconomics``: its capacity-weighted fixed rate, its active
and idle power, its site's PUE and tariff, and the owned share of its capacity hours (rented
GPUs' energy costs nothing extra, so the energy price is scaled by that share). Money is
``Decimal``; utilisations are returned as floats (they are fractions, not money).

The same formulas answer for a rented pool: its fixed rate is the rental rate and its owned
share 0, so ``C(u)`` is the rental rate and ``u*`` is where renting beats the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from billing.cost_model import Number, to_decimal

SECONDS_PER_HOUR = Decimal(3600)
TOKENS_PER_MTOK = Decimal(1_000_000)
HOURS_PER_MONTH = Decimal(730)  # 8,760 / 12: the month of docs/metrics.md
CURVE_UTILIZATIONS: tuple[Decimal, ...] = tuple(Decimal(k) / 20 for k in range(1, 21))

# What a break-even compares (the API's ``comparison``): owning the pool's GPUs, or renting
# them (every capacity hour of the pool in the window rented), against the API.
OWNED = "owned"
RENTED = "rented"

# The product's break-even workload, in the fleet file's keys (``[breakeven]``): what the
# page and the API use where neither the pool's table nor the fleet's names a key.
PRODUCT_WORKLOAD: dict[str, Any] = {
    "tokens_per_s_per_gpu": 2000,
    "api_input_price_per_mtok": Decimal("0.20"),
    "api_output_price_per_mtok": Decimal("0.80"),
    "output_share": 0.25,
    "rental_rate_per_hour": Decimal("2.35"),
}
# The most tokens per second one GPU may be said to serve (page, API, fleet file): far above
# any real GPU (~10^5), and low enough that a month of them at the highest price a form takes
# stays within the 28 digits money is computed in (a larger figure failed to round: a 500).
TOKENS_PER_S_MAX = 1e9
PRICE_KEYS = frozenset(
    {"api_input_price_per_mtok", "api_output_price_per_mtok", "api_price_per_mtok"}
)


def workload_defaults(
    *, fleet: Mapping[str, Any], pool: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The break-even workload in force: the pool's table over the fleet's over the product's.

    A pool table that names any API price brings its prices and none of the fleet's (a price
    it leaves out is the product's). ``api_price_per_mtok`` in the result means the blended
    price is in force; otherwise the input and output prices with the output share are.
    """
    own = dict(pool or {})
    below = {k: v for k, v in fleet.items() if not (PRICE_KEYS & own.keys() and k in PRICE_KEYS)}
    return {**PRODUCT_WORKLOAD, **below, **own}


def comparison_kind(*, owned_capacity_hours: Number, capacity_hours: Number) -> str:
    """``RENTED`` when every capacity hour in the window was rented, else ``OWNED`` (a pool
    with no capacity in the window is compared as owned: there is nothing rented)."""
    capacity = to_decimal(capacity_hours)
    return RENTED if capacity > 0 and to_decimal(owned_capacity_hours) <= 0 else OWNED


def energy_terms_blended(parts: Iterable[tuple[Number, Number, Number]]) -> tuple[Decimal, Decimal]:
    """(PUE, price per kWh) of GPUs at several sites as one pool, from ``(weight, PUE,
    price)`` per part, weighted by the kWh each part drew (or its capacity hours where none
    drew any): ``PUE = Σ w·PUE / Σ w``, ``price = Σ w·PUE·price / Σ w·PUE``, so that
    ``PUE × price = Σ w·PUE·price / Σ w``, the mean price of one kWh at the GPU. No weight:
    PUE 1, price 0 (as for a GPU with no site)."""
    weight = weighted_pue = weighted_cost = Decimal(0)
    for w, pue, price in parts:
        w_d, pue_d = to_decimal(w), to_decimal(pue)
        weight += w_d
        weighted_pue += w_d * pue_d
        weighted_cost += w_d * pue_d * to_decimal(price)
    if weight <= 0 or weighted_pue <= 0:
        return Decimal(1), Decimal(0)
    return weighted_pue / weight, weighted_cost / weighted_pue


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


def measured_cost_per_mtok(*, cost: Decimal, tokens: Number) -> Decimal | None:
    """What a million tokens cost where they were measured (job efficiency, DESIGN.md §9.4):
    ``cost / tokens × 1e6``; ``None`` without tokens."""
    tokens_d = to_decimal(tokens)
    if tokens_d <= 0:
        return None
    return cost / tokens_d * TOKENS_PER_MTOK


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


@dataclass(frozen=True)
class OwningInstead:
    """A rented pool's GPUs owned instead, at the fixed rate and energy price at which the
    fleet owns GPUs of the same model, doing the same work (the pool's measured power and
    utilisation): against the API and against the rent paid."""

    fixed_rate_per_hour: Decimal
    pue: Decimal
    price_per_kwh: Decimal
    breakeven_utilization: float | None  # owning against the API
    cost_per_mtok: Decimal | None  # at the measured utilisation
    cost_per_month: Decimal
    rent_per_month: Decimal
    models: tuple[str, ...] = ()  # the GPU models priced
    gpus: int = 0  # the owned GPUs of those models the price comes from
    curve: tuple[tuple[float, Decimal], ...] = ()  # owning's cost per Mtok, as ``cost_curve``

    @property
    def savings_per_month(self) -> Decimal:
        """Renting − owning: positive when owning would be cheaper."""
        return self.rent_per_month - self.cost_per_month


def owning_instead(
    *,
    rented: PoolEconomics,
    owned_fixed_rate_per_hour: Decimal,
    owned_pue: Number,
    owned_price_per_kwh: Number,
    utilization: Number,
    tokens_per_s: Number,
    api_price_per_mtok: Decimal,
    capacity_hours: Number,
    window_hours: Number,
    models: tuple[str, ...] = (),
    gpus: int = 0,
) -> OwningInstead:
    """``rented``'s power with the owned fixed rate and energy price: ``C_own(u) =
    owned_fixed + (u·P_act + (1−u)·P_idle) × PUE × price``, and the month of both."""
    owned = pool_economics(
        fixed_rate_per_hour=owned_fixed_rate_per_hour,
        p_active_kw=rented.p_active_kw,
        p_idle_kw=rented.p_idle_kw,
        pue=owned_pue,
        price_per_kwh=owned_price_per_kwh,
    )

    def month(economics: PoolEconomics) -> MonthlyComparison:
        return monthly_comparison(
            economics=economics,
            utilization=utilization,
            tokens_per_s=tokens_per_s,
            api_price_per_mtok=api_price_per_mtok,
            capacity_hours=capacity_hours,
            window_hours=window_hours,
        )

    return OwningInstead(
        fixed_rate_per_hour=owned.fixed_rate_per_hour,
        pue=owned.pue,
        price_per_kwh=owned.price_per_kwh,
        breakeven_utilization=breakeven_utilization(
            economics=owned, api_price_per_mtok=api_price_per_mtok, tokens_per_s=tokens_per_s
        ),
        cost_per_mtok=own_cost_per_mtok(
            economics=owned, utilization=utilization, tokens_per_s=tokens_per_s
        ),
        cost_per_month=month(owned).own_cost,
        rent_per_month=month(rented).own_cost,
        models=models,
        gpus=gpus,
        curve=tuple(cost_curve(economics=owned, tokens_per_s=tokens_per_s)),
    )
