"""The Celery app and its beat schedule (kept in code so it is reviewed like code)."""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpufleet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

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
    # The task itself decides whether this hour is the configured weekday and hour in the
    # report time zone, and a compare-and-swap makes sure each week goes out once.
    "weekly-report": {
        "task": "billing.tasks.weekly_report_task",
        "schedule": crontab(minute=5),
        "options": {"expires": 3000},
    },
}
