"""The dashboard pages: permissions, figures, filters, the break-even form, query counts."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.billing.test_dashboard_data import make_fleet, range_query

pytestmark = pytest.mark.django_db

PLOTLY_FINDER = "billing.staticfiles.PlotlyJsFinder"
PAGES = ["overview", "fleet-board", "heatmap", "chargeback", "breakeven"]


@pytest.fixture(autouse=True)
def _plotly_finder(settings):
    # Until config/settings lists the finder (see docs/dashboard.md), add it for these tests.
    finders = list(
        getattr(
            settings,
            "STATICFILES_FINDERS",
            [
                "django.contrib.staticfiles.finders.FileSystemFinder",
                "django.contrib.staticfiles.finders.AppDirectoriesFinder",
            ],
        )
    )
    if PLOTLY_FINDER not in finders:
        settings.STATICFILES_FINDERS = finders + [PLOTLY_FINDER]


def _url(name: str, *args: str, **extra: str) -> str:
    return f"{reverse(name, args=args)}?{range_query(**extra)}"


def _figure_ids(html: str) -> set[str]:
    """The figures a page embeds (its other JSON block, dark-colours, is the dark palette)."""
    found = set(re.findall(r'<script id="([\w-]+)" type="application/json">', html))
    return found - {"dark-colours"}


@pytest.mark.smoke
def test_every_page_renders_its_charts_for_finance(role_client):
    gpus = make_fleet(4)
    client = role_client("finance")
    for name in PAGES:
        response = client.get(_url(name))
        assert response.status_code == 200, name
        html = response.content.decode()
        assert "script-src 'self'" in response["Content-Security-Policy"]
        # Charts travel as JSON data, drawn by a static script: no inline script at all.
        scripts = re.findall(r"<script([^>]*)>", html)
        assert scripts and all('type="application/json"' in s or "src=" in s for s in scripts)
        # Every script and stylesheet from this server (no CDN): a random token in the page
        # (the CSRF one) may spell "cdn", so the addresses are what is checked.
        assert "/static/js/plotly.min.js" in html
        sources = re.findall(r'<(?:script|link)[^>]*(?:src|href)="([^"]*)"', html)
        assert sources and all(src.startswith("/static/") for src in sources), sources
        ids = _figure_ids(html)
        assert ids, name
        for fig_id in ids:
            assert f'data-figure="{fig_id}"' in html, (name, fig_id)
    detail = client.get(_url("gpu-detail", gpus[0].uuid))
    assert detail.status_code == 200
    assert {"chart-gpu-blocks", "chart-gpu-hourly", "chart-gpu-cost"} <= _figure_ids(
        detail.content.decode()
    )


@pytest.mark.smoke
def test_viewer_sees_no_money_and_no_break_even(role_client):
    make_fleet(2)
    client = role_client("viewer")
    overview = client.get(_url("overview")).content.decode()
    assert 'id="kpi-utilization"' in overview
    assert "kpi-idle-cost" not in overview and "kpi-total-cost" not in overview
    assert "chart-cost" not in _figure_ids(overview)
    assert "USD" not in overview  # not even in the chart data
    board = client.get(_url("fleet-board")).content.decode()
    assert "Idle cost" not in board
    chargeback = client.get(_url("chargeback")).content.decode()
    assert "chart-team-cost" not in _figure_ids(chargeback)
    assert client.get(_url("breakeven")).status_code == 403
    assert "Break-even" not in overview  # not in the menu either


def test_login_required_and_role_required(client, make_user):
    response = client.get(reverse("overview"))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    client.force_login(make_user(None))
    assert client.get(reverse("overview")).status_code == 403


@pytest.mark.smoke
def test_overview_figures_match_a_hand_computation(role_client):
    # One owned GPU at 45 % all day for 3 days: 45.0 % utilisation, 10.8 h in the air per day.
    make_fleet(1, air_fraction=0.45)
    html = role_client("finance").get(_url("overview")).content.decode()
    card = re.search(r'id="kpi-utilization">.*?<p class="value">([^<]+)<', html, re.S)
    assert card and card.group(1) == "45.0 %"
    card = re.search(
        r'id="kpi-air-hours">.*?<p class="value">([^<]+) <span class="unit">h<', html, re.S
    )
    assert card and card.group(1) == "10.8"
    # Total cost: 72 h × (30000 / 43830 + 0.10) + energy. Energy per hour: 3600 × 321 J =
    # 0.321 kWh; 72 h → 23.112 kWh × 1.5 × 0.20 = 6.9336. Fixed 72 × 0.784463 = 56.4813.
    card = re.search(
        r'id="kpi-total-cost">.*?<p class="value" title="([^"]+)">([^<]+)'
        r'<span class="unit">([^<]+)<',
        html,
        re.S,
    )
    assert card and card.groups() == ("63.41 USD", "63.41 ", "USD")


def test_a_filter_changes_the_figures_and_stays_in_the_links(role_client):
    make_fleet(4)  # training: GPUs 0 and 2 (15 %, 45 %); inference: 1 and 3 (30 %, 60 %)
    client = role_client("finance")

    def utilisation(html: str) -> str:
        match = re.search(r'id="kpi-utilization">.*?<p class="value">([^<]+)<', html, re.S)
        assert match
        return match.group(1)

    whole = client.get(_url("overview")).content.decode()
    training = client.get(_url("overview", pool="training")).content.decode()
    assert utilisation(whole) == "37.5 %"
    assert utilisation(training) == "30.0 %"
    assert "pool=training" in re.search(r'href="/fleet/\?([^"]+)"', training).group(1)
    board = client.get(_url("fleet-board", pool="inference")).content.decode()
    assert "GPU-test-0001" in board and "GPU-test-0000" not in board


def test_fleet_board_is_worst_first_and_sortable(role_client):
    make_fleet(4)
    client = role_client("viewer")
    html = client.get(_url("fleet-board")).content.decode()
    order = re.findall(r'class="uuid">(GPU-test-\d+)', html)
    assert order == ["GPU-test-0000", "GPU-test-0001", "GPU-test-0002", "GPU-test-0003"]
    html = client.get(_url("fleet-board", sort="util", dir="desc")).content.decode()
    assert re.findall(r'class="uuid">(GPU-test-\d+)', html)[0] == "GPU-test-0003"
    # a viewer cannot sort by money: falls back to utilisation
    html = client.get(_url("fleet-board", sort="idle_cost")).content.decode()
    assert re.findall(r'class="uuid">(GPU-test-\d+)', html)[0] == "GPU-test-0000"


def test_fleet_board_pages_through_the_sorted_fleet(role_client, monkeypatch):
    monkeypatch.setattr("billing.views.BOARD_PAGE_SIZE", 3)
    make_fleet(4)
    client = role_client("viewer")

    def page(n: str) -> tuple[list[str], str]:
        html = client.get(_url("fleet-board", page=n)).content.decode()
        return re.findall(r'class="uuid">(GPU-test-\d+)', html), html

    first, html = page("1")
    assert first == ["GPU-test-0000", "GPU-test-0001", "GPU-test-0002"]
    assert "GPUs 1–3 of 4 · page 1 of 2" in html and 'rel="next"' in html
    second, html = page("2")
    assert second == ["GPU-test-0003"] and 'rel="prev"' in html and 'rel="next"' not in html
    assert page("99")[0] == second and page("x")[0] == first  # clamped; junk → first page


def test_heatmap_pages_through_gpus(role_client, monkeypatch):
    import json

    monkeypatch.setattr("billing.views.BOARD_PAGE_SIZE", 3)
    make_fleet(4)
    client = role_client("viewer")

    def lines(n: str) -> list[str]:
        html = client.get(_url("heatmap", page=n)).content.decode()
        data = re.search(
            r'<script id="chart-heatmap" type="application/json">(.*?)</script>', html, re.S
        )
        assert data, html[-1500:]
        return json.loads(data.group(1))["data"][0]["y"]

    assert len(lines("1")) == 3 and len(lines("2")) == 1
    assert not set(lines("1")) & set(lines("2"))


def test_heatmap_by_utilisation_lists_the_worst_gpu_first(role_client):
    """Worst first by each GPU's utilisation over the window, air hours / capacity hours:
    a GPU in service from noon of the first day, 12 h in the air then idle for two days, is
    at 12 / 60 = 20 %, between the fleet's 15 % and 30 % GPUs (the mean of its days, 33 %,
    would put it after the 30 % one)."""
    import datetime as dt
    import json

    from fleet.models import Gpu, Node
    from telemetry.models import HourlyUsage
    from tests.billing.test_dashboard_data import DAYS, day0

    gpus = make_fleet(4)  # 15, 30, 45, 60 %
    noon = dt.datetime.combine(day0(), dt.time(12), tzinfo=dt.UTC)
    node = Node.objects.create(hostname="late-node", pool=gpus[0].node.pool)
    late = Gpu.objects.create(uuid="GPU-late", node=node, index=0, in_service_at=noon)
    HourlyUsage.objects.bulk_create(
        HourlyUsage(
            gpu=late,
            hour=noon + dt.timedelta(hours=h),
            node=node,
            pool=node.pool,
            samples=60,
            observed_s=3600,
            air_s=3600.0 if h < 12 else 0.0,
            parked_s=0.0 if h < 12 else 3600.0,
            computed_at=noon,
        )
        for h in range(DAYS * 24 - 12)
    )
    html = role_client("viewer").get(_url("heatmap", order="util")).content.decode()
    data = re.search(
        r'<script id="chart-heatmap" type="application/json">(.*?)</script>', html, re.S
    )
    assert data, html[-1500:]
    names = json.loads(data.group(1))["data"][0]["y"]
    label = {g.uuid: f"{g.node.hostname}#{g.index}" for g in gpus}
    assert names == [
        label["GPU-test-0000"],
        "late-node#0",
        label["GPU-test-0001"],
        label["GPU-test-0002"],
        label["GPU-test-0003"],
    ]


def test_break_even_form_recomputes(role_client):
    make_fleet(2)
    client = role_client("finance")

    def u_star(**params: str) -> str:
        html = client.get(_url("breakeven", **params)).content.decode()
        match = re.search(r'id="kpi-ustar">.*?<p class="value">([^<]+)<', html, re.S)
        assert match, html[-2000:]
        return match.group(1)

    base = {"pool": "training", "price_mode": "blended", "api_price_per_mtok": "0.60"}
    slow = u_star(tokens_per_s="1000", **base)
    fast = u_star(tokens_per_s="4000", **base)
    assert slow != fast
    assert float(fast.rstrip(" %")) < float(slow.rstrip(" %"))
    assert u_star(tokens_per_s="10", **base) == "never"
    bad = client.get(_url("breakeven", pool="training", tokens_per_s="-1"))
    assert bad.status_code == 200 and "kpi-ustar" not in bad.content.decode()


def test_break_even_defaults_are_the_fleet_files_workload(role_client):
    """Opened without form values, the page computes at the pool's workload from the fleet
    file, else the fleet's: the same u* as the form submitted with those values."""
    from fleet.models import FleetSettings, Pool

    make_fleet(2)
    client = role_client("finance")

    def u_star(**params: str) -> str:
        html = client.get(_url("breakeven", pool="training", **params)).content.decode()
        match = re.search(r'id="kpi-ustar">.*?<p class="value">([^<]+)<', html, re.S)
        assert match, html[-2000:]
        return match.group(1)

    FleetSettings.objects.filter(pk=FleetSettings.load().pk).update(
        breakeven={"tokens_per_s_per_gpu": 1000.0, "api_price_per_mtok": "0.60"}
    )
    blended = {"price_mode": "blended", "api_price_per_mtok": "0.60"}
    assert u_star() == u_star(tokens_per_s="1000", **blended)
    # The pool's own throughput over the fleet's; the fleet's blended price still applies.
    Pool.objects.filter(name="training").update(breakeven={"tokens_per_s_per_gpu": 4000.0})
    assert (
        u_star() == u_star(tokens_per_s="4000", **blended) != u_star(tokens_per_s="1000", **blended)
    )
    # A pool that names its own prices brings all of them: split prices, the form's share.
    Pool.objects.filter(name="training").update(
        breakeven={
            "tokens_per_s_per_gpu": 4000.0,
            "api_input_price_per_mtok": "0.30",
            "api_output_price_per_mtok": "2.00",
        }
    )
    split = {
        "price_mode": "split",
        "api_input_price_per_mtok": "0.30",
        "api_output_price_per_mtok": "2.00",
        "output_share": "0.25",
    }
    assert (
        u_star() == u_star(tokens_per_s="4000", **split) != u_star(tokens_per_s="4000", **blended)
    )


