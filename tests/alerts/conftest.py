"""Fixtures for the alert tests: the billing tests' fleet builder (rollups written by hand),
real HTTP receivers on 127.0.0.1, the weekly report's real SMTP server, and Celery run
in-process."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.billing.conftest import EXAMPLE_NOW, FleetBuilder, at, worked_example  # noqa: F401

SECRET = "test-webhook-secret"


@pytest.fixture
def fleet(db: Any) -> FleetBuilder:
    return FleetBuilder()


@pytest.fixture
def eager(settings: Any) -> Iterator[None]:
    """Celery tasks run in this process (the embedded default), whatever REDIS_URL says."""
    from config.celery import app

    before = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    settings.ALERT_WEBHOOK_SECRET = SECRET
    settings.SITE_URL = "https://gpufleet.example.com"
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = before


@pytest.fixture
def broker() -> Iterator[None]:
    """Celery as in production: tasks go to a broker (the tests stub the dispatch)."""
    from config.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = False
    yield
    app.conf.task_always_eager = before


def rules_apply(*tables: dict[str, Any]) -> Any:
    """Apply these ``[[alerts]]`` as fleet_apply does (the section alone: a whole document
    would also make the cost profiles exactly its own, i.e. none)."""
    from django.db import transaction

    from alerts.fleetfile import alerts_section_apply
    from fleet.services import ApplyResult

    result = ApplyResult()
    with transaction.atomic():
        alerts_section_apply(document={"alerts": list(tables)}, result=result)
    return result


def open_alert(rule: Any, subject: str = "gpu:GPU-a", **values: Any) -> Any:
    """An open alert of ``rule`` written directly (as an earlier evaluation would have)."""
    from django.utils import timezone

    from alerts.models import Alert

    now = values.pop("now", timezone.now())
    return Alert.objects.create(
        rule=rule,
        subject=subject,
        threshold=rule.threshold,
        firing_since=now,
        last_notified_at=now,
        evaluated_at=now,
        **values,
    )


def seed_alerts() -> dict[str, Any]:
    """What evaluations would have left: a firing GPU alert told by email and by a webhook
    that failed, a firing budget alert (money, in EUR), and a resolved one."""
    import datetime as dt
    from decimal import Decimal

    from django.utils import timezone

    from alerts.models import Delivery, Rule
    from fleet.models import FleetSettings, Pool

    Pool.objects.create(name="training")
    rules_apply(
        {
            "name": "held-idle",
            "rule": "gpu_held_hours",
            "scope": "pool:training",
            "threshold": 4,
            "notify": ["mailto:ops@example.com", "https://hooks.slack.example/T000/B000/s3cr3t"],
        },
        {"name": "budget", "rule": "budget_month", "threshold": "1000.00"},
    )
    FleetSettings.objects.update_or_create(pk=1, defaults={"currency": "EUR"})
    held, budget = Rule.objects.get(name="held-idle"), Rule.objects.get(name="budget")
    now = timezone.now()
    firing = open_alert(
        held,
        "gpu:GPU-a",
        subject_label="gpu-07#0",
        value=Decimal("6.25"),
        peak_value=Decimal("7"),
        window_start=now - dt.timedelta(hours=24),
        window_end=now,
        now=now - dt.timedelta(hours=3),
    )
    for target, status in (
        ("mailto:ops@example.com", "sent"),
        ("https://hooks.slack.example/T000/B000/s3cr3t", "failed"),
    ):
        Delivery.objects.create(
            alert=firing,
            event="firing",
            sequence=1,
            channel="email" if target.startswith("mailto:") else "webhook",
            target=target,
            value=firing.value,
            threshold=firing.threshold,
            created_at=now,
            next_attempt_at=now,
            status=status,
            attempts=1,
        )
    money = open_alert(budget, "fleet", subject_label="Fleet", value=Decimal("1234.567"))
    old = open_alert(
        held,
        "gpu:GPU-b",
        subject_label="gpu-07#1",
        value=Decimal("3"),
        now=now - dt.timedelta(days=2),
    )
    old.resolved_at = now - dt.timedelta(days=1)
    old.save()
    return {"firing": firing, "money": money, "old": old}


# --- HTTP receivers --------------------------------------------------------------------------
@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at_s: float = field(default_factory=time.time)  # when it arrived (the tests' clock)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def signature_ok(self) -> bool:
        """As docs/alerts.md's verifier: ``t=<unix>,v1=<hex>`` over ``<t>.<body>``, at most
        five minutes old when it arrived."""
        header = self.headers.get("X-Gpufleet-Signature", "")
        return signature_verified(self.body, header, now_s=self.at_s)


def signature_verified(
    body: bytes, header: str, secret: str = SECRET, now_s: float | None = None
) -> bool:
    """The ten lines of docs/alerts.md, as a receiver would write them."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    t, v1 = fields.get("t", ""), fields.get("v1", "")
    if not t.isdigit() or abs((time.time() if now_s is None else now_s) - int(t)) > 300:
        return False
    want = hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, v1)


