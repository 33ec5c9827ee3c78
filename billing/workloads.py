"""Workload figures: who held the GPUs, their hours and their money (docs/metrics.md,
"Workloads").

One read of the hourly workload rollups (``telemetry.WorkloadHourlyUsage``) summed in SQL per
workload, GPU, attribution (team, site) and, where a GPU's rate changes inside the period (its
depreciation ends), per hour; then the money of each of those parts through
``billing.cost_model`` at the GPU's fixed rate, and the parts summed per group. A group's
figures are the sums of its parts; its ratios are ratios of those sums.

``workload_figures`` is the one entry point: the Workloads page, its detail page, the GPU
page, the overview, the finance API and the alerts call it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import Case, DateTimeField, F, FloatField, Sum, Value, When
from django.utils import timezone

from billing import cost_model as cm
from billing.models import CostProfile, WorkloadTeamRule
from fleet.models import FleetSettings, Gpu, Site, Team
from telemetry.models import Workload, WorkloadHourlyUsage

GROUP_BY = ("workload", "user", "account", "team")
# Beyond the API's groupings, the pages break one workload (or one GPU) down further.
PAGE_GROUP_BY = (*GROUP_BY, "gpu", "day")
UNASSIGNED = "(none)"


# --- rules of [[workload_teams]] ------------------------------------------------------------
@dataclass(frozen=True)
class TeamRule:
    """``match_field:pattern`` → team; a pattern ending in ``*`` matches by prefix."""

    match_field: str
    pattern: str
    team_id: int

    def matches(self, *, kind: str, key: str, user: str, account: str) -> bool:
        value = {"account": account, "user": user, "kind": kind, "id": key}[self.match_field]
        if self.pattern.endswith("*"):
            return value.startswith(self.pattern[:-1])
        return value == self.pattern


def team_rule_match(
    rules: Sequence[TeamRule], *, kind: str, key: str, user: str, account: str
) -> int | None:
    """The team of the first rule (in file order) that matches the workload; ``None``: none
    does, and the workload stays with its GPU's pool's team in each hour."""
    for rule in rules:
        if rule.matches(kind=kind, key=key, user=user, account=account):
            return rule.team_id
    return None


def team_rules_load() -> list[TeamRule]:
    return [
        TeamRule(match_field=r.match_field, pattern=r.pattern, team_id=r.team_id)
        for r in WorkloadTeamRule.objects.order_by("position")
    ]


# --- what callers ask and get ---------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadFilters:
    """Restrictions, each a set of allowed values (empty: no restriction). ``teams``,
    ``sites`` and ``pools`` are names (the site and pool of the GPU in each hour, as its cost
    rows attribute them; the team after ``[[workload_teams]]``); ``models`` GPU model keys;
    ``gpus`` UUIDs; ``workloads`` primary keys."""

    kinds: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    workloads: tuple[int, ...] = ()


@dataclass
class WorkloadRow:
    """One group's figures over the period. Text fields that differ within a group are
    ``None`` (a user's row has no single account when they ran under two)."""

    key: str
    kind: str | None
    name: str | None
    user: str | None
    account: str | None
    team: str | None
    site: str | None
    gpus: int  # distinct GPUs
    workloads: int  # distinct workloads
    workload_pk: int | None  # the workload of a one-workload row (its detail page)
    first_seen: dt.datetime | None
    last_seen: dt.datetime | None
    gpu_hours: float
    air_hours: float
    held_hours: float
    utilization: float | None
    energy_kwh: float
    cost: Decimal
    idle_cost: Decimal
    currency: str
    priced: bool  # False when a GPU it held has no cost profile or no site
    day: dt.date | None = None  # group_by "day"
    gpu_uuid: str | None = None  # group_by "gpu"
    gpu_label: str | None = None


# --- pricing --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Pricing:
    terms: cm.CostTerms | None
    service_start: dt.datetime | None
    uuid: str
    label: str

    def depreciation_ends(self) -> dt.datetime | None:
        if self.terms is None or not self.terms.owned or self.service_start is None:
            return None
        return cm.depreciation_end(
            service_start=self.service_start, depreciation_years=self.terms.depreciation_years
        )


def _pricing_load(gpu_ids: Iterable[int] | None = None) -> dict[int, _Pricing]:
    """Each GPU's cost terms by the same resolution as its cost rows (gpu > node > pool >
    site profile, ``billing.cost_model.cost_profile_resolve``), and its service start."""
    profiles = {(p.scope_kind, p.scope_name): p for p in CostProfile.objects.all()}
    qs = Gpu.objects.all()
    if gpu_ids is not None:
        qs = qs.filter(pk__in=list(gpu_ids))
    out: dict[int, _Pricing] = {}
    for pk, uuid, index, in_service, first_seen, host, pool, pool_site, node_site in qs.values_list(
        "pk",
        "uuid",
        "index",
        "in_service_at",
        "first_seen_at",
        "node__hostname",
        "node__pool__name",
        "node__pool__site__name",
        "node__site__name",
    ):
        profile = cm.cost_profile_resolve(
            profiles=profiles,
            gpu_uuid=uuid,
            hostname=host,
            pool_name=pool,
            site_name=node_site or pool_site,
        )
        out[pk] = _Pricing(
            terms=profile.cost_terms() if profile is not None else None,
            service_start=in_service or first_seen,
            uuid=uuid,
            label=f"{host}#{index}" if index is not None else str(host),
        )
    return out


@dataclass(frozen=True)
class _SiteTerms:
    name: str
    pue: Decimal
    price_per_kwh: Decimal


# --- parts: one SQL aggregate ---------------------------------------------------------------
@dataclass
class _Part:
    workload_id: int
    gpu_id: int
    team_id: int | None
    site_id: int | None
    hour: dt.datetime | None  # set where the GPU's rate changes in the period, or per day
    gpu_s: float
    air_s: float
    energy_j: float
    idle_energy_j: float


def _parts(
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    filters: WorkloadFilters,
    split_gpu_ids: list[int],
    per_hour: bool,
) -> list[_Part]:
    """Σ of the hourly workload rows in the window per (workload, GPU, team, site[, hour]).

    The held part of the energy is summed per hourly row (energy × held / GPU seconds), as
    idle cost is that hour's cost × its held share. Hours are kept apart only for GPUs whose
    fixed rate changes within the window (``split_gpu_ids``), or for all (``per_hour``)."""
    qs = WorkloadHourlyUsage.objects.filter(hour__gte=window_start, hour__lt=window_end)
    for lookup, allowed in (
        ("workload_id__in", filters.workloads),
        ("workload__kind__in", filters.kinds),
        ("workload__user_name__in", filters.users),
        ("workload__account__in", filters.accounts),
        ("site__name__in", filters.sites),
        ("pool__name__in", filters.pools),
        ("gpu__model__key__in", filters.models),
        ("gpu__uuid__in", filters.gpus),
    ):
        if allowed:
            qs = qs.filter(**{lookup: allowed})
    hour: Any
    if per_hour:
        hour = F("hour")
    elif split_gpu_ids:
        hour = Case(
            When(gpu_id__in=split_gpu_ids, then=F("hour")),
            default=Value(None),
            output_field=DateTimeField(),
        )
    else:
        hour = Value(None, output_field=DateTimeField())
    held_energy = Case(
        When(gpu_s__gt=0, then=F("energy_j") * (F("gpu_s") - F("air_s")) / F("gpu_s")),
        default=Value(0.0),
        output_field=FloatField(),
    )
    rows = (
        qs.annotate(part_hour=hour)
        .values("workload_id", "gpu_id", "team_id", "site_id", "part_hour")
        .annotate(
            sum_gpu_s=Sum("gpu_s"),
            sum_air_s=Sum("air_s"),
            sum_energy_j=Sum("energy_j"),
            sum_idle_energy_j=Sum(held_energy),
        )
        .values_list(
            "workload_id",
            "gpu_id",
            "team_id",
            "site_id",
            "part_hour",
            "sum_gpu_s",
            "sum_air_s",
            "sum_energy_j",
            "sum_idle_energy_j",
        )
    )
    return [
        _Part(w, g, t, s, h, float(gs or 0), float(a or 0), float(e or 0), float(ie or 0))
        for w, g, t, s, h, gs, a, e, ie in rows
    ]


# --- groups ---------------------------------------------------------------------------------
@dataclass
class _Acc:
    workload_ids: set[int] = field(default_factory=set)
    gpu_ids: set[int] = field(default_factory=set)
    texts: dict[str, set[str]] = field(default_factory=dict)
    gpu_s: float = 0.0
    air_s: float = 0.0
    energy_j: float = 0.0
    cost: Decimal = Decimal(0)
    idle_cost: Decimal = Decimal(0)
    priced: bool = True
    first_seen: dt.datetime | None = None
    last_seen: dt.datetime | None = None

    def text(self, name: str, value: str) -> None:
        self.texts.setdefault(name, set()).add(value)

    def one(self, name: str) -> str | None:
        values = self.texts.get(name, set())
        return next(iter(values)) if len(values) == 1 else None


@dataclass(frozen=True)
class _WorkloadInfo:
    kind: str
    key: str
    user: str
    account: str
    name: str
    site_id: int | None
    first_seen: dt.datetime | None
    last_seen: dt.datetime | None
    rule_team_id: int | None


def _window(start: dt.date, end: dt.date, zone: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    def midnight(day: dt.date) -> dt.datetime:
        return dt.datetime.combine(day, dt.time(), tzinfo=zone).astimezone(dt.UTC)

    return midnight(start), midnight(end)


def workload_figures(
    *,
    start: dt.date,
    end: dt.date,
    group_by: str = "workload",
    filters: WorkloadFilters | None = None,
    now: dt.datetime | None = None,
) -> list[WorkloadRow]:
    """One row per group (``GROUP_BY``, or the pages' ``gpu`` and ``day``) over the local days
    [start, end) of the report time zone, worst idle cost first (then GPU hours, then key).

    GPU hours = Σ share_s / 3600, air hours = Σ air_s / 3600, held = GPU − air hours,
    utilisation = air / GPU hours, energy = Σ the samples' energy × share_s / seconds; cost =
    GPU hours × the GPU's fixed rate in those hours + energy × PUE × price (owned GPUs); idle
    cost = Σ over hourly rows of that hour's cost × held / GPU hours. Team: the first
    ``[[workload_teams]]`` rule that matches, else the team of the GPU's pool in that hour.
    """
    if end <= start:
        raise ValueError("end: must be after start")
    if group_by not in PAGE_GROUP_BY:
        raise ValueError(f"group_by: must be one of {', '.join(GROUP_BY)}")
    filters = filters or WorkloadFilters()
    now = now or timezone.now()
    fleet_settings = FleetSettings.load()
    zone = fleet_settings.report_zone
    window_start, window_end = _window(start, end, zone)
    pricing = _pricing_load()
    # A GPU whose depreciation ends inside the window changes rate there: its hours apart.
    split = []
    for gpu_id, p in pricing.items():
        ends = p.depreciation_ends()
        if ends is not None and window_start < ends < window_end:
            split.append(gpu_id)
    parts = _parts(
        window_start=window_start,
        window_end=window_end,
        filters=filters,
        split_gpu_ids=split,
        per_hour=group_by == "day",
    )
    if not parts:
        return []
    rules = team_rules_load()
    teams = dict(Team.objects.values_list("id", "name"))
    sites = {
        s.pk: _SiteTerms(name=s.name, pue=s.pue, price_per_kwh=s.price_per_kwh)
        for s in Site.objects.all()
    }
    workloads: dict[int, _WorkloadInfo] = {}
    for pk, kind, key, user, account, name, site_id, first, last in Workload.objects.filter(
        pk__in={p.workload_id for p in parts}
    ).values_list(
        "pk",
        "kind",
        "key",
        "user_name",
        "account",
        "name",
        "site_id",
        "first_seen_at",
        "last_seen_at",
    ):
        workloads[pk] = _WorkloadInfo(
            kind=kind,
            key=key,
            user=user,
            account=account,
            name=name,
            site_id=site_id,
            first_seen=first,
            last_seen=last,
            rule_team_id=team_rule_match(rules, kind=kind, key=key, user=user, account=account),
        )
    rates: dict[tuple[int, dt.datetime | None], Decimal] = {}
    groups: dict[Any, _Acc] = {}
    for part in parts:
        info = workloads.get(part.workload_id)
        if info is None:  # a rollup row of a workload since removed by hand
            continue
        team_id = info.rule_team_id if info.rule_team_id is not None else part.team_id
        team = teams.get(team_id, UNASSIGNED) if team_id is not None else UNASSIGNED
        if filters.teams and team not in filters.teams:
            continue
        price = pricing.get(part.gpu_id)
        terms = price.terms if price is not None else None
        rate_key = (part.gpu_id, part.hour)
        rate = rates.get(rate_key)
        if rate is None:
            lo, hi = (
                (part.hour, part.hour + cm.ONE_HOUR)
                if part.hour is not None
                else (window_start, window_end)
            )
            rate = cm.mean_fixed_rate_per_hour(
                terms=terms,
                service_start=price.service_start if price is not None else None,
                start=lo,
                end=hi,
            )
            rates[rate_key] = rate
        site = sites.get(part.site_id) if part.site_id is not None else None
        pue = site.pue if site is not None else Decimal(1)
        price_per_kwh = site.price_per_kwh if site is not None else Decimal(0)
        paid_as = terms.kind if terms is not None else None
        gpu_h = cm.hours_from_seconds(seconds=part.gpu_s)
        held_h = gpu_h - cm.hours_from_seconds(seconds=part.air_s)
        cost = cm.workload_cost(
            kind=paid_as,
            fixed_rate_per_hour=rate,
            gpu_hours=gpu_h,
            energy_kwh=cm.kwh_from_joules(energy_j=part.energy_j),
            pue=pue,
            price_per_kwh=price_per_kwh,
        )
        idle = cm.workload_cost(
            kind=paid_as,
            fixed_rate_per_hour=rate,
            gpu_hours=held_h,
            energy_kwh=cm.kwh_from_joules(energy_j=part.idle_energy_j),
            pue=pue,
            price_per_kwh=price_per_kwh,
        )
        key = _group_key(group_by, part, info, team, price, zone)
        acc = groups.setdefault(key, _Acc())
        acc.workload_ids.add(part.workload_id)
        acc.gpu_ids.add(part.gpu_id)
        acc.text("kind", info.kind)
        acc.text("name", info.name)
        acc.text("user", info.user)
        acc.text("account", info.account)
        acc.text("team", team)
        acc.text("site", sites[info.site_id].name if info.site_id in sites else "")
        acc.gpu_s += part.gpu_s
        acc.air_s += part.air_s
        acc.energy_j += part.energy_j
        acc.cost += cost
        acc.idle_cost += idle
        acc.priced = acc.priced and terms is not None and site is not None
        if info.first_seen is not None:
            acc.first_seen = min(acc.first_seen or info.first_seen, info.first_seen)
        if info.last_seen is not None:
            acc.last_seen = max(acc.last_seen or info.last_seen, info.last_seen)
    rows = [
        _row(group_by, key, acc, workloads, pricing, fleet_settings.currency)
        for key, acc in groups.items()
    ]
    rows.sort(key=lambda r: (-r.idle_cost, -r.gpu_hours, r.key))
    return rows


def _group_key(
    group_by: str,
    part: _Part,
    info: _WorkloadInfo,
    team: str,
    price: _Pricing | None,
    zone: dt.tzinfo,
) -> Any:
    if group_by == "workload":
        return part.workload_id
    if group_by == "user":
        return info.user or UNASSIGNED
    if group_by == "account":
        return info.account or UNASSIGNED
    if group_by == "team":
        return team
    if group_by == "gpu":
        return part.gpu_id
    assert part.hour is not None  # group_by "day" sums per hour
    return part.hour.astimezone(zone).date()


def _row(
    group_by: str,
    key: Any,
    acc: _Acc,
    workloads: dict[int, _WorkloadInfo],
    pricing: dict[int, _Pricing],
    currency: str,
) -> WorkloadRow:
    gpu_h = cm.hours_from_seconds(seconds=acc.gpu_s)
    air_h = cm.hours_from_seconds(seconds=acc.air_s)
    only = next(iter(acc.workload_ids)) if len(acc.workload_ids) == 1 else None
    if group_by == "workload":
        text_key = workloads[key].key
    elif group_by == "gpu":
        text_key = pricing[key].uuid if key in pricing else str(key)
    else:
        text_key = str(key)
    return WorkloadRow(
        key=text_key,
        kind=acc.one("kind"),
        name=acc.one("name"),
        user=acc.one("user"),
        account=acc.one("account"),
        team=acc.one("team"),
        site=acc.one("site"),
        gpus=len(acc.gpu_ids),
        workloads=len(acc.workload_ids),
        workload_pk=only,
        first_seen=acc.first_seen,
        last_seen=acc.last_seen,
        gpu_hours=float(gpu_h),
        air_hours=float(air_h),
        held_hours=float(gpu_h - air_h),
        utilization=cm.utilization(air_hours=air_h, capacity_hours=gpu_h),
        energy_kwh=float(cm.kwh_from_joules(energy_j=acc.energy_j)),
        cost=acc.cost,
        idle_cost=acc.idle_cost,
        currency=currency,
        priced=acc.priced,
        day=key if group_by == "day" else None,
        gpu_uuid=pricing[key].uuid if group_by == "gpu" and key in pricing else None,
        gpu_label=pricing[key].label if group_by == "gpu" and key in pricing else None,
    )
