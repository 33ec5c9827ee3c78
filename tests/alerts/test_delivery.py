"""Notices through real parts: an SMTP server (aiosmtpd) and HTTP receivers on 127.0.0.1 that
answer 200, 500, a redirect, check the signature, or hang; retries with backoff for an hour,
every attempt recorded; a real Celery worker in which a hanging receiver delays no other."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import subprocess
import uuid as uuidlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.conf import settings as django_settings
from django.utils import timezone

from alerts import services
from alerts.models import FAILED, PENDING, SENT, Delivery, DeliveryAttempt
from alerts.services import alerts_evaluate, delivery_attempt
from tests.alerts.conftest import SECRET, at, rules_apply

NOW = at("2026-03-02T20") + dt.timedelta(minutes=5)  # the worked example's GPU held 6 h


def held_rule(*notify: str, scope: str = "pool:inference", rule: str = "gpu_held_hours") -> None:
    threshold: Any = 4 if rule == "gpu_held_hours" else 0.5
    rules_apply(
        {
            "name": "held-idle",
            "rule": rule,
            "scope": scope,
            "threshold": threshold,
            "notify": list(notify),
        }  # fmt: skip
    )


def evaluate(capture: Any, now: dt.datetime = NOW) -> Any:
    with time_machine.travel(now, tick=False), capture(execute=True):
        return alerts_evaluate()


def test_an_email_over_smtp_says_what_fired_and_links_to_its_page(
    worked_example: Any, eager: None, smtp: Any, django_capture_on_commit_callbacks: Any
) -> None:
    held_rule("mailto:ops@example.com")
    evaluate(django_capture_on_commit_callbacks)

    (envelope,) = smtp.envelopes
    assert envelope.rcpt_tos == ["ops@example.com"]
    (message,) = smtp.messages()
    assert message["From"] == "gpufleet@example.com"
    assert message["Subject"] == "[gpufleet] firing held-idle: gpu-07#0 at 6.0 h, above 4.0 h"
    text = message.get_body(("plain",)).get_content()
    html = message.get_body(("html",)).get_content()
    page = "https://gpufleet.example.com/gpus/GPU-example/?from=2026-03-01&to=2026-03-02"
    assert f"Details: {page}" in text
    assert "All alerts: https://gpufleet.example.com/alerts/?rule=held-idle" in text
    assert "Value:     6.0 h, threshold 4.0 h (fires above)" in text
    assert "Window:    2026-03-01 20:00 to 2026-03-02 20:00 UTC" in text
    assert "What to do: Something holds the GPU and does not compute" in text
    assert f'href="{page.replace("&", "&amp;")}"' in html
    assert "gpu-07#0" in html and "6.0 h" in html
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.channel) == (SENT, 1, "email")
    assert DeliveryAttempt.objects.get().ok


def test_a_pool_alert_links_to_the_fleet_board_of_that_pool(
    worked_example: Any, eager: None, smtp: Any, django_capture_on_commit_callbacks: Any
) -> None:
    held_rule("mailto:ops@example.com", rule="utilization_below")  # 37.5 % over the day
    evaluate(django_capture_on_commit_callbacks, at("2026-03-03T00"))
    text = smtp.messages()[0].get_body(("plain",)).get_content()
    assert (
        "Details: https://gpufleet.example.com/fleet/?from=2026-03-02&to=2026-03-02&pool=inference"
        in text
    )
    assert "Value:     37.5 %, threshold 50.0 % (fires below)" in text


def test_an_smtp_server_that_is_away_is_retried(
    worked_example: Any, eager: None, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    held_rule("mailto:ops@example.com")
    evaluate(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (PENDING, 1)
    assert delivery.next_attempt_at == NOW + dt.timedelta(seconds=30)
    assert "SMTP: ConnectionRefusedError" in delivery.last_error


def test_a_webhook_carries_the_signed_json_of_the_design(
    worked_example: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    hook = receiver("verify")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    (got,) = hook.received
    # t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>" with ALERT_WEBHOOK_SECRET>, t = when sent.
    sent_s = int(NOW.timestamp())
    signed = f"{sent_s}.".encode() + got.body
    want = hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
    assert got.headers["X-Gpufleet-Signature"] == f"t={sent_s},v1={want}"
    assert got.signature_ok
    assert got.headers["Content-Type"] == "application/json"
    delivery = Delivery.objects.get()
    # The id to de-duplicate on is inside the signed body; no unsigned header offers one.
    assert "X-Gpufleet-Delivery" not in got.headers
    body = got.json()
    assert body["delivery"] == delivery.pk
    assert {
        "alert",
        "rule",
        "subject",
        "state",
        "value",
        "threshold",
        "since",
        "url",
        "text",
    } <= set(body)
    assert body["rule"] == "held-idle" and body["rule_kind"] == "gpu_held_hours"
    assert (body["subject"], body["subject_label"]) == ("gpu:GPU-example", "gpu-07#0")
    assert (body["state"], body["value"], body["threshold"], body["unit"]) == (
        "firing",
        6.0,
        4.0,
        "h",
    )
    assert body["since"] == "2026-03-02T20:05:00Z"
    assert (
        body["url"]
        == "https://gpufleet.example.com/gpus/GPU-example/?from=2026-03-01&to=2026-03-02"
    )
    assert body["text"].startswith(":rotating_light: *firing held-idle: gpu-07#0 at 6.0 h")
    # Slack's link syntax, its '&' escaped as Slack asks of its control characters.
    assert body["text"].endswith(f"<{body['url'].replace('&', '&amp;')}|details>")
    assert (delivery.status, DeliveryAttempt.objects.get().status_code) == (SENT, 200)


def test_a_webhook_with_a_wrong_key_is_refused_by_a_checking_receiver(
    worked_example: Any,
    eager: None,
    receiver: Any,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.ALERT_WEBHOOK_SECRET = SECRET + "-not"
    hook = receiver("verify")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    assert not hook.received[0].signature_ok
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.last_error) == (FAILED, "HTTP 401")  # a refusal: final


def test_a_failing_receiver_is_retried_with_backoff_for_an_hour(
    worked_example: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """30 s, 1, 2, 4, 8 min, then 15 min: attempts at 0, 30, 90, 210, 450, 930, 1830 and 2730 s;
    the next would come after the hour, so the eighth is the last."""
    hook = receiver("error")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get()
    moments = [0]
    while delivery.status == PENDING:
        assert delivery.next_attempt_at is not None
        moments.append(int((delivery.next_attempt_at - NOW).total_seconds()))
        with time_machine.travel(delivery.next_attempt_at, tick=False):
            assert delivery_attempt(delivery_id=delivery.pk).status in ("retry", "failed")
        delivery.refresh_from_db()
    assert moments == [0, 30, 90, 210, 450, 930, 1830, 2730]
    assert (delivery.status, delivery.attempts, len(hook.received)) == (FAILED, 8, 8)
    tries = list(DeliveryAttempt.objects.values_list("number", "ok", "status_code", "error"))
    assert tries == [(n, False, 500, "HTTP 500") for n in range(1, 9)]
    assert delivery.failed_at == NOW + dt.timedelta(seconds=2730)


def test_a_due_retry_is_sent_by_the_next_evaluations_sweep_without_a_broker(
    worked_example: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    hook = receiver("error")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    hook.behaviour = "ok"
    # 40 s later: no new notice, but the pending one is due and the sweep sends it.
    result = evaluate(django_capture_on_commit_callbacks, NOW + dt.timedelta(seconds=40))
    assert (result.deliveries, result.resent) == (0, 1)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, len(hook.received)) == (SENT, 2, 2)


def test_with_a_broker_the_sweep_resends_only_what_lost_its_task(
    worked_example: Any, broker: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_rule("mailto:ops@example.com")
    sent: list[list[int]] = []
    monkeypatch.setattr(services, "deliveries_dispatch", lambda ids: sent.append(list(ids)))
    with time_machine.travel(NOW, tick=False):
        alerts_evaluate()  # queued: its task is in the broker
    with time_machine.travel(NOW + dt.timedelta(minutes=5), tick=False):
        assert services.deliveries_sweep() == 0
    with time_machine.travel(NOW + dt.timedelta(minutes=11), tick=False):
        assert services.deliveries_sweep() == 1  # ten minutes overdue: its task was lost
        Delivery.objects.update(claimed_until=timezone.now() + dt.timedelta(minutes=1))
        assert services.deliveries_sweep() == 0  # a sender holds it


def test_a_redirect_is_not_followed(
    worked_example: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    elsewhere = receiver("ok")
    hook = receiver("redirect", location=elsewhere.url)
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    assert len(hook.received) == 1 and elsewhere.received == []
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.last_error) == (FAILED, "HTTP 302")


def test_a_hanging_receiver_times_out_and_is_retried(
    worked_example: Any,
    eager: None,
    receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    assert services.WEBHOOK_TIMEOUT_S == 5.0  # docs/alerts.md; shortened below for the test
    monkeypatch.setattr(services, "WEBHOOK_TIMEOUT_S", 0.5)
    hook = receiver("hang")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    assert hook.arrived.is_set()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (PENDING, 1)
    assert "timed out" in delivery.last_error


def test_without_a_secret_no_webhook_leaves(
    worked_example: Any,
    eager: None,
    receiver: Any,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.ALERT_WEBHOOK_SECRET = ""
    hook = receiver("ok")
    held_rule(hook.url, "mailto:ops@example.com")
    evaluate(django_capture_on_commit_callbacks)
    assert hook.received == []
    by_channel = dict(Delivery.objects.values_list("channel", "status"))
    assert by_channel == {"webhook": FAILED, "email": SENT}


def test_what_an_evaluation_reads_never_becomes_an_address(
    fleet: Any, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    """Names come from agents and admins: a pool or GPU named like an address or a header
    goes into the notice's text, never into its recipients or headers."""
    from django.core import mail

    pool = fleet.pool("x@evil.example")
    node = fleet.node("Bcc: y@evil.example", pool=pool)
    gpu = fleet.gpu(
        "GPU-mailto:z@evil.example", node=node, index=0, in_service_at=at("2026-03-01T00")
    )
    fleet.save(
        [
            fleet.usage(gpu, at(f"2026-03-02T{h:02d}"), observed_s=3600, held_s=3600)
            for h in range(8)
        ]
    )
    rules_apply(
        {
            "name": "held",
            "rule": "gpu_held_hours",
            "scope": "pool:x@evil.example",
            "threshold": 4,
            "notify": ["mailto:ops@example.com"],
        }  # fmt: skip
    )
    evaluate(django_capture_on_commit_callbacks, at("2026-03-02T12"))
    (message,) = mail.outbox
    assert message.recipients() == ["ops@example.com"]
    assert "evil" not in "".join(str(v) for k, v in message.extra_headers.items())
    assert list(Delivery.objects.values_list("target", flat=True)) == ["mailto:ops@example.com"]


