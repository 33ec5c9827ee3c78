"""The ingest wire format (docs/ingest.md): typed structs, decoding and the answers' errors.

The body is decoded by msgspec straight into typed structs (type and range checks in C), never
into DRF serializers or model instances. Everything here is pure: what needs the server's
state (the GPUs, the clock) is checked in ``telemetry.ingest``.

Whole-request problems (malformed JSON, too many samples or GPUs, a bad ``node`` or ``gpus``
block) raise :class:`IngestError` with the field to blame; a bad sample becomes a
:class:`Rejected` in its place, and the rest of its batch is stored.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import msgspec
from django.conf import settings

from fleet.identifiers import identifier_error, text_error

# The widest values the columns hold (smallint, bigint): anything wider is bad input, not a 500.
SMALLINT_MAX = 32_767
INT_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1
THROTTLE_KEYS = ("power_cap", "thermal", "hw_slowdown", "other", "any")
# The longest GPU uuid (fleet.Gpu.uuid) and reported hostname (fleet.Node.reported_hostname).
UUID_MAX = 100
HOSTNAME_MAX = 255
# fleet.Node.alloc_problem (the agent cuts its text to this: telemetry/agent/workloads.py)
ALLOC_PROBLEM_MAX = 300

Pct = Annotated[float, msgspec.Meta(ge=0, le=100)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=3600)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
# Workloads per sample, and their strings (docs/ingest.md, "workloads").
WORKLOADS_MAX = 32
WORKLOAD_TEXT_MAX = 200
WorkloadKind = Literal["slurm", "k8s", "container", "user"]
WorkloadText = Annotated[str, msgspec.Meta(min_length=1, max_length=WORKLOAD_TEXT_MAX)]
# Σ share_s of a sample may pass ``seconds`` by this much: per-second shares are summed in
# floating point by the agent.
SHARE_SLACK_S = 0.5


# --- wire structs ------------------------------------------------------------------------------
class ThrottleIn(msgspec.Struct):
    """Seconds of the interval with each throttle reason set; checked against ``seconds``."""

    power_cap: Seconds | None = None
    thermal: Seconds | None = None
    hw_slowdown: Seconds | None = None
    other: Seconds | None = None
    any: Seconds | None = None


class WorkloadIn(msgspec.Struct):
    """A workload that held the GPU during the sample: its share of the interval's seconds
    and of their air time (docs/metrics.md, "Workloads")."""

    kind: WorkloadKind
    id: WorkloadText
    share_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]
    air_s: Seconds
    # Optional (absent or null: not said), but 1–200 characters when sent.
    user: WorkloadText | None = None
    account: WorkloadText | None = None
    name: WorkloadText | None = None


NonNegative = Annotated[float, msgspec.Meta(ge=0, le=1e300)]
JOB_MODEL_MAX = 200
# A job's data wait, compute and checkpoint happen within its wall time; the parts may pass it
# by this share (clock reads and rounding in the hook and the agent).
JOB_PARTS_SLACK = 1.01


class JobIn(msgspec.Struct):
    """What the training loop of one workload on this GPU reported over the interval
    (docs/ingest.md, "job"; the agent's hook socket): sums, counts split over the workload's
    GPUs, times the job's own. ``kind``/``id`` name the workload among the sample's
    ``workloads`` (absent: the one with the largest share)."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=JOB_MODEL_MAX)]
    wall_s: Annotated[float, msgspec.Meta(ge=0, le=3600)]
    steps: NonNegative = 0.0
    samples: NonNegative = 0.0
    tokens: NonNegative = 0.0
    data_wait_s: Seconds = 0.0
    compute_s: Seconds = 0.0
    ckpt_s: Seconds = 0.0
    ckpt_bytes: NonNegative = 0.0
    # Absent: the job did not say (no MFU for it); 0 is a measured zero.
    flops: NonNegative | None = None
    kind: WorkloadKind | None = None
    id: WorkloadText | None = None


class SampleIn(msgspec.Struct):
    """One sample as sent; constraints here are the context-free ranges of docs/ingest.md.

    Every float is range-constrained, which also rejects NaN and ±Infinity (JSON has neither;
    a Python agent's ``NaN`` literal reaches here through the lenient fallback decoder).
    """

    gpu: Annotated[str, msgspec.Meta(min_length=1, max_length=UUID_MAX)]
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
    active_s: Seconds | None = None
    # Profiling means (NVML GPM, dcgm-exporter) over prof_s seconds (default: seconds).
    sm_active: Fraction | None = None
    sm_occupancy: Fraction | None = None
    tensor_active: Fraction | None = None
    dram_active: Fraction | None = None
    prof_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] | None = None
    workloads: Annotated[list[WorkloadIn], msgspec.Meta(max_length=WORKLOADS_MAX)] | None = None
    job: JobIn | None = None
    # A MIG instance of ``gpu`` (its MIG UUID, listed in the GPU's ``mig`` block): the sample
    # covers that instance alone (docs/ingest.md, "instance").
    instance: Annotated[str, msgspec.Meta(min_length=1, max_length=UUID_MAX)] | None = None


