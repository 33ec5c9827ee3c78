"""The queue figures of DESIGN.md §9.2 that need no money: waited GPU hours per reason class
and the wait per job (p50, p95), grouped by partition, account, user or cluster; and the
capacity-waited GPU hours per partition and hour that ``wanted while held`` is built on.

Definitions (docs/ingest.md, "Queue"):

- **waited GPU hours**: the hourly sums of ``telemetry.queue`` (Σ gpus × Δt, Δt capped at
  two push intervals) of the UTC hours that start in ``[start, end)``;
- **jobs**: the jobs whose pending overlaps ``[start, end)``; a job is a chain of stretches
  (its identity may change while it waits), grouped by the names of its last stretch;
- **wait** of a job: from the first snapshot that listed it pending to the end of its last
  stretch (when it was gone), or to ``end`` when it was still pending then (its wait so far;
  a job still pending now counts to its cluster's latest snapshot, or ``end`` if earlier);
- **wanted while held**, per partition and UTC hour (the finest grain both sides are stored
  at: the waits as hourly sums, the GPUs as hourly rollups): min(capacity-waited GPU hours of
  the partition, held + parked GPU hours of its pools' GPUs in that hour), i.e. min(mean GPUs
  waited for, mean GPUs held or parked) × 1 h (:class:`PartitionHour`). A group other than
  the partition (account, user) takes the part of it that its own capacity wait is of the
  partition's in that hour; a cluster the sum of its partitions'. Its money is billing's
  (``billing.selectors.queue``), from the GPU hours each partition hour names.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Q, Sum

from config.replica import read_cursor
from telemetry.models import HourlyUsage, PendingStretch, QueuePartition, QueueWaitHourly

__all__ = [
    "GROUP_BYS",
    "PartitionHour",
    "QueueFigures",
    "QueueGroup",
    "capacity_waited_gpus_by_partition_hour",
    "partition_hours",
    "partition_pools",
    "percentile",
    "queue_figures",
    "queue_rows",
]

GROUP_BYS = ("partition", "account", "user", "cluster")
CLASSES = ("capacity", "policy", "user")
# The columns that make a group's key: a partition is one of its cluster's (two clusters may
# both have a "gpu" partition), so its rows also carry ``cluster``.
_WAITED_KEYS = {
    "partition": ("cluster__name", "partition"),
    "account": ("account",),
    "user": ("user_name",),
    "cluster": ("cluster__name",),
}
_WAIT_SQL_KEYS = {
    "partition": ("c.name", "s.partition"),
    "account": ("s.account",),
    "user": ("s.user_name",),
    "cluster": ("c.name",),
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0–1) with linear interpolation between closest ranks, as
    PostgreSQL's ``percentile_cont`` and numpy's default: rank ``q × (n − 1)``."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _waited(
    start: dt.datetime, end: dt.datetime, group_by: str
) -> dict[tuple[Any, ...], dict[str, float]]:
    keys = _WAITED_KEYS[group_by]
    out: dict[tuple[Any, ...], dict[str, float]] = defaultdict(lambda: dict.fromkeys(CLASSES, 0.0))
    rows = (
        QueueWaitHourly.objects.filter(hour__gte=start, hour__lt=end)
        .values(*keys, "reason_class")
        .annotate(gpu_seconds=Sum("gpu_seconds"))
        .order_by()
    )
    for row in rows:
        key = tuple(row[k] for k in keys)
        out[key][row["reason_class"]] += row["gpu_seconds"] / 3600
    return out


def _jobs_filter(start: dt.datetime, end: dt.datetime) -> Q:
    """The last stretches of the jobs whose pending overlaps ``[start, end)``."""
    return Q(split=False, wait_started_at__lt=end) & (
        Q(ended_at__isnull=True) | Q(ended_at__gt=start)
    )


def waits_python(
    start: dt.datetime, end: dt.datetime, group_by: str
) -> dict[tuple[Any, ...], tuple[int, float | None, float | None]]:
    """Per group: (jobs, p50 wait s, p95 wait s), computed here row by row (any database)."""
    keys = _WAITED_KEYS[group_by]
    waits: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    rows = PendingStretch.objects.filter(_jobs_filter(start, end)).values_list(
        *keys, "wait_started_at", "ended_at", "cluster__last_at"
    )
    for *key, started, ended, cluster_last in rows:
        gone = ended if ended is not None else cluster_last
        waits[tuple(key)].append((min(gone, end) - started).total_seconds())
    return {
        key: (len(values), percentile(values, 0.5), percentile(values, 0.95))
        for key, values in waits.items()
    }


# Per group: the jobs and their wait's p50 and p95, in one pass of PostgreSQL (the waits are
# never shipped to Python). ``{inner}`` and ``{outer}`` are made from _WAIT_SQL_KEYS, never
# from input.
_WAITS_SQL = """
SELECT {outer}, COUNT(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY w),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY w)
FROM (
    SELECT {inner}, EXTRACT(EPOCH FROM LEAST(COALESCE(s.ended_at, c.last_at), %(end)s)
                                       - s.wait_started_at)::float8 AS w
    FROM telemetry_pendingstretch AS s
    JOIN telemetry_queuecluster AS c ON c.id = s.cluster_id
    WHERE NOT s.split AND s.wait_started_at < %(end)s
      AND (s.ended_at IS NULL OR s.ended_at > %(start)s)
) AS s
GROUP BY {outer}
"""


def waits_sql(
    start: dt.datetime, end: dt.datetime, group_by: str
) -> dict[tuple[Any, ...], tuple[int, float | None, float | None]]:
    """As :func:`waits_python`, in one PostgreSQL statement."""
    keys = _WAIT_SQL_KEYS[group_by]
    inner = ", ".join(f"{k} AS k{i}" for i, k in enumerate(keys))
    outer = ", ".join(f"k{i}" for i in range(len(keys)))
    sql = _WAITS_SQL.format(inner=inner, outer=outer)
    with read_cursor() as cursor:  # the replica where pages read from one
        cursor.execute(sql, {"start": start, "end": end})
        rows = cursor.fetchall()
    n = len(keys)
    return {tuple(r[:n]): (int(r[n]), float(r[n + 1]), float(r[n + 2])) for r in rows}


PartitionHourKey = tuple[str, str, dt.datetime]  # (cluster, partition, UTC hour)


@dataclass(frozen=True)
class PartitionHour:
    """One partition of one cluster over one UTC hour in which its jobs waited for capacity:
    the GPU hours they waited (also the mean number of GPUs waited for over the hour) and the
    held + parked seconds of each GPU of the partition's pools (``[[partitions]]``; a GPU's
    pool as its hourly rollup stored it) in that hour."""

    cluster: str
    partition: str
    hour: dt.datetime
    waited_gpu_hours: float
    idle_s_by_gpu: dict[int, float] = field(default_factory=dict)

    @property
    def idle_gpu_hours(self) -> float:
        """Held + parked GPU hours of the partition's pools: the mean GPUs held or parked."""
        return sum(self.idle_s_by_gpu.values()) / 3600

    @property
    def wanted_gpu_hours(self) -> float:
        """**wanted while held**: min(GPUs waited for, GPUs held or parked) × 1 h."""
        return min(self.waited_gpu_hours, self.idle_gpu_hours)


