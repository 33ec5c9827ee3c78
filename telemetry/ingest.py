"""Ingest of agent pushes (docs/ingest.md): one straight path from bytes to stored rows.

:func:`sample_batch_ingest` decodes the push (``telemetry.wire``), reads the GPUs it mentions,
registers the node's new GPUs and refreshes what changed of its own, validates each sample
against that (:func:`samples_validate`, pure), registers the workloads that the samples not
stored yet name (:func:`workloads_attach`: whose names count, the hourly cap) and stores the
valid rows together with the node's metadata (``telemetry.ingest_store.push_store``).
Nothing is cached between pushes: the write itself checks, in its transaction, that the node
still owns each GPU and that the token is still live, so a GPU moved by ``fleet_apply`` or the
admin is refused at once, on every database.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from config.metrics import counters_incr
from fleet.identifiers import text_error
from fleet.models import Gpu, Node
from fleet.services import gpu_model_for_name
from telemetry import ingest_store
from telemetry.wire import (
    JOB_MODEL_MAX,
    JOB_PARTS_SLACK,
    MIG_SLICES_DEFAULT,
    REJECT_CLOCK_AHEAD,
    REJECT_NOT_REGISTERED,
    REJECT_OTHER_NODE,
    REJECT_TOO_OLD,
    REJECT_UNKNOWN_GPU,
    REJECT_UNKNOWN_INSTANCE,
    SHARE_SLACK_S,
    THROTTLE_KEYS,
    WORKLOAD_TEXT_MAX,
    GpuIn,
    IngestError,
    JobIn,
    NodeIn,
    Rejected,
    SampleIn,
    WorkloadIn,
    push_decode,
    samples_decode,
)

__all__ = ["IngestError", "IngestResult", "Rejected", "sample_batch_ingest", "samples_validate"]

# An interval may end at most this far ahead of the server's clock (agents' clocks drift).
FUTURE_TOLERANCE_S = 300
_NO_THROTTLE: tuple[float | None, ...] = (None, None, None, None, None)
_NOT_OWNED = "this GPU belongs to another node"
_UNKNOWN = "unknown GPU: list it in the push's gpus block"
_UNKNOWN_INSTANCE = "not a MIG instance of this GPU: list it in the GPU's mig block"


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)

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
                {"index": r.index, "field": r.field, "error": r.error, "code": r.code}
                for r in self.rejected
            ],
        }


# --- the GPUs of a push ------------------------------------------------------------------------
@dataclass(slots=True)
class GpuRef:
    """What ingest needs of one GPU row (read once per push, no model instance)."""

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
# PostgreSQL: constant text, so it runs prepared on every push (``= ANY`` of one array).
_GPUS_SQL_POSTGRESQL = f"SELECT {_GPU_COLUMNS} FROM fleet_gpu WHERE uuid = ANY(%s)"  # noqa: S608


def gpus_read(uuids: set[str]) -> dict[str, GpuRef]:
    """The GPUs among ``uuids``, whoever owns them: one query."""
    if not uuids:
        return {}
    if connection.vendor == "postgresql":
        with ingest_store.prepared_cursor() as cursor:
            cursor.execute(_GPUS_SQL_POSTGRESQL, [sorted(uuids)])
            rows = cursor.fetchall()
    else:
        marks = ", ".join(["%s"] * len(uuids))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {_GPU_COLUMNS} FROM fleet_gpu WHERE uuid IN ({marks})",  # noqa: S608
                sorted(uuids),
            )
            rows = cursor.fetchall()
    return {uuid: GpuRef(pk, *rest) for pk, uuid, *rest in rows}


def _block_changes(gpu: GpuIn, ref: GpuRef) -> dict[str, Any]:
    """What the agent's ``gpus`` entry changes of its GPU row (``ref`` is brought up to date)."""
    changes: dict[str, Any] = {}
    if gpu.index is not None and gpu.index != ref.index:
        changes["index"] = ref.index = gpu.index
    if gpu.name and gpu.name != ref.name:
        changes["name"] = ref.name = gpu.name
        model = gpu_model_for_name(gpu.name)
        if model is not None and model.pk != ref.model_id:
            changes["model"] = model
            ref.model_id = model.pk
    if gpu.memory_total_bytes is not None and gpu.memory_total_bytes != ref.memory_total_bytes:
        changes["memory_total_bytes"] = ref.memory_total_bytes = gpu.memory_total_bytes
    if gpu.power_limit_w is not None and gpu.power_limit_w != ref.power_limit_w:
        changes["power_limit_w"] = ref.power_limit_w = gpu.power_limit_w
    if gpu.is_lost != ref.lost:
        ref.lost = gpu.is_lost
        changes["lost_at"] = True  # the time is set by gpus_register
    return changes


