"""Cost rows: segments grouped and accumulated through the cost model; the fleet
summary and the overview."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from operator import add, itemgetter

from billing import cost_model as cm
from billing.selectors.calendar import _buckets
from billing.selectors.closing import adjustment_negligible, booked_segments
from billing.selectors.closing import compute as _compute
from billing.selectors.counting import BucketCounts, bucket_counts
from billing.selectors.loading import _load, _Loaded, _loaded_within
from billing.selectors.sums import _kept_now
from billing.selectors.types import (
    UNASSIGNED_NAME,
    CostRow,
    Filters,
    _Acc,
    _Bucket,
    _Computation,
    _GpuInfo,
    _NamesAndSiteTerms,
    _Segment,
    _SiteTerms,
    _validate,
    offline_now,
)
from telemetry.models import USAGE_SUM_COLUMNS as _SUM_FIELDS

logger = logging.getLogger(__name__)


# --- grouping -------------------------------------------------------------------------------
def _group_of(
    gpu: _GpuInfo, at: _Segment | _GpuInfo, group_by: str, names: _NamesAndSiteTerms
) -> tuple[str, str]:
    """(key, name) of the group of ``gpu`` with the attribution (node, pool, team, site) of
    ``at``: a segment's stored one, or the GPU's own now."""
    if group_by == "gpu":
        return gpu.uuid, gpu.label
    if group_by == "model":
        return gpu.model_key, gpu.model_name
    if group_by == "fleet":
        return "fleet", "Fleet"
    found: str | None
    if group_by == "team":
        found = names.teams.get(at.team_id or 0)
    elif group_by == "pool":
        found = names.pools.get(at.pool_id or 0)
    elif group_by == "node":
        found = names.nodes.get(at.node_id or 0)
    else:  # site
        found = names.site(at.site_id).name
    return (found, found) if found else ("", UNASSIGNED_NAME)


def _accumulate(acc: _Acc, segment: _Segment, names: _NamesAndSiteTerms) -> None:
    """Add one segment's hours and money to ``acc``, and its GPU to the row's GPUs where it
    has capacity."""
    site = segment.site_terms or names.site(segment.site_id)
    if _priced_into(acc, segment, segment.sums, segment.offline_h, site) > 0:
        acc.gpu_ids.add(segment.gpu.id)


def _priced_into(
    acc: _Acc, segment: _Segment, sums: dict[str, float], offline_h: Decimal, site: _SiteTerms
) -> Decimal:
    """Add the hours and money of ``sums`` and ``offline_h`` (one segment's, or a price
    class's added up) to ``acc`` (not its GPU), at the GPU, phase and ``site`` terms of
    ``segment``: every figure from ``billing.cost_model`` (the site's PUE, tariff and grid
    intensity are ``Decimal`` already; the rollup sums are converted once each). Returns
    the capacity hours."""
    gpu = segment.gpu
    rate = gpu.rates[segment.phase]
    terms = gpu.terms
    kind = gpu.kind
    capacity_h, energy_kwh, idle_energy_kwh, fixed, energy, idle, co2e, profiled = cm.segment_costs(
        kind,
        rate,
        sums["observed_s"],
        offline_h,
        sums["air_s"],
        sums["energy_j"],
        sums["idle_energy_j"],
        site.pue,
        site.price_per_kwh,
        site.grid_g_per_kwh,
        sums["sm_hours"],
        sums["sm_hours_energy_j"],
    )
    acc.capacity_h += capacity_h
    if kind != cm.RENTED:
        acc.owned_capacity_h += capacity_h
    acc.offline_h += offline_h
    acc_sums = acc.sums
    for name in _SUM_FIELDS:
        acc_sums[name] += sums[name]
    acc.energy_kwh += energy_kwh
    acc.idle_energy_kwh += idle_energy_kwh
    acc.fixed_cost += fixed
    acc.energy_cost += energy
    acc.idle_cost += idle
    acc.co2e_kg += co2e
    if profiled is not None:
        acc.profiled_cost += profiled
    if terms is None or site.name is None:
        acc.priced = False
    if gpu.max_power_w is not None and gpu.idle_power_w is not None:
        capacity_f = float(capacity_h)
        acc.nominal_max_w_h += gpu.max_power_w * capacity_f
        acc.nominal_idle_w_h += gpu.idle_power_w * capacity_f
        acc.nominal_h += capacity_f
    return capacity_h


def _accumulated(
    segments: Iterable[_Segment],
    names: _NamesAndSiteTerms,
    classes: tuple[set[int], list[tuple[_SiteTerms, list[_Segment]]]] | None = None,
) -> _Acc:
    """The segments' hours and money, priced per price class (``_classes``): the segments
    whose GPUs share their kind, fixed rate, cost-profile presence, site terms and nominal
    power are summed first (their rollup sums and offline hours) and go through the cost
    model once. Every figure is linear in those sums, so this is the segment-by-segment
    accumulation up to the last digits of float and 28-digit Decimal sums taken in another
    order: equal to the cent (``test_price_classes_give_the_segment_by_segment_figures``).
    A page of 10,000 GPUs prices a few classes, not 20,000 segments. ``classes``: the
    segments' ``_classes``, where the caller has them."""
    gpu_ids, by_class = classes or _classes(segments, names)
    acc = _Acc(gpu_ids=set(gpu_ids))
    for site, members in by_class:
        _priced_into(acc, members[0], *_class_sums(members), site)
    return acc


def _classes(
    segments: Iterable[_Segment], names: _NamesAndSiteTerms
) -> tuple[set[int], list[tuple[_SiteTerms, list[_Segment]]]]:
    """The GPUs with capacity in ``segments``, and the segments by price class (in the order
    each class first comes), each with the site terms that price it.

    Segments of late data for a closed month (``adjusts``) are priced in their classes too
    (their sums may be negative: frozen figures negated); whether one GPU's has capacity is
    its own capacity's sign, a class's names its GPUs (none, negated)."""
    gpu_ids: set[int] = set()
    classes: dict[tuple[object, ...], tuple[_SiteTerms, list[_Segment]]] = {}
    site_of = names.site
    for segment in segments:
        gpu = segment.gpu
        if segment.gpu_ids is not None:  # a class's segment: its GPUs with capacity
            gpu_ids |= segment.gpu_ids
        elif segment.adjusts is not None:
            observed_h = cm.hours_from_seconds(seconds=segment.sums["observed_s"])
            if observed_h + segment.offline_h > 0:
                gpu_ids.add(gpu.id)
        elif segment.sums["observed_s"] > 0 or segment.offline_h > 0:  # both ≥ 0: capacity > 0
            gpu_ids.add(gpu.id)
        site = segment.site_terms or site_of(segment.site_id)
        key = (*gpu.price_class(segment.phase), site)
        found = classes.get(key)
        if found is None:
            classes[key] = (site, [segment])
        else:
            found[1].append(segment)
    return gpu_ids, list(classes.values())


def _class_sums(members: list[_Segment]) -> tuple[dict[str, float], Decimal]:
    """A price class's sums and offline hours: those of its one segment (a GPU's row, as a
    rule: the same figures as its members added up, without adding), else ``_merged``."""
    if len(members) == 1:
        return members[0].sums, members[0].offline_h
    return _merged(members)


def _merged(members: list[_Segment]) -> tuple[dict[str, float], Decimal]:
    """The sums and offline hours of ``members`` (of one price class) added in their order
    (each sum a left fold from the first member's): each member's sums added to the running
    ones all at once, in C (a team's 10,000 GPUs: ~10 ms, not a Python loop per field)."""
    first = members[0]
    values = _ALL_SUMS(first.sums)
    offline_h = first.offline_h
    for member in members[1:]:
        values = tuple(map(add, values, _ALL_SUMS(member.sums)))
        offline_h += member.offline_h
    return dict(zip(_SUM_FIELDS, values, strict=True)), offline_h


_ALL_SUMS = itemgetter(*_SUM_FIELDS)  # a sums dict's values, in ``_SUM_FIELDS`` order


def _hours(seconds: float) -> float:
    return float(cm.hours_from_seconds(seconds=seconds))


class _Lead:
    """The figures of a row that a list is ordered by (the fleet board's columns), each from
    ``billing.cost_model``: ``_cost_row`` takes them from here, so a row ordered by its lead
    shows the same numbers. Each ratio and hour figure is worked out when first asked for: a
    board of 10,000 GPUs orders them all by one column and shows a page of them."""

    def __init__(
        self,
        capacity_h: Decimal,
        offline_h: Decimal,
        idle_cost: Decimal,
        priced: bool,
        air_s: float,
        sm_active_s: float,
        sm_observed_s: float,
        throttle_any_s: float,
    ) -> None:
        self.capacity_h, self.offline_h = capacity_h, offline_h
        self.idle_cost, self.priced = idle_cost, priced
        self.air_s, self.sm_active_s = air_s, sm_active_s
        self.sm_observed_s, self.throttle_any_s = sm_observed_s, throttle_any_s

    @functools.cached_property
    def air_h(self) -> Decimal:
        return cm.hours_from_seconds(seconds=self.air_s)

    @functools.cached_property
    def utilization(self) -> float | None:
        return cm.utilization(air_hours=self.air_h, capacity_hours=self.capacity_h)

    @functools.cached_property
    def hours_in_air_per_day(self) -> float | None:
        return cm.hours_in_air_per_day(air_hours=self.air_h, capacity_hours=self.capacity_h)

    @functools.cached_property
    def work_utilization(self) -> float | None:
        return cm.activity_share(
            active_seconds=self.sm_active_s, measured_seconds=self.sm_observed_s
        )

    @functools.cached_property
    def throttled_hours(self) -> float:
        return _hours(self.throttle_any_s)

    @functools.cached_property
    def offline_hours(self) -> float:
        return float(self.offline_h)


def _lead(acc: _Acc) -> _Lead:
    s = acc.sums
    return _Lead(
        acc.capacity_h,
        acc.offline_h,
        acc.idle_cost,
        acc.priced,
        s["air_s"],
        s["sm_active_s"],
        s["sm_observed_s"],
        s["throttle_any_s"],
    )


def _lead_of(entry: _Group, names: _NamesAndSiteTerms, *, money: bool = True) -> _Lead:
    """``_lead(_accumulated(entry.segments, names))`` without the rest of the accumulation:
    the same price classes (kept on ``entry`` for its row), their sums added in the same
    order, the capacity and idle cost of each from the same formulas
    (``cost_model.segment_idle_cost``), so the same figures to the last digit. Every GPU of
    a 10,000-GPU board is ordered by these; only the rows drawn are accumulated whole.

    ``money`` False: each class's capacity alone (``cost_model.capacity_hours``, as
    ``segment_idle_cost`` takes it), no idle cost (0): a list ordered by utilisation."""
    if entry.classes is None:
        entry.classes = _classes(entry.segments, names)
    capacity_h = offline_h = idle = Decimal(0)
    air_s = sm_active_s = sm_observed_s = throttle_any_s = 0.0
    priced = True
    for site, members in entry.classes[1]:
        first = members[0]
        values, offline = _lead_sums(members)
        observed, air, idle_j, sm_active, sm_observed, throttle = values
        gpu = first.gpu
        if money:
            capacity, idle_cost = cm.segment_idle_cost(
                gpu.kind,
                gpu.rates[first.phase],
                observed,
                offline,
                air,
                idle_j,
                site.pue,
                site.price_per_kwh,
            )
            idle += idle_cost
        else:
            capacity = cm.capacity_hours(observed_s=observed, offline_hours=offline)
        capacity_h += capacity
        offline_h += offline
        air_s += air
        sm_active_s += sm_active
        sm_observed_s += sm_observed
        throttle_any_s += throttle
        if gpu.terms is None or site.name is None:  # as ``_priced_into`` tells
            priced = False
    return _Lead(
        capacity_h, offline_h, idle, priced, air_s, sm_active_s, sm_observed_s, throttle_any_s
    )


# The sums a row's lead needs (``_lead_of``), in ``_lead_sums``' order.
_LEAD_SUMS = itemgetter(
    "observed_s", "air_s", "idle_energy_j", "sm_active_s", "sm_observed_s", "throttle_any_s"
)


def _lead_sums(members: list[_Segment]) -> tuple[tuple[float, ...], Decimal]:
    """``_class_sums`` of the sums a lead needs alone (``_LEAD_SUMS``): the same left folds
    in the same order, the same floats."""
    first = members[0]
    values: tuple[float, ...] = _LEAD_SUMS(first.sums)
    offline_h = first.offline_h
    for member in members[1:]:
        values = tuple(map(add, values, _LEAD_SUMS(member.sums)))
        offline_h += member.offline_h
    return values, offline_h


def _cost_row(
    acc: _Acc,
    *,
    key: str,
    name: str,
    local_start: dt.datetime,
    local_end: dt.datetime,
    currency: str,
    closed: bool = False,
    adjustment_for: str | None = None,
    lead: _Lead | None = None,
) -> CostRow:
    s = acc.sums
    lead = lead or _lead(acc)
    air_h = lead.air_h
    observed_h = cm.hours_from_seconds(seconds=s["observed_s"])
    total = cm.total_cost(fixed_cost=acc.fixed_cost, energy_cost=acc.energy_cost)
    # Work figures only where some sample carried sm_active: None, never 0, otherwise.
    profiled_s = s["sm_observed_s"]
    work_h = cm.hours_from_seconds(seconds=s["sm_active_s"]) if profiled_s > 0 else None
    return CostRow(
        key=key,
        name=name,
        period_start=local_start,
        period_end=local_end,
        gpu_count=len(acc.gpu_ids),
        capacity_hours=float(acc.capacity_h),
        observed_hours=float(observed_h),
        air_hours=float(air_h),
        held_hours=_hours(s["held_s"]),
        parked_hours=_hours(s["parked_s"]),
        offline_hours=lead.offline_hours,
        utilization=lead.utilization,
        hours_in_air_per_day=lead.hours_in_air_per_day,
        energy_kwh=float(acc.energy_kwh),
        idle_energy_kwh=float(acc.idle_energy_kwh),
        energy_per_gpu_hour_kwh=cm.energy_per_gpu_hour_kwh(
            energy_kwh=acc.energy_kwh, observed_hours=observed_h
        ),
        kwh_per_air_hour=cm.kwh_per_air_hour(energy_kwh=acc.energy_kwh, air_hours=air_h),
        fixed_cost=acc.fixed_cost,
        energy_cost=acc.energy_cost,
        total_cost=total,
        idle_cost=acc.idle_cost,
        cost_per_air_hour=cm.cost_per_air_hour(total_cost=total, air_hours=air_h),
        co2e_kg=acc.co2e_kg,
        throttled_hours=lead.throttled_hours,
        throttled_power_cap_hours=_hours(s["throttle_power_cap_s"]),
        throttled_thermal_hours=_hours(s["throttle_thermal_s"]),
        throttled_hw_slowdown_hours=_hours(s["throttle_hw_slowdown_s"]),
        throttled_other_hours=_hours(s["throttle_other_s"]),
        profiled_hours=_hours(profiled_s),
        work_hours=float(work_h) if work_h is not None else None,
        busy_not_working_hours=(
            float(max(Decimal(0), cm.hours_from_seconds(seconds=s["sm_air_s"]) - work_h))
            if work_h is not None
            else None
        ),
        work_utilization=lead.work_utilization,
        tensor_hours=_hours(s["tensor_active_s"]) if s["tensor_observed_s"] > 0 else None,
        tensor_utilization=cm.activity_share(
            active_seconds=s["tensor_active_s"], measured_seconds=s["tensor_observed_s"]
        ),
        cost_per_work_hour=(
            cm.cost_per_work_hour(profiled_cost=acc.profiled_cost, work_hours=work_h)
            if work_h is not None
            else None
        ),
        priced=acc.priced,
        currency=currency,
        nominal_rate_per_hour=cm.mean_rate_per_hour(
            fixed_cost=acc.fixed_cost, capacity_hours=acc.capacity_h
        ),
        closed=closed,
        adjustment_for=adjustment_for,
    )


# A row's place in the order of the rows: its bucket's key (the local date it starts), its
# group's key, and the month it adjusts ("" for the bucket's own figures).
RowPlace = tuple[dt.date, str, str]


@dataclass
class _Group:
    """One row to be: a group's segments over one bucket, in the order they were computed
    (its money is their accumulation in that order). ``adjusts``: None for the bucket's own
    figures, "YYYY-MM" for the adjustment late data makes to that closed month (a row of its
    own)."""

    bucket: _Bucket
    key: str
    name: str
    adjusts: str | None
    segments: list[_Segment]
    acc: _Acc | None = None  # accumulated already (an adjustment, to see whether it is a row)
    # Its segments' ``_classes``, where worked out already (for its lead).
    classes: tuple[set[int], list[tuple[_SiteTerms, list[_Segment]]]] | None = None

    def place(self) -> RowPlace:
        """Where its row stands in the rows' order: by period (its bucket's key orders the
        buckets as their starts do), key, then the adjustments after the regular row."""
        return self.bucket.key, self.key, self.adjusts or ""


def _groups(computation: _Computation, group_by: str) -> list[_Group]:
    """The rows of a computation, unpriced and in order: per bucket, group and adjusted
    month. An adjustment is accumulated here (it is a row only where it is not negligible);
    every other group is priced only when its row is made (``_row``), so a page prices only
    the rows it shows."""
    names = computation.names
    return _kept(_grouped(computation.segments, names, group_by).values(), names)


# A group's bucket (by its key: a computation's buckets have one each), key and adjusted month.
_GroupKey = tuple[dt.date, str, str | None]


def _grouped(
    segments: list[_Segment], names: _NamesAndSiteTerms, group_by: str
) -> dict[_GroupKey, _Group]:
    """Every group of the segments, negligible adjustments too, in the order their first
    segments come."""
    groups: dict[_GroupKey, _Group] = {}
    by_gpu = group_by == "gpu"
    for segment in segments:
        if by_gpu:  # (``_group_of``'s, without the call: 10,000s of segments a page)
            key, name = segment.gpu.uuid, segment.gpu.label
        else:
            key, name = _group_of(segment.gpu, segment, group_by, names)
        adjusts = f"{segment.adjusts:%Y-%m}" if segment.adjusts is not None else None
        place = (segment.bucket.key, key, adjusts)
        found = groups.get(place)
        if found is None:
            found = groups[place] = _Group(segment.bucket, key, name, adjusts, [])
        found.segments.append(segment)
    return groups


def _kept(groups: Iterable[_Group], names: _NamesAndSiteTerms) -> list[_Group]:
    """The groups that are rows (an adjustment only where it is not negligible: accumulated
    here to tell), in the rows' order."""
    kept = []
    for entry in groups:
        if entry.adjusts is not None:
            entry.acc = entry.acc or _accumulated(entry.segments, names)
            if adjustment_negligible(entry.acc):
                continue
        kept.append(entry)
    kept.sort(key=_Group.place)
    return kept


# --- public ---------------------------------------------------------------------------------
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
    number of queries does not grow with the number of GPUs. Raises ValueError naming a bad
    argument.
    """
    _validate(start=start, end=end, period=period, group_by=group_by)
    computation = _compute(
        start=start,
        end=end,
        period=period,
        filters=filters or Filters(),
        now=now,
        by_class=_by_class((group_by,)),
    )
    return _rows(computation, group_by)


def cost_rows_by(
    *,
    start: dt.date,
    end: dt.date,
    group_bys: tuple[str, ...],
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> dict[str, list[CostRow]]:
    """``cost_rows`` for several groupings of the same period and filters, from one
    computation (a page that shows GPUs and models, or teams and pools, reads the rollups
    once): ``{group_by: rows}``, each list as ``cost_rows`` returns it."""
    computation = _grouped_compute(start, end, group_bys, period, filters, now)
    return {group_by: _rows(computation, group_by) for group_by in group_bys}


def _grouped_compute(
    start: dt.date,
    end: dt.date,
    group_bys: tuple[str, ...],
    period: str,
    filters: Filters | None,
    now: dt.datetime | None,
) -> _Computation:
    """The one computation several groupings of the same rows are made from, the arguments
    checked first."""
    for group_by in group_bys:
        _validate(start=start, end=end, period=period, group_by=group_by)
    return _compute(
        start=start,
        end=end,
        period=period,
        filters=filters or Filters(),
        now=now,
        by_class=_by_class(group_bys),
    )


def _by_class(group_bys: Iterable[str]) -> bool:
    """Whether rows grouped so can come from a computation by price class (no row per GPU
    or node: ``sums._compute``)."""
    return not {"gpu", "node"} & set(group_bys)


def cost_rows_in_parts(
    *,
    start: dt.date,
    end: dt.date,
    parts: Iterable[tuple[dt.date, dt.date]],
    group_by: str = "gpu",
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> Iterator[CostRow]:
    """``cost_rows`` of each part of [start, end) in turn (``parts``: consecutive sub-ranges
    whose edges are bucket edges, so the rows are those of the whole), one part's rows in
    memory at a time. What every part reads before the rollups (settings, names, GPUs, their
    cost terms and rates) is read once for the whole range, with one ``now``: a year of
    months reads the fleet once, not twelve times."""
    for computation, groups in _parts(start, end, parts, group_by, period, filters, now):
        spans = computation.pooled
        yield from (_row(entry, computation, spans) for entry in groups)


def cost_rows_counted(
    *,
    start: dt.date,
    end: dt.date,
    parts: Iterable[tuple[dt.date, dt.date]],
    offset: int,
    limit: int,
    group_by: str = "gpu",
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> tuple[int, list[CostRow]]:
    """How many rows ``cost_rows_in_parts`` gives, and its rows [offset, offset + limit).

    Where the rows of each bucket can be counted without computing them
    (``counting.bucket_counts``), only the buckets the page's rows lie in are computed: a
    page of a quarter of daily GPU rows costs what its days cost. Otherwise every part is
    computed and its rows counted; either way only the rows returned are priced."""
    _validate(start=start, end=end, period=period, group_by=group_by)
    filters = filters or Filters()
    parts = list(parts)
    loaded = _load(start=start, end=end, filters=filters, now=now)

    index = {b.key: i for i, b in enumerate(_buckets(start, end, period, loaded.zone))}

    def computed(sub: Filters) -> set[tuple[int, str]]:
        gpus = {g.id: g for g in loaded.gpus.values() if g.uuid in sub.gpus}
        only = dataclasses.replace(loaded, gpus=gpus)
        return {
            (index[entry.bucket.key], entry.key)
            for _, groups in _parts(start, end, parts, group_by, period, sub, loaded=only)
            for entry in groups
            if entry.adjusts is None
        }

    def adjustments() -> list[int]:
        found = []
        for part_start, part_end in parts:
            segments = booked_segments(
                start=part_start,
                end=part_end,
                period=period,
                filters=filters,
                loaded=loaded,
                by_class=_by_class((group_by,)),
            )
            groups = _grouped(segments, loaded.names, group_by)
            found += [index[entry.bucket.key] for entry in _kept(groups.values(), loaded.names)]
        return found

    counted = bucket_counts(
        loaded=loaded,
        start=start,
        end=end,
        parts=parts,
        period=period,
        filters=filters,
        group_by=group_by,
        group_key=lambda gpu, names: _group_of(gpu, gpu, group_by, names)[0],
        computed=computed,
        adjustments=adjustments,
    )
    if counted is not None:
        page = _counted_page(
            counted, loaded, start, end, parts, offset, limit, group_by, period, filters
        )
        if page is not None:
            return sum(counted.counts), page
    count, page = 0, []
    for computation, groups in _parts(start, end, parts, group_by, period, filters, loaded=loaded):
        spans = computation.pooled
        for entry in groups[max(0, offset - count) : max(0, offset + limit - count)]:
            page.append(_row(entry, computation, spans))
        count += len(groups)
    return count, page


def _counted_page(
    counted: BucketCounts,
    loaded: _Loaded,
    start: dt.date,
    end: dt.date,
    parts: list[tuple[dt.date, dt.date]],
    offset: int,
    limit: int,
    group_by: str,
    period: str,
    filters: Filters,
) -> list[CostRow] | None:
    """Rows [offset, offset + limit) of a query whose rows per bucket are counted: the buckets
    they lie in computed, part by part as ``_parts`` computes them. None (and a warning)
    where those buckets hold another number of rows than counted: a fault of the count, so
    the caller computes every row instead."""
    buckets, counts = counted.buckets, counted.counts
    before, first = 0, 0
    while first < len(buckets) and before + counts[first] <= offset:
        before += counts[first]
        first += 1
    last, upto = first, before
    while last < len(buckets) and upto < offset + limit:
        upto += counts[last]
        last += 1
    found: list[tuple[_Group, _Computation]] = []
    for part_start, part_end in parts:
        inside = [
            i for i in range(first, last) if part_start <= max(start, buckets[i].key) < part_end
        ]
        if not inside:
            continue
        following = inside[-1] + 1
        computation = _compute(
            start=max(part_start, buckets[inside[0]].key),
            end=min(part_end, buckets[following].key) if following < len(buckets) else end,
            period=period,
            filters=filters,
            now=loaded.now,
            loaded=_loaded_within(loaded, start=part_start, end=part_end),
            by_class=_by_class((group_by,)),
        )
        found += [(entry, computation) for entry in _groups(computation, group_by)]
    if len(found) != upto - before:
        logger.warning(
            "costs count: %d rows counted in %s..%s, %d computed; computing every row",
            upto - before,
            buckets[first].key if first < len(buckets) else end,
            buckets[last - 1].key if last > first else end,
            len(found),
        )
        return None
    page = found[offset - before : offset - before + limit]
    spans = {id(comp): comp.pooled for _, comp in page}
    return [_row(entry, comp, spans[id(comp)]) for entry, comp in page]


def cost_rows_after(
    *,
    start: dt.date,
    end: dt.date,
    after: RowPlace | None,
    limit: int,
    group_by: str = "gpu",
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> tuple[list[CostRow], RowPlace | None]:
    """The first ``limit`` rows of ``cost_rows`` after the place ``after`` (None: from the
    first), and the place of the last of them where more rows follow (else None).

    Computes only the buckets it needs, from the first one at or after ``after``: first as
    many as the page would need if every bucket held as many rows as it can (a row per GPU,
    team, … there is: ``_rows_per_bucket_at_most``), then as many as the rows seen so far
    say will fill it (at least twice as many each time); prices only the rows it returns. A
    page of a year of daily GPU rows costs one day's computation, not the year's; a page of
    a quarter of monthly team rows one computation, not two."""
    _validate(start=start, end=end, period=period, group_by=group_by)
    filters = filters or Filters()
    loaded = _load(start=start, end=end, filters=filters, now=now)
    buckets = _buckets(start, end, period, loaded.zone)
    first = 0
    if after is not None:
        while first < len(buckets) and buckets[first].key < after[0]:
            first += 1
    found: list[tuple[_Group, _Computation]] = []
    size = max(1, math.ceil((limit + 1) / _rows_per_bucket_at_most(loaded, group_by)))
    while first < len(buckets) and len(found) <= limit:
        last = min(first + size, len(buckets))
        part_start = max(start, buckets[first].key)
        part_end = buckets[last].key if last < len(buckets) else end
        computation = _part(loaded, part_start, part_end, period, filters, group_by)
        groups = _groups(computation, group_by)
        found += [
            (entry, computation) for entry in groups if after is None or entry.place() > after
        ]
        per_bucket = len(groups) / (last - first)
        wanted = math.ceil((limit + 1 - len(found)) / per_bucket) if per_bucket else 0
        size = max(2 * size, wanted)
        first = last
    rows = [_row(entry, comp, comp.pooled) for entry, comp in found[:limit]]
    if len(found) <= limit:
        return rows, None
    return rows, found[limit - 1][0].place()


def _rows_per_bucket_at_most(loaded: _Loaded, group_by: str) -> int:
    """How many rows one bucket can hold (one per group), as far as the loaded fleet tells:
    a bound that sizes a cursor page's first computation, never its rows. Late data for a
    closed month adds rows of its own, and rows keep the node a GPU had then, so a bucket
    may hold more; the page then computes further buckets as it would have."""
    names = loaded.names
    if group_by == "fleet":
        return 1
    if group_by == "team":
        return len(names.teams) + 1  # each team and the unassigned row
    if group_by == "pool":
        return len(names.pools) + 1
    if group_by == "site":
        return len(names.sites) + 1
    if group_by == "model":
        return max(1, len({gpu.model_key for gpu in loaded.gpus.values()}))
    return max(1, len(loaded.gpus))  # gpu; node: at most a row per GPU as a rule


def _parts(
    start: dt.date,
    end: dt.date,
    parts: Iterable[tuple[dt.date, dt.date]],
    group_by: str,
    period: str,
    filters: Filters | None,
    now: dt.datetime | None = None,
    loaded: _Loaded | None = None,
) -> Iterator[tuple[_Computation, list[_Group]]]:
    """Each part's computation and its rows unpriced, the fleet read once for all (or given:
    ``loaded``)."""
    _validate(start=start, end=end, period=period, group_by=group_by)
    filters = filters or Filters()
    loaded = loaded or _load(start=start, end=end, filters=filters, now=now)
    for part_start, part_end in parts:
        computation = _part(loaded, part_start, part_end, period, filters, group_by)
        yield computation, _groups(computation, group_by)


def _part(
    loaded: _Loaded,
    start: dt.date,
    end: dt.date,
    period: str,
    filters: Filters,
    group_by: str,
) -> _Computation:
    """The computation of [start, end), a part of the range ``loaded`` was read for, for
    rows grouped by ``group_by``."""
    return _compute(
        start=start,
        end=end,
        period=period,
        filters=filters,
        now=loaded.now,
        loaded=_loaded_within(loaded, start=start, end=end),
        by_class=_by_class((group_by,)),
    )


def _rows(computation: _Computation, group_by: str) -> list[CostRow]:
    assert not computation.pooled or group_by == "fleet", "pooled segments are a class of GPUs"
    spans = computation.pooled  # none outside the overview's trend
    return [_row(entry, computation, spans) for entry in _groups(computation, group_by)]


def _row(
    entry: _Group,
    computation: _Computation,
    spans: dict[tuple[dt.date, dt.date], set[int]],
    acc: _Acc | None = None,
    lead: _Lead | None = None,
) -> CostRow:
    """A group's row: its segments accumulated through the cost model (and the GPUs that
    pooled segments of its bucket stand for); ``acc`` and ``lead``: those of
    ``_row_acc`` and ``_lead`` where a deferred row made them already."""
    acc = acc or _row_acc(entry, computation, spans)
    return _cost_row(
        acc,
        key=entry.key,
        name=entry.name,
        local_start=entry.bucket.local_start,
        local_end=entry.bucket.local_end,
        currency=computation.currency,
        closed=entry.adjusts is None and entry.bucket.key in computation.closed_buckets,
        adjustment_for=entry.adjusts,
        lead=lead,
    )


def _row_acc(
    entry: _Group,
    computation: _Computation,
    spans: dict[tuple[dt.date, dt.date], set[int]],
) -> _Acc:
    acc = entry.acc = entry.acc or _accumulated(entry.segments, computation.names, entry.classes)
    for (first, last), ids in spans.items():
        if first <= entry.bucket.key < last:
            acc.gpu_ids |= ids
    return acc


@dataclass
class DeferredRow:
    """A group's cost row before it is made: the figures a list is ordered by (the fleet
    board's columns, the same values as the row's: its ``_Lead``'s), and ``row()``,
    which makes the whole ``CostRow`` on demand. A page of 10,000 GPUs orders them all and
    makes the rows it shows. ``last_seen_at``: the GPU's, for ``group_by="gpu"`` (else
    None)."""

    key: str
    name: str
    last_seen_at: dt.datetime | None
    lead: _Lead = dataclasses.field(repr=False, compare=False)
    make: Callable[[], CostRow] = dataclasses.field(repr=False, compare=False)

    def row(self) -> CostRow:
        return self.make()

    @property
    def utilization(self) -> float | None:
        return self.lead.utilization

    @property
    def work_utilization(self) -> float | None:
        return self.lead.work_utilization

    @property
    def hours_in_air_per_day(self) -> float | None:
        return self.lead.hours_in_air_per_day

    @property
    def idle_cost(self) -> Decimal:
        return self.lead.idle_cost

    @property
    def offline_hours(self) -> float:
        return self.lead.offline_hours

    @property
    def throttled_hours(self) -> float:
        return self.lead.throttled_hours

    @property
    def priced(self) -> bool:
        return self.lead.priced


def cost_rows_deferred_by(
    *,
    start: dt.date,
    end: dt.date,
    group_bys: tuple[str, ...],
    period: str = "all",
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> dict[str, list[DeferredRow]]:
    """``cost_rows_by`` with every row deferred: the same groups in the same order, each
    row's ordering figures computed (``_lead_of``: not its whole accumulation), the rest of
    the row made by ``row()`` (``[d.row() for d in rows]`` is ``cost_rows_by``'s list)."""
    computation = _grouped_compute(start, end, group_bys, period, filters, now)
    spans = computation.pooled
    names = computation.names
    out: dict[str, list[DeferredRow]] = {}
    for group_by in group_bys:
        rows = out[group_by] = []
        for entry in _groups(computation, group_by):
            # An adjustment is accumulated already (to tell whether it is a row).
            lead = _lead(entry.acc) if entry.acc else _lead_of(entry, names)
            rows.append(
                DeferredRow(
                    entry.key,
                    entry.name,
                    entry.segments[0].gpu.last_seen_at if group_by == "gpu" else None,
                    lead,
                    functools.partial(_row, entry, computation, spans, None, lead),
                )
            )
    return out


def gpu_utilizations(
    *,
    start: dt.date,
    end: dt.date,
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[tuple[str, str, float | None]]:
    """Each GPU's key, name and utilisation over [start, end): its row's (period "all", the
    fleet board's figure to the last digit), without the money or the rest of the row, in
    the rows' order: what a list ordered by utilisation needs (the heatmap by utilisation).
    One per GPU: its own row's, or where it has none, its first adjustment's (the month
    its late data corrects)."""
    computation = _grouped_compute(start, end, ("gpu",), "all", filters, now)
    names = computation.names
    seen: set[str] = set()
    out = []
    for entry in _groups(computation, "gpu"):
        if entry.key not in seen:
            seen.add(entry.key)
            lead = _lead(entry.acc) if entry.acc else _lead_of(entry, names, money=False)
            out.append((entry.key, entry.name, lead.utilization))
    return out


def fleet_trend(
    *,
    start: dt.date,
    end: dt.date,
    filters: Filters | None = None,
    now: dt.datetime | None = None,
) -> list[CostRow]:
    """The fleet's rows per day over [start, end): ``cost_rows(group_by="fleet",
    period="day")`` by a faster path for the overview's trend charts. The GPUs in service
    over the whole window at one rate are summed per rate class and day in SQL (so the cost
    model runs per class, not per GPU-day); the rest per GPU. Same figures up to the last
    digits of float and 28-digit Decimal sums taken in another order."""
    _validate(start=start, end=end, period="day")
    computation = _compute(
        start=start,
        end=end,
        period="day",
        filters=filters or Filters(),
        now=now,
        pooled=True,
        by_class=True,
    )
    return _rows(computation, "fleet")


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
    """The fleet row over [start, end), recoverable GPUs and money, GPUs in service now."""
    _validate(start=start, end=end, period="all")
    filters = filters or Filters()
    computation = _compute(
        start=start, end=end, period="all", filters=filters, now=now, by_class=True
    )
    return _summary(computation, filters)


def fleet_overview(
    *, start: dt.date, end: dt.date, filters: Filters | None = None, now: dt.datetime | None = None
) -> tuple[FleetSummary, list[CostRow]]:
    """``(fleet_summary(...), fleet_trend(...))`` for the overview page, with the settings,
    GPUs and cost terms loaded once for both (and one ``now``): the same figures as the two
    calls. The summary is the trend's days taken together where each GPU's offline hours
    over the days add up to those over the whole window (no GPU observed more than its
    capacity on a day: the rule), so the rollups are read once; else it is computed apart.
    Every figure is linear in the segments' sums and offline hours, so that is the summary
    up to the last digits of float and 28-digit Decimal sums taken in another order."""
    _validate(start=start, end=end, period="all")
    filters = filters or Filters()
    loaded = _load(start=start, end=end, filters=filters, now=now)
    compute = functools.partial(
        _compute, start=start, end=end, filters=filters, now=now, loaded=loaded, by_class=True
    )
    trend = compute(period="day", pooled=True)
    whole = trend if trend.offline_additive else compute(period="all")
    return _summary(whole, filters), _rows(trend, "fleet")


def _summary(computation: _Computation, filters: Filters) -> FleetSummary:
    """The fleet's row (from a computation by price class, or per GPU, of the whole window
    or of its days taken together) and its GPUs now."""
    acc = _accumulated(computation.segments, computation.names)
    acc.gpu_ids.update(*computation.pooled.values())  # pooled segments name no GPU
    row = _cost_row(
        acc,
        key="fleet",
        name="Fleet",
        local_start=computation.local_start,
        local_end=computation.local_end,
        currency=computation.currency,
    )
    recoverable = cm.recoverable_gpus(
        capacity_hours=acc.capacity_h,
        air_hours=cm.hours_from_seconds(seconds=acc.sums["air_s"]),
        period_hours=computation.window_hours,
        target_utilization=computation.target_utilization,
    )
    in_service = offline = 0
    current = computation.now
    for info in computation.gpus.values():
        if not _kept_now(info, filters, computation.names):
            continue
        if info.service_start is None or info.service_start > current:
            continue
        if info.retired_at is not None and info.retired_at <= current:
            continue
        in_service += 1
        if offline_now(info.last_seen_at, current):
            offline += 1
    return FleetSummary(
        row=row,
        target_utilization=computation.target_utilization,
        recoverable_gpus=recoverable,
        recoverable_money_per_year=cm.recoverable_money_per_year(
            recoverable_gpus=recoverable, mean_fixed_rate_per_hour=row.nominal_rate_per_hour
        ),
        gpus_in_service=in_service,
        gpus_offline_now=offline,
    )
