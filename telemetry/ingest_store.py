"""Writes validated raw samples: COPY on PostgreSQL, one multi-row INSERT OR IGNORE on SQLite.

A row is a tuple in :data:`COLUMNS` order, built by ``telemetry.ingest``. Within one
transaction the store inserts the new samples, leaves duplicates ``(gpu_id, start)`` untouched,
moves each GPU's ``first_seen_at`` / ``last_seen_at`` and marks the hours that received samples
for the rollup (one statement each), so a rollup never sees samples its mark does not cover.

PostgreSQL has two ways in (measured in bench/ingest.py and docs/benchmarks.md):

- optimistic (``skip_duplicates=False``): binary COPY straight into ``telemetry_sample``. COPY
  batches its inserts into the partitions; an ``INSERT … SELECT … ON CONFLICT`` inserts row by
  row with a speculative check each, which doubled the database time of a 1,000-sample batch.
  Nearly every push holds only new samples, so this is the usual path. A duplicate makes the
  COPY fail with a unique violation: :class:`DuplicateSamples` is raised, the caller's
  transaction rolls back and it calls again with
- ``skip_duplicates=True``: COPY into a session-private staging table, then one
  ``INSERT … SELECT … ON CONFLICT DO NOTHING RETURNING`` that stores the new rows and counts
  them, so duplicates change nothing and are counted.
"""

from __future__ import annotations

import datetime as dt
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg
from django.db import IntegrityError, connection
from django.db.models import DateTimeField, Value
from django.db.models.functions import Coalesce, Greatest, Least

from fleet.models import Gpu
from telemetry.pending import MARK_CONFLICT, MARK_INSERT, hours_mark

COLUMNS = (
    "gpu_id",
    "start",
    "seconds",
    "util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "procs",
    "power_w",
    "energy_j",
    "temp_c",
    "sm_clock_mhz",
    "throttle_power_cap_s",
    "throttle_thermal_s",
    "throttle_hw_slowdown_s",
    "throttle_other_s",
    "throttle_any_s",
    "active_s",
    "sm_active",
    "received_at",
)
# PostgreSQL types of COLUMNS, for binary COPY (which sends no type information itself).
COPY_TYPES = (
    "int8",
    "timestamptz",
    "int2",
    "float8",
    "float8",
    "int8",
    "int2",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "timestamptz",
)
STAGE_TABLE = "telemetry_ingest_stage"
_COLS = ", ".join(COLUMNS)

# A GPU's last seen is kept to this resolution: it moves when a sample ends at least this long
# after it (its first seen always moves to an earlier sample). Writing it on every push would
# make every push of an 8-GPU node rewrite eight ``fleet_gpu`` rows, the costliest part of a
# small push (docs/ingest.md); five minutes is well inside the 15 minutes after which the
# dashboard counts a GPU offline.
GPU_SEEN_RESOLUTION_S = 300
# Which GPU rows need the move (``g``: the GPU; ``p``: first_start, last_end of new samples).
_SEEN_DUE = (
    "(g.first_seen_at IS NULL OR g.last_seen_at IS NULL OR p.first_start < g.first_seen_at"
    f" OR p.last_end >= g.last_seen_at + interval '{GPU_SEEN_RESOLUTION_S} seconds')"
)
_SEEN_SET = (
    "first_seen_at = LEAST(g.first_seen_at, p.first_start),"
    " last_seen_at = GREATEST(g.last_seen_at, p.last_end)"
)

# Shared by both merge statements: each GPU's first/last seen moves from the rows really
# inserted (``inserted``: gpu_id, start, seconds). LEAST/GREATEST ignore NULLs, so a GPU's
# first sample sets both; the last end never passes the server's clock (the one parameter).
_SEEN_FROM_INSERTED = f"""), per_gpu AS (
    SELECT gpu_id, min(start) AS first_start,
           LEAST(max(start + seconds * interval '1 second'), %s::timestamptz) AS last_end
    FROM inserted GROUP BY gpu_id
), seen AS (
    UPDATE fleet_gpu AS g SET {_SEEN_SET}
    FROM per_gpu AS p WHERE g.id = p.gpu_id AND {_SEEN_DUE}
"""  # noqa: S608 - constants of this module

