"""Celery tasks of alerts: thin wrappers over ``alerts.services`` (HackSoft style).

Declared defensively (PostHog style): ``acks_late`` with ``reject_on_worker_lost``, so a worker
killed mid-task leaves the message to be redelivered. A redelivery, a retry or a second beat
is harmless: the evaluation settles every notice with a compare-and-swap, and a delivery is
sent only by the sender holding its lease.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError


@shared_task(  # type: ignore[untyped-decorator]
    name="alerts.tasks.alerts_evaluate_task",
    acks_late=True,
    reject_on_worker_lost=True,
    expires=280,  # beat sends one every 5 minutes: a backlog is dropped, not replayed
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=15,
    retry_backoff_max=120,
    max_retries=3,
    ignore_result=True,
)
def alerts_evaluate_task() -> str:
    """Beat: every 5 minutes. Evaluates every rule and hands out the notices."""
    from alerts.services import alerts_evaluate

    return alerts_evaluate().summary()


@shared_task(  # type: ignore[untyped-decorator]
    bind=True,
    name="alerts.tasks.delivery_task",
    acks_late=True,
    reject_on_worker_lost=True,
    # Bounded by the delivery itself: it stops retrying an hour after the notice.
    max_retries=None,
    ignore_result=True,
)
def delivery_task(self: Any, delivery_id: int) -> str:
    """One attempt at one notice (email or webhook); schedules the next one with backoff.
    Without a broker (eager) it attempts once and leaves the retries to the sweep."""
    from alerts.services import delivery_attempt

    try:
        outcome = delivery_attempt(delivery_id=delivery_id)
    except (OperationalError, InterfaceError) as exc:
        if self.request.is_eager:
            raise
        raise self.retry(exc=exc, countdown=60, max_retries=60) from exc
    if outcome.retry_in is not None and not self.request.is_eager:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.status


@shared_task(  # type: ignore[untyped-decorator]
    name="alerts.tasks.digests_task",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=60,
    max_retries=3,
    ignore_result=True,
)
def digests_task() -> str:
    """Beat: hourly. Last week's digests per workload user once the weekly report is due;
    each (week, user) is claimed, so reruns and retries send nothing twice."""
    from alerts.digest import digests_send_due

    return digests_send_due()
