"""A ``replica`` database alias for the read-replica tests, added and removed at run time.

The test settings have no replica (the suite runs without ``DATABASE_REPLICA_URL``), so these
tests add the alias to Django's connection handler once the test database exists: either a
stand-in (a second connection to the test database itself, for the routing rules) or a real
standby on another port (test_replica_standby.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.test.utils import CaptureQueriesContext

from config import replica as rep

PRIMARY_TABLE_READS_ALLOWED = {"fleet_fleetsettings"}  # read by get_or_create: the primary


def alias_add(*, host: str | None = None, port: int | None = None) -> None:
    """The ``replica`` alias: the test database, on ``host:port`` when given."""
    conf = copy.deepcopy(connections["default"].settings_dict)
    if host is not None:
        conf["HOST"] = host
    if port is not None:
        conf["PORT"] = str(port)
    conf["OPTIONS"] = {
        **conf.get("OPTIONS", {}),
        "connect_timeout": 2,
        "options": "-c default_transaction_read_only=on",
    }
    conf["TEST"] = {**conf["TEST"], "MIRROR": "default"}
    connections.settings[rep.REPLICA] = conf
    rep.replica_forget()


def alias_remove() -> None:
    if rep.REPLICA not in connections.settings:
        return
    try:
        connections[rep.REPLICA].close()
    except Exception:  # noqa: BLE001, S110 - a stopped server: nothing to close
        pass
    try:
        del connections[rep.REPLICA]
    except AttributeError:  # never opened in this thread
        pass
    del connections.settings[rep.REPLICA]
    rep.replica_forget()


def state_set(state: str, lag_s: float | None = 0.0) -> None:
    """What the last check found, as if it had just run (the tests set a long interval)."""
    import time

    rep._last = rep.ReplicaState(state, lag_s, time.monotonic())  # noqa: SLF001


@dataclass
class Captured:
    primary: list[str] = field(default_factory=list)
    replica: list[str] = field(default_factory=list)

    def tables(self, side: str) -> set[str]:
        """The tables the SELECTs on one side read (by their quoted names)."""
        import re

        found: set[str] = set()
        for sql in getattr(self, side):
            if sql.lstrip().upper().startswith(("SELECT", "WITH")):
                found |= set(
                    re.findall(r'"((?:fleet|telemetry|billing|alerts|auth|django)_\w+)"', sql)
                )
        return found


@contextmanager
def captured() -> Iterator[Captured]:
    """Every statement run on each side while the block runs."""
    out = Captured()
    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections[rep.REPLICA]) as replica,
    ):
        yield out
    out.primary = [q["sql"] for q in primary.captured_queries]
    out.replica = [q["sql"] for q in replica.captured_queries]


def cookie(response: Any) -> Any:
    return response.cookies.get(rep.STICKY_COOKIE)