def gpus_register(
    *,
    node_id: int,
    block: list[GpuIn],
    known: dict[str, GpuRef],
    now: dt.datetime,
    token_id: int | None,
) -> dict[str, str]:
    """Register the node's new GPUs and refresh what changed of its own; ``known`` (the GPUs
    read for this push) is brought up to date in place.

    The first node to report a GPU owns it (docs/ingest.md): a GPU of another node is left
    alone and its samples are rejected. A node owns at most ``NODE_MAX_GPUS`` GPUs that are
    not retired; GPUs past that are not registered. Returns, per uuid not registered, why.
    Writes nothing (and opens no transaction) when the block changes nothing.
    """
    new = {g.uuid: g for g in block if g.uuid not in known}
    changed = [
        (known[g.uuid], changes)
        for g in block
        if g.uuid in known
        and known[g.uuid].node_id == node_id
        and (changes := _block_changes(g, known[g.uuid]))
    ]
    if not new and not changed:
        return {}
    refused: dict[str, str] = {}
    with transaction.atomic():
        if token_id is not None and not ingest_store.token_live(token_id):
            raise ingest_store.TokenRevoked("the node token was revoked")
        for ref, changes in changed:
            if "lost_at" in changes:
                # Set when first reported lost, cleared when the agent lists it present again.
                changes["lost_at"] = now if ref.lost else None
            # node_id: a GPU moved away since it was read stays as it is.
            Gpu.objects.filter(pk=ref.id, node_id=node_id).update(**changes)
        if new:
            # The node row, locked: two pushes of one node count its GPUs one after the other.
            Node.objects.select_for_update().filter(pk=node_id).exists()
            room = (
                settings.NODE_MAX_GPUS
                - Gpu.objects.filter(node_id=node_id, retired_at__isnull=True).count()
            )
            wanted = list(new.values())
            for g in wanted[max(room, 0) :]:
                refused[g.uuid] = (
                    f"not registered: its node already owns {settings.NODE_MAX_GPUS} GPUs, "
                    "the most NODE_MAX_GPUS allows (retire GPUs, or raise the setting)"
                )
            objs = [
                Gpu(
                    uuid=g.uuid,
                    node_id=node_id,
                    index=g.index,
                    name=g.name,
                    memory_total_bytes=g.memory_total_bytes,
                    power_limit_w=g.power_limit_w,
                    model=gpu_model_for_name(g.name) if g.name else None,
                    lost_at=now if g.is_lost else None,
                )
                for g in wanted[: max(room, 0)]
            ]
            # Two pushes may register the same GPU at once: the unique uuid settles it, the
            # loser reads back the winner's row (and its samples are rejected if it is not its).
            Gpu.objects.bulk_create(objs, ignore_conflicts=True)
            known.update(gpus_read({o.uuid for o in objs}))
    return refused