@pytest.mark.parametrize(
    "page", ["overview", "fleet-board", "heatmap", "chargeback", "breakeven", "gpu-detail"]
)
def test_queries_per_page_do_not_grow_with_the_fleet(role_client, page):
    gpus = make_fleet(2)
    client = role_client("finance")
    args = (gpus[0].uuid,) if page == "gpu-detail" else ()
    client.get(_url(page, *args))  # warm caches (content types, sessions)

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(_url(page, *args)).status_code == 200
        return len(ctx.captured_queries)

    small = count()
    make_fleet(10)
    assert count() == small


def test_plotly_js_is_served_from_the_installed_package(client):
    import plotly
    from django.contrib.staticfiles import finders

    from billing.staticfiles import plotly_js_path

    found = finders.find("js/plotly.min.js")
    assert found == str(plotly_js_path())
    assert plotly.__file__.rsplit("/", 1)[0] in found
    response = client.get("/static/js/plotly.min.js")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert body == plotly_js_path().read_bytes()


def test_gpu_page_hourly_chart_draws_each_rollup_hour(worked_example, finance):
    # The chart reads the rollup columns as dicts (not model rows): each hour's utilisation
    # (air / 36), power, temperature and throttling as the stored row has them.
    import json

    from telemetry.models import HourlyUsage

    row = HourlyUsage.objects.filter(gpu=worked_example).order_by("hour").first()
    row.power_w_mean, row.temp_c_max, row.throttle_any_s = 412.5, 71.0, 900.0
    row.save()
    html = finance.get(
        reverse("gpu-detail", args=[worked_example.uuid]) + "?from=2026-03-02&to=2026-03-02"
    ).content.decode()
    found = re.search(r'<script id="chart-gpu-hourly" type="application/json">(.*?)</script>', html)
    traces = json.loads(found.group(1))["data"]
    util, power, temp, throttled = (t["y"][0] for t in traces[:4])
    assert traces[0]["x"][0].startswith("2026-03-02T00:00")
    assert (util, power, temp, throttled) == (round(row.air_s / 36, 1), 412.5, 71.0, 25.0)


