"""The cost formulas of docs/metrics.md ("Costs"), once: pure functions over plain data, no ORM.

``billing.selectors`` computes every cost through these functions, per GPU, period and
depreciation phase (``billing/selectors/costs.py``); the dashboard, the finance API, the weekly
email and the alerts show the selectors' figures, and ``billing/breakeven.py`` builds the
break-even on the fixed rate they give. Money is ``Decimal`` in full precision and is
rounded (``money_round``) only when shown or exported. Names carry their units. Hours and
energies arrive as floats from the rollups and are turned into ``Decimal`` through their
shortest ``repr`` (``to_decimal``), so 4.95 kWh is priced as 4.95, not as its binary expansion.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import TypeVar

# Depreciation years are Julian years of 365.25 days: 8,766 hours (docs/metrics.md).
HOURS_PER_YEAR = Decimal(8766)
SECONDS_PER_HOUR = Decimal(3600)
JOULES_PER_KWH = Decimal(3_600_000)
HOURS_PER_DAY = Decimal(24)
GRAMS_PER_KG = Decimal(1000)
CENT = Decimal("0.01")
ONE_HOUR = dt.timedelta(hours=1)

OWNED = "owned"
RENTED = "rented"
SCOPE_ORDER = ("gpu", "node", "pool", "site")  # most specific first

Number = Decimal | float | int
T = TypeVar("T")


def to_decimal(value: Number) -> Decimal:
    """A number as ``Decimal``; a float through its shortest repr (0.1 → Decimal("0.1"))."""
    if isinstance(value, float):  # first: the rollups' sums, the common case
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        return Decimal(repr(value))
    if isinstance(value, Decimal):
        return value
    return Decimal(value)


def money_round(amount: Decimal) -> Decimal:
    """Half-up to cents: only for display and export, never inside a computation."""
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


# --- units ----------------------------------------------------------------------------------
def hours_from_seconds(seconds: Number) -> Decimal:
    return to_decimal(seconds) / SECONDS_PER_HOUR


def kwh_from_joules(energy_j: Number) -> Decimal:
    return to_decimal(energy_j) / JOULES_PER_KWH


def hours_between(*, start: dt.datetime, end: dt.datetime) -> Decimal:
    """Exact length of ``[start, end)`` in hours (0 when empty), to the microsecond."""
    if end <= start:
        return Decimal(0)
    delta = end - start
    seconds = Decimal(delta.days * 86_400 + delta.seconds) + Decimal(delta.microseconds) / 10**6
    return seconds / SECONDS_PER_HOUR


def _timedelta_from_hours(hours: Decimal) -> dt.timedelta:
    microseconds = (hours * SECONDS_PER_HOUR * 10**6).to_integral_value(rounding=ROUND_HALF_UP)
    return dt.timedelta(microseconds=int(microseconds))


# --- cost profiles --------------------------------------------------------------------------
@dataclass(frozen=True)
class CostTerms:
    """How one GPU is paid for, as plain data (a ``billing.models.CostProfile`` without ORM).

    ``kind`` is ``"owned"`` (purchase price depreciated linearly over ``depreciation_years``
    of 8,766 h, plus opex per hour) or ``"rented"`` (a rate per GPU-hour, energy included).
    """

    kind: str
    purchase_price: Decimal = Decimal(0)
    depreciation_years: Decimal = Decimal(5)
    opex_per_hour: Decimal = Decimal(0)
    rental_rate_per_hour: Decimal = Decimal(0)

    @property
    def owned(self) -> bool:
        return self.kind == OWNED

    @property
    def depreciation_hours(self) -> Decimal:
        return self.depreciation_years * HOURS_PER_YEAR


def cost_profile_scopes(
    *, gpu_uuid: str, hostname: str | None, pool_name: str | None, site_name: str | None
) -> list[tuple[str, str]]:
    """``(scope_kind, scope_name)`` of the scopes a GPU is in, most specific first (gpu >
    node > pool > site); a scope without a name (no pool, no site) is left out."""
    names = (gpu_uuid, hostname, pool_name, site_name)
    return [(kind, name) for kind, name in zip(SCOPE_ORDER, names, strict=True) if name]


def cost_profile_resolve(
    *,
    profiles: Mapping[tuple[str, str], T],
    gpu_uuid: str,
    hostname: str | None,
    pool_name: str | None,
    site_name: str | None,
) -> T | None:
    """The profile of the most specific scope that has one (``cost_profile_scopes``).

    ``profiles`` maps ``(scope_kind, scope_name)`` (e.g. ``("pool", "training")``) to anything.
    """
    for scope in cost_profile_scopes(
        gpu_uuid=gpu_uuid, hostname=hostname, pool_name=pool_name, site_name=site_name
    ):
        found = profiles.get(scope)
        if found is not None:
            return found
    return None


# --- the fixed rate and its integral --------------------------------------------------------
def depreciation_end(*, service_start: dt.datetime, depreciation_years: Decimal) -> dt.datetime:
    """The moment an owned GPU is fully depreciated: ``service_start + years × 8,766 h``."""
    return service_start + _timedelta_from_hours(depreciation_years * HOURS_PER_YEAR)


def fixed_rate_per_hour(*, terms: CostTerms | None, depreciating: bool = True) -> Decimal:
    """Owned: ``purchase / (years × 8,766) + opex`` while depreciating, else ``opex``.
    Rented: the rental rate. No profile: 0."""
    if terms is None:
        return Decimal(0)
    if not terms.owned:
        return terms.rental_rate_per_hour
    if depreciating and terms.depreciation_hours > 0:
        return terms.purchase_price / terms.depreciation_hours + terms.opex_per_hour
    return terms.opex_per_hour


def fixed_cost(
    *,
    terms: CostTerms | None,
    service_start: dt.datetime | None,
    start: dt.datetime,
    end: dt.datetime,
) -> Decimal:
    """The fixed cost of being in service over ``[start, end)``: the rate integrated exactly.

    The rate of an owned GPU drops to opex at ``depreciation_end``; an interval containing that
    moment is split there, so the hour that contains it is priced pro rata. Without a known
    service start an owned GPU is taken to be depreciating.
    """
    hours = hours_between(start=start, end=end)
    if terms is None or hours == 0:
        return Decimal(0)
    if not terms.owned or service_start is None:
        return fixed_rate_per_hour(terms=terms) * hours
    boundary = depreciation_end(
        service_start=service_start, depreciation_years=terms.depreciation_years
    )
    depreciating_hours = hours_between(start=start, end=min(end, boundary))
    return fixed_rate_per_hour(
        terms=terms, depreciating=True
    ) * depreciating_hours + fixed_rate_per_hour(terms=terms, depreciating=False) * (
        hours - depreciating_hours
    )


def mean_fixed_rate_per_hour(
    *,
    terms: CostTerms | None,
    service_start: dt.datetime | None,
    start: dt.datetime,
    end: dt.datetime,
) -> Decimal:
    """The mean rate over ``[start, end)``: the pro-rata rate of the hour depreciation ends in."""
    hours = hours_between(start=start, end=end)
    if hours == 0:
        return Decimal(0)
    return fixed_cost(terms=terms, service_start=service_start, start=start, end=end) / hours


def fixed_cost_at_rate(*, fixed_rate_per_hour: Decimal, capacity_hours: Number) -> Decimal:
    """``fixed_rate × capacity hours`` over a stretch where the rate is constant."""
    return _fixed_cost_at_rate(fixed_rate_per_hour, to_decimal(capacity_hours))


def _fixed_cost_at_rate(rate: Decimal, hours: Decimal) -> Decimal:
    return rate * hours


def mean_rate_per_hour(*, fixed_cost: Decimal, capacity_hours: Decimal) -> Decimal:
    """``fixed cost / capacity hours``: the capacity-weighted mean fixed rate of a group of
    GPUs (0 without capacity)."""
    return fixed_cost / capacity_hours if capacity_hours > 0 else Decimal(0)


# --- capacity -------------------------------------------------------------------------------
def capacity_hours(*, observed_s: Number, offline_hours: Decimal) -> Decimal:
    """A GPU's capacity hours over a stretch: the hours it was observed plus the hours it was
    offline (docs/metrics.md)."""
    return hours_from_seconds(observed_s) + offline_hours


def capacity_interval(
    *,
    service_start: dt.datetime | None,
    retired_at: dt.datetime | None,
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
) -> tuple[dt.datetime, dt.datetime] | None:
    """The part of ``[start, end)`` the GPU is in service: from its service start to its
    retirement, never past ``now``. ``None`` when empty or the GPU has no service start."""
    if service_start is None:
        return None
    lo = max(start, service_start)
    hi = min(end, now)
    if retired_at is not None:
        hi = min(hi, retired_at)
    return (lo, hi) if lo < hi else None


def offline_hours(*, capacity_hours: Number, observed_hours: Number) -> Decimal:
    """Capacity we paid for and know nothing about; never below 0."""
    return max(Decimal(0), to_decimal(capacity_hours) - to_decimal(observed_hours))


# --- energy, totals, idle -------------------------------------------------------------------
def energy_cost(
    *, kind: str | None, energy_kwh: Number, pue: Number, price_per_kwh: Number
) -> Decimal:
    """``kWh × PUE × price`` for owned GPUs (and for GPUs with no profile, priced at their
    site's tariff); 0 for rented ones, whose rate includes energy."""
    return _energy_cost(kind, to_decimal(energy_kwh), to_decimal(pue), to_decimal(price_per_kwh))


def _energy_cost(kind: str | None, energy_kwh: Decimal, pue: Decimal, price: Decimal) -> Decimal:
    if kind == RENTED:
        return Decimal(0)
    return energy_kwh * pue * price


def total_cost(*, fixed_cost: Decimal, energy_cost: Decimal) -> Decimal:
    return fixed_cost + energy_cost


def idle_fixed_cost(
    *, fixed_rate_per_hour: Decimal, capacity_hours: Number, air_hours: Number
) -> Decimal:
    """``fixed_rate × (capacity − air)``: offline hours included, they were paid for."""
    return _idle_fixed_cost(fixed_rate_per_hour, to_decimal(capacity_hours), to_decimal(air_hours))


def _idle_fixed_cost(rate: Decimal, capacity_hours: Decimal, air_hours: Decimal) -> Decimal:
    return rate * (capacity_hours - air_hours)


def idle_cost(
    *,
    kind: str | None,
    fixed_rate_per_hour: Decimal,
    capacity_hours: Number,
    air_hours: Number,
    idle_energy_kwh: Number,
    pue: Number,
    price_per_kwh: Number,
) -> Decimal:
    """``fixed_rate × (capacity − air) + idle kWh × PUE × price`` (energy: owned GPUs only)."""
    return _idle_cost(
        kind,
        fixed_rate_per_hour,
        to_decimal(capacity_hours),
        to_decimal(air_hours),
        to_decimal(idle_energy_kwh),
        to_decimal(pue),
        to_decimal(price_per_kwh),
    )


def _idle_cost(
    kind: str | None,
    rate: Decimal,
    capacity_hours: Decimal,
    air_hours: Decimal,
    idle_energy_kwh: Decimal,
    pue: Decimal,
    price: Decimal,
) -> Decimal:
    return _idle_fixed_cost(rate, capacity_hours, air_hours) + _energy_cost(
        kind, idle_energy_kwh, pue, price
    )


def workload_cost(
    *,
    kind: str | None,
    fixed_rate_per_hour: Decimal,
    gpu_hours: Number,
    energy_kwh: Number,
    pue: Number,
    price_per_kwh: Number,
) -> Decimal:
    """A workload's share of one GPU at one rate: ``GPU hours × fixed rate + kWh × PUE ×
    price`` (energy: owned GPUs only). Its idle cost is the same sum over its held hours and
    the held part of its energy (docs/metrics.md, "Workloads")."""
    return _workload_cost(
        kind,
        fixed_rate_per_hour,
        to_decimal(gpu_hours),
        to_decimal(energy_kwh),
        to_decimal(pue),
        to_decimal(price_per_kwh),
    )


def _workload_cost(
    kind: str | None,
    rate: Decimal,
    gpu_hours: Decimal,
    energy_kwh: Decimal,
    pue: Decimal,
    price: Decimal,
) -> Decimal:
    return _fixed_cost_at_rate(rate, gpu_hours) + _energy_cost(kind, energy_kwh, pue, price)


def cost_per_air_hour(*, total_cost: Decimal, air_hours: Number) -> Decimal | None:
    """What one hour of real GPU work cost; ``None`` without air hours."""
    air = to_decimal(air_hours)
    return total_cost / air if air > 0 else None


def cost_per_work_hour(*, profiled_cost: Decimal, work_hours: Number) -> Decimal | None:
    """What one hour of the SMs really working cost: the total cost of the GPU-hours that
    carry profiling data (``sm_active``) / their work hours (docs/metrics.md, "Work");
    ``None`` without work hours. GPU-hours without profiling data count in neither part, so a
    fleet measured in part is not charged its unmeasured hours."""
    work = to_decimal(work_hours)
    return profiled_cost / work if work > 0 else None


def co2e_kg(*, energy_kwh: Number, pue: Number, grid_g_per_kwh: Number) -> float:
    """``kWh × PUE × grid g/kWh / 1000``, for owned and rented GPUs alike."""
    return _co2e_kg(to_decimal(energy_kwh), to_decimal(pue), to_decimal(grid_g_per_kwh))


def _co2e_kg(energy_kwh: Decimal, pue: Decimal, grid_g_per_kwh: Decimal) -> float:
    return float(energy_kwh * pue * grid_g_per_kwh / GRAMS_PER_KG)


def segment_costs(
    kind: str | None,
    fixed_rate_per_hour: Decimal,
    observed_s: float,
    offline_hours: Decimal,
    air_s: float,
    energy_j: float,
    idle_energy_j: float,
    pue: Decimal,
    price_per_kwh: Decimal,
    grid_g_per_kwh: Decimal,
    profiled_hours: float,
    profiled_energy_j: float,
) -> tuple[Decimal, Decimal, Decimal, Decimal, Decimal, Decimal, float, Decimal | None]:
    """One segment (one GPU's stretch at one fixed rate) priced in one call: ``(capacity
    hours, kWh, idle kWh, fixed cost, energy cost, idle cost, CO2e kg, profiled cost)``.

    Capacity is observed + offline hours; the costs are ``fixed_cost_at_rate``,
    ``energy_cost``, ``idle_cost`` and ``co2e_kg`` through the same private formulas, so
    every figure is identical to the last digit; the profiled cost is ``workload_cost`` of
    the GPU-hours with profiling data and their energy (docs/metrics.md, "Work"), ``None``
    without such hours. Positional and tuple-valued because the selectors call it once per
    segment (~1 µs less than the single-purpose calls). ``pue``, the tariff and the grid
    intensity are ``Decimal``; the seconds, joules and profiled hours are rollup floats.
    """
    capacity_h = capacity_hours(observed_s=observed_s, offline_hours=offline_hours)
    air_h = hours_from_seconds(air_s)
    energy_kwh = kwh_from_joules(energy_j)
    idle_energy_kwh = kwh_from_joules(idle_energy_j)
    return (
        capacity_h,
        energy_kwh,
        idle_energy_kwh,
        _fixed_cost_at_rate(fixed_rate_per_hour, capacity_h),
        _energy_cost(kind, energy_kwh, pue, price_per_kwh),
        _idle_cost(
            kind, fixed_rate_per_hour, capacity_h, air_h, idle_energy_kwh, pue, price_per_kwh
        ),
        _co2e_kg(energy_kwh, pue, grid_g_per_kwh),
        # The GPU-hours with profiling data at the rate, with their energy (docs/metrics.md,
        # "Work"): as ``workload_cost``; None without such hours.
        _workload_cost(
            kind,
            fixed_rate_per_hour,
            to_decimal(profiled_hours),
            kwh_from_joules(profiled_energy_j),
            pue,
            price_per_kwh,
        )
        if profiled_hours
        else None,
    )


def segment_idle_cost(
    kind: str | None,
    fixed_rate_per_hour: Decimal,
    observed_s: float,
    offline_hours: Decimal,
    air_s: float,
    idle_energy_j: float,
    pue: Decimal,
    price_per_kwh: Decimal,
) -> tuple[Decimal, Decimal]:
    """``(capacity hours, idle cost)`` of one segment: what a list ordered by idle cost needs
    of ``segment_costs``, through the same formulas on the same values (the same figures to
    the last digit), without the rest."""
    capacity_h = capacity_hours(observed_s=observed_s, offline_hours=offline_hours)
    idle = _idle_cost(
        kind,
        fixed_rate_per_hour,
        capacity_h,
        hours_from_seconds(air_s),
        kwh_from_joules(idle_energy_j),
        pue,
        price_per_kwh,
    )
    return capacity_h, idle


# --- ratios ---------------------------------------------------------------------------------
def utilization(*, air_hours: Number, capacity_hours: Number) -> float | None:
    """Air hours / capacity hours (a fraction); ``None`` without capacity."""
    capacity = to_decimal(capacity_hours)
    return float(to_decimal(air_hours) / capacity) if capacity > 0 else None


def hours_in_air_per_day(*, air_hours: Number, capacity_hours: Number) -> float | None:
    """Air hours / (capacity hours / 24): the airline's block-hours figure."""
    capacity = to_decimal(capacity_hours)
    if capacity <= 0:
        return None
    return float(to_decimal(air_hours) / (capacity / HOURS_PER_DAY))


def activity_share(*, active_seconds: Number, measured_seconds: Number) -> float | None:
    """Σ activity × prof_s / Σ prof_s: work utilisation (``sm_active``) and tensor
    utilisation (``tensor_active``) of docs/metrics.md, "Work"; ``None`` (never 0) without
    measured seconds."""
    measured = to_decimal(measured_seconds)
    return float(to_decimal(active_seconds) / measured) if measured > 0 else None


def energy_per_gpu_hour_kwh(*, energy_kwh: Number, observed_hours: Number) -> float | None:
    observed = to_decimal(observed_hours)
    return float(to_decimal(energy_kwh) / observed) if observed > 0 else None


def kwh_per_air_hour(*, energy_kwh: Number, air_hours: Number) -> float | None:
    air = to_decimal(air_hours)
    return float(to_decimal(energy_kwh) / air) if air > 0 else None


# --- recoverable capacity -------------------------------------------------------------------
def recoverable_gpus(
    *,
    capacity_hours: Number,
    air_hours: Number,
    period_hours: Number,
    target_utilization: Number,
) -> float:
    """``(capacity − air / T) / period hours``, not below 0: GPU-equivalents the same work
    would not need at the target utilisation ``T``."""
    period = to_decimal(period_hours)
    target = to_decimal(target_utilization)
    if period <= 0 or target <= 0:
        return 0.0
    spare = (to_decimal(capacity_hours) - to_decimal(air_hours) / target) / period
    return float(max(Decimal(0), spare))


def recoverable_money_per_year(
    *, recoverable_gpus: Number, mean_fixed_rate_per_hour: Decimal
) -> Decimal:
    """Recoverable GPUs × the capacity-weighted mean fixed rate × 8,766 h."""
    return to_decimal(recoverable_gpus) * mean_fixed_rate_per_hour * HOURS_PER_YEAR
