"""Queue pressure (DESIGN.md §9.2): applying a cluster's snapshot of pending GPU jobs, and the
fleet file's ``[[partitions]]``.

A snapshot is stored as changes, not rows: each job's pending stretch
(:class:`~telemetry.models.PendingStretch`) opens at the first snapshot that lists it and
closes at the first that does not, and the GPU-seconds waited are added to per-hour sums
(:class:`~telemetry.models.QueueWaitHourly`). An unchanged job costs no write at all.

The interval rule: between two snapshots of a cluster at ``t₀`` and ``t₁``, the jobs pending
at ``t₀`` (its open stretches) waited ``Δt = min(t₁ − t₀, INTERVAL_CAP_S)``, counted from
``t₀`` and split at UTC hour boundaries; the part of a longer gap (an agent down) counts
nothing. A job's stretch that the snapshot at ``t₁`` no longer lists ends at ``t₀ + Δt``.
The figures read from these tables are in ``telemetry.queue_figures``.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from fleet.identifiers import identifier_error
from fleet.models import Pool
from fleet.services import ApplyResult, FleetFileError
from telemetry import ingest_store
from telemetry.models import PendingStretch, QueueCluster, QueuePartition
from telemetry.queue_wire import PendingJob, Snapshot, snapshot_decode
from telemetry.wire import IngestError

__all__ = [
    "INTERVAL_CAP_S",
    "PUSH_INTERVAL_S",
    "QueueResult",
    "hour_segments",
    "queue_partitions_apply",
    "queue_snapshot_apply",
    "queue_snapshot_ingest",
]

# The agent's push interval, and the longest interval between two snapshots that counts:
# twice the push interval, so one lost push costs nothing and an outage counts no more than
# two minutes of waiting that nobody saw.
PUSH_INTERVAL_S = 60
INTERVAL_CAP_S = 2 * PUSH_INTERVAL_S

# What makes a job's stretch the same from one snapshot to the next: a change of any of these
# closes it and opens another (the groups of the figures, the GPUs and the reason class).
_IDENTITY = ("user", "account", "partition", "gpus", "gpu_model", "reason_class")
_STRETCH_IDENTITY = ("user_name", "account", "partition", "gpus", "gpu_model", "reason_class")


@dataclass
class QueueResult:
    """What a snapshot did: ``status`` "applied", "duplicate" (its ``at`` is the cluster's
    latest: a resend) or "stale" (older than the latest: ignored)."""

    cluster: str
    at: dt.datetime
    status: str
    pending: int = 0
    opened: int = 0
    closed: int = 0
    counted_s: float = 0.0

    def body(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "at": self.at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
            "status": self.status,
            "pending": self.pending,
            "opened": self.opened,
            "closed": self.closed,
            "counted_s": self.counted_s,
        }


# --- pure parts --------------------------------------------------------------------------------
def hour_floor(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def hour_segments(start: dt.datetime, seconds: float) -> list[tuple[dt.datetime, float]]:
    """``[start, start + seconds)`` cut at UTC hour boundaries → (hour, seconds in it)."""
    segments: list[tuple[dt.datetime, float]] = []
    moment = start.astimezone(dt.UTC)
    left = seconds
    while left > 0:
        hour = hour_floor(moment)
        room = (hour + dt.timedelta(hours=1) - moment).total_seconds()
        part = min(room, left)
        segments.append((hour, part))
        moment += dt.timedelta(seconds=part)
        left -= part
    return segments


def counted_seconds(previous: dt.datetime | None, at: dt.datetime) -> float:
    """Δt of the interval that ends at ``at``: 0 for a cluster's first snapshot."""
    if previous is None:
        return 0.0
    return min((at - previous).total_seconds(), float(INTERVAL_CAP_S))


def _job_identity(job: PendingJob) -> tuple[Any, ...]:
    return tuple(getattr(job, name) for name in _IDENTITY)


# --- the service -------------------------------------------------------------------------------
def queue_snapshot_ingest(
    *, node_id: int, payload_bytes: bytes, now: dt.datetime, token_id: int | None = None
) -> QueueResult:
    """Decode one ``POST /api/v1/queue`` body and apply it for node ``node_id``. Raises
    :class:`IngestError` (4xx, naming the field) and ``ingest_store.TokenRevoked``; a push
    refused writes nothing."""
    snapshot = snapshot_decode(payload_bytes, now=now, retention_days=settings.RAW_RETENTION_DAYS)
    return queue_snapshot_apply(node_id=node_id, snapshot=snapshot, now=now, token_id=token_id)


