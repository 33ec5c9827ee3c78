"""The weekly digest per workload user, through a real SMTP server, on the workloads of
``jobs`` (conftest) in ISO week 2026-W10 (Monday 2 March, report time zone UTC).

By hand: the worked example's GPU costs 30,000.00 / (5 × 8,766 h) + 0.10 = 0.7844627 per
hour and the rows carry no energy, so alice's job (7 GPU h, 5.2 held) cost 7 × 0.7844627 =
5.4912389 → 5.49 and its idle hours 5.2 × 0.7844627 = 4.0792060 → 4.08; 5.2 / 7 = 74 %
held idle. bob's (1 GPU h, all held): 0.78 and 0.78, 100 %.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.management import call_command

from alerts.digest import digest_users, digests_send, digests_send_due
from alerts.models import Digest
from tests.alerts.conftest import at
from tests.alerts.test_owners import people_apply

WEEK = dt.date(2026, 3, 2)


@pytest.fixture
def people(jobs: Any) -> None:
    people_apply({"user": "alice", "email": "alice@example.com"}, {"email_domain": "example.org"})


def test_who_gets_a_digest(jobs: Any) -> None:
    people_apply({"user": "alice", "email": "alice@example.com"}, {"email_domain": "example.org"})
    # alice is listed (on by default); bob only through the domain rule (off by default).
    assert digest_users(week_start=WEEK) == [("alice", "alice@example.com")]
    people_apply(
        {"user": "alice", "email": "alice@example.com", "digest": False},
        {"email_domain": "example.org", "digest": True},
    )
    assert digest_users(week_start=WEEK) == [("bob", "bob@example.org")]
    # The week before had no workloads: nobody.
    assert digest_users(week_start=WEEK - dt.timedelta(weeks=1)) == []


def test_a_digest_says_hours_idle_share_and_money_once(people: None, smtp: Any) -> None:
    assert digests_send(week_start=WEEK) == {"sent": 1}
    (message,) = smtp.messages()
    assert message["To"] == "alice@example.com"
    assert message["Subject"] == "[gpufleet] Your GPU week 2026-W10: 7.0 GPU h, 74 % held idle"
    text = message.get_body(("plain",)).get_content()
    assert text.startswith("Hi alice,")
    assert "held 7.0 GPU hours, 74 % of them without computing (5.2 GPU hours)" in text
    assert "They cost 5.49 USD; the hours held without computing cost 4.08 USD." in text
    line = "- slurm 48213 · train-llm: 7.0 GPU h, 74 % held idle, cost 5.49 USD (idle 4.08 USD)"
    assert line in text
    assert "user=alice" in text and "from=2026-03-02" in text and "to=2026-03-08" in text
    html = message.get_body(("html",)).get_content()
    assert "74 %" in html and "5.49" in html and "4.08" in html
    # Asked again (a retried task, the command): nothing more goes out.
    assert digests_send(week_start=WEEK) == {"already_sent": 1}
    out = call_command_output("send_digests", "--week", "2026-W10")
    assert out == "digests 2026-W10: 1 already_sent"
    assert len(smtp.messages()) == 1
    assert Digest.objects.get().sent_at is not None


def test_a_failed_send_is_retried_and_a_stale_claim_taken_over(
    people: None, smtp: Any, settings: Any
) -> None:
    port = settings.EMAIL_PORT
    settings.EMAIL_PORT = 9  # nothing listens: the send fails, the claim is given back
    assert digests_send(week_start=WEEK) == {"failed": 1}
    assert Digest.objects.get().claimed_at is None
    settings.EMAIL_PORT = port
    assert digests_send(week_start=WEEK) == {"sent": 1}
    assert len(smtp.messages()) == 1


def test_the_beat_job_sends_last_weeks_digests_when_the_report_is_due(
    people: None, smtp: Any, settings: Any
) -> None:
    settings.WEEKLY_REPORT_WEEKDAY, settings.WEEKLY_REPORT_HOUR = 0, 7
    assert digests_send_due(now=at("2026-03-09T06")) == "no digest due now"
    assert digests_send_due(now=at("2026-03-09T07")) == "digests 2026-W10: 1 sent"
    assert digests_send_due(now=at("2026-03-09T08")) == "digests 2026-W10: 1 already_sent"
    assert len(smtp.messages()) == 1


@pytest.mark.django_db
def test_the_command_refuses_a_week_that_has_not_ended() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--week: 2100-W01 has not ended yet"):
        call_command("send_digests", "--week", "2100-W01")
    with pytest.raises(CommandError, match="--week: expected YYYY-Www"):
        call_command("send_digests", "--week", "March")


def call_command_output(*args: str) -> str:
    import io

    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()
