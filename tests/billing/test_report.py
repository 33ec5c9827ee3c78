"""The weekly email: delivered through a real SMTP server (aiosmtpd) and parsed back with the
``email`` package; its figures equal the finance API's; each week goes out once."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import io
import socket
import threading
from email.message import EmailMessage
from typing import Any

import pytest
import time_machine
from aiosmtpd.controller import Controller
from django.core import mail
from django.core.management import CommandError, call_command
from django.db import connection

from billing import report, report_chart
from billing.models import ReportSubscription, WeeklyReport
from billing.report import week_due, week_label, week_parse, weekly_report_send
from tests.billing.conftest import EXAMPLE_DAY, EXAMPLE_NOW, at

WEEK = EXAMPLE_DAY  # Monday 2026-03-02: ISO week 2026-W10


class Sink:
    """An aiosmtpd handler that keeps every message it is given."""

    def __init__(self) -> None:
        self.envelopes: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.envelopes.append(envelope)
        return "250 Message accepted for delivery"

    def messages(self) -> list[EmailMessage]:
        return [
            email.message_from_bytes(e.original_content, policy=email.policy.default)
            for e in self.envelopes
        ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def smtp(settings: Any) -> Any:
    """A real SMTP server on 127.0.0.1 and Django's SMTP backend pointed at it."""
    sink = Sink()
    port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_USE_TLS = False
    settings.DEFAULT_FROM_EMAIL = "gpufleet@example.com"
    settings.SITE_URL = "https://gpufleet.example.com"
    settings.WEEKLY_REPORT_RECIPIENTS = ["cio@example.com"]
    yield sink
    controller.stop()


@pytest.fixture
def example_week(worked_example: Any) -> Any:
    """The worked example as a week: the GPU served only that one day (retired after it), so
    the week's figures are the day's: total 20.31, idle 12.05, 2.26 per air hour, 2.97 kg."""
    worked_example.retired_at = at("2026-03-03T00")
    worked_example.last_seen_at = at("2026-03-02T20")
    worked_example.save()
    return worked_example


@pytest.fixture
def no_chart(monkeypatch: Any) -> None:
    monkeypatch.setattr(report_chart, "chromium_path", lambda: None)


def api_week_row(make_user: Any) -> dict[str, Any]:
    from django.test import Client

    client = Client()
    client.force_login(make_user("finance"))
    with time_machine.travel(EXAMPLE_NOW, tick=False):
        body = client.get(
            "/api/v1/costs", {"start": "2026-03-02", "end": "2026-03-09", "group_by": "fleet"}
        ).json()
    (row,) = body["results"]
    return dict(row)


def parts(message: EmailMessage) -> tuple[str, str, list[EmailMessage]]:
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    images = [p for p in message.walk() if p.get_content_type() == "image/png"]
    return text.get_content(), html.get_content(), images


