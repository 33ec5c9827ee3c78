"""Delivery: POST spooled samples to ``/api/v1/ingest``, oldest first (DESIGN.md §4, §5).

* 2xx: the batch is acknowledged and leaves the spool; the server's per-sample reject list is
  logged.
* connection errors, timeouts, 5xx, 429 (and 408, redirects, 401/403/404, which a batch cannot
  fix and an operator can): exponential backoff with full jitter, honouring ``Retry-After``;
  the batch stays at the head of the queue.
* 413: the batch is halved until it fits; a single sample that does not fit is quarantined.
* any other 4xx: the batch is quarantined (kept in the spool file, logged, counted) so one bad
  batch never blocks the queue.

Only the standard library is used (urllib), so the agent extra needs nothing but nvidia-ml-py.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .spool import Spool

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


def _snippet(body: bytes, n: int = 300) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:n] + ("…" if len(text) > n else "")


@dataclass
class Stats:
    batches_sent: int = 0
    samples_sent: int = 0
    samples_rejected: int = 0
    batches_quarantined: int = 0
    failures: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


# statuses a new attempt may fix without changing the batch
_RETRY = {408, 425, 429}
# statuses an operator must fix (token, URL); quarantining every batch meanwhile would be wrong
_OPERATOR = {401, 403, 404, 405}


class Delivery:
    """Sends the spool's oldest batch when due. Pure state machine over an injected clock
    (``now`` arguments), POST function and random source, so tests run hours in no time."""

    def __init__(
        self,
        spool: Spool,
        *,
        url: str,
        token: str,
        node: Callable[[], dict[str, Any]],
        gpus: Callable[[], list[dict[str, Any]]],
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
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.next_attempt = 0.0
        self.failures = 0  # consecutive
        self.stats = Stats()

    def backoff(self) -> float:
        """Full jitter: uniform in [0, min(cap, base × 2^(failures-1)))."""
        ceiling = min(self.max_backoff_s, self.base_backoff_s * 2.0 ** (self.failures - 1))
        return self.rng.uniform(0.0, ceiling)

    def step(self, now: float) -> str:
        """Try one batch if one is due. Returns ``idle`` (spool empty), ``wait`` (backing
        off), ``sent``, ``split``, ``quarantined`` or ``retry``."""
        if now < self.next_attempt:
            return "wait"
        batch = self.spool.oldest(self.batch_limit)
        if batch is None:
            return "idle"
        dropped = self.spool.dropped_pending()
        node = dict(self.node())
        if dropped > 0:
            node["spool_dropped_samples"] = dropped
        q = self.spool.counter("quarantined_batches")
        if q:
            node["quarantined_batches"] = q
        payload = {"node": node, "gpus": self.gpus(), "samples": batch.samples}
        body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        r = self.post(self.url, self.token, body, self.timeout_s)
        st = self.stats
        st.statuses[r.status] = st.statuses.get(r.status, 0) + 1
        n = len(batch.samples)
        if 200 <= r.status < 300:
            self._log_rejects(r.body, n)
            self.spool.ack(batch, dropped_reported=max(dropped, 0))
            if dropped > 0:
                log.warning("reported %d samples dropped from the full spool", dropped)
            if self.failures:
                log.warning("server reachable again after %d failed attempts", self.failures)
            self.failures = 0
            self.next_attempt = now
            st.batches_sent += 1
            st.samples_sent += n
            return "sent"
        if r.status == 413 and n > 1:
            # the server's limit rarely changes: keep the smaller batches from now on
            self.batch_limit = max(1, n // 2)
            log.warning("server says batch of %d samples too large (413); halving", n)
            return "split"
        if r.status == 0 or r.status >= 500 or r.status in _RETRY or r.status in _OPERATOR:
            self.failures += 1
            st.failures += 1
            delay = self.backoff()
            if r.retry_after is not None:
                delay = max(delay, min(r.retry_after, self.max_backoff_s))
            self.next_attempt = now + delay
            pending = self.spool.pending()
            if r.status == 0:
                why = f"cannot reach {self.url} ({r.error})"
            elif r.status in (401, 403):
                why = f"server refused the token ({r.status}): check --token / GPUFLEET_TOKEN"
            elif r.status in (404, 405) or 300 <= r.status < 400:
                why = f"server answered {r.status} at {self.url}: check --server"
            else:
                why = f"server answered {r.status} {_snippet(r.body, 120)}".rstrip()
            log.warning("push failed: %s; %d samples spooled; retry in %.1f s", why, pending, delay)
            return "retry"
        # Any other 4xx: this batch is the problem. Keep it aside and carry on with the rest.
        reason = _snippet(r.body, 2000)
        self.spool.quarantine(batch, r.status, reason)
        st.batches_quarantined += 1
        self.next_attempt = now
        log.error(
            "server refused a batch of %d samples (%d): %s; quarantined in %s",
            n,
            r.status,
            _snippet(r.body),
            self.spool.path,
        )
        return "quarantined"

    def _log_rejects(self, body: bytes, n: int) -> None:
        try:
            answer = json.loads(body) if body else {}
        except ValueError:
            return
        rejected = answer.get("rejected") if isinstance(answer, dict) else None
        if isinstance(rejected, list) and rejected:
            self.stats.samples_rejected += len(rejected)
            shown = json.dumps(rejected[:3], separators=(",", ":"))[:500]
            log.warning("server rejected %d of %d samples: %s", len(rejected), n, shown)

    def drain(self, now: Callable[[], float], *, deadline: float | None = None) -> str:
        """Send until the spool is empty or a retry is needed (or ``deadline`` passes)."""
        while True:
            t = now()
            if deadline is not None and t >= deadline:
                return "deadline"
            out = self.step(t)
            if out in ("idle", "wait", "retry"):
                return out
