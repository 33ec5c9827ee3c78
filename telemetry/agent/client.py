"""Delivery: POST spooled samples to ``/api/v1/ingest``, oldest first.

The wire format is docs/ingest.md; what delivery guarantees is docs/reliability.md.

Nothing leaves before NVML has been read once since the start, and every push describes every
GPU its samples name (the current inventory, plus the last known entry, marked ``lost``, of a
GPU no longer present), so the server never refuses a sample for want of the GPU block.

What each answer does to the batch:

* an answer with a per-sample reject list (2xx, or 400 when every sample was rejected): the
  accepted and duplicate samples leave the spool; rejected ones a later push can fix (an
  unknown GPU, a start ahead of the server's clock) stay queued and are retried with backoff;
  the rest are refused for good and move to the spool's quarantine, with the answer.
* connection errors, timeouts, 5xx, 429, 408, 401/403/404/405, redirects, a 400 that blames the
  push's ``node`` or ``gpus`` block, and any 4xx not named here: exponential backoff with full
  jitter, honouring ``Retry-After``; the batch stays at the head of the queue. None of these
  says that the samples are wrong, so none of them may cost samples.
* 413: the batch is halved until it fits; a single sample that does not fit is quarantined.
* any other whole-request 400: an empty push (same node and GPU block, no samples) tells
  whether the samples are to blame. If it is refused too, backoff as above; if not, the batch
  is halved until the one bad sample is found, and only that sample is quarantined.

Only the standard library is used (urllib), so the agent extra needs nothing but nvidia-ml-py.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import __version__
from .spool import Batch, Spool

log = logging.getLogger("gpufleet.agent")

INGEST_PATH = "/api/v1/ingest"


@dataclass
class Response:
    status: int  # 0: no HTTP answer (connection refused, timeout, reset…)
    body: bytes = b""
    retry_after: float | None = None
    error: str | None = None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would turn a redirected POST into a GET without a body: report it instead.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _retry_after(v: str | None) -> float | None:
    if not v:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    try:
        d = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    return max(0.0, d.timestamp() - time.time())


def ingest_url(server: str) -> str:
    s = server.rstrip("/")
    return s if s.endswith(INGEST_PATH) else s + INGEST_PATH


def post_json(url: str, token: str, body: bytes, timeout: float) -> Response:
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"gpufleet-agent/{__version__}",
        },
    )
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return Response(int(r.status), r.read())
    except urllib.error.HTTPError as e:
        try:
            data = e.read()
        except (OSError, http.client.HTTPException):
            data = b""
        return Response(int(e.code), data, _retry_after(e.headers.get("Retry-After")))
    except urllib.error.URLError as e:
        return Response(0, error=str(e.reason))
    except (OSError, http.client.HTTPException) as e:
        return Response(0, error=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def backoff_s(rng: random.Random, failures: int, base_s: float, max_s: float) -> float:
    """Full jitter: uniform in [0, min(max_s, base_s × 2^(failures-1)))."""
    return rng.uniform(0.0, min(max_s, base_s * 2.0 ** (failures - 1)))


def failure_reason(r: Response, url: str) -> str:
    """Why a push to ``url`` did not get through, as the log says it."""
    if r.status == 0:
        return f"cannot reach {url} ({r.error})"
    if r.status in (401, 403):
        return f"server refused the token ({r.status}): check --token / GPUFLEET_TOKEN"
    if r.status in (404, 405) or 300 <= r.status < 400:
        return f"server answered {r.status} at {url}: check --server"
    return f"server answered {r.status} {_snippet(r.body, 120)}".rstrip()


def _snippet(body: bytes, n: int = 300) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:n] + ("…" if len(text) > n else "")


@dataclass
class Stats:
    batches_sent: int = 0
    samples_sent: int = 0
    samples_rejected: int = 0
    samples_retried: int = 0
    batches_quarantined: int = 0
    failures: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


def _answer(body: bytes) -> dict[str, Any] | None:
    try:
        answer = json.loads(body) if body else None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _rejects(answer: dict[str, Any] | None, n: int) -> dict[int, dict[str, Any]] | None:
    """The per-sample reject list of an ingest answer, by position in the batch; ``None`` when
    the answer is not one (a whole-request error)."""
    if answer is None or not isinstance(answer.get("rejected"), list):
        return None
    out: dict[int, dict[str, Any]] = {}
    for r in answer["rejected"]:
        if isinstance(r, dict) and isinstance(r.get("index"), int) and 0 <= r["index"] < n:
            out.setdefault(r["index"], r)
    return out


# Reject codes a later push can fix (docs/ingest.md, "Responses").
# An instance the server does not know yet is listed by a later push (its GPU's ``mig``).
RETRYABLE_CODES = frozenset({"unknown_gpu", "clock_ahead", "unknown_instance"})


def _retryable(reject: dict[str, Any]) -> bool:
    """A reject that a later push can fix: the GPU was unknown (every push carries the GPU
    block, so the server registers it), or the interval ends ahead of the server's clock
    (which catches up). By the reject's ``code``; a server too old to send one is matched on
    its wording."""
    code = reject.get("code")
    if isinstance(code, str):
        return code in RETRYABLE_CODES
    name, error = str(reject.get("field", "")), str(reject.get("error", ""))
    return (name == "gpu" and error.startswith("unknown GPU")) or (
        name == "start" and "ahead of the server" in error
    )


def _blames_block(answer: dict[str, Any] | None) -> bool:
    """A whole-request error about the push's ``node`` or ``gpus`` block, not its samples."""
    name = str((answer or {}).get("field", ""))
    return name.startswith(("node", "gpus"))


