"""What a new user saw in the demo (issue 39), in a real browser: no page wider than a phone
for any role, the fleet board a line a GPU at 1440 px, the heatmap's dates whole under its
axis title, the Workloads page's accounts before its workloads, the break-even's labels inside
their charts and its log ticks each saying its decade, round ticks on second axes.

The same pages' words are checked without a browser in tests/billing/test_pages_text.py."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import pytest
from django.core.management import call_command

from tests.e2e.conftest import screenshot_path

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PHONE = 390
ROW_HEIGHT_MAX_PX = 48  # a line of text and its padding


def _demo() -> dict[str, Any]:
    """The demo's fleet, small (every group: pools, models, faults, workload kinds), its two
    days of data, and the range that covers them."""
    from fleet.models import Gpu, Team
    from telemetry.models import Workload

    call_command("demo", no_serve=True, gpus=12, days=20, verbosity=0)
    today = dt.date.today()
    return {
        "range": f"from={today - dt.timedelta(days=20)}&to={today}",
        "gpu": Gpu.objects.order_by("uuid").values_list("uuid", flat=True).first(),
        "team": Team.objects.order_by("name").values_list("name", flat=True).first(),
        "workload": Workload.objects.order_by("pk").values_list("pk", flat=True).first(),
    }


def _login(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", username)  # the demo's users: password = name
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def _drawn(page: Any) -> None:
    if page.locator("script[src$='charts.js']").count():
        page.wait_for_selector("body[data-charts-ready=true]")
    total = page.locator(".plot[data-figure]").count()
    page.wait_for_function(
        "n => document.querySelectorAll('.plot[data-drawn=true] .main-svg').length >= n", arg=total
    )


def _pages(demo: dict[str, Any], role: str) -> list[str]:
    rng = demo["range"]
    pages = [
        f"/?{rng}",
        f"/fleet/?{rng}",
        f"/fleet/heatmap/?{rng}",
        f"/gpus/{demo['gpu']}/?{rng}",
        f"/chargeback/?{rng}",
        f"/workloads/?{rng}",
        f"/workloads/{demo['workload']}/?{rng}",
        "/alerts/",
    ]
    if role != "viewer":  # money: finance and admin only
        pages += [
            f"/chargeback/teams/{demo['team']}/?{rng}",
            f"/breakeven/?{rng}",
            f"/breakeven/?{rng}&pool=cloud-burst",
            "/reports/weekly/subscription/",
        ]
    return pages


def test_no_page_is_wider_than_a_phone_for_any_role(live_server: Any, open_page: Any) -> None:
    demo = _demo()
    base = live_server.url
    wide = []
    for role in ("viewer", "finance"):
        page = open_page(PHONE, "light")
        _login(page, base, role)
        for url in _pages(demo, role):
            response = page.goto(base + url)
            assert response is not None and response.status == 200, (role, url)
            _drawn(page)
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > PHONE:
                name = re.sub(r"\W+", "-", url.split("?")[0]).strip("-") or "overview"
                page.screenshot(path=str(screenshot_path(f"too-wide-{role}-{name}")))
                wide.append((role, url, width))
    assert not wide

    # The heatmap's dates, turned on a phone, are whole and the axis title sits below them.
    page = open_page(PHONE, "light")
    _login(page, base, "finance")
    page.goto(f"{base}/fleet/heatmap/?{demo['range']}")
    _drawn(page)
    boxes = page.evaluate(
        """() => {
          const plot = document.querySelector('#chart-heatmap-plot');
          const box = e => e.getBoundingClientRect();
          const svg = box(plot.querySelector('.main-svg'));
          return {svg: [svg.top, svg.bottom, svg.left, svg.right],
                  ticks: [...plot.querySelectorAll('.xtick text')].map(e => {
                    const r = box(e); return [r.top, r.bottom, r.left, r.right]; }),
                  title: (r => [r.top, r.bottom])(box(plot.querySelector('.g-xtitle text')))};
        }"""
    )
    top, bottom, left, right = boxes["svg"]
    assert boxes["ticks"]
    for t_top, t_bottom, t_left, t_right in boxes["ticks"]:
        assert t_top >= top - 1 and t_bottom <= bottom + 1, boxes  # not cut off
        assert t_left >= left - 1 and t_right <= right + 1, boxes
    assert boxes["title"][0] >= max(t[1] for t in boxes["ticks"]) - 1, boxes  # below them

    # Which account held the GPUs comes first, before the list of workloads.
    page.goto(f"{base}/workloads/?{demo['range']}")
    y = {
        ident: page.locator(f"#{ident}").bounding_box()["y"]
        for ident in ("account-table", "user-table", "workload-table")
    }
    assert y["account-table"] < y["workload-table"] and y["user-table"] < y["workload-table"]


def _tick_texts(page: Any, plot: str, axis: str) -> list[str]:
    return list(
        page.eval_on_selector_all(f"#{plot} .{axis}tick text", "es => es.map(e => e.textContent)")
    )


def test_boards_and_charts_at_1440(live_server: Any, open_page: Any) -> None:
    demo = _demo()
    base = live_server.url
    page = open_page(1440, "light")
    _login(page, base, "finance")

    # The fleet board: a line a GPU, however long its name and model.
    page.goto(f"{base}/fleet/?{demo['range']}")
    _drawn(page)
    heights = page.eval_on_selector_all(
        "#fleet-board tbody tr", "rows => rows.map(r => r.getBoundingClientRect().height)"
    )
    assert heights and max(heights) <= ROW_HEIGHT_MAX_PX, heights
    uuid = page.locator("#fleet-board tbody tr .uuid").first
    assert (uuid.get_attribute("title") or "").startswith("GPU-")  # the whole uuid on hover

    # The overview's energy chart: the CO2e axis ticks at round numbers.
    page.goto(f"{base}/?{demo['range']}")
    _drawn(page)
    co2e = [float(t.replace(",", "")) for t in _tick_texts(page, "chart-energy-plot", "y2")]
    steps = {round(b - a, 9) for a, b in zip(co2e, co2e[1:], strict=False)}
    assert len(co2e) >= 2 and len(steps) == 1, co2e
    (step,) = steps
    assert any(
        math.isclose(step / 10 ** math.floor(math.log10(step)), m) for m in (1, 2, 2.5, 5)
    ), co2e

    # The break-even of the rented pool: its marks' labels inside the chart, its log ticks
    # each naming its decade (no "2" for 0.2 and 2.0 alike).
    for url in (f"/breakeven/?{demo['range']}", f"/breakeven/?{demo['range']}&pool=cloud-burst"):
        page.goto(base + url)
        _drawn(page)
        for plot in ("chart-breakeven-plot", "chart-rent-plot"):
            if not page.locator(f"#{plot}").count():
                continue
            inside = page.evaluate(
                """plot => {
                  const el = document.getElementById(plot);
                  const svg = el.querySelector('.main-svg').getBoundingClientRect();
                  return [...el.querySelectorAll('.annotation')].map(a => {
                    const r = a.getBoundingClientRect();
                    return [a.textContent, r.left >= svg.left - 1 && r.right <= svg.right + 1];
                  });
                }""",
                plot,
            )
            assert inside and all(ok for _, ok in inside), (url, plot, inside)
            ticks = _tick_texts(page, plot, "y")
            assert len(ticks) == len(set(ticks)), (url, plot, ticks)
        page.screenshot(path=str(screenshot_path(f"breakeven-{url.count('pool')}")), full_page=True)
