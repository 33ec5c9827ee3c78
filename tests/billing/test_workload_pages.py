"""The Workloads pages (docs/dashboard.md, "Workloads") with the worked example of
docs/metrics.md: the list, per user and per account, one workload, the GPU page's section and
the overview's panel; money for finance, never for viewers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.billing.conftest import workload_span


@pytest.fixture
def span(workload_hour: Any) -> str:
    days = workload_span(workload_hour)
    last = days["end"].toordinal() - 1
    import datetime as dt

    return f"from={days['start'].isoformat()}&to={dt.date.fromordinal(last).isoformat()}"


def _page(client: Any, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def _ordered(text: str, *parts: str) -> bool:
    at = [text.index(p) for p in parts]
    return at == sorted(at)


@pytest.mark.smoke
def test_workloads_page_for_finance(
    workload_example: dict[str, Any], role_client: Any, span: str
) -> None:
    html = _page(role_client("finance"), f"/workloads/?{span}")
    table = html[html.index('id="workload-table"') :]
    # Worst idle cost first: 103 (0.81), then 101 and 102 (0.09 each).
    assert _ordered(table, ">103<", ">101<", ">102<")
    assert "0.81" in table and "0.45" in table and "0.09" in table
    users = html[html.index('id="user-table"') : html.index('id="workload-table"')]
    assert _ordered(users, ">carol<", ">alice<", ">bob<")
    # A user links to the page filtered by them, and shows their workloads (alice: 1).
    assert 'user=alice">alice<' in users and 'href="/workloads/?' in users
    assert 'data-label="Workloads">1<' in users
    accounts = html[html.index('id="account-table"') : html.index('id="user-table"')]
    assert "1.26" in accounts and "0.90" in accounts
    assert 'data-label="Workloads">2<' in accounts  # nlp: jobs 101 and 103
    assert 'id="workloads-csv"' in html and "format=csv" in html
    kpi = html[html.index('id="kpi-workloads"') :]
    assert kpi[kpi.index('class="value"') :].startswith('class="value">3<')
    assert 'href="/workloads/' in table  # rows link to their workload
    nav = html[: html.index("<main")] if "<main" in html else html
    assert ">Workloads<" in nav


def test_workloads_page_for_viewers_has_no_money(
    workload_example: dict[str, Any], role_client: Any, span: str
) -> None:
    html = _page(role_client("viewer"), f"/workloads/?{span}")
    table = html[html.index('id="workload-table"') :]
    # Most held hours first: 103 (1.0 h), then 101 and 102 (0.1 h each).
    assert _ordered(table, ">103<", ">101<")
    for money in ("0.81", "0.45", "0.09", "1.26", "EUR", "Idle", "format=csv"):
        assert money not in html, money


def test_workloads_page_filters(
    workload_example: dict[str, Any], role_client: Any, span: str
) -> None:
    client = role_client("finance")
    html = _page(client, f"/workloads/?{span}&user=bob")
    table = html[html.index('id="workload-table"') :]
    assert ">102<" in table and ">101<" not in table and ">103<" not in table
    assert "user=bob" in html  # the CSV link and the presets keep the filter
    html = _page(client, f"/workloads/?{span}&kind=vm")
    assert "Some filters were ignored: kind" in html
    html = _page(client, f"/workloads/?{span}&kind=k8s")
    assert "No workload held a GPU in this period" in html


def test_workload_detail_page(
    workload_example: dict[str, Any], role_client: Any, span: str, workload_hour: Any
) -> None:
    job = workload_example["jobs"]["101"]
    html = _page(role_client("finance"), f"/workloads/{job.pk}/?{span}")
    assert "alice" in html and "nlp" in html and "research" in html
    gpus = html[html.index('id="workload-gpus"') : html.index('id="workload-days"')]
    assert "gpu-01#0" in gpus and "/gpus/GPU-A/" in gpus and "0.45" in gpus
    assert "gpu-01#1" not in gpus
    days = html[html.index('id="workload-days"') :]
    assert workload_hour.strftime("%a %-d %b") in days and "0.5" in days
    viewer = _page(role_client("viewer"), f"/workloads/{job.pk}/?{span}")
    assert "0.45" not in viewer and "Idle" not in viewer
    assert role_client("finance").get("/workloads/999999/").status_code == 404


def test_gpu_page_lists_the_workloads_that_held_it(
    workload_example: dict[str, Any], role_client: Any, span: str
) -> None:
    html = _page(role_client("finance"), f"/gpus/GPU-A/?{span}")
    section = html[html.index('id="gpu-workloads"') :]
    assert "Workloads that held it" in section
    assert ">101<" in section and ">102<" in section and ">103<" not in section
    assert "0.09" in section


def test_overview_explains_held_hours_and_names_the_top_accounts(
    workload_example: dict[str, Any], role_client: Any, span: str
) -> None:
    # The overview leaves a slot that its script fills from the panel's own URL, once loaded.
    page = _page(role_client("finance"), f"/?{span}")
    assert f'data-fragment="/overview/workloads/?{span}' in page.replace("&amp;", "&")
    html = _page(role_client("finance"), f"/overview/workloads/?{span}")
    panel = html[html.index('id="workload-panel"') :]
    # GPU A held 0.2 h, GPU B 1.0 h; the workloads' held hours: 0.1 + 0.1 + 1.0 = 1.2.
    share = panel[panel.index('id="workload-share"') :]
    assert share.startswith('id="workload-share"><strong>100 %</strong>')
    top = panel[panel.index('id="top-accounts"') :]
    assert _ordered(top, "nlp", "vision") and "0.90" in top
    viewer = _page(role_client("viewer"), f"/overview/workloads/?{span}")
    assert 'id="workload-share"' in viewer and 'id="top-accounts"' not in viewer
