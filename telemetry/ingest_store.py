"""Writes one validated push: samples, first/last seen, hour marks and the node row, together.

A row is a tuple in :data:`COLUMNS` order, built by ``telemetry.ingest``. :func:`push_store`
is the one way in. Whatever path it takes, the write itself checks, within its transaction,
the two facts that may have changed since ingest read them:

- **ownership**: a node writes only the GPUs it owns at the moment of the write. Rows of a GPU
  that was moved to another node (or deleted) are not stored and come back in
  :attr:`Stored.not_owned`, so they are rejected like any invalid sample;
- **the token**: a node token revoked since authentication read it (authentication keeps
  token facts per process) stores nothing and raises :class:`TokenRevoked`.

Duplicates ``(gpu_id, start)`` change nothing and are counted. The paths, measured in
bench/ingest.py and docs/benchmarks.md:

- PostgreSQL, up to :data:`ONE_STATEMENT_MAX_ROWS` rows (a node's minute): one prepared
  statement in autocommit does everything above, one round trip;
- PostgreSQL, larger batches: one transaction; the node's GPU rows are share-locked (a move
  waits for the push to commit), binary COPY straight into ``telemetry_sample`` inside a
  savepoint, and where that meets a duplicate, the savepoint is rolled back and the rows go
  through a staging table and ``INSERT … ON CONFLICT DO NOTHING`` instead;
- SQLite (the embedded default): one transaction, which SQLite's IMMEDIATE mode serialises
  with every other writer; plain multi-row ``INSERT OR IGNORE``.
"""

from __future__ import annotations

import datetime as dt
import json
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg
from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, Value
from django.db.models.functions import Coalesce, Greatest, Least

from fleet.models import Gpu
from telemetry.models import WORKLOAD_CLAIM_FIELDS, Workload
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
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "prof_s",
    "workload_ids",
    "workload_share_s",
    "workload_air_s",
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
    "float8",
    "float8",
    "float8",
    "float8",
    "int8[]",
    "float8[]",
    "float8[]",
    "timestamptz",
)
STAGE_TABLE = "telemetry_ingest_stage"
_COLS = ", ".join(COLUMNS)

# --- job sums (docs/ingest.md, "job") ----------------------------------------------------------
# What ingest hands over per valid sample with a ``job``: (gpu_id, start, workload_id or None,
# model, then JOB_SUMS in order). They are added to ``telemetry_jobhour`` (gpu, hour, workload,
# model) in the samples' own transaction, for the samples really inserted only: a duplicate
# sample adds nothing, exactly as it stores nothing.
JOB_SUMS = (
    "steps",
    "samples",
    "tokens",
    "flops",
    "ckpt_bytes",
    "wall_s",
    "data_wait_s",
    "compute_s",
    "ckpt_s",
    "flops_wall_s",
)
JobRow = tuple[Any, ...]
_JOB_COLS = "gpu_id, hour, workload_id, model, reports, " + ", ".join(JOB_SUMS)
_JOB_ADD = ", ".join(f"{c} = telemetry_jobhour.{c} + excluded.{c}" for c in ("reports", *JOB_SUMS))
_JOB_CONFLICT = f"""ON CONFLICT (gpu_id, hour, (COALESCE(workload_id, 0)), model) DO UPDATE
    SET {_JOB_ADD}"""  # noqa: S608 - constants of this module
# PostgreSQL, within a statement whose ``inserted`` CTE returns the samples really inserted:
# the jobs (one JSON parameter) of those samples, summed per key first (ON CONFLICT may not
# touch one row twice in a statement).
_JOBS_FROM_INSERTED = f"""), jobs AS (
    INSERT INTO telemetry_jobhour ({_JOB_COLS})
    SELECT j.gpu_id, date_trunc('hour', j.start, 'UTC'), j.workload_id, j.model, count(*),
           {", ".join(f"sum(j.{c})" for c in JOB_SUMS)}
    FROM json_to_recordset(%s::json) AS j(
        gpu_id int8, start timestamptz, workload_id int8, model text,
        {", ".join(f"{c} float8" for c in JOB_SUMS)})
    JOIN inserted AS i ON i.gpu_id = j.gpu_id AND i.start = j.start
    GROUP BY 1, 2, 3, 4
    {_JOB_CONFLICT}
"""  # noqa: S608 - constants of this module


def _jobs_json(jobs: Sequence[JobRow]) -> str:
    names = ("gpu_id", "start", "workload_id", "model", *JOB_SUMS)
    return msgspec.json.encode([dict(zip(names, j, strict=True)) for j in jobs]).decode()


def _jobs_add(jobs: Sequence[JobRow]) -> None:
    """Add ``jobs`` (of samples all inserted) to their hours, summed per key first: the
    paths that know their inserted rows (direct COPY, SQLite)."""
    if not jobs:
        return
    sums: dict[tuple[Any, ...], list[Any]] = {}
    for j in jobs:
        key = (j[0], _hour(j[1]), j[2], j[3])
        acc = sums.get(key)
        if acc is None:
            sums[key] = [1, *j[4:]]
        else:
            acc[0] += 1
            for k, v in enumerate(j[4:], start=1):
                acc[k] += v
    adapt = connection.ops.adapt_datetimefield_value
    one = "(" + ", ".join(["%s"] * (5 + len(JOB_SUMS))) + ")"
    items = list(sums.items())
    with connection.cursor() as cursor:
        for at in range(0, len(items), SQLITE_CHUNK_ROWS):
            chunk = items[at : at + SQLITE_CHUNK_ROWS]
            params: list[Any] = []
            for (gpu_id, hour, workload_id, model), acc in chunk:
                params += [gpu_id, adapt(hour), workload_id, model, *acc]
            cursor.execute(
                f"INSERT INTO telemetry_jobhour ({_JOB_COLS}) VALUES "  # noqa: S608
                + ", ".join([one] * len(chunk))
                + f" {_JOB_CONFLICT}",
                params,
            )


