"""The selectors' data: filters, rows, and the plain data a computation works on."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from billing import cost_model as cm
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS

GROUP_BY = ("gpu", "node", "pool", "team", "site", "model", "fleet")
PERIODS = ("day", "week", "month", "all")
THROTTLE_REASONS = ("power_cap", "thermal", "hw_slowdown", "other")
# A GPU in service that sent nothing for this long counts as offline now (offline_now).
OFFLINE_NOW_AFTER = dt.timedelta(minutes=15)


def offline_now(last_seen_at: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether a GPU last seen at ``last_seen_at`` (None: never) counts as offline at ``now``."""
    return last_seen_at is None or last_seen_at < now - OFFLINE_NOW_AFTER


UNASSIGNED_NAME = "(none)"


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
    """One group over one period: every field of the finance API's rows (docs/api.md)."""

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
    # What the SMs really did, from profiling data (docs/metrics.md, "Work"); each None (never
    # 0) where no sample of the row carries it.
    profiled_hours: float  # Σ prof_s of the samples with sm_active / 3600; 0 without
    work_hours: float | None  # Σ sm_active × prof_s / 3600
    busy_not_working_hours: float | None  # air hours of those samples − work hours
    work_utilization: float | None  # work hours / profiled hours
    tensor_hours: float | None
    tensor_utilization: float | None
    cost_per_work_hour: Decimal | None  # cost of the GPU-hours with sm_active / work hours
    priced: bool  # False when any GPU in the row has no cost profile or no site
    currency: str
    nominal_rate_per_hour: Decimal  # capacity-weighted mean fixed rate
    closed: bool = False  # the whole period lies in closed months: frozen figures
    adjustment_for: str | None = None  # "YYYY-MM": late data for that closed month


# --- plain data the computation works on ----------------------------------------------------
@dataclass(frozen=True)
class _SiteTerms:
    name: str | None
    pue: Decimal
    price_per_kwh: Decimal
    grid_g_per_kwh: Decimal
    # Its hash, worked out once: segments are told into price classes by their terms, tens
    # of thousands a page (a dataclass hashes its fields' Decimals at every lookup).
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hashed = hash((self.name, self.pue, self.price_per_kwh, self.grid_g_per_kwh))
        object.__setattr__(self, "_hash", hashed)

    def __hash__(self) -> int:
        return self._hash


# A GPU with no site: PUE 1, price 0, grid 0 (docs/metrics.md), and not priced.
_NO_SITE = _SiteTerms(
    name=None, pue=Decimal(1), price_per_kwh=Decimal(0), grid_g_per_kwh=Decimal(0)
)


@dataclass
class _GpuInfo:
    id: int
    uuid: str
    label: str
    model_key: str
    model_name: str
    max_power_w: float | None
    idle_power_w: float | None
    node_id: int | None  # current attribution: where offline hours go
    pool_id: int | None
    team_id: int | None
    site_id: int | None
    service_start: dt.datetime | None
    retired_at: dt.datetime | None
    last_seen_at: dt.datetime | None
    terms: cm.CostTerms | None
    boundary_hour: dt.datetime | None = None  # the UTC hour depreciation ends in
    rates: tuple[Decimal, Decimal, Decimal] = (Decimal(0), Decimal(0), Decimal(0))

    @property
    def kind(self) -> str | None:
        return self.terms.kind if self.terms else None

    def price_class(self, phase: int) -> tuple[Any, ...]:
        """What prices this GPU's sums in ``phase`` beside a site's terms: its kind, rate,
        whether it has a cost profile at all, nominal and idle power. Segments alike in
        these and their site are priced as one (``costs._accumulated``): the one key every
        grouping by price class starts from."""
        terms = self.terms
        return (
            terms.kind if terms else None,
            self.rates[phase],
            terms is None,
            self.max_power_w,
            self.idle_power_w,
        )

    def standing_in(
        self, terms: cm.CostTerms | None, rates: tuple[Decimal, Decimal, Decimal]
    ) -> _GpuInfo:
        """A copy of this GPU at other terms and rates, no depreciation boundary (a closed
        month's stand-in): ``dataclasses.replace`` without its ``__init__``, 10,000 times a
        page at 10,000 GPUs."""
        copy = object.__new__(_GpuInfo)
        copy.__dict__.update(self.__dict__)
        copy.terms, copy.rates, copy.boundary_hour = terms, rates, None
        return copy

    def phase_intervals(self) -> list[tuple[int, dt.datetime | None, dt.datetime | None]]:
        """(phase, from, to) with open ends as None."""
        if self.boundary_hour is None:
            return [(0, None, None)]
        after = self.boundary_hour + cm.ONE_HOUR
        return [(0, None, self.boundary_hour), (1, self.boundary_hour, after), (2, after, None)]


