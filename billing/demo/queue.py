"""The demo's Slurm queue (DESIGN.md §9.2): what a queue collector on cluster ``hpc`` would
have pushed, as snapshots for ``telemetry.queue.queue_snapshot_apply``.

Every day from 08:00 to 18:00 UTC the ``h100`` partition (the fleet file's ``[[partitions]]``:
pools llm-training and cloud-burst) has jobs waiting: alice's 8-GPU training job on
``Resources`` all ten hours and bob's 4-GPU job on ``Priority`` from 10:00 to 14:00 (capacity:
more GPUs would start them), carol's 2-GPU job held by her QOS (policy) and dave's 1-GPU job
waiting on a dependency from 12:00 (user). Meanwhile the rented cloud-burst pool's GPUs sit
held by one job that computes on one of its eight: the overview says what that cost.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from telemetry.queue import INTERVAL_CAP_S
from telemetry.queue_wire import PendingJob, Snapshot

CLUSTER = "hpc"
PARTITION = "h100"
# Snapshots as the collector pushes them: a minute apart would count the same, at twice
# the pushes; INTERVAL_CAP_S apart is the sparsest spacing that still counts every second.
STEP = dt.timedelta(seconds=INTERVAL_CAP_S)
OPEN, CLOSE = 8, 18  # the hours of the day (UTC) jobs wait in

# (job id offset, user, account, GPUs, reason, class, from hour, to hour)
JOBS = (
    (0, "alice", "nlp", 8, "Resources", "capacity", 8, 18),
    (1, "bob", "vision", 4, "Priority", "capacity", 10, 14),
    (2, "carol", "nlp", 2, "QOSMaxGRESPerUser", "policy", 8, 18),
    (3, "dave", "speech", 1, "Dependency", "user", 12, 18),
)


def _pending(day: dt.date, index: int, at: dt.datetime) -> list[PendingJob]:
    base = 40_000 + index * 10  # a new job id every day, as a real queue has
    return [
        PendingJob(
            kind="slurm",
            job_id=str(base + offset),
            user=user,
            account=account,
            partition=PARTITION,
            gpus=gpus,
            gpu_model="h100",
            reason_class=cls,
            reason=reason,
            submitted=dt.datetime.combine(day, dt.time(OPEN), tzinfo=dt.UTC),
            eligible=None,
        )
        for offset, user, account, gpus, reason, cls, since, until in JOBS
        if since <= at.hour < until
    ]


def queue_snapshots(start: dt.datetime, end: dt.datetime) -> Iterator[Snapshot]:
    """The snapshots of the days that start in ``[start, end)``, in order, each day's
    waiting hours only (a snapshot with nothing pending ends the day's stretches); none at
    or after ``end``."""
    day = start.astimezone(dt.UTC).date()
    index = 0
    while True:
        at = dt.datetime.combine(day, dt.time(OPEN), tzinfo=dt.UTC)
        close = at.replace(hour=CLOSE)
        if at >= end:
            return
        if at >= start:
            while at < min(close, end):
                yield Snapshot(CLUSTER, at, _pending(day, index, at))
                at += STEP
            if close < end:
                yield Snapshot(CLUSTER, close, [])
        day += dt.timedelta(days=1)
        index += 1


def snapshots_per_day() -> int:
    """How many snapshots one day has (for the progress bar)."""
    return (CLOSE - OPEN) * 3600 // INTERVAL_CAP_S + 1
