"""Celery tasks of telemetry: thin wrappers that call the services (HackSoft style).

Declared defensively (PostHog style): ``acks_late`` with ``reject_on_worker_lost`` so a worker
killed mid-task leaves the message to be redelivered; ``expires`` so a backlog of periodic runs
is dropped rather than run one after another; retries only on transient database errors (a
connection lost, a lock timeout, SQLite busy), with exponential backoff and jitter. Everything
else is a bug and fails loudly. Each task is idempotent, so a redelivery or a retry is harmless.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

# Transient: the database went away or was busy. Not IntegrityError/ProgrammingError (bugs).
TRANSIENT_ERRORS = (OperationalError, InterfaceError)

_DEFENSIVE: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": TRANSIENT_ERRORS,
    "retry_backoff": 5,  # 5 s, 10 s, 20 s … (jittered)
    "retry_backoff_max": 300,
    "retry_jitter": True,
    "max_retries": 5,
    "ignore_result": True,
}


@shared_task(  # type: ignore[untyped-decorator]
    name="telemetry.tasks.rollup_task", expires=55, **_DEFENSIVE
)
def rollup_task(max_hours: int | None = None) -> dict[str, Any]:
    """Roll up the marked hours (beat: every minute). Stops at once if another rollup holds
    the lock: that one is already draining the queue, and the next tick picks up the rest."""
    from telemetry.rollup import rollup_run

    return rollup_run(max_hours=max_hours, wait=False).as_dict()


@shared_task(  # type: ignore[untyped-decorator]
    name="telemetry.tasks.partitions_maintain_task", expires=3600, **_DEFENSIVE
)
def partitions_maintain_task() -> list[str]:
    """Create the raw-sample partitions ahead of time (beat: every six hours)."""
    from telemetry.partitions import partitions_maintain

    return partitions_maintain()


@shared_task(  # type: ignore[untyped-decorator]
    name="telemetry.tasks.retention_apply_task", expires=3600, **_DEFENSIVE
)
def retention_apply_task() -> int:
    """Drop raw samples past RAW_RETENTION_DAYS (beat: daily). Rollups are never deleted: the
    rollup itself leaves hours before the retention horizon as they are."""
    from telemetry.partitions import retention_apply

    return retention_apply()
