"""Pages around the weekly report: the admins' browser preview and each user's opt-in."""

from __future__ import annotations

import base64

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from billing.models import ReportSubscription
from billing.report import (
    last_complete_week,
    week_label,
    week_parse,
    weekly_report_build,
    weekly_report_render,
)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


@login_required
@permission_required("fleet.manage_fleet", raise_exception=True)
def weekly_preview(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.manage_fleet (admin). The email of ``?week=YYYY-Www`` (default: last
    complete week) as it would be sent: ``?part=text`` for the plain-text part, ``?chart=0``
    to skip the chart. Sends nothing."""
    part, chart = request.GET.get("part", "html"), request.GET.get("chart", "1")
    try:
        if part not in ("html", "text"):
            raise ValueError(f"part: must be html or text, not {part!r}")
        if chart not in ("0", "1"):
            raise ValueError(f"chart: must be 0 or 1, not {chart!r}")
        week_start = week_parse(request.GET["week"]) if request.GET.get("week") else None
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    week_start = week_start or last_complete_week()
    rendered = weekly_report_render(
        weekly_report_build(week_start=week_start),
        with_chart=chart == "1" and part == "html",
        inline_chart_src=_data_uri,  # the browser cannot resolve cid: links
    )
    if part == "text":
        return HttpResponse(
            f"Subject: {rendered.subject}\n\n{rendered.text}",
            content_type="text/plain; charset=utf-8",
        )
    response = HttpResponse(rendered.html)
    response["X-Report-Week"] = week_label(week_start)
    return response


@login_required
@permission_required("fleet.view_costs", raise_exception=True)
@require_http_methods(["GET", "POST"])
def weekly_subscription(request: HttpRequest) -> HttpResponse:
    """Permission: fleet.view_costs (finance, admin): the report shows money. GET shows the
    choice; POST ``opted_in=1|0`` changes it (CSRF-protected)."""
    user = request.user
    assert isinstance(user, get_user_model())  # login_required
    subscription, _ = ReportSubscription.objects.get_or_create(user=user)
    if request.method == "POST":
        subscription.opted_in = request.POST.get("opted_in") == "1"
        subscription.save(update_fields=["opted_in", "updated_at"])
        return redirect("weekly-report-subscription")
    return render(
        request,
        "reports/subscription.html",
        {
            "subscription": subscription,
            "has_email": bool(user.email),
            "page": "report-subscription",
        },
    )