@dataclass(frozen=True, slots=True)
class NodeUpdate:
    """What a push says about its node: the values the agent sent (None: not sent, leave as
    is) and the samples its full spool dropped. The node row is written only when one of the
    values differs, the node was last seen :data:`NODE_SEEN_RESOLUTION` ago or more, or the
    spool dropped samples (:data:`_NODE_UPDATE`)."""

    node_id: int
    reported_hostname: str | None = None
    agent_version: str | None = None
    driver_version: str | None = None
    spool_dropped: int = 0
    alloc_problem: str | None = None
    alloc_skipped_files: int | None = None


@dataclass(slots=True)
class Stored:
    """What :func:`push_store` did: new rows, duplicates, and the positions (in the rows given)
    of rows not stored because their GPU is not the node's."""

    accepted: int = 0
    duplicates: int = 0
    not_owned: list[int] = field(default_factory=list)


class TokenRevoked(Exception):
    """The node token was revoked after authentication read it: nothing was stored."""


# --- the node row -------------------------------------------------------------------------------
# "Last seen" needs no finer resolution than a minute; skipping the write when nothing changed
# keeps most pushes of an agent with a short interval to the samples alone.
NODE_SEEN_RESOLUTION = dt.timedelta(seconds=60)
# One statement for both dialects (the columns are NOT NULL, so ``<>`` is null-safe here); the
# one-statement path embeds it as a CTE. Parameters: :func:`_node_update_params`.
_NODE_UPDATE = """UPDATE fleet_node SET
        reported_hostname = COALESCE(%s, reported_hostname),
        agent_version = COALESCE(%s, agent_version),
        driver_version = COALESCE(%s, driver_version),
        alloc_problem = COALESCE(%s, alloc_problem),
        alloc_skipped_files = COALESCE(%s, alloc_skipped_files),
        last_seen_at = %s,
        spool_dropped_total = spool_dropped_total + %s
    WHERE id = %s AND (
        last_seen_at IS NULL OR last_seen_at <= %s OR %s > 0
        OR reported_hostname <> COALESCE(%s, reported_hostname)
        OR agent_version <> COALESCE(%s, agent_version)
        OR driver_version <> COALESCE(%s, driver_version)
        OR alloc_problem <> COALESCE(%s, alloc_problem)
        OR alloc_skipped_files <> COALESCE(%s, alloc_skipped_files)
    )"""


def _node_update_params(node: NodeUpdate, now: dt.datetime) -> list[Any]:
    values = [
        node.reported_hostname,
        node.agent_version,
        node.driver_version,
        node.alloc_problem,
        node.alloc_skipped_files,
    ]
    # As the column stores them (naive UTC text on SQLite), so that the comparison holds.
    adapt = connection.ops.adapt_datetimefield_value
    due, seen = adapt(now - NODE_SEEN_RESOLUTION), adapt(now)
    return [*values, seen, node.spool_dropped, node.node_id, due, node.spool_dropped, *values]


# --- first/last seen ----------------------------------------------------------------------------
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

# The node token ``%s`` exists and is not revoked.
_TOKEN_LIVE = "SELECT 1 FROM fleet_nodetoken WHERE id = %s AND revoked_at IS NULL"


def token_live(token_id: int) -> bool:
    """Whether node token ``token_id`` still exists and is not revoked."""
    with connection.cursor() as cursor:
        cursor.execute(_TOKEN_LIVE, [token_id])
        return cursor.fetchone() is not None


# --- workloads ----------------------------------------------------------------------------------
# What ingest hands over for a push's workloads: one claim per workload per valid sample, in push
# order: (gpu_id, start, kind, id, user, account, name), a name "" where the agent sent none.
Claim = tuple[int, dt.datetime, str, str, str, str, str]
# A claim's last seen needs no finer resolution (as a GPU's): a node that keeps claiming another
# name for a workload would otherwise rewrite its claim row on every push.
CLAIM_SEEN_RESOLUTION = dt.timedelta(minutes=5)
# PostgreSQL registers a push's workloads in one statement; off, it takes the generic path of
# SQLite (tests run both against the same expectations).
WORKLOADS_ONE_STATEMENT = True
# Keys per statement of the generic path (SQLite binds at most 32,766 parameters).
_KEYS_PER_STATEMENT = 500


class WorkloadCapExceeded(Exception):
    """The push's new workloads do not fit in its node's hourly cap: nothing was written."""

    def __init__(self, *, used: int, new: int, cap: int) -> None:
        super().__init__(f"{new} new workloads; {used} of {cap} registered this hour")
        self.used, self.new, self.cap = used, new, cap


# A workload is identified by (the site of the reporting node, kind, id): the node's own site,
# else its pool's; no site is site 0 in the identity (telemetry.models.Workload).
_NODE_SITE = (
    "(SELECT COALESCE(n.site_id, p.site_id) FROM fleet_node AS n"
    " LEFT JOIN fleet_pool AS p ON p.id = n.pool_id WHERE n.id = {node})"
)
_CLAIM_INSERT = """INSERT INTO telemetry_workloadclaim
    (workload_id, node_id, field, value, first_seen_at, last_seen_at)"""
# A claim seen before is only touched when its last seen is older than the resolution ({due}).
_CLAIM_UPSERT = """ON CONFLICT (workload_id, node_id, field, value) DO UPDATE
    SET last_seen_at = excluded.last_seen_at
    WHERE telemetry_workloadclaim.last_seen_at <= {due}"""
