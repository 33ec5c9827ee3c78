"""The in-process beat (config/scheduler.py): on the embedded default the server runs Celery
beat's schedule itself, each entry at its own interval or crontab, driven here by a fake clock.

Times are worked out by hand from config/celery.py's schedule: rollup every 60 s, alert rules
and booking late data into closed months every 300 s, the weekly report at minute 5 and the
digests at minute 10 of every hour, partitions at minute 17 of every sixth hour, retention at
03:27.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import time_machine

from config import scheduler
from config.celery import app
from config.scheduler import InProcessBeat

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_the_entries_are_beats_own_schedule_with_registered_tasks() -> None:
    entries = InProcessBeat(app=app).entries
    assert list(entries) == list(app.conf.beat_schedule)
    assert {e.task for e in entries.values()} == {
        "telemetry.tasks.rollup_task",
        "telemetry.tasks.partitions_maintain_task",
        "telemetry.tasks.retention_apply_task",
        "alerts.tasks.alerts_evaluate_task",
        "billing.tasks.weekly_report_task",
        "alerts.tasks.digests_task",
        "billing.tasks.adjust_closed_task",
    }
    assert all(e.task in app.tasks for e in entries.values())


def _drive(beat: InProcessBeat, traveller: Any, until: dt.datetime) -> int:
    """Look at the schedule, sleep as long as it says (on the fake clock), until ``until``;
    returns how many looks it took."""
    looks = 0
    while True:
        tick = beat.run_due()
        looks += 1
        if dt.datetime.now(UTC) + dt.timedelta(seconds=tick.next_in_s) >= until:
            return looks
        traveller.shift(tick.next_in_s)


def test_each_entry_runs_at_its_interval_or_crontab() -> None:
    runs: dict[str, list[dt.datetime]] = {}

    def record(entry: Any) -> None:
        runs.setdefault(entry.name, []).append(dt.datetime.now(UTC))

    start = at("2026-03-02T11:59:30")
    with time_machine.travel(start, tick=False) as traveller:
        beat = InProcessBeat(app=app, run=record)
        looks = _drive(beat, traveller, until=at("2026-03-02T13:10:00"))

    minute = dt.timedelta(minutes=1)
    # Like beat, an interval counts from the start: the first rollup a minute in.
    assert runs["rollup"] == [start + k * minute for k in range(1, 71)]  # … 13:09:30
    assert runs["alerts-evaluate"] == [start + 5 * k * minute for k in range(1, 15)]
    assert runs["adjust-closed"] == runs["alerts-evaluate"]  # late data booked every 300 s
    assert runs["weekly-report"] == [at("2026-03-02T12:05"), at("2026-03-02T13:05")]
    assert runs["digests"] == [at("2026-03-02T12:10")]
    assert runs["partitions"] == [at("2026-03-02T12:17")]
    assert "retention" not in runs  # 03:27 only
    # It sleeps until the next entry is due: a look per run time, no busy loop.
    distinct = {t for times in runs.values() for t in times}
    assert looks <= len(distinct) + 1


def test_a_failing_run_is_logged_and_waits_for_its_next_turn(caplog: Any) -> None:
    ran: list[tuple[str, dt.datetime]] = []

    def run(entry: Any) -> str:
        ran.append((entry.name, dt.datetime.now(UTC)))
        if entry.name == "alerts-evaluate":
            raise RuntimeError("rule store away")
        return "ok"

    start = at("2026-03-02T12:20:00")
    with time_machine.travel(start, tick=False) as traveller, caplog.at_level(logging.INFO):
        beat = InProcessBeat(app=app, run=run)
        traveller.shift(300)
        tick = beat.run_due()
        # the others of its turn still run
        assert tick.ran == ["rollup", "alerts-evaluate", "adjust-closed"]
        traveller.shift(60)
        assert beat.run_due().ran == ["rollup"]  # not retried at the next look
        traveller.shift(240)
        assert beat.run_due().ran == ["rollup", "alerts-evaluate", "adjust-closed"]
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 2
    assert failures[0].getMessage() == (
        "in-process beat: alerts-evaluate (alerts.tasks.alerts_evaluate_task) failed"
    )
    assert failures[0].exc_info is not None and "rule store away" in str(failures[0].exc_info[1])


@pytest.fixture
def embedded(settings: Any, tmp_path: Path) -> Any:
    """The embedded default: no broker, tasks in-process, a var dir of the test's own."""
    before = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    settings.CELERY_BROKER_URL = ""
    settings.VAR_DIR = tmp_path
    settings.SITE_URL = "http://localhost:8765"
    yield settings
    app.conf.task_always_eager, app.conf.task_eager_propagates = before


