"""The Alerts page: what fires now, what fired before, and the rules as the fleet file set
them. Thin: reads come from ``alerts.selectors``. Money values (idle cost, budgets) are left
out of the page for users who may not see money (viewers)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from alerts import figures
from alerts.forms import AlertFilterForm
from alerts.messages import subject_path, value_text
from alerts.models import EVENT_FIRING, FIRING, RESOLVED, SENT, Alert
from alerts.rules import RULE_KINDS
from alerts.selectors import AlertQuery, alert_window, alerts_query, hidden, notified, rule_rows
from fleet.models import FleetSettings

HISTORY_PAGE = 50


def _told(alert: Alert) -> list[dict[str, Any]]:
    """Per target: the events it was told of, and whether the last one got through."""
    by_target: dict[str, dict[str, Any]] = {}
    for d in notified(alert):
        entry = by_target.setdefault(d["target"], {"target": d["target"], "events": []})
        entry["events"].append(d["event"])
        entry["status"] = d["status"]
    return list(by_target.values())


def duration_text(delta: dt.timedelta) -> str:
    """``2 d 3 h``, ``3 h 20 min``, ``12 min``: how long an alert fired."""
    minutes = max(0, int(delta.total_seconds() // 60))
    days, rest = divmod(minutes, 1440)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min"


def _row(alert: Alert, *, costs: bool, currency: str) -> dict[str, Any]:
    kind = RULE_KINDS.get(alert.rule.kind)
    unit = kind.unit if kind else ""
    secret = hidden(alert, costs)
    end = alert.resolved_at or timezone.now()
    return {
        "id": alert.pk,
        "rule": alert.rule.name,
        "kind": alert.rule.kind,
        "subject": alert.subject,
        "label": alert.subject_label or alert.subject,
        "link": subject_path(alert.subject, alert_window(alert)),
        "hidden": secret,
        "value": None if secret else value_text(alert.value, unit, currency),
        "peak": None if secret else value_text(alert.peak_value, unit, currency),
        "threshold": None if secret else value_text(alert.threshold, unit, currency),
        "relation": ">" if kind is None or kind.above else "<",
        "since": alert.firing_since,
        "lasted": duration_text(end - alert.firing_since),
        "resolved_at": alert.resolved_at,
        "last_notified_at": alert.last_notified_at,
        "told": _told(alert),
        "note": alert.note,
    }


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def alerts_page(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_dashboard (any role); money values need fleet.view_costs."""
    with figures.memo():  # the report time zone, read once for every row's link
        return _alerts_page(request)


def _alerts_page(request: HttpRequest) -> HttpResponse:
    form = AlertFilterForm(request.GET)
    form.is_valid()  # errors are shown; what was valid still filters
    data: dict[str, Any] = getattr(form, "cleaned_data", {})
    costs = bool(request.user.has_perm("fleet.view_costs"))
    currency = FleetSettings.load().currency
    query = AlertQuery(
        rule=data.get("rule") or None,
        rule_kind=data.get("rule_kind") or None,
        subject=data.get("subject") or None,
    )
    state = data.get("state") or ""
    firing = []
    if state in ("", FIRING):
        firing = [
            _row(a, costs=costs, currency=currency)
            for a in alerts_query(dataclasses.replace(query, state=FIRING))
        ]
    history = Paginator(
        alerts_query(dataclasses.replace(query, state=RESOLVED))
        if state in ("", RESOLVED)
        else Alert.objects.none(),
        HISTORY_PAGE,
    ).get_page(request.GET.get("page"))
    keep = request.GET.copy()
    keep.pop("page", None)
    return render(
        request,
        "alerts/alerts.html",
        {
            "page": "alerts",
            "form": form,
            "can_view_costs": costs,
            "currency": currency,
            "firing": firing,
            "history": history,
            "history_rows": [_row(a, costs=costs, currency=currency) for a in history],
            "keep": keep.urlencode(),
            "rules": rule_rows(costs=costs, currency=currency),
            "sent": SENT,
            "started": EVENT_FIRING,
        },
    )
