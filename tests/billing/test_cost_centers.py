"""Chargeback names cost centres (issue 18, item 4): the Teams table and the costs API grouped
by team (JSON and CSV) carry each team's ``cost_center``.

Figures by hand, ``make_fleet(2)`` over its three data days (72 h per GPU):
- research (pool training, owned H100: 30,000 over 5 years + 0.10/h, PUE 1.5, 0.20/kWh),
  one GPU at 15 %: fixed (30000 / 43830 + 0.10) × 72 = 56.481314; energy 72 h × (69 + 560 ×
  0.15) W = 11.016 kWh × 1.5 × 0.20 = 3.3048; total 59.786114 → 59.79.
- product (pool inference, rented at 2.35/h, energy included), one GPU: 2.35 × 72 = 169.20.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from typing import Any

import pytest
from django.http import StreamingHttpResponse
from django.urls import reverse

from tests.billing.test_dashboard_data import DAYS, day0, make_fleet, range_query

pytestmark = pytest.mark.django_db

COSTS = "/api/v1/costs"


def owned_and_rented() -> list[Any]:
    """``make_fleet(2)`` with its second GPU on a node of its own in the rented pool: both
    GPUs share a node there, and a node's pool decides a GPU's cost profile."""
    from fleet.models import Gpu, Node, Pool

    gpus = make_fleet(2)
    node = Node.objects.create(hostname="node-inference", pool=Pool.objects.get(name="inference"))
    Gpu.objects.filter(pk=gpus[1].pk).update(node=node)
    return gpus


def _fleet() -> None:
    from fleet.models import Team

    owned_and_rented()
    Team.objects.filter(name="research").update(cost_center="CC-4100")
    Team.objects.filter(name="product").update(cost_center="=1+2")  # typed text: escaped in CSV


def _query(**extra: str) -> dict[str, str]:
    end = day0() + dt.timedelta(days=DAYS)
    return {"start": day0().isoformat(), "end": end.isoformat(), **extra}


def test_costs_by_team_name_the_cost_centre(role_client: Any) -> None:
    _fleet()
    client = role_client("finance")
    rows = client.get(COSTS, _query(group_by="team")).json()["results"]
    assert [(r["key"], r["cost_center"], r["total_cost"]) for r in rows] == [
        ("product", "=1+2", "169.20"),
        ("research", "CC-4100", "59.79"),
    ]
    assert list(rows[0])[:3] == ["key", "name", "cost_center"]

    response = client.get(COSTS, _query(group_by="team", format="csv"))
    assert isinstance(response, StreamingHttpResponse)
    text = b"".join(response.streaming_content).decode()  # type: ignore[arg-type]
    table = list(csv.DictReader(io.StringIO(text)))
    assert text.splitlines()[0].startswith("key,name,cost_center,period_start,")
    assert [(r["key"], r["cost_center"], r["total_cost"]) for r in table] == [
        ("product", "'=1+2", "169.20"),  # a formula-looking cell is quoted for spreadsheets
        ("research", "CC-4100", "59.79"),
    ]
    for csv_row, json_row in zip(table, rows, strict=True):
        assert list(csv_row) == list(json_row)

    # Other groupings have no such column.
    pools = client.get(COSTS, _query(group_by="pool")).json()["results"]
    assert pools and all("cost_center" not in r for r in pools)
    header = b"".join(client.get(COSTS, _query(group_by="pool", format="csv")).streaming_content)
    assert b"cost_center" not in header


def test_costs_by_team_without_a_team_or_a_cost_centre(role_client: Any) -> None:
    from fleet.models import Team
    from telemetry.models import HourlyUsage

    _fleet()
    Team.objects.filter(name="research").update(cost_center="")
    # Grouping uses the team stored with each rollup: the product GPU's hours had no team.
    HourlyUsage.objects.filter(team__name="product").update(team=None)
    rows = role_client("finance").get(COSTS, _query(group_by="team")).json()["results"]
    assert [(r["key"], r["name"], r["cost_center"], r["total_cost"]) for r in rows] == [
        ("", "(none)", "", "169.20"),
        ("research", "research", "", "59.79"),
    ]


@pytest.mark.parametrize("role", ["finance", "viewer"])
def test_teams_table_names_the_cost_centre(role_client: Any, role: str) -> None:
    _fleet()
    html = role_client(role).get(f"{reverse('chargeback')}?{range_query()}").content.decode()
    team_table = re.search(r'<table[^>]*id="team-table".*?</table>', html, re.S)
    assert team_table, html[-2000:]
    assert "<th>Cost centre</th>" in team_table.group(0)
    cells = re.findall(
        # finance and admin: the name links to the team's printable statement
        r'<td class="strong" data-label="Team">(?:<a [^>]*>)?([^<]+)(?:</a>)?</td>'
        r'<td class="cost-center" data-label="Cost centre">([^<]+)</td>',
        team_table.group(0),
    )
    assert sorted(cells) == [("product", "=1+2"), ("research", "CC-4100")]
    if role == "finance":
        assert "59.79" in team_table.group(0) and "169.20" in team_table.group(0)
    # The pools table has no cost centre column.
    pool_table = re.search(r'<table[^>]*id="pool-table".*?</table>', html, re.S)
    assert pool_table and "Cost centre" not in pool_table.group(0)
