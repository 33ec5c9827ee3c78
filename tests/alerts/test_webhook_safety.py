"""What a webhook may say and where it may go (issue 47): names escaped in Slack's text, a
signature that carries and covers its time (docs/alerts.md's verifier, run as written), and
addresses inside the server's network refused, when the fleet file is applied and again on
what a host name resolves to when the webhook is sent."""

from __future__ import annotations

import datetime as dt
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.conf import settings as django_settings

from alerts import egress, services
from alerts.models import FAILED, SENT, Alert, Delivery
from fleet.services import FleetFileError
from tests.alerts.conftest import SECRET, rules_apply
from tests.alerts.test_delivery import NOW, evaluate


def held_rule(*notify: str) -> None:
    rules_apply(
        {"name": "held-idle", "rule": "gpu_held_hours", "threshold": 4, "notify": list(notify)}
    )


# --- Slack markup in names -------------------------------------------------------------------
def test_a_workload_named_as_slack_markup_stays_text(
    jobs: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """A job named to ping the channel with a phishing link: Slack reads ``<!channel>`` and
    ``<url|label>`` as markup, so '&', '<' and '>' of every name become &amp; &lt; &gt;."""
    jobs["alice"].name = "<!channel> <https://evil.example/login|Re-authenticate> & co"
    jobs["alice"].save()
    hook = receiver("verify")
    rules_apply(
        {"name": "idle-jobs", "rule": "workload_held_hours", "threshold": 4, "notify": [hook.url]}
    )
    evaluate(django_capture_on_commit_callbacks)
    (got,) = hook.received
    body = got.json()
    text = body["text"]
    assert "&lt;!channel&gt; &lt;https://evil.example/login|Re-authenticate&gt; &amp; co" in text
    # The one piece of markup left is the notice's own link to its page ('&' escaped too).
    assert re.findall(r"<[^>]*>", text) == [f"<{body['url'].replace('&', '&amp;')}|details>"]
    # The plain JSON fields keep the name as it is: they are data, not Slack text.
    assert body["subject_label"].endswith(
        "<!channel> <https://evil.example/login|Re-authenticate> & co"
    )


# --- the signature ---------------------------------------------------------------------------
def docs_verifier() -> Any:
    """The verifier docs/alerts.md gives receivers, as written there."""
    doc = (Path(django_settings.BASE_DIR) / "docs" / "alerts.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "def verified" in b]
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # noqa: S102 - the documentation's own ten lines
    return namespace["verified"]


def test_the_documented_verifier_accepts_a_fresh_notice_and_refuses_an_old_or_altered_one(
    worked_example: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    verified = docs_verifier()
    hook = receiver("ok")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    (got,) = hook.received
    header = got.headers["X-Gpufleet-Signature"]
    t = int(NOW.timestamp())
    assert header.startswith(f"t={t},v1=")
    with time_machine.travel(NOW + dt.timedelta(seconds=299), tick=False):
        assert verified(got.body, header, SECRET)
        assert not verified(got.body, header, SECRET + "x")
        assert not verified(got.body.replace(b'"held-idle"', b'"held-IDLE"'), header, SECRET)
        # The time is signed: a recorded notice re-sent with a new t does not verify.
        assert not verified(got.body, header.replace(f"t={t}", f"t={t + 200}"), SECRET)
        assert not verified(got.body, header.split(",")[1], SECRET)  # no t at all
    with time_machine.travel(NOW + dt.timedelta(minutes=6), tick=False):
        assert not verified(got.body, header, SECRET)  # older than five minutes


def test_each_attempt_is_signed_when_it_is_sent(
    worked_example: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    hook = receiver("error")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    hook.behaviour = "verify"
    later = NOW + dt.timedelta(seconds=40)  # the sweep's retry, 40 s later
    evaluate(django_capture_on_commit_callbacks, later)
    first, second = hook.received
    assert first.body == second.body  # the same notice, same bytes, same delivery id
    assert second.headers["X-Gpufleet-Signature"].startswith(f"t={int(later.timestamp())},")
    assert Delivery.objects.get().status == SENT  # the receiver verified the fresh one


# --- where a webhook may go ------------------------------------------------------------------
METADATA = [
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.0.1:8080/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://[fe80::1]/",
    "http://[::ffff:169.254.169.254]/",  # the same address, IPv4-mapped
    "http://0xa9.254.169.254/",  # the same address, as a resolver reads hex
]
PRIVATE = [
    "http://127.0.0.1:9000/hook",
    "http://127.1/hook",  # 127.0.0.1 as a resolver reads it
    "http://2130706433/hook",  # 127.0.0.1 as one number
    "http://[::1]:9000/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://172.31.255.254/hook",
    "http://192.168.1.10/hook",
    "http://[fc00::1]/hook",
    "http://[fd12:3456::1]/hook",
    "http://0.0.0.0:9000/hook",  # reaches this host
]
PUBLIC = ["https://hooks.example.com/x", "http://172.32.0.1/x", "https://[2001:db8::1]/x"]


@pytest.mark.django_db
@pytest.mark.parametrize("url", METADATA)
@pytest.mark.parametrize("allow_private", [False, True])
def test_a_link_local_or_metadata_target_is_refused_always(
    url: str, allow_private: bool, settings: Any
) -> None:
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = allow_private
    with pytest.raises(FleetFileError, match=r"alerts\[0\]\.notify\[0\]: .* link-local or cloud"):
        held_rule(url)


@pytest.mark.django_db
@pytest.mark.parametrize("url", PRIVATE)
def test_a_loopback_or_private_target_needs_the_setting(url: str, settings: Any) -> None:
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(FleetFileError, match=r"notify\[0\]: .*ALERT_WEBHOOK_ALLOW_PRIVATE=1"):
        held_rule(url)
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = True
    held_rule(url)


@pytest.mark.django_db
@pytest.mark.parametrize("url", PUBLIC)
def test_a_public_target_needs_nothing(url: str, settings: Any) -> None:
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = False
    held_rule(url)


def test_a_private_target_stored_while_allowed_is_refused_when_sent_once_it_is_not(
    worked_example: Any,
    eager: None,
    receiver: Any,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    hook = receiver("ok")  # allows private targets: the rule is applied
    held_rule(hook.url)
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = False
    evaluate(django_capture_on_commit_callbacks)
    assert hook.received == []
    delivery = Delivery.objects.get()
    assert delivery.status == FAILED  # at once: no retry would change the answer
    assert delivery.last_error.startswith("refused: 127.0.0.1 resolves to 127.0.0.1, a loopback")


def test_a_name_is_checked_on_what_it_resolves_to(
    worked_example: Any,
    eager: None,
    receiver: Any,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """``localhost`` passes the fleet file (a name) and is refused when sent, as it resolves to
    loopback; with the setting it is delivered."""
    hook = receiver("verify")
    url = hook.url.replace("127.0.0.1", "localhost")
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = False
    held_rule(url)
    evaluate(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get()
    assert (delivery.status, hook.received) == (FAILED, [])
    assert delivery.last_error.startswith("refused: localhost resolves to ")

    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = True
    Alert.objects.all().delete()  # a new alert, a new notice
    evaluate(django_capture_on_commit_callbacks)
    assert Delivery.objects.get().status == SENT and len(hook.received) == 1


def test_a_name_resolving_to_the_metadata_address_is_refused_even_when_private_is_allowed(
    worked_example: Any,
    eager: None,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.ALERT_WEBHOOK_ALLOW_PRIVATE = True
    real = socket.getaddrinfo
    connected: list[Any] = []

    def resolve(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "hooks.example.com":  # a DNS answer the fleet file could not see
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(socket.socket, "connect", lambda s, a: connected.append(a))
    held_rule("http://hooks.example.com/gpufleet")
    evaluate(django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get()
    assert connected == []  # refused before any connection
    assert delivery.status == FAILED
    assert delivery.last_error.startswith(
        "refused: hooks.example.com resolves to 169.254.169.254, a link-local or cloud metadata"
    )


def test_a_webhook_goes_direct_whatever_proxy_the_environment_names(
    worked_example: Any,
    eager: None,
    receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A proxy would connect on our behalf to an address we never checked."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://192.0.2.1:3128")  # nothing there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    # Made as the server makes it at start, with these proxies in its environment.
    monkeypatch.setattr(services, "_OPENER", egress.webhook_opener())
    hook = receiver("verify")
    held_rule(hook.url)
    evaluate(django_capture_on_commit_callbacks)
    assert Delivery.objects.get().status == SENT and len(hook.received) == 1
