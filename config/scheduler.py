"""Celery beat's schedule, run in the server's own process on the embedded default.

Why: without a broker (no ``REDIS_URL`` / ``CELERY_BROKER_URL``) tasks run in-process and no
beat or worker runs, so nothing would ever evaluate the alert rules, send the weekly report or
the digests, or keep the rollups, partitions and retention up to date. The process that serves
the dashboard (the demo, ``runserver``, gunicorn on the embedded default) runs the entries of
``config.celery``'s ``beat_schedule`` itself, each at its own interval or crontab: the same list,
read here, so there is no second one to keep in step.

How: a daemon thread asks every entry ``is_due()`` (celery's own ``ScheduleEntry``, so a
crontab means here what it means to beat), runs the due ones one after another with
``Task.apply`` (in this thread, as a worker would run them), then sleeps until the next one is
due. A run that fails is logged with its traceback and the entry waits for its next turn; the
server goes on. Like beat, an interval entry first runs one interval after the start, and a
crontab entry at its next matching minute (the weekly report and the digests catch up on a
missed hour themselves).

Once: one thread per process, whoever asks first (``start``); and one process per var dir at a
time, by an exclusive ``flock`` on ``VAR_DIR/beat.lock``, so two gunicorn workers or a second
server beside the demo do not run everything twice: the other waits and takes over if the
holder ends. The ``runserver`` autoreloader's parent process never loads the WSGI application,
so it never starts one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from celery import Celery
from celery.beat import ScheduleEntry

logger = logging.getLogger(__name__)

LOCK_FILE_NAME = "beat.lock"
# The longest sleep between two looks: a lock left by another process is tried again, and a
# clock that jumped (a suspended laptop) is noticed, at least this often.
MAX_SLEEP_S = 60.0

Runner = Callable[[ScheduleEntry], Any]


def entries_of(app: Celery) -> dict[str, ScheduleEntry]:
    """The app's beat schedule as celery beat reads it (``Scheduler._maybe_entry``): one entry
    per name, last run now."""
    return {
        name: ScheduleEntry(**dict(spec, name=name, app=app))
        for name, spec in app.conf.beat_schedule.items()
    }


def task_apply(entry: ScheduleEntry) -> Any:
    """Run the entry's task here and now, as a worker would: its retries included, its
    delivery options (``expires``, the queue) left out, since nothing is queued. Raises what the
    task raised."""
    task = entry.app.tasks[entry.task]
    return task.apply(args=entry.args, kwargs=entry.kwargs, throw=True).get()


@dataclass
class Tick:
    """One look at the schedule: the entries that ran, and the seconds until the next is due."""

    ran: list[str]
    next_in_s: float


@dataclass
class InProcessBeat:
    """The beat schedule of ``app``, run by whoever calls :meth:`run_due` (the thread of
    :func:`start`; the tests, under a fake clock)."""

    app: Celery
    run: Runner = task_apply
    entries: dict[str, ScheduleEntry] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # The apps' tasks modules, imported as a worker does when it starts: autodiscovery
        # is lazy, and a task never imported is not registered.
        self.app.autodiscover_tasks(force=True)
        self.entries = self.entries or entries_of(self.app)

    def run_due(self) -> Tick:
        """Run every entry that is due, in the schedule's order."""
        ran = []
        next_in_s = MAX_SLEEP_S
        for name, entry in list(self.entries.items()):
            due, entry_next_s = entry.is_due()
            if due:
                # Reserved before it runs: a run that fails waits for its next turn, not for
                # the next look (no retry storm from a broken task).
                self.entries[name] = next(entry)
                self._run(name, entry)
                ran.append(name)
            next_in_s = min(next_in_s, entry_next_s)
        return Tick(ran=ran, next_in_s=max(0.0, next_in_s))

    def _run(self, name: str, entry: ScheduleEntry) -> None:
        began = time.monotonic()
        try:
            outcome = self.run(entry)
        except Exception:
            logger.exception("in-process beat: %s (%s) failed", name, entry.task)
            return
        logger.info(
            "in-process beat: %s ran in %.1f s: %s", name, time.monotonic() - began, outcome
        )

    def run_forever(self, lock_path: Path | None) -> None:
        """Until ``stop`` is set: hold the var dir's lock, then run the entries as they come
        due (the thread's body)."""
        from django.db import close_old_connections

        with _held(lock_path, self.stop) as held:
            if not held:
                return
            # Counted from now, as beat does: the time spent waiting for the lock is no run.
            self.entries = entries_of(self.app)
            logger.info("in-process beat: running %s", ", ".join(self.entries))
            while not self.stop.is_set():
                try:
                    tick = self.run_due()
                except Exception:  # a bug here must not end the periodic work for good
                    logger.exception("in-process beat: looking at the schedule failed")
                    tick = Tick(ran=[], next_in_s=MAX_SLEEP_S)
                # No request cycle closes this thread's connections: a broken or expired one
                # is dropped here, as after a request.
                close_old_connections()
                self.stop.wait(min(tick.next_in_s, MAX_SLEEP_S))


@contextlib.contextmanager
def _held(lock_path: Path | None, stop: threading.Event) -> Iterator[bool]:
    """An exclusive lock on ``lock_path`` (None: no lock), waited for until ``stop``; yields
    whether it is held. The lock goes with the process, however it ends."""
    if lock_path is None:
        yield True
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle: IO[bytes] = lock_path.open("ab")
    try:
        said = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    logger.info(
                        "in-process beat: another process runs the schedule (%s); waiting",
                        lock_path,
                    )
                    said = True
                if stop.wait(MAX_SLEEP_S):
                    yield False
                    return
        yield True
    finally:
        handle.close()


_started: InProcessBeat | None = None
_start_lock = threading.Lock()


def start(app: Celery | None = None) -> InProcessBeat | None:
    """Start the in-process beat once in this process when there is no broker; the running
    one (or None with a broker, where celery beat and the workers do this work). One that was
    stopped (a demo run inside a test) is replaced."""
    global _started
    from django.conf import settings

    if settings.CELERY_BROKER_URL:
        return None
    if app is None:
        from config.celery import app
    with _start_lock:
        if _started is None or _started.stop.is_set():
            _started = InProcessBeat(app=app)
            threading.Thread(
                target=_started.run_forever,
                args=(Path(settings.VAR_DIR) / LOCK_FILE_NAME,),
                name="in-process-beat",
                daemon=True,
            ).start()
        return _started