# --- a real worker: a hanging receiver delays no other ----------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_in_a_worker_a_hanging_receiver_delays_no_other(
    postgres: None,
    redis_url: str,
    receiver: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Three receivers (one hangs, one answers 500, one checks the signature) and a Celery
    worker with four threads, as production runs them: the checking receiver gets its notice
    and the delivery is recorded sent while the hanging one still holds its request."""
    from celery import Celery

    from config.celery import worker_argv
    from fleet.models import FleetSettings
    from tests.billing.conftest import FleetBuilder
    from tests.deploy.test_worker_watchdog import _stop as worker_stop
    from tests.reliability.conftest import db_url_for_test, server_env, wait_for

    FleetSettings.load()
    fleet = FleetBuilder()
    node = fleet.node("gpu-01", pool=fleet.pool("training"))
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    gpu = fleet.gpu("GPU-w", node=node, index=0, in_service_at=hour - dt.timedelta(days=2))
    fleet.save(
        [
            fleet.usage(gpu, hour - dt.timedelta(hours=h), observed_s=3600, held_s=3600)
            for h in range(1, 9)
        ]
    )
    hang, error, good = receiver("hang"), receiver("error"), receiver("verify")
    rules_apply(
        {
            "name": "held",
            "rule": "gpu_held_hours",
            "scope": "fleet",
            "threshold": 4,
            "notify": [hang.url, error.url, good.url],
        }  # fmt: skip
    )
    created: list[int] = []
    monkeypatch.setattr(services, "deliveries_dispatch", lambda ids: created.extend(ids))
    alerts_evaluate()  # the notices' hour of retries starts now
    by_target = dict(Delivery.objects.values_list("target", "pk"))
    assert sorted(created) == sorted(by_target.values())

    queue = f"alerts-{uuidlib.uuid4().hex[:8]}"
    env = server_env(
        database_url=db_url_for_test(),
        redis_url=redis_url,
        ALERT_WEBHOOK_SECRET=SECRET,
        ALERT_WEBHOOK_ALLOW_PRIVATE="1",  # the receivers are on 127.0.0.1
        SITE_URL="https://gpufleet.example.com",
    )
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        worker_argv(queue=queue, name=f"{queue}@%h", pool="threads", concurrency=4),
        cwd=django_settings.BASE_DIR,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    sender = Celery("alerts-sender", broker=redis_url)
    try:
        wait_for(lambda: "ready." in log.read_text(errors="replace"), "worker ready", 60)
        for target in (hang.url, error.url, good.url):  # the hanging one first
            sender.send_task("alerts.tasks.delivery_task", args=[by_target[target]], queue=queue)
        wait_for(lambda: hang.arrived.is_set() and good.arrived.is_set(), "both receivers", 30)
        wait_for(
            lambda: Delivery.objects.get(pk=by_target[good.url]).status == SENT,
            "the good delivery recorded",
            30,
        )
        # The hanging receiver still holds its request: its attempt is not over.
        assert not DeliveryAttempt.objects.filter(delivery_id=by_target[hang.url]).exists()
        assert good.received[0].signature_ok
        wait_for(
            lambda: DeliveryAttempt.objects.filter(delivery_id=by_target[error.url]).exists(),
            "the failing receiver's attempt",
            30,
        )
        failing = Delivery.objects.get(pk=by_target[error.url])
        assert (failing.status, failing.last_error) == (PENDING, "HTTP 500")
        # The 5 s timeout ends the hanging attempt; it is recorded and will be retried.
        wait_for(
            lambda: DeliveryAttempt.objects.filter(delivery_id=by_target[hang.url]).exists(),
            "the hanging receiver's attempt to time out",
            30,
        )
        hanging = Delivery.objects.get(pk=by_target[hang.url])
        assert hanging.status == PENDING and "timed out" in hanging.last_error
        assert hanging.value == Decimal(8)
    finally:
        hang.release.set()
        worker_stop(worker)
        sender.close()
        import redis

        redis.Redis.from_url(redis_url).delete(queue, f"_kombu.binding.{queue}")
