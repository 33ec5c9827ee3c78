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
  a job still pending now counts to its cluster's latest snapshot, or ``end`` if earlier).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Q, Sum

from telemetry.models import PendingStretch, QueuePartition, QueueWaitHourly

__all__ = [
    "GROUP_BYS",
    "capacity_waited_gpus_by_partition_hour",
    "partition_pools",
    "percentile",
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
    with connection.cursor() as cursor:
        cursor.execute(sql, {"start": start, "end": end})
        rows = cursor.fetchall()
    n = len(keys)
    return {tuple(r[:n]): (int(r[n]), float(r[n + 1]), float(r[n + 2])) for r in rows}


def queue_rows(*, start: dt.datetime, end: dt.datetime, group_by: str) -> list[dict[str, Any]]:
    """One row per group (``group_by``: partition, account, user or cluster), worst first
    (most waited GPU hours): ``key`` (and ``cluster`` for partitions), ``waited_gpu_hours``
    (all classes), ``waited_gpu_hours_capacity``, ``…_policy``, ``…_user``, ``jobs``,
    ``wait_p50_s``, ``wait_p95_s``. A name the agent did not know is the key ``""``."""
    if group_by not in GROUP_BYS:
        raise ValueError(f"group_by: must be one of {', '.join(GROUP_BYS)}")
    waited = _waited(start, end, group_by)
    waits = (
        waits_sql(start, end, group_by)
        if connection.vendor == "postgresql"
        else waits_python(start, end, group_by)
    )
    rows: list[dict[str, Any]] = []
    for key in set(waited) | set(waits):
        by_class = waited.get(key, dict.fromkeys(CLASSES, 0.0))
        jobs, p50, p95 = waits.get(key, (0, None, None))
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
        )
        rows.append(row)
    rows.sort(key=lambda r: (-r["waited_gpu_hours"], -r["jobs"], r.get("cluster", ""), r["key"]))
    return rows


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
