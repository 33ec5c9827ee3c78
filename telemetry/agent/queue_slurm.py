"""Slurm's pending GPU jobs as queue entries (DESIGN.md §9.2, docs/agent.md "Queue pressure").

Pure parsing of ``squeue --json`` (and slurmrestd's ``/jobs``, the same objects) in both shapes:

* Slurm 22.05 (openapi v0.0.38): plain numbers, ``job_state`` a string such as ``"PENDING"``,
  an unset array task id ``null``, an unset time ``0``;
* Slurm 23.02 and later (v0.0.39+): numbers wrapped as ``{"set", "infinite", "number"}`` and
  ``job_state`` a list such as ``["PENDING", "REQUEUED"]``.

Then the two ways to run it: :class:`SqueueSource` (``squeue --json``, bounded in time) and
:class:`SlurmrestdSource` (``GET /slurm/v0.0.XX/jobs`` with a JWT).

What one entry is: a pending job (or array task) that asks for at least one GPU, with
``gpus`` its total (per node × nodes, or the job's own total), ``gpu_model`` the type its
request names, and its reason's class. Running jobs, and jobs asking for no GPU, are left out.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("gpufleet.agent")

# An array record of pending tasks not yet split off ("12_[0-99999]") is expanded into one
# entry per task; a snapshot holds at most this many entries anyway (DESIGN.md §9.2).
MAX_TASKS = 10_000

# squeue reads the controller's whole job table; a controller that does not answer in this
# time gives no snapshot (a gap the server counts as nothing, never an empty queue).
SQUEUE_TIMEOUT_S = 30.0

# slurmrestd's OpenAPI versions, newest first: 25.05 answers v0.0.43 down to v0.0.41, 24.11
# v0.0.42–40, 24.05 v0.0.41–39, 23.11 v0.0.40–38, 23.02 v0.0.39–37, 22.05 v0.0.38–36.
SLURMRESTD_VERSIONS = ("v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.39", "v0.0.38")


def reason_class(reason: str) -> str:
    """DESIGN.md §9.2: capacity (the GPUs are busy), policy (a limit says no), user (the job
    itself waits: a dependency, a hold, a begin time, and anything else)."""
    if reason in ("Resources", "Priority") or reason.startswith("ReqNodeNotAvail"):
        return "capacity"
    if reason.startswith(("QOS", "Assoc")) or "Limit" in reason:
        return "policy"
    return "user"


def number(v: Any) -> int | None:
    """A number in either shape: ``5`` (22.05) or ``{"set": true, "infinite": false,
    "number": 5}`` (23.02+); ``None`` when unset or infinite."""
    if isinstance(v, dict):
        if not v.get("set", False) or v.get("infinite", False):
            return None
        v = v.get("number")
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return int(v)


def states(v: Any) -> list[str]:
    """``job_state`` in either shape: ``"PENDING"`` (22.05) or ``["PENDING", …]`` (23.02+)."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return [s for s in v if isinstance(s, str)]
    return []


def timestamp(v: Any) -> str | None:
    """A Unix time in either shape as the wire writes times (``2026-11-30T09:00:00Z``);
    ``None`` for 0 or unset (a held job has no eligible time yet)."""
    n = number(v)
    if n is None or n <= 0:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(n))


# One GPU request among a TRES list's comma-separated items: "gres:gpu:2", "gres:gpu:h100:2",
# "gres/gpu=4", "gres/gpu:h100=4", "gres/gpu:2" (23.02+ per-node form), or plain "gpu:2". A
# type has a character that is no digit ("gpu:2" is two GPUs of any type).
_GPU_ITEM = re.compile(
    r"^(?:gres[:/])?gpu(?::(?P<type>[^:=,()]*[^\d:=,()][^:=,()]*))?"
    r"(?:[:=](?P<count>\d+))?$"
)


