"""Break-even of a pool, or of every owned GPU of the fleet as one pool, against an API
(the figures of ``billing.breakeven``; docs/metrics.md, "Break-even")."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from billing import breakeven as be
from billing import cost_model as cm
from billing.selectors.costs import _accumulated
from billing.selectors.sums import _compute
from billing.selectors.types import (
    _NO_SITE,
    Filters,
    _NamesAndSiteTerms,
    _Segment,
    _SiteTerms,
    _validate,
)
from fleet.models import FleetSettings, Pool
from telemetry.efficiency import MeasuredTokens, measured_tokens_per_s


@dataclass
class BreakevenResult:
    """The /api/v1/breakeven fields (docs/api.md). For a rented pool (``comparison`` is
    ``"rented"``) the "own" figures are the pool's renting cost, the rental rate and its
    break-even against the API; ``owning_instead`` prices owning those GPUs."""

    pool: str | None  # None: the fleet-wide view, every GPU not rented as one pool
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
    comparison: str = be.OWNED  # be.RENTED: every capacity hour of the pool was rented
    gpus: int = 0  # GPUs with capacity in the window
    owning_instead: be.OwningInstead | None = None  # a rented pool, where the price is known


def breakeven_workload(*, pool: str | None) -> dict[str, Any]:
    """The break-even workload in force for ``pool`` (None: the fleet-wide view), in the fleet
    file's keys: the pool's ``breakeven`` table over the fleet's ``[breakeven]`` over the
    product's defaults. The page's defaults and the API's."""
    own = (
        Pool.objects.filter(name=pool).values_list("breakeven", flat=True).first() if pool else None
    )
    return be.workload_defaults(fleet=dict(FleetSettings.load().breakeven), pool=own)


def breakeven_workload_measured(
    *, pool: str | None, start: dt.date, end: dt.date
) -> tuple[dict[str, Any], MeasuredTokens | None]:
    """:func:`breakeven_workload` for the report days ``[start, end)``, its tokens per second
    per GPU the pool's jobs measured where their training loops reported tokens
    (``telemetry.efficiency.measured_tokens_per_s``; None: the fleet file's or the product's
    stand). The page's, the API's and the weekly email's defaults, so the three agree."""
    workload = breakeven_workload(pool=pool)
    zone = FleetSettings.load().report_zone
    measured = measured_tokens_per_s(
        pool=pool,
        start=dt.datetime.combine(start, dt.time(), tzinfo=zone),
        end=dt.datetime.combine(end, dt.time(), tzinfo=zone),
    )
    if measured is not None:
        workload["tokens_per_s_per_gpu"] = round(measured.tokens_per_s, 1)
    return workload, measured


def _capacity_h(segment: _Segment) -> Decimal:
    return cm.capacity_hours(observed_s=segment.sums["observed_s"], offline_hours=segment.offline_h)


def _energy_terms(segments: list[_Segment], names: _NamesAndSiteTerms) -> tuple[Decimal, Decimal]:
    """PUE and tariff of GPUs at several sites as one pool: weighted by the energy each
    drew, or by capacity hours where none drew any (``billing.breakeven``)."""
    drew = any(s.sums["energy_j"] > 0 for s in segments)
    parts = []
    for segment in segments:
        site = names.site(segment.site_id)
        weight = cm.to_decimal(segment.sums["energy_j"]) if drew else _capacity_h(segment)
        parts.append((weight, site.pue, site.price_per_kwh))
    return be.energy_terms_blended(parts)


