"""What a notice says: the email (subject, text, HTML) and the webhook's JSON (docs/alerts.md),
both from one ``Notice`` built from a ``Delivery`` (the figures as they were when the notice
was decided) and its alert and rule.

Links are absolute (``SITE_URL``) and point at the page that explains the alert over its
window: the GPU's page, the fleet board filtered to the pool, team or site, or the overview.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse

from alerts import figures
from alerts.models import EVENT_REPEAT, EVENT_RESOLVED, FIRING, RESOLVED, Delivery
from alerts.rules import HOURS, MINUTES, MONEY, RULE_KINDS, SHARE, RuleKind, Window
from billing.formatting import MISSING, money

SIGNATURE_HEADER = "X-Gpufleet-Signature"


def slack_escape(text: str) -> str:
    """Text as Slack shows it literally: ``&``, ``<`` and ``>`` are its control characters
    (links, mentions such as ``<!channel>``) and become ``&amp;``, ``&lt;``, ``&gt;``, as
    Slack's formatting reference asks; nothing else is encoded (Slack would show it)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def value_text(value: Decimal | None, unit: str, currency: str = "") -> str:
    """A value or threshold as people read it, in the rule's unit."""
    if value is None:
        return MISSING
    if unit == MONEY:
        return money(value, currency)

    def half_up(number: Decimal, places: int) -> str:  # as money is rounded, never to even
        return f"{number.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP):,}"

    if unit == HOURS:
        return f"{half_up(value, 1)} h"
    if unit == MINUTES:
        return f"{half_up(value, 0)} min"
    if unit == SHARE:
        return f"{half_up(value * 100, 1)} %"
    return f"{value:,}"


def wire_value(value: Decimal | None, unit: str) -> Any:
    """A value in the webhook's JSON: money as a decimal string with cents (as the finance
    API sends money), everything else as a number."""
    if value is None:
        return None
    if unit == MONEY:
        return money(value)
    return float(value)


# --- links -----------------------------------------------------------------------------------
def _dates(window: Window) -> dict[str, str]:
    """The window as the dashboard's inclusive ``from``/``to`` days (report time zone); a
    window shorter than a day (an offline GPU's) shows the last two days."""
    zone = figures.report_zone()
    start = min(window.start, window.end - dt.timedelta(days=1))
    last = max(window.start, window.end - dt.timedelta(microseconds=1))
    return {
        "from": start.astimezone(zone).date().isoformat(),
        "to": last.astimezone(zone).date().isoformat(),
    }


def _gpu_page(name: str, dates: dict[str, str]) -> str:
    try:
        return f"{reverse('gpu-detail', args=[name])}?{urlencode(dates)}"
    except NoReverseMatch:  # a uuid no URL can hold: the board lists it
        return f"{reverse('fleet-board')}?{urlencode(dates)}"


def _board(kind: str) -> Callable[[str, dict[str, str]], str]:
    return lambda name, dates: f"{reverse('fleet-board')}?{urlencode({**dates, kind: name})}"


def _workload_page(name: str, dates: dict[str, str]) -> str:
    try:
        return f"{reverse('workload-detail', args=[int(name)])}?{urlencode(dates)}"
    except (NoReverseMatch, ValueError):
        return f"{reverse('overview')}?{urlencode(dates)}"


# subject kind → the page that explains an alert about such a subject (path and query).
SUBJECT_PAGES: dict[str, Callable[[str, dict[str, str]], str]] = {
    "gpu": _gpu_page,
    "workload": _workload_page,
    "pool": _board("pool"),
    "team": _board("team"),
    "site": _board("site"),
    "fleet": lambda name, dates: f"{reverse('overview')}?{urlencode(dates)}",
    # the Queue page by partition, worst first (the partition's row is among the first)
    "partition": lambda name, dates: (
        f"{reverse('queue-page')}?{urlencode({**dates, 'group_by': 'partition'})}"
    ),
}


def subject_path(subject: str, window: Window) -> str:
    kind, _, name = subject.partition(":")
    page = SUBJECT_PAGES.get(kind, SUBJECT_PAGES["fleet"])
    return page(name, _dates(window))


def absolute(path: str) -> str:
    return f"{settings.SITE_URL}{path}"


# --- the notice ------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadNote:
    """What a notice about a workload tells its owner besides the value: who and what it is,
    and what its idle time cost over the window."""

    kind: str
    key: str
    user: str
    name: str
    gpu_hours_text: str
    idle_cost_text: str | None  # None: not shown (no money for this workload)

    @property
    def what(self) -> str:
        words = {"slurm": "Slurm job", "k8s": "Kubernetes pod", "container": "container"}
        if self.kind == "user":
            return f"the GPU processes of {self.key}"
        named = f" ({self.name})" if self.name and self.name != self.key else ""
        return f"the {words.get(self.kind, self.kind)} {self.key}{named}"