@dataclass(frozen=True)
class _Bucket:
    key: dt.date  # local start date of the (unclipped) day, ISO week or month
    start: dt.datetime  # UTC, clipped to the query
    end: dt.datetime
    local_start: dt.datetime  # the same, in the report time zone
    local_end: dt.datetime


@dataclass(slots=True)
class _Segment:
    """One GPU, one bucket, one attribution, one phase: observed sums or offline hours."""

    gpu: _GpuInfo
    bucket: _Bucket
    phase: int
    node_id: int | None
    pool_id: int | None
    team_id: int | None
    site_id: int | None
    sums: dict[str, float] = field(default_factory=dict)
    offline_h: Decimal = Decimal(0)
    site_terms: _SiteTerms | None = None  # a closed month's: priced as at its close
    adjusts: dt.date | None = None  # the closed day whose late data this adjusts
    # A segment of a price class (``sums._compute(by_class=True)``): the GPUs it stands for
    # that have capacity in it; ``gpu`` is one of them (the pooled trend's segments: none,
    # their GPUs are counted from the pooled spans). None: the segment of ``gpu`` alone.
    gpu_ids: set[int] | None = None


@dataclass
class _Acc:
    """Running sums of one group over one bucket."""

    gpu_ids: set[int] = field(default_factory=set)
    capacity_h: Decimal = Decimal(0)
    owned_capacity_h: Decimal = Decimal(0)  # not rented: their energy is paid for
    offline_h: Decimal = Decimal(0)
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SUM_FIELDS, 0.0))
    energy_kwh: Decimal = Decimal(0)
    idle_energy_kwh: Decimal = Decimal(0)
    fixed_cost: Decimal = Decimal(0)
    energy_cost: Decimal = Decimal(0)
    idle_cost: Decimal = Decimal(0)
    profiled_cost: Decimal = Decimal(0)  # total cost of the GPU-hours with sm_active
    co2e_kg: float = 0.0
    priced: bool = True
    nominal_max_w_h: float = 0.0  # Σ nominal power × capacity hours, for break-even fallbacks
    nominal_idle_w_h: float = 0.0
    nominal_h: float = 0.0


@dataclass
class _NamesAndSiteTerms:
    """What a segment's attribution ids stand for: the node, pool and team names, and each
    site's name with its terms (PUE, tariff, grid intensity) that price its energy."""

    nodes: dict[int, str]
    pools: dict[int, str]
    teams: dict[int, str]
    sites: dict[int, _SiteTerms]

    def site(self, site_id: int | None) -> _SiteTerms:
        return self.sites.get(site_id, _NO_SITE) if site_id is not None else _NO_SITE


@dataclass
class _Computation:
    currency: str
    zone: dt.tzinfo
    target_utilization: float
    local_start: dt.datetime
    local_end: dt.datetime
    window_start: dt.datetime  # UTC
    window_end: dt.datetime  # UTC, the query's end
    now: dt.datetime
    gpus: dict[int, _GpuInfo]
    names: _NamesAndSiteTerms
    segments: list[_Segment]
    # Pooled (fleet trend only): per GPU, the days [from, to) summed per rate class, not per
    # GPU; those segments carry a stand-in GPU of the class.
    # The GPUs whose offline hours pooled segments hold, by the days [from, to) they were
    # pooled over (few spans: most GPUs share one).
    pooled: dict[tuple[dt.date, dt.date], set[int]] = field(default_factory=dict)
    # Keys of the buckets that lie wholly in closed months (their figures are frozen).
    closed_buckets: frozenset[dt.date] = frozenset()
    # No GPU observed more than its capacity in any bucket and phase (overlapping samples,
    # or data before its service start or after its retirement): its offline hours over the
    # buckets then add up to those over the whole window, so the segments of every bucket
    # together are the whole window's (``costs.fleet_overview``). False where not known.
    offline_additive: bool = False

    @property
    def capacity_end(self) -> dt.datetime:
        return max(self.window_start, min(self.window_end, self.now))

    @property
    def window_hours(self) -> Decimal:
        """The window's hours, cut off at now."""
        return cm.hours_between(start=self.window_start, end=self.capacity_end)


def _validate(*, start: dt.date, end: dt.date, period: str, group_by: str = "fleet") -> None:
    if end <= start:
        raise ValueError("end: must be after start")
    if period not in PERIODS:
        raise ValueError(f"period: must be one of {', '.join(PERIODS)}")
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by: must be one of {', '.join(GROUP_BY)}")