def gpu_request(tres: Any) -> tuple[int, str | None] | None:
    """The GPUs a TRES string asks for: (count, the type when one is named) or ``None`` when
    it names no GPU. A bare ``gres:gpu`` asks for one. Several items add up; an untyped total
    beside typed ones (``gres/gpu=4,gres/gpu:h100=4``, as ``tres_req_str`` lists them) is the
    count, and the type is kept when every typed item names the same one."""
    if not isinstance(tres, str) or not tres:
        return None
    untyped: int | None = None
    typed: dict[str, int] = {}
    for raw in tres.split(","):
        m = _GPU_ITEM.match(raw.strip())
        if m is None:
            continue
        count = 1 if m["count"] is None else int(m["count"])
        if m["type"] is None:
            untyped = (untyped or 0) + count
        else:
            typed[m["type"]] = typed.get(m["type"], 0) + count
    if untyped is None and not typed:
        return None
    total = untyped if untyped is not None else sum(typed.values())
    model = next(iter(typed)) if len(typed) == 1 else None
    return total, model


def job_gpus(job: dict[str, Any]) -> tuple[int, str | None] | None:
    """A job's total GPUs and model: its per-job request, else per node × nodes, else the
    totals in ``tres_req_str`` (which lists gres/gpu only where accounting tracks it)."""
    per_job = gpu_request(job.get("tres_per_job"))
    if per_job is not None:
        return per_job
    per_node = gpu_request(job.get("tres_per_node"))
    if per_node is not None:
        nodes = number(job.get("node_count")) or 1
        return per_node[0] * max(nodes, 1), per_node[1]
    return gpu_request(job.get("tres_req_str"))


def array_tasks(spec: str, limit: int = MAX_TASKS) -> list[int]:
    """The task ids of an array task string: ``0-3``, ``1,3,5-7``, ``0-15:4``; a ``%N``
    throttle is no task. At most ``limit`` ids."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+)(?::(\d+))?)?\s*", part)
        if m is None:
            continue
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        step = max(int(m[3]) if m[3] is not None else 1, 1)
        for t in range(lo, hi + 1, step):
            if len(out) >= limit:
                return out
            out.append(t)
    return out


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def job_ids(job: dict[str, Any]) -> list[str]:
    """The entry ids of one squeue record: ``<job>``, ``<array job>_<task>``, or one id per
    task of an array record whose pending tasks are not split off yet (``12_[0-3]``)."""
    job_id = number(job.get("job_id"))
    array_id = number(job.get("array_job_id"))
    task = number(job.get("array_task_id"))
    if array_id and task is not None:
        return [f"{array_id}_{task}"]
    spec = _text(job.get("array_task_string"))
    if array_id and spec:
        return [f"{array_id}_{t}" for t in array_tasks(spec)]
    return [str(job_id)] if job_id is not None else []


def slurm_entries(jobs: Any) -> Iterator[dict[str, Any]]:
    """The queue entries of squeue's (or slurmrestd's) ``jobs`` list, in its order."""
    if not isinstance(jobs, list):
        return
    for job in jobs:
        if not isinstance(job, dict) or "PENDING" not in states(job.get("job_state")):
            continue
        req = job_gpus(job)
        if req is None or req[0] < 1:
            continue
        gpus, model = req
        reason = _text(job.get("state_reason")) or "None"
        # a job submitted to several partitions ("gpu,gpu-long") is counted in the first
        partition = _text(job.get("partition")).split(",")[0]
        common = {
            "user": _text(job.get("user_name")),
            "account": _text(job.get("account")),
            "partition": partition,
            "gpus": gpus,
            "gpu_model": model,
            "reason": reason,
            "class": reason_class(reason),
            "submitted": timestamp(job.get("submit_time")),
            "eligible": timestamp(job.get("eligible_time")),
        }
        for id_ in job_ids(job):
            yield {"kind": "slurm", "id": id_, **common}


def squeue_entries(doc: Any) -> list[dict[str, Any]]:
    """The entries of a whole ``squeue --json`` (or slurmrestd ``/jobs``) answer."""
    return list(slurm_entries(doc.get("jobs") if isinstance(doc, dict) else None))


class QueueError(RuntimeError):
    """The scheduler did not say what is pending (no snapshot this time)."""


class SqueueSource:
    """``squeue --json`` on this host (a login or controller node), bounded in time."""

    def __init__(self, squeue: str = "squeue", *, timeout_s: float = SQUEUE_TIMEOUT_S) -> None:
        self.squeue = squeue
        self.timeout_s = timeout_s

    def __call__(self) -> list[dict[str, Any]]:
        try:
            r = subprocess.run(
                [self.squeue, "--json"],
                capture_output=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise QueueError(f"{self.squeue} --json took over {self.timeout_s:.0f} s") from None
        except OSError as e:
            raise QueueError(f"cannot run {self.squeue}: {e}") from None
        if r.returncode != 0:
            err = r.stderr.decode("utf-8", "replace").strip()[:300]
            raise QueueError(f"{self.squeue} --json exited {r.returncode}: {err}")
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            raise QueueError(f"{self.squeue} --json printed no JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
            raise QueueError(f"{self.squeue} --json printed no job list")
        return squeue_entries(doc)


def jwt_user(token: str) -> str | None:
    """The user a Slurm JWT names (its ``sun`` claim): slurmrestd 22.05 also wants it in
    ``X-SLURM-USER-NAME``. The token is not checked here; slurmctld does that."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    sun = claims.get("sun") if isinstance(claims, dict) else None
    return sun if isinstance(sun, str) and sun else None


