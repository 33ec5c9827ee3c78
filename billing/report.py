"""The weekly email report: what it says (``weekly_report_build``), how it looks
(``weekly_report_render``) and how it is delivered exactly once (``weekly_report_send``).

Every figure comes from ``billing.selectors`` and is formatted by the finance API's own
functions (``billing.api.serializers``), so the email, the API and the dashboard agree to the
cent for the same week.

Exactly once: each (ISO week, audience) has one ``WeeklyReport`` row. A sender first claims it
with a compare-and-swap, ``UPDATE … SET claimed_at = now WHERE sent_at IS NULL AND (claimed_at
IS NULL OR claimed_at < now − 1 h)``, and sends only if that changed exactly one row (the
pattern healthchecks uses for its monthly reports). Two beat processes, a retried task and a
second ``send_weekly_report`` therefore send it once. A claim whose sender died is taken over
after an hour; a failure before the first message went out releases the claim for a retry.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from email.mime.image import MIMEImage
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from billing import breakeven as be
from billing import report_chart, selectors
from billing.formatting import MISSING, money, pct
from billing.models import WeeklyReport
from billing.selectors.queue import QueueOverview, queue_overview
from config.replica import replica_reads
from fleet.bounds import date_error
from fleet.emails import recipient_error
from fleet.models import FleetSettings, Gpu, Pool

logger = logging.getLogger(__name__)

WEEK_RE = re.compile(r"^(\d{4})-W(\d{2})$")
TOP_N = 10
TREND_WEEKS = 4
# A claim older than this belongs to a sender that died mid-way: take it over.
CLAIM_TIMEOUT = dt.timedelta(hours=1)
CHART_CID = "trend-chart@gpufleet"


# --- weeks ------------------------------------------------------------------------------------


def week_label(week_start: dt.date) -> str:
    year, week, _ = week_start.isocalendar()
    return f"{year}-W{week:02d}"


def week_parse(value: str) -> dt.date:
    """``2026-W45`` → the Monday of that ISO week; ValueError for anything else."""
    match = WEEK_RE.match(value.strip())
    if not match:
        raise ValueError(f"week: expected YYYY-Www (e.g. 2026-W45), got {value!r}")
    try:
        monday = dt.date.fromisocalendar(int(match[1]), int(match[2]), 1)
    except ValueError as exc:
        raise ValueError(f"week: no such ISO week {value!r}") from exc
    error = date_error(monday) or date_error(monday + dt.timedelta(days=6))
    if error is not None:
        raise ValueError(f"week: {value!r} is outside the report dates: {error}")
    return monday


def week_ended(value: str | None) -> dt.date:
    """A command's ``--week``: that ISO week's Monday, which must have ended in the report
    time zone; without a value, the last complete week. ValueError naming ``week``."""
    if not value:
        return last_complete_week()
    week_start = week_parse(value)
    local, _ = report_now()
    if week_start + dt.timedelta(weeks=1) > local.date():
        raise ValueError(
            f"week: {week_label(week_start)} has not ended yet in the report time zone"
        )
    return week_start


def report_now(now: dt.datetime | None = None) -> tuple[dt.datetime, ZoneInfo]:
    zone = FleetSettings.load().report_zone
    return (now or timezone.now()).astimezone(zone), zone


def last_complete_week(now: dt.datetime | None = None) -> dt.date:
    """Monday of the last ISO week that has ended, in the report time zone."""
    local, _ = report_now(now)
    this_monday = local.date() - dt.timedelta(days=local.weekday())
    return this_monday - dt.timedelta(weeks=1)


def week_due(now: dt.datetime | None = None) -> dt.date | None:
    """The week the beat job should deliver now: last week, once this week's configured
    weekday and hour (report time zone) have come. ``None`` before that moment.

    Checked every hour, so a beat that was down at the configured hour catches up at the
    next one; the compare-and-swap keeps it to one delivery.
    """
    local, zone = report_now(now)
    this_monday = local.date() - dt.timedelta(days=local.weekday())
    due_at = dt.datetime.combine(
        this_monday + dt.timedelta(days=settings.WEEKLY_REPORT_WEEKDAY % 7),
        dt.time(hour=min(max(settings.WEEKLY_REPORT_HOUR, 0), 23)),
        tzinfo=zone,
    )
    if local < due_at:
        return None
    return this_monday - dt.timedelta(weeks=1)


# --- content ----------------------------------------------------------------------------------


@dataclass
class Headline:
    """One headline figure, this week against last."""

    label: str
    value: str
    previous: str
    change: str  # "+2.5 pp", "−12.0 %", "–" (MISSING)
    trend: str  # "up", "down" or "" (flat / not comparable)
    good: bool | None  # whether the change is good news (None: neutral)


def _change(
    current: float | Decimal | None,
    previous: float | Decimal | None,
    *,
    points: bool = False,
    higher_is_better: bool | None = None,
) -> tuple[str, str, bool | None]:
    if current is None or previous is None:
        return MISSING, "", None
    cur, prev = float(current), float(previous)
    if points:  # utilisation: the change in percentage points is what people compare
        delta = (cur - prev) * 100
        text = f"{delta:+.1f} pp"
    else:
        if prev == 0:
            return ("new" if cur else MISSING), ("up" if cur else ""), None
        delta = (cur - prev) / abs(prev) * 100
        text = f"{delta:+.1f} %"
    if round(delta, 1) == 0:
        return text.replace("+", "±").replace("-", "±"), "", None
    trend = "up" if delta > 0 else "down"
    good = None if higher_is_better is None else (delta > 0) == higher_is_better
    return text.replace("-", "−"), trend, good


def _headline(
    label: str,
    value: str,
    previous: str,
    current_raw: Any,
    previous_raw: Any,
    **kwargs: Any,
) -> Headline:
    change, trend, good = _change(current_raw, previous_raw, **kwargs)
    return Headline(label, value, previous, change, trend, good)


def headlines(row: selectors.CostRow, prev: selectors.CostRow) -> list[Headline]:
    cur = row.currency
    return [
        _headline(
            "Utilisation",
            pct(row.utilization),
            pct(prev.utilization),
            row.utilization,
            prev.utilization,
            points=True,
            higher_is_better=True,
        ),
        _headline(
            "Hours in the air per GPU per day",
            _hours(row.hours_in_air_per_day),
            _hours(prev.hours_in_air_per_day),
            row.hours_in_air_per_day,
            prev.hours_in_air_per_day,
            higher_is_better=True,
        ),
        _headline(
            "Total cost",
            money(row.total_cost, cur),
            money(prev.total_cost, cur),
            row.total_cost,
            prev.total_cost,
        ),
        _headline(
            "Idle cost",
            money(row.idle_cost, cur),
            money(prev.idle_cost, cur),
            row.idle_cost,
            prev.idle_cost,
            higher_is_better=False,
        ),
        _headline(
            "Cost per air hour",
            money(row.cost_per_air_hour, cur),
            money(prev.cost_per_air_hour, cur),
            row.cost_per_air_hour,
            prev.cost_per_air_hour,
            higher_is_better=False,
        ),
        _headline(
            "Energy",
            f"{row.energy_kwh:,.2f} kWh",
            f"{prev.energy_kwh:,.2f} kWh",
            row.energy_kwh,
            prev.energy_kwh,
        ),
        _headline(
            "CO2e",
            f"{row.co2e_kg:,.2f} kg",
            f"{prev.co2e_kg:,.2f} kg",
            row.co2e_kg,
            prev.co2e_kg,
            higher_is_better=False,
        ),
    ]


def work_line(row: selectors.CostRow) -> str:
    """The week's real work in one line (docs/metrics.md, "Work"): how much of the profiled
    time the SMs worked and what an hour of it cost, or that no GPU sent profiling data."""
    if row.work_utilization is None or row.work_hours is None:
        return (
            "Real work: no profiling data (no GPU reports SM activity through NVML GPM or "
            "dcgm-exporter)."
        )
    return (
        f"Real work: the SMs worked {pct(row.work_utilization)} of the "
        f"{row.profiled_hours:,.1f} GPU-hours profiled ({row.work_hours:,.1f} work hours); "
        f"cost per work hour {money(row.cost_per_work_hour, row.currency)}."
    )


def queue_line(queue: QueueOverview | None, currency: str) -> str:
    """The week's queue pressure in one line (docs/metrics.md, "Queue pressure"); empty where
    no queue collector reported a pending GPU job in the week."""
    if queue is None:
        return ""
    line = f"Queue: jobs waited {queue.waited_gpu_hours:,.1f} GPU-hours for capacity"
    if not queue.wanted_gpu_hours:
        return line + ", none of them while GPUs of their partitions sat held or parked."
    cost = "" if queue.wanted_cost is None else f" (cost {money(queue.wanted_cost, currency)})"
    return (
        f"{line}, {queue.wanted_gpu_hours:,.1f} of them while as many GPUs of their "
        f"partitions sat held or parked{cost}."
    )


def _hours(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f} h"


@dataclass
class BarRow:
    """A table row with a bar: the row, its share of the largest value (0–100)."""

    row: selectors.CostRow
    bar_pct: int
    idle_cost: str
    total_cost: str
    utilization: str
    extra: str = ""

    @property
    def label(self) -> str:
        """The row's name; a row of late data for a closed month says which month it adjusts
        ("research (adjustment for 2026-10)", the dashboard's wording), so it does not read
        as the same team or GPU listed twice."""
        if self.row.adjustment_for:
            return f"{self.row.name} (adjustment for {self.row.adjustment_for})"
        return self.row.name


def _bars(rows: Sequence[selectors.CostRow], *, value: Any, currency: str) -> list[BarRow]:
    top = max((float(value(r)) for r in rows), default=0.0)
    out = []
    for r in rows:
        share = float(value(r)) / top if top > 0 else 0.0
        out.append(
            BarRow(
                row=r,
                # Never 0 %: Outlook draws a zero-width cell at its content width.
                bar_pct=max(1, min(100, round(share * 100))),
                idle_cost=money(r.idle_cost, currency),
                total_cost=money(r.total_cost, currency),
                utilization=pct(r.utilization),
            )
        )
    return out


@dataclass
class PoolStatus:
    pool: str
    utilization: str
    breakeven: str
    # "own" (owning pays), "rent" (a rented pool: renting beats the API), "api" (the API would
    # be cheaper), "never", "idle"
    status: str
    verdict: str
    savings_per_month: str
    workload: str = ""  # the workload and API price it was computed at (fleet file)


@dataclass
class OfflineGpu:
    name: str
    uuid: str
    offline_hours: float
    offline_now: bool
    last_seen: str


@dataclass
class WeeklyReportData:
    week: str
    week_start: dt.date
    week_end: dt.date  # exclusive
    currency: str
    row: selectors.CostRow  # the fleet over the week
    previous: selectors.CostRow  # the fleet over the week before
    gpus_in_service: int
    gpus_offline_now: int
    headlines: list[Headline]
    top_gpus: list[BarRow]
    top_teams: list[BarRow]
    throttled_gpus: list[BarRow]
    throttle_reasons: list[tuple[str, str]]
    pools: list[PoolStatus]
    offline: list[OfflineGpu]
    trend: list[selectors.CostRow]  # daily fleet rows for the trend chart
    breakeven_assumptions: str = ""
    work: str = ""  # work_line of the week
    queue: str = ""  # queue_line of the week ("" without a queue collector)
    dashboard_url: str = ""
    subscription_url: str = ""
    subject: str = ""

    @property
    def last_day(self) -> dt.date:
        return self.week_end - dt.timedelta(days=1)


def _pool_statuses(
    *, start: dt.date, end: dt.date, now: dt.datetime
) -> tuple[list[PoolStatus], str]:
    """Break-even of every pool over the week, at the pool's workload (the break-even page's
    defaults: the fleet file's, else the product's), so the email and that page agree.
    Returns the statuses and the workload they share ("" when pools differ: each then
    carries its own)."""
    from billing.forms import BreakevenForm

    statuses: list[PoolStatus] = []
    for pool in Pool.objects.order_by("name").values_list("name", flat=True):
        form = BreakevenForm(BreakevenForm.initial_query(pool, start=start, end=end))
        if not form.is_valid():
            continue
        # what the pool's training loops measured, where they reported (the form's default)
        _, measured = selectors.breakeven_workload_measured(pool=pool, start=start, end=end)
        d = form.cleaned_data
        blended = d.get("price_mode") == "blended"
        try:
            result = selectors.breakeven_compute(
                pool=pool,
                start=start,
                end=end,
                tokens_per_s=d["tokens_per_s"],
                api_price_per_mtok=d.get("api_price_per_mtok") if blended else None,
                api_input_price_per_mtok=None if blended else d["api_input_price_per_mtok"],
                api_output_price_per_mtok=None if blended else d["api_output_price_per_mtok"],
                output_share=None if blended else d["output_share"],
                now=now,
            )
        except (LookupError, ValueError):
            logger.warning("weekly report: break-even of pool %s failed", pool, exc_info=True)
            continue
        cur = result.currency
        workload = (
            f"{d['tokens_per_s']:,.0f} tokens/s per GPU"
            f"{' (measured by its jobs)' if measured is not None else ''}, API "
            f"{money(result.api_price_per_mtok, cur, places=3)} per million tokens"
        )
        u, u_star = result.utilization, result.breakeven_utilization
        if not result.capacity_hours or u is None:
            status, verdict = "idle", "no GPU in service this week"
        elif u_star is None:
            status, verdict = "never", "the API is cheaper at any utilisation"
        elif u >= u_star and result.comparison == be.RENTED:
            status, verdict = "rent", "renting beats the API"
        elif u >= u_star:
            status, verdict = "own", "owning pays off"
        else:
            status, verdict = "api", "the API would have been cheaper"
        statuses.append(
            PoolStatus(
                pool=pool,
                utilization=pct(u),
                breakeven=pct(u_star),
                status=status,
                verdict=verdict,
                savings_per_month=money(result.savings_per_month, cur),
                workload=workload,
            )
        )
    workloads = {p.workload for p in statuses}
    return statuses, (workloads.pop() if len(workloads) == 1 else "")


def _offline(
    gpu_rows: Sequence[selectors.CostRow], *, now: dt.datetime, zone: ZoneInfo
) -> list[OfflineGpu]:
    """GPUs that were offline during the week (most hours first), and whether they still are."""
    rows = sorted(
        (r for r in gpu_rows if r.offline_hours > 0), key=lambda r: (-r.offline_hours, r.key)
    )[:TOP_N]
    seen = dict(
        Gpu.objects.filter(uuid__in=[r.key for r in rows]).values_list("uuid", "last_seen_at")
    )
    out = []
    for r in rows:
        last = seen.get(r.key)
        out.append(
            OfflineGpu(
                name=r.name,
                uuid=r.key,
                offline_hours=round(r.offline_hours, 1),
                offline_now=selectors.offline_now(last, now),
                last_seen=last.astimezone(zone).strftime("%Y-%m-%d %H:%M") if last else "never",
            )
        )
    return out


@replica_reads
def weekly_report_build(*, week_start: dt.date, now: dt.datetime | None = None) -> WeeklyReportData:
    """Everything the report says about the ISO week starting ``week_start`` (a Monday). It
    only reads: from the read replica, where one is set and healthy."""
    now = now or timezone.now()
    _, zone = report_now(now)
    end = week_start + dt.timedelta(weeks=1)
    prev_start = week_start - dt.timedelta(weeks=1)
    summary = selectors.fleet_summary(start=week_start, end=end, now=now)
    previous = selectors.fleet_summary(start=prev_start, end=week_start, now=now)
    row, cur = summary.row, summary.row.currency

    # GPUs and teams from one computation over the week's rollups.
    grouped = selectors.cost_rows_by(
        start=week_start, end=end, group_bys=("gpu", "team"), period="all", now=now
    )
    gpu_rows, team_rows = grouped["gpu"], grouped["team"]
    by_idle = sorted(gpu_rows, key=lambda r: (-r.idle_cost, r.key))
    by_idle = [r for r in by_idle if r.idle_cost > 0][:TOP_N]
    teams = sorted(team_rows, key=lambda r: (-r.idle_cost, r.key))
    teams = [r for r in teams if r.idle_cost > 0][:TOP_N]
    throttled = sorted(
        (r for r in gpu_rows if r.throttled_hours > 0), key=lambda r: (-r.throttled_hours, r.key)
    )[:5]
    throttled_bars = _bars(throttled, value=lambda r: r.throttled_hours, currency=cur)
    for bar in throttled_bars:
        bar.extra = f"{bar.row.throttled_hours:.1f} h"
    reasons = [
        ("Power cap", f"{row.throttled_power_cap_hours:.1f} h"),
        ("Thermal", f"{row.throttled_thermal_hours:.1f} h"),
        ("Hardware slowdown", f"{row.throttled_hw_slowdown_hours:.1f} h"),
        ("Other", f"{row.throttled_other_hours:.1f} h"),
    ]
    pools, assumptions = _pool_statuses(start=week_start, end=end, now=now)
    trend = selectors.cost_rows(
        start=end - dt.timedelta(weeks=TREND_WEEKS),
        end=end,
        group_by="fleet",
        period="day",
        now=now,
    )
    data = WeeklyReportData(
        week=week_label(week_start),
        week_start=week_start,
        week_end=end,
        currency=cur,
        row=row,
        previous=previous.row,
        gpus_in_service=summary.gpus_in_service,
        gpus_offline_now=summary.gpus_offline_now,
        headlines=headlines(row, previous.row),
        top_gpus=_bars(by_idle, value=lambda r: r.idle_cost, currency=cur),
        top_teams=_bars(teams, value=lambda r: r.idle_cost, currency=cur),
        throttled_gpus=throttled_bars,
        throttle_reasons=reasons,
        pools=pools,
        offline=_offline(gpu_rows, now=now, zone=zone),
        trend=trend,
        breakeven_assumptions=assumptions,
        work=work_line(row),
        queue=queue_line(
            queue_overview(
                start=week_start,
                end=end,
                zone_name=FleetSettings.load().report_time_zone,
                money=True,
            ),
            cur,
        ),
        dashboard_url=settings.SITE_URL + reverse("overview"),
        subscription_url=settings.SITE_URL + reverse("weekly-report-subscription"),
    )
    data.subject = (
        render_to_string("emails/weekly_report.subject.txt", {"r": data, "h": data.headlines})
        .strip()
        .replace("\n", " ")
    )
    return data


# --- rendering --------------------------------------------------------------------------------


@dataclass
class Rendered:
    subject: str
    text: str
    html: str
    chart_png: bytes | None


def weekly_report_render(
    data: WeeklyReportData,
    *,
    with_chart: bool = True,
    inline_chart_src: Callable[[bytes], str] | None = None,
) -> Rendered:
    """Subject, plain text and HTML. The HTML shows the chart from ``cid:`` (email) or from
    ``inline_chart_src`` (a data: URI, for the browser preview)."""
    png = report_chart.trend_png(data.trend, currency=data.currency) if with_chart else None
    chart_src = None
    if png is not None:
        chart_src = inline_chart_src(png) if inline_chart_src else f"cid:{CHART_CID}"
    context = {"r": data, "h": data.headlines, "chart_src": chart_src, "subject": data.subject}
    return Rendered(
        subject=data.subject,
        text=render_to_string("emails/weekly_report.txt", context),
        html=render_to_string("emails/weekly_report.html", context),
        chart_png=png,
    )


def weekly_report_messages(
    rendered: Rendered, recipients: Sequence[str]
) -> list[EmailMultiAlternatives]:
    """One message per recipient (nobody sees the list): multipart/alternative text + HTML,
    wrapped in multipart/related with the chart as an inline image when there is one."""
    messages = []
    for address in recipients:
        message = EmailMultiAlternatives(
            subject=rendered.subject,
            body=rendered.text,
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=[address],
        )
        message.attach_alternative(rendered.html, "text/html")
        if rendered.chart_png is not None:
            message.mixed_subtype = "related"  # type: ignore[attr-defined]
            image = MIMEImage(rendered.chart_png, "png")
            image.add_header("Content-ID", f"<{CHART_CID}>")
            image.add_header("Content-Disposition", "inline", filename="trend.png")
            message.attach(image)
        messages.append(message)
    return messages


# --- delivery ---------------------------------------------------------------------------------


def weekly_report_recipients() -> list[str]:
    """Users who opted in and may see money (finance, admin: the report shows costs), then
    ``WEEKLY_REPORT_RECIPIENTS``; each address once, case-insensitively. An address the one
    recipient rule refuses (``fleet.emails.recipient_error``) is left out and logged."""
    users = (
        get_user_model()
        .objects.filter(report_subscription__opted_in=True, is_active=True)
        .exclude(email="")
        .order_by("pk")
    )
    addresses = [u.email for u in users if u.has_perm("fleet.view_costs")]
    addresses += list(settings.WEEKLY_REPORT_RECIPIENTS)
    seen: dict[str, str] = {}
    for address in addresses:
        address = address.strip()
        if not address or address.lower() in seen:
            continue
        error = recipient_error(address)
        if error is not None:
            logger.warning("weekly report: not sent to %s", error)
            continue
        seen[address.lower()] = address
    return list(seen.values())


def claim_take(model: Any, pk: int) -> dt.datetime | None:
    """The compare-and-swap of an exactly-once delivery row (``claimed_at``, ``sent_at``): of
    all the senders that get here, one changes the row and gets its claim time; the others
    get None. A claim older than ``CLAIM_TIMEOUT`` belongs to a sender that died: taken over.
    """
    claimed_at = timezone.now()
    claimed = (
        model.objects.filter(pk=pk, sent_at__isnull=True)
        .filter(Q(claimed_at__isnull=True) | Q(claimed_at__lt=claimed_at - CLAIM_TIMEOUT))
        .update(claimed_at=claimed_at)
    )
    return claimed_at if claimed == 1 else None


def claim_release(model: Any, pk: int, claimed_at: dt.datetime) -> None:
    """Give a claim back (nothing went out), so that a retry sends it."""
    model.objects.filter(pk=pk, claimed_at=claimed_at, sent_at__isnull=True).update(claimed_at=None)


@dataclass
class SendResult:
    week: str
    status: str  # "sent", "already_sent", "in_progress", "no_recipients", "not_due"
    recipients: int = 0
    with_chart: bool = False
    sent_at: dt.datetime | None = None

    @property
    def message(self) -> str:
        if self.status == "sent":
            chart = "with" if self.with_chart else "without"
            return f"sent {self.week} to {self.recipients} recipient(s), {chart} chart"
        if self.status == "already_sent":
            when = self.sent_at.isoformat() if self.sent_at else "earlier"
            return f"{self.week} was already delivered ({when}); not sent again"
        if self.status == "in_progress":
            return f"{self.week} is being sent by another process; not sent again"
        if self.status == "no_recipients":
            return f"{self.week} not sent: nobody opted in and WEEKLY_REPORT_RECIPIENTS is empty"
        return "no report due now"


def weekly_report_send(
    *, week_start: dt.date, to: str | None = None, now: dt.datetime | None = None
) -> SendResult:
    """Deliver the week's report once: to the list, or (``to``) once to that one address."""
    week = week_label(week_start)
    audience = (to or "").strip().lower()
    recipients = [to.strip()] if to else weekly_report_recipients()
    if not recipients:
        return SendResult(week, "no_recipients")
    report, _ = WeeklyReport.objects.get_or_create(
        week=week, audience=audience, defaults={"week_start": week_start}
    )
    if report.sent_at is not None:
        return SendResult(week, "already_sent", report.recipients_count, sent_at=report.sent_at)

    claimed_at = claim_take(WeeklyReport, report.pk)
    if claimed_at is None:
        report.refresh_from_db()
        if report.sent_at is not None:
            return SendResult(week, "already_sent", report.recipients_count, sent_at=report.sent_at)
        return SendResult(week, "in_progress")

    sent = 0
    try:
        rendered = weekly_report_render(weekly_report_build(week_start=week_start, now=now))
        messages = weekly_report_messages(rendered, recipients)
        with get_connection(fail_silently=False) as connection:
            for message in messages:
                try:
                    sent += connection.send_messages([message]) or 0
                except Exception:
                    if sent == 0:
                        raise  # nothing went out: release the claim below, a retry sends all
                    # Some went out: a retry would send those twice, so count this week as
                    # delivered and log who missed it.
                    logger.exception("weekly report %s: sending to %s failed", week, message.to)
    except BaseException:
        claim_release(WeeklyReport, report.pk, claimed_at)
        raise
    sent_at = timezone.now()
    WeeklyReport.objects.filter(pk=report.pk).update(
        sent_at=sent_at,
        recipients_count=sent,
        subject=rendered.subject[:255],
        with_chart=rendered.chart_png is not None,
    )
    logger.info("weekly report %s sent to %d recipient(s)", week, sent)
    return SendResult(week, "sent", sent, rendered.chart_png is not None, sent_at)


def weekly_report_send_due(*, now: dt.datetime | None = None) -> SendResult:
    """What the hourly beat job does: deliver last week's report to the list if it is due."""
    week_start = week_due(now)
    if week_start is None:
        return SendResult("", "not_due")
    done = WeeklyReport.objects.filter(
        week=week_label(week_start), audience="", sent_at__isnull=False
    ).first()
    if done is not None:
        return SendResult(done.week, "already_sent", done.recipients_count, sent_at=done.sent_at)
    return weekly_report_send(week_start=week_start, now=now)