# --- validation --------------------------------------------------------------------------------
def samples_validate(
    *,
    samples: list[SampleIn | Rejected],
    gpus: dict[str, GpuRef],
    node_id: int,
    now: dt.datetime,
    unregistered: dict[str, str] | None = None,
    jobs: list[tuple[int, JobIn, WorkloadIn | None]] | None = None,
    instances: dict[str, ingest_store.InstanceRef] | None = None,
    instance_rows: list[InstanceRow] | None = None,
) -> tuple[list[tuple[Any, ...]], list[int], list[Rejected], list[tuple[int, list[WorkloadIn]]]]:
    """The checks that need the server's state → (rows in ``ingest_store.COLUMNS`` order, the
    push index of each row, rejects, and per row with workloads its position and workloads,
    for :func:`workloads_attach`).

    Pure: reads only its arguments. ``samples`` holds a :class:`Rejected` where the sample
    failed to decode, so indices stay those of the push; ``unregistered`` says why a GPU of
    the push was not registered; ``jobs``, when given, gets per valid row with a ``job`` its
    position, the job and the workload it belongs to (for :func:`jobs_rows`).

    A sample naming ``instance`` (a MIG instance of its GPU, in ``instances``) passes the same
    checks and goes to ``instance_rows`` instead (:class:`InstanceRow`); without
    ``instance_rows`` it is rejected like any sample naming an unknown instance.
    """
    now_ts = now.timestamp()
    latest_end = now_ts + FUTURE_TOLERANCE_S
    retention_days = settings.RAW_RETENTION_DAYS
    earliest = now_ts - retention_days * 86400
    unregistered = unregistered or {}
    rows: list[tuple[Any, ...]] = []
    indices: list[int] = []
    rejected: list[Rejected] = []
    workloads: list[tuple[int, list[WorkloadIn]]] = []
    gcd = math.gcd
    for i, s in enumerate(samples):
        if type(s) is Rejected:
            rejected.append(s)
            continue
        assert isinstance(s, SampleIn)
        ref = gpus.get(s.gpu)
        if ref is None:
            if s.gpu in unregistered:
                rejected.append(Rejected(i, "gpu", unregistered[s.gpu], REJECT_NOT_REGISTERED))
            else:
                rejected.append(Rejected(i, "gpu", _UNKNOWN, REJECT_UNKNOWN_GPU))
            continue
        if ref.node_id != node_id:
            rejected.append(Rejected(i, "gpu", _NOT_OWNED, REJECT_OTHER_NODE))
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
                Rejected(
                    i,
                    "start",
                    "the interval ends more than 5 minutes ahead of the server",
                    REJECT_CLOCK_AHEAD,
                )
            )
            continue
        if start_ts < earliest:
            rejected.append(
                Rejected(
                    i,
                    "start",
                    f"older than the raw retention period ({retention_days} days)",
                    REJECT_TOO_OLD,
                )
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
            ):  # written out: this runs for every sample of every push
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
        if s.prof_s is not None and s.prof_s > seconds:
            rejected.append(Rejected(i, "prof_s", "must be a number within 1–seconds"))
            continue
        if s.instance is not None:
            inst = instances.get(s.instance) if instances else None
            if inst is None or inst.gpu_id != ref.id or instance_rows is None:
                rejected.append(Rejected(i, "instance", _UNKNOWN_INSTANCE, REJECT_UNKNOWN_INSTANCE))
                continue
            if s.workloads:
                problem = _workloads_error(s.workloads, seconds)
                if problem is not None:
                    rejected.append(Rejected(i, *problem))
                    continue
            # ``job`` is the GPU sample's business: not stored for an instance
            instance_rows.append(InstanceRow(i, inst, s, now))
            continue
        job_workload: WorkloadIn | None = None
        if s.job is not None:
            job_problem = _job_error(s.job, s.workloads, seconds)
            if isinstance(job_problem, tuple):
                rejected.append(Rejected(i, *job_problem))
                continue
            job_workload = job_problem
        if s.workloads:
            problem = _workloads_error(s.workloads, seconds)
            if problem is not None:
                rejected.append(Rejected(i, *problem))
                continue
            workloads.append((len(rows), s.workloads))
        if s.job is not None and jobs is not None:
            jobs.append((len(rows), s.job, job_workload))
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
                s.sm_occupancy,
                s.tensor_active,
                s.dram_active,
                s.prof_s,
                None,  # workload_ids, workload_share_s, workload_air_s: workloads_attach
                None,
                None,
                now,
            )
        )
        indices.append(i)
    return rows, indices, rejected, workloads


@dataclass(slots=True)
class InstanceRow:
    """A valid instance sample: its push index, instance and sample (a row once its
    workloads have ids: :meth:`row`)."""

    index: int
    instance: ingest_store.InstanceRef
    sample: SampleIn
    now: dt.datetime

    def row(self, workload_ids: dict[tuple[str, str], int]) -> tuple[Any, ...]:
        """In ``ingest_store.INSTANCE_COLUMNS`` order; workloads without an id are left out."""
        s, inst = self.sample, self.instance
        arrays: tuple[Any, Any, Any] = (None, None, None)
        if s.workloads is not None:
            known = [w for w in s.workloads if (w.kind, w.id) in workload_ids]
            arrays = (
                [workload_ids[(w.kind, w.id)] for w in known],
                [w.share_s for w in known],
                [w.air_s for w in known],
            )
        return (
            inst.id,
            inst.gpu_id,
            s.start,
            s.seconds,
            inst.slices,
            inst.gpu_slices,
            s.util_pct,
            s.mem_used_bytes,
            s.procs,
            s.active_s,
            s.sm_active,
            s.sm_occupancy,
            s.tensor_active,
            s.dram_active,
            s.prof_s,
            *arrays,
            self.now,
        )


