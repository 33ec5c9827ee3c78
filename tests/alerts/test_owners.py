"""Owners: the fleet file's ``[[people]]``, the ``workload_held_hours`` rule and its
``notify = ["owner"]``, through a real SMTP server, on the workloads of ``jobs`` (conftest)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.db import transaction

from alerts import figures
from alerts.models import Delivery, Person, Rule
from alerts.people import people_directory, people_section_apply
from alerts.rules import RULE_KINDS, RuleConfig, Scope
from alerts.services import alerts_evaluate
from fleet.services import ApplyResult, FleetFileError
from tests.alerts.conftest import at, rules_apply

NOW = at("2026-03-02T20") + dt.timedelta(minutes=5)  # window 1 March 20:00 – 2 March 20:00


def people_apply(*tables: dict[str, Any]) -> ApplyResult:
    result = ApplyResult()
    with transaction.atomic():
        people_section_apply(document={"people": list(tables)}, result=result)
    return result


# --- [[people]] ------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tables", "error"),
    [
        ([{"user": "alice"}], "people[0].email: required"),
        ([{"user": "alice", "email": "not-an-address"}], "people[0].email: not an email"),
        ([{"email": "a@example.com"}], "people[0].user: required"),
        ([{"user": "a/b", "email": "a@example.com"}], "people[0].user:"),
        ([{"user": "alice", "email": "a@example.com", "mail": "x"}], "people[0].mail: unknown"),
        ([{"user": "alice", "email": "a@example.com", "digest": "yes"}], "people[0].digest:"),
        ([{"email_domain": "@example.com"}], "people[0].email_domain: a domain"),
        ([{"email_domain": "example.com", "user": "x"}], "people[0].user: unknown"),
        (
            [{"email_domain": "example.com"}, {"email_domain": "example.org"}],
            "people[1].email_domain: only one domain rule",
        ),
        (
            [{"user": "alice", "email": "a@example.com"}, {"user": "alice", "email": "b@x.org"}],
            "people[1].user: 'alice' appears twice",
        ),
    ],
)
def test_a_bad_people_table_is_refused_naming_its_field(
    tables: list[dict[str, Any]], error: str
) -> None:
    with pytest.raises(FleetFileError) as raised:
        people_apply(*tables)
    assert str(raised.value).startswith(error), str(raised.value)
    assert not Person.objects.exists()


@pytest.mark.django_db
def test_listed_people_come_first_then_the_domain_rule() -> None:
    people_apply(
        {"user": "alice", "email": "Alice.Smith@example.com"},
        {"user": "carol", "email": "carol@lab.example.org", "digest": False},
        {"email_domain": "example.com"},
    )
    found = people_directory()
    assert found.email("alice") == "Alice.Smith@example.com"
    assert found.email("bob") == "bob@example.com"  # the domain rule
    assert found.email("") is None
    assert found.email("two words") is None  # no valid address can be made of it
    # The digest: on by default for a listed person, off unless asked for a domain rule.
    assert (found.digest("alice"), found.digest("carol"), found.digest("bob")) == (
        True,
        False,
        False,
    )
    # Applying the same file changes nothing; a new file replaces the people.
    assert (
        people_apply(
            {"user": "alice", "email": "Alice.Smith@example.com"},
            {"user": "carol", "email": "carol@lab.example.org", "digest": False},
            {"email_domain": "example.com"},
        ).updated
        == {}
    )
    people_apply({"user": "bob", "email": "bob@else.example.net"})
    found = people_directory()
    assert (found.email("alice"), found.email("bob")) == (None, "bob@else.example.net")


# --- workload_held_hours -----------------------------------------------------------------------
def measure(scope: str, now: dt.datetime, window_hours: int = 24) -> dict[str, Decimal]:
    kind = RULE_KINDS["workload_held_hours"]
    config = RuleConfig(
        name="r", kind=kind.name, scope=Scope.parse(scope), threshold=Decimal(1),
        window_hours=window_hours,
    )  # fmt: skip
    with figures.memo():
        return {m.subject: m.value for m in kind.measure(config, kind.window_of(config, now), now)}


def test_a_workloads_held_hours_are_its_gpu_hours_less_its_air_hours(jobs: Any) -> None:
    alice, bob = f"workload:{jobs['alice'].pk}", f"workload:{jobs['bob'].pk}"
    # 7 GPU hours − 1.8 air hours; bob 2 × 0.5 GPU hours, none in the air.
    assert measure("pool:inference", NOW) == {alice: Decimal("5.2"), bob: Decimal("1")}
    assert measure("team:research", NOW) == measure("fleet", NOW)
    assert measure("pool:elsewhere", NOW) == {}
    # The last 8 hours (12:00–20:00): alice's hours 12–14, bob's 12–13.
    assert measure("fleet", NOW, window_hours=8) == {alice: Decimal("3"), bob: Decimal("1")}


@pytest.mark.django_db
def test_owner_is_only_for_workload_rules() -> None:
    with pytest.raises(FleetFileError, match=r"alerts\[0\].notify\[0\]: 'owner' only works"):
        rules_apply({"name": "x", "rule": "gpu_held_hours", "threshold": 4, "notify": ["owner"]})
    rules_apply({"name": "x", "rule": "workload_held_hours", "threshold": 4, "notify": ["owner"]})


def test_the_owner_is_mailed_as_a_colleague_and_the_rules_own_targets_too(
    jobs: Any, eager: None, smtp: Any, django_capture_on_commit_callbacks: Any
) -> None:
    people_apply({"user": "alice", "email": "alice@example.com"}, {"email_domain": "example.org"})
    rules_apply(
        {
            "name": "idle-jobs",
            "rule": "workload_held_hours",
            "scope": "pool:inference",
            "threshold": 4,
            "notify": ["owner", "mailto:hpc-team@example.com"],
        }
    )
    with time_machine.travel(NOW, tick=False), django_capture_on_commit_callbacks(execute=True):
        alerts_evaluate()

    # Only alice's job passed 4 held hours (bob's held 1): her and the rule's own address.
    targets = sorted(Delivery.objects.values_list("target", flat=True))
    assert targets == ["mailto:alice@example.com", "mailto:hpc-team@example.com"]
    by_rcpt = {tuple(e.rcpt_tos): e for e in smtp.envelopes}
    assert set(by_rcpt) == {("alice@example.com",), ("hpc-team@example.com",)}
    message = next(m for m in smtp.messages() if m["To"] == "alice@example.com")
    # Non-ASCII (the ·) travels RFC 2047-encoded; the parser keeps the fold's space.
    assert message["Subject"].strip() == (
        "[gpufleet] firing idle-jobs: slurm 48213 · alice · train-llm at 5.2 h, above 4.0 h"
    )
    text = message.get_body(("plain",)).get_content()
    assert text.startswith("Hi alice,")
    assert (
        "The Slurm job 48213 (train-llm) held 5.2 h of GPU time without computing over "
        "2026-03-01 20:00 to 2026-03-02 20:00 UTC, out of 7.0 h it held in all" in text
    )
    # Its idle time's money, as the Workloads page counts it: 5.2 held hours at the GPU's
    # 30,000.00 / 43,830 h + 0.10 = 0.7844627 per hour (no energy in these rows) = 4.08.
    assert "That idle time cost 4.08 USD." in text
    assert "scancel 48213" in text
    page = (
        f"https://gpufleet.example.com/workloads/{jobs['alice'].pk}/?from=2026-03-01&to=2026-03-02"
    )
    assert f"Its GPUs hour by hour: {page}" in text
    html = message.get_body(("html",)).get_content()
    assert "Hi alice," in html and "<code>scancel 48213</code>" in html


def test_an_owner_nobody_can_be_mailed_at_gets_nothing_and_stops_nothing(
    jobs: Any, eager: None, smtp: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # No people at all: the owner cannot be resolved; the rule's own target is still told.
    rules_apply(
        {
            "name": "idle-jobs",
            "rule": "workload_held_hours",
            "threshold": 4,
            "notify": ["owner", "mailto:hpc-team@example.com"],
        }
    )
    with time_machine.travel(NOW, tick=False), django_capture_on_commit_callbacks(execute=True):
        alerts_evaluate()
    assert [e.rcpt_tos for e in smtp.envelopes] == [["hpc-team@example.com"]]


# --- one recipient rule: a workload's user name must not choose where mail goes ---------------
# Each is a valid address to Django's validate_email once the domain is added, and each makes
# a mail server deliver elsewhere or to several: the percent hack and the bang path relay to
# attacker.example; a quoted local part carries an '@' or a second address after a ','.
HOSTILE_USERS = (
    "evil%attacker.example",
    "attacker.example!evil",
    '"evil@attacker.example"',
    '"evil@attacker.example,bob"',
    "bob,evil",
    "bob@attacker.example",
)


@pytest.mark.django_db
@pytest.mark.parametrize("user", HOSTILE_USERS)
def test_a_user_name_that_relays_gets_no_address_from_the_domain_rule(user: str) -> None:
    people_apply({"email_domain": "example.org", "digest": True})
    found = people_directory()
    assert found.email("bob.smith-2_x") == "bob.smith-2_x@example.org"  # a plain one does
    assert (found.email(user), found.digest(user)) == (None, False)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "email",
    [
        "evil%attacker.example@example.com",
        "attacker.example!evil@example.com",
        '"evil@attacker.example"@example.com',
        '"a,b"@example.com',
        "alice@example.com,evil@attacker.example",
        "alice@[192.0.2.1]",
    ],
)
def test_a_listed_address_follows_the_same_rule(email: str) -> None:
    with pytest.raises(FleetFileError, match=r"^people\[0\]\.email: "):
        people_apply({"user": "alice", "email": email})
    assert not Person.objects.exists()
    # A row stored before the rule was this strict is not mailed either.
    Person.objects.create(user="alice", email=email, digest=True, position=0)
    assert people_directory().email("alice") is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "target",
    [
        "mailto:evil%attacker.example@example.com",
        "mailto:attacker.example!evil@example.com",
        'mailto:"evil@attacker.example"@example.com',
    ],
)
def test_a_mailto_target_follows_the_same_rule(target: str) -> None:
    with pytest.raises(FleetFileError, match=r"alerts\[0\]\.notify\[0\]: mailto: takes one"):
        rules_apply({"name": "x", "rule": "gpu_held_hours", "threshold": 4, "notify": [target]})


@pytest.mark.parametrize("user", ["evil%attacker.example", '"evil@attacker.example,bob"'])
def test_a_hostile_user_is_neither_told_as_owner_nor_sent_a_digest(
    user: str, jobs: Any, eager: None, smtp: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from alerts.digest import digest_users

    jobs["alice"].user_name = user
    jobs["alice"].save()
    people_apply({"email_domain": "example.org", "digest": True})
    rules_apply(
        {
            "name": "idle-jobs",
            "rule": "workload_held_hours",
            "threshold": 4,
            "notify": ["owner", "mailto:hpc-team@example.com"],
        }
    )
    with time_machine.travel(NOW, tick=False), django_capture_on_commit_callbacks(execute=True):
        alerts_evaluate()
    # Her job still fires (5.2 held hours); only the rule's own address is told.
    assert [e.rcpt_tos for e in smtp.envelopes] == [["hpc-team@example.com"]]
    # bob (plain) gets his digest through the domain rule; the hostile name none.
    assert digest_users(week_start=dt.date(2026, 3, 2)) == [("bob", "bob@example.org")]


def test_a_stored_notice_to_a_relaying_address_is_not_sent(
    jobs: Any, eager: None, smtp: Any
) -> None:
    """A delivery row written before the rule was this strict fails at once, unsent."""
    from alerts.services import delivery_attempt
    from tests.alerts.conftest import open_alert

    rules_apply({"name": "idle-jobs", "rule": "workload_held_hours", "threshold": 4})
    alert = open_alert(Rule.objects.get(), f"workload:{jobs['alice'].pk}")
    delivery = Delivery.objects.create(
        alert=alert,
        event="firing",
        sequence=1,
        channel="email",
        target="mailto:evil%attacker.example@example.org",
        threshold=alert.threshold,
        created_at=alert.firing_since,
        next_attempt_at=alert.firing_since,
    )
    assert delivery_attempt(delivery_id=delivery.pk).status == "failed"
    delivery.refresh_from_db()
    assert delivery.last_error.startswith("refused: only letters, digits")
    assert smtp.envelopes == []