def test_weekly_report_over_smtp_equals_the_api(
    example_week: Any,
    smtp: Any,
    make_user: Any,
) -> None:
    finance = make_user("finance")
    finance.email = "fin@example.com"
    finance.save()
    ReportSubscription.objects.create(user=finance, opted_in=True)
    viewer = make_user("viewer")  # opted in, but the report shows money: not a recipient
    viewer.email = "viewer@example.com"
    viewer.save()
    ReportSubscription.objects.create(user=viewer, opted_in=True)

    result = weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW)

    assert (result.status, result.week, result.recipients) == ("sent", "2026-W10", 2)
    assert sorted(rcpt for e in smtp.envelopes for rcpt in e.rcpt_tos) == [
        "cio@example.com",
        "fin@example.com",
    ]
    message = smtp.messages()[0]
    assert message["From"] == "gpufleet@example.com"
    assert message["Subject"] == (
        "GPU fleet 2026-W10: 37.5 % utilisation, idle cost 12.05 USD (new w/w)"
    )
    text, html, images = parts(message)

    # By hand (docs/metrics.md) …
    for line in [
        "- Utilisation: 37.5 % (last week –, –)",
        "- Hours in the air per GPU per day: 9.0 h (last week –, –)",
        "- Total cost: 20.31 USD (last week 0.00 USD, new)",
        "- Idle cost: 12.05 USD (last week 0.00 USD, new)",
        "- Cost per air hour: 2.26 USD (last week –, –)",
        "- Energy: 4.95 kWh (last week 0.00 kWh, new)",
        "- CO2e: 2.97 kg (last week 0.00 kg, new)",
        "1. gpu-07#0 (GPU-example): idle 12.05 USD of 20.31 USD, utilisation 37.5 %",
        "1. research: idle 12.05 USD of 20.31 USD, utilisation 37.5 %, 1 GPU(s)",
        "- inference: utilisation 37.5 %, break-even 33.5 %: owning pays off",
        "- gpu-07#0 (GPU-example): 4.0 h offline this week; still offline, last seen "
        "2026-03-02 20:00",
        "Dashboard: https://gpufleet.example.com/",
    ]:
        assert line in text, line
    # … and equal to the finance API for the same week.
    api = api_week_row(make_user)
    assert (api["total_cost"], api["idle_cost"], api["cost_per_air_hour"]) == (
        "20.31",
        "12.05",
        "2.26",
    )
    for label, field in [
        ("Total cost", "total_cost"),
        ("Idle cost", "idle_cost"),
        ("Cost per air hour", "cost_per_air_hour"),
    ]:
        assert f"- {label}: {api[field]} {api['currency']} " in text
        assert f"{api[field]} {api['currency']}" in html
    assert f"- Utilisation: {api['utilization'] * 100:.1f} %" in text
    assert f"- Energy: {api['energy_kwh']:.2f} kWh" in text
    assert f"- CO2e: {api['co2e_kg']:.2f} kg" in text

    # HTML: inlined styles, table bars, an absolute dashboard link; no <style>, no script.
    assert "<style" not in html and "<script" not in html
    assert 'bgcolor="#e8a33d"' in html and 'width="100%"' in html
    assert 'href="https://gpufleet.example.com/"' in html
    if report_chart.chromium_path() is not None:
        assert message.get_content_type() == "multipart/related"
        (image,) = images
        assert image["Content-ID"] == f"<{report.CHART_CID}>"
        assert image.get_content_disposition() == "inline"
        assert image.get_content().startswith(report_chart.PNG_MAGIC)
        assert f'src="cid:{report.CHART_CID}"' in html
        assert result.with_chart
    row = WeeklyReport.objects.get(week="2026-W10", audience="")
    assert row.sent_at is not None and row.recipients_count == 2


@pytest.mark.smoke
@pytest.mark.parametrize("failure", ["no_chromium", "kaleido_fails"])
def test_report_goes_out_without_the_chart(
    example_week: Any,
    smtp: Any,
    monkeypatch: Any,
    caplog: Any,
    failure: Any,
) -> None:
    if failure == "no_chromium":
        monkeypatch.setattr(report_chart, "chromium_path", lambda: None)
    else:
        monkeypatch.setattr(report_chart, "chromium_path", lambda: "/usr/bin/chromium")

        def broken(fig: Any, *, browser: str) -> bytes:
            raise RuntimeError("Chromium crashed")

        monkeypatch.setattr(report_chart, "render_png", broken)
    result = weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW)
    assert result.status == "sent" and not result.with_chart
    (message,) = smtp.messages()
    assert message.get_content_type() == "multipart/alternative"
    text, html, images = parts(message)
    assert images == [] and "cid:" not in html
    assert "- Total cost: 20.31 USD" in text
    if failure == "kaleido_fails":
        assert "chart rendering failed" in caplog.text


def test_a_week_is_delivered_once(example_week: Any, smtp: Any, no_chart: Any) -> None:
    first = weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW)
    second = weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW)
    assert first.status == "sent" and second.status == "already_sent"
    assert len(smtp.envelopes) == 1
    # --to is its own audience: once to that address, and the list is not sent again.
    assert weekly_report_send(week_start=WEEK, to="me@example.com").status == "sent"
    assert weekly_report_send(week_start=WEEK, to="ME@example.com").status == "already_sent"
    assert [e.rcpt_tos for e in smtp.envelopes] == [["cio@example.com"], ["me@example.com"]]