@dataclass(frozen=True)
class Notice:
    delivery_id: int
    alert_id: int
    rule: str
    kind: RuleKind
    event: str
    state: str
    subject: str
    subject_label: str
    value: Decimal | None
    threshold: Decimal
    value_text: str
    threshold_text: str
    since: dt.datetime
    resolved_at: dt.datetime | None
    window: Window
    url: str
    alerts_url: str
    currency: str
    workload: WorkloadNote | None = None

    @property
    def headline(self) -> str:
        """One line: what fired, for whom, how much against what."""
        kind = self.kind
        relation = "above" if kind.above else "below"
        if self.state == RESOLVED:
            return (
                f"resolved {self.rule}: {self.subject_label} is at {self.value_text} "
                f"(threshold {self.threshold_text})"
            )
        word = "still firing" if self.event == EVENT_REPEAT else "firing"
        return (
            f"{word} {self.rule}: {self.subject_label} at {self.value_text}, "
            f"{relation} {self.threshold_text}"
        )

    @property
    def window_text(self) -> str:
        if self.window.start == self.window.end:
            return f"at {self.window.end:%Y-%m-%d %H:%M} UTC"
        return f"{self.window.start:%Y-%m-%d %H:%M} to {self.window.end:%Y-%m-%d %H:%M} UTC"

    @property
    def text(self) -> str:
        """Slack-compatible: mrkdwn bold and a ``<url|label>`` link. Every piece is escaped
        (``slack_escape``): a name holds what its GPU, node or workload was called, and
        ``<!channel>`` or ``<https://…|Sign in>`` in a workload's name must stay text."""
        icon = ":white_check_mark:" if self.state == RESOLVED else ":rotating_light:"
        what = f"{self.kind.what}; {self.window_text}; since {self.since:%Y-%m-%d %H:%M} UTC"
        return (
            f"{icon} *{slack_escape(self.headline)}* ({slack_escape(what)}) "
            f"<{slack_escape(self.url)}|details>"
        )


def notice_build(delivery: Delivery) -> Notice:
    alert = delivery.alert
    rule = alert.rule
    kind = RULE_KINDS[rule.kind]
    window = Window(
        delivery.window_start or alert.firing_since, delivery.window_end or alert.firing_since
    )
    currency = figures.currency()
    return Notice(
        delivery_id=delivery.pk,
        alert_id=alert.pk,
        rule=rule.name,
        kind=kind,
        event=delivery.event,
        state=RESOLVED if delivery.event == EVENT_RESOLVED else FIRING,
        subject=alert.subject,
        subject_label=alert.subject_label or alert.subject,
        value=delivery.value,
        threshold=delivery.threshold,
        value_text=value_text(delivery.value, kind.unit, currency),
        threshold_text=value_text(delivery.threshold, kind.unit, currency),
        since=alert.firing_since,
        resolved_at=alert.resolved_at if delivery.event == EVENT_RESOLVED else None,
        window=window,
        url=absolute(subject_path(alert.subject, window)),
        alerts_url=absolute(f"{reverse('alerts')}?{urlencode({'rule': rule.name})}"),
        currency=currency,
        workload=_workload_note(alert.subject, window, currency),
    )


def _workload_note(subject: str, window: Window, currency: str) -> WorkloadNote | None:
    kind, _, pk = subject.partition(":")
    if kind != "workload" or not pk.isdigit():
        return None
    found = figures.workload_window(workload_id=int(pk), window=window)
    if found is None:
        return None
    return WorkloadNote(
        kind=found.kind,
        key=found.key,
        user=found.user,
        name=found.name,
        gpu_hours_text=value_text(found.gpu_hours, HOURS),
        idle_cost_text=None if found.idle_cost is None else money(found.idle_cost, currency),
    )


# --- email -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Email:
    subject: str
    text: str
    html: str


def email_render(notice: Notice) -> Email:
    # One line whatever a name holds: a header never carries a line break.
    subject = " ".join(f"[gpufleet] {notice.headline}".split())
    context = {"n": notice, "subject": subject}
    # A workload's notice speaks to the person who ran it, as a colleague would.
    template = "workload" if notice.workload is not None else "notice"
    return Email(
        subject=subject,
        text=render_to_string(f"alerts/email/{template}.txt", context),
        html=render_to_string(f"alerts/email/{template}.html", context),
    )


# --- webhook ---------------------------------------------------------------------------------
def webhook_body(notice: Notice) -> bytes:
    """The JSON of docs/alerts.md, plus what a receiver needs to de-duplicate (``delivery``,
    inside the signed body: a header is not signed) and to read the value (``unit``,
    ``event``, the window). Compact and key-sorted, so the same notice is the same bytes on
    every attempt."""
    unit = notice.kind.unit
    body = {
        "alert": notice.alert_id,
        "rule": notice.rule,
        "rule_kind": notice.kind.name,
        "subject": notice.subject,
        "subject_label": notice.subject_label,
        "state": notice.state,
        "event": notice.event,
        "value": wire_value(notice.value, unit),
        "threshold": wire_value(notice.threshold, unit),
        "unit": notice.currency if unit == MONEY else unit,
        "since": notice.since.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "window_start": notice.window.start.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "window_end": notice.window.end.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "url": notice.url,
        "text": notice.text,
        "delivery": notice.delivery_id,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def webhook_signature(body: bytes, secret: str, *, timestamp_s: int) -> str:
    """``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` (Stripe's layout): the time
    is signed with the body, so a receiver that refuses old signatures cannot be fed a
    recorded notice again later."""
    signed = f"{timestamp_s}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp_s},v1={digest}"
