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
    # Other groupings have no cost centre of their own.
    (pool,) = finance.get(COSTS, day_query(group_by="pool")).json()["results"]
    assert pool["cost_center"] is None
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