@pytest.mark.django_db(transaction=True)
def test_two_senders_racing_send_one_email(
    example_week: Any, smtp: Any, no_chart: Any, postgres: Any
) -> None:
    """Two threads claim the week at once: PostgreSQL's row locks decide (SQLite's database
    lock makes the loser fail instead of wait, which is not the production race)."""
    barrier = threading.Barrier(2)
    results: list[str] = []
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW).status)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sender) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sorted(results) in (["already_sent", "sent"], ["in_progress", "sent"])
    assert len(smtp.envelopes) == 1
    assert WeeklyReport.objects.get(week="2026-W10").recipients_count == 1


def test_a_failed_send_releases_the_claim_and_a_retry_sends(
    example_week: Any,
    smtp: Any,
    settings: Any,
    no_chart: Any,
) -> None:
    good_port = settings.EMAIL_PORT
    settings.EMAIL_PORT = free_port()  # nobody listens there
    with pytest.raises(OSError):
        weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW)
    row = WeeklyReport.objects.get(week="2026-W10")
    assert row.claimed_at is None and row.sent_at is None
    settings.EMAIL_PORT = good_port
    assert weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW).status == "sent"
    assert len(smtp.envelopes) == 1


def test_a_dead_senders_claim_is_taken_over_after_an_hour(
    example_week: Any,
    smtp: Any,
    no_chart: Any,
) -> None:
    from django.utils import timezone

    row = WeeklyReport.objects.create(
        week="2026-W10", week_start=WEEK, claimed_at=timezone.now() - dt.timedelta(minutes=10)
    )
    assert weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW).status == "in_progress"
    WeeklyReport.objects.filter(pk=row.pk).update(claimed_at=timezone.now() - dt.timedelta(hours=2))
    assert weekly_report_send(week_start=WEEK, now=EXAMPLE_NOW).status == "sent"
    assert len(smtp.envelopes) == 1


def test_recipients(make_user: Any, settings: Any) -> None:
    settings.WEEKLY_REPORT_RECIPIENTS = ["cio@example.com", "FIN@example.com"]
    users = {}
    for role, opted in [("finance", True), ("admin", True), ("viewer", True), ("finance", False)]:
        user = make_user(role)
        user.email = f"{user.username}@example.com"
        user.save()
        ReportSubscription.objects.create(user=user, opted_in=opted)
        users[(role, opted)] = user
    users[("finance", True)].email = "fin@example.com"
    users[("finance", True)].save()
    assert report.weekly_report_recipients() == [
        "fin@example.com",
        users[("admin", True)].email,
        "cio@example.com",
    ]


def test_recipients_follow_the_one_recipient_rule(make_user: Any, settings: Any) -> None:
    # Each passes Django's validate_email, and each is read by some mail servers as another
    # destination (a relay through %, a quoted @, a bang path): the weekly report, like every
    # email the product sends, goes to plain addresses only (fleet.emails.recipient_error).
    hostile = ["evil%attacker.example@example.com", '"a@b"@example.com', "a!b@example.com"]
    settings.WEEKLY_REPORT_RECIPIENTS = [hostile[0], "cio@example.com"]
    for address in hostile[1:]:
        user = make_user("finance")
        user.email = address
        user.save()
        ReportSubscription.objects.create(user=user, opted_in=True)
    assert report.weekly_report_recipients() == ["cio@example.com"]
    for address in hostile:
        with pytest.raises(CommandError, match="--to"):
            call_command("send_weekly_report", "--to", address, stdout=io.StringIO())


def test_weeks() -> None:
    assert week_label(dt.date(2026, 3, 2)) == "2026-W10"
    assert week_label(dt.date(2021, 1, 3)) == "2020-W53"
    assert week_parse("2026-W10") == dt.date(2026, 3, 2)
    for bad in ("2026-10", "2026-W54", "W10", "2026-W1"):
        with pytest.raises(ValueError, match="week"):
            week_parse(bad)


