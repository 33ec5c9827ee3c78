"""Work figures (docs/metrics.md, "Work"): what the SMs really did, from profiling data, through
the selectors, the finance API, the pages and the weekly email.

By hand, for the worked example with profiling data (``profiled_example``): 20 hours profiled,
10 of them at SM active 0.30 and tensor active 0.15, the rest at 0:
  work hours 10 × 3,600 × 0.30 / 3,600 = 3.0; work utilisation 3.0 / 20 = 0.15;
  tensor hours 1.5; tensor utilisation 1.5 / 20 = 0.075;
  busy but not working = the 9.0 air hours of the profiled samples − 3.0 = 6.0;
  the 20 GPU-hours with data cost 20 × 0.784463 + 4.95 kWh × 1.5 × 0.20
  = 15.689254 + 1.485 = 17.174254; per work hour 17.174254 / 3 = 5.724751 → 5.72.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.urls import reverse

from billing import report
from billing.cost_model import money_round
from billing.selectors import Filters, cost_rows
from tests.billing.conftest import EXAMPLE_DAY, EXAMPLE_NOW, at

pytestmark = pytest.mark.django_db

NEXT_DAY = EXAMPLE_DAY + dt.timedelta(days=1)
RATE = Decimal(30000) / Decimal(43830) + Decimal("0.10")  # the worked example's fixed rate
PROFILED_COST = RATE * 20 + Decimal("4.95") * Decimal("1.5") * Decimal("0.20")
WORK_FIELDS = (
    "work_hours",
    "busy_not_working_hours",
    "work_utilization",
    "tensor_hours",
    "tensor_utilization",
    "cost_per_work_hour",
)


@pytest.fixture
def frozen() -> Any:
    with time_machine.travel(EXAMPLE_NOW, tick=False):
        yield


def _fleet_row(**kwargs: Any) -> Any:
    (row,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="fleet", now=EXAMPLE_NOW, **kwargs)
    return row


# --- selectors ---------------------------------------------------------------------------------
def test_work_figures_of_the_worked_example(profiled_example: Any) -> None:
    row = _fleet_row()
    assert row.profiled_hours == 20.0
    assert row.work_hours == 3.0
    assert row.busy_not_working_hours == 6.0
    assert row.work_utilization == 0.15
    assert row.tensor_hours == 1.5
    assert row.tensor_utilization == 0.075
    assert row.cost_per_work_hour == PROFILED_COST / 3
    assert money_round(row.cost_per_work_hour) == Decimal("5.72")
    # The day's other figures do not move: 20.31 in total, 2.26 per air hour.
    assert money_round(row.total_cost) == Decimal("20.31")
    assert money_round(row.cost_per_air_hour) == Decimal("2.26")


def test_no_profiling_data_is_null_never_zero(worked_example: Any) -> None:
    row = _fleet_row()
    assert row.profiled_hours == 0
    assert all(getattr(row, name) is None for name in WORK_FIELDS)


def test_a_gpu_without_profiling_data_counts_in_no_work_figure(
    profiled_example: Any, fleet: Any
) -> None:
    """A second GPU, no profiling data, 24 h in service (12 h in the air): the fleet's total
    cost grows, its work figures and cost per work hour stay those of the profiled GPU."""
    other = fleet.gpu(
        "GPU-other", node=profiled_example.node, index=1, in_service_at=at("2026-03-02T00")
    )
    fleet.save(
        [
            fleet.usage(
                other,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                air_s=1800,
                held_s=1800,
                energy_j=1_000_000,
            )
            for h in range(24)
        ]
    )
    row = _fleet_row()
    assert (row.work_hours, row.work_utilization, row.profiled_hours) == (3.0, 0.15, 20.0)
    assert row.cost_per_work_hour == PROFILED_COST / 3
    assert money_round(row.total_cost) > Decimal("40")
    by_gpu = {
        r.key: r
        for r in cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="gpu", now=EXAMPLE_NOW)
    }
    assert by_gpu["GPU-other"].work_utilization is None
    assert by_gpu["GPU-other"].cost_per_work_hour is None
    assert by_gpu["GPU-example"].work_hours == 3.0


def test_rented_gpu_pays_no_energy_per_work_hour(fleet: Any) -> None:
    """Rented at 2.00 per hour (energy included): 10 GPU-hours with SM active 0.5 are 5 work
    hours and cost 20.00, 4.00 per work hour; the 1 kWh they drew costs nothing extra."""
    node = fleet.node("rent-1", site=fleet.site("fra1"))
    gpu = fleet.gpu("GPU-rented", node=node, in_service_at=at("2026-03-02T00"))
    fleet.rented("gpu:GPU-rented", rental_rate_per_hour="2.00")
    fleet.save(
        [
            fleet.usage(
                gpu,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                air_s=3600,
                energy_j=360_000,
                sm_active_s=1800,
                sm_observed_s=3600,
                sm_air_s=3600,
                sm_hours=1,
                sm_hours_energy_j=360_000,
            )
            for h in range(10)
        ]
    )
    row = _fleet_row()
    assert row.work_hours == 5.0 and row.busy_not_working_hours == 5.0
    assert row.cost_per_work_hour == Decimal("4.00")
    assert row.tensor_hours is None and row.tensor_utilization is None


def test_work_figures_per_day_and_per_team(profiled_example: Any) -> None:
    """The overview's trend and the chargeback's teams read the same sums."""
    (day,) = cost_rows(
        start=EXAMPLE_DAY, end=NEXT_DAY, group_by="fleet", period="day", now=EXAMPLE_NOW
    )
    (team,) = cost_rows(start=EXAMPLE_DAY, end=NEXT_DAY, group_by="team", now=EXAMPLE_NOW)
    for row in (day, team):
        assert (row.work_hours, row.work_utilization, row.tensor_utilization) == (3.0, 0.15, 0.075)
        assert money_round(row.cost_per_work_hour) == Decimal("5.72")
    assert _fleet_row(filters=Filters(teams=("research",))).work_hours == 3.0


# --- finance API ---------------------------------------------------------------------------------
def _api(role_client: Any, **extra: str) -> Any:
    query = {"start": EXAMPLE_DAY.isoformat(), "end": NEXT_DAY.isoformat(), **extra}
    return role_client("finance").get("/api/v1/costs", query)


def test_api_work_figures_to_the_cent(profiled_example: Any, role_client: Any, frozen: Any) -> None:
    response = _api(role_client)
    assert response.status_code == 200, response.content
    (row,) = response.json()["results"]
    assert row["profiled_hours"] == 20.0
    assert row["work_hours"] == 3.0
    assert row["busy_not_working_hours"] == 6.0
    assert row["work_utilization"] == 0.15
    assert row["tensor_hours"] == 1.5
    assert row["tensor_utilization"] == 0.075
    assert row["cost_per_work_hour"] == "5.72"
    assert row["cost_per_air_hour"] == "2.26"

    text = b"".join(_api(role_client, format="csv").streaming_content).decode()
    (line,) = list(csv.DictReader(io.StringIO(text)))
    assert (line["work_hours"], line["work_utilization"], line["tensor_utilization"]) == (
        "3.0",
        "0.15",
        "0.075",
    )
    assert (line["busy_not_working_hours"], line["cost_per_work_hour"]) == ("6.0", "5.72")


def test_api_work_figures_are_null_without_data(
    worked_example: Any, role_client: Any, frozen: Any
) -> None:
    (row,) = _api(role_client).json()["results"]
    assert row["profiled_hours"] == 0.0
    assert all(row[name] is None for name in WORK_FIELDS)
    text = b"".join(_api(role_client, format="csv").streaming_content).decode()
    (line,) = list(csv.DictReader(io.StringIO(text)))
    assert all(line[name] == "" for name in WORK_FIELDS)


def test_from_raw_samples_through_the_rollup_to_the_api(fleet: Any, role_client: Any) -> None:
    """Two raw samples of one minute each, two days ago, on an owned GPU at the worked
    example's terms: 90 % util, 24,000 J, SM 0.5 and tensor 0.25 over 30 of its 60 s (prof_s);
    50 % util, 12,000 J, SM 0.25 over the whole minute (no prof_s), no tensor. By hand:
      profiled 30 + 60 = 90 s = 0.025 h; work 0.5 × 30 + 0.25 × 60 = 30 s = 0.008333 h;
      work utilisation 30 / 90 = 0.333333; tensor 0.25 × 30 = 7.5 s = 0.002083 h, tensor
      utilisation 7.5 / 30 = 0.25; busy but not working (54 + 30) − 30 = 54 s = 0.015 h;
      the one GPU-hour with data: 0.784463 + 36,000 J = 0.01 kWh × 1.5 × 0.20 = 0.787463;
      per work hour 0.787463 / (30 / 3600) = 94.495524 → 94.50."""
    from django.utils import timezone

    from telemetry.rollup import rollup_run
    from tests.telemetry.conftest import sample, samples_ingest

    now = timezone.now().astimezone(dt.UTC)
    hour = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(days=2)
    node = fleet.node("gpu-09", site=fleet.site("fra1", pue="1.5", price_per_kwh="0.20"))
    gpu = fleet.gpu("GPU-raw", node=node, in_service_at=hour)
    fleet.owned("gpu:GPU-raw")
    samples_ingest(
        [
            sample(gpu, hour, util=90.0, energy_j=24_000.0, procs=1, sm_active=0.5,
                   tensor_active=0.25, prof_s=30.0),
            sample(gpu, hour + dt.timedelta(minutes=1), util=50.0, energy_j=12_000.0, procs=1,
                   sm_active=0.25),
        ]
    )  # fmt: skip
    rollup_run()
    day = hour.date()
    response = role_client("finance").get(
        "/api/v1/costs", {"start": day.isoformat(), "end": (day + dt.timedelta(days=1)).isoformat()}
    )
    assert response.status_code == 200, response.content
    (row,) = response.json()["results"]
    assert (row["profiled_hours"], row["work_hours"], row["busy_not_working_hours"]) == (
        0.025,
        0.008333,
        0.015,
    )
    assert (row["work_utilization"], row["tensor_hours"], row["tensor_utilization"]) == (
        0.333333,
        0.002083,
        0.25,
    )
    assert row["cost_per_work_hour"] == "94.50"


# --- pages ------------------------------------------------------------------------------------
def _page(role_client: Any, name: str, role: str = "finance", *args: str) -> str:
    url = f"{reverse(name, args=args)}?from={EXAMPLE_DAY}&to={EXAMPLE_DAY}"
    response = role_client(role).get(url)
    assert response.status_code == 200, name
    return response.content.decode()


def _kpi(html: str, ident: str) -> str:
    found = re.search(rf'id="{ident}">.*?<p class="value"[^>]*>([^<]+)<', html, re.S)
    assert found, ident
    return found.group(1).strip()


def test_pages_show_the_work_figures(profiled_example: Any, role_client: Any, frozen: Any) -> None:
    html = _page(role_client, "overview")
    assert _kpi(html, "kpi-cost-per-work-hour") == "5.72"
    assert "SMs worked 15.0 % of the time profiled" in html
    assert 'id="chart-busy-working"' in html
    html = _page(role_client, "overview", "viewer")
    assert _kpi(html, "kpi-work-utilization") == "15.0 %"
    assert "5.72" not in html  # a viewer sees no money
    assert 'data-label="Work util. %">15.0 %<' in _page(role_client, "fleet-board")
    assert 'data-label="Work util. %">15.0 %<' in _page(role_client, "chargeback")
    html = _page(role_client, "gpu-detail", "finance", "GPU-example")
    assert 'id="chart-gpu-activity"' in html
    assert _kpi(html, "kpi-cost-per-work-hour") == "5.72"


def test_pages_say_no_profiling_data_instead_of_zero(
    worked_example: Any, role_client: Any, frozen: Any
) -> None:
    html = _page(role_client, "overview")
    assert _kpi(html, "kpi-cost-per-work-hour") == "no profiling data"
    assert 'id="chart-busy-working"' not in html
    assert "No profiling data: no GPU in this range and filter reports SM activity" in html
    assert _kpi(_page(role_client, "overview", "viewer"), "kpi-work-utilization") == (
        "no profiling data"
    )
    for name in ("fleet-board", "chargeback"):
        assert re.search(
            r'nodata-cell" data-label="Work util. %">no profiling data<', _page(role_client, name)
        ), name
    html = _page(role_client, "gpu-detail", "finance", "GPU-example")
    assert 'id="chart-gpu-activity"' not in html
    assert _kpi(html, "kpi-cost-per-work-hour") == "no profiling data"
    assert "No profiling data: this GPU reports no SM, tensor or memory activity" in html


# --- weekly email --------------------------------------------------------------------------------
def test_weekly_email_has_one_line_of_real_work(profiled_example: Any) -> None:
    data = report.weekly_report_build(week_start=EXAMPLE_DAY, now=EXAMPLE_NOW)
    line = (
        "Real work: the SMs worked 15.0 % of the 20.0 GPU-hours profiled (3.0 work hours); "
        "cost per work hour 5.72 USD."
    )
    assert data.work == line
    rendered = report.weekly_report_render(data, with_chart=False)
    assert f"- {line}" in rendered.text and line in rendered.html


def test_weekly_email_says_no_profiling_data(worked_example: Any) -> None:
    data = report.weekly_report_build(week_start=EXAMPLE_DAY, now=EXAMPLE_NOW)
    assert data.work.startswith("Real work: no profiling data")
