"""Chargeback in two clicks: cost centres in the Teams table and every team-grouped export."""

from __future__ import annotations

import csv
import io
from typing import Any

from tests.billing.conftest import day_query

COSTS = "/api/v1/costs"


def test_team_rows_carry_the_cost_centre(worked_example: Any, finance: Any) -> None:
    from fleet.models import Team

    Team.objects.filter(name="research").update(cost_center="CC-4100")
    (row,) = finance.get(COSTS, day_query(group_by="team")).json()["results"]
    assert (row["key"], row["cost_center"]) == ("research", "CC-4100")
    # Other groupings have no cost centre of their own: no such field.
    (pool,) = finance.get(COSTS, day_query(group_by="pool")).json()["results"]
    assert "cost_center" not in pool
    # The monthly chargeback CSV: one row per team and month, with GPU hours (capacity), air
    # hours, idle cost and total, by the same figures (the worked example's 24 h, 9 h, 12.05,
    # 20.31).
    response = finance.get(
        COSTS,
        {
            "start": "2026-03-02",
            "end": "2026-03-03",
            "group_by": "team",
            "period": "month",
            "format": "csv",
        },
    )
    (line,) = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    assert (line["key"], line["cost_center"], line["capacity_hours"], line["air_hours"]) == (
        "research",
        "CC-4100",
        "24.0",
        "9.0",
    )
    assert (line["idle_cost"], line["total_cost"]) == ("12.05", "20.31")


def test_teams_table_shows_cost_centres_and_the_monthly_csv(
    worked_example: Any, finance: Any
) -> None:
    from fleet.models import Team

    Team.objects.filter(name="research").update(cost_center="CC-4100")
    page = finance.get("/chargeback/", {"from": "2026-03-02", "to": "2026-03-02"}).content.decode()
    assert "<th>Cost centre</th>" in page and 'data-label="Cost centre">CC-4100<' in page
    assert "group_by=team&amp;period=month&amp;start=2026-03-02&amp;end=2026-03-03" in page


def test_team_statement_is_printable_and_finance_only(
    worked_example: Any, finance: Any, role_client: Any
) -> None:
    from fleet.models import Team

    Team.objects.filter(name="research").update(cost_center="CC-4100")
    day = {"from": "2026-03-02", "to": "2026-03-02"}
    teams = finance.get("/chargeback/", day).content.decode()
    assert 'href="/chargeback/teams/research/?from=2026-03-02&amp;to=2026-03-02"' in teams
    page = finance.get("/chargeback/teams/research/", day).content.decode()
    assert 'id="cost-center">CC-4100<' in page
    # The worked example by hand: 24 GPU hours, 9 in the air, 37.5 %, idle 12.05, total 20.31,
    # the same on the team, pool and GPU lines (one GPU in one pool).
    total = page[page.index('id="statement-total"') : page.index('id="statement-pools"')]
    for cell in ("24.0", "9.0", "37.5 %", "12.05", "20.31"):
        assert f">{cell}</td>" in total, cell
    gpus = page[page.index('id="statement-gpus"') :]
    assert "gpu-07#0" in gpus and ">20.31</td>" in gpus
    # Printing leaves out the navigation and the filter bar (the print stylesheet).
    assert 'class="noprint"' in page
    assert finance.get("/chargeback/teams/nobody/", day).status_code == 404
    assert role_client("viewer").get("/chargeback/teams/research/", day).status_code == 403


def test_print_stylesheet_hides_navigation_and_filters() -> None:
    from pathlib import Path

    css = (Path(__file__).resolve().parents[2] / "static/css/app.css").read_text()
    rule = css[css.index("@media print") :]
    assert ".topbar, .filters, .noprint" in rule and "display:none" in rule