@dataclass(frozen=True)
class QueueGroup:
    """One row of :func:`queue_rows`, and the wanted-while-held GPU hours that make its
    ``wanted_while_held_gpu_hours``, per partition hour (what billing prices)."""

    row: dict[str, Any]
    wanted: dict[PartitionHourKey, float]


@dataclass(frozen=True)
class QueueFigures:
    """The groups, worst first, and the partition hours their wanted hours come from."""

    groups: list[QueueGroup]
    partition_hours: dict[PartitionHourKey, PartitionHour]


def partition_hours(
    *, start: dt.datetime, end: dt.datetime
) -> dict[PartitionHourKey, PartitionHour]:
    """The partition hours that start in ``[start, end)`` with capacity waits
    (:func:`capacity_waited_gpus_by_partition_hour`), each with the held and parked seconds of
    its pools' GPUs (``telemetry.HourlyUsage``). A partition without a ``[[partitions]]``
    entry has no pools: nothing was held for it."""
    waited = capacity_waited_gpus_by_partition_hour(start=start, end=end)
    pools = partition_pools()
    idle: dict[tuple[int, dt.datetime], dict[int, float]] = defaultdict(dict)
    wanted_pools = {pool for key in waited for pool in pools.get(key[:2], ())}
    hours = sorted({key[2] for key in waited if pools.get(key[:2])})
    if wanted_pools and hours:
        # Only the hours with capacity waits, only the partitions' pools: the GPU hours
        # that can be wanted. held_s + parked_s is the observed time not in the air.
        rows = HourlyUsage.objects.filter(
            hour__in=hours, pool_id__in=sorted(wanted_pools)
        ).values_list("pool_id", "hour", "gpu_id", "held_s", "parked_s")
        for pool_id, hour, gpu_id, held_s, parked_s in rows:
            if held_s + parked_s > 0:
                idle[(pool_id, hour)][gpu_id] = held_s + parked_s
    out: dict[PartitionHourKey, PartitionHour] = {}
    for (cluster, partition, hour), gpu_hours in waited.items():
        by_gpu: dict[int, float] = {}
        for pool_id in pools.get((cluster, partition), ()):
            by_gpu.update(idle.get((pool_id, hour), {}))
        out[(cluster, partition, hour)] = PartitionHour(
            cluster=cluster,
            partition=partition,
            hour=hour,
            waited_gpu_hours=gpu_hours,
            idle_s_by_gpu=by_gpu,
        )
    return out


