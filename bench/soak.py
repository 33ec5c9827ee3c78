"""Soak: a fleet of simulated GPUs pushing on a real stack, for a bounded time (issue 9).

    DATABASE_URL=postgres://… REDIS_URL=redis://… python bench/soak.py \\
        [--gpus 2000] [--interval 10] [--duration 60] [--write-docs]

What runs, all on 127.0.0.1: gunicorn (the real WSGI app, ``--workers`` processes), two Celery
workers on separate queues of their own (one takes rollups, the other rollups, reports and
alerts: both take rollups, so their runs meet the rollup's lock), PostgreSQL and Redis. This
script plays the fleet: ``--gpus`` GPUs in nodes of 8 (the fake fleet of telemetry/agent,
``pattern=mixed``), each node pushing one batch per ``--interval``
seconds of wall-clock time, from ``--senders`` threads over keep-alive connections, retrying
503/429/unreachable like the agent does. Every ``--rollup-every`` seconds it sends the periodic
rollup task twice, so that both workers run one at once.

It reports samples sent, stored (accepted), duplicates, rejected, requests by status, push
latency, and the rollup lag (age of the oldest hour waiting for a rollup) during the run and
after the last push. It then checks, and exits 1 unless, stored = sent (nothing lost, nothing
doubled, nothing rejected) and the rollup rows equal a clean recomputation from the raw rows.

The database: by default ``<DATABASE_URL's name>_soak``, dropped, created and migrated at the
start; ``--keep-db`` uses ``--database-url`` as it is (the test suite's smoke run does).
``--duration`` is capped at 600 s. ``--write-docs`` replaces the "## Soak" section of
docs/benchmarks-history.md (appending it if absent) with this run; docs/benchmarks.md keeps a
one-screen summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

DOCS = ROOT / "docs" / "benchmarks-history.md"
MAX_DURATION_S = 600
GPUS_PER_NODE = 8


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_db_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def database_reset(url: str) -> None:
    """Drop, create and migrate the soak database (never the one DATABASE_URL names)."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    admin = _with_db_name(url, "postgres").replace("postgres://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        check=True,
    )


