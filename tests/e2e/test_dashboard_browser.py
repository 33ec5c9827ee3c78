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


def _shot(page: Any, name: str, *, height: int | None = None) -> None:
    """One of the README's screenshots (docs/screenshots/ only when asked: conftest): the
    whole page, or its first ``height`` pixels (a long list's first screens)."""
    clip = None if height is None else {"x": 0, "y": 0, "width": 1440, "height": height}
    page.screenshot(path=str(screenshot_path(name, readme=True)), full_page=True, clip=clip)


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
    # The demo's H100s send profiling data: what an hour of real SM work cost, and busy vs
    # working per day, drawn.
    assert re.fullmatch(r"[\d,]+\.\d\d USD", _kpi(page, "kpi-cost-per-work-hour"))
    assert page.locator("#chart-busy-working-plot .main-svg").count() >= 1
    _shot(page, "overview")

    # A filter changes the figures and is kept in the URL and the menu's links.
    page.select_option("#filter-pool", "chat-inference")
    page.wait_for_url(re.compile(r".*pool=chat-inference.*"))
    _charts_drawn(page)
    assert _kpi(page, "kpi-utilization") != whole
    # Its H200s send none: the page says so instead of a 0.
    assert _kpi(page, "kpi-cost-per-work-hour") == "no profiling data"
    assert (
        page.locator("[data-chart=chart-busy-working] .nodata")
        .inner_text()
        .startswith("No profiling data")
    )
    assert "pool=chat-inference" in (page.get_attribute("nav a[href^='/fleet/']", "href") or "")

    page.goto(f"{base}/fleet/?from={today - dt.timedelta(days=13)}&to={today}")
    _charts_drawn(page)
    from fleet.models import Gpu

    assert page.locator("#fleet-board tbody tr").count() == Gpu.objects.count()
    _shot(page, "fleet-board")
    page.click("#fleet-board thead a:has-text('Util.')")
    page.wait_for_url(re.compile(r".*sort=util.*"))
    # Again: the busiest first, whose page has something to show (the README's shot).
    page.click("#fleet-board thead a:has-text('Util.')")
    page.wait_for_url(re.compile(r".*sort=util&dir=desc.*"))
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
    _shot(page, "workloads", height=1500)
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

    # Queue pressure: the demo's Slurm queue waited for H100s while the rented cloud-burst
    # GPUs sat held; the overview prices it, the Queue page says who waited.
    page.goto(f"{base}/?from={today - dt.timedelta(days=13)}&to={today}")
    _charts_drawn(page)
    assert re.fullmatch(r"[\d,]+ GPU-h", _kpi(page, "kpi-queue"))
    assert "USD of idle GPUs" in page.locator("#kpi-queue .sub").inner_text()
    assert page.locator("#chart-queue-plot .main-svg").count() >= 1
    page.click("nav a:has-text('Queue')")
    page.wait_for_url(re.compile(r".*/queue/.*"))
    rows = page.locator("#queue-table tbody tr")
    assert rows.count() == 1 and "h100" in rows.first.inner_text()
    page.click("#queue-tabs a:has-text('Per user')")
    page.wait_for_url(re.compile(r".*group_by=user.*"))
    assert page.locator("#queue-table tbody tr").count() == 4  # alice, carol, bob, dave
    _shot(page, "queue")

    page.goto(f"{base}/breakeven/?from={today - dt.timedelta(days=13)}&to={today}")
    assert _charts_drawn(page) >= 2
    # It opens on the whole fleet (every GPU not rented), and says so.
    assert page.locator("#id_pool").input_value() == ""
    scope = page.locator("#breakeven-scope").inner_text()
    assert scope.startswith("Whole fleet: all ") and "not rented, as one pool" in scope
    page.screenshot(path=str(screenshot_path("breakeven-fleet")), full_page=True)
    u_star = _kpi(page, "kpi-ustar")
    page.select_option("#id_pool", "llm-training")
    page.fill("#id_tokens_per_s", "6000")
    page.click("#breakeven-form button[type=submit]")
    page.wait_for_url(re.compile(r".*tokens_per_s=6000.*"))
    _charts_drawn(page)
    assert _kpi(page, "kpi-ustar") != u_star
    assert "Pool llm-training" in page.locator("#breakeven-scope").inner_text()
    _shot(page, "breakeven")
    # A rented pool of a model the fleet owns (H100): renting against the API and owning.
    page.select_option("#id_pool", "cloud-burst")
    page.click("#breakeven-form button[type=submit]")
    page.wait_for_url(re.compile(r".*pool=cloud-burst.*"))
    _charts_drawn(page)
    assert page.locator("h1").inner_text() == "Rent or API?"
    assert (
        "rented): renting against the API and against owning"
        in page.locator("#breakeven-scope").inner_text()
    )
    assert page.locator("#kpi-ustar h3").text_content() == "Break-even u*: renting vs API"
    assert page.locator("#kpi-own-mtok h3").text_content() == "Renting cost / M tokens"
    assert page.locator("#kpi-owning-instead h3").text_content() == "Owning instead / month"
    assert page.locator("#kpi-rent").count() == 0 and page.locator("#chart-rent").count() == 0
    cards = page.locator("section.cards").text_content() or ""
    assert not re.search(r"\bown\b", cards, re.IGNORECASE), cards
    page.screenshot(path=str(screenshot_path("breakeven-rented")), full_page=True)
    # Rented RTX 4090s, which the fleet does not own: owning instead has no price.
    page.select_option("#id_pool", "notebooks")
    page.click("#breakeven-form button[type=submit]")
    page.wait_for_url(re.compile(r".*pool=notebooks.*"))
    _charts_drawn(page)
    assert _kpi(page, "kpi-owning-instead") == "unknown"

    # The alerts the demo's rules raise, once evaluated (what beat does every 5 minutes).
    call_command("alerts_evaluate", verbosity=0)
    page.goto(f"{base}/alerts/")
    assert page.locator("h1").inner_text().startswith("Alerts")
    _shot(page, "alerts")

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


def test_team_statement_prints_without_navigation(
    live_server: Any, page: Any, make_user: Any, problems: Any
) -> None:
    """Teams and pools → a team's name → its statement; printed (print media), the page keeps
    the statement and drops the navigation and the filter bar."""
    from tests.billing.test_dashboard_data import make_fleet, range_query

    make_fleet(6)
    make_user("finance", username="fiona", password="pw-Secret-123")
    base = live_server.url
    _login(page, base, "fiona", "pw-Secret-123")
    page.goto(f"{base}/chargeback/?{range_query()}")
    _charts_drawn(page)
    link = page.locator("#team-table tbody tr a").first
    team = link.inner_text().strip()
    link.click()
    page.wait_for_url(re.compile(rf".*/chargeback/teams/{team}/.*"))
    assert page.locator("h1").inner_text() == f"Chargeback statement: {team}"
    assert page.locator("#statement-gpus tbody tr").count() >= 1
    assert page.locator(".topbar").is_visible() and page.locator(".filters").is_visible()
    page.emulate_media(media="print")
    assert not page.locator(".topbar").is_visible()
    assert not page.locator(".filters").is_visible()
    assert page.locator("#statement-total").is_visible()
    page.screenshot(path=str(screenshot_path("team-statement-print")), full_page=True)
