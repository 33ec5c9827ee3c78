"""``config.replica.read_beside``: a read started on a second connection, in a thread of its
own, while the caller goes on (the closed months' pages, issue 19); at once, in the caller's
thread, where a second connection would not read what the caller's does."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from config.replica import read_beside
from fleet.models import Site
from tests.billing.test_perf_paths import needs_postgres

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def _backend() -> tuple[str, int, str, Any]:
    """This thread's name, its connection's server process, a context variable, and the
    connection (to look at once the thread is done)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return threading.current_thread().name, pid, _seen.get(), connections["default"]


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_a_read_beside_runs_on_its_own_connection_in_this_context() -> None:
    Site.objects.create(name="fra1")  # committed: the second connection reads it
    token = _seen.set("page")
    try:
        result = read_beside(lambda: (*_backend(), Site.objects.count()))
        _, main_pid, _, _ = _backend()
        name, pid, seen, used, sites = result()
    finally:
        _seen.reset(token)
    assert name.startswith("gpufleet-reads") and pid != main_pid
    assert (seen, sites) == ("page", 1)
    assert used.connection is None  # closed when the read was done
    assert connections["default"].connection is not None  # the caller's kept


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_an_error_beside_reaches_the_caller() -> None:
    def fails() -> None:
        raise ValueError("no such month")

    waiting = read_beside(fails)
    with pytest.raises(ValueError, match="no such month"):
        waiting()


@pytest.mark.django_db
def test_inside_a_transaction_it_reads_at_once_in_this_thread() -> None:
    """A test's data, or what a request wrote, is uncommitted: a second connection would not
    see the site."""
    ran: list[str] = []
    with transaction.atomic():
        Site.objects.create(name="iad1")

        def read() -> int:
            ran.append(threading.current_thread().name)
            return Site.objects.filter(name="iad1").count()

        waiting = read_beside(read)
        assert ran == [threading.current_thread().name]  # before it is asked for
        assert waiting() == 1
