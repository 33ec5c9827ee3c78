"""The weekly digest per workload user (docs/alerts.md, "Weekly digest"): "your workloads
last week": GPU hours, the share of them held without computing, and what they cost.

Who gets it: the users the fleet file's ``[[people]]`` maps to an address with ``digest`` on
(on by default for a listed person, off by default for the domain rule), who had workloads
in that week. Sent beside the weekly report, at the same weekday and hour (report time zone).

Every figure comes from ``billing.workloads.workload_figures`` (the Workloads page's and the
finance API's), for the week's local days. Exactly once per (ISO week, user): a ``Digest`` row
claimed with the weekly report's compare-and-swap (``billing.report.claim_take``), so a
retried task, two beat processes and the command send it once.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import urlencode

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from alerts.models import Digest
from alerts.people import people_directory
from billing.formatting import money
from billing.report import claim_release, claim_take, week_due, week_label
from billing.workloads import WorkloadFilters, WorkloadRow, workload_figures

logger = logging.getLogger(__name__)

TOP_N = 10  # workloads listed by name; the rest are in the totals


def percent(share: float | None) -> str:
    return "no hours" if share is None else f"{share * 100:.0f} %"


@dataclass(frozen=True)
class DigestLine:
    label: str
    gpu_hours: float
    held_share: float | None
    cost: str
    idle_cost: str
    url: str

    @property
    def held_text(self) -> str:
        return percent(self.held_share)


@dataclass(frozen=True)
class DigestData:
    user: str
    week: str
    week_start: dt.date
    workloads: int
    gpu_hours: float
    held_hours: float
    held_share: float | None  # held hours / GPU hours
    cost: str
    idle_cost: str
    lines: list[DigestLine]
    more: int  # workloads beyond the listed ones
    url: str  # the Workloads page for this user and week

    @property
    def held_text(self) -> str:
        return percent(self.held_share)

    @property
    def subject(self) -> str:
        return (
            f"[gpufleet] Your GPU week {self.week}: {self.gpu_hours:,.1f} GPU h, "
            f"{self.held_text} held idle"
        )


def _page(name: str, args: list[int] | None, query: dict[str, str]) -> str:
    try:
        path = reverse(name, args=args)
    except NoReverseMatch:
        path = reverse("overview")
    return f"{settings.SITE_URL}{path}?{urlencode(query)}"


def _share(held: float, total: float) -> float | None:
    return held / total if total > 0 else None


def _label(row: WorkloadRow) -> str:
    parts = [f"{row.kind} {row.key}" if row.kind else row.key]
    if row.name and row.name != row.key:
        parts.append(row.name)
    return " · ".join(parts)


def digest_build(*, user: str, week_start: dt.date) -> DigestData | None:
    """The user's week, or None when they held no GPU in it."""
    end = week_start + dt.timedelta(days=7)
    rows = workload_figures(
        start=week_start, end=end, group_by="workload", filters=WorkloadFilters(users=(user,))
    )
    rows = [r for r in rows if r.gpu_hours > 0]
    if not rows:
        return None
    currency = rows[0].currency
    dates = {"from": week_start.isoformat(), "to": (end - dt.timedelta(days=1)).isoformat()}
    gpu_hours = sum(r.gpu_hours for r in rows)
    held_hours = sum(r.held_hours for r in rows)
    lines = [
        DigestLine(
            label=_label(r),
            gpu_hours=r.gpu_hours,
            held_share=_share(r.held_hours, r.gpu_hours),
            cost=money(r.cost, currency),
            idle_cost=money(r.idle_cost, currency),
            url=_page("workload-detail", [r.workload_pk] if r.workload_pk else None, dates),
        )
        for r in rows[:TOP_N]  # worst idle cost first
    ]
    return DigestData(
        user=user,
        week=week_label(week_start),
        week_start=week_start,
        workloads=len(rows),
        gpu_hours=gpu_hours,
        held_hours=held_hours,
        held_share=_share(held_hours, gpu_hours),
        cost=money(sum((r.cost for r in rows), Decimal(0)), currency),
        idle_cost=money(sum((r.idle_cost for r in rows), Decimal(0)), currency),
        lines=lines,
        more=max(len(rows) - TOP_N, 0),
        url=_page("workloads", None, {**dates, "user": user}),
    )


def _message(data: DigestData, address: str) -> EmailMultiAlternatives:
    context = {"d": data}
    message = EmailMultiAlternatives(
        subject=" ".join(data.subject.split()),
        body=render_to_string("alerts/email/digest.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[address],
    )
    message.attach_alternative(render_to_string("alerts/email/digest.html", context), "text/html")
    return message


def digest_send(*, user: str, week_start: dt.date, address: str) -> str:
    """One user's digest of one week, once: ``sent``, ``already_sent``, ``in_progress`` or
    ``nothing`` (no workloads that week)."""
    week = week_label(week_start)
    row, _ = Digest.objects.get_or_create(
        week=week, user=user, defaults={"week_start": week_start, "email": address}
    )
    if row.sent_at is not None:
        return "already_sent"
    claimed_at = claim_take(Digest, row.pk)
    if claimed_at is None:
        row.refresh_from_db()
        return "already_sent" if row.sent_at is not None else "in_progress"
    try:
        data = digest_build(user=user, week_start=week_start)
        if data is not None:
            with get_connection(fail_silently=False) as connection:
                connection.send_messages([_message(data, address)])
    except BaseException:
        claim_release(Digest, row.pk, claimed_at)
        raise
    Digest.objects.filter(pk=row.pk).update(sent_at=timezone.now(), email=address)
    return "sent" if data is not None else "nothing"


def digest_users(*, week_start: dt.date) -> list[tuple[str, str]]:
    """(user, address) of everyone due a digest for the week: a workload in it, the digest
    on, an address known."""
    people = people_directory()
    users = workload_figures(
        start=week_start, end=week_start + dt.timedelta(days=7), group_by="user"
    )
    out = []
    for row in users:
        user = row.user or ""
        address = people.email(user)
        if address is not None and people.digest(user) and row.gpu_hours > 0:
            out.append((user, address))
    return sorted(out)


def digests_send(*, week_start: dt.date) -> dict[str, int]:
    """Every digest of the week; one user's failure is logged and does not stop the rest
    (their claim is released, so the next hourly run retries them)."""
    counts: dict[str, int] = {}
    for user, address in digest_users(week_start=week_start):
        try:
            status = digest_send(user=user, week_start=week_start, address=address)
        except Exception:
            logger.exception(
                "digest %s for %s failed; retried next hour", week_label(week_start), user
            )
            status = "failed"
        counts[status] = counts.get(status, 0) + 1
    return counts


def digests_send_due(*, now: dt.datetime | None = None) -> str:
    """What the hourly beat job does: last week's digests once the weekly report is due."""
    week_start = week_due(now)
    if week_start is None:
        return "no digest due now"
    counts = digests_send(week_start=week_start)
    done = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "nobody due"
    return f"digests {week_label(week_start)}: {done}"
