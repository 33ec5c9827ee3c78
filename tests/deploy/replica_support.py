"""A ``replica`` database alias for the read-replica tests, added and removed at run time.

The test settings have no replica (the suite runs without ``DATABASE_REPLICA_URL``), so these
tests add the alias to Django's connection handler once the test database exists: either a
stand-in (a second connection to the test database itself, for the routing rules) or a real
standby on another port (test_replica_standby.py).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connections
from django.test.utils import CaptureQueriesContext

from config import replica as rep

# What the settings install with DATABASE_REPLICA_URL (the tests add the replica later).
ROUTERS = ["config.replica.ReplicaRouter"]
# The rollup tables the figures are summed from (daily ones where they are kept).
USAGE_TABLES = {"telemetry_hourlyusage", "telemetry_dailyusage"}


_before: dict[str, Any] = {}  # the alias the settings had, while a test's stands in


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
    _before.setdefault("conf", connections.settings.get(rep.REPLICA))
    _alias_close()
    connections.settings[rep.REPLICA] = conf
    rep.replica_forget()


def _alias_close() -> None:
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


def alias_remove() -> None:
    """Back to the settings' own ``replica`` alias (none, unless DATABASE_REPLICA_URL is set)."""
    _alias_close()
    before = _before.pop("conf", None)
    if before is None:
        connections.settings.pop(rep.REPLICA, None)
    else:
        connections.settings[rep.REPLICA] = before
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
            # A raw statement may open with comments, and names its tables unquoted.
            text = re.sub(r"^(\s*--[^\n]*\n)*", "", sql).lstrip()
            if text.upper().startswith(("SELECT", "WITH")):
                found |= set(
                    re.findall(r'\b"?((?:fleet|telemetry|billing|alerts|auth|django)_\w+)"?', text)
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


# --- a real streaming standby of the test cluster ------------------------------------------

STANDBY_PREFIX = "gpufleet-standby-"
# pg_basebackup copies the whole cluster, every database in it: past this it would take minutes
# and fill the disk (a benchmark's data set left behind is 10 GB or more), so the build stops.
STANDBY_MAX_CLUSTER_BYTES = 2 * 2**30
# What a hot standby needs at least as large as its primary's (PostgreSQL refuses to start).
_MATCHED = (
    "max_connections",
    "max_worker_processes",
    "max_wal_senders",
    "max_prepared_transactions",
    "max_locks_per_transaction",
)


class StandbyError(Exception):
    """The standby could not be built or started; the message says which step and why."""


@dataclass
class Standby:
    """A standby PostgreSQL in a temporary folder, streaming from the test database's server.

    Built with ``pg_basebackup -R`` (a copy of the primary plus ``standby.signal`` and
    ``primary_conninfo``) and run with ``pg_ctl`` on its own port, as the ``postgres`` user
    when the tests run as root (PostgreSQL refuses root)."""

    root: Path
    port: int
    bindir: Path
    user: str
    dbname: str

    @property
    def data(self) -> Path:
        return self.root / "data"

    def run(self, program: str, *args: str, timeout: float = 60) -> None:
        command = [*_as_postgres(), str(self.bindir / program), *args]
        try:
            result = subprocess.run(  # noqa: S603 - our own arguments
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise StandbyError(f"{program} took more than {timeout:.0f} s") from exc
        if result.returncode != 0:
            raise StandbyError(f"{program} failed: {(result.stderr or result.stdout).strip()}")

    def sql(self, query: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row, asked on the standby as the superuser."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname=self.dbname, autocommit=True
        ) as conn:
            row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        return row[0] if row else None

    def wait(self, what: str, query: str, params: Sequence[Any] = (), timeout: float = 30) -> None:
        """Until ``query`` answers true on the standby."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                if self.sql(query, params):
                    return
            except Exception as exc:  # noqa: BLE001 - still starting
                last = exc
            time.sleep(0.1)
        raise StandbyError(f"the standby did not {what} within {timeout:.0f} s ({last})")

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_lsn()::text")
            lsn = cursor.fetchone()[0]
        self.wait("catch up", "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn])

    def stop(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")

    def destroy(self) -> None:
        """Stop it if it runs and remove its folder (whatever state it is in)."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(StandbyError):
                self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _bindir(major: int) -> Path:
    debian = Path(f"/usr/lib/postgresql/{major}/bin")
    if (debian / "pg_basebackup").exists():
        return debian
    found = shutil.which("pg_basebackup")
    if found:
        return Path(found).parent
    raise StandbyError(f"no pg_basebackup for PostgreSQL {major}")


def _cluster_size_check(sizes: Sequence[tuple[str, int]]) -> None:
    """Refuses a cluster too large to copy, naming its largest databases."""
    total = sum(size for _, size in sizes)
    if total > STANDBY_MAX_CLUSTER_BYTES:
        largest = ", ".join(f"{name} {size / 2**30:.2f} GiB" for name, size in sizes[:3])
        raise StandbyError(
            f"the PostgreSQL cluster holds {total / 2**30:.2f} GiB (largest: {largest}), more "
            f"than the {STANDBY_MAX_CLUSTER_BYTES / 2**30:.0f} GiB a standby is copied for "
            "here: pg_basebackup copies every database; drop the ones the tests do not use "
            "(benchmark data sets: bench_*)"
        )


def standby_build() -> Standby:
    """A running standby of the test database's server, caught up and streaming."""
    primary = connections["default"]
    with primary.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version_num')::int / 10000")
        major = cursor.fetchone()[0]
        cursor.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(_MATCHED)]
        )
        matched = dict(cursor.fetchall())
        cursor.execute(
            "SELECT datname, pg_database_size(datname) FROM pg_database ORDER BY 2 DESC, 1"
        )
        sizes = cursor.fetchall()
    _cluster_size_check(sizes)
    bindir = _bindir(major)
    for leftover in Path(tempfile.gettempdir()).glob(f"{STANDBY_PREFIX}*"):
        if time.time() - leftover.stat().st_mtime > 600:  # a killed run's; ours take < 1 min
            Standby(leftover, 0, bindir, "", "").destroy()
    root = Path(tempfile.mkdtemp(prefix=STANDBY_PREFIX))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    conf = primary.settings_dict
    standby = Standby(root, port, bindir, conf["USER"] or "postgres", conf["NAME"])
    try:
        standby.run(
            "pg_basebackup",
            *("-h", conf["HOST"] or "127.0.0.1", "-p", str(conf["PORT"] or 5432)),
            *("-U", standby.user, "-D", str(standby.data)),
            # Stream the WAL written meanwhile, checkpoint now rather than at leisure, write
            # standby.signal and primary_conninfo, skip fsync (a throwaway copy), no prompt.
            *("-X", "stream", "-c", "fast", "-R", "--no-sync", "-w"),
        )
        lines = [
            "listen_addresses = '127.0.0.1'",
            f"port = {port}",
            f"unix_socket_directories = '{root}'",
            "hot_standby = on",
            "shared_buffers = 16MB",
            "fsync = off",
            *(f"{name} = {value}" for name, value in matched.items()),
        ]
        for name, text in (
            ("postgresql.conf", "\n".join(lines) + "\n"),
            ("pg_hba.conf", "local all all trust\nhost all all 127.0.0.1/32 trust\n"),
            ("pg_ident.conf", ""),
        ):
            path = standby.data / name
            path.write_text(text)
            if os.geteuid() == 0:
                shutil.chown(path, "postgres", "postgres")
        standby.run(
            "pg_ctl", "-D", str(standby.data), "-l", str(root / "log"), "-w", "-t", "30", "start"
        )
        standby.wait(
            "stream from the primary",
            "SELECT pg_is_in_recovery() AND EXISTS"
            " (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming')",
        )
        standby.wait_replayed()
    except BaseException as exc:
        log = root / "log"
        detail = log.read_text()[-2000:] if log.exists() else ""
        standby.destroy()
        if detail and isinstance(exc, StandbyError):
            raise StandbyError(f"{exc}\nThe standby's log ends with:\n{detail}") from None
        raise
    return standby
