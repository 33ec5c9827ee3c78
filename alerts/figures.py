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
from telemetry.models import HourlyUsage, Workload, WorkloadHourlyUsage

if TYPE_CHECKING:
    from alerts.rules import Scope, Window

T = TypeVar("T")
_MEMO: ContextVar[dict[Any, Any] | None] = ContextVar("alerts_figures_memo", default=None)


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
    """A scope over a window: the sums the rules compare (docs/metrics.md)."""

    label: str
    capacity_hours: float
    air_hours: float
    idle_cost: Decimal
    total_cost: Decimal

    @property
    def utilization(self) -> float | None:
        return self.air_hours / self.capacity_hours if self.capacity_hours > 0 else None

    def __sub__(self, before: ScopeFigures | None) -> ScopeFigures:
        if before is None:
            return self
        return ScopeFigures(
            label=self.label,
            capacity_hours=self.capacity_hours - before.capacity_hours,
            air_hours=self.air_hours - before.air_hours,
            idle_cost=self.idle_cost - before.idle_cost,
            total_cost=self.total_cost - before.total_cost,
        )


def _figures(row: selectors.CostRow, label: str | None = None) -> ScopeFigures:
    return ScopeFigures(
        label=row.name if label is None else label,
        capacity_hours=row.capacity_hours,
        air_hours=row.air_hours,
        idle_cost=row.idle_cost,
        total_cost=row.total_cost,
    )


def _rows_until(
    start: dt.date, end: dt.date, now: dt.datetime, groups: set[str]
) -> dict[str, ScopeFigures]:
    """The figures of ``groups`` over [local midnight of ``start``, ``now``), keyed like a
    scope. The fleet asked for beside another grouping is the sum of that grouping's rows,
    the unassigned one included (each GPU-hour is in exactly one row of a grouping): one pass
    of the selectors over the GPUs fewer."""
    wanted = groups - {"fleet"} if len(groups) > 1 else groups
    grouped = selectors.cost_rows_by(start=start, end=end, group_bys=tuple(sorted(wanted)), now=now)
    out: dict[str, ScopeFigures] = {}
    for group_by, rows in grouped.items():
        for row in rows:
            if group_by == "fleet":
                out["fleet"] = _figures(row)
            elif row.key != selectors.UNASSIGNED_NAME:
                out[f"{group_by}:{row.key}"] = _figures(row)
    if "fleet" in groups and "fleet" not in wanted and grouped:
        rows = next(iter(grouped.values()))
        if rows:
            out["fleet"] = ScopeFigures(
                label="Fleet",
                capacity_hours=sum(r.capacity_hours for r in rows),
                air_hours=sum(r.air_hours for r in rows),
                idle_cost=sum((r.idle_cost for r in rows), Decimal(0)),
                total_cost=sum((r.total_cost for r in rows), Decimal(0)),
            )
    return out


def _whole_hours(zone: ZoneInfo, moment: dt.datetime) -> bool:
    offset = zone.utcoffset(moment.replace(tzinfo=None))
    return offset is not None and offset.total_seconds() % 3600 == 0


def _first_day(window: Window, zone: ZoneInfo) -> dt.date:
    """The report day the selectors must start on so their first midnight is not after the
    window's start: its own day, or the day before where the zone's offset is not whole hours
    (the selectors then round the zone to the hour)."""
    if _whole_hours(zone, window.start):
        return window.start.astimezone(zone).date()
    return (window.start - cm.ONE_HOUR).astimezone(zone).date()


