"""What a computation reads before the rollups: settings, zone, names, GPUs and their
cost terms and rates."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from decimal import Decimal
from operator import itemgetter
from typing import Any
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import BigIntegerField, F, Func, QuerySet
from django.utils import timezone

from billing import cost_model as cm
from billing.models import CostProfile
from billing.selectors.calendar import _floor_hour, _local_midnight, _report_zone
from billing.selectors.types import (
    UNASSIGNED_NAME,
    Filters,
    _GpuInfo,
    _NamesAndSiteTerms,
    _SiteTerms,
)
from config.replica import read_cursor
from fleet.models import FleetSettings, Gpu, Pool, Site, Team
from telemetry.models import DailyUsageState

# --- loading --------------------------------------------------------------------------------
_GPU_COLUMNS = (
    "id",
    "uuid",
    "index",
    "team_id",
    "in_service_at",
    "first_seen_at",
    "retired_at",
    "last_seen_at",
    "node_id",
    "node__hostname",
    "node__pool_id",
    "node__pool__name",
    "node__pool__team_id",
    "node__pool__site_id",
    "node__pool__site__name",
    "node__site_id",
    "node__site__name",
    "model_id",
    "model__key",
    "model__name",
    "model__max_power_w",
    "model__idle_power_w",
)


# The GPU's timestamps: on PostgreSQL read as integer microseconds since the epoch (exact)
# and made datetimes here. Parsing 40,000 timestamps' text took ~200 ms at 10,000 GPUs.
_GPU_TIMES = ("in_service_at", "first_seen_at", "retired_at", "last_seen_at")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECONDS = "(extract(epoch FROM %(expressions)s) * 1000000)::bigint"


def _gpu_rows(gpu_qs: QuerySet[Gpu]) -> list[dict[str, Any]]:
    """The GPUs with their node, pool, sites and model as flat dicts keyed by
    ``_GPU_COLUMNS``: one ``values()`` query, no model instances (a fifth of the time for a
    thousand GPUs); the timestamps aware UTC datetimes (None where unset)."""
    if connection.vendor != "postgresql":
        return [dict(zip(_GPU_COLUMNS, r, strict=True)) for r in gpu_qs.values_list(*_GPU_COLUMNS)]
    in_us = {
        f"{name}_us": Func(F(name), template=_MICROSECONDS, output_field=BigIntegerField())
        for name in _GPU_TIMES
    }
    columns = [c if c not in _GPU_TIMES else f"{c}_us" for c in _GPU_COLUMNS]
    # Django's statement, read in the binary format, all at once (``values_list`` fetches
    # 100 rows at a time and runs a converter per timestamp: ~0.1 s at 10,000 GPUs); its
    # columns in the order Django selects them (``ValuesIterable``'s names), taken in ours.
    query = gpu_qs.annotate(**in_us).values_list(*columns).query
    selected = list(query.selected or ()) or [
        *query.extra_select,
        *query.values_select,
        *query.annotation_select,
    ]
    order = itemgetter(*(selected.index(c) for c in columns))
    with read_cursor(binary=True) as cursor:
        cursor.execute(*query.sql_with_params())
        fetched = cursor.fetchall()
    out = []
    times: dict[int, dt.datetime] = {}  # GPUs bought together share their dates: each once
    for values in map(order, fetched):
        row = dict(zip(_GPU_COLUMNS, values, strict=True))
        for name in _GPU_TIMES:
            found = row[name]
            if found is not None:
                moment = times.get(found)
                if moment is None:
                    moment = times[found] = _EPOCH + dt.timedelta(microseconds=found)
                row[name] = moment
        out.append(row)
    return out


# Per cost profile, service start and retirement: the terms, the rates of the three phases
# and the hour depreciation ends in (the same for a whole batch of GPUs bought together).
_Rates = tuple[cm.CostTerms | None, tuple[Decimal, Decimal, Decimal], dt.datetime | None]


def _rates(
    profile: CostProfile | None,
    service_start: dt.datetime | None,
    retired_at: dt.datetime | None,
    now: dt.datetime,
) -> _Rates:
    terms = profile.cost_terms() if profile is not None else None
    depreciating = cm.fixed_rate_per_hour(terms=terms, depreciating=True)
    if terms is None or not terms.owned or service_start is None:
        return terms, (depreciating, depreciating, depreciating), None
    end = cm.depreciation_end(
        service_start=service_start, depreciation_years=terms.depreciation_years
    )
    boundary_hour = _floor_hour(end)
    hour_end = boundary_hour + cm.ONE_HOUR
    # The pro-rata rate of the hour depreciation ends in, over the part of it in service.
    span = cm.capacity_interval(
        service_start=service_start,
        retired_at=retired_at,
        start=boundary_hour,
        end=hour_end,
        now=now,
    ) or (boundary_hour, hour_end)
    split = cm.mean_fixed_rate_per_hour(
        terms=terms, service_start=service_start, start=span[0], end=span[1]
    )
    after = cm.fixed_rate_per_hour(terms=terms, depreciating=False)
    return terms, (depreciating, split, after), boundary_hour


def _gpu_info(
    gpu: dict[str, Any],
    profiles: dict[tuple[str, str], CostProfile],
    now: dt.datetime,
    rates: dict[tuple[Any, ...], _Rates] | None = None,
    places: dict[tuple[str | None, ...], CostProfile | None] | None = None,
) -> _GpuInfo:
    """One GPU of ``_gpu_rows`` with its terms and rates. ``rates``: a cache of ``_rates``
    for the GPUs of one load (one ``now``); ``places``: of the profile of a node, pool and
    site, for the GPUs without a profile of their own (most: theirs is their node's or a
    wider scope's, the same for the node's GPUs)."""
    pool_id = gpu["node__pool_id"]
    # The node's site, else its pool's; the GPU's own team, else its pool's.
    if gpu["node__site_id"]:
        site_id, site_name = gpu["node__site_id"], gpu["node__site__name"]
    elif pool_id and gpu["node__pool__site_id"]:
        site_id, site_name = gpu["node__pool__site_id"], gpu["node__pool__site__name"]
    else:
        site_id = site_name = None
    team_id = gpu["team_id"] or (gpu["node__pool__team_id"] if pool_id else None)
    hostname = gpu["node__hostname"]
    pool_name = gpu["node__pool__name"] if pool_id else None
    place = (hostname, pool_name, site_name)
    own = (cm.SCOPE_ORDER[0], gpu["uuid"]) in profiles
    if places is not None and not own and place in places:
        profile = places[place]
    else:
        profile = cm.cost_profile_resolve(
            profiles=profiles,
            gpu_uuid=gpu["uuid"],
            hostname=hostname,
            pool_name=pool_name,
            site_name=site_name,
        )
        if places is not None and not own:
            places[place] = profile
    service_start = gpu["in_service_at"] or gpu["first_seen_at"]
    retired_at = gpu["retired_at"]
    key = (profile.pk if profile is not None else None, service_start, retired_at)
    found = rates.get(key) if rates is not None else None
    if found is None:
        found = _rates(profile, service_start, retired_at, now)
        if rates is not None:
            rates[key] = found
    terms, phase_rates, boundary_hour = found
    has_model = gpu["model_id"] is not None
    index = gpu["index"]
    # In the order of its fields, not by keyword: half the time, 10,000 times a page.
    return _GpuInfo(
        gpu["id"],  # id
        gpu["uuid"],  # uuid
        f"{hostname}#{index}" if index is not None else hostname,  # label
        gpu["model__key"] if has_model else "",  # model_key
        gpu["model__name"] if has_model else UNASSIGNED_NAME,  # model_name
        gpu["model__max_power_w"] if has_model else None,  # max_power_w
        gpu["model__idle_power_w"] if has_model else None,  # idle_power_w
        gpu["node_id"],  # node_id
        pool_id or None,  # pool_id
        team_id,  # team_id
        site_id,  # site_id
        service_start,  # service_start
        retired_at,  # retired_at
        gpu["last_seen_at"],  # last_seen_at
        terms,  # terms
        boundary_hour,  # boundary_hour
        phase_rates,  # rates
    )


def _daily_zone(zone: dt.tzinfo) -> bool:
    """Whether ``telemetry.DailyUsage`` holds the local days of ``zone`` (PostgreSQL, built
    for this very zone); otherwise the selectors read hourly rows only."""
    if connection.vendor != "postgresql":
        return False
    if not isinstance(zone, ZoneInfo):  # a fixed offset standing in for a zone with
        return False  # non-whole-hour midnights
    name = zone.key
    state = DailyUsageState.objects.order_by("id").values_list("zone", flat=True).first()
    return state is not None and state == name


def _names_load() -> _NamesAndSiteTerms:
    return _NamesAndSiteTerms(
        nodes={},
        pools=dict(Pool.objects.values_list("id", "name")),
        teams=dict(Team.objects.values_list("id", "name")),
        sites={
            s.pk: _SiteTerms(
                name=s.name,
                pue=s.pue,
                price_per_kwh=s.price_per_kwh,
                grid_g_per_kwh=cm.to_decimal(s.grid_g_per_kwh),
            )
            for s in Site.objects.all()
        },
    )


@dataclass
class _Loaded:
    """What a computation reads before the rollups (settings, zone, names, GPUs and their
    cost terms): the same for every period of one query, so a page that needs two periods
    (the overview: the whole window and each day) loads it once."""

    now: dt.datetime
    fleet_settings: FleetSettings
    zone: dt.tzinfo
    names: _NamesAndSiteTerms
    gpus: dict[int, _GpuInfo]
    daily_zone: bool


def _load(*, start: dt.date, end: dt.date, filters: Filters, now: dt.datetime | None) -> _Loaded:
    now = now or timezone.now()
    fleet_settings = FleetSettings.load()
    zone = _report_zone(fleet_settings.report_time_zone, start, end)
    window_start = _local_midnight(start, zone).astimezone(dt.UTC)
    names = _names_load()
    profiles = {(p.scope_kind, p.scope_name): p for p in CostProfile.objects.all()}
    gpu_qs = Gpu.objects.exclude(retired_at__lte=window_start)
    if filters.models:
        gpu_qs = gpu_qs.filter(model__key__in=filters.models)
    if filters.gpus:
        gpu_qs = gpu_qs.filter(uuid__in=filters.gpus)
    gpus: dict[int, _GpuInfo] = {}
    rates: dict[tuple[Any, ...], _Rates] = {}
    places: dict[tuple[str | None, ...], CostProfile | None] = {}
    for gpu in _gpu_rows(gpu_qs):
        gpus[gpu["id"]] = _gpu_info(gpu, profiles, now, rates, places)
        names.nodes[gpu["node_id"]] = gpu["node__hostname"]
    return _Loaded(
        now=now,
        fleet_settings=fleet_settings,
        zone=zone,
        names=names,
        gpus=gpus,
        daily_zone=_daily_zone(zone),
    )


def _loaded_within(loaded: _Loaded, *, start: dt.date, end: dt.date) -> _Loaded | None:
    """What ``_load`` over [start, end), a part of the range ``loaded`` was read for, would
    read (with ``loaded``'s ``now``), taken from ``loaded``: its GPUs less those retired by
    the part's start. ``None`` where the part's zone is another (a fixed offset standing in
    for the zone over one range and not the other): load it then."""
    zone = _report_zone(loaded.fleet_settings.report_time_zone, start, end)
    if zone != loaded.zone:
        return None
    window_start = _local_midnight(start, zone).astimezone(dt.UTC)
    gpus = {
        gpu_id: info
        for gpu_id, info in loaded.gpus.items()
        if info.retired_at is None or info.retired_at > window_start
    }
    return replace(loaded, gpus=gpus)
