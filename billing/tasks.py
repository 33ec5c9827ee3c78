"""Celery tasks of billing: thin wrappers over ``billing.report`` and ``billing.month_close``
(HackSoft style).

Declared defensively (PostHog style): ``acks_late`` with ``reject_on_worker_lost`` so a worker
killed mid-task leaves the message to be redelivered; ``expires`` so a backlog of hourly runs
is dropped rather than replayed; retries only on transient errors (the database or the mail
server away). A retry or a redelivery is harmless: the report's compare-and-swap delivers each
week once.
"""

from __future__ import annotations

from smtplib import SMTPException

from celery import shared_task
from django.db import InterfaceError, OperationalError


@shared_task(  # type: ignore[untyped-decorator]
    name="billing.tasks.weekly_report_task",
    acks_late=True,
    reject_on_worker_lost=True,
    expires=3000,
    autoretry_for=(OperationalError, InterfaceError, SMTPException, ConnectionError, TimeoutError),
    retry_backoff=60,  # 1 min, 2 min, 4 min … (jittered), well inside the hour
    retry_backoff_max=900,
    retry_jitter=True,
    max_retries=4,
    ignore_result=True,
)
def weekly_report_task() -> str:
    """Beat: hourly. Sends last week's report once the configured weekday and hour
    (``WEEKLY_REPORT_WEEKDAY``, ``WEEKLY_REPORT_HOUR``, report time zone) have come."""
    from billing.report import weekly_report_send_due

    return weekly_report_send_due().message


@shared_task(  # type: ignore[untyped-decorator]
    name="billing.tasks.focus_export_task",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=30,
    max_retries=3,
    ignore_result=True,
)
def focus_export_task(export_id: int) -> str:
    """Builds one month's FOCUS file that finance asked for (billing.focus_exports)."""
    from billing.focus_exports import focus_export_build

    return focus_export_build(export_id=export_id)


@shared_task(  # type: ignore[untyped-decorator]
    name="billing.tasks.adjust_closed_task",
    acks_late=True,
    reject_on_worker_lost=True,
    expires=280,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=30,
    max_retries=3,
    ignore_result=True,
)
def adjust_closed_task() -> str:
    """Beat: every 5 minutes. Books the late data of the closed months marked stale
    (``billing.month_close.adjust_closed``); a row lock on each close makes an overlapping
    run book nothing twice."""
    from billing.month_close import adjust_closed

    return adjust_closed().message
