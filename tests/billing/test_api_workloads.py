"""GET /api/v1/workloads: the worked example of docs/metrics.md through the API (JSON and
CSV, to the cent), its order, its filters, and bad parameters answered 400 naming the field.
Who may call it: tests/billing/test_api_permissions.py and tests/reliability/test_url_matrix.py.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from tests.billing.conftest import workload_span


def _get(client: Any, **params: str) -> Any:
    return client.get("/api/v1/workloads", params)


@pytest.fixture
def finance(role_client: Any) -> Any:
    return role_client("finance")


@pytest.fixture
def span(workload_hour: Any) -> dict[str, str]:
    return {k: v.isoformat() for k, v in workload_span(workload_hour).items()}


@pytest.mark.smoke
def test_workload_rows_to_the_cent(
    workload_example: dict[str, Any], finance: Any, span: dict[str, str], workload_hour: Any
) -> None:
    response = _get(finance, **span)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 3
    rows = body["results"]
    assert [(r["key"], r["cost"], r["idle_cost"]) for r in rows] == [
        ("103", "0.81", "0.81"),
        ("101", "0.45", "0.09"),
        ("102", "0.45", "0.09"),
    ]
    assert rows[1] == {
        "key": "101",
        "kind": "slurm",
        "name": "job-101",
        "user": "alice",
        "account": "nlp",
        "team": "research",
        "site": "fra1",
        "gpus": 1,
        "workloads": 1,
        "first_seen": workload_hour.isoformat(),
        "last_seen": workload_hour.replace(hour=workload_hour.hour + 1).isoformat(),
        "gpu_hours": 0.5,
        "air_hours": 0.4,
        "held_hours": 0.1,
        "utilization": 0.8,
        "energy_kwh": 0.2,
        "cost": "0.45",
        "idle_cost": "0.09",
        "currency": "EUR",
        "priced": True,
    }


def test_groups_filters_and_csv(
    workload_example: dict[str, Any], finance: Any, span: dict[str, str]
) -> None:
    accounts = _get(finance, **span, group_by="account").json()["results"]
    assert [(r["key"], r["cost"], r["idle_cost"], r["gpus"]) for r in accounts] == [
        ("nlp", "1.26", "0.90", 2),
        ("vision", "0.45", "0.09", 1),
    ]
    assert accounts[0]["user"] is None  # alice and carol
    only_bob = _get(finance, **span, user="bob").json()["results"]
    assert [r["key"] for r in only_bob] == ["102"]
    assert _get(finance, **span, kind="k8s,user").json()["count"] == 0
    response = _get(finance, **span, group_by="user", format="csv")
    assert response["Content-Type"].startswith("text/csv")
    text = b"".join(response.streaming_content).decode()
    table = list(csv.DictReader(io.StringIO(text)))
    assert [(r["key"], r["cost"], r["idle_cost"]) for r in table] == [
        ("carol", "0.81", "0.81"),
        ("alice", "0.45", "0.09"),
        ("bob", "0.45", "0.09"),
    ]
    assert table[0]["account"] == "nlp" and table[0]["held_hours"] == "1.0"


def test_team_rows_name_their_cost_centre(
    workload_example: dict[str, Any], finance: Any, span: dict[str, str]
) -> None:
    """Chargeback: every team-grouped export names the team's cost centre (the research
    team's row is docs/metrics.md's 1.71 / 0.99)."""
    from fleet.models import Team

    Team.objects.filter(name="research").update(cost_center="CC-4100")
    (team,) = _get(finance, **span, group_by="team").json()["results"]
    assert (team["key"], team["cost_center"], team["cost"], team["idle_cost"]) == (
        "research",
        "CC-4100",
        "1.71",
        "0.99",
    )
    response = _get(finance, **span, group_by="team", format="csv")
    text = b"".join(response.streaming_content).decode()
    assert text.splitlines()[0].startswith("key,cost_center,kind,")
    (line,) = csv.DictReader(io.StringIO(text))
    assert (line["key"], line["cost_center"]) == ("research", "CC-4100")
    # Other groupings have no cost centre of their own: no such field.
    users = _get(finance, **span, group_by="user").json()["results"]
    assert all("cost_center" not in r for r in users)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"group_by": "pool"}, "group_by"),
        ({"kind": "slurm,vm"}, "kind"),
        ({"team": "nobody"}, "team"),
        ({"site": "nowhere"}, "site"),
        ({"start": "2026-13-01"}, "start"),
        ({"start": "2026-03-02", "end": "2026-03-01"}, "end"),
        ({"groupby": "user"}, "groupby"),
        ({"limit": "-1"}, "limit"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(
    workload_example: dict[str, Any], finance: Any, params: dict[str, str], field: str
) -> None:
    response = _get(finance, **params)
    assert response.status_code == 400, response.content
    assert field in response.json()
    csv_too = _get(finance, **params, format="csv")
    assert csv_too.status_code == 400 and field in csv_too.json()