class SlurmrestdSource:
    """slurmrestd's ``GET /slurm/v0.0.XX/jobs`` with ``X-SLURM-USER-TOKEN`` (the JWT read
    from its file at every poll, so a rotated token is picked up) and ``X-SLURM-USER-NAME``
    (``user``, else the token's own). The first poll tries the versions newest first and keeps
    the first one the server answers."""

    def __init__(
        self,
        url: str,
        jwt_file: str,
        *,
        user: str | None = None,
        timeout_s: float = SQUEUE_TIMEOUT_S,
        versions: tuple[str, ...] = SLURMRESTD_VERSIONS,
    ) -> None:
        self.url = url.rstrip("/")
        self.jwt_file = jwt_file
        self.user = user
        self.timeout_s = timeout_s
        self.versions = versions
        self.version: str | None = None

    def _get(self, version: str, token: str) -> tuple[int, bytes]:
        headers = {"X-SLURM-USER-TOKEN": token, "Accept": "application/json"}
        user = self.user or jwt_user(token)
        if user:
            headers["X-SLURM-USER-NAME"] = user
        req = urllib.request.Request(f"{self.url}/slurm/{version}/jobs", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as e:
            return int(e.code), b""
        except (urllib.error.URLError, OSError) as e:
            raise QueueError(f"cannot reach slurmrestd at {self.url}: {e}") from None

    def __call__(self) -> list[dict[str, Any]]:
        try:
            with open(self.jwt_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise QueueError(f"cannot read the JWT file {self.jwt_file}: {e}") from None
        for version in (self.version,) if self.version else self.versions:
            status, body = self._get(version, token)
            if status in (404, 400) and self.version is None:
                continue  # this slurmrestd does not serve that version: try the next older
            if status in (401, 403):
                raise QueueError(f"slurmrestd refused the token in {self.jwt_file} ({status})")
            if status != 200:
                raise QueueError(f"slurmrestd answered {status} at /slurm/{version}/jobs")
            try:
                doc = json.loads(body)
            except ValueError:
                raise QueueError(f"slurmrestd sent no JSON at /slurm/{version}/jobs") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
                raise QueueError(f"slurmrestd sent no job list at /slurm/{version}/jobs")
            if self.version is None:
                log.info("slurmrestd at %s answers %s", self.url, version)
                self.version = version
            return squeue_entries(doc)
        raise QueueError(
            f"slurmrestd at {self.url} answers none of {', '.join(self.versions)} at /jobs"
        )