@dataclass
class Receiver:
    """A webhook receiver on 127.0.0.1: ``ok`` answers 200, ``error`` 500, ``verify`` checks
    the signature (200, or 401 when it is wrong), ``hang`` keeps the request until
    ``release`` is set, ``redirect`` answers 302 to ``location``."""

    behaviour: str
    location: str = ""
    received: list[Received] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    server: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/gpufleet?token=abc"


def _handler(receiver: Receiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            got = Received(dict(self.headers.items()), self.rfile.read(length))
            receiver.received.append(got)
            receiver.arrived.set()
            status = 200
            if receiver.behaviour == "error":
                status = 500
            elif receiver.behaviour == "verify" and not got.signature_ok:
                status = 401
            elif receiver.behaviour == "hang":
                receiver.release.wait(30)
            elif receiver.behaviour == "redirect":
                self.send_response(302)
                self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            payload = b'{"ok": true}'
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:  # the sender gave up on a hanging answer
                pass

    return Handler


@pytest.fixture
def receiver(settings: Any) -> Iterator[Callable[..., Receiver]]:
    """``receiver("ok")`` → a started receiver on 127.0.0.1 (stopped afterwards). A loopback
    target needs ALERT_WEBHOOK_ALLOW_PRIVATE, so these tests set it."""
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = True
    made: list[Receiver] = []

    def make(behaviour: str, location: str = "") -> Receiver:
        r = Receiver(behaviour, location)
        r.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(r))
        r.server.daemon_threads = True
        threading.Thread(target=r.server.serve_forever, daemon=True).start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.release.set()
        r.server.shutdown()
        r.server.server_close()


# --- SMTP: the weekly report's real server on 127.0.0.1 (aiosmtpd) ---------------------------
from tests.billing.test_report import Sink, smtp  # noqa: E402, F401

__all__ = ["EXAMPLE_NOW", "Sink", "at", "open_alert"]


# --- workloads -------------------------------------------------------------------------------
# On the worked example's GPU (pool inference, team research): Slurm job 48213 of alice held
# it in hours 10–14 of 2 March (its process on it, nothing computing: 5 × 3,600 GPU seconds,
# 0 air seconds) and computed in hours 00–01 (2 × 3,600 GPU s, 2 × 3,240 air s) → 7 GPU hours,
# 1.8 air hours, 5.2 held hours. Job 48214 of bob held it half and half with nobody in hours
# 12–13: 2 × 1,800 GPU seconds, none in the air → 1 GPU hour, all of it held.


def workload(kind: str, key: str, user: str, name: str = "", site: Any = None) -> Any:
    from django.utils import timezone

    from telemetry.models import Workload

    return Workload.objects.create(
        kind=kind, key=key, user_name=user, name=name, site=site, created_at=timezone.now()
    )


def held(workload: Any, gpu: Any, hour: dt.datetime, gpu_s: float, air_s: float) -> Any:
    from django.utils import timezone

    from telemetry.models import WorkloadHourlyUsage

    node = gpu.node
    pool = node.pool
    return WorkloadHourlyUsage(
        workload=workload,
        gpu=gpu,
        hour=hour,
        samples=60,
        gpu_s=gpu_s,
        air_s=air_s,
        energy_j=0.0,
        node=node,
        pool=pool,
        team=pool.team,
        site=pool.site,
        computed_at=timezone.now(),
    )


@pytest.fixture
def jobs(worked_example: Any) -> dict[str, Any]:  # noqa: F811 - the fixture above
    from fleet.models import Gpu
    from telemetry.models import WorkloadHourlyUsage

    gpu = Gpu.objects.get(uuid="GPU-example")
    alice = workload("slurm", "48213", "alice", "train-llm")
    bob = workload("slurm", "48214", "bob")
    rows = [held(alice, gpu, at(f"2026-03-02T{h:02d}"), 3600, 3240) for h in (0, 1)]
    rows += [held(alice, gpu, at(f"2026-03-02T{h:02d}"), 3600, 0) for h in range(10, 15)]
    rows += [held(bob, gpu, at(f"2026-03-02T{h:02d}"), 1800, 0) for h in (12, 13)]
    WorkloadHourlyUsage.objects.bulk_create(rows)
    return {"alice": alice, "bob": bob, "gpu": gpu}
