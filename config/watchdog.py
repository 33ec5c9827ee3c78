"""A Celery worker that has stopped taking tasks exits, so that its supervisor starts a new one.

Why: kombu's Redis transport can lose its consumer when the broker connection drops and comes
back within moments (celery/celery#8030, #9054, #10205; still seen with celery and kombu 5.7).
The worker logs that it is connected again, then never receives another task: rollups stop,
the dashboard goes stale, and nothing says so. tests/reliability/test_faults.py cut Redis for a
second and hit it in about a third of the runs.

How: every ``WORKER_WATCHDOG_INTERVAL_S`` a thread in the worker compares what waits in its
queues (``LLEN`` in Redis, on a connection of its own) with what the worker received. When
tasks have been waiting for ``WORKER_STUCK_AFTER_S`` while the worker received none and runs
none, it logs why and exits with status 70 (EX_SOFTWARE). systemd (``Restart=always``) and
compose (``restart: unless-stopped``) start a fresh worker, which takes the waiting tasks; a
task that was taken but not finished is redelivered (``acks_late``). Brokers other than Redis
are not watched. ``WORKER_STUCK_AFTER_S=0`` turns the watchdog off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import signals

logger = logging.getLogger(__name__)

EXIT_STUCK = 70  # EX_SOFTWARE: the supervisor restarts the worker


@dataclass
class WatchState:
    """What the watchdog knows between two looks (monotonic seconds)."""

    last_received: float
    waiting_since: float | None = None


def stuck(*, state: WatchState, waiting: int, busy: bool, now: float, stuck_after: float) -> bool:
    """Whether the worker has stopped taking tasks, updating ``state``: tasks have waited in
    its queues for ``stuck_after`` seconds (seen at every look in between) while it received
    none and ran none. A busy worker is never stuck: a long task keeps a solo worker from
    taking the next one, rightly."""
    if waiting <= 0 or busy:
        state.waiting_since = None
        return False
    if state.waiting_since is None:
        state.waiting_since = now
    since = max(state.waiting_since, state.last_received)
    return now - since >= stuck_after


def _waiting(client: Any, queues: list[str]) -> int:
    return sum(int(client.llen(q)) for q in queues)


def watch(
    *,
    state: WatchState,
    waiting: Callable[[], int],
    busy: Callable[[], bool],
    interval: float,
    stuck_after: float,
    on_stuck: Callable[[str], None],
) -> None:
    """The watchdog's loop (runs until the process ends)."""
    while True:
        time.sleep(interval)
        try:
            count = waiting()
        except Exception:  # noqa: BLE001 - Redis away: the worker's own retries report that
            state.waiting_since = None
            continue
        if stuck(
            state=state, waiting=count, busy=busy(), now=time.monotonic(), stuck_after=stuck_after
        ):
            on_stuck(
                f"{count} task(s) have waited in this worker's queues for {stuck_after:g} s or "
                "more while it received none: its broker connection was lost and never "
                "resumed consuming (a known kombu Redis fault); exiting so that the supervisor "
                "starts a fresh worker"
            )
            return


def _exit(reason: str) -> None:
    logger.critical("worker watchdog: %s", reason)
    logging.shutdown()
    os._exit(EXIT_STUCK)


_state = WatchState(last_received=time.monotonic())


def _received(**kwargs: Any) -> None:
    _state.last_received = time.monotonic()


def _start(sender: Any = None, **kwargs: Any) -> None:
    """Start watching once the worker consumes (``sender`` is its consumer)."""
    from django.conf import settings

    stuck_after = float(settings.WORKER_STUCK_AFTER_S)
    broker = str(sender.app.conf.broker_url or "")
    if stuck_after <= 0 or not broker.startswith(("redis://", "rediss://")):
        return
    import redis
    from celery.worker import state as worker_state

    queues = [q.name for q in sender.task_consumer.queues]
    client = redis.Redis.from_url(broker, socket_connect_timeout=2, socket_timeout=2)
    _state.last_received = time.monotonic()
    threading.Thread(
        target=watch,
        name="worker-watchdog",
        daemon=True,
        kwargs={
            "state": _state,
            "waiting": lambda: _waiting(client, queues),
            "busy": lambda: bool(worker_state.active_requests),
            "interval": float(settings.WORKER_WATCHDOG_INTERVAL_S),
            "stuck_after": stuck_after,
            "on_stuck": _exit,
        },
    ).start()
    logger.info("worker watchdog: watching %s (stuck after %g s)", ", ".join(queues), stuck_after)


signals.task_received.connect(_received)
signals.worker_ready.connect(_start)