# Counts a capped push's new workloads in its node's current hour and forgets the node's past
# hours, so the table keeps a row or two per node.
_REGISTRATIONS_ADD = """INSERT INTO telemetry_workloadregistrations (node_id, hour, registered)
    {rows}
    ON CONFLICT (node_id, hour) DO UPDATE
    SET registered = telemetry_workloadregistrations.registered + excluded.registered"""
_REGISTRATIONS_PRUNE = (
    "DELETE FROM telemetry_workloadregistrations WHERE node_id = {node} AND hour < {hour}"
)

# PostgreSQL: the rest in one prepared statement of constant text (the workloads travel as one
# JSON parameter), so a push's workloads cost one round trip after the probe of which samples
# are stored already (:func:`_claims_fresh`):
# - ``ok``: the token is live, and the new workloads fit in the node's hourly cap (``cap``
#   NULL: no cap); otherwise nothing is written and the first row says why;
# - ``added``: new workloads, owned by this node; ``renamed``: a workload this node owns (or
#   one registered before workloads had owners, which it adopts) takes its non-empty names;
# - ``claims``: another node's names that differ are kept beside them.
# Within one statement the INSERT's rows are not visible to a SELECT, so the ids come from
# ``existing`` and ``added``; a workload another push registered after this statement's
# snapshot comes back without an id and goes through the generic path.
_WORKLOADS_ONE_STATEMENT = f"""
WITH wanted AS (
    SELECT * FROM json_to_recordset(%(workloads)s::json)
        AS r(kind text, key text, user_name text, account text, name text)
), site AS (
    SELECT COALESCE({_NODE_SITE.format(node="%(node)s::int8")}, 0) AS id
), existing AS (
    SELECT w.id, w.kind, w.key, w.identity_node_id AS owner, w.user_name, w.account, w.name
    FROM telemetry_workload AS w JOIN wanted AS x ON w.kind = x.kind AND w.key = x.key
    WHERE COALESCE(w.site_id, 0) = (SELECT id FROM site)
), new AS (
    SELECT x.* FROM wanted AS x
    WHERE NOT EXISTS (SELECT 1 FROM existing AS e WHERE e.kind = x.kind AND e.key = x.key)
), used AS (
    SELECT COALESCE((SELECT registered FROM telemetry_workloadregistrations
                     WHERE node_id = %(node)s::int8 AND hour = %(hour)s::timestamptz), 0) AS n
), ok AS (
    SELECT (%(token)s::int8 IS NULL OR EXISTS (
                SELECT 1 FROM fleet_nodetoken WHERE id = %(token)s::int8 AND revoked_at IS NULL
            )) AS token,
           (%(cap)s::int4 IS NULL
            OR (SELECT n FROM used) + (SELECT count(*) FROM new) <= %(cap)s::int4) AS room
), go AS (
    SELECT token AND room AS go FROM ok
), added AS (
    INSERT INTO telemetry_workload
        (site_id, kind, key, user_name, account, name, identity_node_id, created_at)
    SELECT NULLIF((SELECT id FROM site), 0), x.kind, x.key, x.user_name, x.account, x.name,
           %(node)s::int8, %(now)s::timestamptz
    FROM new AS x
    WHERE (SELECT go FROM go)
    ON CONFLICT ((COALESCE(site_id, 0)), kind, key) DO NOTHING
    RETURNING id, kind, key
), counted AS (
    {
    _REGISTRATIONS_ADD.format(
        rows='''SELECT %(node)s::int8, %(hour)s::timestamptz, count(*)
    FROM added WHERE %(cap)s::int4 IS NOT NULL HAVING count(*) > 0'''
    )
}
), pruned AS (
    {_REGISTRATIONS_PRUNE.format(node="%(node)s::int8", hour="%(hour)s::timestamptz")}
    AND %(cap)s::int4 IS NOT NULL AND EXISTS (SELECT 1 FROM added)
), renamed AS (
    UPDATE telemetry_workload AS w SET
        user_name = COALESCE(NULLIF(x.user_name, ''), w.user_name),
        account = COALESCE(NULLIF(x.account, ''), w.account),
        name = COALESCE(NULLIF(x.name, ''), w.name),
        identity_node_id = %(node)s::int8
    FROM existing AS e JOIN wanted AS x ON e.kind = x.kind AND e.key = x.key
    WHERE w.id = e.id AND (SELECT go FROM go)
      AND (e.owner IS NULL
           OR (e.owner = %(node)s::int8
               AND ((x.user_name <> '' AND x.user_name <> e.user_name)
                    OR (x.account <> '' AND x.account <> e.account)
                    OR (x.name <> '' AND x.name <> e.name))))
), claims AS (
    {_CLAIM_INSERT}
    SELECT e.id, %(node)s::int8, f.field, f.claimed, %(now)s::timestamptz, %(now)s::timestamptz
    FROM existing AS e JOIN wanted AS x ON e.kind = x.kind AND e.key = x.key
    CROSS JOIN LATERAL (VALUES ('user', x.user_name, e.user_name),
                               ('account', x.account, e.account),
                               ('name', x.name, e.name)) AS f(field, claimed, stored)
    WHERE (SELECT go FROM go) AND e.owner <> %(node)s::int8
      AND f.claimed <> '' AND f.claimed <> f.stored
    {_CLAIM_UPSERT.format(due="%(due)s::timestamptz")}
)
SELECT ok.token, ok.room, (SELECT n FROM used), (SELECT count(*) FROM new), r.kind, r.key, r.id
FROM ok LEFT JOIN (
    SELECT x.kind, x.key, COALESCE(e.id, a.id) AS id
    FROM wanted AS x
    LEFT JOIN existing AS e ON e.kind = x.kind AND e.key = x.key
    LEFT JOIN added AS a ON a.kind = x.kind AND a.key = x.key
) AS r ON (SELECT go FROM go)
"""  # noqa: S608 - constants of this module