def test_deferred_rows_are_the_cost_rows_with_their_figures(db):
    """Every grouping of ``cost_rows_deferred_by`` makes ``cost_rows_by``'s rows, in its
    order, and each deferred row's ordering figures (``costs._lead_of``, not the whole
    accumulation) are its row's, to the last digit."""
    import datetime as dt

    from billing import selectors
    from tests.billing.test_dashboard_data import DAYS, day0

    make_fleet(4)
    start = day0()
    end = start + dt.timedelta(days=DAYS)
    groupings = ("gpu", "model", "team", "pool", "fleet")
    whole = selectors.cost_rows_by(start=start, end=end, group_bys=groupings)
    deferred = selectors.cost_rows_deferred_by(start=start, end=end, group_bys=groupings)
    for group_by in groupings:
        rows = [d.row() for d in deferred[group_by]]
        assert len(rows) == len(whole[group_by]) and rows
        assert rows == whole[group_by]
        for d, row in zip(deferred[group_by], rows, strict=True):
            assert (d.key, d.name, d.priced) == (row.key, row.name, row.priced)
            assert d.utilization == row.utilization
            assert d.work_utilization == row.work_utilization
            assert d.hours_in_air_per_day == row.hours_in_air_per_day
            assert d.idle_cost == row.idle_cost
            assert d.offline_hours == row.offline_hours
            assert d.throttled_hours == row.throttled_hours
    utilisations = sorted(d.utilization for d in deferred["gpu"])
    assert utilisations == pytest.approx([0.15, 0.30, 0.45, 0.60])


def test_fleet_board_makes_only_the_rows_it_draws(role_client, monkeypatch):
    """Every GPU is ordered, by its idle cost here; only the page's GPUs are made whole
    rows (and the models' rows for the chart)."""
    from billing.selectors import costs

    monkeypatch.setattr("billing.views.BOARD_PAGE_SIZE", 3)
    make_fleet(4)
    made: list[str] = []
    real_row = costs._row

    def counted(entry, *args):
        made.append(entry.key)
        return real_row(entry, *args)

    monkeypatch.setattr(costs, "_row", counted)
    html = role_client("finance").get(_url("fleet-board")).content.decode()
    drawn = re.findall(r'class="uuid">(GPU-test-\d+)', html)
    assert len(drawn) == 3
    assert sorted(k for k in made if k.startswith("GPU-test-")) == sorted(drawn)