def _windows_figures(plan: dict[Window, set[str]]) -> dict[Window, dict[str, ScopeFigures]]:
    """Every planned window's scopes from as few computations of the selectors as the windows
    allow. The selectors count whole days of the report time zone and cut capacity and
    rollups at ``now``; every figure compared here is a sum (capacity, hours in the air,
    money), so a window of hours is the figures up to its end less those up to its start,
    both counted from one common first day. Windows ending together (all of one evaluation)
    share the computation up to their end; each needs one more up to its start, unless it
    starts on that first midnight (a month to date, usually)."""
    zone = report_zone()
    out: dict[Window, dict[str, ScopeFigures]] = {}
    by_end: dict[dt.datetime, list[Window]] = defaultdict(list)
    for window in plan:
        by_end[window.end].append(window)
    for end, windows in by_end.items():
        first = min(_first_day(w, zone) for w in windows)
        midnight = dt.datetime.combine(first, dt.time(), tzinfo=zone).astimezone(dt.UTC)
        last = end.astimezone(zone).date() + dt.timedelta(days=1)
        groups = set().union(*(plan[w] for w in windows))
        upto_end = _rows_until(first, last, end, groups)
        for window in windows:
            before: dict[str, ScopeFigures] = {}
            if upto_end and not (window.start == midnight and _whole_hours(zone, midnight)):
                before = _rows_until(first, last, window.start, plan[window])
            out[window] = {
                key: figures - before.get(key)
                for key, figures in upto_end.items()
                if key.partition(":")[0] in plan[window]
            }
    return out


def scope_plan(*, window: Window, scope: Scope) -> None:
    """Announce that a rule will read ``scope`` over ``window`` (``RuleKind.plan``): inside
    ``memo()``, the first read then computes every announced window together."""
    memo = _MEMO.get()
    if memo is not None:
        memo.setdefault("scope_plan", {}).setdefault(window, set()).add(scope.kind)


def scope_figures(*, window: Window, scope: Scope) -> ScopeFigures | None:
    """The scope's figures over the window; None when the scope had no GPU in it."""
    memo = _MEMO.get()
    if memo is None:
        return _windows_figures({window: {scope.kind}})[window].get(str(scope))
    table: dict[Window, dict[str, ScopeFigures]] = memo.setdefault("scope_table", {})
    done: dict[Window, set[str]] = memo.setdefault("scope_done", {})
    if scope.kind not in done.get(window, set()):
        plan: dict[Window, set[str]] = memo.get("scope_plan", {})
        wanted = {w: groups - done.get(w, set()) for w, groups in plan.items()}
        wanted = {w: groups for w, groups in wanted.items() if groups}
        wanted.setdefault(window, set()).add(scope.kind)
        for w, found in _windows_figures(wanted).items():
            table.setdefault(w, {}).update(found)
            done.setdefault(w, set()).update(wanted[w])
    return table[window].get(str(scope))


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
    silent_since: dt.datetime  # the moment its silence began: now − silent_s


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

    In service as docs/metrics.md counts capacity: from ``in_service`` (or the first sample) to
    ``retired``. A GPU that never reported counts from its ``in_service`` date."""
    rows = _memo(("gpus_now", now), lambda: _gpus_now(now))
    inside = _attribution_match(scope, _directory())
    out = []
    for row in rows:
        started = row["in_service_at"] or row["first_seen_at"]
        if started is None or started > now or not inside(row):
            continue
        silent_since = min(now, max(row["last_seen_at"] or started, started))
        hostname = row["hostname"]
        label = f"{hostname}#{row['index']}" if row["index"] is not None else hostname
        out.append(
            SilentGpu(
                subject=f"gpu:{row['uuid']}",
                label=label,
                silent_s=(now - silent_since).total_seconds(),
                last_seen_at=row["last_seen_at"],
                silent_since=silent_since,
            )
        )
    return out


# --- a workload's held hours from its rollups ------------------------------------------------
@dataclass(frozen=True)
class WorkloadHeld:
    subject: str  # workload:PK
    label: str  # "slurm 48213 · alice · train-llm"
    user: str
    gpu_hours: Decimal
    held_hours: Decimal


def workload_label(kind: str, key: str, user: str, name: str) -> str:
    return " · ".join(part for part in (f"{kind} {key}", user, name) if part)


def _workload_hour_rows(window: Window) -> list[dict[str, Any]]:
    rows = (
        WorkloadHourlyUsage.objects.filter(hour__gte=window.start, hour__lt=window.end)
        .order_by()
        .values("workload_id", "gpu_id", "pool_id", "team_id", "site_id")
        .annotate(gpu_s=Sum("gpu_s"), air_s=Sum("air_s"))
    )
    return [dict(row) for row in rows]


def workloads_held(*, window: Window, scope: Scope) -> list[WorkloadHeld]:
    """Each workload's GPU hours and held hours (GPU hours − air hours, docs/metrics.md,
    "Workloads") in the window, counting only its hours on GPUs attributed to the scope."""
    rows = _memo(("workload_hours", window), lambda: _workload_hour_rows(window))
    inside = _attribution_match(scope, _directory())
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        if inside(row):
            acc = sums[row["workload_id"]]
            acc[0] += float(row["gpu_s"] or 0)
            acc[1] += float(row["air_s"] or 0)
    names = {
        w["id"]: w
        for w in Workload.objects.filter(pk__in=list(sums)).values(
            "id", "kind", "key", "user_name", "name"
        )
    }
    out = []
    for pk, (gpu_s, air_s) in sorted(sums.items()):
        w = names.get(pk)
        if w is None:
            continue
        out.append(
            WorkloadHeld(
                subject=f"workload:{pk}",
                label=workload_label(w["kind"], w["key"], w["user_name"], w["name"]),
                user=w["user_name"],
                gpu_hours=cm.hours_from_seconds(seconds=gpu_s),
                held_hours=cm.hours_from_seconds(seconds=max(gpu_s - air_s, 0.0)),
            )
        )
    return out


@dataclass(frozen=True)
class WorkloadWindow:
    kind: str
    key: str
    user: str
    name: str
    gpu_hours: Decimal
    idle_cost: Decimal | None


def workload_window(*, workload_id: int, window: Window) -> WorkloadWindow | None:
    """One workload over an alert's window: who it is, its GPU hours and its idle cost, from
    the Workloads page's figures (``billing.workloads``) over the window's whole hours."""
    from billing.workloads import WorkloadFilters, workload_figures

    found = Workload.objects.filter(pk=workload_id).first()
    if found is None:
        return None
    rows = workload_figures(
        start=window.start,  # aware datetimes: the whole hours of the window
        end=window.end,
        filters=WorkloadFilters(workloads=(workload_id,)),
    )
    row = rows[0] if rows else None
    return WorkloadWindow(
        kind=found.kind,
        key=found.key,
        user=found.user_name,
        name=found.name,
        gpu_hours=cm.to_decimal(row.gpu_hours) if row is not None else Decimal(0),
        idle_cost=row.idle_cost if row is not None and row.priced else None,
    )


@dataclass(frozen=True)
class PartitionWaited:
    """A partition's GPU hours waited for capacity in a window (DESIGN.md §9.2)."""

    subject: str  # partition:CLUSTER/NAME
    label: str
    waited_gpu_hours: Decimal


