"""``python manage.py demo``: the embedded-default demo, in one command.

Migrates, applies the demo fleet file (billing/demo/fleet.toml), generates ``--days`` of
history for about ``--gpus`` GPUs from the fake fleet through the real ingest service
(``sample_batch_ingest``, in batches of many samples), rolls it up, then serves the dashboard
on localhost with a threaded WSGI server while simulated agents keep POSTing live samples to
its ``/api/v1/ingest`` with node tokens, and Celery beat's schedule runs in-process
(config/scheduler.py: rollups, alert rules, the weekly report, digests). Prints the URL and a
login on its last lines. ``--no-serve`` stops after the rollup (the tests use it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import math
import os
import sys
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils import timezone

from billing.formatting import count
from config.site_url import served_url_clear, served_url_write

DEMO_DIR = Path(__file__).resolve().parent.parent.parent / "demo"
FLEET_FILE = DEMO_DIR / "fleet.toml"
SPEC_FILE = DEMO_DIR / "fleet_spec.json"
PLOTLY_FINDER = "billing.staticfiles.PlotlyJsFinder"
DEMO_USERS = (("demo", "admin"), ("finance", "finance"), ("viewer", "viewer"))
# Each demo user's address: what Subscribe and the weekly report send to (the console backend
# prints it when EMAIL_HOST is unset).
DEMO_EMAIL_DOMAIN = "example.com"
BASE_GPUS_PER_NODE = 8
# The Slurm queue's history (billing/demo/queue.py): the last two weeks of the history.
QUEUE_DAYS = dt.timedelta(days=14)

log = logging.getLogger("gpufleet.demo")


def demo_spec(gpus: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The fake-fleet spec groups for about ``gpus`` GPUs, and the pool of each group.

    The base layout has 64 GPUs on 8 nodes; other sizes keep every group (so every site,
    pool, model and fault is there) and scale its nodes, or its GPUs per node below 64.
    """
    document = json.loads(SPEC_FILE.read_text())
    base = document["groups"]
    base_gpus = sum(int(g["nodes"]) * BASE_GPUS_PER_NODE for g in base)
    small = gpus < base_gpus
    # Small fleets: one node per group, fewer GPUs per node; large ones: more nodes of 8.
    per_node = (
        max(1, min(BASE_GPUS_PER_NODE, round(gpus / len(base)))) if small else (BASE_GPUS_PER_NODE)
    )
    groups, pools = [], []
    for group in base:
        spec = {k: v for k, v in group.items() if k != "pool"}
        if "workloads" in document:  # the file's default: every GPU says who holds it
            spec.setdefault("workloads", document["workloads"])
        spec["nodes"] = 1 if small else max(1, round(int(group["nodes"]) * gpus / base_gpus))
        spec["gpus"] = per_node
        if per_node < BASE_GPUS_PER_NODE and "falls_off_bus" in spec:
            spec["falls_off_bus"] = f"0.0@{str(spec['falls_off_bus']).split('@', 1)[1]}"
        groups.append(spec)
        pools.append(str(group["pool"]))
    return groups, pools


