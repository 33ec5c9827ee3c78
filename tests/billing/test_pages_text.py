"""What the dashboard's pages say, as a new user meets them (issue 39): no template syntax on
any page of any role, the overview's workload panel, the Workloads page's order, words for each
role, adjustment rows, partial days, what recoverable GPUs and the break-even's month count,
the break-even form and charts, round axes, pluralised counts and the favicon.

Browser checks of the same pages (widths, row heights, labels inside charts) are in
tests/e2e/test_pages_seen_browser.py."""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing import charts
from billing.formatting import count
from tests.billing.conftest import at
from tests.billing.test_month_close import CLOSE_NOW, book, close, late_batch

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
ROLES = ("viewer", "finance", "admin")
FIGURE = re.compile(r'<script id="(chart-[\w-]+)" type="application/json">(.*?)</script>', re.S)


def _figures(html: str) -> dict[str, Any]:
    return {name: json.loads(body) for name, body in FIGURE.findall(html)}


def _text(client: Any, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, (url, response.status_code)
    return str(response.content.decode())


def _section(html: str, ident: str) -> str:
    """The element with id ``ident``, from its opening tag to the first closing tag of its
    kind (enough for the tables, paragraphs and lists these tests read)."""
    at = html.index(f'id="{ident}"')
    start = html.rindex("<", 0, at)
    tag = re.match(r"<(\w+)", html[start:])
    assert tag is not None
    return html[start : html.index(f"</{tag.group(1)}>", at)]


# --- 39.1: template comments -------------------------------------------------------------
def test_no_template_comment_spans_two_lines() -> None:
    """Django's {# #} ends on its own line: one that goes on is shown on the page."""
    found = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.count("{#") != line.count("#}"):
                found.append(f"{path.relative_to(TEMPLATES)}:{number}")
    assert not found, f"multi-line {{# #}} (use {{% comment %}}): {found}"


@pytest.fixture
def demo() -> dict[str, Any]:
    """The demo's fleet, small: two days of every group (every pool, model, fault and
    workload kind), through the real ingest and rollup. Its data begin two days ago at the
    time it ran, so a range from three days ago starts before them."""
    from fleet.models import Gpu, Pool, Team
    from telemetry.models import Workload

    call_command("demo", no_serve=True, gpus=6, days=2, stdout=io.StringIO(), stderr=io.StringIO())
    today = timezone.now().date()
    return {
        "range": f"from={today - dt.timedelta(days=3)}&to={today}",
        "gpus": list(Gpu.objects.values_list("uuid", flat=True)),
        "teams": list(Team.objects.values_list("name", flat=True)),
        "pools": list(Pool.objects.values_list("name", flat=True)),
        "workloads": list(Workload.objects.values_list("pk", flat=True)[:5]),
    }


def _every_page(demo: dict[str, Any]) -> list[str]:
    rng = demo["range"]
    pages = [
        f"/?{rng}",
        f"/overview/workloads/?{rng}",
        f"/fleet/?{rng}",
        f"/fleet/heatmap/?{rng}",
        f"/fleet/heatmap/?{rng}&order=util",
        f"/chargeback/?{rng}",
        f"/breakeven/?{rng}",
        f"/workloads/?{rng}",
        "/alerts/",
        "/reports/weekly/subscription/",
        "/no/such/page/",
    ]
    pages += [f"/gpus/{uuid}/?{rng}" for uuid in demo["gpus"]]
    pages += [f"/chargeback/teams/{team}/?{rng}" for team in demo["teams"]]
    pages += [f"/breakeven/?{rng}&pool={pool}" for pool in demo["pools"]]
    pages += [f"/workloads/{pk}/?{rng}" for pk in demo["workloads"]]
    return pages


def _every_page_of_every_role(
    demo: dict[str, Any], role_client: Any, client: Any
) -> list[tuple[str, str, str]]:
    """(role, url, html) of every page each role opens (403 and 404 pages included), and the
    login page."""
    pages = [("anonymous", "/accounts/login/", _text(client, "/accounts/login/"))]
    for role in ROLES:
        browser = role_client(role)
        for url in _every_page(demo):
            response = browser.get(url)
            assert response.status_code in (200, 403, 404), (role, url, response.status_code)
            pages.append((role, url, response.content.decode()))
    assert sum(1 for _, _, html in pages if "errorpage" not in html) > 3 * 20
    return pages


def test_no_page_of_any_role_shows_template_syntax(
    demo: dict[str, Any], role_client: Any, client: Any
) -> None:
    shown = [
        (role, url, syntax)
        for role, url, html in _every_page_of_every_role(demo, role_client, client)
        for syntax in ("{#", "#}", "{%", "{{")
        if syntax in html
    ]
    assert not shown


def test_no_page_of_any_role_says_1_gpus(
    demo: dict[str, Any], role_client: Any, client: Any
) -> None:
    # A whole 1 only: "2.1 GPUs" (the break-even's GPUs in service all month) is right.
    one = re.compile(r"(?<![\d.,])1 (GPUs|pools|teams|nodes|workloads|users|accounts|days|hours)\b")
    said = [
        (role, url, found.group(0))
        for role, url, html in _every_page_of_every_role(demo, role_client, client)
        if (found := one.search(html))
    ]
    assert not said


def test_count_is_singular_for_one() -> None:
    assert count(1, "GPU") == "1 GPU"
    assert count(0, "GPU") == "0 GPUs"
    assert count(2_048, "GPU") == "2,048 GPUs"
    assert count(1, "day") == "1 day" and count(3, "entry", "entries") == "3 entries"


# --- 39.1: the overview's workload panel; 39.6 and 39.10: the Workloads page --------------
def test_workload_panel_links_accounts_names_no_account_and_says_each_figure_once(
    demo: dict[str, Any], role_client: Any
) -> None:
    from urllib.parse import quote

    from billing.workloads import UNASSIGNED

    html = _text(role_client("finance"), f"/overview/workloads/?{demo['range']}")
    panel = _section(html, "workload-panel")
    assert panel.startswith('<section class="card padded" id="workload-panel">')  # padded
    share = _section(panel, "workload-share")
    held = re.search(r"of the ([\d,]+) held GPU hours", share)
    assert held is not None
    # Each figure once: no "(17,250 h)" after "17,250 held GPU hours".
    assert share.count(held.group(1)) == 1, share
    items = re.findall(r"<li>(.*?)</li>", _section(panel, "top-accounts"), re.S)
    assert len(items) == 3
    accounts = _text(role_client("finance"), f"/workloads/?{demo['range']}")
    for item in items:
        link = re.search(r'<a href="/workloads/\?([^"]*)"><strong>([^<]+)</strong></a>', item)
        if link is None:  # the workloads without an account, said in words
            assert item.startswith("<strong>no account <span") and UNASSIGNED not in item
            continue
        query, account = link.groups()
        assert f"account={quote(account)}" in query and "from=" in query
    # The Workloads page's accounts table says the same of its "(none)" row.
    table = _section(accounts, "account-table")
    assert "no account" in table and f">{UNASSIGNED}<" not in table


def test_workloads_page_answers_which_account_first_and_speaks_to_each_role(
    workload_example: dict[str, Any], role_client: Any, workload_hour: dt.datetime, monkeypatch: Any
) -> None:
    from billing import workload_views

    day = workload_hour.date().isoformat()
    url = f"/workloads/?from={day}&to={day}"
    html = _text(role_client("finance"), url)
    tables = [html.index(f'id="{t}"') for t in ("account-table", "user-table", "workload-table")]
    assert tables == sorted(tables)  # accounts, users, then the list of workloads
    # More workloads than the page lists (3 > 2): finance is sent to the CSV it has; a viewer,
    # who has no CSV, to the filters.
    monkeypatch.setattr(workload_views, "LIST_ROWS", 2)
    finance = _text(role_client("finance"), url)
    assert "the first 2 of 3; the CSV has them all" in finance and 'id="workloads-csv"' in finance
    viewer = _text(role_client("viewer"), url)
    assert "CSV" not in viewer
    assert "the first 2 of 3; narrow the filters (kind, user, account) to see the others" in viewer


def test_teams_page_speaks_of_cost_only_to_those_who_see_it(role_client: Any) -> None:
    from tests.billing.test_dashboard_data import make_fleet, range_query

    make_fleet(2)
    page = _text(role_client("viewer"), f"/chargeback/?{range_query()}")
    viewer = page[page.index("<main>") : page.index("</main>")]
    finance = _text(role_client("finance"), f"/chargeback/?{range_query()}")
    assert "What each team and pool used: utilisation, hours in the air and energy." in viewer
    # (A team's cost centre is no money: viewers see it.)
    assert not re.search(r"\b(cost(?![ -]cent)|money|price|CSV)", viewer, re.IGNORECASE)
    assert "Chargeback: what each team and pool used, and what its idle time cost." in finance


# --- 39.12: adjustment rows -----------------------------------------------------------------
@pytest.fixture
def in_april(role_client: Any) -> Any:
    """A finance user's client on 5 April 2026, when March is closed (test_month_close)."""
    import time_machine

    with time_machine.travel(CLOSE_NOW, tick=False):
        yield role_client("finance")


def test_adjustment_rows_say_so_in_every_list(
    worked_example: Any, fleet: Any, in_april: Any
) -> None:
    """March closed, then a late batch for it: April's rows carry an adjustment for March,
    which each list names beside the team's, pool's or GPU's own row."""
    close()
    late_batch(fleet, worked_example)
    book()
    span = {"from": "2026-03-01", "to": "2026-04-03"}
    page = in_april.get("/chargeback/", span).content.decode()
    label = "adjustment for 2026-03"
    for table, name in (("team-table", "research"), ("pool-table", "inference")):
        rows = re.findall(r"<tr><td.*?</tr>", _section(page, table), re.S)
        assert len(rows) == 2 and all(re.search(f">{name}[< ]", r) for r in rows), table
        assert [label in r for r in rows].count(True) == 1, table
    # The charts' bars too: a second bar of the team's own name would fall on the first.
    bars = _figures(page)["chart-team-cost"]["data"][0]["y"]
    assert sorted(bars) == ["research", f"research ({label})"]
    board = _section(in_april.get("/fleet/", span).content.decode(), "fleet-board")
    gpu_rows = re.findall(r"<tr>\s*<td class=\"gpu\".*?</tr>", board, re.S)
    assert [label in r for r in gpu_rows].count(True) == len(gpu_rows) - 1 == 1
    statement = in_april.get("/chargeback/teams/research/", span).content.decode()
    assert label in _section(statement, "statement-total")


# --- 39.7: the break-even ---------------------------------------------------------------------
def _input_value(html: str, name: str) -> str:
    found = re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', html)
    assert found is not None, name
    return found.group(1)


def test_breakeven_form_prices_renting_as_the_pool_is_priced(
    worked_example: Any, fleet: Any, role_client: Any
) -> None:
    """A rented pool's page opens with its own rate (2.49, its cost profile), not the
    product's 2.35, and hides the on-demand rate, which a rented pool is not compared with;
    an owned pool keeps the product's figure."""
    pool = fleet.pool("burst", site=fleet.site("iad1", pue="1.0", price_per_kwh="0"))
    gpu = fleet.gpu(
        "GPU-burst", node=fleet.node("gpu-b1", pool=pool), in_service_at=at("2026-03-02T00")
    )
    fleet.rented("pool:burst", rental_rate_per_hour="2.490000")
    day = [at(f"2026-03-02T{h:02d}") for h in range(24)]
    fleet.save([fleet.usage(gpu, h, samples=60, observed_s=3600, air_s=1800) for h in day])
    client = role_client("finance")
    span = "from=2026-03-02&to=2026-03-02"
    rented = _text(client, f"/breakeven/?{span}&pool=burst")
    assert "Pool burst (1 GPU, rented)" in rented
    assert _input_value(rented, "rental_rate_per_hour") == "2.49"
    assert '<label class="f-rental_rate_per_hour" hidden>' in rented
    assert "rented at 2.490 USD per GPU-hour" in rented
    owned = _text(client, f"/breakeven/?{span}&pool=inference")
    assert _input_value(owned, "rental_rate_per_hour") == "2.35"  # billing.breakeven's
    assert '<label class="f-rental_rate_per_hour">' in owned
    # The chart of owning against renting: its subtitle and its axis say the same unit.
    assert 'Owning against renting on demand <span class="note">cost per air hour</span>' in owned
    rent = _figures(owned)["chart-rent"]
    assert rent["layout"]["yaxis"]["title"]["text"] == "USD per air hour"


def test_log_axis_ticks_say_which_decade() -> None:
    """Plotly's own minor ticks on a log axis read "2" for 0.2 and for 2.0."""
    ticks = charts._log_ticks([0.35, 7.9, None, 0.21])
    assert ticks["tickvals"] == [0.1, 0.2, 0.5, 1, 2, 5, 10]
    assert ticks["ticktext"] == ["0.1", "0.2", "0.5", "1", "2", "5", "10"]
    assert charts._log_ticks([0.012, 0.04])["ticktext"] == ["0.01", "0.02", "0.05", "0.1"]


def test_a_mark_near_the_right_edge_is_labelled_on_its_left() -> None:
    """u* at 98.8 % labelled to its right was cut off by the plot's edge."""
    _, right = charts._vline(98.8, charts.API, "u* 99%")
    assert (right["xanchor"], right["xshift"]) == ("right", -4)
    _, left = charts._vline(12.0, charts.AIR, "today 12%")
    assert (left["xanchor"], left["xshift"]) == ("left", 4)


def test_breakeven_month_says_how_many_gpus_it_counts(role_client: Any) -> None:
    """Pool training: two GPUs over three days (72 h), one of them only from the middle of
    the second day: 72 + 36 = 108 GPU-hours, 108 / 72 = 1.5 GPUs in service all month."""
    from fleet.models import Gpu
    from telemetry.models import HourlyUsage
    from tests.billing.test_dashboard_data import day0, make_fleet, range_query

    gpus = make_fleet(4)
    late = gpus[2]  # training: GPUs 0 and 2
    start = dt.datetime.combine(day0(), dt.time(), tzinfo=dt.UTC) + dt.timedelta(hours=36)
    Gpu.objects.filter(pk=late.pk).update(in_service_at=start, first_seen_at=start)
    HourlyUsage.objects.filter(gpu=late, hour__lt=start).delete()
    html = _text(role_client("finance"), f"/breakeven/?{range_query()}&pool=training")
    assert "Pool training (2 GPUs, owned)" in html
    assert (
        "Per month: the 108 GPU-hours in service over the 72 h of the window, scaled to 730 h: "
        "1.5 GPUs in service all month (of the 2 GPUs; a GPU in service for a part of the "
        "window counts in part)."
    ) in html


# --- 39.9: partial days, recoverable GPUs ----------------------------------------------------
def _late_start(minutes_after_midnight: int) -> tuple[dt.date, str]:
    """A fleet (make_fleet) whose data begin on its first day at 06:45: its GPUs in service
    from then, no rollup before 07:00. The range from the day before to the last data day."""
    from fleet.models import Gpu
    from telemetry.models import HourlyUsage
    from tests.billing.test_dashboard_data import DAYS, day0, make_fleet

    make_fleet(2)
    first = dt.datetime.combine(day0(), dt.time(), tzinfo=dt.UTC)
    begin = first + dt.timedelta(minutes=minutes_after_midnight)
    Gpu.objects.update(in_service_at=begin, first_seen_at=begin)
    HourlyUsage.objects.filter(hour__lt=begin).delete()
    last = day0() + dt.timedelta(days=DAYS - 1)
    return day0(), f"from={day0() - dt.timedelta(days=1)}&to={last}"


def test_the_day_the_data_began_is_marked_as_a_part(role_client: Any) -> None:
    first, span = _late_start(6 * 60 + 45)
    html = _text(role_client("finance"), f"/?{span}")
    figures = _figures(html)
    for name in ("chart-air-hours", "chart-blocks", "chart-cost", "chart-energy"):
        layout, data = figures[name]["layout"], figures[name]["data"]
        notes = [a for a in layout["annotations"] if a["text"].startswith("partial day")]
        assert [n["text"] for n in notes] == ["partial day: data from 06:45"], name
        # The charts begin with the first day with data: its column shaded and labelled;
        # its bars not hatched, since a legend's swatch takes the first bar's pattern.
        assert data[0]["x"][0] == first.isoformat()
        assert "pattern" not in data[0].get("marker", {}), name
        column = [s for s in layout["shapes"] if s["type"] == "rect"]
        assert column[0]["x1"] == f"{first.isoformat()} 12:00:00", name
        assert notes[0]["x"] == column[0]["x0"] and notes[0]["xanchor"] == "left", name
    # Recoverable GPUs: what they count, and over how many hours (four days: 96 h).
    card = _section(html, "kpi-recoverable")
    assert "GPU-equivalents over the period&#x27;s 96 h" in card
    assert f"(data from {first.day} {first:%b} 06:45)" in card
    assert "(capacity hours − air hours / 60%) / the period&#x27;s 96 hours" in card


def test_data_from_midnight_marks_no_partial_day(role_client: Any) -> None:
    first_day, span = _late_start(0)
    html = _text(role_client("finance"), f"/?{span}")
    assert "partial day" not in html
    # The empty day before the data still counts in the period, and the card says so.
    assert f"(data from {first_day.day} {first_day:%b} 00:00)" in _section(html, "kpi-recoverable")


# --- 39.11: round axes, the favicon ------------------------------------------------------------
def _round_step(step: float) -> bool:
    """1, 2, 2.5 or 5 times a power of ten."""
    mantissa = step / 10 ** math.floor(math.log10(step))
    return any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5))