def _cluster_lock(*, name: str, node_id: int, now: dt.datetime) -> QueueCluster:
    """The cluster's row, created if new and locked for this transaction. The first node to
    push for a cluster owns it; a cluster without a node (new from the fleet file, or its node
    deleted) is adopted by the pushing node."""
    # Two first pushes at once: the unique name settles which row exists, then both lock it.
    QueueCluster.objects.bulk_create(
        [QueueCluster(name=name, node_id=node_id, created_at=now)], ignore_conflicts=True
    )
    cluster = QueueCluster.objects.select_for_update().get(name=name)
    if cluster.node_id is None:
        QueueCluster.objects.filter(pk=cluster.pk).update(node_id=node_id)
        cluster.node_id = node_id
    if cluster.node_id != node_id:
        raise IngestError(
            403,
            "cluster",
            f"cluster {name!r} is pushed by another node; moving it is an admin action",
        )
    return cluster


def queue_snapshot_apply(
    *, node_id: int, snapshot: Snapshot, now: dt.datetime, token_id: int | None = None
) -> QueueResult:
    """Apply one validated snapshot of node ``node_id``: count the interval since the
    cluster's previous snapshot, close the stretches of jobs no longer pending, open those of
    new jobs and of jobs whose identity changed, refresh reasons. A snapshot whose ``at`` is
    not after the cluster's latest changes nothing ("duplicate" when equal, "stale" when
    older).

    Everything happens under a row lock on the cluster: two pushes of the same cluster at
    once (a resend crossing its original, two agents by mistake) apply one after the other,
    and the second sees the first's ``last_at``, so no interval is counted twice.
    """
    at = snapshot.at
    result = QueueResult(cluster=snapshot.cluster, at=at, status="applied")
    with transaction.atomic():
        if token_id is not None and not ingest_store.token_live(token_id):
            raise ingest_store.TokenRevoked("the node token was revoked")
        cluster = _cluster_lock(name=snapshot.cluster, node_id=node_id, now=now)
        previous = cluster.last_at
        if previous is not None and at <= previous:
            result.status = "duplicate" if at == previous else "stale"
            return result
        counted = counted_seconds(previous, at)
        opened = list(
            PendingStretch.objects.filter(cluster=cluster, ended_at__isnull=True).only(
                "id",
                "kind",
                "job_id",
                *_STRETCH_IDENTITY,
                "reason",
                "submitted_at",
                "eligible_at",
                "wait_started_at",
            )
        )
        if previous is not None and counted > 0:
            _waited_add(cluster.pk, opened, start=previous, seconds=counted)
        ended_at = previous + dt.timedelta(seconds=counted) if previous is not None else at
        jobs = {job.key: job for job in snapshot.jobs}
        gone: list[int] = []
        split: list[int] = []
        refreshed: list[PendingStretch] = []
        new: list[PendingStretch] = []
        for stretch in opened:
            job = jobs.pop((stretch.kind, stretch.job_id), None)
            if job is None:
                gone.append(stretch.pk)
                continue
            if _job_identity(job) != tuple(getattr(stretch, n) for n in _STRETCH_IDENTITY):
                split.append(stretch.pk)
                new.append(_stretch_new(cluster.pk, job, at, wait_started=stretch.wait_started_at))
                continue
            if (job.reason, job.submitted, job.eligible) != (
                stretch.reason,
                stretch.submitted_at,
                stretch.eligible_at,
            ):
                stretch.reason = job.reason
                stretch.submitted_at = job.submitted
                stretch.eligible_at = job.eligible
                refreshed.append(stretch)
        new += [_stretch_new(cluster.pk, job, at, wait_started=at) for job in jobs.values()]
        # Close before opening: the next stretch of a changed job takes the open slot
        # (one open stretch per job, telemetry_pending_open).
        for ids, was_split in ((gone, False), (split, True)):
            for chunk in _chunks(ids):
                PendingStretch.objects.filter(pk__in=chunk).update(
                    ended_at=ended_at, last_seen_at=previous, split=was_split
                )
        if refreshed:
            PendingStretch.objects.bulk_update(
                refreshed, ["reason", "submitted_at", "eligible_at"], batch_size=1000
            )
        PendingStretch.objects.bulk_create(new, batch_size=2000)
        QueueCluster.objects.filter(pk=cluster.pk).update(last_at=at)
    result.pending = len(snapshot.jobs)
    result.opened = len(new)
    result.closed = len(gone) + len(split)
    result.counted_s = counted
    return result


