"""The worker watchdog (config/watchdog.py): a worker that stops taking tasks exits with 70.

The decision is a pure function, walked through by hand here; then a real worker on Redis is
made to stop consuming (the remote-control ``cancel_consumer``, the closest deterministic
stand-in for kombu losing its consumer after a broker blip) and must exit on its own, while a
worker that keeps taking tasks must not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from config.watchdog import EXIT_STUCK, WatchState, stuck

ROOT = Path(__file__).resolve().parents[2]


def test_stuck_only_after_tasks_waited_the_whole_time_unreceived() -> None:
    state = WatchState(last_received=0.0)
    looks = [
        # (now, waiting, busy) → stuck?   with stuck_after = 30
        (10.0, 0, False, False),  # nothing waits
        (20.0, 2, False, False),  # waiting since 20
        (45.0, 2, False, False),  # 25 s
        (50.0, 3, False, True),  # 30 s: stuck
    ]
    for now, waiting, busy, want in looks:
        assert stuck(state=state, waiting=waiting, busy=busy, now=now, stuck_after=30) is want


def test_a_receipt_or_an_empty_queue_or_a_running_task_resets_the_clock() -> None:
    state = WatchState(last_received=0.0)
    assert not stuck(state=state, waiting=1, busy=False, now=100.0, stuck_after=30)
    state.last_received = 120.0  # the worker took a task meanwhile
    assert not stuck(state=state, waiting=1, busy=False, now=140.0, stuck_after=30)  # 20 s
    assert stuck(state=state, waiting=1, busy=False, now=150.0, stuck_after=30)  # 30 s
    assert not stuck(state=state, waiting=0, busy=False, now=151.0, stuck_after=30)  # drained
    assert not stuck(state=state, waiting=5, busy=False, now=160.0, stuck_after=30)  # anew: 0 s
    assert not stuck(state=state, waiting=5, busy=True, now=200.0, stuck_after=30)  # a long task
    assert not stuck(state=state, waiting=5, busy=False, now=210.0, stuck_after=30)  # anew
    assert stuck(state=state, waiting=5, busy=False, now=240.0, stuck_after=30)


def _worker(queue: str, redis_url: str, log: Path) -> subprocess.Popen[bytes]:
    from config.celery import worker_argv

    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "WORKER_STUCK_AFTER_S": "3",
        "WORKER_WATCHDOG_INTERVAL_S": "1",
    }
    return subprocess.Popen(
        worker_argv(queue=queue, name=f"{queue}@%h"),
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_ready(log: Path, worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while "ready." not in log.read_text(errors="replace"):
        assert worker.poll() is None, log.read_text(errors="replace")[-2000:]
        assert time.monotonic() < deadline, "worker not ready in 60 s"
        time.sleep(0.2)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


@pytest.mark.slow
def test_a_worker_that_stopped_consuming_exits_and_one_that_consumes_does_not(
    redis_url: str, tmp_path: Path
) -> None:
    import redis
    from celery import Celery

    stalled_q, live_q = (f"wd-{uuid.uuid4().hex[:8]}" for _ in range(2))
    stalled = _worker(stalled_q, redis_url, tmp_path / "stalled.log")
    live = _worker(live_q, redis_url, tmp_path / "live.log")
    sender = Celery("wd-sender", broker=redis_url)
    try:
        _wait_ready(tmp_path / "stalled.log", stalled)
        _wait_ready(tmp_path / "live.log", live)
        sender.control.cancel_consumer(stalled_q, destination=[f"{stalled_q}@{os.uname()[1]}"])
        time.sleep(1)
        began = time.monotonic()
        # A task that does nothing harmful on an empty database: partitions are PostgreSQL's.
        sender.send_task("telemetry.tasks.partitions_maintain_task", queue=stalled_q)
        while stalled.poll() is None and time.monotonic() - began < 30:
            sender.send_task("telemetry.tasks.partitions_maintain_task", queue=live_q)
            time.sleep(0.5)
        assert stalled.poll() == EXIT_STUCK, (tmp_path / "stalled.log").read_text()[-2000:]
        assert "worker watchdog" in (tmp_path / "stalled.log").read_text()
        assert live.poll() is None, (tmp_path / "live.log").read_text()[-2000:]
    finally:
        for worker in (stalled, live):
            _stop(worker)
        sender.close()
        client: Any = redis.Redis.from_url(redis_url)
        for q in (stalled_q, live_q):
            client.delete(q, f"_kombu.binding.{q}")
