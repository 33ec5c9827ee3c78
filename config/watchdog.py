"""A Celery worker that has stopped taking tasks exits, so that its supervisor starts a new one.

Why: kombu's Redis transport can lose its consumer when the broker connection drops and comes
back within moments (celery/celery#8030, #9054, #10205; still seen with celery and kombu 5.7).
The worker logs that it is connected again, then never receives another task: rollups stop,
the dashboard goes stale, and nothing says so. tests/reliability/test_faults.py cut Redis for a
second and hit it in about a third of the runs.

How: every ``WORKER_WATCHDOG_INTERVAL_S`` a thread in the worker compares what waits in its
queues (``LLEN`` in Redis, on a connection of its own) with what the worker received. When
tasks have been waiting for ``WORKER_STUCK_AFTER_S`` while the worker received none and runs
none, it logs why and exits with status 70 (EX_SOFTWARE). systemd (``Restart=on-failure``) and
compose (``restart: unless-stopped``) start a fresh worker, which takes the waiting tasks; a
task that was taken but not finished is redelivered (``acks_late``). Brokers other than Redis
are not watched. ``WORKER_STUCK_AFTER_S=0`` turns the watchdog off.

The same fault has a quieter form: the consumer takes a message off the queue (``BRPOP``),
kombu files it in its ``unacked`` hash and ``unacked_index`` zset (its ack emulation), and the
message never reaches the worker as a task. The queue is empty, so ``LLEN`` sees nothing, and
kombu hands the message out again only after the visibility timeout (an hour). So the watchdog
also notes each message this process's consumer takes (``_track_taken``, around kombu's
``QoS.append``) and forgets it when the worker receives its task. A message taken
``WORKER_STUCK_AFTER_S`` ago that never became a task and is still unacknowledged is put back
at the head of its queue (kombu's own ``restore_by_tag``, as after the visibility timeout), and
the worker ends with status 70 as above, its consumer being one that drops messages: by a warm
shutdown this time, because its loop may well take the message just put back (a task it runs
finishes and is acknowledged, one it took and did not start kombu puts back).
Only messages this process took are looked at: one in ``unacked`` that another worker is
running is that worker's business.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import signals

logger = logging.getLogger(__name__)

EXIT_STUCK = 70  # EX_SOFTWARE: the supervisor restarts the worker


@dataclass
class WatchState:
    """What the watchdog knows between two looks (monotonic seconds)."""

    last_received: float
    waiting_since: float | None = None
    # Delivery tag → when this process's consumer took the message off a queue; removed when
    # the worker receives its task. Written by the consumer's thread, read by the watchdog's.
    taken: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, tag: str, now: float) -> None:
        with self.lock:
            self.taken[tag] = now

    def forget(self, tags: list[str] | tuple[str, ...]) -> None:
        with self.lock:
            for tag in tags:
                self.taken.pop(tag, None)

    def overdue(self, *, now: float, after: float) -> list[str]:
        """The messages taken ``after`` seconds ago or more that never became a task, oldest
        first (some may since have been acknowledged unseen: an expired task is)."""
        with self.lock:
            return [
                t for t, at in sorted(self.taken.items(), key=lambda i: i[1]) if now - at >= after
            ]


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
    put_back: Callable[[list[str]], list[str]] = lambda tags: [],
    on_lost: Callable[[str], None] | None = None,
) -> None:
    """The watchdog's loop (runs until the process ends). ``put_back(tags)`` returns the
    tags still unacknowledged, each now back on its queue; ``on_lost`` ends the worker after
    that (``on_stuck`` if not given)."""
    while True:
        time.sleep(interval)
        try:
            overdue = state.overdue(now=time.monotonic(), after=stuck_after)
            lost = put_back(overdue) if overdue else []
            state.forget(overdue)
            count = waiting()
        except Exception:  # noqa: BLE001 - Redis away: the worker's own retries report that
            state.waiting_since = None
            continue
        if lost:
            (on_lost or on_stuck)(
                f"{len(lost)} message(s) this worker took off its queues {stuck_after:g} s ago "
                "or more never reached it as tasks (kept in kombu's unacked set after a broker "
                "blip, a known kombu Redis fault); put back on their queues, exiting so that "
                "the supervisor starts a fresh worker"
            )
            return
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


def _shut_down(reason: str, *, busy: Callable[[], bool], grace_s: float) -> None:
    """End the worker after lost messages were put back: a warm shutdown with status 70, so
    that a task it took meanwhile (the message just put back, perhaps) finishes and is
    acknowledged, and kombu puts back what it took and did not start. If the worker is still
    there ``grace_s`` after it last ran a task, its loop is not listening: exit at once."""
    from celery.worker import state as worker_state

    logger.critical("worker watchdog: %s", reason)
    worker_state.should_stop = EXIT_STUCK
    idle_since = time.monotonic()
    while True:
        time.sleep(1)
        if busy():
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= grace_s:
            _exit("a warm shutdown did not end the worker; exiting now")


_state = WatchState(last_received=time.monotonic())


def _received(request: Any = None, **kwargs: Any) -> None:
    _state.last_received = time.monotonic()
    message = getattr(request, "message", None)
    if message is not None:
        _state.forget((message.delivery_tag,))


def _track_taken() -> None:
    """Note every message this process's Redis consumer files as unacknowledged (kombu's
    ``QoS.append``, called when a message is taken off a queue, before it is handed to the
    worker). Wrapped once, for the whole process: a consumer kombu left behind after a
    reconnect takes messages through the same class."""
    from kombu.transport import redis as kombu_redis

    append: Any = kombu_redis.QoS.append
    if getattr(append, "_watchdog", False):
        return

    def tracked(qos: Any, message: Any, delivery_tag: str) -> Any:
        filed = append(qos, message, delivery_tag)
        _state.take(delivery_tag, time.monotonic())  # before the worker sees it
        return filed

    tracked._watchdog = True  # type: ignore[attr-defined]
    kombu_redis.QoS.append = tracked  # type: ignore[method-assign]


def _put_back(app: Any, tags: list[str]) -> list[str]:
    """Put each of ``tags`` still in kombu's unacked set back on its queue, with kombu's own
    ``restore_by_tag`` (what the visibility timeout would do an hour later: the message is
    marked redelivered and pushed where the consumer takes next). Returns those put back."""
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)  # Redis away: the next look tries again
        channel: Any = connection.default_channel
        client = channel.client
        lost = [t for t in tags if client.hexists(channel.unacked_key, t)]
        for tag in lost:
            channel.qos.restore_by_tag(tag, client=client)
    return lost


def _watched(app: Any) -> bool:
    """Whether this worker is watched: the watchdog is on and the broker is Redis."""
    from django.conf import settings

    broker = str(app.conf.broker_url or "")
    return settings.WORKER_STUCK_AFTER_S > 0 and broker.startswith(("redis://", "rediss://"))


def _init(sender: Any = None, **kwargs: Any) -> None:
    """Before the worker consumes (``sender`` is the worker): note the messages it takes."""
    if _watched(sender.app):
        _track_taken()


def _start(sender: Any = None, **kwargs: Any) -> None:
    """Start watching once the worker consumes (``sender`` is its consumer)."""
    from django.conf import settings

    if not _watched(sender.app):
        return
    import redis
    from celery.worker import state as worker_state

    stuck_after = float(settings.WORKER_STUCK_AFTER_S)
    queues = [q.name for q in sender.task_consumer.queues]
    client = redis.Redis.from_url(
        str(sender.app.conf.broker_url), socket_connect_timeout=2, socket_timeout=2
    )
    _state.last_received = time.monotonic()

    def busy() -> bool:
        return bool(worker_state.active_requests)

    threading.Thread(
        target=watch,
        name="worker-watchdog",
        daemon=True,
        kwargs={
            "state": _state,
            "waiting": lambda: _waiting(client, queues),
            "busy": busy,
            "interval": float(settings.WORKER_WATCHDOG_INTERVAL_S),
            "stuck_after": stuck_after,
            "on_stuck": _exit,
            "put_back": lambda tags: _put_back(sender.app, tags),
            "on_lost": lambda reason: _shut_down(reason, busy=busy, grace_s=stuck_after),
        },
    ).start()
    logger.info("worker watchdog: watching %s (stuck after %g s)", ", ".join(queues), stuck_after)


signals.task_received.connect(_received)
signals.worker_init.connect(_init)
signals.worker_ready.connect(_start)
