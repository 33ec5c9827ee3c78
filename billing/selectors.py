"""Period figures (DESIGN.md §3 and §7) for the dashboard, the finance API and the email.

INTERFACE STUB — the signatures and dataclasses below are the contract that the dashboard,
the finance API and the weekly report code against; the implementation is being written.
Money is Decimal in full precision (round only when shown); hours are floats.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

GROUP_BY = ("gpu", "node", "pool", "team", "site", "model", "fleet")
PERIODS = ("day", "week", "month", "all")
THROTTLE_REASONS = ("power_cap", "thermal", "hw_slowdown", "other")


@dataclass(frozen=True)
class Filters:
    """Restricts which GPUs count; each tuple empty = no restriction. Site/pool/team filters
    use the attribution stored with each hourly rollup (offline hours: current attribution)."""

    sites: tuple[str, ...] = ()  # site names
    pools: tuple[str, ...] = ()  # pool names
    teams: tuple[str, ...] = ()  # team names
    models: tuple[str, ...] = ()  # GpuModel keys, e.g. "H100-SXM"
    gpus: tuple[str, ...] = ()  # GPU UUIDs


@dataclass
class CostRow:
    """One group over one period: every field of the finance API's rows (DESIGN.md §7)."""

    key: str  # GPU UUID, hostname, pool/team/site name, model key, or "fleet"
    name: str  # human label (GPU: "host#index", model: display name)
    period_start: dt.datetime  # aware, report time zone, clipped to the query
    period_end: dt.datetime
    gpu_count: int  # GPUs with capacity in this row
    capacity_hours: float
    observed_hours: float
    air_hours: float
    held_hours: float
    parked_hours: float
    offline_hours: float
    utilization: float | None  # air / capacity; None when capacity is 0
    hours_in_air_per_day: float | None
    energy_kwh: float
    idle_energy_kwh: float
    energy_per_gpu_hour_kwh: float | None  # kWh / observed hours
    kwh_per_air_hour: float | None
    fixed_cost: Decimal
    energy_cost: Decimal
    total_cost: Decimal
    idle_cost: Decimal
    cost_per_air_hour: Decimal | None
    co2e_kg: float
    throttled_hours: float
    throttled_power_cap_hours: float
    throttled_thermal_hours: float
    throttled_hw_slowdown_hours: float
    throttled_other_hours: float
    work_utilization: float | None
    priced: bool  # False when any GPU in the row has no cost profile or no site
    currency: str
    nominal_rate_per_hour: Decimal  # capacity-weighted mean fixed rate


def cost_rows(
    *,
    start: dt.date,
    end: dt.date,
    group_by: str = "gpu",
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[CostRow]:
    """Rows per group and period over [start, end) (dates in the report time zone).

    Ordered by period_start, then key. Reads hourly rollups only (never the raw table); the
    number of queries does not grow with the number of GPUs.
    """
    raise NotImplementedError


@dataclass
class FleetSummary:
    row: CostRow  # group_by="fleet", period="all"
    target_utilization: float
    recoverable_gpus: float
    recoverable_money_per_year: Decimal
    gpus_in_service: int
    gpus_offline_now: int  # in service, no sample in the last 15 minutes


def fleet_summary(
    *, start: dt.date, end: dt.date, filters: Filters | None = None, now: dt.datetime | None = None
) -> FleetSummary:
    raise NotImplementedError


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
    raise NotImplementedError
