"""Reads of alerts for the page and the API: one query shape, one wire shape (``alert_data``),
money hidden in one place for whoever may not see it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Case, IntegerField, Prefetch, Q, QuerySet, Value, When

from alerts.messages import absolute, subject_path, value_text
from alerts.models import FIRING, RESOLVED, Alert, Delivery, Rule
from alerts.rules import MONEY, RULE_KINDS, WINDOW_HOURS, WINDOW_MONTH, Window
from alerts.targets import target_display
from billing.cost_model import money_round


@dataclass(frozen=True)
class AlertQuery:
    """What a list may be narrowed to; each None = no restriction."""

    state: str | None = None  # firing | resolved
    rule: str | None = None  # a rule's name
    rule_kind: str | None = None
    subject: str | None = None  # exactly, e.g. gpu:GPU-… or pool:training
    since: dt.datetime | None = None  # firing at or after this moment
    until: dt.datetime | None = None  # started firing before this moment


def alerts_query(query: AlertQuery | None = None) -> QuerySet[Alert]:
    """Open alerts first (newest first), then closed ones, most recently resolved first;
    with their rule and deliveries in two more queries, whatever the number of alerts."""
    query = query or AlertQuery()
    qs = Alert.objects.select_related("rule").prefetch_related(
        Prefetch("deliveries", queryset=Delivery.objects.order_by("created_at", "pk"))
    )
    if query.state == FIRING:
        qs = qs.filter(resolved_at__isnull=True)
    elif query.state == RESOLVED:
        qs = qs.filter(resolved_at__isnull=False)
    if query.rule:
        qs = qs.filter(rule__name=query.rule)
    if query.rule_kind:
        qs = qs.filter(rule__kind=query.rule_kind)
    if query.subject:
        qs = qs.filter(subject=query.subject)
    if query.since:
        qs = qs.filter(Q(resolved_at__isnull=True) | Q(resolved_at__gte=query.since))
    if query.until:
        qs = qs.filter(firing_since__lt=query.until)
    return qs.annotate(
        closed=Case(
            When(resolved_at__isnull=True, then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        )
    ).order_by("closed", "-resolved_at", "-firing_since", "-pk")


def firing_count() -> int:
    return Alert.objects.filter(resolved_at__isnull=True).count()


def _number(value: Decimal | None, unit: str, costs: bool) -> str | None:
    """A value on the wire: money with two decimals (as the finance API), other units with
    up to six; None where there is none or the caller may not see money."""
    if value is None or (unit == MONEY and not costs):
        return None
    if unit == MONEY:
        return str(money_round(value))
    return f"{value.normalize():f}"


def hidden(alert_or_rule: Alert | Rule, costs: bool) -> bool:
    rule = alert_or_rule.rule if isinstance(alert_or_rule, Alert) else alert_or_rule
    kind = RULE_KINDS.get(rule.kind)
    return bool(kind and kind.money and not costs)


def notified(alert: Alert) -> list[dict[str, Any]]:
    """Who was told what: every delivery, its target as pages may show it."""
    return [
        {
            "event": d.event,
            "channel": d.channel,
            "target": target_display(d.target),
            "status": d.status,
            "attempts": d.attempts,
            "sent_at": d.sent_at,
            "error": d.last_error,
        }
        for d in alert.deliveries.all()
    ]


def alert_window(alert: Alert) -> Window:
    return Window(alert.window_start or alert.firing_since, alert.window_end or alert.firing_since)


def alert_data(alert: Alert, *, costs: bool, currency: str) -> dict[str, Any]:
    """One alert as the API sends it (docs/alerts.md); money values are null for viewers."""
    kind = RULE_KINDS.get(alert.rule.kind)
    unit = kind.unit if kind else ""
    secret = hidden(alert, costs)
    return {
        "id": alert.pk,
        "rule": alert.rule.name,
        "rule_kind": alert.rule.kind,
        "subject": alert.subject,
        "subject_label": alert.subject_label,
        "state": alert.state,
        "value": _number(alert.value, unit, costs),
        "peak_value": _number(alert.peak_value, unit, costs),
        "threshold": _number(alert.threshold, unit, costs),
        "unit": currency if unit == MONEY else unit,
        "values_hidden": secret,
        "since": alert.firing_since,
        "last_notified_at": alert.last_notified_at,
        "notices": alert.notices,
        "resolved_at": alert.resolved_at,
        "note": alert.note,
        "window_start": alert.window_start,
        "window_end": alert.window_end,
        "url": absolute(subject_path(alert.subject, alert_window(alert))),
        "notified": notified(alert),
    }


def rule_rows(*, costs: bool, currency: str) -> list[dict[str, Any]]:
    """The rules as the fleet file set them, for the page: values in words, money hidden
    for viewers, webhooks by host only."""
    out = []
    for rule in Rule.objects.filter(active=True).order_by("position", "name"):
        kind = RULE_KINDS.get(rule.kind)
        unit = kind.unit if kind else ""
        if kind is None or kind.window not in (WINDOW_HOURS, WINDOW_MONTH):
            window = "now"
        elif kind.window == WINDOW_MONTH:
            window = "month to date"
        else:
            window = f"{rule.window_hours} h"
        out.append(
            {
                "name": rule.name,
                "kind": rule.kind,
                "what": kind.what if kind else "",
                "scope": rule.scope,
                "relation": ">" if kind is None or kind.above else "<",
                "threshold": (
                    None if hidden(rule, costs) else value_text(rule.threshold, unit, currency)
                ),
                "window": window,
                "notify": [target_display(t) for t in rule.notify],
                "repeat": f"every {rule.repeat_hours} h" if rule.repeat_hours else "never",
            }
        )
    return out