class NodeIn(msgspec.Struct):
    """What the agent says about its node; recorded, never trusted (the token names the node)."""

    hostname: Annotated[str, msgspec.Meta(max_length=HOSTNAME_MAX)] = ""
    agent_version: Annotated[str, msgspec.Meta(max_length=50)] = ""
    driver_version: Annotated[str, msgspec.Meta(max_length=50)] = ""
    # Samples the agent's full spool dropped since its last successful push.
    spool_dropped_samples: Annotated[int, msgspec.Meta(ge=0, le=BIGINT_MAX)] = 0
    # The allocation directory (docs/agent.md): the problem in force that hides allocations
    # ("" none) and the files skipped at the agent's last look; absent: not said.
    alloc_problem: Annotated[str, msgspec.Meta(max_length=ALLOC_PROBLEM_MAX)] | None = None
    alloc_skipped_files: Annotated[int, msgspec.Meta(ge=0, le=INT_MAX)] | None = None


# MIG (docs/ingest.md, "mig"): a GPU has at most MIG_SLICES_MAX slices, so at most that many
# instances (one compute instance per GPU instance, or several sharing one: 7 × 8 at most).
MIG_SLICES_MAX = 8
MIG_INSTANCES_MAX = 64
MIG_PROFILE_MAX = 50
MIG_SLICES_DEFAULT = 7  # A100, H100, H200, B200: a GPU whose block does not say mig_slices


class MigIn(msgspec.Struct):
    """One MIG instance of a GPU: its MIG UUID, GPU and compute instance ids, NVIDIA's
    profile name, slices and memory."""

    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=UUID_MAX)]
    gi: Annotated[int, msgspec.Meta(ge=0, le=SMALLINT_MAX)]
    ci: Annotated[int, msgspec.Meta(ge=0, le=SMALLINT_MAX)]
    profile: Annotated[str, msgspec.Meta(min_length=1, max_length=MIG_PROFILE_MAX)]
    slices: Annotated[int, msgspec.Meta(ge=1, le=MIG_SLICES_MAX)]
    memory_mb: Annotated[int, msgspec.Meta(ge=0, le=BIGINT_MAX)]


class GpuIn(msgspec.Struct):
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=UUID_MAX)]
    index: Annotated[int, msgspec.Meta(ge=0, le=SMALLINT_MAX)] | None = None
    name: Annotated[str, msgspec.Meta(max_length=100)] = ""
    memory_total_bytes: Annotated[int, msgspec.Meta(ge=0, le=BIGINT_MAX)] | None = None
    power_limit_w: Annotated[float, msgspec.Meta(ge=0, le=5000)] | None = None
    # "lost": the agent can no longer reach it (off the bus); "ok" or absent: present.
    status: Literal["ok", "lost"] | None = None
    # MIG mode: its instances now (absent: not in MIG mode, or not said), and its slices.
    mig: Annotated[list[MigIn], msgspec.Meta(max_length=MIG_INSTANCES_MAX)] | None = None
    mig_slices: Annotated[int, msgspec.Meta(ge=1, le=MIG_SLICES_MAX)] | None = None

    @property
    def is_lost(self) -> bool:
        return self.status == "lost"


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