def _capacity_shares(
    start: dt.datetime, end: dt.datetime, group_by: str
) -> dict[tuple[Any, ...], dict[PartitionHourKey, float]]:
    """Per group: its capacity-waited GPU seconds per partition hour."""
    keys = _WAITED_KEYS[group_by]
    columns = list(dict.fromkeys((*keys, "cluster__name", "partition", "hour")))
    rows = (
        QueueWaitHourly.objects.filter(hour__gte=start, hour__lt=end, reason_class="capacity")
        .values(*columns)
        .annotate(gpu_seconds=Sum("gpu_seconds"))
        .order_by()
    )
    out: dict[tuple[Any, ...], dict[PartitionHourKey, float]] = defaultdict(dict)
    for row in rows:
        place = (row["cluster__name"], row["partition"], row["hour"])
        out[tuple(row[k] for k in keys)][place] = row["gpu_seconds"]
    return out


def _wanted_by_group(
    start: dt.datetime,
    end: dt.datetime,
    group_by: str,
    hours: dict[PartitionHourKey, PartitionHour],
) -> dict[tuple[Any, ...], dict[PartitionHourKey, float]]:
    """Per group: its wanted-while-held GPU hours per partition hour, the partition hour's
    wanted hours × the group's part of its capacity wait."""
    shares = _capacity_shares(start, end, group_by)
    totals: dict[PartitionHourKey, float] = defaultdict(float)
    for by_place in shares.values():
        for place, seconds in by_place.items():
            totals[place] += seconds
    out: dict[tuple[Any, ...], dict[PartitionHourKey, float]] = {}
    for key, by_place in shares.items():
        wanted = {}
        for place, seconds in by_place.items():
            found = hours.get(place)
            if found is None or totals[place] <= 0:
                continue
            hours_wanted = found.wanted_gpu_hours * seconds / totals[place]
            if hours_wanted > 0:
                wanted[place] = hours_wanted
        out[key] = wanted
    return out


