"""The Alerts page in Debian's Chromium, as tests/e2e checks every page: at 1440 and 390 px,
light and dark, no sideways scrolling, no overlapping boxes, text that reads on its
background, no console error and no request that leaves the machine; the badge in the
navigation. Screenshots go to var/screenshots/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# The browser fixtures of tests/e2e: Debian's Chromium, watched pages, the test's time bound.
from tests.e2e.conftest import (  # noqa: F401
    _e2e_environment,
    browser_context_args,
    browser_type_launch_args,
    open_page,
    problems,
    screenshot_path,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-Secret-123"
E2E = Path(__file__).resolve().parents[1] / "e2e"
LAYOUT_PROBLEMS = (E2E / "layout_problems.js").read_text()
LUMINANCE = (E2E / "contrast.js").read_text()


def _setup() -> None:
    """The alerts of test_pages.py (one told by a webhook that failed, one about money, one
    resolved); a finance user and a viewer."""
    from django.contrib.auth import get_user_model

    from fleet.roles import role_assign
    from tests.alerts.conftest import seed_alerts

    seed_alerts()
    for role in ("finance", "viewer"):
        user = get_user_model().objects.create_user(username=f"{role}-e2e", password=PASSWORD)
        role_assign(user=user, role=role)


@pytest.mark.parametrize(
    ("width", "scheme", "role"),
    [
        (1440, "light", "finance"),
        (1440, "dark", "viewer"),
        (390, "light", "viewer"),
        (390, "dark", "finance"),
    ],  # fmt: skip
)
def test_the_alerts_page_fits_and_reads(
    live_server: Any,
    open_page: Any,  # noqa: F811 - the fixture imported above
    width: int,
    scheme: str,
    role: str,
) -> None:
    _setup()
    page = open_page(width, scheme)
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", f"{role}-e2e")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    badge = page.locator("a[href='/alerts/'] .nav-badge")
    assert badge.count() == 1 and badge.get_attribute("title") == "2 firing"
    response = page.goto(f"{live_server.url}/alerts/")
    assert response is not None and response.status == 200
    found = page.evaluate(LAYOUT_PROBLEMS)
    page.screenshot(path=str(screenshot_path(f"alerts-{width}-{scheme}")), full_page=True)
    assert not found, found
    for selector in ("h1", "main p", ".board td", ".target"):
        for el in page.locator(selector).all()[:8]:
            if el.is_visible():
                seen = el.evaluate(LUMINANCE)
                assert seen["contrast"] >= 4.5, (selector, seen)
    text = page.locator("main").inner_text()
    assert "gpu-07#0" in text and "hooks.slack.example" in text
    assert "s3cr3t" not in page.content()
    assert ("1,234.57 EUR" in text) == (role == "finance")