@pytest.mark.parametrize(
    ("zone", "now", "due"),
    [
        ("UTC", "2026-03-09T06:59", None),
        ("UTC", "2026-03-09T07:05", dt.date(2026, 3, 2)),
        ("UTC", "2026-03-12T15:00", dt.date(2026, 3, 2)),  # a missed hour catches up
        ("UTC", "2026-03-08T23:00", dt.date(2026, 2, 23)),
        # New York is UTC−4 from 2026-03-08: Monday 07:00 there is 11:00 UTC.
        ("America/New_York", "2026-03-09T10:30", None),
        ("America/New_York", "2026-03-09T11:05", dt.date(2026, 3, 2)),
    ],
)
def test_week_due_at_the_configured_weekday_and_hour(
    fleet: Any,
    settings: Any,
    zone: Any,
    now: Any,
    due: Any,
) -> None:
    settings.WEEKLY_REPORT_WEEKDAY, settings.WEEKLY_REPORT_HOUR = 0, 7
    fleet.settings(report_time_zone=zone)
    assert week_due(at(now)) == due


def test_beat_task_sends_once_when_due(example_week: Any, settings: Any, no_chart: Any) -> None:
    from billing.tasks import weekly_report_task

    settings.WEEKLY_REPORT_RECIPIENTS = ["cio@example.com"]
    settings.WEEKLY_REPORT_WEEKDAY, settings.WEEKLY_REPORT_HOUR = 0, 7
    with time_machine.travel(at("2026-03-09T06:05"), tick=False):
        assert weekly_report_task.apply().get() == "no report due now"
    assert mail.outbox == []
    with time_machine.travel(at("2026-03-09T07:05"), tick=False):
        first = weekly_report_task.apply().get()
        again = weekly_report_task.apply().get()
    assert first.startswith("sent 2026-W10 to 1 recipient(s)")
    assert again.startswith("2026-W10 was already delivered")
    (message,) = mail.outbox
    assert message.to == ["cio@example.com"]
    assert "20.31 USD" in message.body


def test_send_weekly_report_command(example_week: Any, settings: Any, no_chart: Any) -> None:
    settings.WEEKLY_REPORT_RECIPIENTS = ["cio@example.com"]

    def run(*args: str) -> str:
        out = io.StringIO()
        with time_machine.travel(EXAMPLE_NOW, tick=False):
            call_command("send_weekly_report", *args, stdout=out)
        return out.getvalue().strip().splitlines()[-1]

    assert run() == "sent 2026-W10 to 1 recipient(s), without chart"  # last complete week
    assert run("--week", "2026-W10").startswith("2026-W10 was already delivered")
    assert run("--to", "me@example.com", "--week", "2026-W10") == (
        "sent 2026-W10 to 1 recipient(s), without chart"
    )
    assert run("--to", "me@example.com", "--week", "2026-W10").startswith("2026-W10 was already")
    assert [m.to for m in mail.outbox] == [["cio@example.com"], ["me@example.com"]]
    for bad in (["--week", "2026-W99"], ["--week", "2026-W11"], ["--to", "not-an-address"]):
        with pytest.raises(CommandError):
            run(*bad)
    settings.WEEKLY_REPORT_RECIPIENTS = []
    assert run("--week", "2026-W09").endswith("WEEKLY_REPORT_RECIPIENTS is empty")


def test_break_even_per_pool_at_its_fleet_file_workload(example_week: Any, no_chart: Any) -> None:
    """Each pool's break-even is computed at its workload from the fleet file (else the
    product's defaults), and the email says which workload each line is at."""
    from decimal import Decimal

    from billing import selectors
    from billing.formatting import pct
    from fleet.models import Pool

    Pool.objects.filter(name="inference").update(
        breakeven={"tokens_per_s_per_gpu": 1000.0, "api_price_per_mtok": "0.60"}
    )
    Pool.objects.create(name="batch")  # no GPUs, no workload of its own: the defaults
    data = report.weekly_report_build(week_start=WEEK, now=EXAMPLE_NOW)
    by_pool = {p.pool: p for p in data.pools}
    assert data.breakeven_assumptions == ""  # the pools' workloads differ
    # 1,000 tokens/s at 0.60 blended; the defaults: 2,000 at 0.75 × 0.20 + 0.25 × 0.80 = 0.35.
    assert by_pool["inference"].workload == (
        "1,000 tokens/s per GPU, API 0.600 USD per million tokens"
    )
    assert by_pool["batch"].workload == "2,000 tokens/s per GPU, API 0.350 USD per million tokens"
    assert by_pool["batch"].status == "idle"
    at_workload = selectors.breakeven_compute(
        pool="inference",
        start=WEEK,
        end=WEEK + dt.timedelta(days=7),
        tokens_per_s=1000.0,
        api_price_per_mtok=Decimal("0.60"),
        api_input_price_per_mtok=None,
        api_output_price_per_mtok=None,
        output_share=None,
        now=EXAMPLE_NOW,
    )
    u_star = pct(at_workload.breakeven_utilization)
    assert by_pool["inference"].breakeven == u_star != "33.5 %"  # 33.5 % at the defaults
    text = report.weekly_report_render(data, with_chart=False).text
    assert (
        "- inference (at 1,000 tokens/s per GPU, API 0.600 USD per million tokens): "
        f"utilisation 37.5 %, break-even {u_star}"
    ) in text