@pytest.mark.django_db
def test_the_schedule_makes_an_offline_gpu_alert_fire(
    embedded: Any, django_capture_on_commit_callbacks: Any, mailoutbox: Any
) -> None:
    """As in the demo: a GPU offline for 20 days and a fleet-wide offline rule. Five minutes
    after the start the schedule's alert evaluation runs (the real task, in-process) and the
    alert fires and is told by email; nobody called alerts_evaluate."""
    from alerts.models import Alert
    from tests.alerts.conftest import rules_apply
    from tests.billing.conftest import FleetBuilder

    start = at("2026-03-02T12:20:00")
    fleet = FleetBuilder()
    node = fleet.node("gpu-ams1-02", pool=fleet.pool("shared-dev"))
    fleet.gpu(
        "GPU-lost",
        node=node,
        in_service_at=start - dt.timedelta(days=30),
        last_seen_at=start - dt.timedelta(days=20),
    )
    fleet.gpu(
        "GPU-fine",
        node=node,
        index=1,
        in_service_at=start - dt.timedelta(days=30),
        last_seen_at=start - dt.timedelta(minutes=2),  # 7 minutes at the evaluation: fine
    )
    rules_apply(
        {
            "name": "gpu-offline",
            "rule": "gpu_offline_minutes",
            "threshold": 30,
            "notify": ["mailto:ops@example.com"],
        }
    )
    with (
        time_machine.travel(start, tick=False) as traveller,
        django_capture_on_commit_callbacks(execute=True),
    ):
        beat = InProcessBeat(app=app)
        traveller.shift(299)
        assert beat.run_due().ran == ["rollup"]  # four minutes 59 in: not yet
        assert not Alert.objects.exists()
        traveller.shift(1)
        assert beat.run_due().ran == ["alerts-evaluate", "adjust-closed"]
    firing = Alert.objects.get(resolved_at__isnull=True)
    assert (firing.rule.name, firing.subject) == ("gpu-offline", "gpu:GPU-lost")
    assert [m.to for m in mailoutbox] == [["ops@example.com"]]
    assert "http://localhost:8765/" in mailoutbox[0].body


def test_start_runs_one_thread_per_process_and_none_with_a_broker(
    settings: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(scheduler, "_started", None)
    settings.VAR_DIR = tmp_path
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/6"
    assert scheduler.start() is None  # celery beat and the workers do it

    settings.CELERY_BROKER_URL = ""
    first = scheduler.start()
    try:
        assert first is not None
        assert scheduler.start() is first
        threads = [t for t in threading.enumerate() if t.name == "in-process-beat"]
        assert len(threads) == 1 and threads[0].daemon
    finally:
        assert first is not None
        first.stop.set()
        threads[0].join(timeout=10)
    assert not threads[0].is_alive()
    # Stopped (a demo that served inside a test): the next start begins anew.
    second = scheduler.start()
    assert second is not None and second is not first
    second.stop.set()


def test_one_process_per_var_dir_runs_the_schedule(tmp_path: Path) -> None:
    """A second holder of the same var dir waits (here: is stopped while waiting) and runs
    nothing; once the first lets go, it can hold the lock."""
    lock = tmp_path / scheduler.LOCK_FILE_NAME
    stop = threading.Event()
    with scheduler._held(lock, threading.Event()) as first:
        assert first
        stop.set()
        with scheduler._held(lock, stop) as second:
            assert not second
    with scheduler._held(lock, threading.Event()) as again:
        assert again


@pytest.mark.slow
def test_runserver_on_the_embedded_default_runs_the_schedule_once(
    tmp_path: Path, free_tcp_port: int
) -> None:
    """``manage.py runserver`` with its autoreloader: two processes, the parent watching the
    files and the child serving. Only the serving one runs the schedule, once."""
    from django.conf import settings

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "RUN_MAIN")
    }
    env.update(GPUFLEET_VAR_DIR=str(tmp_path), LOG_LEVEL="INFO", PYTHONUNBUFFERED="1")
    log = tmp_path / "runserver.log"
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{free_tcp_port}"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                url = f"http://127.0.0.1:{free_tcp_port}/healthz"
                with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(2)  # a second one, were there one, has had time to say so
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=15)
    output = log.read_text(errors="replace")
    assert output.count("in-process beat: running") == 1, output
    assert "another process runs the schedule" not in output
