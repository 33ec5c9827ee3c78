"""What a new CIO, finance controller or viewer stumbled on in their first minutes (issue 18):
periods, money formatting, colours, the heatmap's offline days, the throttling card, the
offline banner, the error pages, the menus. The browser side is in tests/e2e/."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.http import QueryDict
from django.urls import reverse
from django.utils import timezone

from billing import charts
from billing.dashboard import dashboard_filters, period_label, preset_range
from billing.formatting import money_exact, money_shown
from tests.billing.test_dashboard_data import DAYS, day0, make_fleet, range_query

pytestmark = pytest.mark.django_db

CSS = Path(__file__).resolve().parent.parent.parent / "static" / "css" / "app.css"


def _url(name: str, *args: str, **extra: str) -> str:
    return f"{reverse(name, args=args)}?{range_query(**extra)}"


def _figures(html: str) -> dict[str, Any]:
    found = re.findall(r'<script id="([\w-]+)" type="application/json">(.*?)</script>', html, re.S)
    return {k: json.loads(v) for k, v in found if k != "dark-colours"}


def _offline_gpu(gpu: Any) -> None:
    """``gpu`` went offline at the start of the last data day: no rollups from then on."""
    from telemetry.models import HourlyUsage

    last_day = dt.datetime.combine(day0() + dt.timedelta(days=DAYS - 1), dt.time(), tzinfo=dt.UTC)
    HourlyUsage.objects.filter(gpu=gpu, hour__gte=last_day).delete()
    type(gpu).objects.filter(pk=gpu.pk).update(last_seen_at=last_day)


# --- item 5: periods ------------------------------------------------------------------------
def test_period_shortcuts_by_hand() -> None:
    wednesday = dt.date(2026, 5, 20)
    assert preset_range("this_week", wednesday) == (dt.date(2026, 5, 18), wednesday)
    assert preset_range("last_week", wednesday) == (dt.date(2026, 5, 11), dt.date(2026, 5, 17))
    assert preset_range("month_to_date", wednesday) == (dt.date(2026, 5, 1), wednesday)
    assert preset_range("last_month", wednesday) == (dt.date(2026, 4, 1), dt.date(2026, 4, 30))
    assert preset_range("last_quarter", wednesday) == (dt.date(2026, 1, 1), dt.date(2026, 3, 31))
    assert preset_range("last_30_days", wednesday) == (dt.date(2026, 4, 21), wednesday)
    # Across the year: January looks back into December and the fourth quarter.
    january = dt.date(2026, 1, 5)
    assert preset_range("last_month", january) == (dt.date(2025, 12, 1), dt.date(2025, 12, 31))
    assert preset_range("last_quarter", january) == (dt.date(2025, 10, 1), dt.date(2025, 12, 31))
    assert preset_range("this_week", dt.date(2026, 5, 18)) == (dt.date(2026, 5, 18),) * 2
    assert period_label(dt.date(2026, 5, 11), dt.date(2026, 5, 17)) == "11–17 May 2026"
    assert period_label(dt.date(2026, 4, 28), dt.date(2026, 5, 3)) == "28 Apr – 3 May 2026"
    assert period_label(dt.date(2025, 12, 28), dt.date(2026, 1, 3)) == "28 Dec 2025 – 3 Jan 2026"


def test_period_shortcuts_use_the_report_time_zone() -> None:
    from fleet.models import FleetSettings

    fs = FleetSettings.load()
    fs.report_time_zone = "America/Los_Angeles"
    fs.save()
    # Monday 02:00 UTC is still Sunday 19:00 in Los Angeles: "this week" is the week before.
    with time_machine.travel(dt.datetime(2026, 5, 18, 2, tzinfo=dt.UTC), tick=False):
        flt = dashboard_filters(QueryDict("period=this_week"))
        assert (flt.start, flt.end) == (dt.date(2026, 5, 11), dt.date(2026, 5, 17))
        assert flt.querystring == "period=this_week"  # links keep the shortcut, not its days
        # Days typed into the filter bar win over the shortcut they were shown with.
        typed = dashboard_filters(QueryDict("period=this_week&from=2026-05-01&to=2026-05-03"))
        assert (typed.start, typed.end, typed.preset) == (
            dt.date(2026, 5, 1),
            dt.date(2026, 5, 3),
            "",
        )
    assert "period" in dashboard_filters(QueryDict("period=yesterday")).form.errors


def test_every_card_says_its_period_and_the_shortcuts_keep_the_filters(role_client: Any) -> None:
    make_fleet(4)
    html = role_client("finance").get(_url("overview", pool="training")).content.decode()
    first = day0()
    label = period_label(first, first + dt.timedelta(days=DAYS - 1))
    cards = re.findall(r'<article class="card kpi.*?</article>', html, re.S)
    assert len(cards) == 11
    periods = [re.search(r'<p class="period">([^<]*)</p>', c) for c in cards]
    offline_card = next(c for c in cards if 'id="kpi-offline"' in c)
    assert all(
        p and p.group(1) == label for c, p in zip(cards, periods, strict=True) if c != offline_card
    )
    assert '<p class="period">now</p>' in offline_card  # GPUs offline now: the present
    assert 'href="?period=last_week&amp;pool=training"' in html


def test_todays_partial_day_is_marked_in_daily_charts(role_client: Any) -> None:
    make_fleet(2)
    client = role_client("finance")
    today = timezone.now().date()
    html = client.get(f"/?from={day0()}&to={today}").content.decode()
    figures = _figures(html)
    daily = ["chart-air-hours", "chart-utilization", "chart-blocks", "chart-cost"]
    daily += ["chart-cost-per-air-hour", "chart-throttled", "chart-energy"]
    for name in daily:
        fig = figures[name]
        notes = [a["text"] for a in fig["layout"].get("annotations", [])]
        assert "today, so far" in notes, name
        for trace in fig["data"]:
            if trace["type"] == "bar":
                shapes = trace["marker"]["pattern"]["shape"]
                assert shapes[-1] == "/" and set(shapes[:-1]) == {""}, name
    # A range that ends yesterday has no partial day.
    html = client.get(_url("overview")).content.decode()
    for name, fig in _figures(html).items():
        assert "today, so far" not in json.dumps(fig), name


def test_a_range_without_data_says_so(role_client: Any) -> None:
    make_fleet(2)
    client = role_client("finance")
    for name in ("overview", "fleet-board", "heatmap", "chargeback"):
        html = client.get(reverse(name) + "?from=2001-01-01&to=2001-01-31").content.decode()
        assert "No data for this period" in html, name
        assert not _figures(html), name  # no empty axes
        assert 'class="card kpi' not in html, name  # no zeros either
        assert "1–31 Jan 2001" in html, name


# --- item 7: money formatting -------------------------------------------------------------
def test_one_money_rule_for_every_card() -> None:
    assert money_shown(Decimal("9999.994")) == "9,999.99"
    assert money_shown(Decimal("10000.4"), "USD") == "10,000 USD"
    assert money_exact(Decimal("10000.4"), "USD") == "10,000.40 USD"
    assert money_shown(Decimal("1234567.891"), "EUR") == "1,234,568 EUR"
    assert money_shown(Decimal("-12345.5"), "USD") == "-12,346 USD"
    assert money_shown(Decimal("0.31384"), "USD") == "0.314 USD"  # a price per M tokens
    assert money_exact(Decimal("0.31384"), "USD") == "0.3138 USD"
    assert money_shown(Decimal("0"), "USD") == "0.00 USD"
    assert money_shown(None) == "–"


def test_money_cards_show_the_currency_and_the_exact_figure_on_hover(role_client: Any) -> None:
    make_fleet(4)  # recoverable money per year has five figures, the rest fewer
    html = role_client("finance").get(_url("overview")).content.decode()
    money_cards = re.findall(
        r'<article class="card kpi accent-(?:idle-)?money" id="([\w-]+)">.*?'
        r'<p class="value" title="([^"]+)">([^<]+)<span class="unit">([^<]+)</span>',
        html,
        re.S,
    )
    assert {c[0] for c in money_cards} == {
        "kpi-total-cost",
        "kpi-idle-cost",
        "kpi-cost-per-air-hour",
        "kpi-recoverable-money",
    }
    places = set()
    for _ident, exact, shown, unit in money_cards:
        assert unit == "USD" and exact.endswith(" USD")
        number = Decimal(exact.removesuffix(" USD").replace(",", ""))
        assert shown.strip() == money_shown(number)
        assert ("." in shown) == (abs(number) < 10_000), (shown, exact)  # cents below 10,000
        places.add(abs(number) >= 10_000)
    assert places == {True, False}  # both sides of the rule were on the page


def test_cost_profiles_and_columns_carry_their_units(role_client: Any) -> None:
    gpus = make_fleet(2)
    client = role_client("finance")
    owned = client.get(_url("gpu-detail", gpus[0].uuid)).content.decode()
    assert (
        "owned (set on pool training): bought for 30,000.00 USD, depreciated over 5 years, "
        "opex 0.10 USD / h" in owned
    )
    from billing.models import CostProfile

    CostProfile.objects.create(
        scope_kind="gpu",
        scope_name=gpus[1].uuid,
        kind="rented",
        rental_rate_per_hour=Decimal("2.6875"),
    )
    rented = client.get(_url("gpu-detail", gpus[1].uuid)).content.decode()
    assert f"rented (set on gpu {gpus[1].uuid}): 2.6875 USD per GPU-hour" in rented
    teams = client.get(_url("chargeback")).content.decode()
    header = re.search(r'<table class="board groups.*?</thead>', teams, re.S)
    assert header
    columns = re.findall(r"<th[^>]*>([^<]+)</th>", header.group(0))
    assert columns == [
        "Team",
        "Cost centre",
        "GPUs",
        "Util. %",
        "Air h / day",
        "24-hour day (average)",
        "Capacity h",
        "kWh",
        "CO2e kg",
        "Total USD",
        "Idle USD",
        "USD per air hour",
    ]


# --- item 3 and 8: colours ------------------------------------------------------------------
def test_the_heatmap_draws_an_offline_day_in_the_offline_colour(role_client: Any) -> None:
    gpus = make_fleet(3)
    _offline_gpu(gpus[2])
    html = role_client("viewer").get(_url("heatmap")).content.decode()
    heat = _figures(html)["chart-heatmap"]
    util, offline = heat["data"]
    assert offline["name"] == "Offline"
    assert {c for _, c in offline["colorscale"]} == {charts.OFFLINE}
    row = util["y"].index("node-001#0")  # GPU-test-0002
    assert offline["z"][row] == [None, None, 1] and util["z"][row][2] is None
    assert offline["customdata"][row][2] == 24.0  # hours, on hover
    # A GPU at 15 % is blue every day, even the near-white low end of the scale.
    busy = util["y"].index("node-000#0")
    assert util["z"][busy] == [15.0, 15.0, 15.0] and offline["z"][busy] == [None] * 3
    assert charts.OFFLINE not in {c for _, c in util["colorscale"]}


BLOCK_TRACES = {
    charts.AIR: {"In the air", "Utilisation", "Hours in the air / GPU / day"},
    charts.HELD: {"Held"},
    charts.PARKED: {"Parked"},
    charts.OFFLINE: {"Offline"},
}


def _colours(trace: dict[str, Any]) -> set[str]:
    found = set()
    for part in ("marker", "line"):
        colour = trace.get(part, {}).get("color")
        found |= set(colour) if isinstance(colour, list) else {colour}
    found |= {c for _, c in trace.get("colorscale", [])}
    return found - {None}


def test_block_colours_mean_only_their_block_on_every_page(role_client: Any) -> None:
    gpus = make_fleet(4)
    client = role_client("finance")
    pages = ["overview", "fleet-board", "heatmap", "chargeback", "breakeven"]
    seen = 0
    for html in [client.get(_url(p)).content.decode() for p in pages] + [
        client.get(_url("gpu-detail", gpus[0].uuid)).content.decode()
    ]:
        for fig_id, fig in _figures(html).items():
            for trace in fig["data"]:
                for colour in _colours(trace) & BLOCK_TRACES.keys():
                    seen += 1
                    assert trace.get("name") in BLOCK_TRACES[colour], (fig_id, trace.get("name"))
    assert seen >= 10  # the block charts are there and were checked


def test_gpus_offline_now_is_red_only_when_not_zero_and_cards_have_no_block_accents(
    role_client: Any,
) -> None:
    gpus = make_fleet(2)
    client = role_client("finance")

    def card(html: str, ident: str) -> str:
        match = re.search(rf'<article class="([^"]+)" id="{ident}">', html)
        assert match, ident
        return match.group(1)

    html = client.get(_url("overview")).content.decode()
    assert card(html, "kpi-offline") == "card kpi"
    accents = set(re.findall(r'class="card kpi accent-([\w-]+)"', html))
    assert accents <= {"air", "money", "idle-money", "energy", "co2e", "throttled"}
    type(gpus[0]).objects.filter(pk=gpus[0].pk).update(
        last_seen_at=timezone.now() - dt.timedelta(hours=2)
    )
    html = client.get(_url("overview")).content.decode()
    assert card(html, "kpi-offline") == "card kpi accent-offline"
    assert re.search(r'id="kpi-offline">.*?<p class="value">1<', html, re.S)


def test_css_and_charts_share_the_block_colours_light_and_dark() -> None:
    css = CSS.read_text()
    light = dict(re.findall(r"--([\w-]+):(#[0-9a-f]{6})", css.split("@media")[0]))
    dark_block = css[css.index("prefers-color-scheme: dark") :]
    dark = dict(re.findall(r"--([\w-]+):(#[0-9a-f]{6})", dark_block.split("}")[0]))
    for name, colour in [
        ("air", charts.AIR),
        ("held", charts.HELD),
        ("parked", charts.PARKED),
        ("offline", charts.OFFLINE),
        ("throttled", charts.THROTTLED),
        ("energy", charts.ENERGY),
        ("idle-money", charts.IDLE_MONEY),
        ("target", charts.TARGET),
    ]:
        assert light[name] == colour, name
        assert dark[name] == charts.DARK.get(colour, colour), name
    # No colour means two things: the block colours are used for nothing else in the CSS.
    for name in ("air", "held", "parked", "offline"):
        others = [k for k, v in light.items() if v == light[name] and k != name]
        assert not others, (name, others)


def test_overview_has_a_throttling_card_and_chart(role_client: Any) -> None:
    # make_fleet: every GPU is throttled (thermal) 60 s at noon each day: 4 GPUs × 3 days.
    make_fleet(4)
    html = role_client("viewer").get(_url("overview")).content.decode()
    card = re.search(
        r'id="kpi-throttled">.*?<p class="value">([^<]+) <span class="unit">GPU-h</span>.*?'
        r'<p class="sub">([^<]+)</p>',
        html,
        re.S,
    )
    assert card and card.groups() == ("0.2", "power cap 0.0 h · thermal 0.2 h")
    chart = _figures(html)["chart-throttled"]["data"][0]
    assert chart["y"] == [round(4 * 60 / 3600, 2)] * DAYS
    assert chart["marker"]["color"] == charts.THROTTLED


# --- item 9: 403 and 404 --------------------------------------------------------------------
def test_a_viewer_on_a_money_link_is_told_why_and_the_log_has_no_traceback(
    role_client: Any, caplog: Any
) -> None:
    make_fleet(1)
    client = role_client("viewer")
    caplog.set_level(logging.INFO)
    response = client.get(_url("breakeven"), HTTP_REFERER="http://testserver/fleet/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "It shows money (costs and prices), which your role may not see." in html
    assert "(viewer)" in html and "The finance and admin roles see money" in html
    assert 'class="mainnav"' in html and 'href="/?' in html  # the navigation, with filters
    assert 'href="http://testserver/fleet/" rel="prev"' in html  # back where they came from
    assert not [r for r in caplog.records if r.exc_info or r.exc_text]
    forbidden = [r for r in caplog.records if r.getMessage().startswith("Forbidden")]
    assert len(forbidden) == 1 and forbidden[0].levelno == logging.WARNING
    # A link from elsewhere is not offered as the way back.
    other = client.get(_url("breakeven"), HTTP_REFERER="https://evil.example/").content.decode()
    assert "evil.example" not in other


def test_a_missing_page_has_the_navigation_and_a_way_back(role_client: Any) -> None:
    make_fleet(1)
    response = role_client("finance").get("/gpus/GPU-nope/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "There is no such page" in html and "no GPU has that id" in html
    assert 'class="mainnav"' in html and "Break-even" in html
    assert '<a href="/">← The fleet overview</a>' in html
    # The API keeps its JSON 404.
    api = role_client("finance").get("/api/v1/nope")
    assert api.status_code == 404 and api.json() == {"detail": "Not found."}


# --- item 10: findable ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("role", "links"),
    [
        ("viewer", ["API docs"]),
        ("finance", ["Weekly email report", "API docs"]),
        ("admin", ["Weekly email report", "Preview last week's email", "API docs", "Admin"]),
    ],
)
def test_the_user_menu_leads_to_the_report_and_the_api_docs(
    role_client: Any, role: str, links: list[str]
) -> None:
    make_fleet(1)
    client = role_client(role)
    html = client.get(_url("overview")).content.decode()
    menu = re.search(r'<details class="usermenu">.*?</details>', html, re.S)
    assert menu
    found = re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', menu.group(0))
    assert [label.replace("&#x27;", "'") for _, label in found] == links
    for href, _ in found:
        assert client.get(href).status_code in (200, 302), href


def test_an_offline_gpu_has_a_banner_saying_since_when(role_client: Any) -> None:
    gpus = make_fleet(2)
    _offline_gpu(gpus[1])
    client = role_client("viewer")
    since = (day0() + dt.timedelta(days=DAYS - 1)).strftime("%-d %b %Y")
    html = client.get(_url("gpu-detail", gpus[1].uuid)).content.decode()
    assert re.search(
        rf'id="offline-banner".*?<strong>Offline since {since}, 00:00</strong> \(UTC, ', html, re.S
    )
    assert (
        'id="offline-banner"' not in client.get(_url("gpu-detail", gpus[0].uuid)).content.decode()
    )
