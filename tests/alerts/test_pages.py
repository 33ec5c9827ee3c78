"""The Alerts page and the navigation's badge: firing first, then history; filters; who was
told; money values only for finance and admin."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from alerts.models import Alert, Delivery, Rule
from tests.alerts.conftest import open_alert, rules_apply

pytestmark = pytest.mark.django_db


@pytest.fixture
def alerts(db: Any, settings: Any) -> dict[str, Any]:
    """A firing GPU alert told by email and webhook, a firing budget alert (money), and a
    resolved one, as evaluations would have left them."""
    from fleet.models import FleetSettings, Pool

    settings.SITE_URL = "https://gpufleet.example.com"
    Pool.objects.create(name="training")
    rules_apply(
        {
            "name": "held-idle",
            "rule": "gpu_held_hours",
            "scope": "pool:training",
            "threshold": 4,
            "notify": ["mailto:ops@example.com", "https://hooks.slack.example/T000/B000/s3cr3t"],
        },
        {"name": "budget", "rule": "budget_month", "threshold": "1000.00"},
    )
    FleetSettings.objects.update_or_create(pk=1, defaults={"currency": "EUR"})
    held, budget = Rule.objects.get(name="held-idle"), Rule.objects.get(name="budget")
    now = timezone.now()
    firing = open_alert(
        held,
        "gpu:GPU-a",
        subject_label="gpu-07#0",
        value=Decimal("6.25"),
        peak_value=Decimal("7"),
        window_start=now - dt.timedelta(hours=24),
        window_end=now,
        now=now - dt.timedelta(hours=3),
    )
    for target, status in (
        ("mailto:ops@example.com", "sent"),
        ("https://hooks.slack.example/T000/B000/s3cr3t", "failed"),
    ):
        Delivery.objects.create(
            alert=firing,
            event="firing",
            sequence=1,
            channel="email" if target.startswith("mailto:") else "webhook",
            target=target,
            value=firing.value,
            threshold=firing.threshold,
            created_at=now,
            next_attempt_at=now,
            status=status,
            attempts=1,
        )
    money = open_alert(budget, "fleet", subject_label="Fleet", value=Decimal("1234.567"))
    old = open_alert(
        held,
        "gpu:GPU-b",
        subject_label="gpu-07#1",
        value=Decimal("3"),
        now=now - dt.timedelta(days=2),
    )
    old.resolved_at = now - dt.timedelta(days=1)
    old.save()
    return {"firing": firing, "money": money, "old": old}


def _page(role_client: Any, role: str, query: str = "") -> str:
    response = role_client(role).get(f"/alerts/{query}")
    assert response.status_code == 200
    return str(response.content.decode())


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
