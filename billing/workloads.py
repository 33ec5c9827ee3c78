"""Workload figures: who held the GPUs, their hours and their money (docs/metrics.md,
"Workloads").

One read of the hourly workload rollups (``telemetry.WorkloadHourlyUsage``) summed in SQL per
workload, GPU, attribution (team, site) and, where a GPU's rate changes inside the period (its
depreciation ends), per hour; those parts summed again per workload, fixed rate, team and site
and priced there through ``billing.cost_model`` (``workload_cost``); then summed per group. A
group's figures are the sums of its parts; its ratios are ratios of those sums.

Entry points: ``workload_figures(start, end, group_by, filters)`` → rows, worst idle cost first
(the finance API, the alerts); ``workload_figures_by`` for several groupings from one read (the
pages); ``workload_accounts``, the accounts' figures summed per account rather than per
workload (the overview's panel, affordable over a long range).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import connections
from django.db.models import (
    Aggregate,
    Case,
    CharField,
    DateField,
    DateTimeField,
    F,
    FloatField,
    IntegerField,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast
from django.utils.dateparse import parse_datetime

from billing import cost_model as cm
from billing.models import CostProfile, WorkloadTeamRule
from fleet.models import FleetSettings, Gpu, Site, Team
from telemetry.models import (
    Workload,
    WorkloadClaim,
    WorkloadDailyState,
    WorkloadDailyUsage,
    WorkloadHourlyUsage,
)
from telemetry.rollup import daily_zone_name

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


# The workload's fields the rules match, as lookups from a workload rollup row.
_RULE_LOOKUPS = {
    "account": "workload__account",
    "user": "workload__user_name",
    "kind": "workload__kind",
    "id": "workload__key",
}


def team_filtered(qs: Any, teams: Sequence[str]) -> Any:
    """Workload rollup rows of these teams (names; ``UNASSIGNED``: rows without a team), each
    row's team being that of the first ``[[workload_teams]]`` rule that matches its workload,
    else its own: :func:`team_rule_match` as an SQL expression, for reads that filter by team
    in the database rather than per workload in Python. No teams: ``qs`` as it is."""
    if not teams:
        return qs
    whens = []
    for rule in team_rules_load():
        lookup = _RULE_LOOKUPS[rule.match_field]
        if rule.pattern.endswith("*"):
            condition = Q(**{f"{lookup}__startswith": rule.pattern[:-1]})
        else:
            condition = Q(**{lookup: rule.pattern})
        whens.append(When(condition, then=Value(rule.team_id)))
    team: Any = F("team_id")
    if whens:
        team = Case(*whens, default=F("team_id"), output_field=IntegerField())
    ids = list(Team.objects.filter(name__in=teams).values_list("pk", flat=True))
    allowed = Q(rule_team__in=ids)
    if UNASSIGNED in teams:
        allowed |= Q(rule_team__isnull=True)
    return qs.annotate(rule_team=team).filter(allowed)


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


def pricing_load(gpu_ids: Iterable[int] | None = None) -> dict[int, _Pricing]:
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


@dataclass(frozen=True)
class GpuSeconds:
    """Seconds of one GPU at one site (its attribution then) within ``[start, end)``, with the
    energy they drew: what ``gpu_seconds_cost`` prices."""

    gpu_id: int
    site_id: int | None
    start: dt.datetime
    end: dt.datetime
    gpu_s: float
    energy_j: float


def gpu_seconds_cost(*, pieces: Sequence[GpuSeconds]) -> tuple[Decimal, bool]:
    """The cost of GPU seconds priced as a workload's are (§8.1, ``workload_figures``): each
    piece's hours × its GPU's mean fixed rate over ``[start, end)`` (the same profile
    resolution and depreciation as its cost rows), plus on owned GPUs its energy × the site's
    PUE × price. Returns (the sum, priced: every GPU has a cost profile and a site)."""
    if not pieces:
        return Decimal(0), True
    pricing = pricing_load({p.gpu_id for p in pieces})
    sites = {
        s.pk: _SiteTerms(name=s.name, pue=s.pue, price_per_kwh=s.price_per_kwh)
        for s in Site.objects.filter(pk__in={p.site_id for p in pieces if p.site_id})
    }
    total, priced = Decimal(0), True
    for piece in pieces:
        rate, paid_as, profiled = _rate(pricing.get(piece.gpu_id), None, (piece.start, piece.end))
        site = sites.get(piece.site_id) if piece.site_id is not None else None
        total += cm.workload_cost(
            kind=paid_as,
            fixed_rate_per_hour=rate,
            gpu_hours=cm.hours_from_seconds(seconds=piece.gpu_s),
            energy_kwh=cm.kwh_from_joules(energy_j=piece.energy_j),
            pue=site.pue if site is not None else Decimal(1),
            price_per_kwh=site.price_per_kwh if site is not None else Decimal(0),
        )
        priced = priced and profiled and site is not None
    return total, priced


# --- parts: one SQL aggregate ---------------------------------------------------------------
@dataclass
class _Part:
    workload_id: Any  # the workload's id; its account where the parts are summed per account
    gpu_id: int
    team_id: int | None
    site_id: int | None
    hour: dt.datetime | None  # set where the GPU's rate changes in the period, or per day
    gpu_s: float
    air_s: float
    energy_j: float
    idle_energy_j: float
    # From the daily rows: the local day (where a page asks per day), and the GPUs summed in
    # the part, all of one rate over the window (``gpu_id`` is one of them).
    day: dt.date | None = None
    gpu_ids: frozenset[int] | None = None


def _parts(
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    filters: WorkloadFilters,
    split_gpu_ids: list[int],
    per_hour: bool,
    owner: str = "workload_id",
    gpu_ids: list[int] | None = None,
    teams_in_sql: bool = False,
) -> list[_Part]:
    """Σ of the hourly workload rows in the window per (workload, GPU, team, site[, hour]).

    The held part of the energy is summed per hourly row (energy × held / GPU seconds), as
    idle cost is that hour's cost × its held share. Hours are kept apart only for GPUs whose
    fixed rate changes within the window (``split_gpu_ids``), or for all (``per_hour``)."""
    qs = _filtered(
        WorkloadHourlyUsage.objects.filter(hour__gte=window_start, hour__lt=window_end),
        filters,
    )
    if gpu_ids is not None:
        qs = qs.filter(gpu_id__in=gpu_ids)
    if teams_in_sql:  # parts of no workload (per owner): the team filter applied here
        qs = team_filtered(qs, filters.teams)
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
        .values(owner, "gpu_id", "team_id", "site_id", "part_hour")
        .annotate(
            sum_gpu_s=Sum("gpu_s"),
            sum_air_s=Sum("air_s"),
            sum_energy_j=Sum("energy_j"),
            sum_idle_energy_j=Sum(held_energy),
        )
        .values_list(
            owner,
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
        _Part(w, g, t, s, _aware(h), float(gs or 0), float(a or 0), float(e or 0), float(ie or 0))
        for w, g, t, s, h, gs, a, e, ie in _fetch(rows)
    ]


def _filtered(qs: Any, filters: WorkloadFilters) -> Any:
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
    return qs


def _fetch(rows: Any) -> list[tuple[Any, ...]]:
    """A values_list query executed by hand, past the ORM's per-row converters (a tenth of a
    second per 50,000 rows): its columns are plain numbers, texts or dates in both dialects."""
    sql, params = rows.query.get_compiler(using=rows.db).as_sql()
    with connections[rows.db].cursor() as cursor:
        cursor.execute(sql, params)
        fetched: list[tuple[Any, ...]] = cursor.fetchall()
    return fetched


class _GpuIds(Aggregate):
    """The distinct GPU ids of a group as one text, "3,17,18" (both dialects)."""

    function = "group_concat"
    template = "%(function)s(DISTINCT %(expressions)s)"
    output_field = CharField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            function="string_agg",
            template="%(function)s(DISTINCT %(expressions)s::text, ',')",
            **extra,
        )


def _daily_days(start: dt.date, end: dt.date, zone_name: str) -> tuple[dt.date, dt.date] | None:
    """The local days [start, end) when the daily pre-aggregate can answer for them: the
    window is whole days (dates, not an alert's aware hours) and the table holds the report
    time zone's days; else None (read hourly rows)."""
    if isinstance(start, dt.datetime) or isinstance(end, dt.datetime):
        return None
    state = WorkloadDailyState.objects.order_by("id").values_list("zone", flat=True).first()
    if state is None or state != daily_zone_name(zone_name):
        return None
    return start, end


def _rate_classes(
    pricing: dict[int, _Pricing], split_gpu_ids: list[int], window: tuple[dt.datetime, dt.datetime]
) -> dict[int, list[int]]:
    """The GPUs whose rate does not change in the window, by their rate there (fixed rate,
    owned or rented, has a profile): one GPU of each class → all of the class."""
    split = set(split_gpu_ids)
    classes: dict[tuple[Decimal, str | None, bool], list[int]] = {}
    for gpu_id, price in pricing.items():
        if gpu_id not in split:
            classes.setdefault(_rate(price, None, window), []).append(gpu_id)
    return {members[0]: members for members in classes.values()}


def _daily_parts(
    *,
    days: tuple[dt.date, dt.date],
    filters: WorkloadFilters,
    classes: dict[int, list[int]],
    split_gpu_ids: list[int],
    per_day: bool,
    per_gpu: bool,
    owner: str,
) -> list[_Part]:
    """Σ of the daily workload rows of the local days, per (workload, rate class, team, site
    [, day][, GPU]), for the GPUs whose rate does not change in the window: the same sums as
    the hourly rows' (a day's rows are its hours' sums), priced alike (one rate per class)."""
    qs = _filtered(WorkloadDailyUsage.objects.filter(day__gte=days[0], day__lt=days[1]), filters)
    if split_gpu_ids:
        qs = qs.exclude(gpu_id__in=split_gpu_ids)
    rate_gpu: Any = F("gpu_id")
    if not per_gpu and classes:
        rate_gpu = Case(
            *(When(gpu_id__in=members, then=Value(rep)) for rep, members in classes.items()),
            default=F("gpu_id"),
            output_field=IntegerField(),
        )
    part_day: Any = F("day") if per_day else Value(None, output_field=DateField())
    sums: dict[str, Any] = {
        "sum_gpu_s": Sum("gpu_s"),
        "sum_air_s": Sum("air_s"),
        "sum_energy_j": Sum("energy_j"),
        "sum_idle_energy_j": Sum("held_energy_j"),
    }
    if not per_gpu:  # the part's GPUs (per GPU: the one it is grouped by)
        sums["gpu_list"] = _GpuIds("gpu_id")
    rows = (
        qs.annotate(rate_gpu=rate_gpu, part_day=part_day)
        .values(owner, "rate_gpu", "team_id", "site_id", "part_day")
        .annotate(**sums)
        .values_list(owner, "rate_gpu", "team_id", "site_id", "part_day", *sums)
    )
    return [
        _Part(
            workload_id=row[0],
            gpu_id=row[1],
            team_id=row[2],
            site_id=row[3],
            hour=None,
            gpu_s=float(row[5] or 0),
            air_s=float(row[6] or 0),
            energy_j=float(row[7] or 0),
            idle_energy_j=float(row[8] or 0),
            day=_date(row[4]),
            gpu_ids=None if per_gpu else frozenset(int(i) for i in str(row[9]).split(",")),
        )
        for row in _fetch(rows)
    ]


def _date(day: Any) -> dt.date | None:
    """A date as the cursor gives it (a date on PostgreSQL, its text on SQLite)."""
    if day is None or isinstance(day, dt.date):
        return day
    return dt.date.fromisoformat(str(day))


def _parts_read(
    *,
    start: dt.date,
    end: dt.date,
    window_start: dt.datetime,
    window_end: dt.datetime,
    zone_name: str,
    filters: WorkloadFilters,
    pricing: dict[int, _Pricing],
    per_day: bool,
    per_gpu: bool,
    owner: str = "workload_id",
) -> list[_Part]:
    """The parts of the window: from the daily pre-aggregate where it can answer (whole local
    days), the hourly rows of the GPUs whose rate changes in the window still per hour; else
    from the hourly rows alone."""
    split = _split(pricing, window_start, window_end)
    days = _daily_days(start, end, zone_name)
    if days is None:
        return _parts(
            window_start=window_start,
            window_end=window_end,
            filters=filters,
            split_gpu_ids=split,
            per_hour=per_day,
            owner=owner,
        )
    parts = _daily_parts(
        days=days,
        filters=filters,
        classes=_rate_classes(pricing, split, (window_start, window_end)),
        split_gpu_ids=split,
        per_day=per_day,
        per_gpu=per_gpu,
        owner=owner,
    )
    if split:
        parts += _parts(
            window_start=window_start,
            window_end=window_end,
            filters=filters,
            split_gpu_ids=split,
            per_hour=True,
            owner=owner,
            gpu_ids=split,
        )
    return parts


def _aware(hour: Any) -> dt.datetime | None:
    """An hour as the cursor gives it (aware on PostgreSQL; naive UTC or its text on SQLite),
    as an aware UTC datetime."""
    if hour is None:
        return None
    parsed = hour if isinstance(hour, dt.datetime) else parse_datetime(str(hour))
    if parsed is None:
        raise ValueError(f"not a datetime: {hour!r}")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


# --- groups ---------------------------------------------------------------------------------
@dataclass
class _Bucket:
    """Parts of one workload at one rate, team and site (and hour or GPU, where a page asks):
    their sums, priced once."""

    workload_id: Any  # as _Part
    team: str
    day: dt.date | None
    gpu_id: int | None
    gpu_ids: set[int] = field(default_factory=set)
    gpu_s: float = 0.0
    air_s: float = 0.0
    energy_j: float = 0.0
    idle_energy_j: float = 0.0
    cost: Decimal = Decimal(0)
    idle_cost: Decimal = Decimal(0)
    priced: bool = True


@dataclass
class _Acc:
    workload_ids: set[int] = field(default_factory=set)
    gpu_ids: set[int] = field(default_factory=set)
    teams: set[str] = field(default_factory=set)
    gpu_s: float = 0.0
    air_s: float = 0.0
    energy_j: float = 0.0
    cost: Decimal = Decimal(0)
    idle_cost: Decimal = Decimal(0)
    priced: bool = True

    def add(self, bucket: _Bucket) -> None:
        self.workload_ids.add(bucket.workload_id)
        self.gpu_ids |= bucket.gpu_ids
        self.teams.add(bucket.team)
        self.gpu_s += bucket.gpu_s
        self.air_s += bucket.air_s
        self.energy_j += bucket.energy_j
        self.cost += bucket.cost
        self.idle_cost += bucket.idle_cost
        self.priced = self.priced and bucket.priced


@dataclass(frozen=True)
class _WorkloadInfo:
    kind: str
    key: str
    user: str
    account: str
    name: str
    site: str
    # As the database writes them as text (UTC, one format per dialect, so the least text is
    # the earliest): parsed only for the rows built (45,000 parsed: half a second).
    first_seen: str | None
    last_seen: str | None
    rule_team_id: int | None


def _window_read(
    *,
    start: dt.date,
    end: dt.date,
    filters: WorkloadFilters,
    per_day: bool,
    per_gpu: bool,
    owner: str = "workload_id",
    pricing: dict[int, _Pricing] | None = None,
) -> tuple[FleetSettings, tuple[dt.datetime, dt.datetime], dict[int, _Pricing], list[_Part]]:
    """What every figure of a window starts from: the fleet settings, the window in UTC, each
    GPU's pricing (``pricing``: as a caller already read it) and the window's parts
    (``_parts_read``)."""
    fleet_settings = FleetSettings.load()
    window_start, window_end = _window(start, end, fleet_settings.report_zone)
    pricing = pricing if pricing is not None else pricing_load()
    parts = _parts_read(
        start=start,
        end=end,
        window_start=window_start,
        window_end=window_end,
        zone_name=fleet_settings.report_time_zone,
        filters=filters,
        pricing=pricing,
        per_day=per_day,
        per_gpu=per_gpu,
        owner=owner,
    )
    return fleet_settings, (window_start, window_end), pricing, parts


def _window(start: dt.date, end: dt.date, zone: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """Local days [start, end) of the report time zone as UTC moments; aware datetimes (an
    alert's window of whole hours) are taken as they are."""

    def moment(day: dt.date) -> dt.datetime:
        if isinstance(day, dt.datetime):
            if day.tzinfo is None:
                raise ValueError("start: a datetime must be aware")
            return day.astimezone(dt.UTC)
        return dt.datetime.combine(day, dt.time(), tzinfo=zone).astimezone(dt.UTC)

    return moment(start), moment(end)


def workload_figures(
    *,
    start: dt.date,
    end: dt.date,
    group_by: str = "workload",
    filters: WorkloadFilters | None = None,
) -> list[WorkloadRow]:
    """One row per group (``GROUP_BY``, or the pages' ``gpu`` and ``day``) over the local days
    [start, end) of the report time zone (or, given aware datetimes, the hours that start in
    [start, end)), worst idle cost first (then GPU hours, then key).

    GPU hours = Σ share_s / 3600, air hours = Σ air_s / 3600, held = GPU − air hours,
    utilisation = air / GPU hours, energy = Σ the samples' energy × share_s / seconds; cost =
    GPU hours × the GPU's fixed rate in those hours + energy × PUE × price (owned GPUs); idle
    cost = Σ over hourly rows of that hour's cost × held / GPU hours. Team: the first
    ``[[workload_teams]]`` rule that matches, else the team of the GPU's pool in that hour.
    """
    return workload_figures_by(start=start, end=end, group_bys=(group_by,), filters=filters)[
        group_by
    ]


def workload_figures_by(
    *,
    start: dt.date,
    end: dt.date,
    group_bys: Sequence[str],
    filters: WorkloadFilters | None = None,
    limits: Mapping[str, int] | None = None,
    worst: str = "idle_cost",
    pricing: dict[int, _Pricing] | None = None,
) -> dict[str, list[WorkloadRow]]:
    """``workload_figures`` for several groupings from one read of the rollups (a page that
    shows workloads, users and accounts reads them once). ``limits``: per grouping, only its
    first rows, worst first by ``worst`` (``idle_cost``, or ``held_hours`` for a page without
    money): a page of 200 out of 45,000 workloads builds 200 rows. ``pricing``: each GPU's
    pricing, where the caller has read it already (``pricing_load``)."""
    if worst not in ("idle_cost", "held_hours"):
        raise ValueError("worst: idle_cost or held_hours")
    if end <= start:
        raise ValueError("end: must be after start")
    for group_by in group_bys:
        if group_by not in PAGE_GROUP_BY:
            raise ValueError(f"group_by: must be one of {', '.join(GROUP_BY)}")
    filters = filters or WorkloadFilters()
    fleet_settings, (window_start, window_end), pricing, parts = _window_read(
        start=start,
        end=end,
        filters=filters,
        per_day="day" in group_bys,
        per_gpu="gpu" in group_bys,
        pricing=pricing,
    )
    zone = fleet_settings.report_zone
    out: dict[str, list[WorkloadRow]] = {g: [] for g in group_bys}
    if not parts:
        return out
    workloads = _workloads_load({p.workload_id for p in parts}, window_start, window_end)
    buckets = _buckets(
        parts,
        workloads=workloads,
        pricing=pricing,
        window=(window_start, window_end),
        zone=zone,
        per_gpu="gpu" in group_bys,
        teams_allowed=frozenset(filters.teams),
    )
    for group_by in group_bys:
        groups: dict[Any, _Acc] = {}
        for bucket in buckets:
            key = _group_key(group_by, bucket, workloads[bucket.workload_id])
            acc = groups.get(key)
            if acc is None:
                acc = groups[key] = _Acc()
            acc.add(bucket)
        keyed = [
            (_text_key(group_by, key, workloads, pricing), key, acc) for key, acc in groups.items()
        ]
        keyed.sort(key=lambda k: k[0])
        if worst == "idle_cost":
            keyed.sort(key=lambda k: (k[2].idle_cost, k[2].gpu_s), reverse=True)
        else:
            keyed.sort(key=lambda k: k[2].gpu_s - k[2].air_s, reverse=True)
        out[group_by] = [
            _row(group_by, key, acc, workloads, pricing, fleet_settings.currency)
            for _, key, acc in keyed[: (limits or {}).get(group_by)]
        ]
    return out


def workload_accounts(
    *, start: dt.date, end: dt.date, filters: WorkloadFilters | None = None
) -> list[WorkloadRow]:
    """The accounts' GPU hours, held hours and money, summed in SQL per account and GPU rather
    than per workload: the overview's top accounts and its share of held hours, affordable
    over a long range. The same figures as ``workload_figures(group_by="account")``; the rows
    carry only those: no team (rules are per workload), no other names, no seen times, and
    ``workloads`` 0. Not with a team filter (a workload's team needs its rules): use
    ``workload_figures`` there."""
    filters = filters or WorkloadFilters()
    if filters.teams:
        raise ValueError("team: workload_accounts takes no team filter")
    if end <= start:
        raise ValueError("end: must be after start")
    fleet_settings, (window_start, window_end), pricing, parts = _window_read(
        start=start,
        end=end,
        filters=filters,
        per_day=False,
        # Per GPU: an account's parts are few (13 accounts × 1,000 GPUs), and listing each
        # part's distinct GPUs in SQL costs more than it saves.
        per_gpu=True,
        owner="workload__account",
    )
    zone = fleet_settings.report_zone
    buckets = _buckets(
        parts,
        workloads={},
        pricing=pricing,
        window=(window_start, window_end),
        zone=zone,
        per_gpu=False,
        teams_allowed=frozenset(),
        lean=True,
    )
    return _owner_rows(buckets, currency=fleet_settings.currency, field="account")


def _owner_rows(
    buckets: Iterable[_Bucket],
    *,
    currency: str,
    field: str,
    gpus: Mapping[str, int] | None = None,
    workloads: Mapping[str, int] | None = None,
) -> list[WorkloadRow]:
    """Rows of lean buckets (owned by a user or an account, ``field``, rather than by a
    workload) summed per owner, worst first: their hours and money, their distinct GPUs
    (``gpus``, else the buckets' GPUs) and workloads (else 0); no kind, name, team, site or
    seen times."""
    groups: dict[str, _Acc] = {}
    for bucket in buckets:
        groups.setdefault(bucket.workload_id or UNASSIGNED, _Acc()).add(bucket)
    rows = []
    for key, acc in groups.items():
        gpu_h = cm.hours_from_seconds(seconds=acc.gpu_s)
        air_h = cm.hours_from_seconds(seconds=acc.air_s)
        value = None if key == UNASSIGNED else key
        rows.append(
            WorkloadRow(
                key=key,
                kind=None,
                name=None,
                user=value if field == "user" else None,
                account=value if field == "account" else None,
                team=None,
                site=None,
                gpus=gpus.get(key, 0) if gpus is not None else len(acc.gpu_ids),
                workloads=workloads.get(key, 0) if workloads is not None else 0,
                workload_pk=None,
                first_seen=None,
                last_seen=None,
                gpu_hours=float(gpu_h),
                air_hours=float(air_h),
                held_hours=float(gpu_h - air_h),
                utilization=cm.utilization(air_hours=air_h, capacity_hours=gpu_h),
                energy_kwh=float(cm.kwh_from_joules(energy_j=acc.energy_j)),
                cost=acc.cost,
                idle_cost=acc.idle_cost,
                currency=currency,
                priced=acc.priced,
            )
        )
    _worst_first(rows)
    return rows


def _worst_first(rows: list[WorkloadRow]) -> None:
    """Highest idle cost first, then most GPU hours, then by key (two stable sorts)."""
    rows.sort(key=lambda r: r.key)
    rows.sort(key=lambda r: (r.idle_cost, r.gpu_hours), reverse=True)


def _split(pricing: dict[int, _Pricing], start: dt.datetime, end: dt.datetime) -> list[int]:
    """The GPUs whose depreciation ends inside [start, end): their rate changes there, so
    their hours are priced apart."""
    split = []
    for gpu_id, p in pricing.items():
        ends = p.depreciation_ends()
        if ends is not None and start < ends < end:
            split.append(gpu_id)
    return split


def _workloads_load(
    ids: set[int], window_start: dt.datetime, window_end: dt.datetime
) -> dict[int, _WorkloadInfo]:
    """The workloads ``ids`` with their team rule applied. Many are read as those seen in the
    window (a workload with rollup rows in it was seen then), not by a list of ids."""
    rules = team_rules_load()
    sites = dict(Site.objects.values_list("id", "name"))
    workloads: dict[int, _WorkloadInfo] = {}
    qs = Workload.objects.filter(pk__in=ids)
    if len(ids) > 1000:
        seen = Q(first_seen_at__lt=window_end, last_seen_at__gt=window_start)
        qs = Workload.objects.filter(seen | Q(first_seen_at__isnull=True))
    rows = qs.annotate(
        first_text=Cast("first_seen_at", CharField()), last_text=Cast("last_seen_at", CharField())
    ).values_list(
        "pk", "kind", "key", "user_name", "account", "name", "site_id", "first_text", "last_text"
    )
    for pk, kind, key, user, account, name, site_id, first, last in _fetch(rows):
        if pk not in ids:
            continue
        workloads[pk] = _WorkloadInfo(
            kind=kind,
            key=key,
            user=user,
            account=account,
            name=name,
            site=sites.get(site_id, ""),
            first_seen=first,
            last_seen=last,
            rule_team_id=team_rule_match(rules, kind=kind, key=key, user=user, account=account),
        )
    return workloads


def _buckets(
    parts: list[_Part],
    *,
    workloads: dict[int, _WorkloadInfo],
    pricing: dict[int, _Pricing],
    window: tuple[dt.datetime, dt.datetime],
    zone: dt.tzinfo,
    per_gpu: bool,
    teams_allowed: frozenset[str],
    lean: bool = False,
) -> list[_Bucket]:
    """The parts summed per workload, rate, kind of profile, team and site (and day or GPU),
    then priced through the cost model: a workload's 8 GPUs of one pool are priced once."""
    teams = dict(Team.objects.values_list("id", "name"))
    sites = {
        s.pk: _SiteTerms(name=s.name, pue=s.pue, price_per_kwh=s.price_per_kwh)
        for s in Site.objects.all()
    }
    rates: dict[tuple[int, dt.datetime | None], tuple[Decimal, str | None, bool]] = {}
    buckets: dict[tuple[Any, ...], _Bucket] = {}
    for part in parts:
        info = workloads.get(part.workload_id)
        if info is None and not lean:  # a rollup row of a workload since removed by hand
            continue
        rule_team_id = info.rule_team_id if info is not None else None
        team_id = rule_team_id if rule_team_id is not None else part.team_id
        team = teams.get(team_id, UNASSIGNED) if team_id is not None else UNASSIGNED
        if teams_allowed and team not in teams_allowed:
            continue
        rate_key = (part.gpu_id, part.hour)
        rate = rates.get(rate_key)
        if rate is None:
            rate = rates[rate_key] = _rate(pricing.get(part.gpu_id), part.hour, window)
        day = part.hour.astimezone(zone).date() if part.hour is not None else part.day
        gpu_id = part.gpu_id if per_gpu else None
        key = (part.workload_id, rate, team, part.site_id, day, gpu_id)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = _Bucket(part.workload_id, team, day, gpu_id)
        if part.gpu_ids is not None:
            bucket.gpu_ids |= part.gpu_ids
        else:
            bucket.gpu_ids.add(part.gpu_id)
        bucket.gpu_s += part.gpu_s
        bucket.air_s += part.air_s
        bucket.energy_j += part.energy_j
        bucket.idle_energy_j += part.idle_energy_j
    for (_, (rate_per_hour, paid_as, profiled), _, site_id, _, _), bucket in buckets.items():
        site = sites.get(site_id) if site_id is not None else None
        pue = site.pue if site is not None else Decimal(1)
        price_per_kwh = site.price_per_kwh if site is not None else Decimal(0)
        gpu_h = cm.hours_from_seconds(seconds=bucket.gpu_s)
        bucket.cost = cm.workload_cost(
            kind=paid_as,
            fixed_rate_per_hour=rate_per_hour,
            gpu_hours=gpu_h,
            energy_kwh=cm.kwh_from_joules(energy_j=bucket.energy_j),
            pue=pue,
            price_per_kwh=price_per_kwh,
        )
        bucket.idle_cost = cm.workload_cost(
            kind=paid_as,
            fixed_rate_per_hour=rate_per_hour,
            gpu_hours=gpu_h - cm.hours_from_seconds(seconds=bucket.air_s),
            energy_kwh=cm.kwh_from_joules(energy_j=bucket.idle_energy_j),
            pue=pue,
            price_per_kwh=price_per_kwh,
        )
        bucket.priced = profiled and site is not None
    return list(buckets.values())


def _rate(
    price: _Pricing | None, hour: dt.datetime | None, window: tuple[dt.datetime, dt.datetime]
) -> tuple[Decimal, str | None, bool]:
    """(fixed rate per hour, owned/rented, has a profile) of a GPU over one hour, or over the
    window where its rate does not change in it."""
    terms = price.terms if price is not None else None
    lo, hi = (hour, hour + cm.ONE_HOUR) if hour is not None else window
    rate = cm.mean_fixed_rate_per_hour(
        terms=terms,
        service_start=price.service_start if price is not None else None,
        start=lo,
        end=hi,
    )
    return rate, terms.kind if terms is not None else None, terms is not None


def _group_key(group_by: str, bucket: _Bucket, info: _WorkloadInfo) -> Any:
    if group_by == "workload":
        return bucket.workload_id
    if group_by == "user":
        return info.user or UNASSIGNED
    if group_by == "account":
        return info.account or UNASSIGNED
    if group_by == "team":
        return bucket.team
    if group_by == "gpu":
        return bucket.gpu_id
    return bucket.day


def _one(values: Iterable[str]) -> str | None:
    """The value all share, else None."""
    found = set(values)
    return next(iter(found)) if len(found) == 1 else None


def _text_key(
    group_by: str, key: Any, workloads: dict[int, _WorkloadInfo], pricing: dict[int, _Pricing]
) -> str:
    if group_by == "workload":
        return workloads[key].key
    if group_by == "gpu":
        return pricing[key].uuid if key in pricing else str(key)
    return str(key)


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
    infos = [workloads[w] for w in acc.workload_ids]
    only = next(iter(acc.workload_ids)) if len(acc.workload_ids) == 1 else None
    one: Any = _one if only is None else lambda values: next(iter(values))
    text_key = _text_key(group_by, key, workloads, pricing)
    firsts = [i.first_seen for i in infos if i.first_seen is not None]
    lasts = [i.last_seen for i in infos if i.last_seen is not None]
    return WorkloadRow(
        key=text_key,
        kind=one(i.kind for i in infos),
        name=one(i.name for i in infos),
        user=one(i.user for i in infos),
        account=one(i.account for i in infos),
        team=_one(acc.teams),
        site=one(i.site for i in infos),
        gpus=len(acc.gpu_ids),
        workloads=len(acc.workload_ids),
        workload_pk=only,
        first_seen=_aware(min(firsts)) if firsts else None,
        last_seen=_aware(max(lasts)) if lasts else None,
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


# --- whose names count ------------------------------------------------------------------------
def workload_conflicting_claims(*, workload_id: int) -> list[WorkloadClaim]:
    """What nodes other than the workload's identity node said its user, account or name was,
    where that differs from what it holds (docs/ingest.md, "Whose names count"): latest first,
    each with its node."""
    return list(
        WorkloadClaim.objects.filter(workload_id=workload_id)
        .select_related("node")
        .order_by("-last_seen_at", "field", "value")
    )