class Stack:
    """gunicorn and a Celery worker as subprocesses; stopped by :meth:`stop`."""

    def __init__(self, *, database_url: str, redis_url: str, workers: int, log_dir: Path) -> None:
        self.port = _free_port()
        self.queue = f"soak-{uuidlib.uuid4().hex[:8]}"
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "LOG_LEVEL": "WARNING",
            # The soak drives 2,000 GPUs from one address; the per-node limit still applies.
            "INGEST_THROTTLE_RATE": "6000/min",
        }
        log_dir.mkdir(parents=True, exist_ok=True)
        self.web = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                str(workers),
                "--threads",
                "4",
                "--timeout",
                "60",
            ],
            cwd=ROOT,
            env=env,
            stdout=(log_dir / "gunicorn.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        from config.celery import QUEUES, worker_argv

        # Two Celery workers on separate queues, as docs/deploy.md sizes a larger site: one
        # for rollups alone, one for rollups, reports and alerts. Both take rollups, so their
        # runs overlap and the rollup's lock has to keep them apart. Queue names carry this
        # run's tag, so nothing else on the broker takes them.
        self.queues = {name: f"{self.queue}-{name}" for name in QUEUES}
        rollups = self.queues["rollups"]
        self.worker_logs = [log_dir / "worker-rollups.log", log_dir / "worker-all.log"]
        self.workers = [
            subprocess.Popen(
                worker_argv(queue=queues, name=f"{self.queue}-{i}@%h"),
                cwd=ROOT,
                env=env,
                stdout=log.open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for i, (queues, log) in enumerate(
                zip((rollups, ",".join(self.queues.values())), self.worker_logs, strict=True)
            )
        ]
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        web_ok = worker_ok = False
        while not (web_ok and worker_ok):
            if time.monotonic() > deadline:
                raise SystemExit("soak: gunicorn or the Celery worker did not start")
            if not web_ok:
                try:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                    c.request("GET", "/healthz")
                    web_ok = c.getresponse().status == 200
                    c.close()
                except OSError:
                    pass
            worker_ok = worker_ok or all(
                "ready." in log.read_text(errors="replace") for log in self.worker_logs
            )
            time.sleep(0.1)

    def rollups_send(self, sender: Any) -> None:
        """What Celery beat does each period, twice: both workers take one, at once."""
        for _ in range(2):
            sender.send_task("telemetry.tasks.rollup_task", queue=self.queues["rollups"])

    def rollups_done(self) -> dict[str, int]:
        """Rollup tasks each worker finished (from its log)."""
        done = "telemetry.tasks.rollup_task"
        return {
            log.stem: sum(1 for line in log.read_text(errors="replace").splitlines()
                          if done in line and "succeeded" in line)
            for log in self.worker_logs
        }  # fmt: skip

    def stop(self) -> None:
        for proc in (self.web, *self.workers):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in (self.web, *self.workers):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


class Sender(threading.Thread):
    """Posts the payloads from ``work`` on one keep-alive connection; retries like the agent."""

    def __init__(self, port: int, work: queue.Queue[Any], tally: Tally) -> None:
        super().__init__(daemon=True)
        self.port, self.work, self.tally = port, work, tally
        self.conn: http.client.HTTPConnection | None = None

    def _post(self, token: str, body: bytes) -> tuple[int, bytes]:
        for _ in range(2):  # one reconnect for a keep-alive connection the server closed
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self.conn.request(
                    "POST",
                    "/api/v1/ingest",
                    body,
                    {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
                )
                r = self.conn.getresponse()
                return r.status, r.read()
            except (OSError, http.client.HTTPException):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
        return 0, b""

    def run(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            token, body, n = item
            delay = 0.2
            for _attempt in range(30):  # ~2 minutes of retries, then count it unanswered
                began = time.perf_counter()
                status, data = self._post(token, body)
                self.tally.request(status, time.perf_counter() - began)
                if status == 200 or 400 <= status < 500 and status not in (408, 429):
                    break
                time.sleep(delay)  # 503, 429, unreachable: retry, backing off
                delay = min(delay * 2, 5.0)
            self.tally.answer(status, n, data)
            self.work.task_done()


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: Counter[int] = Counter()
        self.latencies: list[float] = []
        self.sent = self.accepted = self.duplicates = self.rejected = self.lost = 0

    def request(self, status: int, seconds: float) -> None:
        with self.lock:
            self.statuses[status] += 1
            self.latencies.append(seconds)

    def answer(self, status: int, n: int, data: bytes) -> None:
        with self.lock:
            self.sent += n
            if status == 200 or status == 400 and data.startswith(b'{"accepted"'):
                body = json.loads(data)
                self.accepted += body["accepted"]
                self.duplicates += body["duplicates"]
                self.rejected += len(body["rejected"])
            else:
                self.lost += n


def rollup_rows() -> dict[Any, tuple[Any, ...]]:
    from telemetry.models import HourlyUsage

    fields = [f.name for f in HourlyUsage._meta.fields if f.name not in ("id", "computed_at")]
    return {
        (r["gpu"], r["hour"]): tuple(
            round(r[f], 6) if isinstance(r[f], float) else r[f] for f in fields
        )
        for r in HourlyUsage.objects.values(*fields)
    }


def rollups_equal_clean_run() -> tuple[bool, int]:
    """Recompute every hour from the raw rows in a transaction that is rolled back; compare."""
    from django.db import transaction

    from telemetry.models import HourlyUsage, RollupPending, Sample
    from telemetry.pending import hours_mark
    from telemetry.rollup import rollup_run

    current = rollup_rows()
    with transaction.atomic():
        sid = transaction.savepoint()
        HourlyUsage.objects.all().delete()
        RollupPending.objects.all().delete()
        hours = {
            s.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
            for s in Sample.objects.values_list("start", flat=True).distinct()
        }
        hours_mark(hours)
        rollup_run()
        clean = rollup_rows()
        transaction.savepoint_rollback(sid)
    return current == clean, len(clean)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import django

    django.setup()
    from celery import Celery

    from fleet.services import node_token_issue
    from telemetry.agent.fake import FakeFleet, simulate
    from telemetry.models import RollupPending, Sample
    from telemetry.selectors import rollup_lag_seconds

    nodes = max(1, args.gpus // GPUS_PER_NODE)
    spec = f"nodes={nodes},gpus={GPUS_PER_NODE},model=H100,pattern=mixed,site=soak"
    fleet = FakeFleet(spec, seed=args.seed, epoch=time.time() - 3600)
    tokens = {host: node_token_issue(hostname=host)[1] for host in fleet.nodes}
    stack = Stack(
        database_url=args.database_url,
        redis_url=args.redis_url,
        workers=args.workers,
        log_dir=Path(args.log_dir),
    )
    sender = Celery("soak-sender", broker=args.redis_url)
    tally = Tally()
    work: queue.Queue[Any] = queue.Queue()
    threads = [Sender(stack.port, work, tally) for _ in range(args.senders)]
    for t in threads:
        t.start()
    lags: list[float] = []
    behind: list[float] = []
    interval = args.interval
    try:
        began = time.time()
        deadline = began + min(args.duration, MAX_DURATION_S)
        next_rollup = began + args.rollup_every
        # The first whole interval that starts after now.
        boundary = (int(began) // interval + 1) * interval
        intervals = 0
        while boundary + interval <= deadline:
            # Wait for the interval [boundary, boundary + interval) to close, then push it.
            close = boundary + interval
            while time.time() < close:
                time.sleep(
                    max(0.0, min(0.05, close - time.time()))
                )  # the clock moves between reads
                if time.time() >= next_rollup:
                    stack.rollups_send(sender)
                    next_rollup += args.rollup_every
                    lags.append(rollup_lag_seconds())
            for host, payload in simulate(
                fleet,
                start=dt.datetime.fromtimestamp(boundary, dt.UTC),
                end=dt.datetime.fromtimestamp(close, dt.UTC),
                interval_s=interval,
            ):
                work.put((tokens[host], json.dumps(payload).encode(), len(payload["samples"])))
            work.join()
            behind.append(time.time() - close)
            intervals += 1
            boundary = close
        pushed_at = time.time()
        # Catch up: the periodic task again until nothing is pending.
        stack.rollups_send(sender)
        catch_up_deadline = time.time() + 120
        while RollupPending.objects.exists() and time.time() < catch_up_deadline:
            time.sleep(0.2)
            if time.time() >= next_rollup:
                stack.rollups_send(sender)
                next_rollup = time.time() + 2
        caught_up_s = time.time() - pushed_at
        rollups_by_worker = stack.rollups_done()
    finally:
        for _ in threads:
            work.put(None)
        stack.stop()
        sender.close()
    stored = Sample.objects.count()
    equal, rows = rollups_equal_clean_run()
    lat = sorted(tally.latencies) or [0.0]
    return {
        "gpus": nodes * GPUS_PER_NODE,
        "nodes": nodes,
        "interval_s": interval,
        "duration_s": round(pushed_at - began, 1),
        "intervals": intervals,
        "requests": sum(tally.statuses.values()),
        "statuses": dict(sorted(tally.statuses.items())),
        "sent": tally.sent,
        "stored": stored,
        "accepted": tally.accepted,
        "duplicates": tally.duplicates,
        "rejected": tally.rejected,
        "unanswered": tally.lost,
        "samples_per_s": round(tally.sent / max(pushed_at - began, 1e-9), 1),
        "push_p50_ms": round(statistics.median(lat) * 1000, 1),
        "push_p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1),
        "interval_push_max_s": round(max(behind, default=0.0), 2),
        "rollup_lag_max_s": round(max(lags, default=0.0), 1),
        "rollup_caught_up_s": round(caught_up_s, 1),
        "rollup_rows": rows,
        "rollups_equal_clean_run": equal,
        "rollup_tasks_by_worker": rollups_by_worker,
        "ok": stored == tally.sent == tally.accepted and not tally.rejected and equal,
    }


def docs_write(result: dict[str, Any], args: argparse.Namespace) -> None:
    cpu = platform.processor() or platform.machine()
    lines = [
        "## Soak",
        "",
        f"`python bench/soak.py --gpus {args.gpus} --interval {args.interval} --duration "
        f"{args.duration}` on {os.cpu_count()} cores ({cpu}), PostgreSQL, Redis, gunicorn "
        f"({args.workers} workers × 4 threads) and two Celery workers (solo) on separate "
        "queues (one takes rollups, one rollups, reports and alerts), all on loopback; "
        f"{args.senders} sender threads play the fleet (nodes of 8 GPUs, one push per node per "
        "interval). Measured on " + dt.date.today().isoformat() + ".",
        "",
        "| | |",
        "|---|---|",
    ]
    labels = {
        "gpus": "GPUs (nodes)",
        "duration_s": "pushing for",
        "sent": "samples sent",
        "stored": "samples stored",
        "duplicates": "duplicates",
        "rejected": "rejected",
        "samples_per_s": "samples/s",
        "push_p50_ms": "push latency p50 / p99",
        "interval_push_max_s": "slowest interval fully pushed after it closed",
        "rollup_lag_max_s": "rollup lag during the run (max)",
        "rollup_caught_up_s": "rollups caught up after the last push",
        "rollups_equal_clean_run": "rollups equal a clean recomputation",
    }
    values = {
        **result,
        "gpus": f"{result['gpus']} ({result['nodes']})",
        "duration_s": (
            f"{result['duration_s']} s, {result['intervals']} intervals of {result['interval_s']} s"
        ),
        "push_p50_ms": f"{result['push_p50_ms']} ms / {result['push_p99_ms']} ms",
        "interval_push_max_s": f"{result['interval_push_max_s']} s",
        "rollup_lag_max_s": f"{result['rollup_lag_max_s']} s",
        "rollup_caught_up_s": f"{result['rollup_caught_up_s']} s",
        "rollups_equal_clean_run": "yes" if result["rollups_equal_clean_run"] else "**no**",
    }
    lines += [f"| {label} | {values[key]} |" for key, label in labels.items()]
    lines += [
        "",
        f"Requests by status: {result['statuses']}. Result: "
        + (
            "stored = sent, nothing rejected, rollups equal a clean run."
            if result["ok"]
            else "**FAILED** (see the numbers above)."
        ),
        "",
    ]
    section = "\n".join(lines)
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    at = text.find("\n## Soak")
    if at >= 0:
        rest = text.find("\n## ", at + 1)
        text = text[:at] + "\n" + section + (text[rest:] if rest >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOCS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=2000)
    p.add_argument("--interval", type=int, default=10, help="seconds; must divide 3600")
    p.add_argument(
        "--duration", type=float, default=60.0, help=f"seconds (capped at {MAX_DURATION_S})"
    )
    p.add_argument("--senders", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    p.add_argument("--rollup-every", type=float, default=10.0, help="seconds between rollup tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--database-url", default=None)
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", ""))
    p.add_argument("--keep-db", action="store_true", help="use --database-url as it is")
    p.add_argument("--log-dir", default=str(ROOT / "var" / "soak"))
    p.add_argument("--write-docs", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = p.parse_args(argv)
    if 3600 % args.interval:
        p.error("--interval must divide 3600")
    base = os.environ.get("DATABASE_URL", "")
    if not args.database_url:
        if not base.startswith("postgres"):
            p.error("needs DATABASE_URL (PostgreSQL) or --database-url")
        name = urlsplit(base).path.lstrip("/") or "gpufleet"
        args.database_url = _with_db_name(base, f"{name}_soak")
    if not args.redis_url:
        p.error("needs REDIS_URL or --redis-url")
    if not args.keep_db:
        database_reset(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["REDIS_URL"] = args.redis_url
    result = run(args)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        for key, value in result.items():
            print(f"{key:>26}: {value}")
    if args.write_docs:
        docs_write(result, args)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