def workloads_register(
    *,
    node_id: int,
    claims: Sequence[Claim],
    token_id: int | None,
    now: dt.datetime,
    max_new_per_hour: int | None = None,
) -> dict[tuple[str, str], int]:
    """The ids of the workloads named by those of ``claims`` (the valid samples of a push of
    node ``node_id``) whose samples are not stored yet, registering new ones, taking this
    node's names where it owns the workload and recording them as claims where it does not
    (docs/ingest.md, "Whose names count"). A sample stored already names nothing.

    ``max_new_per_hour``: at most this many new workloads per node and UTC hour (None: no
    cap). Raises :class:`WorkloadCapExceeded` when the push's new ones do not fit, and
    :class:`TokenRevoked` when token ``token_id`` is not live; both write nothing.
    """
    if not claims:
        return {}
    wanted: dict[tuple[str, str], tuple[str, str, str]] = {}
    for c in _claims_fresh(claims):
        wanted[(c[2], c[3])] = c[4:]  # the last sample of the push names it
    if not wanted:
        return {}
    if connection.vendor != "postgresql" or not WORKLOADS_ONE_STATEMENT:
        return _register_generic(node_id, wanted, token_id, now, max_new_per_hour)
    records = [
        {"kind": k[0], "key": k[1], "user_name": u, "account": a, "name": n}
        for k, (u, a, n) in wanted.items()
    ]
    params = {
        "workloads": msgspec.json.encode(records).decode(),
        "node": node_id,
        "token": token_id,
        "cap": max_new_per_hour,
        "hour": _hour(now),
        "now": now,
        "due": now - CLAIM_SEEN_RESOLUTION,
    }
    with prepared_cursor() as cursor:
        cursor.execute(_WORKLOADS_ONE_STATEMENT, params)
        rows = cursor.fetchall()
    token_ok, room, used, new = rows[0][:4]
    if not token_ok:
        raise TokenRevoked("the node token was revoked")
    if not room:
        raise WorkloadCapExceeded(used=int(used), new=int(new), cap=int(max_new_per_hour or 0))
    ids = {(kind, key): pk for *_, kind, key, pk in rows if pk is not None}
    late = {(kind, key): wanted[(kind, key)] for *_, kind, key, pk in rows if kind and pk is None}
    if late:
        # Registered by another push after this statement's snapshot was taken: the generic
        # path sees their rows now (and records this node's names as it would have).
        ids |= _register_generic(node_id, late, token_id, now, max_new_per_hour)
    return ids


def _register_generic(
    node_id: int,
    wanted: dict[tuple[str, str], tuple[str, str, str]],
    token_id: int | None,
    now: dt.datetime,
    cap: int | None,
) -> dict[tuple[str, str], int]:
    """:func:`workloads_register` for ``wanted`` ((kind, id) → (user, account, name) of the
    new samples) in plain statements, one transaction (SQLite: IMMEDIATE, so no other writer
    runs between the cap's count and the insert)."""
    hour = _hour(now)
    adapt = connection.ops.adapt_datetimefield_value
    with transaction.atomic(), connection.cursor() as cursor:
        if token_id is not None and not token_live(token_id):
            raise TokenRevoked("the node token was revoked")
        cursor.execute(f"SELECT COALESCE({_NODE_SITE.format(node='%s')}, 0)", [node_id])
        site_id = int(cursor.fetchone()[0])
        existing = _workloads_read(cursor, site_id, list(wanted))
        new = [k for k in wanted if k not in existing]
        if cap is not None and new:
            cursor.execute(
                "SELECT registered FROM telemetry_workloadregistrations"
                " WHERE node_id = %s AND hour = %s",
                [node_id, adapt(hour)],
            )
            row = cursor.fetchone()
            used = int(row[0]) if row else 0
            if used + len(new) > cap:
                raise WorkloadCapExceeded(used=used, new=len(new), cap=cap)
        if new:
            Workload.objects.bulk_create(
                [
                    Workload(
                        site_id=site_id or None,
                        kind=kind,
                        key=key,
                        user_name=wanted[(kind, key)][0],
                        account=wanted[(kind, key)][1],
                        name=wanted[(kind, key)][2],
                        identity_node_id=node_id,
                        created_at=now,
                    )
                    for kind, key in new
                ],
                ignore_conflicts=True,
                batch_size=_KEYS_PER_STATEMENT,
            )
            if cap is not None:
                cursor.execute(
                    _REGISTRATIONS_ADD.format(rows="VALUES (%s, %s, %s)"),
                    [node_id, adapt(hour), len(new)],
                )
                cursor.execute(
                    _REGISTRATIONS_PRUNE.format(node="%s", hour="%s"), [node_id, adapt(hour)]
                )
        claimed: list[tuple[Any, ...]] = []
        for key, (pk, owner, *stored) in existing.items():
            names = wanted[key]
            if owner is None or owner == node_id:
                if owner is None or any(n and n != s for n, s in zip(names, stored, strict=True)):
                    # One UPDATE per workload whose names change: rare (a job is named once).
                    Workload.objects.filter(pk=pk).update(
                        user_name=names[0] or stored[0],
                        account=names[1] or stored[1],
                        name=names[2] or stored[2],
                        identity_node_id=node_id,
                    )
                continue
            for field_name, n, s in zip(WORKLOAD_CLAIM_FIELDS, names, stored, strict=True):
                if n and n != s:
                    claimed.append((pk, node_id, field_name, n, adapt(now), adapt(now)))
        for at in range(0, len(claimed), _KEYS_PER_STATEMENT):
            chunk = claimed[at : at + _KEYS_PER_STATEMENT]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"{_CLAIM_INSERT} VALUES {values} {_CLAIM_UPSERT.format(due='%s')}",
                [*(v for claim in chunk for v in claim), adapt(now - CLAIM_SEEN_RESOLUTION)],
            )
        ids = {key: row[0] for key, row in existing.items()}
        if new:
            ids |= {k: row[0] for k, row in _workloads_read(cursor, site_id, new).items()}
        return ids