def instances_register(
    *,
    node_id: int,
    block: list[GpuIn],
    known: dict[str, GpuRef],
    samples: list[SampleIn | Rejected],
    now: dt.datetime,
) -> dict[str, ingest_store.InstanceRef]:
    """The MIG instances the push lists (for GPUs of this node) registered or brought up to
    date, and those its samples name; nothing (no query) for a push with neither."""
    wanted = {s.instance for s in samples if type(s) is SampleIn and s.instance is not None}
    listed: list[ingest_store.InstanceListed] = []
    listing: set[int] = set()
    for g in block:
        ref = known.get(g.uuid)
        if g.mig is None or ref is None or ref.node_id != node_id:
            continue
        listing.add(ref.id)
        total = MIG_SLICES_DEFAULT if g.mig_slices is None else g.mig_slices
        listed += [
            ingest_store.InstanceListed(
                ref.id, m.uuid, m.gi, m.ci, m.profile, m.slices, m.memory_mb, total
            )
            for m in g.mig
        ]
    if not wanted and not listing:
        return {}
    return ingest_store.instances_register(
        listed=listed, listing_gpus=listing, wanted=wanted, now=now
    )


def _instance_workload_ids(
    node_id: int, instance_rows: list[InstanceRow], ids: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    """``ids`` (the workloads the push's GPU samples registered) and those of the instance
    samples' workloads registered before (the GPU sample of the same seconds names them)."""
    missing: set[tuple[str, str]] = {
        (w.kind, w.id)
        for r in instance_rows
        for w in r.sample.workloads or ()
        if (w.kind, w.id) not in ids
    }
    if not missing:
        return ids
    return {**ids, **ingest_store.workload_ids_lookup(node_id, missing)}


def _workloads_error(workloads: list[WorkloadIn], seconds: int) -> tuple[str, str] | None:
    """The rules of docs/ingest.md for a sample's ``workloads`` → (field, error) or None."""
    seen: set[tuple[str, str]] = set()
    total = 0.0
    for j, w in enumerate(workloads):
        at = f"workloads[{j}]"
        for name, value in (
            ("id", w.id),
            ("user", w.user),
            ("account", w.account),
            ("name", w.name),
        ):
            if value is None:  # an optional name not sent (its length was checked in decoding)
                continue
            error = text_error(value, max_length=WORKLOAD_TEXT_MAX)
            if error is None and name == "id" and value != value.strip():
                error = "must not begin or end with whitespace"
            if error is not None:
                return f"{at}.{name}", error
        if (w.kind, w.id) in seen:
            return f"{at}.id", "the same workload is listed twice"
        seen.add((w.kind, w.id))
        if w.share_s > seconds:
            return f"{at}.share_s", "must be a number above 0 and at most seconds"
        if w.air_s > w.share_s:
            return f"{at}.air_s", "must be a number within 0–share_s"
        total += w.share_s
    if total > seconds + SHARE_SLACK_S:
        return "workloads", f"the shares add up to {total:g} s, more than the {seconds} s"
    return None


def _job_error(
    job: JobIn, workloads: list[WorkloadIn] | None, seconds: int
) -> tuple[str, str] | WorkloadIn | None:
    """The rules of docs/ingest.md for a sample's ``job`` → (field, error), or the workload of
    ``workloads`` it belongs to (``None``: the sample names none)."""
    error = text_error(job.model, max_length=JOB_MODEL_MAX)
    if error is not None:
        return "job.model", error
    if job.wall_s > seconds:
        return "job.wall_s", "must be a number within 0–seconds"
    # Checked for each part, then for their sum; the slack covers the hook's clock reads.
    limit = job.wall_s * JOB_PARTS_SLACK + 1e-6
    for name, value in (
        ("data_wait_s", job.data_wait_s),
        ("compute_s", job.compute_s),
        ("ckpt_s", job.ckpt_s),
    ):
        if value > limit:
            return f"job.{name}", "must be a number within 0–wall_s"
    parts = job.data_wait_s + job.compute_s + job.ckpt_s
    if parts > limit:
        return "job.wall_s", (
            f"data_wait_s + compute_s + ckpt_s add up to {parts:g} s, more than wall_s "
            f"({job.wall_s:g} s) allows"
        )
    if (job.kind is None) != (job.id is None):
        return ("job.id" if job.id is None else "job.kind"), "required with job.kind and job.id"
    if not workloads:
        if job.kind is not None:
            return "job.id", "names a workload, but the sample has no workloads"
        return None
    if job.kind is None:
        # not said: the workload that held the GPU longest in the interval
        return max(workloads, key=lambda w: w.share_s)
    for w in workloads:
        if w.kind == job.kind and w.id == job.id:
            return w
    return "job.id", "must name one of the sample's workloads (kind and id)"


def jobs_rows(
    *,
    rows: list[tuple[Any, ...]],
    jobs: list[tuple[int, JobIn, WorkloadIn | None]],
    workload_ids: dict[tuple[str, str], int],
) -> list[ingest_store.JobRow]:
    """The job sums for ``ingest_store.push_store`` (``ingest_store.JOB_SUMS`` order) of the
    valid rows, the first of a repeated (gpu, start) only (the one stored)."""
    out: list[ingest_store.JobRow] = []
    seen: set[tuple[int, dt.datetime]] = set()
    for position, job, w in jobs:
        row = rows[position]
        key = (row[0], row[1])
        if key in seen:
            continue
        seen.add(key)
        workload_id = workload_ids.get((w.kind, w.id)) if w is not None else None
        if w is not None and workload_id is None:
            continue  # its sample is stored already (a duplicate): it will add nothing
        flops = job.flops
        out.append(
            (
                row[0],
                row[1],
                workload_id,
                job.model,
                job.steps,
                job.samples,
                job.tokens,
                flops or 0.0,
                job.ckpt_bytes,
                job.wall_s,
                job.data_wait_s,
                job.compute_s,
                job.ckpt_s,
                job.wall_s if flops is not None else 0.0,
            )
        )
    return out


_ARRAYS = slice(-4, -1)  # where a row holds its workload arrays (ingest_store.COLUMNS)


def workloads_attach(
    *,
    rows: list[tuple[Any, ...]],
    workloads: list[tuple[int, list[WorkloadIn]]],
    node_id: int,
    token_id: int | None,
    now: dt.datetime,
    max_new_per_hour: int | None = None,
) -> dict[tuple[str, str], int]:
    """Register the workloads of the valid rows whose samples are new and put their ids,
    shares and air seconds into those rows (in place); returns the ids by (kind, id).

    Only a sample that will be stored registers or renames workloads (docs/ingest.md): the
    store skips one whose (gpu, start) is stored already, and a repeat of a key earlier in
    the same push (the first is stored), so neither names anything here. Raises
    ``ingest_store.WorkloadCapExceeded`` and ``ingest_store.TokenRevoked``; both write
    nothing."""
    if not workloads:
        return {}
    first: dict[tuple[int, dt.datetime], int] = {}
    for position, row in enumerate(rows):
        first.setdefault((row[0], row[1]), position)
    claims: list[ingest_store.Claim] = [
        (row[0], row[1], w.kind, w.id, w.user or "", w.account or "", w.name or "")
        for position, ws in workloads
        if first[((row := rows[position])[0], row[1])] == position
        for w in ws
    ]
    ids = ingest_store.workloads_register(
        node_id=node_id,
        claims=claims,
        token_id=token_id,
        now=now,
        max_new_per_hour=max_new_per_hour,
    )
    for position, ws in workloads:
        row = rows[position]
        # A duplicate's workloads have no ids: the row is not stored anyway.
        known = [w for w in ws if (w.kind, w.id) in ids]
        arrays = (
            [ids[(w.kind, w.id)] for w in known],
            [w.share_s for w in known],
            [w.air_s for w in known],
        )
        rows[position] = (*row[: _ARRAYS.start], *arrays, row[-1])
    return ids


def _cap_error(exc: ingest_store.WorkloadCapExceeded, now: dt.datetime) -> IngestError:
    """The answer to a push whose new workloads do not fit its node's hourly cap: 413 when
    they would not fit even in an empty hour (the agent halves the batch; one sample names at
    most 32, and the cap is at least that), else 429 until the next UTC hour."""
    setting = f"INGEST_MAX_NEW_WORKLOADS_PER_HOUR ({exc.cap})"
    if exc.new > exc.cap:
        return IngestError(
            413, "workloads", f"{exc.new} new workloads in one push, more than {setting}"
        )
    retry_after_s = 3600 - int(now.timestamp()) % 3600
    return IngestError(
        429,
        "workloads",
        f"{exc.new} new workloads; this node registered {exc.used} this hour, and "
        f"{setting} allows no more: retry after the hour",
        retry_after_s=retry_after_s,
    )


# --- the service -------------------------------------------------------------------------------
def _node_update(node_id: int, meta: NodeIn) -> ingest_store.NodeUpdate:
    """What the agent said about itself (empty strings: not said)."""
    return ingest_store.NodeUpdate(
        node_id=node_id,
        reported_hostname=meta.hostname or None,
        agent_version=meta.agent_version or None,
        driver_version=meta.driver_version or None,
        spool_dropped=meta.spool_dropped_samples,
        alloc_problem=meta.alloc_problem,
        alloc_skipped_files=meta.alloc_skipped_files,
    )


def sample_batch_ingest(
    *,
    node_id: int,
    payload_bytes: bytes,
    now: dt.datetime,
    token_id: int | None = None,
    counters: dict[str, int] | None = None,
    max_new_workloads_per_hour: int | None = None,
) -> IngestResult:
    """Validate one push of node ``node_id`` and store its valid samples; duplicates change
    nothing.

    ``token_id`` is the node token the push came with, checked live by every write (None: a
    caller that needs none, such as the demo's history); a revoked one raises
    ``ingest_store.TokenRevoked`` and nothing is written. Raises :class:`IngestError` for a
    push refused as a whole, among them a push whose new workloads pass
    ``max_new_workloads_per_hour`` for its node (None: no cap; the API passes
    ``INGEST_MAX_NEW_WORKLOADS_PER_HOUR``). Database errors propagate (the API answers 503,
    the agent retries the push later). The sample counters (``config.metrics``) are
    incremented here, or added to ``counters`` when given, for the caller to send with its
    own in one round trip.
    """
    push, typed = push_decode(payload_bytes)
    samples = samples_decode(push, typed)
    uuids = {s.gpu for s in samples if type(s) is SampleIn}
    uuids.update(g.uuid for g in push.gpus)
    gpus = gpus_read(uuids)
    unregistered = {}
    if push.gpus:
        unregistered = gpus_register(
            node_id=node_id, block=push.gpus, known=gpus, now=now, token_id=token_id
        )
    instances = instances_register(
        node_id=node_id, block=push.gpus, known=gpus, samples=samples, now=now
    )
    jobs: list[tuple[int, JobIn, WorkloadIn | None]] = []
    instance_rows: list[InstanceRow] = []
    rows, indices, rejected, workloads = samples_validate(
        samples=samples,
        gpus=gpus,
        node_id=node_id,
        now=now,
        unregistered=unregistered,
        jobs=jobs,
        instances=instances,
        instance_rows=instance_rows,
    )
    try:
        workload_ids = workloads_attach(
            rows=rows,
            workloads=workloads,
            node_id=node_id,
            token_id=token_id,
            now=now,
            max_new_per_hour=max_new_workloads_per_hour,
        )
    except ingest_store.WorkloadCapExceeded as exc:
        raise _cap_error(exc, now) from None
    stored = ingest_store.push_store(
        rows=rows,
        node=_node_update(node_id, push.node),
        token_id=token_id,
        now=now,
        jobs=jobs_rows(rows=rows, jobs=jobs, workload_ids=workload_ids) if jobs else (),
    )
    if stored.not_owned:
        # Moved to another node between the read and the write: refused as the read would.
        rejected += [
            Rejected(indices[p], "gpu", _NOT_OWNED, REJECT_OTHER_NODE) for p in stored.not_owned
        ]
    if instance_rows:
        ids = _instance_workload_ids(node_id, instance_rows, workload_ids)
        inst_stored = ingest_store.instances_store(
            rows=[r.row(ids) for r in instance_rows], node_id=node_id, token_id=token_id
        )
        stored.accepted += inst_stored.accepted
        stored.duplicates += inst_stored.duplicates
        rejected += [
            Rejected(instance_rows[p].index, "gpu", _NOT_OWNED, REJECT_OTHER_NODE)
            for p in inst_stored.not_owned
        ]
    rejected.sort(key=lambda r: r.index)
    result = IngestResult(accepted=stored.accepted, duplicates=stored.duplicates, rejected=rejected)
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
