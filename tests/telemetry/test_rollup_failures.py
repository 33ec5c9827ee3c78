"""A rollup batch that fails does not block the hours after it: the bad hour fails alone,
counts a failure on its mark, and is set aside after ROLLUP_MAX_FAILURES (logged, in
/metrics and in the admin, whose action puts it back in the queue). Transient errors count
against no hour."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import DataError, OperationalError, connection

from telemetry import rollup
from telemetry.models import RollupPending, Sample
from telemetry.pending import hours_mark
from telemetry.rollup import BATCH_HOURS, rollup_run
from telemetry.selectors import rollup_lag_seconds
from tests.telemetry.conftest import rollup_rows, sample, samples_ingest

pytestmark = pytest.mark.django_db

H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)


def mark(hour: dt.datetime) -> RollupPending:
    """The mark of that hour (by failures and set-aside state: the ORM's hour lookups do not
    match the text ingest writes on SQLite)."""
    marks = [m for m in RollupPending.objects.all() if m.hour == hour]
    assert len(marks) == 1, hour
    return marks[0]


@pytest.fixture
def failing_hour(monkeypatch: pytest.MonkeyPatch) -> Callable[[dt.datetime, Exception], list[Any]]:
    """``failing_hour(hour, error)``: the rollup's statement raises ``error`` for any batch
    holding ``hour`` (on both dialects) → the batches it was called with."""

    def install(bad: dt.datetime, error: Exception) -> list[Any]:
        calls: list[Any] = []
        recompute = rollup._recompute

        def recompute_or_fail(hours: list[dt.datetime], **kwargs: Any) -> tuple[int, int]:
            calls.append(list(hours))
            if bad in hours:
                raise error
            return recompute(hours, **kwargs)

        monkeypatch.setattr(rollup, "_recompute", recompute_or_fail)
        return calls

    return install


def day_of_samples(gpu: Any, t0: dt.datetime, hours: int = BATCH_HOURS) -> None:
    samples_ingest(sample(gpu, t0 + h * H, util=10 + h, power_w=100) for h in range(hours))


def test_a_failing_hour_fails_alone_and_the_hours_after_it_are_rolled(
    make_gpu: Any, t0: dt.datetime, failing_hour: Any, settings: Any
) -> None:
    settings.ROLLUP_MAX_FAILURES = 5
    gpu = make_gpu()
    day_of_samples(gpu, t0, 2 * BATCH_HOURS)
    bad = t0 + 5 * H
    calls = failing_hour(bad, DataError("division by zero"))
    result = rollup_run()
    # The first batch failed as a whole, then went hour by hour: 23 of its hours are rolled,
    # and the second batch too.
    assert calls[0] == [t0 + h * H for h in range(BATCH_HOURS)]
    assert [len(c) for c in calls[1:]] == [1] * BATCH_HOURS + [BATCH_HOURS]
    assert (result.hours, result.failed_hours, result.set_aside_hours) == (47, 1, 0)
    assert len(rollup_rows()) == 47 and (gpu.pk, bad) not in rollup_rows()
    assert "1 hours failed (0 set aside)" in str(result)
    left = mark(bad)
    assert (left.failures, left.set_aside_at) == (1, None)
    assert left.last_error == "DataError: division by zero" and left.failed_at is not None
    assert RollupPending.objects.count() == 1


def test_after_max_failures_an_hour_is_set_aside_logged_and_passed_by(
    make_gpu: Any,
    t0: dt.datetime,
    failing_hour: Any,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.ROLLUP_MAX_FAILURES = 2
    gpu = make_gpu()
    bad = t0 + 3 * H
    samples_ingest([sample(gpu, bad, util=50)])
    calls = failing_hour(bad, DataError("value out of range: underflow"))
    with caplog.at_level(logging.WARNING, logger="telemetry.rollup"):
        first = rollup_run()
        assert (first.failed_hours, first.set_aside_hours) == (1, 0)
        assert "failed (1 of 2 before it is set aside)" in caplog.text
        samples_ingest([sample(gpu, t0 + 10 * H, util=50)])  # a later hour arrives meanwhile
        second = rollup_run()
    assert (second.hours, second.failed_hours, second.set_aside_hours) == (1, 1, 1)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert bad.isoformat() in errors[0].getMessage()
    assert "set aside after 2 failures" in errors[0].getMessage()
    assert "DataError: value out of range: underflow" in errors[0].getMessage()
    aside = mark(bad)
    assert aside.failures == 2 and aside.set_aside_at is not None

    # Passed by from now on, even when marked again: its statement is not run at all.
    hours_mark([bad])
    tried = len(calls)
    samples_ingest([sample(gpu, t0 + 11 * H, util=50)])
    third = rollup_run()
    assert (third.hours, third.failed_hours) == (1, 0) and len(calls) == tried + 1
    assert (gpu.pk, t0 + 11 * H) in rollup_rows()
    # Not waiting for a worker: no lag, while the mark stays (with its version bumped).
    assert rollup_lag_seconds() == 0.0
    assert mark(bad).version == 2 and mark(bad).set_aside_at is not None


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("server closed the connection unexpectedly"),
        OperationalError("canceling statement due to lock timeout"),
    ],
    ids=["connection", "lock-timeout"],
)
def test_transient_errors_count_against_no_hour(
    make_gpu: Any, t0: dt.datetime, failing_hour: Any, settings: Any, error: Exception
) -> None:
    settings.ROLLUP_MAX_FAILURES = 1
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0, util=50)])
    failing_hour(t0, error)
    for _ in range(3):
        with pytest.raises(OperationalError):
            rollup_run()  # raised as before: the task retries it
    left = mark(t0)
    assert (left.failures, left.set_aside_at, left.last_error) == (0, None, "")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's own errors")
def test_a_real_data_error_on_postgresql_fails_its_hour_alone(
    make_gpu: Any, t0: dt.datetime, settings: Any
) -> None:
    """No mock: a sample that makes the statement divide by zero (seconds 0, in the hour's
    mean utilisation; ingest refuses it, a row written by hand does not). On PostgreSQL an
    error aborts the whole transaction, so the rest of the batch goes on only because each
    attempt has its own savepoint."""
    settings.ROLLUP_MAX_FAILURES = 3
    gpu = make_gpu()
    day_of_samples(gpu, t0, 4)
    Sample.objects.filter(gpu=gpu, start=t0 + H).update(seconds=0)
    result = rollup_run()
    assert (result.hours, result.failed_hours) == (3, 1)
    assert set(rollup_rows()) == {(gpu.pk, t0 + h * H) for h in (0, 2, 3)}
    failed = mark(t0 + H)
    assert failed.failures == 1 and failed.last_error.startswith("DataError: division by zero")

    Sample.objects.filter(gpu=gpu, start=t0 + H).update(seconds=60)  # the cause fixed
    assert rollup_run().hours == 1 and not RollupPending.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's own lock timeout")
@pytest.mark.django_db(transaction=True)
def test_a_real_lock_timeout_counts_against_no_hour(make_gpu: Any, t0: dt.datetime) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0, util=50)])
    s = connection.settings_dict
    other = psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
    )
    try:
        # Another session holds the hourly table; the rollup's statement gives up waiting.
        other.execute("LOCK TABLE telemetry_hourlyusage IN EXCLUSIVE MODE")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            rollup_run()
    finally:
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert (mark(t0).failures, mark(t0).last_error) == (0, "")
    assert rollup_run().hours == 1 and not RollupPending.objects.exists()


def test_the_admin_puts_set_aside_hours_back_in_the_queue(
    make_gpu: Any,
    t0: dt.datetime,
    failing_hour: Any,
    settings: Any,
    admin_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.ROLLUP_MAX_FAILURES = 1
    gpu = make_gpu()
    bad, fine = t0 + 2 * H, t0 + 30 * H
    samples_ingest([sample(gpu, bad, util=50), sample(gpu, fine, util=50)])
    failing_hour(bad, DataError("boom"))
    assert rollup_run().set_aside_hours == 1
    samples_ingest([sample(gpu, fine + M, util=50)])  # a mark in the queue beside it

    page = admin_client.get("/admin/telemetry/rolluppending/?state=set_aside")
    assert page.status_code == 200
    body = page.content.decode()
    assert "DataError: boom" in body and body.count(f'name="{ACTION_CHECKBOX_NAME}"') == 1
    assert (
        admin_client.get("/admin/telemetry/rolluppending/")
        .content.decode()
        .count(f'name="{ACTION_CHECKBOX_NAME}"')
        == 2
    )

    response = admin_client.post(
        "/admin/telemetry/rolluppending/",
        {"action": "requeue", ACTION_CHECKBOX_NAME: [str(mark(bad).pk)]},
        follow=True,
    )
    assert response.status_code == 200
    assert "1 hours put back in the queue" in response.content.decode()
    again = mark(bad)
    assert (again.failures, again.set_aside_at, again.last_error) == (0, None, "")

    # Once the cause is fixed (here: the failing statement gone), the next rollup does it.
    monkeypatch.undo()
    result = rollup_run()
    assert (result.hours, result.failed_hours) == (2, 0)
    assert {(gpu.pk, bad), (gpu.pk, fine)} <= set(rollup_rows())
    assert not RollupPending.objects.exists()
