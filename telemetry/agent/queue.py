"""Queue pressure (DESIGN.md §9.2, docs/agent.md "Queue pressure"): every ``--queue-interval``
seconds, what the scheduler has pending that asks for GPUs, pushed to ``POST /api/v1/queue``.

    gpufleet-agent --queue slurm --cluster NAME [--squeue PATH | --slurmrestd URL --jwt-file F]
    gpufleet-agent --queue k8s --cluster NAME

The sources are queue_slurm.py (``squeue --json`` or slurmrestd) and queue_k8s.py (pending
pods). A snapshot is ``{"cluster", "at", "pending": [...]}``; it goes through the spool
(spool.py, its own file) like samples do, so a server that is away loses nothing: snapshots
wait, oldest first, and are retried with the sample path's backoff (client.py). A snapshot's
``(cluster, at)`` is its key: a resent one changes nothing on the server.

A poll that fails (squeue times out, slurmrestd or the API server refuses) gives no snapshot
at all, never an empty one: an empty ``pending`` says "nothing waits", a missing one says
"not known", which the server counts as nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from .client import (
    INGEST_PATH,
    Response,
    backoff_s,
    deliver_until,
    failure_reason,
    post_json,
)
from .clock import Clock, RealClock
from .queue_slurm import QueueError
from .spool import Spool

log = logging.getLogger("gpufleet.agent")

QUEUE_PATH = "/api/v1/queue"
KIND = "queue"
SPOOL_FILE = "queue-spool.sqlite3"
# DESIGN.md §9.2: a snapshot holds at most this many entries.
MAX_ENTRIES = 10_000
# Snapshots kept while the server is away: a day at the default 60 s; beyond it the oldest go
# (the server counts a gap as nothing, so old snapshots matter least).
DEFAULT_KEEP = 1440
STOP_BUDGET_S = 8.0

Source = Callable[[], list[dict[str, Any]]]


def queue_url(server: str) -> str:
    """``--server`` is the base URL (an ingest URL given in full is accepted too)."""
    s = server.rstrip("/")
    if s.endswith(INGEST_PATH):
        s = s[: -len(INGEST_PATH)]
    return s if s.endswith(QUEUE_PATH) else s + QUEUE_PATH


def iso(t: float) -> str:
    """A time as the wire writes times: whole seconds, UTC, ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.floor(t)))