def test_the_renderers_chatter_and_ignored_message_error_stay_out_of_the_log(
    caplog: Any,
) -> None:
    """kaleido and choreographer log every step of a render at INFO, and choreographer logs
    a browser message it then ignores as an ERROR with a traceback: after the first render
    (or ``renderer_logs_quiet``) neither reaches the log."""
    import logging

    report_chart.renderer_logs_quiet()
    caplog.set_level(logging.INFO)
    logging.getLogger("kaleido.kaleido").info("Conforming 1 to file:///tmp/x/index.html")
    logging.getLogger("choreographer.browser_async").info("Opening browser.")
    pipe = logging.getLogger("choreographer.channels.pipe")
    try:
        raise ValueError("Expecting value: line 1 column 1 (char 0)")
    except ValueError:
        pipe.exception("JSONError decoding message. Ignoring")
    pipe.error("a real pipe error")  # other errors still get through
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("choreographer.channels.pipe", "ERROR", "a real pipe error")
    ]


def test_a_real_render_logs_nothing_below_warning(caplog: Any, monkeypatch: Any) -> None:
    import logging
    from decimal import Decimal
    from types import SimpleNamespace

    if report_chart.chromium_path() is None:
        pytest.skip("no Chromium here")
    caplog.set_level(logging.INFO)
    row = SimpleNamespace(
        period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC),
        idle_cost=Decimal("12.5"),
        utilization=0.4,
    )
    png = report_chart.trend_png([row], currency="USD")  # type: ignore[list-item]
    assert png is not None and png.startswith(report_chart.PNG_MAGIC)
    noisy = [r for r in caplog.records if r.name.split(".")[0] in report_chart.RENDERER_LOGGERS]
    assert not noisy, [(r.name, r.levelname, r.getMessage()) for r in noisy]
    # The same figure again comes from the cache: no browser at all.
    started: list[str] = []
    monkeypatch.setattr(report_chart, "render_png", lambda fig, browser: started.append(browser))
    assert report_chart.trend_png([row], currency="USD") == png  # type: ignore[list-item]
    assert not started


def test_an_adjustment_row_says_which_month_it_adjusts(worked_example: Any) -> None:
    """March closed on 5 April, then the site's tariff raised from 0.20 to 0.50 per kWh: the
    week of Monday 30 March carries the repricing of March as its own team row, booked on
    1 April. Its idle cost by hand: March's idle energy 0.95 kWh × 1.5 × (0.50 − 0.20) =
    0.4275 → 0.43. The email names it as an adjustment, the dashboard's wording."""
    from decimal import Decimal

    from fleet.models import Site

    with time_machine.travel(at("2026-04-05T12"), tick=False):
        call_command("close_month", "2026-03", "--by", "alice", stdout=io.StringIO())
    # Changed with SQL, which marks nothing: booked by the run that checks every closed month.
    Site.objects.filter(name="fra1").update(price_per_kwh=Decimal("0.50"))
    call_command("adjust_closed", "--all", stdout=io.StringIO())
    data = report.weekly_report_build(week_start=dt.date(2026, 3, 30), now=at("2026-04-06T00"))
    labels = [(b.label, b.idle_cost) for b in data.top_teams]
    assert ("research (adjustment for 2026-03)", "0.43 USD") in labels
    assert [label for label, _ in labels].count("research") == 1
    rendered = report.weekly_report_render(data, with_chart=False)
    assert ". research (adjustment for 2026-03): idle 0.43 USD of " in rendered.text
    assert ">research (adjustment for 2026-03)<br>" in rendered.html
