"""What the rules read, each from the place that defines it, never from raw samples:

- money and utilisation of a scope: ``billing.selectors.cost_rows_by`` (the dashboard's and
  the finance API's figures, to the cent);
- a GPU's held, parked, throttled and observed hours: sums of its hourly rollups
  (``telemetry.HourlyUsage``), split by the attribution stored with each hour, as the
  selectors' filters do;
- a GPU's silence: its ``last_seen_at`` (what the dashboard's "offline now" reads).

One evaluation runs several rules over the same windows: inside ``memo()`` each figure is
read once per window and shared by every rule that asks for it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar
from zoneinfo import ZoneInfo

from django.db.models import Q, Sum

from billing import cost_model as cm
from billing import selectors
from fleet.models import FleetSettings, Gpu, Pool, Site, Team
from telemetry.models import HourlyUsage

if TYPE_CHECKING:
    from alerts.rules import Scope, Window

T = TypeVar("T")
_MEMO: ContextVar[dict[Any, Any] | None] = ContextVar("alerts_figures_memo", default=None)
# Every grouping the selectors know that a scope can name, from one computation.
_GROUPS = ("fleet", "site", "pool", "team", "gpu")


@contextmanager
def memo() -> Iterator[None]:
    """Share what is read between the rules of one evaluation, or the rows of one page (and
    only there: the next evaluation reads afresh)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _memo(key: Any, compute: Callable[[], T]) -> T:
    memo = _MEMO.get()
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]  # type: ignore[no-any-return]


def report_zone() -> ZoneInfo:
    return _memo("zone", lambda: FleetSettings.load().report_zone)


def currency() -> str:
    return _memo("currency", lambda: FleetSettings.load().currency)


# --- a scope's money and utilisation --------------------------------------------------------
@dataclass(frozen=True)
class ScopeFigures:
    """A scope over a window: the sums the rules compare (DESIGN.md §3)."""

    label: str
    capacity_hours: float
    air_hours: float
    idle_cost: Decimal
    total_cost: Decimal

    @property
    def utilization(self) -> float | None:
        return self.air_hours / self.capacity_hours if self.capacity_hours > 0 else None


def _rows_until(start: dt.date, end: dt.date, now: dt.datetime) -> dict[str, selectors.CostRow]:
    """Every scope's row over [local midnight of ``start``, ``now``), keyed like a scope."""
    grouped = selectors.cost_rows_by(start=start, end=end, group_bys=_GROUPS, now=now)
    out: dict[str, selectors.CostRow] = {}
    for group_by, rows in grouped.items():
        for row in rows:
            if group_by == "fleet":
                out["fleet"] = row
            elif row.key != selectors.UNASSIGNED_NAME:
                out[f"{group_by}:{row.key}"] = row
    return out


def _window_figures(window: Window) -> dict[str, ScopeFigures]:
    """The selectors take whole days of the report time zone; a window of hours is the
    figures up to its end less those up to its start, over the same days (capacity, hours in
    the air and money are sums, and the selectors cut capacity and rollups at ``now``)."""
    zone = report_zone()
    # An hour earlier than the window's start: selectors approximate a zone with a
    # half-hour offset to the hour, and their first midnight must not fall after the start.
    start = (window.start - cm.ONE_HOUR).astimezone(zone).date()
    end = window.end.astimezone(zone).date() + dt.timedelta(days=1)
    upto_end = _rows_until(start, end, window.end)
    upto_start = _rows_until(start, end, window.start) if upto_end else {}
    out: dict[str, ScopeFigures] = {}
    for key, row in upto_end.items():
        before = upto_start.get(key)
        out[key] = ScopeFigures(
            label=row.name,
            capacity_hours=row.capacity_hours - (before.capacity_hours if before else 0.0),
            air_hours=row.air_hours - (before.air_hours if before else 0.0),
            idle_cost=row.idle_cost - (before.idle_cost if before else Decimal(0)),
            total_cost=row.total_cost - (before.total_cost if before else Decimal(0)),
        )
    return out


def scope_figures(*, window: Window, scope: Scope) -> ScopeFigures | None:
    """The scope's figures over the window; None when the scope had no GPU in it."""
    found = _memo(("scopes", window), lambda: _window_figures(window))
    return found.get(str(scope))


# --- a GPU's hours from its rollups ----------------------------------------------------------
@dataclass(frozen=True)
class GpuHours:
    subject: str
    label: str
    held_hours: Decimal
    parked_hours: Decimal
    throttled_hours: Decimal
    observed_hours: Decimal


@dataclass(frozen=True)
class _Directory:
    gpus: dict[int, tuple[str, str]]  # id → (uuid, "host#index")
    gpu_ids: dict[str, int]  # uuid → id
    pools: dict[str, int]
    teams: dict[str, int]
    sites: dict[str, int]


def _directory_load() -> _Directory:
    gpus: dict[int, tuple[str, str]] = {}
    for pk, uuid, index, hostname in Gpu.objects.values_list(
        "id", "uuid", "index", "node__hostname"
    ):
        gpus[pk] = (uuid, f"{hostname}#{index}" if index is not None else hostname)
    return _Directory(
        gpus=gpus,
        gpu_ids={uuid: pk for pk, (uuid, _) in gpus.items()},
        pools=dict(Pool.objects.values_list("name", "id")),
        teams=dict(Team.objects.values_list("name", "id")),
        sites=dict(Site.objects.values_list("name", "id")),
    )


