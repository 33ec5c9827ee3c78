"""Formula injection: every CSV the product writes neutralises every text cell (docs/finance.md,
"CSV cells"; issue 47, point 6).

Names come from people (teams, cost centres, sites) and from agents (GPU UUIDs, hostnames,
workload users, accounts and names). Each export below is fed such names as a spreadsheet
would run them (``=7*7``, ``@SUM(1+1)``, ``-2+3``, ``+1``, a leading tab or carriage return)
and must write each with a leading ``'`` (OWASP), while numbers, negative ones included, stay
as they are.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from billing.api.csv import CsvRenderer, csv_cell, csv_escape_text
from tests.billing.conftest import at, workload_span

HOSTILE = ("=7*7", "@SUM(1+1)", "-2+3", "+1", "\t=1+1", "\r=1+1", "-1E+2")


def _quoted(value: str) -> str:
    return "'" + value


def _table(content: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(content.decode())))


def _streamed(response: Any) -> list[dict[str, str]]:
    assert response.status_code == 200, response.content if hasattr(response, "content") else ""
    return _table(b"".join(response.streaming_content))


def _no_raw_formula(rows: list[dict[str, str]]) -> None:
    """No cell of any row starts as a spreadsheet formula, but plain decimal numbers."""
    for row in rows:
        for column, value in row.items():
            if value.startswith(("=", "+", "-", "@", "\t", "\r")):
                assert re.fullmatch(r"-[0-9]+(\.[0-9]+)?", value), (column, value)


# --- the rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", HOSTILE)
def test_text_starting_a_formula_gets_a_quote(value: str) -> None:
    assert csv_escape_text(value) == _quoted(value)
    assert csv_cell(value) == _quoted(value)


def test_numbers_stay_numbers() -> None:
    """A negative amount (an adjustment) is a number, whether the formatter wrote a Decimal or
    its text: a spreadsheet reads ``-3.20`` as that number and runs nothing."""
    assert csv_cell("-3.20") == "-3.20" and csv_cell("-3") == "-3"
    assert csv_cell(Decimal("-3.20")) == "-3.20" and csv_cell(-4) == "-4"
    assert csv_cell(-0.5) == "-0.5"
    assert csv_cell(None) == "" and csv_cell(True) == "true" and csv_cell(False) == "false"
    assert csv_cell("research") == "research" and csv_cell("2026-03") == "2026-03"
    # Anything else is text, whatever its type.
    assert csv_cell(["=1"]) == "['=1']" and csv_cell(_Named("=x")) == "'=x"


class _Named:
    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def test_the_renderer_neutralises_what_reaches_it() -> None:
    body = CsvRenderer().render([{"name": "=7*7", "cost": "-3.20", "n": Decimal("-1.5")}])
    assert body.decode().splitlines() == ["name,cost,n", "'=7*7,-3.20,-1.5"]


# --- every export ------------------------------------------------------------------------------
@pytest.fixture
def hostile_march(worked_example: Any) -> Iterator[dict[str, str]]:
    """The worked example (March 2026) with hostile names for what agents and people name:
    the GPU's UUID (agent), its host (agent), its team and cost centre, its pool and site."""
    from billing.models import CostProfile
    from fleet.models import Gpu, Node, Pool, Site, Team

    names = {
        "gpu": "=7*7",
        "node": "+1",
        "team": "@SUM(1+1)",
        "cost_center": "\t=1+1",
        "pool": "\r=1+1",
        "site": "-2+3",
    }
    Gpu.objects.filter(pk=worked_example.pk).update(uuid=names["gpu"])
    Node.objects.filter(hostname="gpu-07").update(hostname=names["node"])
    Team.objects.filter(name="research").update(
        name=names["team"], cost_center=names["cost_center"]
    )
    Pool.objects.filter(name="inference").update(name=names["pool"])
    CostProfile.objects.filter(scope_name="inference").update(scope_name=names["pool"])
    Site.objects.filter(name="fra1").update(name=names["site"])
    with time_machine.travel(at("2026-04-05T12"), tick=False):
        yield names


MARCH = {"start": "2026-03-01", "end": "2026-04-01"}


@pytest.mark.parametrize("group_by", ["gpu", "node", "team", "pool", "site"])
def test_costs_csv(hostile_march: dict[str, str], role_client: Any, group_by: str) -> None:
    finance = role_client("finance")
    query = {**MARCH, "group_by": group_by, "period": "month", "format": "csv"}
    (row,) = _streamed(finance.get("/api/v1/costs", query))
    assert row["key"] == _quoted(hostile_march[group_by])
    if group_by == "team":
        assert row["name"] == _quoted(hostile_march["team"])
        assert row["cost_center"] == _quoted(hostile_march["cost_center"])
    assert row["total_cost"] == "566.30"  # tests/billing/test_month_close.py, by hand
    _no_raw_formula([row])