def snapshot(cluster: str, at: float, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The payload. Beyond :data:`MAX_ENTRIES` the entries asking for the most GPUs are kept
    (then the longest waiting): what is left out costs the least waited GPU hours."""
    if len(entries) > MAX_ENTRIES:
        log.warning(
            "%d pending GPU jobs; sending the %d asking for the most GPUs",
            len(entries),
            MAX_ENTRIES,
        )
        order = sorted(
            range(len(entries)),
            key=lambda i: (-entries[i]["gpus"], entries[i]["submitted"] or "", i),
        )
        keep = set(order[:MAX_ENTRIES])
        entries = [e for i, e in enumerate(entries) if i in keep]
    return {"cluster": cluster, "at": iso(at), "pending": entries}


class QueueDelivery:
    """Sends the spool's oldest snapshot when due; the same shape as client.Delivery (an
    injected clock, POST function and random source), one snapshot per POST.

    What each answer does: 2xx, the snapshot is done (a duplicate is answered 2xx too); 400,
    413 and 422 say the snapshot itself is wrong, so no retry can help: it is logged with the
    answer, counted (``refused_queue`` in the spool) and dropped; everything else (no answer,
    5xx, 429, 408, 401/403/404/405, redirects) is retried with full-jitter backoff honouring
    ``Retry-After``, the snapshot staying at the head of the queue."""

    REFUSED = frozenset({400, 413, 422})

    def __init__(
        self,
        spool: Spool,
        *,
        url: str,
        token: str,
        post: Callable[[str, str, bytes, float], Response] = post_json,
        rng: random.Random | None = None,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 300.0,
        timeout_s: float = 30.0,
    ) -> None:
        self.spool = spool
        self.url = url
        self.token = token
        self.post = post
        self.rng = rng or random.Random()
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.next_attempt = 0.0
        self.failures = 0  # consecutive
        self.sent = 0
        self.statuses: dict[int, int] = {}

    def step(self, now: float, *, timeout_s: float | None = None) -> str:
        """Try the oldest snapshot if one is due: ``idle`` (none), ``wait`` (backing off),
        ``sent``, ``refused`` or ``retry``."""
        if now < self.next_attempt:
            return "wait"
        head = self.spool.payload_oldest(KIND)
        if head is None:
            return "idle"
        id_, payload = head
        timeout = self.timeout_s if timeout_s is None else max(0.1, min(self.timeout_s, timeout_s))
        body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        r = self.post(self.url, self.token, body, timeout)
        self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
        if 200 <= r.status < 300:
            self.spool.payload_settle(id_)
            if self.failures:
                log.warning("server reachable again after %d failed attempts", self.failures)
            self.failures = 0
            self.next_attempt = now
            self.sent += 1
            return "sent"
        if r.status in self.REFUSED:
            self.spool.payload_settle(id_, refused=True)
            log.error(
                "server refused the queue snapshot of %s (%s): %s; dropped",
                payload.get("at"),
                r.status,
                r.body.decode("utf-8", "replace")[:500],
            )
            self.next_attempt = now
            return "refused"
        self.failures += 1
        delay = backoff_s(self.rng, self.failures, self.base_backoff_s, self.max_backoff_s)
        if r.retry_after is not None:
            delay = max(delay, min(r.retry_after, self.max_backoff_s))
        self.next_attempt = now + delay
        why = failure_reason(r, self.url)
        if r.status == 403 and r.body:
            # the server also says 403 for a cluster another node pushes: show its words
            why = f"{why}: {r.body.decode('utf-8', 'replace')[:300]}"
        log.warning(
            "queue push failed: %s; %d snapshots spooled; retry in %.1f s",
            why,
            self.spool.payloads_pending(KIND),
            delay,
        )
        return "retry"

    def drain(self, now: Callable[[], float], *, within_s: float | None = None) -> str:
        """Send until nothing is left or a retry is needed; with ``within_s``, stop after that
        many real seconds."""
        until = None if within_s is None else time.monotonic() + within_s
        while True:
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                return "deadline"
            out = self.step(now(), timeout_s=left)
            if out in ("idle", "wait", "retry"):
                return out


class QueueAgent:
    """Polls the source on every whole multiple of ``interval_s`` (so ``at`` falls on the
    same grid at every agent), spools the snapshot and wakes the sender thread."""

    def __init__(
        self,
        source: Source,
        *,
        cluster: str,
        spool_dir: str | None,
        server: str | None = None,
        token: str | None = None,
        interval_s: int = 60,
        clock: Clock | None = None,
        post: Callable[[str, str, bytes, float], Response] = post_json,
        rng: random.Random | None = None,
        max_keep: int = DEFAULT_KEEP,
        max_backoff_s: float = 300.0,
    ) -> None:
        self.source = source
        self.cluster = cluster
        self.interval_s = interval_s
        self.clock: Clock = clock or RealClock()
        self.max_keep = max_keep
        self.spool: Spool | None = None
        self.delivery: QueueDelivery | None = None
        if spool_dir is not None:
            path = os.path.join(spool_dir, SPOOL_FILE)
            self.spool = Spool(path)
            if server:
                self.delivery = QueueDelivery(
                    Spool(path),
                    url=queue_url(server),
                    token=token or "",
                    post=post,
                    rng=rng,
                    max_backoff_s=max_backoff_s,
                )
        self._wake = threading.Event()
        self._stop_until = 0.0
        self.polls = 0
        self.failed_polls = 0

    def poll(self, at: float) -> dict[str, Any] | None:
        """Read the scheduler now and spool the snapshot stamped ``at``; ``None`` when the
        scheduler did not answer (logged; no snapshot)."""
        self.polls += 1
        try:
            entries = self.source()
        except QueueError as e:
            self.failed_polls += 1
            log.warning("no queue snapshot at %s: %s", iso(at), e)
            return None
        snap = snapshot(self.cluster, at, entries)
        if self.spool is not None:
            self.spool.payload_add(KIND, snap["at"], snap, max_keep=self.max_keep)
            self._wake.set()
        return snap

    def run(self, stop: threading.Event, *, max_polls: int | None = None) -> None:
        """Poll on the grid until ``stop``; deliver in a second thread meanwhile."""
        sender = None
        if self.delivery is not None:
            sender = threading.Thread(target=self._send_loop, args=(stop,), daemon=True)
            sender.start()
        clock = self.clock
        n = 0
        try:
            t = (math.floor(clock.time()) // self.interval_s + 1) * self.interval_s
            while not stop.is_set():
                now = clock.time()
                if now < t:
                    # in short steps, so a stop is noticed within a second
                    clock.sleep(min(1.0, t - now))
                    continue
                if now - t > self.interval_s:
                    t = (math.floor(now) // self.interval_s) * self.interval_s  # was suspended
                self.poll(t)
                t += self.interval_s
                n += 1
                if max_polls is not None and n >= max_polls:
                    break
        finally:
            self._stop_until = time.monotonic() + STOP_BUDGET_S
            stop.set()
            self._wake.set()
            if sender is not None:
                sender.join(timeout=max(0.0, self._stop_until - time.monotonic()) + 1.0)

    def _send_loop(self, stop: threading.Event) -> None:
        assert self.delivery is not None
        deliver_until(
            self.delivery,
            self.clock,
            stop=stop,
            wake=self._wake,
            again=("sent", "refused"),
            stop_until=lambda: self._stop_until,
            what="queue delivery",
        )

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()
        if self.delivery is not None:
            self.delivery.spool.close()


def source_for(
    queue: str,
    *,
    squeue: str = "squeue",
    slurmrestd: str | None = None,
    jwt_file: str | None = None,
) -> Source:
    """The source ``--queue`` names; ValueError for a combination that cannot work."""
    if queue == "k8s":
        from .queue_k8s import SERVICE_ACCOUNT_DIR, KubeSource

        return KubeSource(sa_dir=os.environ.get("GPUFLEET_K8S_SA_DIR") or SERVICE_ACCOUNT_DIR)
    if queue != "slurm":
        raise ValueError(f"--queue {queue!r}: slurm or k8s")
    from .queue_slurm import SlurmrestdSource, SqueueSource

    if slurmrestd:
        if not jwt_file:
            raise ValueError("--slurmrestd needs --jwt-file (the token slurmrestd accepts)")
        return SlurmrestdSource(slurmrestd, jwt_file)
    return SqueueSource(squeue)


def queue_main(args: Any) -> int:
    """``gpufleet-agent --queue …`` (cli.py parses; this runs)."""
    import signal
    import sys

    if not args.cluster:
        print("gpufleet-agent: --queue needs --cluster (or GPUFLEET_CLUSTER)", file=sys.stderr)
        return 2
    if args.queue_interval < 1:
        print("gpufleet-agent: --queue-interval must be at least 1 second", file=sys.stderr)
        return 2
    if args.print_ and not args.once:
        print("gpufleet-agent: --print needs --once", file=sys.stderr)
        return 2
    if not (args.once and args.print_) and not (args.server and args.token):
        print(
            "gpufleet-agent: --server and --token (or GPUFLEET_SERVER, GPUFLEET_TOKEN) are "
            "required unless --once --print",
            file=sys.stderr,
        )
        return 2
    try:
        source = source_for(
            args.queue, squeue=args.squeue, slurmrestd=args.slurmrestd, jwt_file=args.jwt_file
        )
    except ValueError as e:
        print(f"gpufleet-agent: {e}", file=sys.stderr)
        return 2
    printing = bool(args.once and args.print_)
    agent = QueueAgent(
        source,
        cluster=args.cluster,
        spool_dir=None if printing else args.spool,
        server=None if printing else args.server,
        token=args.token,
        interval_s=args.queue_interval,
    )
    try:
        if args.once:
            snap = agent.poll(time.time())
            if snap is None:
                return 1
            if printing:
                json.dump(snap, sys.stdout, indent=2)
                sys.stdout.write("\n")
                return 0
            assert agent.delivery is not None
            return 0 if agent.delivery.drain(time.time, within_s=60.0) == "idle" else 1
        stop = threading.Event()

        def _stop(signum: int, frame: Any) -> None:
            log.info("received signal %d; stopping", signum)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        log.info(
            "gpufleet-agent queue mode: %s, cluster %s, every %d s, spool %s, server %s",
            args.queue,
            args.cluster,
            args.queue_interval,
            args.spool,
            args.server,
        )
        agent.run(stop)
        return 0
    finally:
        agent.close()
