"""Faults of docs/reliability.md with a real Celery worker on Redis and the PostgreSQL test
database:
two rollups at once, and a worker killed mid-rollup, both end in the rows of one clean run.

A worker is caught inside a batch by a row lock the test holds on one of that batch's marks
(:class:`MarkLocked`): the rollup computes the batch, then waits in its transaction where it
clears the batch's marks. No hook in the code, and no sleep that a slow machine outruns.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config.celery import worker_argv
from telemetry.models import HourlyUsage, RollupPending
from telemetry.pending import hours_mark
from telemetry.rollup import BATCH_HOURS, rollup_run
from tests.telemetry.conftest import rollup_rows, rows_approx_equal, sample, samples_ingest

# Transactional: the worker is another process, so the test's data must really be committed.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

TASK = "telemetry.tasks.rollup_task"
H = dt.timedelta(hours=1)


def _test_database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Worker:
    """A real ``celery -A config worker`` on its own queue, in its own process group."""

    def __init__(
        self,
        redis_url: str,
        queue: str,
        log: Path,
        *,
        pool: str = "solo",
        concurrency: int = 1,
    ) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": _test_database_url(),
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
        }
        self.log = log
        self.proc = subprocess.Popen(
            worker_argv(
                queue=queue,
                name=f"{queue}-{uuid.uuid4().hex[:6]}@%h",
                pool=pool,
                concurrency=concurrency,
            ),
            cwd=settings.BASE_DIR,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a kill reaches the pool's children too
        )
        self.wait_for(lambda: "ready." in self.output(), "worker ready", timeout=40)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited while waiting for {what}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.output()[-3000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


class MarkLocked:
    """A row lock on one rollup mark, held by the test's own connection until ``release``.

    A rollup whose batch holds that hour computes the batch and then waits, inside the batch's
    transaction and holding the rollup lock, for this lock where it clears the batch's marks.
    """

    def __init__(self, hour: dt.datetime) -> None:
        self.conn = psycopg.connect(_test_database_url())
        row = self.conn.execute(
            "SELECT hour FROM telemetry_rolluppending WHERE hour = %s FOR UPDATE", [hour]
        ).fetchone()
        assert row is not None, f"no mark for {hour}"

    def waiter(self) -> int:
        """The backend (a rollup's) that waits for this lock, once one does → its pid."""
        mine = self.conn.info.backend_pid

        def blocked() -> int | None:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    [mine],
                )
                row = cursor.fetchone()
            return int(row[0]) if row else None

        return int(wait_until(blocked, "a rollup to wait for the held mark"))

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def backend_gone(pid: int) -> None:
    """Wait until that backend has ended (a killed worker's, once it finds its client gone)."""

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
            return cursor.fetchone() is None

    wait_until(gone, f"backend {pid} to end")


@pytest.fixture
def celery_queue(redis_url: str, postgres: None, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A fresh queue name, a sender, and worker starter; workers stopped and the queue's
    unacknowledged messages (left by a killed worker) removed afterwards."""
    import redis
    from celery import Celery

    queue = f"h4-rollup-{uuid.uuid4().hex[:8]}"
    sender = Celery("rollup-test", broker=redis_url)
    workers: list[Worker] = []

    def start(**kwargs: Any) -> Worker:
        worker = Worker(redis_url, queue, tmp_path / f"worker{len(workers)}.log", **kwargs)
        workers.append(worker)
        return worker

    def send() -> None:
        sender.send_task(TASK, queue=queue)

    yield {"start": start, "send": send}
    for worker in workers:
        worker.stop()
    client = redis.Redis.from_url(redis_url)
    for tag, raw in client.hgetall("unacked").items():
        if json.loads(raw)[2] == queue:
            client.hdel("unacked", tag)
            client.zrem("unacked_index", tag)
    client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    sender.close()


def _fleet_of_hours(make_gpu: Callable[..., Any], t0: dt.datetime, hours: int) -> list[dt.datetime]:
    gpus = [make_gpu(), make_gpu(memory_total_bytes=None)]
    samples_ingest(
        sample(
            gpu,
            t0 + h * H + m * dt.timedelta(minutes=10),
            util=(h * 7 + m * 13) % 100,
            power_w=100 + m,
            procs=m % 2 if m % 3 else None,
            mem_used_bytes=5_000_000_000 if m % 2 else None,
        )
        for gpu in gpus
        for h in range(hours)
        for m in range(6)
    )
    return [t0 + h * H for h in range(hours)]


def _clean_run_rows(hours: list[dt.datetime]) -> dict[Any, dict[str, Any]]:
    """The rows one clean run computes from the same samples, in this process."""
    HourlyUsage.objects.all().delete()
    RollupPending.objects.all().delete()
    hours_mark(hours)
    rollup_run()
    return rollup_rows()


def test_two_rollups_at_once_end_as_one_clean_run(
    celery_queue: dict[str, Any], make_gpu: Callable[..., Any], t0: dt.datetime
) -> None:
    hours = _fleet_of_hours(make_gpu, t0 - 2 * 24 * H, 3 * BATCH_HOURS)
    # Two tasks on two worker threads. The first is held inside its first batch (the rollup
    # lock taken) while the second starts.
    held = MarkLocked(hours[0])
    worker = celery_queue["start"](pool="threads", concurrency=2)
    try:
        celery_queue["send"]()
        held.waiter()
        celery_queue["send"]()
        # The second finds the lock held and stands down; the first then drains the queue.
        worker.wait_for(
            lambda: "another rollup holds the lock" in worker.output(), "the second rollup"
        )
    finally:
        held.release()
    worker.wait_for(lambda: f"rollup: {len(hours)} hours rolled" in worker.output(), "the first")
    assert not RollupPending.objects.exists()
    assert worker.output().count("rollup: ") == 2
    worker.stop()
    after_two = rollup_rows()
    assert len(after_two) == 2 * len(hours)
    rows_approx_equal(after_two, _clean_run_rows(hours))


def test_worker_killed_mid_rollup_then_restarted_ends_as_one_clean_run(
    celery_queue: dict[str, Any], make_gpu: Callable[..., Any], t0: dt.datetime
) -> None:
    hours = _fleet_of_hours(make_gpu, t0 - 2 * 24 * H, 3 * BATCH_HOURS)
    # The second batch is held after its upsert, before its marks are cleared and it commits.
    held = MarkLocked(hours[BATCH_HOURS])
    worker = celery_queue["start"]()
    try:
        celery_queue["send"]()
        pid = held.waiter()
        # The first batch has committed (its marks are gone); the second is in its transaction.
        assert RollupPending.objects.count() == 2 * BATCH_HOURS
        worker.kill()
    finally:
        held.release()
    # Its connection's backend finds the client gone once the lock is free, and rolls back.
    backend_gone(pid)
    # What a SIGKILL leaves: batch 1 done, batch 2 rolled back with its marks, batch 3 untouched.
    assert RollupPending.objects.count() == 2 * BATCH_HOURS
    assert HourlyUsage.objects.filter(hour__gte=hours[BATCH_HOURS]).count() == 0
    assert HourlyUsage.objects.count() == 2 * BATCH_HOURS

    # Restarted, the next periodic run redoes what was left.
    worker = celery_queue["start"]()
    celery_queue["send"]()
    worker.wait_for(lambda: "rollup: " in worker.output(), "the rerun", timeout=30)
    assert not RollupPending.objects.exists()
    worker.stop()
    rows_approx_equal(rollup_rows(), _clean_run_rows(hours))