def _claims_fresh(claims: Sequence[Claim]) -> list[Claim]:
    """The claims whose sample (gpu_id, start) is not stored yet, in their order.

    A plain statement with its values inlined (Django binds client-side): the planner then
    reads only the partitions of those starts, through the (gpu_id, start) key. Prepared, a
    generic plan would open and lock every partition of the table on each push."""
    adapt = connection.ops.adapt_datetimefield_value
    # As the column hands it back: SQLite's driver gives naive UTC text or a parsed naive
    # datetime (whose str() is that text); PostgreSQL an aware datetime.
    norm: Callable[[Any], Any] = str if connection.vendor == "sqlite" else (lambda v: v)
    gpu_ids = sorted({c[0] for c in claims})
    starts = list(dict.fromkeys(adapt(c[1]) for c in claims))
    stored: set[tuple[int, Any]] = set()
    with connection.cursor() as cursor:
        for at in range(0, len(starts), _KEYS_PER_STATEMENT):
            chunk = starts[at : at + _KEYS_PER_STATEMENT]
            gpus = ", ".join(["%s"] * len(gpu_ids))
            times = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                # Every (GPU, start) pair of the two lists: a few more than the claims name.
                f"{_SAMPLE_KEYS} WHERE gpu_id IN ({gpus}) AND start IN ({times})",
                [*gpu_ids, *chunk],
            )
            stored.update((gpu_id, norm(start)) for gpu_id, start in cursor.fetchall())
    return [c for c in claims if (c[0], norm(adapt(c[1]))) not in stored]


_SAMPLE_KEYS = "SELECT gpu_id, start FROM telemetry_sample"
_WORKLOADS_READ = """SELECT id, kind, key, identity_node_id, user_name, account, name
    FROM telemetry_workload WHERE COALESCE(site_id, 0) = %s"""


def _workloads_read(
    cursor: Any, site_id: int, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], tuple[Any, ...]]:
    """(kind, id) → (id, identity node, user, account, name) of the site's workloads."""
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for at in range(0, len(keys), _KEYS_PER_STATEMENT):
        chunk = keys[at : at + _KEYS_PER_STATEMENT]
        values = ", ".join(["(%s, %s)"] * len(chunk))
        cursor.execute(
            f"{_WORKLOADS_READ} AND (kind, key) IN (VALUES {values})",
            [site_id, *[part for key in chunk for part in key]],
        )
        for pk, kind, key, owner, user, account, name in cursor.fetchall():
            out[(kind, key)] = (pk, owner, user, account, name)
    return out


# --- PostgreSQL, a small batch: one statement ---------------------------------------------------
# Small batches (a node's minute): one statement in autocommit, so the whole push is one round
# trip and one implicit transaction, where COPY costs BEGIN, COPY, the first/last-seen statement
# and COMMIT. INSERT … ON CONFLICT checks row by row, which costs more than COPY's batched
# insert from a few hundred rows on (bench/ingest.py), hence the bound.
ONE_STATEMENT_MAX_ROWS = 64
# Its text never changes (the rows travel as one JSON parameter with their positions), so it is
# parsed and planned once per connection and then runs as a prepared statement: planning this
# statement cost more than running it, and psycopg does not cache the parsing of long texts.
# Ownership is part of the insert (``owned``): in READ COMMITTED the statement sees every move
# committed before it began, so a moved GPU's rows are never stored after the move.
_ROWS_TYPES = ", ".join(f"{c} {t}" for c, t in zip(COLUMNS, COPY_TYPES, strict=True))
_ONE_STATEMENT = f"""
WITH v AS (
    SELECT * FROM json_to_recordset(%s::json) AS r(pos int4, {_ROWS_TYPES})
), ok AS (
    SELECT %s::int8 IS NULL OR EXISTS ({_TOKEN_LIVE}) AS token
), owned AS (
    SELECT v.* FROM v JOIN fleet_gpu AS g ON g.id = v.gpu_id AND g.node_id = %s
    WHERE (SELECT token FROM ok)
), inserted AS (
    INSERT INTO telemetry_sample ({_COLS})
    SELECT {_COLS} FROM owned
    ON CONFLICT (gpu_id, start) DO NOTHING
    RETURNING gpu_id, start, seconds
{_SEEN_FROM_INSERTED}), marked AS (
    {MARK_INSERT}
    SELECT DISTINCT date_trunc('hour', start, 'UTC'), 1, %s::timestamptz FROM inserted
    {MARK_CONFLICT}
), node AS (
    {_NODE_UPDATE} AND (SELECT token FROM ok)
)
SELECT token, (SELECT count(*) FROM inserted), (SELECT count(*) FROM owned),
       ARRAY(SELECT pos FROM v WHERE pos NOT IN (SELECT pos FROM owned) ORDER BY pos)
FROM ok
"""  # noqa: S608 - table and column names are constants of this module
# The same with the samples' job sums (one more parameter, last): a push without jobs keeps
# the statement above, which it has prepared already.
_ONE_STATEMENT_JOBS = _ONE_STATEMENT.replace(
    "\n)\nSELECT token,", "\n" + _JOBS_FROM_INSERTED + ")\nSELECT token,", 1
)
assert _ONE_STATEMENT_JOBS != _ONE_STATEMENT