Push = PushIn | PushRawIn | PushLooseIn

_push_decoder = msgspec.json.Decoder(PushIn, strict=True)
_push_raw_decoder = msgspec.json.Decoder(PushRawIn, strict=True)
_sample_decoder = msgspec.json.Decoder(SampleIn, strict=True)


# --- errors ------------------------------------------------------------------------------------
class IngestError(Exception):
    """The whole push is refused: ``status`` (400/413) and the field to blame."""

    def __init__(
        self, status: int, field_name: str, error: str, retry_after_s: int | None = None
    ) -> None:
        super().__init__(f"{field_name}: {error}")
        self.status = status
        self.field = field_name
        self.error = error
        self.retry_after_s = retry_after_s  # a 429's Retry-After

    def body(self) -> dict[str, Any]:
        return {"detail": f"{self.field}: {self.error}", "field": self.field, "error": self.error}


@dataclass(slots=True)
class Rejected:
    """One sample refused: its index in the push, the field to blame, why, and a stable code
    an agent can act on (docs/ingest.md, "Responses")."""

    index: int
    field: str
    error: str
    code: str = "invalid"


# The codes of a reject. Only the first two can succeed when sent again later: with the GPU
# in the push's gpus block, and once the agent's clock no longer runs ahead.
REJECT_UNKNOWN_GPU = "unknown_gpu"
REJECT_CLOCK_AHEAD = "clock_ahead"
REJECT_OTHER_NODE = "other_node"
REJECT_NOT_REGISTERED = "not_registered"
REJECT_TOO_OLD = "too_old"
REJECT_INVALID = "invalid"
# A sample naming a MIG instance the server does not know for its GPU (docs/ingest.md).
REJECT_UNKNOWN_INSTANCE = "unknown_instance"


_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<name>[^`]+)`")
_INDEX = re.compile(r"\[(\d+)\]")
_WORKLOAD_TEXT_PATH = re.compile(r"workloads\[\d+\]\.(id|user|account|name)$")
_WORKLOAD_KIND_PATH = re.compile(r"workloads\[\d+\]\.kind$")
_JOB_NUMBERS = frozenset(
    ("steps", "samples", "tokens", "ckpt_bytes", "flops", "data_wait_s", "compute_s", "ckpt_s")
)
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
    "sm_occupancy": "must be a number within 0–1",
    "tensor_active": "must be a number within 0–1",
    "dram_active": "must be a number within 0–1",
    "prof_s": "must be a number within 1–seconds",
    "share_s": "must be a number above 0 and at most seconds",
    "air_s": "must be a number within 0–share_s",
    "memory_total_bytes": "must be an integer ≥ 0 (bytes)",
    "power_limit_w": "must be a number within 0–5000",
    "index": f"must be an integer within 0–{SMALLINT_MAX}",
    "spool_dropped_samples": "must be an integer ≥ 0",
    "alloc_problem": f"must be a string of at most {ALLOC_PROBLEM_MAX} characters",
    "alloc_skipped_files": f"must be an integer within 0–{INT_MAX}",
    "gi": f"must be an integer within 0–{SMALLINT_MAX}",
    "ci": f"must be an integer within 0–{SMALLINT_MAX}",
    "slices": f"must be an integer within 1–{MIG_SLICES_MAX} (and at most mig_slices)",
    "mig_slices": f"must be an integer within 1–{MIG_SLICES_MAX}",
    "memory_mb": "must be an integer ≥ 0 (MiB)",
}
_MIG_LIST_PATH = re.compile(r"gpus\[\d+\]\.mig$")
_MIG_PROFILE_PATH = re.compile(r"gpus\[\d+\]\.mig\[\d+\]\.profile$")


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
    if leaf == "workloads" and "length" in message:
        return path, f"at most {WORKLOADS_MAX} entries"
    if _MIG_LIST_PATH.match(path) and "length" in message:
        return path, f"at most {MIG_INSTANCES_MAX} instances"
    if _MIG_PROFILE_PATH.match(path) and "length" in message:
        return path, f"must be 1–{MIG_PROFILE_MAX} characters"
    if _WORKLOAD_TEXT_PATH.match(path) and "length" in message:
        return path, f"must be 1–{WORKLOAD_TEXT_MAX} characters"
    if _WORKLOAD_KIND_PATH.match(path) and "enum" in message:
        return path, f"must be one of {', '.join(get_args(WorkloadKind))}"
    if path.startswith("job."):
        job_error = _job_error(path[4:], message)
        if job_error is not None:
            return path, job_error
    if leaf in _RANGES and any(
        mark in message for mark in (">=", "<=", "` > ", "` < ", "out of range", "got `float`")
    ):
        return path, _RANGES[leaf]
    return path or root, message