def test_second_axes_have_round_ticks_and_lines_stay_below_the_top_tick(role_client: Any) -> None:
    """The CO2e axis beside the energy bars ticked 49.9, 99.9, 149.8 (Plotly's ticks on a
    second axis follow the first one's grid); the GPU page's power line ran above its top
    tick."""
    from tests.billing.test_dashboard_data import make_fleet, range_query

    gpus = make_fleet(2)
    client = role_client("finance")
    energy = _figures(_text(client, f"/?{range_query()}"))["chart-energy"]
    co2e = next(t for t in energy["data"] if t.get("yaxis") == "y2")["y"]
    axis = energy["layout"]["yaxis2"]
    assert axis["tickmode"] == "linear" and axis["tick0"] == 0 and _round_step(axis["dtick"])
    top = axis["range"][1]
    assert max(co2e) <= top and math.isclose(top % axis["dtick"], 0, abs_tol=1e-9)
    assert top - axis["dtick"] < max(co2e)  # the first round tick above the line, no more
    page = _text(client, f"/gpus/{gpus[1].uuid}/?{range_query()}")
    hourly = _figures(page)["chart-gpu-hourly"]
    power = [p for p in next(t for t in hourly["data"] if t["name"] == "Power")["y"] if p]
    watts = hourly["layout"]["yaxis2"]
    assert _round_step(watts["dtick"]) and max(power) <= watts["range"][1]
    assert math.isclose(watts["range"][1] % watts["dtick"], 0, abs_tol=1e-9)


