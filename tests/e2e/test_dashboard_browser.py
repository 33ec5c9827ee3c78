"""The dashboard in a real browser: log in, every page draws its charts, filters and the
break-even form work, nothing leaves localhost. Saves the README's screenshots."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.e2e.conftest import screenshot_path

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _login(page: Any, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def _charts_drawn(page: Any) -> int:
    """Waits until every chart container on the page has been drawn by plotly.js."""
    page.wait_for_selector("body[data-charts-ready=true]")
    total = page.locator(".plot[data-figure]").count()
    page.wait_for_function(
        "n => document.querySelectorAll('.plot[data-drawn=true] .main-svg').length >= n", arg=total
    )
    return total


def _kpi(page: Any, ident: str) -> str:
    return page.locator(f"#{ident} .value").inner_text().strip()


def _shot(page: Any, name: str) -> None:
    """One of the README's screenshots (docs/screenshots/ only when asked: conftest)."""
    page.screenshot(path=str(screenshot_path(name, readme=True)), full_page=True)


def test_finance_journey_through_every_page(live_server: Any, page: Any, open_page: Any) -> None:
    # The demo's own data path, small: fake fleet → ingest service → rollup.
    call_command("demo", no_serve=True, gpus=24, days=14, verbosity=0)
    base = live_server.url
    _login(page, base, "finance", "finance")
    # The fortnight of data, so the charts are full.
    today = timezone.now().date()
    page.goto(f"{base}/?from={today - dt.timedelta(days=13)}&to={today}")

    assert _charts_drawn(page) >= 6
    whole = _kpi(page, "kpi-utilization")
    assert re.fullmatch(r"\d+\.\d %", whole)
    _shot(page, "overview")

    # A filter changes the figures and is kept in the URL and the menu's links.
    page.select_option("#filter-pool", "chat-inference")
    page.wait_for_url(re.compile(r".*pool=chat-inference.*"))
    _charts_drawn(page)
    assert _kpi(page, "kpi-utilization") != whole
    assert "pool=chat-inference" in (page.get_attribute("nav a[href^='/fleet/']", "href") or "")

    page.goto(f"{base}/fleet/?from={today - dt.timedelta(days=13)}&to={today}")
    _charts_drawn(page)
    from fleet.models import Gpu

    assert page.locator("#fleet-board tbody tr").count() == Gpu.objects.count()
    _shot(page, "fleet-board")
    page.click("#fleet-board thead a:has-text('Util.')")
    page.wait_for_url(re.compile(r".*sort=util.*"))
    first = page.locator("#fleet-board tbody tr td.gpu a").first
    first.click()
    page.wait_for_url(re.compile(r".*/gpus/GPU-.*"))
    assert _charts_drawn(page) >= 3
    assert page.locator("#chart-gpu-hourly-plot .main-svg").count() >= 1
    _shot(page, "gpu-detail")

    page.goto(f"{base}/fleet/heatmap/?from={today - dt.timedelta(days=13)}&to={today}")
    assert _charts_drawn(page) == 1
    _shot(page, "heatmap")

    page.goto(f"{base}/chargeback/?from={today - dt.timedelta(days=13)}&to={today}")
    assert _charts_drawn(page) == 4
    assert page.locator("#team-table tbody tr").count() == 4
    _shot(page, "teams-pools")

    # Who held the GPUs: the demo's fake GPUs name their workloads; the worst idle cost first,
    # each row a link to the workload's page, whose GPUs link back to their pages.
    page.click("nav a:has-text('Workloads')")
    page.wait_for_url(re.compile(r".*/workloads/.*"))
    assert page.locator("#workload-table tbody tr td a").count() >= 3
    assert page.locator("#account-table tbody tr").count() >= 2
    assert "format=csv" in (page.get_attribute("#workloads-csv", "href") or "")
    page.select_option("#filter-kind", "slurm")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(r".*kind=slurm.*"))
    kinds = page.locator("#workload-table tbody td[data-label=Kind]").all_inner_texts()
    assert kinds and set(kinds) == {"slurm"}
    page.locator("#workload-table tbody tr td a").first.click()
    page.wait_for_url(re.compile(r".*/workloads/\d+/.*"))
    assert page.locator("#workload-gpus tbody tr td a[href^='/gpus/']").count() >= 1
    assert page.locator("#kpi-idle-cost").count() == 1

    page.goto(f"{base}/breakeven/?from={today - dt.timedelta(days=13)}&to={today}")
    assert _charts_drawn(page) >= 2
    u_star = _kpi(page, "kpi-ustar")
    page.select_option("#id_pool", "llm-training")
    page.fill("#id_tokens_per_s", "6000")
    page.click("#breakeven-form button[type=submit]")
    page.wait_for_url(re.compile(r".*tokens_per_s=6000.*"))
    _charts_drawn(page)
    assert _kpi(page, "kpi-ustar") != u_star
    _shot(page, "breakeven")

    # The overview on a phone with the system in dark mode (the README shows its first screen).
    phone = open_page(390, "dark")
    _login(phone, base, "finance", "finance")
    phone.goto(f"{base}/?from={today - dt.timedelta(days=13)}&to={today}")
    _charts_drawn(phone)
    phone.screenshot(path=str(screenshot_path("overview-phone-dark", readme=True)))


def test_viewer_sees_utilisation_but_no_money(
    live_server: Any, page: Any, make_user: Any, problems: Any
) -> None:
    from tests.billing.test_dashboard_data import make_fleet, range_query

    make_fleet(6)
    make_user("viewer", username="vera", password="pw-Secret-123")
    base = live_server.url
    _login(page, base, "vera", "pw-Secret-123")
    page.goto(f"{base}/?{range_query()}")
    _charts_drawn(page)
    assert page.locator("#kpi-utilization").count() == 1
    assert page.locator(".kpi.money").count() == 0
    assert page.locator("nav a:has-text('Break-even')").count() == 0
    response = page.goto(f"{base}/breakeven/")
    assert response is not None and response.status == 403
    # the browser logs the expected 403 as a failed resource load: that one is wanted
    problems.console_errors = [e for e in problems.console_errors if "403" not in e]