def _job_error(name: str, message: str) -> str | None:
    """The reason for a bad field of a sample's ``job`` (``name``: its key), from msgspec's."""
    ranged = any(mark in message for mark in (">=", "<=", "out of range", "got `float`"))
    if name == "model" and "length" in message:
        return f"must be a string of 1–{JOB_MODEL_MAX} characters"
    if name == "model" and "Expected `str`" in message:
        return f"must be a string of 1–{JOB_MODEL_MAX} characters"
    if name == "wall_s" and ranged:
        return "must be a number within 0–seconds"
    if name in ("data_wait_s", "compute_s", "ckpt_s") and ranged:
        return "must be a number within 0–wall_s"
    if name in _JOB_NUMBERS and ranged:
        return "must be a finite number ≥ 0"
    if name == "kind" and "enum" in message:
        return f"must be one of {', '.join(get_args(WorkloadKind))}"
    if name == "id" and "length" in message:
        return f"must be 1–{WORKLOAD_TEXT_MAX} characters"
    return None


# --- decoding ----------------------------------------------------------------------------------
def push_decode(payload: bytes) -> tuple[Push, bool]:
    """Decode and check the envelope; the flag says whether its samples are already typed and
    valid (the fast path). Raises :class:`IngestError` for a push refused as a whole."""
    push, typed = _envelope_decode(payload)
    max_samples = settings.INGEST_MAX_SAMPLES
    if len(push.samples) > max_samples:
        raise IngestError(
            413, "samples", f"{len(push.samples)} samples; at most {max_samples} per push"
        )
    max_gpus = settings.INGEST_MAX_GPUS
    if len(push.gpus) > max_gpus:
        raise IngestError(
            413, "gpus", f"{len(push.gpus)} GPUs; at most {max_gpus} per push (INGEST_MAX_GPUS)"
        )
    _strings_check(push)
    return push, typed


_SURROGATE = "strings must be valid Unicode (a lone UTF-16 surrogate escape is not)"


def _envelope_decode(payload: bytes) -> tuple[Push, bool]:
    if not payload.strip():
        raise IngestError(400, "body", "empty body: expected a JSON object")
    if b"\\u0000" in payload:
        # PostgreSQL text cannot hold NUL: refuse it here rather than fail in the database
        # (which would answer 503 and make the agent retry a push that can never succeed).
        raise IngestError(400, "body", "strings must not contain NUL (\\u0000)")
    try:
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
            except ValueError:
                raise IngestError(400, "body", f"malformed JSON: {exc}") from None
            try:
                return msgspec.convert(loose, PushLooseIn, strict=True), False
            except msgspec.ValidationError as exc2:
                name, error = validation_error_split(exc2)
                raise IngestError(400, name, error) from None
            except UnicodeEncodeError:
                # msgspec refuses lone surrogate escapes ("\ud800"); the standard library
                # accepts them, and they cannot be stored.
                raise IngestError(400, "body", _SURROGATE) from None
    except RecursionError:
        # Both decoders refuse deeply nested arrays and objects by recursing until Python's
        # limit; no part of the format nests more than three levels.
        raise IngestError(400, "body", "nested too deeply: not the ingest format") from None