def _store_one_statement(
    rows: Sequence[tuple[Any, ...]],
    node: NodeUpdate,
    token_id: int | None,
    now: dt.datetime,
    jobs: Sequence[JobRow] = (),
) -> Stored:
    records = [{"pos": i, **dict(zip(COLUMNS, row, strict=True))} for i, row in enumerate(rows)]
    params: list[Any] = [
        msgspec.json.encode(records).decode(),
        token_id,
        token_id,
        node.node_id,
        now,
        now,
        *_node_update_params(node, now),
    ]
    sql = _ONE_STATEMENT
    if jobs:
        sql = _ONE_STATEMENT_JOBS
        params.append(_jobs_json(jobs))
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        token_ok, inserted, owned, not_owned = cursor.fetchone()
    if not token_ok:
        raise TokenRevoked("the node token was revoked")
    return Stored(accepted=int(inserted), duplicates=owned - inserted, not_owned=list(not_owned))


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


# --- every other path: one transaction ----------------------------------------------------------
def _checked_in_transaction(
    rows: Sequence[tuple[Any, ...]], node: NodeUpdate, token_id: int | None
) -> tuple[list[tuple[Any, ...]], list[int]]:
    """Inside the write's transaction: the rows whose GPU the node owns, and the positions of
    the others; raises :class:`TokenRevoked` when ``token_id`` is no longer live. On
    PostgreSQL the owned GPU rows are share-locked until commit, so a move waits for this push
    (SQLite's IMMEDIATE transactions already exclude every other writer)."""
    if token_id is not None and not token_live(token_id):
        raise TokenRevoked("the node token was revoked")
    if not rows:
        return [], []
    with connection.cursor() as cursor:
        gpu_ids = sorted({row[0] for row in rows})
        ids = ", ".join(["%s"] * len(gpu_ids))
        lock = " FOR SHARE" if connection.vendor == "postgresql" else ""
        cursor.execute(
            # In id order, so two pushes of one node lock their GPUs in the same order.
            f"SELECT id FROM fleet_gpu WHERE node_id = %s AND id IN ({ids}) ORDER BY id{lock}",  # noqa: S608
            [node.node_id, *gpu_ids],
        )
        owned = {gpu_id for (gpu_id,) in cursor.fetchall()}
    kept = [row for row in rows if row[0] in owned]
    return kept, [i for i, row in enumerate(rows) if row[0] not in owned]


def push_store(
    *,
    rows: Sequence[tuple[Any, ...]],
    node: NodeUpdate,
    token_id: int | None,
    now: dt.datetime,
    jobs: Sequence[JobRow] = (),
) -> Stored:
    """Store one push of node ``node.node_id`` (module docstring): its rows (duplicates change
    nothing), each GPU's first/last seen, the hours to roll up and the node row, all or nothing.
    ``jobs``: the job sums of its samples (:data:`JobRow`, at most one per (gpu, start)),
    added for the samples inserted, in the same transaction.

    ``token_id``: the node token it came with, checked live within the write (None: a caller
    that needs none, such as the demo's history). Raises :class:`TokenRevoked`; database errors
    propagate (the API answers 503 and the agent retries the push later).
    """
    if connection.vendor == "postgresql" and len(rows) <= ONE_STATEMENT_MAX_ROWS:
        # Also an empty push (the node row and the token check): one round trip.
        return _store_one_statement(rows, node, token_id, now, jobs)
    with transaction.atomic():
        kept, not_owned = _checked_in_transaction(rows, node, token_id)
        if connection.vendor == "postgresql":
            accepted = _store_postgresql(kept, now, jobs)
        else:
            accepted = _store_generic(kept, now, jobs)
        with connection.cursor() as cursor:
            cursor.execute(_NODE_UPDATE, _node_update_params(node, now))
    return Stored(accepted=accepted, duplicates=len(kept) - accepted, not_owned=not_owned)


# --- PostgreSQL, a large batch ------------------------------------------------------------------
# After the direct COPY, one statement: the GPUs' first/last seen and the hour marks (a
# data-modifying CTE, so this costs one round trip, not two).
_GPU_SEEN = f"""
WITH p AS (
    SELECT * FROM unnest(%s::int8[], %s::timestamptz[], %s::timestamptz[])
        AS p(id, first_start, last_end)
), seen AS (
    UPDATE fleet_gpu AS g SET {_SEEN_SET}
    FROM p WHERE g.id = p.id AND {_SEEN_DUE}
)
{MARK_INSERT}
SELECT unnest(%s::timestamptz[]), 1, %s::timestamptz
{MARK_CONFLICT}
"""  # noqa: S608 - constants of this module
_DIRECT_COPY = f"COPY telemetry_sample ({_COLS}) FROM STDIN (FORMAT BINARY)"

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
# Hours are UTC hours.
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
_STAGE_MERGE_JOBS = _STAGE_MERGE.replace(
    "\n)\nSELECT date_trunc", "\n" + _JOBS_FROM_INSERTED + ")\nSELECT date_trunc", 1
)
assert _STAGE_MERGE_JOBS != _STAGE_MERGE

# Raw psycopg connections whose session already holds the staging table (set after a commit:
# a rolled-back CREATE leaves no table behind).
_staged_sessions: weakref.WeakSet[Any] = weakref.WeakSet()


class _Duplicate(Exception):
    """The direct COPY met a sample already stored (or one twice in the batch)."""


def _store_postgresql(
    rows: Sequence[tuple[Any, ...]], now: dt.datetime, jobs: Sequence[JobRow] = ()
) -> int:
    """Nearly every push holds only new samples: binary COPY straight into the partitioned
    table batches its inserts, where ``INSERT … ON CONFLICT`` checks row by row (it doubled a
    1,000-sample batch's database time). A duplicate fails the COPY: its savepoint is rolled
    back and the rows go through the staging table, which skips and counts duplicates."""
    if not rows:
        return 0
    try:
        with transaction.atomic():
            _store_direct(rows, now)
            # every row was inserted: so were the samples of every job whose GPU is kept
            kept = {row[0] for row in rows}
            _jobs_add([j for j in jobs if j[0] in kept])
        return len(rows)
    except _Duplicate:
        return _store_staged(rows, now, jobs)