def _owned_price(
    *,
    start: dt.date,
    end: dt.date,
    now: dt.datetime | None,
    pool_segments: list[_Segment],
) -> tuple[Decimal, Decimal, Decimal, tuple[str, ...], int] | None:
    """What owning the rented pool's GPUs costs, from the fleet's owned GPUs of the same
    models in the window: ``(fixed rate, PUE, tariff, model names, owned GPUs)``, the fixed
    rate each model's (fixed cost / capacity hours) weighted by the pool's capacity hours of
    that model. None where a model of the pool has no owned GPU with capacity (or none)."""
    pool_h: dict[str, Decimal] = defaultdict(Decimal)
    for segment in pool_segments:
        pool_h[segment.gpu.model_key] += _capacity_h(segment)
    models = {k: h for k, h in pool_h.items() if h > 0}
    if not models or "" in models:  # a GPU of no known model has no price to go by
        return None
    computation = _compute(
        start=start, end=end, period="all", filters=Filters(models=tuple(models)), now=now
    )
    owned = [s for s in computation.segments if s.gpu.kind == cm.OWNED]
    by_model = {
        key: _accumulated((s for s in owned if s.gpu.model_key == key), computation.names)
        for key in models
    }
    if any(acc.capacity_h <= 0 for acc in by_model.values()):
        return None
    total_h = sum(models.values(), Decimal(0))
    fixed = sum(
        (
            models[key]
            / total_h
            * cm.mean_rate_per_hour(fixed_cost=acc.fixed_cost, capacity_hours=acc.capacity_h)
            for key, acc in by_model.items()
        ),
        Decimal(0),
    )
    pue, price = _energy_terms(owned, computation.names)
    names = {seg.gpu.model_key: seg.gpu.model_name for seg in pool_segments}
    gpus = set().union(*(acc.gpu_ids for acc in by_model.values()))
    return fixed, pue, price, tuple(sorted(names[k] for k in models)), len(gpus)


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
    pool: str | None,
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
    """Break-even of ``pool``, or with ``pool=None`` of every GPU of the fleet that is not
    rented as one pool (PUE and tariff weighted by energy). Raises LookupError for an unknown
    pool, ValueError naming the bad argument."""
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
    if pool is None:  # the fleet-wide view: every GPU not rented, as one pool
        computation = _compute(start=start, end=end, period="all", filters=Filters(), now=now)
        segments = [seg for seg in computation.segments if seg.gpu.kind != cm.RENTED]
        members = [g for g in computation.gpus.values() if g.kind != cm.RENTED]
        pue, price_per_kwh = _energy_terms(segments, computation.names)
        site = _SiteTerms(
            name=None, pue=pue, price_per_kwh=price_per_kwh, grid_g_per_kwh=Decimal(0)
        )
    else:
        pool_obj = Pool.objects.filter(name=pool).first()
        if pool_obj is None:
            raise LookupError(f"pool: no pool named {pool!r}")
        computation = _compute(
            start=start, end=end, period="all", filters=Filters(pools=(pool,)), now=now
        )
        segments = computation.segments
        members = [g for g in computation.gpus.values() if g.pool_id == pool_obj.pk]
        # PUE and tariff: the pool's site; else that of its GPUs' current site.
        site = computation.names.site(pool_obj.site_id)
        if pool_obj.site_id is None:
            site = next(
                (computation.names.site(g.site_id) for g in members if g.site_id is not None),
                _NO_SITE,
            )
    acc = _accumulated(segments, computation.names)
    s = acc.sums

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
    comparison = be.comparison_kind(
        owned_capacity_hours=acc.owned_capacity_h, capacity_hours=capacity_h
    )
    instead = None
    if comparison == be.RENTED:
        # Renting on demand is no alternative to a pool that is rented: owning is.
        rental_rate_per_hour = None
        price = (
            _owned_price(start=start, end=end, now=now, pool_segments=segments)
            if measured_u is not None
            else None
        )
        if price is not None and measured_u is not None:
            fixed, pue, tariff, models, gpus = price
            instead = be.owning_instead(
                rented=economics,
                owned_fixed_rate_per_hour=fixed,
                owned_pue=pue,
                owned_price_per_kwh=tariff,
                utilization=measured_u,
                tokens_per_s=tokens_per_s,
                api_price_per_mtok=api_price,
                capacity_hours=capacity_h,
                window_hours=computation.window_hours,
                models=models,
                gpus=gpus,
            )
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
        comparison=comparison,
        gpus=len(acc.gpu_ids),
        owning_instead=instead,
    )
