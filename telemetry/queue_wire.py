"""The queue wire format (DESIGN.md §9.2, docs/ingest.md "Queue"): typed structs, decoding
and the checks that need nothing but the clock.

A queue push is one snapshot of a cluster's pending GPU jobs. Unlike a sample push, it is
taken or refused whole: a snapshot with one entry left out would read as that job gone (its
stretch closed) and back a minute later (a new one), so a bad entry refuses the push with a
400 naming it (``pending[3].gpus``), in the error shape of ``telemetry.wire``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

import msgspec

from fleet.bounds import date_error
from fleet.identifiers import identifier_error, text_error
from telemetry.wire import IngestError, validation_error_split

# At most this many entries per snapshot (DESIGN.md §9.2); more is answered 413 naming
# ``pending``, as ingest answers too many samples.
MAX_PENDING = 10_000
# The most GPUs one pending job may ask for: far above any cluster's, within an integer column.
GPUS_MAX = 100_000
TEXT_MAX = 200
GPU_MODEL_MAX = 100
CLUSTER_MAX = 100
# The snapshot's time may lie at most this far ahead of the server's clock (as a sample's end).
FUTURE_TOLERANCE_S = 300

QueueKind = Literal["slurm", "k8s"]
ReasonClass = Literal["capacity", "policy", "user"]
_Text = Annotated[str, msgspec.Meta(min_length=1, max_length=TEXT_MAX)]
_Name = Annotated[str, msgspec.Meta(max_length=TEXT_MAX)]
_Time = Annotated[dt.datetime, msgspec.Meta(tz=True)]


class PendingIn(msgspec.Struct, rename={"reason_class": "class"}):
    """One pending GPU job as sent; ranges and enums checked by msgspec."""

    kind: QueueKind
    id: _Text
    gpus: Annotated[int, msgspec.Meta(ge=1, le=GPUS_MAX)]
    reason: _Text
    reason_class: ReasonClass
    # Null, "" or left out: not known to the agent (squeue leaves an account empty). Stored
    # as "".
    user: _Name | None = None
    account: _Name | None = None
    partition: _Name | None = None
    gpu_model: Annotated[str, msgspec.Meta(max_length=GPU_MODEL_MAX)] | None = None
    submitted: _Time | None = None
    eligible: _Time | None = None


class QueuePushIn(msgspec.Struct):
    cluster: Annotated[str, msgspec.Meta(min_length=1, max_length=CLUSTER_MAX)]
    at: _Time
    pending: list[PendingIn]


class _QueuePushRawIn(msgspec.Struct):
    """The envelope with entries left raw: to count them before naming a bad one."""

    cluster: msgspec.Raw
    at: msgspec.Raw
    pending: list[msgspec.Raw]


_decoder = msgspec.json.Decoder(QueuePushIn, strict=True)
_raw_decoder = msgspec.json.Decoder(_QueuePushRawIn, strict=True)

_ERRORS = {
    "gpus": f"must be an integer within 1–{GPUS_MAX}",
    "kind": f"must be one of {', '.join(get_args(QueueKind))}",
    "class": f"must be one of {', '.join(get_args(ReasonClass))}",
    "cluster": f"must be 1–{CLUSTER_MAX} characters",
    "gpu_model": f"must be at most {GPU_MODEL_MAX} characters",
    **{k: f"must be 1–{TEXT_MAX} characters" for k in ("id", "reason")},
    **{k: f"must be at most {TEXT_MAX} characters" for k in ("user", "account", "partition")},
}


@dataclass(frozen=True, slots=True)
class PendingJob:
    """One validated entry, unknown names as ""."""

    kind: str
    job_id: str
    user: str
    account: str
    partition: str
    gpus: int
    gpu_model: str
    reason_class: str
    reason: str
    submitted: dt.datetime | None
    eligible: dt.datetime | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.job_id)


@dataclass(frozen=True, slots=True)
class Snapshot:
    cluster: str
    at: dt.datetime
    jobs: list[PendingJob]


def _decode(payload: bytes) -> QueuePushIn:
    if not payload.strip():
        raise IngestError(400, "body", "empty body: expected a JSON object")
    if b"\\u0000" in payload:
        # PostgreSQL text cannot hold NUL (as in the sample wire).
        raise IngestError(400, "body", "strings must not contain NUL (\\u0000)")
    try:
        try:
            return _decoder.decode(payload)
        except msgspec.ValidationError as exc:
            typed_error = exc
        # Something is bad: too many entries is answered first (413), as for samples.
        try:
            raw = _raw_decoder.decode(payload)
        except msgspec.ValidationError:
            raw = None
        if raw is not None:
            _count_check(len(raw.pending))
        name, error = validation_error_split(typed_error)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in _ERRORS and not error.startswith(("required", "must be an RFC", "not an RFC")):
            if "got `str`" in error and leaf == "gpus":
                error = "must be an integer, not a string"
            else:
                error = _ERRORS[leaf]
        raise IngestError(400, name, error) from None
    except msgspec.DecodeError as exc:
        raise IngestError(400, "body", f"malformed JSON: {exc}") from None
    except UnicodeEncodeError:
        raise IngestError(400, "body", "strings must be valid Unicode") from None
    except RecursionError:
        raise IngestError(400, "body", "nested too deeply: not the queue format") from None


def _count_check(n: int) -> None:
    if n > MAX_PENDING:
        raise IngestError(413, "pending", f"{n} entries; at most {MAX_PENDING} per snapshot")


def _time_check(name: str, value: dt.datetime | None) -> None:
    if value is None:
        return
    # The local date: converting year 1 or 9999 to UTC could overflow.
    error = date_error(value.date())
    if error is not None:
        raise IngestError(400, name, error)


def snapshot_decode(payload: bytes, *, now: dt.datetime, retention_days: int) -> Snapshot:
    """The push as a :class:`Snapshot`, or :class:`IngestError` naming the field to blame.

    Checks beyond the types: printable strings (identifiers for ``cluster``), ``at`` not
    more than 5 minutes ahead of ``now`` nor older than ``retention_days``, ``submitted``
    not after ``at`` (+ the same tolerance), dates within fleet.bounds, and each job listed
    once (by ``kind`` and ``id``).
    """
    push = _decode(payload)
    _count_check(len(push.pending))
    error = identifier_error(push.cluster, max_length=CLUSTER_MAX)
    if error is not None:
        raise IngestError(400, "cluster", error)
    _time_check("at", push.at)  # before any arithmetic: year 1 in UTC would overflow
    at = push.at.astimezone(dt.UTC)
    if (at - now).total_seconds() > FUTURE_TOLERANCE_S:
        raise IngestError(400, "at", "more than 5 minutes ahead of the server's clock")
    if (now - at).total_seconds() > retention_days * 86400:
        raise IngestError(400, "at", f"older than the raw retention period ({retention_days} days)")
    latest_submit = at + dt.timedelta(seconds=FUTURE_TOLERANCE_S)
    seen: set[tuple[str, str]] = set()
    jobs: list[PendingJob] = []
    for i, p in enumerate(push.pending):
        where = f"pending[{i}]"
        for name, value in (
            ("id", p.id),
            ("reason", p.reason),
            ("user", p.user),
            ("account", p.account),
            ("partition", p.partition),
            ("gpu_model", p.gpu_model),
        ):
            if value is None:
                continue
            error = text_error(value, max_length=TEXT_MAX)
            if error is None and value != value.strip():
                error = "must not begin or end with whitespace"
            if error is not None:
                raise IngestError(400, f"{where}.{name}", error)
        if (p.kind, p.id) in seen:
            raise IngestError(400, f"{where}.id", "the same job is listed twice")
        seen.add((p.kind, p.id))
        _time_check(f"{where}.submitted", p.submitted)
        _time_check(f"{where}.eligible", p.eligible)
        if p.submitted is not None and p.submitted > latest_submit:
            raise IngestError(400, f"{where}.submitted", "after the snapshot's time (at)")
        jobs.append(
            PendingJob(
                kind=p.kind,
                job_id=p.id,
                user=p.user or "",
                account=p.account or "",
                partition=p.partition or "",
                gpus=p.gpus,
                gpu_model=p.gpu_model or "",
                reason_class=p.reason_class,
                reason=p.reason,
                submitted=p.submitted,
                eligible=p.eligible,
            )
        )
    return Snapshot(cluster=push.cluster, at=at, jobs=jobs)