def _copy(cursor: Any, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Binary COPY of ``rows``; psycopg's errors become Django's (a lost connection is then
    an OperationalError, which the API answers with 503)."""
    with connection.wrap_database_errors, cursor.copy(sql) as copy:
        copy.set_types(COPY_TYPES)
        for row in rows:
            copy.write_row(row)


def _store_direct(rows: Sequence[tuple[Any, ...]], now: dt.datetime) -> None:
    with connection.cursor() as cursor:
        try:
            _copy(cursor, _DIRECT_COPY, rows)
        except IntegrityError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise
            raise _Duplicate(str(exc).splitlines()[0]) from exc
    # Every row is new: first/last seen and the hours come from the rows themselves.
    seen = _seen_per_gpu(rows, now)
    ids = sorted(seen)
    params: list[Any] = [
        ids,
        [seen[i][0] for i in ids],
        [seen[i][1] for i in ids],
        # Hours of the distinct starts: a 1,000-sample batch has ~125 starts in 3 hours.
        sorted({_hour(start) for start in {row[1] for row in rows}}),
        now,
    ]
    with prepared_cursor() as prepared:
        prepared.execute(_GPU_SEEN, params)


def _store_staged(
    rows: Sequence[tuple[Any, ...]], now: dt.datetime, jobs: Sequence[JobRow] = ()
) -> int:
    connection.ensure_connection()
    raw = connection.connection
    with connection.cursor() as cursor:
        if raw not in _staged_sessions:
            cursor.execute(_STAGE_CREATE)
            connection.on_commit(lambda: _staged_sessions.add(raw))
        _copy(cursor, _STAGE_COPY, rows)
        if jobs:
            cursor.execute(_STAGE_MERGE_JOBS, [now, _jobs_json(jobs)])
        else:
            cursor.execute(_STAGE_MERGE, [now])
        touched = cursor.fetchall()
    hours_mark(hour for hour, _ in touched)
    return sum(n for _, n in touched)


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


# --- SQLite -------------------------------------------------------------------------------------
# SQLite allows 32,766 bound parameters per statement; 19 columns × 1,000 rows stays below.
SQLITE_CHUNK_ROWS = 1000


def _store_generic(
    rows: Sequence[tuple[Any, ...]], now: dt.datetime, jobs: Sequence[JobRow] = ()
) -> int:
    """SQLite (the embedded default): small volumes, so plain SQL and the ORM suffice."""
    adapt = _sqlite_adapters()
    by_key: dict[tuple[int, Any], tuple[Any, ...]] = {}
    inserted: list[tuple[Any, ...]] = []
    one = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
    with connection.cursor() as cursor:
        for at in range(0, len(rows), SQLITE_CHUNK_ROWS):
            chunk = rows[at : at + SQLITE_CHUNK_ROWS]
            params: list[Any] = []
            for row in chunk:
                values = [
                    v if f is None or v is None else f(v) for f, v in zip(adapt, row, strict=True)
                ]
                by_key.setdefault((row[0], values[1]), row)  # the first of a repeated key wins
                params += values
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
    if jobs:
        new = {(row[0], row[1]) for row in inserted}
        _jobs_add([j for j in jobs if (j[0], j[1]) in new])
    return len(inserted)


def _sqlite_adapters() -> list[Callable[[Any], Any] | None]:
    """Per column of :data:`COLUMNS`: how SQLite stores it (times as Django's text, arrays as
    JSON, see ``telemetry.fields``), or None for a value stored as it is."""
    times = connection.ops.adapt_datetimefield_value
    return [
        times if t == "timestamptz" else _json_list if t.endswith("[]") else None
        for t in COPY_TYPES
    ]


def _json_list(values: Sequence[Any]) -> str:
    return json.dumps(list(values))


# --- MIG instances (docs/ingest.md, "mig" and "instance") ---------------------------------------
# A push without a ``mig`` block and without instance samples costs nothing here.
INSTANCE_COLUMNS = (
    "instance_id",
    "gpu_id",
    "start",
    "seconds",
    "slices",
    "gpu_slices",
    "util_pct",
    "mem_used_bytes",
    "procs",
    "active_s",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "prof_s",
    "workload_ids",
    "workload_share_s",
    "workload_air_s",
    "received_at",
)
_INSTANCE_COLS = ", ".join(INSTANCE_COLUMNS)
# An instance's last seen needs no finer resolution than a GPU's.
INSTANCE_SEEN_RESOLUTION = dt.timedelta(seconds=GPU_SEEN_RESOLUTION_S)


@dataclass(frozen=True, slots=True)
class InstanceRef:
    """What ingest needs of one MIG instance row."""

    id: int
    gpu_id: int
    slices: int
    gpu_slices: int


@dataclass(frozen=True, slots=True)
class InstanceListed:
    """One instance of a GPU's ``mig`` block (a GPU the pushing node owns)."""

    gpu_id: int
    uuid: str
    gi: int
    ci: int
    profile: str
    slices: int
    memory_mb: int
    gpu_slices: int


def instances_register(
    *,
    listed: Sequence[InstanceListed],
    listing_gpus: set[int],
    wanted: set[str],
    now: dt.datetime,
) -> dict[str, InstanceRef]:
    """Register the instances of the push's ``mig`` blocks and bring changed ones up to
    date; mark the instances of ``listing_gpus`` (the GPUs whose block has ``mig``) that the
    block no longer lists as gone (and one listed again as back). Returns every instance
    among the listed and ``wanted`` (the samples' ``instance`` values), by MIG UUID, whichever
    GPU it belongs to (the caller checks the sample's GPU). An instance already registered to
    another GPU keeps its GPU."""
    from telemetry.models import MigInstance

    uuids = {m.uuid for m in listed} | wanted
    rows = {
        r.uuid: r
        for r in MigInstance.objects.filter(uuid__in=uuids).only(
            "id",
            "uuid",
            "gpu_id",
            "gi",
            "ci",
            "profile",
            "slices",
            "memory_mb",
            "gpu_slices",
            "last_seen_at",
            "gone_at",
        )
    }
    if listed or listing_gpus:
        with transaction.atomic():
            new = [
                MigInstance(
                    gpu_id=m.gpu_id,
                    uuid=m.uuid,
                    gi=m.gi,
                    ci=m.ci,
                    profile=m.profile,
                    slices=m.slices,
                    memory_mb=m.memory_mb,
                    gpu_slices=m.gpu_slices,
                    first_seen_at=now,
                    last_seen_at=now,
                )
                for m in listed
                if m.uuid not in rows
            ]
            if new:
                # two pushes may register one instance at once: the unique uuid settles it
                MigInstance.objects.bulk_create(new, ignore_conflicts=True)
                rows.update(
                    {r.uuid: r for r in MigInstance.objects.filter(uuid__in=[n.uuid for n in new])}
                )
            due = now - INSTANCE_SEEN_RESOLUTION
            for m in listed:
                r = rows[m.uuid]
                if r.gpu_id != m.gpu_id:
                    continue  # another GPU's instance: left alone
                values = {
                    "gi": m.gi,
                    "ci": m.ci,
                    "profile": m.profile,
                    "slices": m.slices,
                    "memory_mb": m.memory_mb,
                    "gpu_slices": m.gpu_slices,
                }
                changes = {k: v for k, v in values.items() if getattr(r, k) != v}
                if r.gone_at is not None:
                    changes["gone_at"] = None
                if changes or r.last_seen_at <= due:
                    changes["last_seen_at"] = now
                    MigInstance.objects.filter(pk=r.pk).update(**changes)
                    for k, v in changes.items():
                        setattr(r, k, v)
            if listing_gpus:
                still = {m.uuid for m in listed}
                MigInstance.objects.filter(gpu_id__in=listing_gpus, gone_at__isnull=True).exclude(
                    uuid__in=still
                ).update(gone_at=now)
    return {u: InstanceRef(r.pk, r.gpu_id, r.slices, r.gpu_slices) for u, r in rows.items()}


def workload_ids_lookup(node_id: int, keys: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The ids of registered workloads (kind, id) of the node's site (its own, else its
    pool's; none: site 0), for instance samples whose GPU sample registered nothing new."""
    if not keys:
        return {}
    site = _NODE_SITE.format(node="%s")
    marks = ", ".join(["(%s, %s)"] * len(keys))
    params: list[Any] = [node_id]
    for kind, key in sorted(keys):
        params += [kind, key]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, key, id FROM telemetry_workload "  # noqa: S608 - constants
            f"WHERE COALESCE(site_id, 0) = COALESCE({site}, 0) AND (kind, key) IN ({marks})",
            params,
        )
        return {(kind, key): pk for kind, key, pk in cursor.fetchall()}


def instances_store(
    *, rows: Sequence[tuple[Any, ...]], node_id: int, token_id: int | None
) -> Stored:
    """Store instance samples (:data:`INSTANCE_COLUMNS` order) of node ``node_id``:
    duplicates ``(instance, start)`` change nothing; rows of a GPU the node no longer owns
    come back in ``not_owned``; their hours are marked for the rollup. One transaction."""
    if not rows:
        return Stored()
    with transaction.atomic():
        if token_id is not None and not token_live(token_id):
            raise TokenRevoked("the node token was revoked")
        gpu_ids = sorted({row[1] for row in rows})
        with connection.cursor() as cursor:
            ids = ", ".join(["%s"] * len(gpu_ids))
            cursor.execute(
                f"SELECT id FROM fleet_gpu WHERE node_id = %s AND id IN ({ids})",  # noqa: S608
                [node_id, *gpu_ids],
            )
            owned = {gpu_id for (gpu_id,) in cursor.fetchall()}
            kept = [row for row in rows if row[1] in owned]
            not_owned = [i for i, row in enumerate(rows) if row[1] not in owned]
            adapt = _sqlite_instance_adapters() if connection.vendor != "postgresql" else None
            one = "(" + ", ".join(["%s"] * len(INSTANCE_COLUMNS)) + ")"
            inserted: list[Any] = []
            for at in range(0, len(kept), SQLITE_CHUNK_ROWS // 2):
                chunk = kept[at : at + SQLITE_CHUNK_ROWS // 2]
                params: list[Any] = []
                for row in chunk:
                    if adapt is None:
                        params += row
                    else:
                        params += [
                            v if f is None or v is None else f(v)
                            for f, v in zip(adapt, row, strict=True)
                        ]
                cursor.execute(
                    f"INSERT INTO telemetry_instancesample ({_INSTANCE_COLS}) VALUES "  # noqa: S608
                    + ", ".join([one] * len(chunk))
                    + " ON CONFLICT (instance_id, start) DO NOTHING RETURNING start",
                    params,
                )
                inserted += [start for (start,) in cursor.fetchall()]
        hours_mark({_hour(_aware(start)) for start in inserted})
    return Stored(accepted=len(inserted), duplicates=len(kept) - len(inserted), not_owned=not_owned)


def _aware(start: Any) -> dt.datetime:
    """A start as the driver hands it back (SQLite: naive UTC, or stored text) → aware UTC."""
    moment = start if isinstance(start, dt.datetime) else dt.datetime.fromisoformat(str(start))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _sqlite_instance_adapters() -> list[Callable[[Any], Any] | None]:
    times = connection.ops.adapt_datetimefield_value
    return [
        times
        if c in ("start", "received_at")
        else _json_list
        if c.startswith("workload_")
        else None
        for c in INSTANCE_COLUMNS
    ]
