"""A new user's first minutes in a real browser (issue 18): every page at 1440 and 390 px,
light and dark, checked for sideways scrolling, overlapping boxes and text that does not fit;
the navigation menu on a phone, chart toolbars, the fleet table as cards, dark charts, the
period shortcuts, the error pages and the user menu. Screenshots go to var/screenshots/."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import screenshot_path

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-Secret-123"

HERE = Path(__file__).resolve().parent
LAYOUT_PROBLEMS = (HERE / "layout_problems.js").read_text()
LUMINANCE = (HERE / "contrast.js").read_text()


def _setup() -> dict[str, Any]:
    """Six GPUs over three days (tests/billing/test_dashboard_data.py), the last one offline
    since the start of the third day, a long model name; a finance user and a viewer."""
    from django.contrib.auth import get_user_model

    from fleet.roles import role_assign
    from telemetry.models import HourlyUsage
    from tests.billing.test_dashboard_data import DAYS, day0, make_fleet

    gpus = make_fleet(6)
    # A long model name, as real ones are: it must wrap, not run into the next column.
    gpus[0].model.__class__.objects.update(name="NVIDIA GeForce RTX 4090 24GB (PCIe)")
    last_day = dt.datetime.combine(day0() + dt.timedelta(days=DAYS - 1), dt.time(), tzinfo=dt.UTC)
    HourlyUsage.objects.filter(gpu=gpus[5], hour__gte=last_day).delete()
    type(gpus[5]).objects.filter(pk=gpus[5].pk).update(last_seen_at=last_day)
    for name in ("finance", "viewer"):
        user = get_user_model().objects.create_user(username=f"{name}-e2e", password=PASSWORD)
        role_assign(user=user, role=name)
    return {"offline_gpu": gpus[5].uuid}


def _login(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def _signed_in(live_server: Any, open_page: Any, width: int, scheme: str, url: str) -> Any:
    """The test data, and a finance user's page at ``url`` with its charts drawn."""
    _setup()
    page = open_page(width, scheme)
    _login(page, live_server.url, "finance-e2e")
    page.goto(live_server.url + url)
    _drawn(page)
    return page


def _drawn(page: Any) -> int:
    """Waits until every chart on the page is drawn; the number of charts."""
    if page.locator("script[src$='charts.js']").count():
        page.wait_for_selector("body[data-charts-ready=true]")
    total = page.locator(".plot[data-figure]").count()
    page.wait_for_function(
        "n => document.querySelectorAll('.plot[data-drawn=true] .main-svg').length >= n", arg=total
    )
    return total


@pytest.mark.parametrize(
    ("width", "scheme"), [(1440, "light"), (1440, "dark"), (390, "light"), (390, "dark")]
)
def test_every_page_fits_at_this_width_and_scheme(
    live_server: Any, open_page: Any, problems: Any, width: int, scheme: str
) -> None:
    from django.urls import reverse

    from billing import charts
    from tests.billing.test_dashboard_data import range_query

    data = _setup()
    base, rng = live_server.url, range_query()
    page = open_page(width, scheme)
    _login(page, base, "finance-e2e")
    pages = {
        "overview": f"/?{rng}",
        "fleet-board": f"/fleet/?{rng}",
        "heatmap": f"/fleet/heatmap/?{rng}",
        "gpu-offline": f"{reverse('gpu-detail', args=[data['offline_gpu']])}?{rng}",
        "teams-pools": f"/chargeback/?{rng}",
        "breakeven": f"/breakeven/?{rng}",
        "no-data": "/?from=2001-01-01&to=2001-01-31",
        "report-subscription": "/reports/weekly/subscription/",
        "forbidden": "/reports/weekly/preview/",  # admins only: a styled 403
        "not-found": "/no/such/page/",
    }
    for name, url in pages.items():
        response = page.goto(base + url)
        assert response is not None
        assert response.status == {"forbidden": 403, "not-found": 404}.get(name, 200), name
        charts_drawn = _drawn(page)
        found = page.evaluate(LAYOUT_PROBLEMS)
        page.screenshot(path=str(screenshot_path(f"{name}-{width}-{scheme}")), full_page=True)
        assert not found, (name, found)
        # Text reads on its background, in either scheme.
        for selector in ("h1", "main p", ".kpi .value", ".board td"):
            for el in page.locator(selector).all()[:5]:
                if el.is_visible():
                    seen = el.evaluate(LUMINANCE)
                    assert seen["contrast"] >= 4.5, (name, selector, seen)
        body = page.locator("body").evaluate(LUMINANCE)
        assert (body["bg"] < 0.05) == (scheme == "dark"), (name, body)
        if name == "heatmap":  # the scale runs from dark to bright in dark mode
            busier = "brighter is busier" if scheme == "dark" else "darker is busier"
            assert busier in page.locator("#heatmap-legend").inner_text(), scheme
        if charts_drawn:
            font = page.evaluate(
                "document.querySelector('.plot[data-drawn=true]')._fullLayout.font.color"
            )
            expected = charts.DARK[charts.INK] if scheme == "dark" else charts.INK
            assert font.lower() == expected.lower(), (name, font)
            # No toolbar on a phone (it covered the legends); on hover on a desktop.
            page.locator(".plot[data-drawn=true]").first.hover()
            toolbars = page.locator(".modebar-container")
            if width < 760:
                assert not any(t.is_visible() for t in toolbars.all()), name
            else:
                assert toolbars.count() >= 1, name
    # The expected refusals show up as failed loads in the console; nothing else may.
    problems.console_errors = [
        e for e in problems.console_errors if not re.search(r"\b40[34]\b", e)
    ]