def _directory() -> _Directory:
    return _memo("directory", _directory_load)


_HOUR_SUMS = {
    "held_s": Sum("held_s"),
    "parked_s": Sum("parked_s"),
    "throttled_s": Sum("throttle_any_s"),
    "observed_s": Sum("observed_s"),
}


def _gpu_hour_rows(window: Window) -> list[dict[str, Any]]:
    # The window's rollups summed per GPU and stored attribution: one GROUP BY over the
    # hour index, whatever the number of rules that read it.
    rows = (
        HourlyUsage.objects.filter(hour__gte=window.start, hour__lt=window.end)
        .order_by()
        .values("gpu_id", "pool_id", "team_id", "site_id")
        .annotate(**_HOUR_SUMS)
    )
    return [dict(row) for row in rows]


def _attribution_match(scope: Scope, directory: _Directory) -> Callable[[dict[str, Any]], bool]:
    """Whether a row (ids of GPU, pool, team, site) lies in the scope; names the scope gives
    that do not exist match nothing."""
    if scope.kind == "fleet":
        return lambda row: True
    if scope.kind == "gpu":
        wanted = directory.gpu_ids.get(scope.name, -1)
        return lambda row: bool(row["gpu_id"] == wanted)
    ids = {"pool": directory.pools, "team": directory.teams, "site": directory.sites}[scope.kind]
    wanted = ids.get(scope.name, -1)
    column = f"{scope.kind}_id"
    return lambda row: bool(row[column] == wanted)


def gpu_hours(*, window: Window, scope: Scope) -> list[GpuHours]:
    """Each GPU's hours in the window, counting only its hours attributed to the scope."""
    rows = _memo(("gpu_hours", window), lambda: _gpu_hour_rows(window))
    directory = _directory()
    inside = _attribution_match(scope, directory)
    sums: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_HOUR_SUMS, 0.0))
    for row in rows:
        if inside(row):
            acc = sums[row["gpu_id"]]
            for name in _HOUR_SUMS:
                acc[name] += float(row[name] or 0)
    out = []
    for gpu_id, acc in sums.items():
        uuid, label = directory.gpus.get(gpu_id, (str(gpu_id), str(gpu_id)))
        out.append(
            GpuHours(
                subject=f"gpu:{uuid}",
                label=label,
                held_hours=cm.hours_from_seconds(seconds=acc["held_s"]),
                parked_hours=cm.hours_from_seconds(seconds=acc["parked_s"]),
                throttled_hours=cm.hours_from_seconds(seconds=acc["throttled_s"]),
                observed_hours=cm.hours_from_seconds(seconds=acc["observed_s"]),
            )
        )
    out.sort(key=lambda g: g.subject)
    return out


# --- a GPU's silence -------------------------------------------------------------------------
@dataclass(frozen=True)
class SilentGpu:
    subject: str
    label: str
    silent_s: float  # since its last sample ended (or since it entered service, if never)
    last_seen_at: dt.datetime | None


def _gpus_now(now: dt.datetime) -> list[dict[str, Any]]:
    from django.db.models.functions import Coalesce

    # Attribution as the selectors give offline hours: the GPU's current node, pool, team
    # (its own over its pool's) and site (its node's over its pool's).
    rows = (
        Gpu.objects.filter(Q(retired_at__isnull=True) | Q(retired_at__gt=now))
        .annotate(
            now_team=Coalesce("team_id", "node__pool__team_id"),
            now_site=Coalesce("node__site_id", "node__pool__site_id"),
        )
        .order_by("uuid")
        .values_list(
            "id",
            "uuid",
            "index",
            "node__hostname",
            "in_service_at",
            "first_seen_at",
            "last_seen_at",
            "node__pool_id",
            "now_team",
            "now_site",
        )
    )
    keys = (
        *("gpu_id", "uuid", "index", "hostname", "in_service_at", "first_seen_at"),
        *("last_seen_at", "pool_id", "team_id", "site_id"),
    )
    return [dict(zip(keys, row, strict=True)) for row in rows]


def gpus_in_service(*, now: dt.datetime, scope: Scope) -> list[SilentGpu]:
    """GPUs in service at ``now`` in the scope (current attribution), with their silence.

    In service as DESIGN.md §3 counts capacity: from ``in_service`` (or the first sample) to
    ``retired``. A GPU that never reported counts from its ``in_service`` date."""
    rows = _memo(("gpus_now", now), lambda: _gpus_now(now))
    inside = _attribution_match(scope, _directory())
    out = []
    for row in rows:
        started = row["in_service_at"] or row["first_seen_at"]
        if started is None or started > now or not inside(row):
            continue
        last = row["last_seen_at"] or started
        hostname = row["hostname"]
        label = f"{hostname}#{row['index']}" if row["index"] is not None else hostname
        out.append(
            SilentGpu(
                subject=f"gpu:{row['uuid']}",
                label=label,
                silent_s=max(0.0, (now - max(last, started)).total_seconds()),
                last_seen_at=row["last_seen_at"],
            )
        )
    return out
