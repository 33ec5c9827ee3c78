"""The Celery tasks of telemetry: declared defensively, retried only on transient errors, and
retention never takes rollups with it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from celery.exceptions import Retry
from django.db import IntegrityError, OperationalError

from telemetry.models import HourlyUsage, Sample
from telemetry.pending import hours_mark
from telemetry.rollup import RollupResult, rollup_run
from telemetry.tasks import partitions_maintain_task, retention_apply_task, rollup_task
from tests.telemetry.conftest import rollup_rows, sample, samples_ingest


def test_tasks_are_declared_defensively_and_match_the_beat_schedule() -> None:
    from config.celery import app

    scheduled = {e["task"] for e in app.conf.beat_schedule.values()}
    for task in (rollup_task, partitions_maintain_task, retention_apply_task):
        assert task.name in scheduled
        assert task.name in app.tasks  # registered with the app the workers run
        assert task.acks_late and task.reject_on_worker_lost and task.expires
        assert OperationalError in task.autoretry_for
        assert Exception not in task.autoretry_for and IntegrityError not in task.autoretry_for
        assert task.retry_backoff and task.max_retries


def test_rollup_task_retries_transient_errors_only(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []

    def fine(**kwargs: Any) -> RollupResult:
        calls.append(kwargs["wait"])
        return RollupResult(hours=3)

    def flaky(**kwargs: Any) -> RollupResult:
        raise OperationalError("server closed the connection unexpectedly")

    def broken(**kwargs: Any) -> RollupResult:
        raise ValueError("a bug, not a hiccup")

    monkeypatch.setattr("telemetry.rollup.rollup_run", fine)
    assert rollup_task.apply().get()["hours"] == 3
    assert calls == [False]  # the periodic task never queues behind a running rollup
    # Eager mode raises the retry it would schedule, rather than sleeping through the backoff.
    monkeypatch.setattr("telemetry.rollup.rollup_run", flaky)
    with pytest.raises(Retry):
        rollup_task.apply()
    monkeypatch.setattr("telemetry.rollup.rollup_run", broken)
    with pytest.raises(ValueError):
        rollup_task.apply()


@pytest.mark.django_db
def test_retention_drops_raw_samples_never_rollups(
    make_gpu: Any, t0: dt.datetime, settings: Any
) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0 + i * dt.timedelta(minutes=20), util=40) for i in range(6)])
    rollup_run()
    before = rollup_rows()
    assert len(before) == 2
    assert isinstance(partitions_maintain_task(), list)

    settings.RAW_RETENTION_DAYS = 1  # t0 is three days ago: past retention now
    assert retention_apply_task() == 6
    assert not Sample.objects.exists()
    assert rollup_rows() == before
    # Re-marking those hours (a GPU's dates changed, a backfill) must not erase them either.
    hours_mark([t0, t0 + dt.timedelta(hours=1)])
    result = rollup_run()
    assert (result.skipped_hours, result.deleted) == (2, 0)
    assert rollup_rows() == before and HourlyUsage.objects.count() == 2