def test_a_phone_gets_a_menu_and_the_fleet_table_as_cards(live_server: Any, open_page: Any) -> None:
    from tests.billing.test_dashboard_data import range_query

    base = live_server.url
    page = _signed_in(live_server, open_page, 390, "light", f"/fleet/?{range_query()}")
    toggle = page.locator(".menu-toggle")
    nav = page.locator(".mainnav")
    assert toggle.is_visible() and not nav.is_visible()
    assert toggle.get_attribute("aria-expanded") == "false"
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true"
    assert nav.is_visible() and page.locator(".mainnav a.active").inner_text() == "Fleet board"
    page.screenshot(path=str(screenshot_path("menu-open-390")), full_page=False)
    page.keyboard.press("Escape")
    assert not nav.is_visible()
    # The fleet table: no header row, each GPU a card no wider than the screen.
    assert not page.locator("#fleet-board thead").is_visible()
    rows = page.locator("#fleet-board tbody tr").all()
    assert len(rows) == 6
    for row in rows:
        box = row.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
        assert row.evaluate("r => getComputedStyle(r).display") == "grid"
    label = page.locator("#fleet-board tbody tr td.num").first.evaluate(
        "td => getComputedStyle(td, '::before').content"
    )
    assert label == '"Air h / day"'
    # The same page at 1440: a table with its header, the menu button gone.
    wide = open_page(1440, "light")
    _login(wide, base, "finance-e2e")
    wide.goto(f"{base}/fleet/?{range_query()}")
    assert wide.locator("#fleet-board thead").is_visible()
    assert not wide.locator(".menu-toggle").is_visible() and wide.locator(".mainnav").is_visible()


def test_shortcuts_periods_menus_and_error_pages(
    live_server: Any, open_page: Any, problems: Any
) -> None:
    from billing.dashboard import period_label, preset_range
    from billing.forms import PRESETS
    from fleet.models import FleetSettings
    from tests.billing.test_dashboard_data import DAYS, day0, range_query

    base = live_server.url
    page = _signed_in(live_server, open_page, 1440, "dark", f"/?{range_query()}&pool=training")
    # Period shortcuts: a week in the report time zone, keeping the pool filter. The data
    # days end two days ago: last week holds some of them from Monday to Thursday, this
    # week from Thursday to Sunday (the other has no GPU in service: no figures to show).
    today = dt.datetime.now(FleetSettings.load().report_zone).date()
    first, last = day0(), day0() + dt.timedelta(days=DAYS - 1)
    shortcut = next(
        key
        for key in ("last_week", "this_week")
        if preset_range(key, today)[0] <= last and preset_range(key, today)[1] >= first
    )
    page.click(f".presets a:has-text('{PRESETS[shortcut]}')")
    page.wait_for_url(re.compile(rf".*period={shortcut}.*pool=training.*"))
    start, end = preset_range(shortcut, today)
    assert page.input_value("input[name=from]") == start.isoformat()
    assert page.input_value("input[name=to]") == end.isoformat()
    assert page.locator(".presets a.active").inner_text() == PRESETS[shortcut]
    label = period_label(start, end)
    periods = page.locator(".kpi .period").all_inner_texts()
    assert periods and all(p in (label, "now") for p in periods)
    # The menu keeps the shortcut, not its days.
    assert f"period={shortcut}" in (
        page.get_attribute(".mainnav a:has-text('Heatmap')", "href") or ""
    )
    # The user menu: the weekly report and the API docs.
    page.click(".usermenu summary")
    page.click(".usermenu a:has-text('Weekly email report')")
    page.wait_for_url(f"{base}/reports/weekly/subscription/")
    assert "Weekly email report" in page.inner_text("h1")
    page.click(".usermenu summary")
    assert page.locator(".usermenu a:has-text('API docs')").get_attribute("href") == "/api/v1/docs"
    # A viewer opening a shared money link is told why, in the site's frame.
    viewer = open_page(1440, "light")
    _login(viewer, base, "viewer-e2e")
    response = viewer.goto(f"{base}/breakeven/?{range_query()}")
    assert response is not None and response.status == 403
    assert "shows money" in viewer.inner_text(".errorpage .why")
    assert viewer.locator(".mainnav a:has-text('Overview')").is_visible()
    viewer.click(".errorpage a:has-text('The fleet overview')")
    viewer.wait_for_url(re.compile(rf".*/\?{re.escape(range_query())}$"))
    _drawn(viewer)
    assert viewer.locator(".kpi.accent-money").count() == 0
    problems.console_errors = [e for e in problems.console_errors if "403" not in e]