def queue_figures(*, start: dt.datetime, end: dt.datetime, group_by: str) -> QueueFigures:
    """The rows of :func:`queue_rows` with the partition hours behind their wanted hours."""
    if group_by not in GROUP_BYS:
        raise ValueError(f"group_by: must be one of {', '.join(GROUP_BYS)}")
    waited = _waited(start, end, group_by)
    waits = (
        waits_sql(start, end, group_by)
        if connection.vendor == "postgresql"
        else waits_python(start, end, group_by)
    )
    hours = partition_hours(start=start, end=end)
    wanted = _wanted_by_group(start, end, group_by, hours)
    groups: list[QueueGroup] = []
    for key in set(waited) | set(waits):
        by_class = waited.get(key, dict.fromkeys(CLASSES, 0.0))
        jobs, p50, p95 = waits.get(key, (0, None, None))
        parts = wanted.get(key, {})
        row: dict[str, Any] = {"key": key[-1]}
        if group_by == "partition":
            row["cluster"] = key[0]
        row.update(
            waited_gpu_hours=sum(by_class.values()),
            waited_gpu_hours_capacity=by_class["capacity"],
            waited_gpu_hours_policy=by_class["policy"],
            waited_gpu_hours_user=by_class["user"],
            jobs=jobs,
            wait_p50_s=p50,
            wait_p95_s=p95,
            wanted_while_held_gpu_hours=sum(parts.values(), 0.0),
        )
        groups.append(QueueGroup(row=row, wanted=parts))
    groups.sort(
        key=lambda g: (
            -g.row["waited_gpu_hours"],
            -g.row["jobs"],
            g.row.get("cluster", ""),
            g.row["key"],
        )
    )
    return QueueFigures(groups=groups, partition_hours=hours)


def queue_rows(*, start: dt.datetime, end: dt.datetime, group_by: str) -> list[dict[str, Any]]:
    """One row per group (``group_by``: partition, account, user or cluster), worst first
    (most waited GPU hours): ``key`` (and ``cluster`` for partitions), ``waited_gpu_hours``
    (all classes), ``waited_gpu_hours_capacity``, ``…_policy``, ``…_user``, ``jobs``,
    ``wait_p50_s``, ``wait_p95_s``, ``wanted_while_held_gpu_hours``. A name the agent did not
    know is the key ``""``. Money: ``billing.selectors.queue.queue_cost_rows``."""
    return [g.row for g in queue_figures(start=start, end=end, group_by=group_by).groups]


def capacity_waited_gpus_by_partition_hour(
    *, start: dt.datetime, end: dt.datetime
) -> dict[tuple[str, str, dt.datetime], float]:
    """Capacity-class waited GPU hours per (cluster, partition, UTC hour) for the hours that
    start in ``[start, end)``; an hour's value is also the mean number of GPUs waited for
    over it. What ``wanted while held`` takes the minimum of, hour by hour, with the held and
    parked GPU hours of the partition's pools (:func:`partition_pools`)."""
    rows = (
        QueueWaitHourly.objects.filter(hour__gte=start, hour__lt=end, reason_class="capacity")
        .values("cluster__name", "partition", "hour")
        .annotate(gpu_seconds=Sum("gpu_seconds"))
        .order_by()
    )
    return {(r["cluster__name"], r["partition"], r["hour"]): r["gpu_seconds"] / 3600 for r in rows}


def partition_pools() -> dict[tuple[str, str], list[int]]:
    """(cluster, partition) → the ids of its pools, after the fleet file's ``[[partitions]]``."""
    out: dict[tuple[str, str], list[int]] = {}
    for p in QueuePartition.objects.select_related("cluster").prefetch_related("pools"):
        out[(p.cluster.name, p.name)] = sorted(pool.pk for pool in p.pools.all())
    return out