def test_round_axis_by_hand() -> None:
    assert charts.round_axis([199.8, None, 12.0]) == {
        "range": [0, 200.0],
        "tickmode": "linear",
        "tick0": 0,
        "dtick": 50.0,
    }
    assert charts.round_axis([716.0])["range"] == [0, 800.0]  # 716 / 4 = 179 → step 200
    assert charts.round_axis([0.3])["range"] == [0, 0.3]  # not 0.30000000000000004
    assert charts.round_axis([None, 0.0]) == {"rangemode": "tozero"}


def test_weekly_email_chart_has_round_idle_cost_ticks() -> None:
    """The email's idle-cost axis ticked 239, 477, 716."""
    from billing.report_chart import trend_figure

    class Day:
        def __init__(self, day: int, idle: str) -> None:
            self.period_start = dt.datetime(2026, 3, day, tzinfo=dt.UTC)
            self.idle_cost = Decimal(idle)
            self.utilization = 0.4

    fig = trend_figure([Day(2, "700.10"), Day(3, "716.40")], currency="USD")  # type: ignore[list-item]
    axis = fig.layout.yaxis2
    assert axis.tickmode == "linear" and axis.dtick == 200 and tuple(axis.range) == (0, 800)


def test_favicon_ico_is_the_site_icon(client: Any) -> None:
    from django.contrib.staticfiles import finders

    response = client.get("/favicon.ico")
    assert response.status_code == 302
    assert response["Location"].endswith(".svg") and "favicon" in response["Location"]
    assert finders.find("favicon.svg")


@pytest.mark.django_db
def test_the_admin_says_deliveries(role_client: Any) -> None:
    page = role_client("admin").get("/admin/").content.decode()
    assert "Deliveries" in page and "Deliverys" not in page
