"""Ingest of agent pushes (DESIGN.md §4, §5): decoding, validation and the batch service.

The hot path never builds a DRF serializer or a model instance per sample: the body is decoded
by msgspec straight into typed structs (type and range checks in C), the few checks that need
the server's state (the GPU's owner and memory, the clock, the hour grid) run in one small loop,
and the valid rows go to ``telemetry.ingest_store`` as plain tuples for COPY.

Whole-request problems (malformed JSON, too many samples, a broken ``gpus`` block) raise
:class:`IngestError`; a bad sample is only listed in ``IngestResult.rejected`` and the rest of
its batch is stored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from config.metrics import counters_incr
from fleet.models import Gpu, Node
from fleet.services import gpu_model_for_name
from telemetry import ingest_store

# An interval may end at most this far ahead of the server's clock (agents' clocks drift).
FUTURE_TOLERANCE_S = 300
# Node metadata is written at most once a minute unless it changed: "last seen" needs no more
# resolution, and skipping the write keeps a small push to the sample insert alone.
NODE_SEEN_RESOLUTION = dt.timedelta(seconds=60)
# The widest values the columns hold (smallint, bigint): anything wider is bad input, not a 500.
SMALLINT_MAX = 32_767
BIGINT_MAX = 2**63 - 1
THROTTLE_KEYS = ("power_cap", "thermal", "hw_slowdown", "other", "any")
_NO_THROTTLE: tuple[float | None, ...] = (None, None, None, None, None)

Pct = Annotated[float, msgspec.Meta(ge=0, le=100)]


# --- wire structs (DESIGN.md §4) ---------------------------------------------------------------
class ThrottleIn(msgspec.Struct):
    """Seconds of the interval with each throttle reason set; checked against ``seconds``."""

    power_cap: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None
    thermal: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None
    hw_slowdown: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None
    other: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None
    any: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None


class SampleIn(msgspec.Struct):
    """One sample as sent; constraints here are the context-free ranges of DESIGN.md §4.

    Every float is range-constrained, which also rejects NaN and ±Infinity (JSON has neither;
    a Python agent's ``NaN`` literal reaches here through the lenient fallback decoder).
    """

    gpu: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    start: Annotated[dt.datetime, msgspec.Meta(tz=True)]
    seconds: Annotated[int, msgspec.Meta(ge=1, le=3600)]
    util_pct: Pct
    mem_util_pct: Pct | None = None
    mem_used_bytes: Annotated[int, msgspec.Meta(ge=0, le=BIGINT_MAX)] | None = None
    procs: Annotated[int, msgspec.Meta(ge=0, le=SMALLINT_MAX)] | None = None
    power_w: Annotated[float, msgspec.Meta(ge=0, le=5000)] | None = None
    energy_j: Annotated[float, msgspec.Meta(ge=0, le=1e300)] | None = None
    temp_c: Annotated[float, msgspec.Meta(ge=-50, le=150)] | None = None
    sm_clock_mhz: Annotated[float, msgspec.Meta(ge=0, le=100_000)] | None = None
    throttle_s: ThrottleIn | None = None
    active_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None
    sm_active: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None


class NodeIn(msgspec.Struct):
    hostname: Annotated[str, msgspec.Meta(max_length=255)] = ""
    agent_version: Annotated[str, msgspec.Meta(max_length=50)] = ""
    driver_version: Annotated[str, msgspec.Meta(max_length=50)] = ""
    # Samples the agent's full spool dropped since its last successful push. The agent of
    # telemetry/agent sends it as ``spool_dropped_samples``: both names are accepted.
    spool_dropped: Annotated[int, msgspec.Meta(ge=0, le=BIGINT_MAX)] = 0
    spool_dropped_samples: Annotated[int, msgspec.Meta(ge=0, le=BIGINT_MAX)] = 0

    @property
    def dropped(self) -> int:
        return self.spool_dropped or self.spool_dropped_samples


class GpuIn(msgspec.Struct):
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    index: Annotated[int, msgspec.Meta(ge=0, le=SMALLINT_MAX)] | None = None
    name: Annotated[str, msgspec.Meta(max_length=100)] = ""
    memory_total_bytes: Annotated[int, msgspec.Meta(ge=0, le=BIGINT_MAX)] | None = None
    power_limit_w: Annotated[float, msgspec.Meta(ge=0, le=5000)] | None = None
    # ``"lost": true`` (or ``"status": "lost"``, as telemetry/agent sends it): off the bus.
    lost: bool = False
    status: Annotated[str, msgspec.Meta(max_length=50)] = ""

    @property
    def is_lost(self) -> bool:
        return self.lost or self.status == "lost"


class PushIn(msgspec.Struct):
    """The whole push with samples decoded: the fast path when nothing in it is bad."""

    samples: list[SampleIn]
    node: NodeIn = msgspec.field(default_factory=NodeIn)
    gpus: list[GpuIn] = msgspec.field(default_factory=list)


class PushRawIn(msgspec.Struct):
    """The push with samples left raw, to decode (and reject) them one by one."""

    samples: list[msgspec.Raw]
    node: NodeIn = msgspec.field(default_factory=NodeIn)
    gpus: list[GpuIn] = msgspec.field(default_factory=list)


class PushLooseIn(msgspec.Struct):
    """The push as the standard library parsed it (``NaN`` literals), samples still loose."""

    samples: list[Any]
    node: NodeIn = msgspec.field(default_factory=NodeIn)
    gpus: list[GpuIn] = msgspec.field(default_factory=list)


_push_decoder = msgspec.json.Decoder(PushIn, strict=True)
_push_raw_decoder = msgspec.json.Decoder(PushRawIn, strict=True)
_sample_decoder = msgspec.json.Decoder(SampleIn, strict=True)


# --- results -----------------------------------------------------------------------------------
class IngestError(Exception):
    """The whole push is refused: ``status`` (400/413) and the field to blame."""

    def __init__(self, status: int, field_name: str, error: str) -> None:
        super().__init__(f"{field_name}: {error}")
        self.status = status
        self.field = field_name
        self.error = error

    def body(self) -> dict[str, Any]:
        return {"detail": f"{self.field}: {self.error}", "field": self.field, "error": self.error}


@dataclass(slots=True)
class Rejected:
    index: int
    field: str
    error: str


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    # What was written to the node row (attribute → value; not part of the answer).
    node_written: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> int:
        """200, or 400 when the batch had samples and every one of them was rejected."""
        if self.rejected and not self.accepted and not self.duplicates:
            return 400
        return 200

    def body(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": [
                {"index": r.index, "field": r.field, "error": r.error} for r in self.rejected
            ],
        }


# --- decoding ----------------------------------------------------------------------------------
_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<name>[^`]+)`")
_INDEX = re.compile(r"\[(\d+)\]")
_NUMBER_TYPES = ("`float`", "`int`")
_RANGES = {
    "seconds": "must be an integer within 1–3600",
    "util_pct": "must be a number within 0–100",
    "mem_util_pct": "must be a number within 0–100",
    "mem_used_bytes": "must be an integer ≥ 0 (bytes)",
    "procs": f"must be an integer within 0–{SMALLINT_MAX}",
    "power_w": "must be a number within 0–5000",
    "energy_j": "must be a finite number ≥ 0",
    "temp_c": "must be a number within −50–150",
    "sm_clock_mhz": "must be a finite number ≥ 0",
    "active_s": "must be a number within 0–seconds",
    "sm_active": "must be a number within 0–1",
    "memory_total_bytes": "must be an integer ≥ 0 (bytes)",
    "power_limit_w": "must be a number within 0–5000",
    "index": f"must be an integer within 0–{SMALLINT_MAX}",
    "spool_dropped": "must be an integer ≥ 0",
}


def validation_error_split(exc: msgspec.ValidationError, root: str = "body") -> tuple[str, str]:
    """msgspec's message → (field path like ``throttle_s.thermal`` or ``gpus[0].uuid``, reason).

    ``root`` names the decoded value itself when the error is about the whole of it.
    """
    message = str(exc)
    path = ""
    match = _AT_PATH.search(message)
    if match:
        path = match.group("path").lstrip(".")
        message = message[: match.start()]
    missing = _MISSING.search(message)
    if missing:
        name = missing.group("name")
        return (f"{path}.{name}" if path else name), "required"
    leaf = path.rsplit(".", 1)[-1]
    leaf = _INDEX.sub("", leaf)
    if (
        message.startswith("Expected")
        and "got `str`" in message
        and (any(t in message for t in _NUMBER_TYPES))
    ):
        return path or root, "must be a number, not a string (NaN and Infinity are not allowed)"
    if "timezone" in message:
        return path, "must be an RFC 3339 timestamp with a time zone (e.g. 2026-11-30T09:00:00Z)"
    if "RFC3339" in message:
        return path, "not an RFC 3339 timestamp (e.g. 2026-11-30T09:00:00Z)"
    if leaf.startswith("throttle_s") or path.startswith("throttle_s."):
        if ">=" in message or "<=" in message:
            return path, "must be a number within 0–seconds"
    if leaf in _RANGES and (
        ">=" in message or "<=" in message or "out of range" in message or "got `float`" in message
    ):
        return path, _RANGES[leaf]
    return path or root, message


def _push_decode(payload: bytes) -> tuple[PushIn | PushRawIn | PushLooseIn, bool]:
    """Decode the envelope; the flag says whether its samples are already typed and valid."""
    if not payload.strip():
        raise IngestError(400, "body", "empty body: expected a JSON object")
    if b"\\u0000" in payload:
        # PostgreSQL text cannot hold NUL: refuse it here rather than fail in the database
        # (which would answer 503 and make the agent retry a push that can never succeed).
        raise IngestError(400, "body", "strings must not contain NUL (\\u0000)")
    try:
        try:
            return _push_decoder.decode(payload), True
        except msgspec.ValidationError:
            pass  # some part is bad: leave the samples raw to find out which
        try:
            return _push_raw_decoder.decode(payload), False
        except msgspec.ValidationError as exc:
            name, error = validation_error_split(exc)
            raise IngestError(400, name, error) from None
    except msgspec.DecodeError as exc:
        # Not JSON as RFC 8259 defines it. Python agents write NaN and Infinity as bare
        # literals: parse those leniently so that only the affected samples are rejected.
        try:
            loose = json.loads(payload)
        except (ValueError, RecursionError):
            raise IngestError(400, "body", f"malformed JSON: {exc}") from None
        try:
            return msgspec.convert(loose, PushLooseIn, strict=True), False
        except msgspec.ValidationError as exc2:
            name, error = validation_error_split(exc2)
            raise IngestError(400, name, error) from None


def _sample_decode(raw: Any) -> SampleIn:
    if isinstance(raw, msgspec.Raw):
        return _sample_decoder.decode(raw)
    return msgspec.convert(raw, SampleIn, strict=True)


# --- the GPUs of a push ------------------------------------------------------------------------
@dataclass(slots=True)
class GpuRef:
    """What ingest needs of one GPU row (read once per request, no model instance)."""

    id: int
    node_id: int
    memory_total_bytes: int | None
    index: int | None
    name: str
    power_limit_w: float | None
    model_id: int | None
    lost: bool = False  # the agent has reported it off the bus (lost_at is set)


# What a GPU query reads: the row's id and uuid, then GpuRef's fields after ``id``.
_GPU_COLUMNS = (
    'id, uuid, node_id, memory_total_bytes, "index", name, power_limit_w, model_id,'
    " lost_at IS NOT NULL"
)


def _ref_from_row(row: tuple[Any, ...]) -> tuple[str, GpuRef]:
    pk, uuid, *rest = row
    return uuid, GpuRef(pk, *rest)


# The GPUs a push mentions, whoever owns them (a sample for another node's GPU is rejected).
# Plain SQL: this runs on every push, and the ORM's query building cost more than the query.
_GPUS_SQL = f"SELECT {_GPU_COLUMNS} FROM fleet_gpu WHERE uuid IN ({{}})"  # noqa: S608


def _gpus_load(uuids: set[str]) -> dict[str, GpuRef]:
    if not uuids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_GPUS_SQL.format(", ".join(["%s"] * len(uuids))), list(uuids))
        rows = cursor.fetchall()
    return dict(_ref_from_row(row) for row in rows)


# --- the node's GPUs, cached in process memory ---------------------------------------------
# A node pushes every minute with the same GPUs: reading them costs a round trip per push.
# Each process keeps, per node, the node's own GPUs for GPU_CACHE_TTL_S. The cache is only a
# guess that the database confirms where it matters:
# - a uuid the cache lacks (a new GPU, or one of another node) is always read from the database;
# - samples accepted on the cache's word are stored with ``verify``: the statement that moves
#   first/last seen only touches GPUs still owned by this node with the same total memory, and
#   any mismatch rolls the push back and runs it again from the database (ingest_store);
# - a push with a sample rejected on the cache's word (memory above the total) runs again from
#   the database before answering;
# - a GPU saved or deleted through the ORM clears the cache of this process, and ingest's own
#   registrations and updates clear it for the node.
GPU_CACHE_TTL_S = 300.0  # longer than an agent's push interval: a steady node is a hit
_gpu_cache: dict[int, tuple[float, dict[str, GpuRef]]] = {}
_gpu_cache_lock = threading.Lock()

# The node's own GPUs and the GPUs a push mentions, in one query. IN (…) rather than
# PostgreSQL's = ANY(%s) so the same statement runs on the embedded SQLite default.
_NODE_GPUS_SQL = f"SELECT {_GPU_COLUMNS} FROM fleet_gpu WHERE node_id = %s"  # noqa: S608


def gpu_cache_clear(node_id: int | None = None) -> None:
    """Forget the cached GPUs of ``node_id`` (of every node when None)."""
    with _gpu_cache_lock:
        if node_id is None:
            _gpu_cache.clear()
        else:
            _gpu_cache.pop(node_id, None)


@receiver(post_save, sender=Gpu, dispatch_uid="telemetry.ingest.gpu_saved")
@receiver(post_delete, sender=Gpu, dispatch_uid="telemetry.ingest.gpu_deleted")
def _gpu_changed(**kwargs: Any) -> None:
    # Every node: a GPU moved by an admin changes two nodes' maps.
    gpu_cache_clear()


def _gpus_for(node_id: int, uuids: set[str], *, use_cache: bool) -> tuple[dict[str, GpuRef], bool]:
    """The GPUs among ``uuids`` (whoever owns them) → (map, whether it came from the cache).

    Copies of the refs: callers change them (gpus_register) and must not change the cache.
    """
    if use_cache:
        with _gpu_cache_lock:
            entry = _gpu_cache.get(node_id)
        if entry is not None and entry[0] > time.monotonic():
            own = entry[1]
            if all(u in own for u in uuids):
                return {u: _ref_copy(own[u]) for u in uuids}, True
    wanted = sorted(uuids)
    sql = _NODE_GPUS_SQL
    if wanted:
        sql += " OR uuid IN (" + ", ".join(["%s"] * len(wanted)) + ")"
    with connection.cursor() as cursor:
        cursor.execute(sql, [node_id, *wanted])
        rows = cursor.fetchall()
    found: dict[str, GpuRef] = {}
    own = {}
    for row in rows:
        uuid, ref = _ref_from_row(row)
        if ref.node_id == node_id:
            own[uuid] = ref
        if uuid in uuids:
            found[uuid] = _ref_copy(ref)
    with _gpu_cache_lock:
        _gpu_cache[node_id] = (time.monotonic() + GPU_CACHE_TTL_S, own)
    return found, False


def _ref_copy(ref: GpuRef) -> GpuRef:
    return dataclasses.replace(ref)


def gpus_register(
    *,
    node: Node,
    block: list[GpuIn],
    known: dict[str, GpuRef],
    now: dt.datetime,
    before_write: Callable[[], None] | None = None,
) -> bool:
    """Register the node's new GPUs, refresh what changed of its own, note lost ones.

    The first node to report a GPU owns it (DESIGN.md §4): a GPU of another node is left alone
    here and its samples are rejected. ``known`` is updated in place. Returns whether anything
    was written (the node's cached GPU map is then cleared).
    """
    wrote = False
    new = [g for g in block if g.uuid not in known]
    if new:
        if before_write is not None:
            before_write()
        objs = []
        for g in {g.uuid: g for g in new}.values():
            model = gpu_model_for_name(g.name) if g.name else None
            objs.append(
                Gpu(
                    uuid=g.uuid,
                    node=node,
                    index=g.index,
                    name=g.name,
                    memory_total_bytes=g.memory_total_bytes,
                    power_limit_w=g.power_limit_w,
                    model=model,
                    lost_at=now if g.is_lost else None,
                )
            )
        # Two pushes may register the same GPU at once: the unique uuid settles it, the loser
        # reads back the winner's row.
        Gpu.objects.bulk_create(objs, ignore_conflicts=True)
        known.update(_gpus_load({o.uuid for o in objs}))
        wrote = True
    for g in block:
        ref = known.get(g.uuid)
        if ref is None or ref.node_id != node.pk:
            continue
        changes: dict[str, Any] = {}
        if g.index is not None and g.index != ref.index:
            changes["index"] = ref.index = g.index
        if g.name and g.name != ref.name:
            changes["name"] = ref.name = g.name
            model = gpu_model_for_name(g.name)
            if model is not None and model.pk != ref.model_id:
                changes["model"] = model
                ref.model_id = model.pk
        if g.memory_total_bytes is not None and g.memory_total_bytes != ref.memory_total_bytes:
            changes["memory_total_bytes"] = ref.memory_total_bytes = g.memory_total_bytes
        if g.power_limit_w is not None and g.power_limit_w != ref.power_limit_w:
            changes["power_limit_w"] = ref.power_limit_w = g.power_limit_w
        if g.is_lost != ref.lost:
            # Set when first reported lost, cleared when the agent lists it present again.
            changes["lost_at"] = now if g.is_lost else None
            ref.lost = g.is_lost
        if changes:
            if before_write is not None:
                before_write()
            # node_id: the map may come from the cache, and a GPU moved away since stays as is.
            Gpu.objects.filter(pk=ref.id, node_id=node.pk).update(**changes)
            wrote = True
    if wrote:
        gpu_cache_clear(node.pk)
    return wrote


# --- validation --------------------------------------------------------------------------------
def samples_validate(
    *,
    samples: list[SampleIn | Rejected],
    gpus: dict[str, GpuRef],
    node_id: int,
    now: dt.datetime,
) -> tuple[list[tuple[Any, ...]], list[Rejected]]:
    """The checks that need the server's state; returns (rows in ``ingest_store`` order, rejects).

    Pure: reads only its arguments. ``samples`` holds a :class:`Rejected` where the sample
    failed to decode, so indices stay those of the push.
    """
    now_ts = now.timestamp()
    latest_end = now_ts + FUTURE_TOLERANCE_S
    retention_days = settings.RAW_RETENTION_DAYS
    earliest = now_ts - retention_days * 86400
    rows: list[tuple[Any, ...]] = []
    rejected: list[Rejected] = []
    gcd = math.gcd
    for i, s in enumerate(samples):
        if type(s) is Rejected:
            rejected.append(s)
            continue
        assert isinstance(s, SampleIn)
        ref = gpus.get(s.gpu)
        if ref is None:
            rejected.append(Rejected(i, "gpu", "unknown GPU: list it in the push's gpus block"))
            continue
        if ref.node_id != node_id:
            rejected.append(Rejected(i, "gpu", "this GPU belongs to another node"))
            continue
        seconds = s.seconds
        start_f = s.start.timestamp()
        start_ts = int(start_f)
        if start_ts != start_f:
            rejected.append(Rejected(i, "start", "must be on a whole second"))
            continue
        offset = start_ts % 3600
        if offset + seconds > 3600:
            rejected.append(Rejected(i, "start", "the interval crosses an hour boundary"))
            continue
        # Aligned: start lies on the grid of an interval length that divides the hour and is at
        # least ``seconds`` long. A full 60 s interval starts on the minute; a partial one (an
        # agent that started mid-interval or missed ticks) keeps its interval's aligned start.
        if gcd(offset, 3600) < seconds:
            rejected.append(
                Rejected(i, "start", f"not aligned to the interval ({seconds} s) within the hour")
            )
            continue
        if start_ts + seconds > latest_end:
            rejected.append(
                Rejected(i, "start", "the interval ends more than 5 minutes ahead of the server")
            )
            continue
        if start_ts < earliest:
            rejected.append(
                Rejected(i, "start", f"older than the raw retention period ({retention_days} days)")
            )
            continue
        mem = s.mem_used_bytes
        if mem is not None and ref.memory_total_bytes is not None and mem > ref.memory_total_bytes:
            rejected.append(Rejected(i, "mem_used_bytes", "more than the GPU's total memory"))
            continue
        if s.active_s is not None and s.active_s > seconds:
            rejected.append(Rejected(i, "active_s", "must be a number within 0–seconds"))
            continue
        t = s.throttle_s
        values: tuple[float | None, ...]
        if t is not None:
            values = (t.power_cap, t.thermal, t.hw_slowdown, t.other, t.any)
            if (
                (values[0] is not None and values[0] > seconds)
                or (values[1] is not None and values[1] > seconds)
                or (values[2] is not None and values[2] > seconds)
                or (values[3] is not None and values[3] > seconds)
                or (values[4] is not None and values[4] > seconds)
            ):
                bad = next(
                    k
                    for k, v in zip(THROTTLE_KEYS, values, strict=True)
                    if v is not None and v > seconds
                )
                rejected.append(
                    Rejected(i, f"throttle_s.{bad}", "must be a number within 0–seconds")
                )
                continue
        else:
            values = _NO_THROTTLE
        rows.append(
            (
                ref.id,
                s.start,
                seconds,
                s.util_pct,
                s.mem_util_pct,
                mem,
                s.procs,
                s.power_w,
                s.energy_j,
                s.temp_c,
                s.sm_clock_mhz,
                *values,
                s.active_s,
                s.sm_active,
                now,
            )
        )
    return rows, rejected


# --- the service -------------------------------------------------------------------------------
def _node_changes(*, node: Node, meta: NodeIn, now: dt.datetime) -> ingest_store.NodeUpdate | None:
    """What the agent said about itself that the node row lacks; often nothing (None).

    Reads ``node`` as authentication loaded it and never changes it in memory, so a
    transaction that rolls back and runs again writes the same changes.
    """
    hostname = meta.hostname if meta.hostname != node.reported_hostname else ""
    agent = meta.agent_version if meta.agent_version != node.agent_version else ""
    driver = meta.driver_version if meta.driver_version != node.driver_version else ""
    changed = bool(hostname or agent or driver)
    seen = None
    if changed or node.last_seen_at is None or now - node.last_seen_at >= NODE_SEEN_RESOLUTION:
        seen = now
    if not changed and seen is None and not meta.dropped:
        return None
    return ingest_store.NodeUpdate(
        node_id=node.pk,
        reported_hostname=hostname or None,
        agent_version=agent or None,
        driver_version=driver or None,
        last_seen_at=seen,
        spool_dropped=meta.dropped,
    )


def _node_update_apply(update: ingest_store.NodeUpdate) -> None:
    """``update`` through the ORM (the multi-statement path; the one statement embeds it)."""
    changes: dict[str, Any] = update.written()
    if update.spool_dropped:
        # F(): two pushes of one node at once must both count.
        changes["spool_dropped_total"] = F("spool_dropped_total") + update.spool_dropped
    Node.objects.filter(pk=update.node_id).update(**changes)


def sample_batch_ingest(
    *,
    node: Node,
    payload_bytes: bytes,
    now: dt.datetime,
    token_id: int | None = None,
    token_checked: bool = True,
    counters: dict[str, int] | None = None,
) -> IngestResult:
    """Validate one push of ``node`` and store its valid samples; duplicates change nothing.

    ``token_id`` is the node token the push came with (None: a caller that needs none, such
    as the demo's history); ``token_checked`` False says that authentication took it from a
    cache, so it is checked against the database before anything is written (within the
    write statement itself on the one-statement path), and :class:`ingest_store.TokenRevoked`
    raised if it was revoked since.

    Raises :class:`IngestError` for a push that is refused as a whole. Database errors
    propagate (the API answers 503, the agent retries the push later). The sample counters
    (``config.metrics``) are incremented here, or added to ``counters`` when given, for the
    caller to send with its own in one round trip.
    """
    push, typed = _push_decode(payload_bytes)
    max_samples = settings.INGEST_MAX_SAMPLES
    if len(push.samples) > max_samples:
        raise IngestError(
            413, "samples", f"{len(push.samples)} samples; at most {max_samples} per push"
        )
    samples: list[SampleIn | Rejected]
    if typed:
        samples = push.samples  # type: ignore[assignment]
    else:
        samples = []
        for i, raw in enumerate(push.samples):
            try:
                samples.append(_sample_decode(raw))
            except msgspec.ValidationError as exc:
                name, error = validation_error_split(exc, root="sample")
                samples.append(Rejected(i, name, error))
    uuids = {s.gpu for s in samples if type(s) is SampleIn}
    uuids.update(g.uuid for g in push.gpus)
    node_update = _node_changes(node=node, meta=push.node, now=now)
    token = _TokenCheck(token_id, checked=token_checked)
    use_cache = True
    while True:
        gpus, cached = _gpus_for(node.pk, uuids, use_cache=use_cache) if uuids else ({}, False)
        if push.gpus and gpus_register(
            node=node, block=push.gpus, known=gpus, now=now, before_write=token.confirm
        ):
            if cached:  # read the GPUs again, with what it registered or changed
                use_cache = False
                continue
        rows, rejected = samples_validate(samples=samples, gpus=gpus, node_id=node.pk, now=now)
        if cached and any(r.field == "mem_used_bytes" for r in rejected):
            use_cache = False  # rejected on the cache's word: ask the database
            continue
        verify = {ref.id: (ref.node_id, ref.memory_total_bytes) for ref in gpus.values()}
        try:
            stored = _store(rows, node_update, now, verify if cached else None, token)
        except (ingest_store.StaleGpus, ingest_store.DuplicateSamples):
            # Stale: the cache was wrong. Duplicates: the slower path that skips them cannot
            # check the cache's word, so it runs on a map read from the database.
            gpu_cache_clear(node.pk)
            use_cache = False
            continue
        break
    result = IngestResult(rejected=rejected)
    if node_update is not None:
        result.node_written = node_update.written()
    result.accepted = stored
    result.duplicates = len(rows) - stored
    values = {
        "ingest_samples_accepted": result.accepted,
        "ingest_samples_duplicate": result.duplicates,
        "ingest_samples_rejected": len(result.rejected),
    }
    if counters is None:
        counters_incr(values)
    else:
        for name, value in values.items():
            counters[name] = counters.get(name, 0) + value
    return result


class _TokenCheck:
    """The push's node token, checked against the database at most once (when not yet)."""

    def __init__(self, token_id: int | None, *, checked: bool) -> None:
        self.id = token_id
        self.checked = checked or token_id is None

    def confirm(self) -> None:
        if not self.checked:
            assert self.id is not None
            if not ingest_store.token_valid(self.id):
                raise ingest_store.TokenRevoked("the node token was revoked")
            self.checked = True


def _store(
    rows: list[tuple[Any, ...]],
    node_update: ingest_store.NodeUpdate | None,
    now: dt.datetime,
    verify: dict[int, tuple[int, int | None]] | None,
    token: _TokenCheck,
) -> int:
    """One transaction: samples, first/last seen, the hours to roll up and the node's metadata.

    First the fast path that assumes no duplicates; a duplicate rolls it back entirely and the
    batch goes again through the path that skips and counts them (ingest_store). A push with
    nothing to write opens no transaction (but a token from the cache is still checked).
    """
    if not rows and node_update is None:
        token.confirm()
        return 0
    if ingest_store.one_statement(rows):
        # One round trip, no explicit transaction: samples, first/last seen, hour marks and the
        # node row in one statement, which also checks the token.
        return ingest_store.samples_store_one_statement(
            rows=rows, now=now, token_id=token.id, verify=verify, node_update=node_update
        )
    try:
        with transaction.atomic():
            token.confirm()
            stored = ingest_store.samples_store(
                rows=rows, now=now, skip_duplicates=False, verify=verify
            )
            if node_update is not None:
                _node_update_apply(node_update)
    except ingest_store.DuplicateSamples:
        if verify is not None:
            raise  # validated on the cache's word: the caller reads the GPUs again first
        with transaction.atomic():
            stored = ingest_store.samples_store(rows=rows, now=now, skip_duplicates=True)
            if node_update is not None:
                _node_update_apply(node_update)
    return stored