@pytest.mark.parametrize("version", ["1.2", "1.0"])
def test_focus_api_csv(hostile_march: dict[str, str], role_client: Any, version: str) -> None:
    rows = _streamed(role_client("finance").get("/api/v1/focus", {**MARCH, "version": version}))
    assert len(rows) == 31  # fixed charges 2-31 March, and 2 March's energy
    for row in rows:
        assert row["ResourceId"] == _quoted(hostile_march["gpu"])
        assert row["ResourceName"] == _quoted(hostile_march["node"] + "#0")
        assert row["SubAccountId"] == row["SubAccountName"] == _quoted(hostile_march["team"])
        assert row["RegionId"] == row["RegionName"] == _quoted(hostile_march["site"])
    _no_raw_formula(rows)


def test_focus_month_file(
    hostile_march: dict[str, str], role_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from billing.models import FocusExport
    from config.celery import app

    before = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    try:
        finance = role_client("finance")
        with django_capture_on_commit_callbacks(execute=True):
            finance.post("/chargeback/focus/", {"month": "2026-03", "version": "1.2"})
    finally:
        app.conf.task_always_eager, app.conf.task_eager_propagates = before
    export = FocusExport.objects.get()
    rows = _table(gzip.decompress(finance.get(f"/chargeback/focus/{export.pk}/").content))
    assert len(rows) == export.rows == 31
    assert {r["ResourceId"] for r in rows} == {_quoted(hostile_march["gpu"])}
    assert {r["SubAccountName"] for r in rows} == {_quoted(hostile_march["team"])}
    _no_raw_formula(rows)


def test_costs_and_focus_keep_a_negative_adjustment_a_number(
    hostile_march: dict[str, str], role_client: Any
) -> None:
    """March closed, then its site's tariff lowered from 0.20 to 0.10 per kWh: April carries a
    negative correction, a number in both CSVs, while its names are still quoted. By hand:
    energy 4.95 kWh × 1.5 × (0.10 − 0.20) = −0.7425; idle energy 0.95 kWh of it: −0.1425."""
    from fleet.models import Site
    from tests.billing.test_month_close import book, close

    close()
    site = Site.objects.get(name=hostile_march["site"])
    site.price_per_kwh = Decimal("0.10")
    site.save()
    book()
    finance = role_client("finance")
    april = {"start": "2026-04-01", "end": "2026-05-01"}
    query = {**april, "group_by": "gpu", "period": "month", "format": "csv"}
    costs = _streamed(finance.get("/api/v1/costs", query))
    (adjustment,) = [r for r in costs if r["adjustment_for"] == "2026-03"]
    assert adjustment["key"] == _quoted(hostile_march["gpu"])
    assert (adjustment["energy_cost"], adjustment["idle_cost"]) == ("-0.74", "-0.14")
    focus = _streamed(finance.get("/api/v1/focus", april))
    (correction,) = [r for r in focus if r["ChargeCategory"] == "Adjustment"]
    assert correction["ResourceId"] == _quoted(hostile_march["gpu"])
    assert correction["BilledCost"] == "-0.7425000000"
    assert correction["x_IdleCost"] == "-0.1425000000"
    _no_raw_formula(costs + focus)


@pytest.fixture
def hostile_workloads(workload_example: dict[str, Any]) -> dict[str, str]:
    """The workload example with what a job controls (user, account, name, key) and what
    people name (team, cost centre, site) set to formulas."""
    from fleet.models import Site, Team
    from telemetry.models import Workload

    names = {
        "key": "=7*7",
        "user": "-2+3",
        "account": "+1",
        "name": "@SUM(1+1)",
        "team": "\t=1+1",
        "cost_center": "=1+2",
        "site": "\r=1+1",
    }
    Workload.objects.filter(key="103").update(
        key=names["key"], user_name=names["user"], account=names["account"], name=names["name"]
    )
    Team.objects.filter(name="research").update(
        name=names["team"], cost_center=names["cost_center"]
    )
    Site.objects.filter(name="fra1").update(name=names["site"])
    return names


@pytest.mark.parametrize("group_by", ["workload", "user", "account", "team"])
def test_workloads_csv(
    hostile_workloads: dict[str, str], role_client: Any, workload_hour: Any, group_by: str
) -> None:
    span = {k: v.isoformat() for k, v in workload_span(workload_hour).items()}
    query = {**span, "group_by": group_by, "format": "csv"}
    rows = _streamed(role_client("finance").get("/api/v1/workloads", query))
    assert rows
    _no_raw_formula(rows)
    if group_by == "workload":
        (job,) = [r for r in rows if r["key"] == _quoted(hostile_workloads["key"])]
        for field in ("user", "account", "name", "team", "site"):
            assert job[field] == _quoted(hostile_workloads[field]), field
        assert job["idle_cost"] == "0.81"  # tests/billing/test_api_workloads.py, by hand
    if group_by == "team":
        (team,) = rows
        assert team["key"] == _quoted(hostile_workloads["team"])
        assert team["cost_center"] == _quoted(hostile_workloads["cost_center"])