def partitions_waited(*, window: Window, scope: Scope) -> list[PartitionWaited]:
    """Each partition's capacity-waited GPU hours in the window (``telemetry.queue_figures``:
    jobs pending on Resources, Priority or ReqNodeNotAvail; the UTC hours that start in it),
    for the partitions whose pools (``[[partitions]]``) are in the scope; the fleet scope
    takes every partition, mapped to pools or not."""
    from telemetry.queue_figures import partition_pools, queue_rows

    rows = _memo(
        ("queue_partitions", window),
        lambda: queue_rows(start=window.start, end=window.end, group_by="partition"),
    )
    if scope.kind == "fleet":
        inside: Callable[[tuple[str, str]], bool] = lambda key: True  # noqa: E731
    else:
        pools = Pool.objects.filter(
            **({"name": scope.name} if scope.kind == "pool" else {"site__name": scope.name})
        )
        wanted = set(pools.values_list("pk", flat=True))
        by_partition = partition_pools()

        def inside(key: tuple[str, str]) -> bool:
            return bool(wanted.intersection(by_partition.get(key, ())))

    out = []
    for row in rows:
        key = (row["cluster"], row["key"])
        if row["waited_gpu_hours_capacity"] and inside(key):
            out.append(
                PartitionWaited(
                    subject=f"partition:{key[0]}/{key[1]}",
                    label=f"{key[1]} ({key[0]})",
                    waited_gpu_hours=cm.to_decimal(row["waited_gpu_hours_capacity"]),
                )
            )
    return out