def _strings_check(push: Push) -> None:
    """The node and GPU blocks' strings: identifiers as fleet.identifiers defines them, the
    rest printable text (a lone surrogate or control character would otherwise fail in the
    database, or reach a page)."""
    node = push.node
    if node.hostname:
        _string_check("node.hostname", identifier_error(node.hostname, max_length=HOSTNAME_MAX))
    _string_check("node.agent_version", text_error(node.agent_version, max_length=50))
    _string_check("node.driver_version", text_error(node.driver_version, max_length=50))
    for i, gpu in enumerate(push.gpus):
        _string_check(f"gpus[{i}].uuid", identifier_error(gpu.uuid, max_length=UUID_MAX))
        _string_check(f"gpus[{i}].name", text_error(gpu.name, max_length=100))
    _mig_check(push.gpus)


def _mig_check(gpus: list[GpuIn]) -> None:
    """The ``mig`` blocks: identifiers and text as elsewhere, each instance once in the push,
    each within its GPU's slices, and together no more slices than the GPU has."""
    seen: dict[str, str] = {}
    for i, gpu in enumerate(gpus):
        if gpu.mig is None:
            if gpu.mig_slices is not None:
                raise IngestError(400, f"gpus[{i}].mig_slices", "only with mig (the instances)")
            continue
        total = MIG_SLICES_DEFAULT if gpu.mig_slices is None else gpu.mig_slices
        used = 0
        for j, m in enumerate(gpu.mig):
            at = f"gpus[{i}].mig[{j}]"
            _string_check(f"{at}.uuid", identifier_error(m.uuid, max_length=UUID_MAX))
            _string_check(f"{at}.profile", text_error(m.profile, max_length=MIG_PROFILE_MAX))
            if m.uuid == gpu.uuid:
                raise IngestError(400, f"{at}.uuid", "an instance's uuid is not its GPU's")
            if m.uuid in seen:
                raise IngestError(
                    400, f"{at}.uuid", f"the same instance is listed twice (also {seen[m.uuid]})"
                )
            seen[m.uuid] = at
            if m.slices > total:
                raise IngestError(
                    400, f"{at}.slices", f"more than the GPU's {total} slices (mig_slices)"
                )
            used += m.slices
        if used > total:
            raise IngestError(
                400,
                f"gpus[{i}].mig",
                f"the instances' slices add up to {used}, more than the GPU's {total}",
            )
    for i, gpu in enumerate(gpus):
        if gpu.uuid in seen:
            raise IngestError(400, f"gpus[{i}].uuid", f"also a MIG instance ({seen[gpu.uuid]})")


def _string_check(field_name: str, error: str | None) -> None:
    if error is not None:
        raise IngestError(400, field_name, error)


def samples_decode(push: Push, typed: bool) -> list[SampleIn | Rejected]:
    """Every sample of ``push`` decoded, or a :class:`Rejected` in its place (so indices stay
    those of the push). A sample's ``gpu`` must be an identifier; each distinct value is
    checked once."""
    samples: list[SampleIn | Rejected]
    if typed:
        samples = list(push.samples)  # type: ignore[arg-type]
    else:
        samples = []
        for i, raw in enumerate(push.samples):
            try:
                if isinstance(raw, msgspec.Raw):
                    samples.append(_sample_decoder.decode(raw))
                else:
                    samples.append(msgspec.convert(raw, SampleIn, strict=True))
            except msgspec.ValidationError as exc:
                name, error = validation_error_split(exc, root="sample")
                samples.append(Rejected(i, name, error))
            except RecursionError:
                samples.append(Rejected(i, "sample", "nested too deeply"))
            except UnicodeEncodeError:
                samples.append(Rejected(i, "sample", _SURROGATE))
    bad: dict[str, str] = {}
    for uuid in {s.gpu for s in samples if type(s) is SampleIn}:
        why = identifier_error(uuid, max_length=UUID_MAX)
        if why is not None:
            bad[uuid] = why
    if bad:
        samples = [
            Rejected(i, "gpu", bad[s.gpu]) if type(s) is SampleIn and s.gpu in bad else s
            for i, s in enumerate(samples)
        ]
    return samples