# A session-private staging table: COPY cannot skip duplicates, INSERT … SELECT … ON CONFLICT
# can. ON COMMIT DELETE ROWS resets its storage at every commit; the DELETE … RETURNING below
# empties it within the statement too, so a batch never sees another's rows even inside an
# outer transaction that has not committed yet (tests, nested atomic blocks).
_STAGE_CREATE = (
    f"CREATE TEMP TABLE IF NOT EXISTS {STAGE_TABLE} "
    "(LIKE telemetry_sample INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
_STAGE_COPY = f"COPY {STAGE_TABLE} ({_COLS}) FROM STDIN (FORMAT BINARY)"
# One statement: move the staged rows into the partitioned table (duplicates do nothing), move
# each GPU's first/last seen from the rows really inserted, and return the hours they touched.
# LEAST/GREATEST ignore NULLs, so a GPU's first sample sets both. Hours are UTC hours.
_STAGE_MERGE = f"""
WITH staged AS (
    DELETE FROM {STAGE_TABLE} RETURNING {_COLS}
), inserted AS (
    INSERT INTO telemetry_sample ({_COLS})
    SELECT {_COLS} FROM staged
    ON CONFLICT (gpu_id, start) DO NOTHING
    RETURNING gpu_id, start, seconds
{_SEEN_FROM_INSERTED})
SELECT date_trunc('hour', start, 'UTC'), count(*) FROM inserted GROUP BY 1
"""  # noqa: S608 - table and column names are constants of this module

# Raw psycopg connections whose session already holds the staging table (set after a commit:
# a rolled-back CREATE leaves no table behind).
_staged_sessions: weakref.WeakSet[Any] = weakref.WeakSet()

# Whether every GPU the caller validated against a cached map (``verify``) still has that owner
# and total memory: true when none was (the arrays are then empty). Its four parameters come
# from :func:`_gpus_match_params`. Both write statements use it, and write nothing when false.
_GPUS_MATCH = """(
    SELECT count(*) FROM fleet_gpu AS g
    JOIN unnest(%s::int8[], %s::int8[], %s::int8[]) AS c(id, node_id, mem)
    ON g.id = c.id AND g.node_id = c.node_id
    AND g.memory_total_bytes IS NOT DISTINCT FROM c.mem
) = %s"""
# The node token ``%s`` (the one parameter) exists and is not revoked.
_TOKEN_LIVE = "SELECT 1 FROM fleet_nodetoken WHERE id = %s AND revoked_at IS NULL"


def _gpus_match_params(
    verify: Mapping[int, tuple[int, int | None]] | None, gpu_ids: Sequence[int]
) -> list[Any]:
    """The parameters of :data:`_GPUS_MATCH` for the GPUs ``gpu_ids`` (none without verify)."""
    checks = [(i, *verify.get(i, (None, None))) for i in gpu_ids] if verify else []
    return [[c[0] for c in checks], [c[1] for c in checks], [c[2] for c in checks], len(checks)]


# After the direct COPY, one statement: the GPUs' first/last seen and the hour marks (a
# data-modifying CTE, so a push costs one round trip here, not two), only when the GPUs still
# match the caller's cached view (``verify``); false tells the caller to roll back.
_GPU_SEEN = f"""
WITH ok AS (
    SELECT {_GPUS_MATCH} AS gpus
), p AS (
    SELECT * FROM unnest(%s::int8[], %s::timestamptz[], %s::timestamptz[])
        AS p(id, first_start, last_end)
), seen AS (
    UPDATE fleet_gpu AS g SET {_SEEN_SET}
    FROM p WHERE g.id = p.id AND {_SEEN_DUE} AND (SELECT gpus FROM ok)
), marked AS (
    {MARK_INSERT}
    SELECT unnest(%s::timestamptz[]), 1, %s::timestamptz WHERE (SELECT gpus FROM ok)
    {MARK_CONFLICT}
)
SELECT gpus FROM ok
"""  # noqa: S608 - constants of this module
_DIRECT_COPY = f"COPY telemetry_sample ({_COLS}) FROM STDIN (FORMAT BINARY)"


# Small batches (a node's minute): one statement in autocommit, so the whole push is one round
# trip and one implicit transaction, where COPY costs BEGIN, COPY, the first/last-seen statement
# and COMMIT. INSERT … ON CONFLICT checks row by row, which costs more than COPY's batched
# insert from a few hundred rows on (bench/ingest.py), hence the bound.
ONE_STATEMENT_MAX_ROWS = 64
# Its text never changes (the rows travel as one JSON parameter, the checks as arrays), so it is
# parsed and planned once per connection and then runs as a prepared statement: planning this
# statement cost more than running it, and psycopg does not cache the parsing of long texts.
_ROWS_TYPES = ", ".join(f"{c} {t}" for c, t in zip(COLUMNS, COPY_TYPES, strict=True))
_ONE_STATEMENT = f"""
WITH v AS (
    SELECT * FROM json_to_recordset(%s::json) AS r({_ROWS_TYPES})
), ok AS (
    SELECT {_GPUS_MATCH} AS gpus,
    (%s::int8 IS NULL OR EXISTS ({_TOKEN_LIVE})) AS token
), inserted AS (
    INSERT INTO telemetry_sample ({_COLS})
    SELECT {_COLS} FROM v WHERE (SELECT gpus AND token FROM ok)
    ON CONFLICT (gpu_id, start) DO NOTHING
    RETURNING gpu_id, start, seconds
{_SEEN_FROM_INSERTED}), marked AS (
    {MARK_INSERT}
    SELECT DISTINCT date_trunc('hour', start, 'UTC'), 1, %s::timestamptz FROM inserted
    {MARK_CONFLICT}
), node AS (
    UPDATE fleet_node SET
        reported_hostname = COALESCE(%s, reported_hostname),
        agent_version = COALESCE(%s, agent_version),
        driver_version = COALESCE(%s, driver_version),
        last_seen_at = COALESCE(%s, last_seen_at),
        spool_dropped_total = spool_dropped_total + %s
    WHERE id = %s AND %s AND (SELECT gpus AND token FROM ok)
)
SELECT gpus, token, (SELECT count(*) FROM inserted) FROM ok
"""  # noqa: S608 - table and column names are constants of this module


@dataclass(frozen=True, slots=True)
class NodeUpdate:
    """What a push changes on its node row (None: leave as is); see ingest._node_changes."""

    node_id: int
    reported_hostname: str | None = None
    agent_version: str | None = None
    driver_version: str | None = None
    last_seen_at: dt.datetime | None = None
    spool_dropped: int = 0

    def written(self) -> dict[str, Any]:
        """The node attributes this sets (not the dropped count, which it adds to)."""
        names = ("reported_hostname", "agent_version", "driver_version", "last_seen_at")
        return {n: v for n in names if (v := getattr(self, n)) is not None}


def one_statement(rows: Sequence[tuple[Any, ...]]) -> bool:
    """Whether :func:`samples_store` writes ``rows`` with one statement (no transaction)."""
    return 0 < len(rows) <= ONE_STATEMENT_MAX_ROWS and connection.vendor == "postgresql"


def samples_store_one_statement(
    *,
    rows: Sequence[tuple[Any, ...]],
    now: dt.datetime,
    token_id: int | None,
    verify: Mapping[int, tuple[int, int | None]] | None = None,
    node_update: NodeUpdate | None = None,
) -> int:
    """PostgreSQL, a small batch: store ``rows`` in one statement; returns how many were new.

    Needs no transaction of its own (autocommit makes the statement one): the new samples,
    the GPUs' first/last seen from the rows really inserted (duplicates change nothing and are
    counted), the hour marks (:func:`telemetry.pending.hours_mark`'s upsert) and
    ``node_update`` commit together, and only while the node token ``token_id`` (unless None)
    is not revoked (:class:`TokenRevoked` otherwise: authentication may come from a cache). With
    ``verify`` and a GPU that no longer matches, nothing is written and :class:`StaleGpus` is
    raised.
    """
    node = node_update or NodeUpdate(node_id=0)
    params: list[Any] = [
        msgspec.json.encode([dict(zip(COLUMNS, row, strict=True)) for row in rows]).decode(),
        *_gpus_match_params(verify, sorted({row[0] for row in rows})),
        token_id,
        token_id,
        now,
        now,
        node.reported_hostname,
        node.agent_version,
        node.driver_version,
        node.last_seen_at,
        node.spool_dropped,
        node.node_id,
        node_update is not None,
    ]
    with prepared_cursor() as cursor:
        cursor.execute(_ONE_STATEMENT, params)
        gpus_ok, token_ok, stored = cursor.fetchone()
    if not token_ok:
        raise TokenRevoked("the node token was revoked")
    if not gpus_ok:
        raise StaleGpus("a GPU changed since it was read")
    return int(stored)


class _PreparedCursor(psycopg.Cursor[Any]):
    """Server-side binding, and every statement prepared (Django's cursors bind client-side)."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        kwargs["prepare"] = True
        return super().execute(query, params, **kwargs)


@contextmanager
def prepared_cursor() -> Iterator[Any]:
    """A Django cursor (query logging, execute wrappers, error translation) whose statements
    are prepared once per connection: for statements of constant text run on every push."""
    with connection.cursor() as wrapper:
        raw = connection.connection
        if raw.prepare_threshold is None:
            # Django turns psycopg's automatic preparing off (None), which also makes it ignore
            # prepare=True; a threshold nothing reaches turns explicit preparing back on only.
            raw.prepare_threshold = _NEVER
        plain = wrapper.cursor
        wrapper.cursor = _PreparedCursor(raw)
        plain.close()
        yield wrapper


_NEVER = 2**31 - 1


class TokenRevoked(Exception):
    """The node token was revoked after the (cached) authentication of this push."""


def token_valid(token_id: int) -> bool:
    """Whether node token ``token_id`` still exists and is not revoked."""
    with connection.cursor() as cursor:
        cursor.execute(_TOKEN_LIVE, [token_id])
        return cursor.fetchone() is not None


class DuplicateSamples(Exception):
    """The optimistic COPY met a sample already stored (or one twice in the batch)."""


class StaleGpus(Exception):
    """A GPU no longer has the owner or total memory the caller validated against (``verify``).

    Nothing was written once the caller's transaction rolls back; validate again from the
    database and store again.
    """


# SQLite allows 32,766 bound parameters per statement; 19 columns × 1,000 rows stays below.
SQLITE_CHUNK_ROWS = 1000


def samples_store(
    *,
    rows: Sequence[tuple[Any, ...]],
    now: dt.datetime,
    skip_duplicates: bool = True,
    verify: Mapping[int, tuple[int, int | None]] | None = None,
) -> int:
    """Insert ``rows``; returns how many were new (the rest were duplicates).

    (Where :func:`one_statement` says so, callers use :func:`samples_store_one_statement`.)
    Call inside ``transaction.atomic()``: the samples, the GPUs' first/last seen and the
    pending hours must commit together. With ``skip_duplicates=False`` (PostgreSQL's fast
    path) a duplicate raises :class:`DuplicateSamples`; roll back and call again with True.
    ``verify`` (GPU id → (node id, total memory) the rows were validated against, from a
    cache): on the fast path, a GPU that no longer matches raises :class:`StaleGpus`; roll
    back, validate again from the database, and call again.
    """
    if not rows:
        return 0
    if connection.vendor != "postgresql":
        return _store_generic(rows, now)
    if skip_duplicates:
        return _store_staged(rows, now)
    return _store_direct(rows, now, verify)


def _copy(cursor: Any, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Binary COPY of ``rows``; psycopg's errors become Django's (a lost connection is then
    an OperationalError, which the API answers with 503)."""
    with connection.wrap_database_errors, cursor.copy(sql) as copy:
        copy.set_types(COPY_TYPES)
        for row in rows:
            copy.write_row(row)


def _store_direct(
    rows: Sequence[tuple[Any, ...]],
    now: dt.datetime,
    verify: Mapping[int, tuple[int, int | None]] | None = None,
) -> int:
    import psycopg

    with connection.cursor() as cursor:
        try:
            _copy(cursor, _DIRECT_COPY, rows)
        except IntegrityError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise
            raise DuplicateSamples(str(exc).splitlines()[0]) from exc
        # Every row is new: first/last seen and the hours come from the rows themselves.
        seen = _seen_per_gpu(rows, now)
        # In id order, so two pushes of one node lock their GPUs' rows in the same order.
        ids = sorted(seen)
        params: list[Any] = [
            *_gpus_match_params(verify, ids),
            ids,
            [seen[i][0] for i in ids],
            [seen[i][1] for i in ids],
            # Hours of the distinct starts: a 1,000-sample batch has ~125 starts in 3 hours.
            sorted({_hour(start) for start in {row[1] for row in rows}}),
            now,
        ]
        with prepared_cursor() as prepared:
            prepared.execute(_GPU_SEEN, params)
            (gpus_ok,) = prepared.fetchone()
    if not gpus_ok:
        # A GPU was moved to another node, deleted, or its memory changed since the cache
        # was filled: the caller rolls back and validates again.
        raise StaleGpus("a GPU changed since it was read")
    return len(rows)


def _hour(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def _seen_per_gpu(
    rows: Sequence[tuple[Any, ...]], now: dt.datetime
) -> dict[int, tuple[dt.datetime, dt.datetime]]:
    """Per GPU: the earliest start and the latest end (not past ``now``) of ``rows``."""
    spans: dict[int, list[dt.datetime]] = {}
    lengths: dict[int, dt.timedelta] = {}
    for row in rows:
        gpu_id, start, seconds = row[0], row[1], row[2]
        length = lengths.get(seconds)
        if length is None:
            length = lengths[seconds] = dt.timedelta(seconds=seconds)
        end = start + length
        span = spans.get(gpu_id)
        if span is None:
            spans[gpu_id] = [start, end]
        else:
            if start < span[0]:
                span[0] = start
            if end > span[1]:
                span[1] = end
    return {gpu_id: (first, min(last, now)) for gpu_id, (first, last) in spans.items()}


def _store_staged(rows: Sequence[tuple[Any, ...]], now: dt.datetime) -> int:
    connection.ensure_connection()
    raw = connection.connection
    with connection.cursor() as cursor:
        if raw not in _staged_sessions:
            cursor.execute(_STAGE_CREATE)
            connection.on_commit(lambda: _staged_sessions.add(raw))
        _copy(cursor, _STAGE_COPY, rows)
        cursor.execute(_STAGE_MERGE, [now])
        touched = cursor.fetchall()
    hours_mark(hour for hour, _ in touched)
    return sum(n for _, n in touched)


def _store_generic(rows: Sequence[tuple[Any, ...]], now: dt.datetime) -> int:
    """SQLite (the embedded default): small volumes, so plain SQL and the ORM suffice."""
    adapt = connection.ops.adapt_datetimefield_value
    by_key: dict[tuple[int, Any], tuple[Any, ...]] = {}
    inserted: list[tuple[Any, ...]] = []
    one = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
    with connection.cursor() as cursor:
        for at in range(0, len(rows), SQLITE_CHUNK_ROWS):
            chunk = rows[at : at + SQLITE_CHUNK_ROWS]
            params: list[Any] = []
            for row in chunk:
                start = adapt(row[1])
                by_key.setdefault((row[0], start), row)  # the first of a repeated key wins
                params += [row[0], start, *row[2:-1], adapt(row[-1])]
            cursor.execute(
                f"INSERT OR IGNORE INTO telemetry_sample ({_COLS}) VALUES "  # noqa: S608
                + ", ".join([one] * len(chunk))
                + " RETURNING gpu_id, start",
                params,
            )
            # The driver may hand ``start`` back parsed (naive UTC) or as stored text.
            inserted += [by_key[(gpu_id, str(start))] for gpu_id, start in cursor.fetchall()]
    for gpu_id, (first, last) in _seen_per_gpu(inserted, now).items():
        first_v = Value(first, output_field=DateTimeField())
        last_v = Value(last, output_field=DateTimeField())
        Gpu.objects.filter(pk=gpu_id).update(
            first_seen_at=Least(Coalesce("first_seen_at", first_v), first_v),
            last_seen_at=Greatest(Coalesce("last_seen_at", last_v), last_v),
        )
    hours_mark({_hour(row[1]) for row in inserted})
    return len(inserted)
