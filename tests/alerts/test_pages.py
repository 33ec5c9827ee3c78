"""The Alerts page, the navigation's badge, and ``GET /api/v1/alerts``: firing first, then
history; filters; who was told; money values only for finance and admin."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from alerts.models import Alert, Rule
from fleet.services import api_token_issue
from tests.alerts.conftest import open_alert, seed_alerts

pytestmark = pytest.mark.django_db


@pytest.fixture
def alerts(db: Any, settings: Any) -> dict[str, Any]:
    settings.SITE_URL = "https://gpufleet.example.com"
    return seed_alerts()


def _page(role_client: Any, role: str, query: str = "") -> str:
    response = role_client(role).get(f"/alerts/{query}")
    assert response.status_code == 200
    return str(response.content.decode())


@pytest.mark.smoke
def test_the_page_lists_firing_alerts_first_then_history_and_the_rules(
    alerts: dict[str, Any], role_client: Any
) -> None:
    page = _page(role_client, "finance")
    firing_table, rest = page.split('id="alerts-history-table"')
    history_table, rules_table = rest.split('id="alert-rules"')
    assert f'id="alert-{alerts["firing"].pk}"' in firing_table
    assert f'id="alert-{alerts["money"].pk}"' in firing_table
    assert f'id="alert-{alerts["old"].pk}"' in history_table
    assert "6.3 h" in firing_table and "&gt; 4.0 h" in firing_table  # value against threshold
    assert "1,234.57 EUR" in firing_table and "&gt; 1,000.00 EUR" in firing_table
    assert "for 3 h 0 min" in firing_table
    assert "/gpus/GPU-a/?from=" in firing_table  # the page that explains it
    # Who was told: the address; the webhook by its host only (its path is its secret).
    assert "ops@example.com" in firing_table
    assert "https://hooks.slack.example/…" in firing_table and "(failed)" in firing_table
    assert "s3cr3t" not in page
    assert "held-idle" in rules_table and "pool:training" in rules_table
    assert "every 24 h" in rules_table


def test_viewers_see_alerts_without_money(alerts: dict[str, Any], role_client: Any) -> None:
    page = _page(role_client, "viewer")
    assert f'id="alert-{alerts["money"].pk}"' in page
    assert "1,234.57" not in page and "1,000.00" not in page and "EUR" not in page
    assert "6.3 h" in page  # not money: shown


def test_filters_narrow_the_lists_and_bad_values_are_ignored(
    alerts: dict[str, Any], role_client: Any
) -> None:
    resolved = _page(role_client, "viewer", "?state=resolved")
    assert f'id="alert-{alerts["old"].pk}"' in resolved
    assert f'id="alert-{alerts["firing"].pk}"' not in resolved
    by_rule = _page(role_client, "viewer", "?rule=budget")
    assert f'id="alert-{alerts["money"].pk}"' in by_rule
    assert f'id="alert-{alerts["firing"].pk}"' not in by_rule
    by_subject = _page(role_client, "viewer", "?subject=gpu%3AGPU-b")
    assert f'id="alert-{alerts["old"].pk}"' in by_subject
    assert f'id="alert-{alerts["firing"].pk}"' not in by_subject
    odd = _page(role_client, "viewer", "?state=maybe&rule_kind=x&subject=%00&page=99999999999999")
    assert "Some filters were ignored" in odd
    assert f'id="alert-{alerts["firing"].pk}"' in odd


def test_the_navigation_shows_a_badge_while_alerts_fire(
    alerts: dict[str, Any], role_client: Any
) -> None:
    client = role_client("viewer")
    overview = client.get("/").content.decode()
    assert '<a href="/alerts/">Alerts <span class="nav-badge" title="2 firing">' in overview
    Alert.objects.update(resolved_at=timezone.now())
    overview = client.get("/").content.decode()
    assert '<a href="/alerts/">Alerts</a>' in overview and "nav-badge" not in overview
    page = client.get("/alerts/").content.decode()
    assert '<a href="/alerts/" class="active" aria-current="page">Alerts</a>' in page


# --- the API ---------------------------------------------------------------------------------
def _api(role: str, query: str = "") -> Any:
    _, token = api_token_issue(username=f"api-{role}", role=role)
    return Client().get(f"/api/v1/alerts{query}", HTTP_AUTHORIZATION=f"Bearer {token}")


def test_the_api_lists_alerts_with_their_figures_and_who_was_told(
    alerts: dict[str, Any],
) -> None:
    response = _api("finance")
    assert response.status_code == 200
    rows = response.json()["results"]
    # Open ones first, newest first; then the resolved one.
    assert [r["id"] for r in rows][:2] == [alerts["money"].pk, alerts["firing"].pk]
    assert rows[-1]["id"] == alerts["old"].pk and rows[-1]["state"] == "resolved"
    by_id = {r["id"]: r for r in rows}
    gpu = by_id[alerts["firing"].pk]
    assert (gpu["rule"], gpu["rule_kind"], gpu["subject"], gpu["state"]) == (
        "held-idle",
        "gpu_held_hours",
        "gpu:GPU-a",
        "firing",
    )
    assert (gpu["value"], gpu["peak_value"], gpu["threshold"], gpu["unit"]) == (
        "6.25",
        "7",
        "4",
        "h",
    )
    assert gpu["url"].startswith("https://gpufleet.example.com/gpus/GPU-a/?from=")
    assert [(n["channel"], n["target"], n["status"]) for n in gpu["notified"]] == [
        ("email", "ops@example.com", "sent"),
        ("webhook", "https://hooks.slack.example/…", "failed"),
    ]
    money = by_id[alerts["money"].pk]
    assert (money["value"], money["threshold"], money["unit"], money["values_hidden"]) == (
        "1234.57",
        "1000.00",
        "EUR",
        False,
    )


def test_viewers_get_alerts_without_money_values(alerts: dict[str, Any]) -> None:
    rows = {r["id"]: r for r in _api("viewer").json()["results"]}
    money = rows[alerts["money"].pk]
    assert (money["value"], money["peak_value"], money["threshold"], money["values_hidden"]) == (
        None,
        None,
        None,
        True,
    )
    assert rows[alerts["firing"].pk]["value"] == "6.25"


@pytest.mark.parametrize(
    ("query", "want"),
    [
        ("?state=firing", {"firing", "money"}),
        ("?state=resolved", {"old"}),
        ("?rule=held-idle", {"firing", "old"}),
        ("?rule_kind=budget_month", {"money"}),
        ("?subject=gpu:GPU-b", {"old"}),
        ("?state=resolved&rule=budget", set()),
    ],
)
def test_the_api_filters(alerts: dict[str, Any], query: str, want: set[str]) -> None:
    ids = {r["id"] for r in _api("viewer", query).json()["results"]}
    assert ids == {alerts[name].pk for name in want}


def test_the_since_and_until_filters(alerts: dict[str, Any]) -> None:
    now = timezone.now()
    recent = (now - dt.timedelta(hours=12)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ids = {r["id"] for r in _api("viewer", f"?since={recent}").json()["results"]}
    assert ids == {alerts["firing"].pk, alerts["money"].pk}  # the old one resolved a day ago
    ids = {r["id"] for r in _api("viewer", f"?until={recent}").json()["results"]}
    assert ids == {alerts["old"].pk}  # the others started firing within the last 12 h


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?state=open", "state"),
        ("?rule_kind=gpu_happy_hours", "rule_kind"),
        ("?since=yesterday", "since"),
        ("?since=0001-01-01T00:00:00Z", "since"),
        ("?until=9999-12-31T00:00:00Z", "until"),
        ("?subject=%00", "subject"),
        ("?limit=0", "limit"),
    ],
)
def test_bad_filters_answer_400_naming_the_parameter(
    alerts: dict[str, Any], query: str, field: str
) -> None:
    response = _api("viewer", query)
    assert response.status_code == 400
    assert field in response.json()


def test_the_api_needs_a_role(alerts: dict[str, Any], make_user: Any) -> None:
    assert Client().get("/api/v1/alerts").status_code == 401
    client = Client()
    client.force_login(make_user(None))
    assert client.get("/api/v1/alerts").status_code == 403


def test_the_api_reads_a_fixed_number_of_queries(alerts: dict[str, Any]) -> None:
    _, token = api_token_issue(username="api-count", role="viewer")
    client = Client()

    def count() -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as ctx:
            response = client.get("/api/v1/alerts", HTTP_AUTHORIZATION=f"Bearer {token}")
            assert response.status_code == 200
        return len(ctx.captured_queries)

    count()  # warm: the token's first use is written once
    before = count()
    rule = Rule.objects.get(name="held-idle")
    for i in range(20):
        open_alert(rule, f"gpu:GPU-more-{i}")
    assert count() == before


def test_the_rows_are_what_the_schema_documents(alerts: dict[str, Any]) -> None:
    from alerts.api.serializers import AlertSerializer, NoticeSerializer

    rows = {r["id"]: r for r in _api("finance").json()["results"]}
    row = rows[alerts["firing"].pk]
    assert set(row) == set(AlertSerializer().fields)
    assert set(row["notified"][0]) == set(NoticeSerializer().fields)


def test_the_schema_documents_the_alerts_api() -> None:
    from pathlib import Path

    import yaml
    from django.conf import settings

    schema = yaml.safe_load((Path(settings.BASE_DIR) / "docs" / "openapi.yaml").read_text())
    get = schema["paths"]["/api/v1/alerts"]["get"]
    names = {p["name"] for p in get["parameters"]}
    assert {"state", "rule", "rule_kind", "subject", "since", "until", "limit", "offset"} <= names
    state = next(p for p in get["parameters"] if p["name"] == "state")
    assert state["schema"]["enum"] == ["firing", "resolved"]