class Command(BaseCommand):
    help = (
        "The demo on the embedded default: migrate, apply an example fleet, generate history "
        "through the real ingest path, roll up, then serve the dashboard with simulated agents "
        "streaming live data. Prints the URL and a login on its last lines."
    )
    # --fresh deletes the database file before anything touches it.
    requires_system_checks: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop = threading.Event()  # set: stop serving (what Ctrl-C does; the tests use it)
        self.beat: Any = None  # the in-process beat (config.scheduler) while serving

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--fresh",
            action="store_true",
            help="Delete the embedded SQLite database first and start over.",
        )
        parser.add_argument(
            "--no-serve",
            action="store_true",
            help="Only generate the data and roll it up; do not serve.",
        )
        parser.add_argument("--gpus", type=int, default=64, help="About this many GPUs (64).")
        parser.add_argument("--days", type=float, default=30, help="Days of history (30).")
        parser.add_argument("--host", default="127.0.0.1", help="Address to serve on.")
        parser.add_argument(
            "--port", type=int, default=8000, help="Port to serve on (the next free one if taken)."
        )
        parser.add_argument(
            "--history-interval",
            type=int,
            default=900,
            help="Seconds per sample in the generated history (900).",
        )
        parser.add_argument(
            "--live-interval",
            type=int,
            default=60,
            help="Seconds per sample of the live agents (60).",
        )
        parser.add_argument("--seed", type=int, default=7, help="Seed of the fake fleet.")

    # --- steps ------------------------------------------------------------------------------
    def handle(self, *args: Any, **opts: Any) -> None:
        started = time.monotonic()
        if opts["gpus"] < 1 or opts["days"] <= 0:
            raise CommandError("--gpus and --days must be positive")
        if opts["days"] > settings.RAW_RETENTION_DAYS - 1:
            raise CommandError(
                f"--days must stay inside the raw retention ({settings.RAW_RETENTION_DAYS} days)"
            )
        for interval in (opts["history_interval"], opts["live_interval"]):
            if interval < 1 or 3600 % interval:
                raise CommandError("intervals must divide 3600 seconds (60, 300, 900, 3600…)")
        if opts["fresh"]:
            self._fresh()
        self._say("migrating the database…")
        call_command("migrate", interactive=False, verbosity=0)

        from telemetry.agent.fake import FakeFleet

        groups, pools = demo_spec(opts["gpus"])
        now = timezone.now()
        history_end = _floor(now, opts["history_interval"])
        history_start = history_end - dt.timedelta(days=opts["days"])
        # Relative fault times (+3d, +10d) count from the start of the history.
        fleet = FakeFleet(groups, seed=opts["seed"], epoch=history_start)
        hosts_pools = self._hosts_pools(fleet, groups, pools)
        self._apply_fleet(hosts_pools)
        self._users()
        tokens = self._tokens(fleet.nodes)
        gpu_count = sum(len(fleet.node(h).gpus) for h in fleet.nodes)
        resume = self._resume_from(history_start, opts["history_interval"])
        if resume >= history_end:
            self._say("history already generated; catching up is left to the live agents")
        else:
            self._history(fleet, resume, history_end, opts["history_interval"], gpu_count)
        self._queue(
            max(history_start, history_end - QUEUE_DAYS), history_end, collector=fleet.nodes[0]
        )
        self._rollup()
        elapsed = time.monotonic() - started
        if opts["no_serve"]:
            self._say(
                f"demo data ready in {elapsed:.0f} s: {count(gpu_count, 'GPU')} on "
                f"{count(len(fleet.nodes), 'node')}"
            )
            self._logins()
            return
        self._serve(fleet, tokens, history_end, opts, started)

    def _say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def _fresh(self) -> None:
        db = settings.DATABASES["default"]
        if db["ENGINE"] != "django.db.backends.sqlite3":
            raise CommandError("--fresh deletes the embedded SQLite file; DATABASE_URL is set")
        connections.close_all()
        path = Path(str(db["NAME"]))
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        self._say(f"deleted {path}")

    def _hosts_pools(
        self, fleet: Any, groups: list[dict[str, Any]], pools: list[str]
    ) -> dict[str, str]:
        # FakeFleet names nodes in group order (gpu-<site>-<nn>): walk the groups the same way.
        hosts = iter(fleet.nodes)
        return {
            next(hosts): pool
            for group, pool in zip(groups, pools, strict=True)
            for _ in range(int(group["nodes"]))
        }

    def _apply_fleet(self, hosts_pools: dict[str, str]) -> None:
        from billing.services import fleet_document_apply
        from fleet.services import FleetFileError

        document = tomllib.loads(FLEET_FILE.read_text())
        # The file lists the nodes of the default 64-GPU layout; other sizes have other
        # nodes, so the pools of the fake fleet's own hostnames are what gets applied.
        document["nodes"] = [{"hostname": h, "pool": p} for h, p in hosts_pools.items()]
        try:
            result = fleet_document_apply(document=document)
        except FleetFileError as exc:
            raise CommandError(f"{FLEET_FILE}: {exc}") from exc
        self._say(f"applied {FLEET_FILE.name}: {result.summary()}")

    def _users(self) -> None:
        from django.contrib.auth import get_user_model

        from fleet.roles import role_assign

        for username, role in DEMO_USERS:
            user, _ = get_user_model().objects.get_or_create(username=username)
            # Demo-only passwords (the username): this database is a local toy.
            user.set_password(username)
            user.email = f"{username}@{DEMO_EMAIL_DOMAIN}"
            user.save()
            role_assign(user=user, role=role)

    def _tokens(self, hostnames: list[str]) -> dict[str, tuple[Any, str]]:
        from fleet.services import node_token_issue

        return {h: node_token_issue(hostname=h) for h in hostnames}

    def _resume_from(self, history_start: dt.datetime, interval_s: int) -> dt.datetime:
        """Where the history still has to be generated: after the newest stored sample."""
        from django.db.models import Max

        from telemetry.models import Sample

        newest = Sample.objects.aggregate(newest=Max("start"))["newest"]
        if newest is None or newest < history_start:
            return history_start
        return _ceil(newest + dt.timedelta(seconds=1), interval_s)

    def _history(
        self, fleet: Any, start: dt.datetime, end: dt.datetime, interval_s: int, gpu_count: int
    ) -> None:
        from tqdm import tqdm

        from fleet.models import Node
        from telemetry.agent.fake import simulate
        from telemetry.ingest import IngestError, sample_batch_ingest

        nodes = dict(Node.objects.filter(hostname__in=fleet.nodes).values_list("hostname", "pk"))
        # A day of samples per push: 8 GPUs × 96 is far below INGEST_MAX_SAMPLES.
        per_push = max(
            1, min(86400 // interval_s, settings.INGEST_MAX_SAMPLES // BASE_GPUS_PER_NODE)
        )
        intervals = int((end - start).total_seconds()) // interval_s
        possible = intervals * gpu_count
        self._say(
            f"generating {(end - start).total_seconds() / 86400:.1f} days of history for "
            f"{count(gpu_count, 'GPU')} ({possible:,} samples of {interval_s} s at most) "
            "through the ingest service…"
        )
        accepted = rejected = 0
        sent: Counter[str] = Counter()
        with (
            tqdm(
                total=possible,
                unit="sample",
                unit_scale=True,
                desc="history",
                file=sys.stderr,
                mininterval=0.5,
            ) as bar,
            _logs_above(sys.stderr),
        ):
            for hostname, payload in simulate(
                fleet, start=start, end=end, interval_s=interval_s, batch_intervals=per_push
            ):
                body = json.dumps(payload).encode()
                try:
                    result = sample_batch_ingest(
                        node_id=nodes[hostname], payload_bytes=body, now=timezone.now()
                    )
                except IngestError as exc:
                    raise CommandError(f"ingest refused a push of {hostname}: {exc}") from exc
                accepted += result.accepted
                rejected += len(result.rejected)
                samples = payload["samples"]
                sent.update(s["gpu"] for s in samples)
                # The bar counts GPU-intervals simulated, so a GPU that sends nothing (it is
                # offline) does not leave it short of 100 %.
                bar.update(len({s["start"] for s in samples}) * len(fleet.node(hostname).gpus))
            bar.update(bar.total - bar.n)  # a node wholly silent for a push sends nothing
        offline = _unsent(fleet, sent, intervals=intervals, interval_s=interval_s)
        missing = possible - sum(sent.values())
        if not offline:
            self._say(f"ingested {accepted:,} samples ({rejected} rejected)")
            return
        self._say(
            f"ingested {accepted:,} of {possible:,} possible samples ({rejected} rejected); "
            f"the {missing:,} missing were never sent, by GPUs that went offline:"
        )
        for line in offline:
            self._say(f"  {line}")

    def _queue(self, start: dt.datetime, end: dt.datetime, *, collector: str) -> None:
        """The Slurm queue's history (billing/demo/queue.py) through the queue service, as if
        ``collector`` ran ``gpufleet-agent --queue slurm``; resumed after the last snapshot."""
        from tqdm import tqdm

        from billing.demo.queue import CLUSTER, queue_snapshots, snapshots_per_day
        from fleet.models import Node
        from telemetry.models import QueueCluster
        from telemetry.queue import queue_snapshot_apply

        last = QueueCluster.objects.filter(name=CLUSTER).values_list("last_at", flat=True).first()
        if last is not None:
            start = max(start, last + dt.timedelta(seconds=1))
        days = (end - start).total_seconds() / 86400
        if days <= 0:
            return
        node_id = Node.objects.get(hostname=collector).pk
        self._say(
            f"generating {days:.1f} days of Slurm queue on cluster {CLUSTER} (pushed by "
            f"{collector}) through the queue service…"
        )
        with (
            tqdm(
                total=round(days * snapshots_per_day()),
                unit="snapshot",
                desc="queue",
                file=sys.stderr,
                mininterval=0.5,
            ) as bar,
            _logs_above(sys.stderr),
        ):
            for snapshot in queue_snapshots(start, end):
                queue_snapshot_apply(node_id=node_id, snapshot=snapshot, now=snapshot.at)
                bar.update(1)
            bar.update(max(0, bar.total - bar.n))

    def _rollup(self) -> None:
        from tqdm import tqdm

        from telemetry.models import RollupPending
        from telemetry.rollup import rollup_run

        total = RollupPending.objects.count()
        if not total:  # nothing marked: no bar stuck at "0h"
            self._say(f"rolled up: {rollup_run(wait=True)}")
            return
        with (
            tqdm(total=total, unit="h", desc="rollup", file=sys.stderr) as bar,
            _logs_above(sys.stderr),
        ):
            result = rollup_run(wait=True, on_batch=bar.update)
        self._say(f"rolled up: {result}")

    def _logins(self) -> None:
        others = ", ".join(f"{u}/{u} ({r})" for u, r in DEMO_USERS[1:])
        self._say(f"Login: demo / demo (admin; demo-only passwords; also {others})")

    def _periodic(self) -> str:
        """Celery beat's schedule in this process (config/scheduler.py), with a first look at
        the alert rules now rather than in five minutes; what the demo says of it."""
        from config import scheduler

        beat = self.beat = scheduler.start()
        if beat is None:
            return "periodic tasks: left to celery beat and a worker (a broker is set)"
        try:
            # By its command: billing sits below alerts and imports nothing of it.
            out = io.StringIO()
            call_command("alerts_evaluate", stdout=out)
            self._say(f"alert rules: {out.getvalue().strip().splitlines()[-1]}")
        except Exception:  # the demo serves on; the schedule evaluates again in five minutes
            log.exception("demo: evaluating the alert rules failed")
        return f"periodic tasks run in-process ({', '.join(beat.entries)})"

    # --- serving ----------------------------------------------------------------------------
    def _serve(
        self,
        fleet: Any,
        tokens: dict[str, tuple[Any, str]],
        live_from: dt.datetime,
        opts: dict[str, Any],
        started: float,
    ) -> None:
        from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

        from config.wsgi import application as _unused  # noqa: F401  (settings loaded)

        if PLOTLY_FINDER not in getattr(settings, "STATICFILES_FINDERS", ()):
            # Until config/settings lists the finder: whitenoise reads the finders once, when
            # the WSGI application is built just below.
            settings.STATICFILES_FINDERS = [
                "django.contrib.staticfiles.finders.FileSystemFinder",
                "django.contrib.staticfiles.finders.AppDirectoriesFinder",
                PLOTLY_FINDER,
            ]
        from django.core.handlers.wsgi import WSGIHandler

        Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)  # whitenoise warns
        application = WSGIHandler()
        quiet: dict[str, int] = {}
        if opts["verbosity"] < 2:
            # Agents push every minute and rollups run every minute (a line from the
            # schedule and one from Celery's trace each); a line for each would bury the
            # URL. Put back when serving ends (the command may run in a process that goes
            # on, a test's).
            for name in (
                "gpufleet.access",
                "django.server",
                "telemetry.rollup",
                "config.scheduler",
                "celery.app.trace",
            ):
                quiet[name] = logging.getLogger(name).level
                logging.getLogger(name).setLevel(logging.WARNING)
        server = None
        port = opts["port"]
        for candidate in range(port, port + 20):
            try:
                server = ThreadedWSGIServer(
                    (opts["host"], candidate), WSGIRequestHandler, ipv6=":" in opts["host"]
                )
                port = candidate
                break
            except OSError:
                continue
        if server is None:
            raise CommandError(f"no free port in {port}–{port + 19} on {opts['host']}")
        server.set_app(application)
        server.daemon_threads = True
        host = "localhost" if opts["host"] in ("127.0.0.1", "::1", "localhost") else opts["host"]
        url = f"http://{host}:{port}/"
        if "SITE_URL" not in os.environ:
            # Links in emails and the report preview point at this server, not at the
            # default port 8000 (SITE_URL set in the environment wins: a proxy in front);
            # the file tells commands run in another shell beside the demo.
            settings.SITE_URL = url.rstrip("/")
            served_url_write(Path(settings.VAR_DIR), url)
        stop = self.stop
        threads = [
            threading.Thread(
                target=_live_agents,
                name="demo-agents",
                daemon=True,
                args=(
                    fleet,
                    tokens,
                    f"http://127.0.0.1:{port}",
                    live_from,
                    opts["live_interval"],
                    stop,
                ),
            ),
        ]
        serving = threading.Thread(target=server.serve_forever, name="demo-http", daemon=True)
        serving.start()
        for thread in threads:
            thread.start()
        periodic = self._periodic()
        self._say(
            f"serving in {time.monotonic() - started:.0f} s; simulated agents push every "
            f"{opts['live_interval']} s; {periodic}; Ctrl-C stops"
        )
        self._say(f"Dashboard: {url}")
        self._logins()
        try:
            while serving.is_alive() and not stop.wait(timeout=1):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
            server.shutdown()
            server.server_close()
            if self.beat is not None:  # the process may go on (a test's): no work left behind
                self.beat.stop.set()
            served_url_clear(Path(settings.VAR_DIR), url)
            for name, level in quiet.items():
                logging.getLogger(name).setLevel(level)