class Delivery:
    """Sends the spool's oldest batch when due. Pure state machine over an injected clock
    (``now`` arguments), POST function and random source, so tests run hours in no time.

    ``gpus`` returns the current inventory, or ``None`` while the GPUs are not known yet."""

    def __init__(
        self,
        spool: Spool,
        *,
        url: str,
        token: str,
        node: Callable[[], dict[str, Any]],
        gpus: Callable[[], list[dict[str, Any]] | None],
        post: Callable[[str, str, bytes, float], Response] = post_json,
        rng: random.Random | None = None,
        max_batch: int = 1000,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 300.0,
        timeout_s: float = 30.0,
    ) -> None:
        self.spool = spool
        self.url = url
        self.token = token
        self.node = node
        self.gpus = gpus
        self.post = post
        self.rng = rng or random.Random()
        self.max_batch = max_batch
        self.batch_limit = max_batch
        # While looking for the sample a whole-request 400 blames: the size of the next batch,
        # and the last spool id of the refused batch (the bad sample is at or before it).
        self.bisect_limit: int | None = None
        self.suspect_id = 0
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.next_attempt = 0.0
        self.failures = 0  # consecutive
        self.stats = Stats()

    def backoff(self) -> float:
        """Full jitter: uniform in [0, min(cap, base × 2^(failures-1)))."""
        return backoff_s(self.rng, self.failures, self.base_backoff_s, self.max_backoff_s)

    def block(self, inventory: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[Any]:
        """The push's ``gpus``: the inventory, and for each GPU of ``samples`` it lacks (gone
        since the agent restarted) the last entry the spool knows, marked lost."""
        listed = {g["uuid"] for g in inventory}
        missing = sorted({s["gpu"] for s in samples} - listed)
        if not missing:
            return inventory
        saved = self.spool.gpus_saved()
        gone = [{**saved.get(u, {"uuid": u}), "status": "lost"} for u in missing]
        return inventory + gone

    def step(self, now: float, *, timeout_s: float | None = None) -> str:
        """Try one batch if one is due. Returns ``idle`` (spool empty), ``wait`` (backing
        off, or the GPUs not known yet), ``sent``, ``split``, ``quarantined`` or ``retry``.
        ``timeout_s`` caps the POST's timeout (a stopping agent has little time left)."""
        if now < self.next_attempt:
            return "wait"
        inventory = self.gpus()
        if inventory is None:
            # NVML not read yet since the start: a push now would carry no GPU block, and the
            # server refuses the samples of GPUs it has never been told about.
            self.next_attempt = now + 1.0
            return "wait"
        batch = self.spool.oldest(min(self.batch_limit, self.bisect_limit or self.batch_limit))
        if batch is None:
            return "idle"
        timeout = self.timeout_s if timeout_s is None else max(0.1, min(self.timeout_s, timeout_s))
        node = dict(self.node())
        quarantined = self.spool.counter("quarantined_batches")
        if quarantined:
            node["quarantined_batches"] = quarantined
        dropped = self.spool.dropped_pending()
        gpus = self.block(inventory, batch.samples)
        head = {**node, "spool_dropped_samples": dropped} if dropped > 0 else node
        r = self._post(head, gpus, batch.samples, timeout)
        n = len(batch.samples)
        answer = _answer(r.body)
        rejects = _rejects(answer, n) if 200 <= r.status < 300 or r.status == 400 else None
        if 200 <= r.status < 300 or rejects is not None:
            return self._answered(batch, r.status, rejects or {}, max(dropped, 0), now)
        if r.status == 413 and n > 1:
            # the server's limit rarely changes: keep the smaller batches from now on
            self.batch_limit = max(1, n // 2)
            log.warning("server says batch of %d samples too large (413); halving", n)
            return "split"
        if r.status == 413 or (r.status == 400 and not _blames_block(answer)):
            if r.status == 400 and self.bisect_limit is None:
                # Is it the samples at all? The same push without them tells (without the
                # drop count, which it would report a second time).
                probe = self._post(node, gpus, [], timeout)
                if not 200 <= probe.status < 300:
                    return self._retry(r, now, f"an empty push is refused too ({probe.status})")
            return self._refused(batch, r, now)
        return self._retry(r, now)

    def _refused(self, batch: Batch, r: Response, now: float) -> str:
        """The samples of ``batch`` are to blame for a whole-request 4xx: halve until one
        sample is left, and quarantine that one only."""
        n = len(batch.samples)
        self.next_attempt = now
        if n > 1:
            if self.bisect_limit is None:
                self.suspect_id = batch.ids[-1]
            self.bisect_limit = max(1, n // 2)
            log.warning("server refused a batch of %d samples (%d); halving", n, r.status)
            return "split"
        self.bisect_limit = None
        self.spool.settle(batch, quarantine=[0], status=r.status, reason=_snippet(r.body, 2000))
        self.stats.batches_quarantined += 1
        log.error(
            "server refused a sample (%d): %s; quarantined in %s",
            r.status,
            _snippet(r.body),
            self.spool.path,
        )
        return "quarantined"

    def _post(
        self, node: dict[str, Any], gpus: list[Any], samples: list[Any], timeout: float
    ) -> Response:
        payload = {"node": node, "gpus": gpus, "samples": samples}
        body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        r = self.post(self.url, self.token, body, timeout)
        self.stats.statuses[r.status] = self.stats.statuses.get(r.status, 0) + 1
        return r

    def _answered(
        self,
        batch: Batch,
        status: int,
        rejects: dict[int, dict[str, Any]],
        dropped: int,
        now: float,
    ) -> str:
        """The server went through the batch sample by sample (which also recorded the node
        block, drops included): settle each sample by its fate."""
        n = len(batch.samples)
        keep = [i for i, rej in rejects.items() if _retryable(rej)]
        bad = [i for i, rej in rejects.items() if not _retryable(rej)]
        st = self.stats
        self.spool.settle(
            batch,
            keep=keep,
            quarantine=bad,
            status=status,
            reason=json.dumps([rejects[i] for i in sorted(bad)], separators=(",", ":")),
            dropped_reported=dropped,
        )
        if dropped > 0:
            log.warning("reported %d samples dropped from the full spool", dropped)
        if rejects:
            st.samples_rejected += len(bad)
            st.samples_retried += len(keep)
            shown = json.dumps([rejects[i] for i in sorted(rejects)[:3]], separators=(",", ":"))
            log.warning(
                "server rejected %d of %d samples: %s; %d quarantined in %s, %d kept to retry",
                len(rejects),
                n,
                shown[:500],
                len(bad),
                self.spool.path,
                len(keep),
            )
        if bad:
            st.batches_quarantined += 1
        taken = n - len(rejects)
        if keep:
            self.failures += 1
            self.next_attempt = now + self.backoff()
        else:
            if self.failures:
                log.warning("server reachable again after %d failed attempts", self.failures)
            self.failures = 0
            self.next_attempt = now
        if taken:
            if batch.ids[-1] >= self.suspect_id:
                self.bisect_limit = None  # past the refused batch without finding a bad sample
            st.batches_sent += 1
            st.samples_sent += taken
        if keep and not taken:
            return "retry"
        return "sent" if taken else "quarantined"

    def _retry(self, r: Response, now: float, note: str = "") -> str:
        """Keep the batch at the head of the queue and try again after a backoff."""
        self.failures += 1
        self.stats.failures += 1
        self.bisect_limit = None
        delay = self.backoff()
        if r.retry_after is not None:
            delay = max(delay, min(r.retry_after, self.max_backoff_s))
        self.next_attempt = now + delay
        pending = self.spool.pending()
        why = failure_reason(r, self.url)
        if note:
            why = f"{why} ({note})"
        log.warning("push failed: %s; %d samples spooled; retry in %.1f s", why, pending, delay)
        return "retry"

    def drain(self, now: Callable[[], float], *, within_s: float | None = None) -> str:
        """Send until the spool is empty or a retry is needed; with ``within_s``, stop after
        that many real seconds, no POST outliving them."""
        until = None if within_s is None else time.monotonic() + within_s
        while True:
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                return "deadline"
            out = self.step(now(), timeout_s=left)
            if out in ("idle", "wait", "retry"):
                return out


class Deliverer(Protocol):
    """What :func:`deliver_until` drives: :class:`Delivery` (samples) and the queue
    collector's ``QueueDelivery`` (snapshots)."""

    next_attempt: float

    def step(self, now: float) -> str: ...

    def drain(self, clock: Callable[[], float], *, within_s: float) -> Any: ...


def deliver_until(
    delivery: Deliverer,
    clock: Any,
    *,
    stop: threading.Event,
    wake: threading.Event,
    again: Collection[str],
    stop_until: Callable[[], float],
    what: str,
) -> None:
    """A sender thread's loop: deliver until ``stop``, then make one last try, so that a clean
    stop leaves nothing behind when the server is up, within the stop budget (``stop_until()``,
    a ``time.monotonic()`` deadline read at the end: no POST outlives it). A step whose
    outcome is in ``again`` is followed at once; otherwise the loop waits for ``wake`` or the
    next attempt (at most 60 s). ``what`` names the push in the log ("delivery", "queue
    delivery")."""
    while not stop.is_set():
        try:
            out = delivery.step(clock.time())
        except Exception:  # never let one bad answer kill delivery
            log.exception("%s failed unexpectedly; retrying in 10 s", what)
            delivery.next_attempt = clock.time() + 10.0
            out = "retry"
        if out in again:
            continue
        wait = delivery.next_attempt - clock.time() if out in ("wait", "retry") else 60.0
        # the clock's seconds may be simulated; the wait itself is real time
        speed = float(getattr(clock, "speed", 1.0))
        wake.wait(timeout=max(0.01, min(wait, 60.0)) / speed)
        wake.clear()
    delivery.next_attempt = 0.0
    try:
        delivery.drain(clock.time, within_s=stop_until() - time.monotonic())
    except Exception:
        log.exception("the last push of the %s before stopping failed", what)
