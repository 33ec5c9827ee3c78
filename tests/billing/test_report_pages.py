"""The admins' preview of the weekly email and each user's opt-in page.

config/urls.py mounts these at ``reports/``; this module's URLconf does the same, so the test
does not depend on that line being there.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import include, path

from billing import report_chart
from billing.models import ReportSubscription
from config.urls import urlpatterns as project_urlpatterns

urlpatterns = [path("reports/", include("billing.report_urls")), *project_urlpatterns]
pytestmark = pytest.mark.urls(__name__)

PREVIEW = "/reports/weekly/preview/"
SUBSCRIPTION = "/reports/weekly/subscription/"


@pytest.fixture
def no_chart(monkeypatch: Any) -> None:
    monkeypatch.setattr(report_chart, "chromium_path", lambda: None)


def login(make_user: Any, role: str | None) -> Client:
    client = Client()
    client.force_login(make_user(role))
    return client


def test_preview_is_for_admins(worked_example: Any, make_user: Any, no_chart: Any) -> None:
    admin = login(make_user, "admin")
    page = admin.get(PREVIEW, {"week": "2026-W10"})
    assert page.status_code == 200
    assert page["X-Report-Week"] == "2026-W10"
    html = page.content.decode()
    assert "GPU fleet weekly report" in html and "gpu-07#0" in html and "2026-W10" in html
    text = admin.get(PREVIEW, {"week": "2026-W10", "part": "text"})
    assert text["Content-Type"].startswith("text/plain")
    assert text.content.decode().startswith("Subject: GPU fleet 2026-W10:")
    assert admin.get(PREVIEW, {"week": "2026-13"}).status_code == 400
    assert admin.get(PREVIEW).status_code == 200  # last complete week
    for role in ("finance", "viewer"):
        assert login(make_user, role).get(PREVIEW).status_code == 403
    anonymous = Client().get(PREVIEW)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_preview_embeds_the_chart_as_data_uri(
    worked_example: Any,
    make_user: Any,
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(report_chart, "chromium_path", lambda: "/usr/bin/chromium")
    monkeypatch.setattr(report_chart, "render_png", lambda fig, browser: report_chart.PNG_MAGIC)
    html = login(make_user, "admin").get(PREVIEW, {"week": "2026-W10"}).content.decode()
    assert 'src="data:image/png;base64,iVBORw0KGgo=' in html and "cid:" not in html


def test_subscription_toggle(make_user: Any) -> None:
    user = make_user("finance")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(SUBSCRIPTION)
    assert page.status_code == 200 and "not subscribed" in page.content.decode()
    assert client.post(SUBSCRIPTION, {"opted_in": "1"}).status_code == 403  # no CSRF token
    token = page.cookies["csrftoken"].value
    done = client.post(SUBSCRIPTION, {"opted_in": "1", "csrfmiddlewaretoken": token})
    assert done.status_code == 302
    assert ReportSubscription.objects.get(user=user).opted_in is True
    client.post(SUBSCRIPTION, {"opted_in": "0", "csrfmiddlewaretoken": token})
    assert ReportSubscription.objects.get(user=user).opted_in is False
    assert login(make_user, "viewer").get(SUBSCRIPTION).status_code == 403


def test_preview_draws_the_chart_once_per_week_and_figures(
    worked_example: Any, make_user: Any, monkeypatch: Any
) -> None:
    """A render starts a headless Chromium (seconds): the second preview of the same week
    and figures takes the PNG from the cache; another week's figures are drawn anew."""
    renders: list[Any] = []

    def render(fig: Any, browser: str) -> bytes:
        renders.append(fig)
        return report_chart.PNG_MAGIC + b"%d" % len(renders)

    monkeypatch.setattr(report_chart, "chromium_path", lambda: "/usr/bin/chromium")
    monkeypatch.setattr(report_chart, "render_png", render)
    admin = login(make_user, "admin")
    first = admin.get(PREVIEW, {"week": "2026-W10"}).content.decode()
    second = admin.get(PREVIEW, {"week": "2026-W10"}).content.decode()
    assert len(renders) == 1
    assert "data:image/png;base64," in first and first == second
    admin.get(PREVIEW, {"week": "2026-W11"})  # other days, other figures
    assert len(renders) == 2


def test_preview_links_use_site_url(
    worked_example: Any, make_user: Any, no_chart: Any, settings: Any
) -> None:
    settings.SITE_URL = "http://localhost:8765"
    html = login(make_user, "admin").get(PREVIEW, {"week": "2026-W10"}).content.decode()
    assert 'href="http://localhost:8765/"' in html
    assert 'href="http://localhost:8765/reports/weekly/subscription/"' in html