def _unsent(fleet: Any, sent: Counter[str], *, intervals: int, interval_s: int) -> list[str]:
    """Why fewer samples were ingested than the history could hold: a line for each GPU that
    sent fewer than one per interval (in the fake fleet, one that fell off the bus: it sends
    nothing from then on, and the dashboard counts those hours as offline)."""
    lines = []
    for hostname in fleet.nodes:
        for gpu in fleet.node(hostname).gpus:
            short = intervals - sent[gpu.uuid]
            if short <= 0:
                continue
            why = "sent no sample"
            if gpu.lost_at is not None:
                at = dt.datetime.fromtimestamp(gpu.lost_at, tz=dt.UTC)
                why = f"fell off the bus at {at:%Y-%m-%d %H:%M} UTC (a simulated fault)"
            lines.append(
                f"{hostname}#{gpu.index} {why}: {short:,} samples, "
                f"{short * interval_s / 3600:,.1f} h offline (paid for, no data)"
            )
    return lines


class _AboveTheBar(logging.Handler):
    """Stands in for a console log handler while a progress bar draws: each record is written
    through tqdm, on its own line above the bar, with the handler's own format and filters."""

    def __init__(self, console: logging.Handler, file: TextIO) -> None:
        super().__init__(console.level)
        self.setFormatter(console.formatter)
        self.filters = list(console.filters)
        self.file = file

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.file)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _logs_above(file: TextIO) -> Iterator[None]:
    """No log line inside a progress bar: the root logger's console handlers write through
    tqdm while a bar draws on ``file``. The rollup's own result line is left out: the demo
    says it."""
    root = logging.getLogger()
    # The console handlers of settings.LOGGING: plain StreamHandlers (file handlers and test
    # capture handlers are subclasses and stay).
    consoles = [h for h in root.handlers if type(h) is logging.StreamHandler]
    stand_ins = [_AboveTheBar(h, file) for h in consoles]
    rollup_log = logging.getLogger("telemetry.rollup")
    level = rollup_log.level
    for console, stand_in in zip(consoles, stand_ins, strict=True):
        root.removeHandler(console)
        root.addHandler(stand_in)
    rollup_log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        rollup_log.setLevel(level)
        for console, stand_in in zip(consoles, stand_ins, strict=True):
            root.removeHandler(stand_in)
            root.addHandler(console)