def _chunks(ids: list[int], size: int = 5000) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _stretch_new(
    cluster_id: int, job: PendingJob, at: dt.datetime, *, wait_started: dt.datetime
) -> PendingStretch:
    return PendingStretch(
        cluster_id=cluster_id,
        kind=job.kind,
        job_id=job.job_id,
        user_name=job.user,
        account=job.account,
        partition=job.partition,
        gpus=job.gpus,
        gpu_model=job.gpu_model,
        reason_class=job.reason_class,
        reason=job.reason,
        submitted_at=job.submitted,
        eligible_at=job.eligible,
        wait_started_at=wait_started,
        first_seen_at=at,
    )


# Adds GPU-seconds to an hour's sums; the unique key makes a second snapshot in the same hour
# add to the row rather than insert another. Same syntax on PostgreSQL and SQLite.
_WAITED_UPSERT = (
    "INSERT INTO telemetry_queuewaithourly"
    " (cluster_id, hour, partition, account, user_name, reason_class, gpu_seconds)"
    " VALUES {values}"
    " ON CONFLICT (cluster_id, hour, partition, account, user_name, reason_class)"
    " DO UPDATE SET gpu_seconds = telemetry_queuewaithourly.gpu_seconds + excluded.gpu_seconds"
)


def _waited_add(
    cluster_id: int, opened: list[PendingStretch], *, start: dt.datetime, seconds: float
) -> None:
    """Add Σ gpus × the interval's seconds of the stretches open since ``start`` to the hourly
    sums of their (partition, account, user, class)."""
    gpus: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for s in opened:
        gpus[(s.partition, s.account, s.user_name, s.reason_class)] += s.gpus
    if not gpus:
        return
    adapt = connection.ops.adapt_datetimefield_value
    rows = [
        (cluster_id, adapt(hour), *key, total * part)
        for hour, part in hour_segments(start, seconds)
        for key, total in sorted(gpus.items())
    ]
    with connection.cursor() as cursor:
        for i in range(0, len(rows), 1000):
            chunk = rows[i : i + 1000]
            marks = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(_WAITED_UPSERT.format(values=marks), [v for row in chunk for v in row])


# --- the fleet file ------------------------------------------------------------------------------
def queue_partitions_apply(*, document: dict[str, Any], result: ApplyResult) -> None:
    """Make the partitions exactly the fleet file's ``[[partitions]]`` (``cluster``, ``name``,
    ``pools``: pool names), creating the clusters they name (without a node: the first node to
    push for one owns it). Runs inside ``fleet_document_apply``'s transaction, after pools;
    raises ``FleetFileError`` naming the table and field."""
    rows = document.get("partitions", [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FleetFileError("partitions: must be an array of tables ([[partitions]])")
    wanted: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows):
        where = f"partitions[{i}]"
        for field_name in ("cluster", "name"):
            if not row.get(field_name):
                raise FleetFileError(f"{where}.{field_name}: required")
            error = identifier_error(row[field_name], max_length=100)
            if error is not None:
                raise FleetFileError(f"{where}.{field_name}: {error}")
        pools = row.get("pools", [])
        if not isinstance(pools, list) or not all(isinstance(p, str) for p in pools):
            raise FleetFileError(f"{where}.pools: must be a list of pool names")
        pool_ids: list[int] = []
        for j, name in enumerate(pools):
            pool_id = Pool.objects.filter(name=name).values_list("pk", flat=True).first()
            if pool_id is None:
                raise FleetFileError(f"{where}.pools[{j}]: no pool named {name!r}")
            pool_ids.append(pool_id)
        key = (row["cluster"], row["name"])
        if key in wanted:
            raise FleetFileError(f"{where}.name: partition {key[1]!r} of {key[0]!r} listed twice")
        wanted[key] = pool_ids
    now = dt.datetime.now(dt.UTC)
    clusters = {c for c, _ in wanted}
    QueueCluster.objects.bulk_create(
        [QueueCluster(name=c, created_at=now) for c in sorted(clusters)], ignore_conflicts=True
    )
    ids = dict(QueueCluster.objects.filter(name__in=clusters).values_list("name", "pk"))
    existing = {
        (p.cluster.name, p.name): p for p in QueuePartition.objects.select_related("cluster")
    }
    removed = 0
    for key, old in existing.items():
        if key not in wanted:
            old.delete()
            removed += 1
    if removed:
        result.updated["partitions_removed"] = removed
    changed = 0
    for key, pool_ids in wanted.items():
        partition = existing.get(key)
        if partition is None:
            partition = QueuePartition.objects.create(cluster_id=ids[key[0]], name=key[1])
            result.count("partitions", True, False)
        elif set(partition.pools.values_list("pk", flat=True)) == set(pool_ids):
            continue
        else:
            changed += 1
        partition.pools.set(pool_ids)
    if changed:
        result.updated["partitions"] = result.updated.get("partitions", 0) + changed
