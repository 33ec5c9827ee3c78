"""The Celery app and its beat schedule (kept in code so it is reviewed like code)."""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab
from kombu.entity import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Imported for its signal handlers: a worker that stops taking tasks exits (config/watchdog.py).
from config import watchdog  # noqa: E402, F401

app = Celery("gpufleet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Queues by kind of work, so that a deployment can give each its own workers (docs/deploy.md,
# "Sizing"): rollups (and the partition maintenance beside them), the weekly report, alerts.
# A worker started without -Q consumes every queue listed here; one started with
# `-Q rollups` only that one. Two workers may both take rollups: the rollup's advisory lock
# keeps them from computing the same hours at once (telemetry.rollup).
QUEUES = {"rollups": "telemetry.tasks.*", "reports": "billing.tasks.*", "alerts": "alerts.tasks.*"}
app.conf.task_default_queue = "celery"
app.conf.task_queues = [
    Queue(name, Exchange(name), routing_key=name)  # type: ignore[no-untyped-call]
    for name in ("celery", *QUEUES)
]
app.conf.task_routes = {pattern: {"queue": name} for name, pattern in QUEUES.items()}

app.conf.beat_schedule = {
    # Late data re-rolls its hours, so a minute's cadence keeps the dashboard current.
    "rollup": {"task": "telemetry.tasks.rollup_task", "schedule": 60.0, "options": {"expires": 55}},
    "partitions": {
        "task": "telemetry.tasks.partitions_maintain_task",
        "schedule": crontab(minute=17, hour="*/6"),
        "options": {"expires": 3600},
    },
    "retention": {
        "task": "telemetry.tasks.retention_apply_task",
        "schedule": crontab(minute=27, hour=3),
        "options": {"expires": 3600},
    },
    # Alert rules (docs/alerts.md); each notice is its own task. Settled in the database, so
    # an evaluation that overlaps the previous one notifies nothing twice.
    "alerts-evaluate": {
        "task": "alerts.tasks.alerts_evaluate_task",
        "schedule": 300.0,
        "options": {"expires": 280},
    },
    # The task itself decides whether this hour is the configured weekday and hour in the
    # report time zone, and a compare-and-swap makes sure each week goes out once.
    "weekly-report": {
        "task": "billing.tasks.weekly_report_task",
        "schedule": crontab(minute=5),
        "options": {"expires": 3000},
    },
    # Late data for closed months, booked when it is written (DESIGN.md §9.1): the months
    # marked stale since the last run (billing.month_close.adjust_closed).
    "adjust-closed": {
        "task": "billing.tasks.adjust_closed_task",
        "schedule": 300.0,
        "options": {"expires": 280},
    },
    # Beside it, each workload user's digest of last week (alerts.digest), once per user.
    "digests": {
        "task": "alerts.tasks.digests_task",
        "schedule": crontab(minute=10),
        "options": {"expires": 3000},
    },
}


def worker_argv(*, queue: str, name: str, pool: str = "solo", concurrency: int = 1) -> list[str]:
    """The command line of one Celery worker on ``queue`` (several: comma-separated), as the
    fault tests and the soak start it: without gossip, mingle and heartbeat, which only slow a
    lone worker's start."""
    import sys

    argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queue, "-P", pool]
    if pool != "solo":
        argv += ["-c", str(concurrency)]
    return argv + [
        "-n",
        name,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "INFO",
    ]