def _floor(moment: dt.datetime, interval_s: int) -> dt.datetime:
    seconds = int(moment.timestamp()) // interval_s * interval_s
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def _ceil(moment: dt.datetime, interval_s: int) -> dt.datetime:
    seconds = math.ceil(moment.timestamp() / interval_s) * interval_s
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def _live_agents(
    fleet: Any,
    tokens: dict[str, tuple[Any, str]],
    server: str,
    since: dt.datetime,
    interval_s: int,
    stop: threading.Event,
) -> None:
    """The simulated agents: at every interval boundary, each node POSTs the intervals it has
    finished since its last push to the served /api/v1/ingest with its node token, as the
    real agent does (same client code, same wire format)."""
    from telemetry.agent.client import ingest_url, post_json
    from telemetry.agent.fake import simulate

    url = ingest_url(server)
    sent_until = since
    while not stop.is_set():
        until = _floor(timezone.now(), interval_s)
        if until > sent_until:
            for hostname, payload in simulate(
                fleet,
                start=sent_until,
                end=until,
                interval_s=interval_s,
                batch_intervals=10_000 // BASE_GPUS_PER_NODE,
            ):
                response = post_json(
                    url, tokens[hostname][1], json.dumps(payload).encode(), timeout=30
                )
                if response.status != 200:
                    log.warning(
                        "demo agent %s: HTTP %s %s",
                        hostname,
                        response.status,
                        response.error or response.body[:200],
                    )
            sent_until = until
        # Wake just after the next boundary, when every node has a new interval to send.
        wait = interval_s - (time.time() % interval_s) + 1
        stop.wait(wait)
