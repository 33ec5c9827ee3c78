"""``[[alerts]]`` in the fleet file: applied by fleet_apply, idempotent, exactly the file's
rules, and every bad value refused naming the rule and the field."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from alerts.models import Rule
from fleet.services import FleetFileError
from tests.alerts.conftest import open_alert, rules_apply

pytestmark = pytest.mark.django_db

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "fleet.example.toml"
HELD = {
    "name": "held-idle",
    "rule": "gpu_held_hours",
    "scope": "pool:training",
    "threshold": 4,
    "window_hours": 24,
    "notify": ["mailto:ops@example.com", "https://hooks.example.com/gpufleet"],
    "repeat_hours": 24,
}


@pytest.fixture
def training(db: Any) -> None:
    from fleet.models import Pool, Site, Team

    Pool.objects.create(name="training", site=Site.objects.create(name="fra1"))
    Team.objects.create(name="research")


@pytest.mark.smoke
def test_the_example_file_sets_its_rules_and_a_second_apply_changes_nothing(capsys: Any) -> None:
    call_command("fleet_apply", str(EXAMPLE))
    first = capsys.readouterr().out.strip().splitlines()[-1]
    assert "alerts created" in first
    rules = {r.name: r for r in Rule.objects.all()}
    assert set(rules) == {"training-held-idle", "gpu-offline", "research-budget", "jobs-held-idle"}
    assert rules["jobs-held-idle"].notify == ["owner", "mailto:hpc-team@example.com"]
    # Its people: two listed, one domain rule; bob gets no digest.
    from alerts.people import people_directory

    people = people_directory()
    assert (people.email("alice"), people.email("carol")) == (
        "alice@example.com",
        "carol@example.com",
    )
    assert (people.digest("alice"), people.digest("bob"), people.digest("carol")) == (
        True,
        False,
        False,
    )
    held = rules["training-held-idle"]
    assert (held.kind, held.scope, held.threshold, held.window_hours, held.repeat_hours) == (
        "gpu_held_hours",
        "pool:training",
        Decimal(4),
        24,
        24,
    )
    assert rules["research-budget"].threshold == Decimal("25000.00")
    assert rules["gpu-offline"].window_hours is None
    call_command("fleet_apply", str(EXAMPLE))
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"applied {EXAMPLE}: no changes"


def test_a_changed_rule_updates_and_a_removed_one_goes_inactive_closing_its_alerts(
    training: None,
) -> None:
    budget = {"name": "budget", "rule": "budget_month", "threshold": "100.00"}
    result = rules_apply(budget, HELD)
    assert result.created == {"alerts": 2}
    rule = Rule.objects.get(name="held-idle")
    alert = open_alert(rule)

    result = rules_apply(budget, {**HELD, "threshold": 6})
    assert result.updated == {"alerts": 1}
    rule.refresh_from_db()
    assert rule.threshold == Decimal(6) and rule.active
    alert.refresh_from_db()
    assert alert.resolved_at is None  # same kind and scope: the alert carries on

    result = rules_apply(budget)
    assert result.updated == {"alerts_removed": 1}
    rule.refresh_from_db()
    alert.refresh_from_db()
    assert not rule.active
    assert alert.resolved_at is not None and "removed" in alert.note

    rules_apply(budget, HELD)  # back again, same row
    assert Rule.objects.get(name="held-idle").pk == rule.pk
    assert Rule.objects.get(name="held-idle").active


def test_a_changed_scope_closes_the_open_alerts(training: None) -> None:
    rules_apply(HELD)
    rule = Rule.objects.get()
    alert = open_alert(rule)
    rules_apply({**HELD, "scope": "fleet"})
    alert.refresh_from_db()
    assert alert.resolved_at is not None and "changed" in alert.note


BAD = [
    ({"rule": "gpu_happy_hours"}, "alerts[1].rule: unknown rule 'gpu_happy_hours'"),
    ({"rule": "workload_held_hours", "threshold": 0}, "alerts[1].threshold: GPU hours: more"),
    ({"scope": "rack:r1"}, "alerts[1].scope: expected fleet, site:NAME"),
    ({"scope": "pool:nowhere"}, "alerts[1].scope: no pool named 'nowhere'"),
    ({"scope": "team:"}, "alerts[1].scope"),
    ({"scope": "gpu:a/b"}, "alerts[1].scope"),
    ({"threshold": 25}, "alerts[1].threshold: must be more than 0 and at most the window (24 h)"),
    ({"threshold": 0}, "alerts[1].threshold"),
    ({"threshold": -1}, "alerts[1].threshold"),
    ({"threshold": "lots"}, "alerts[1].threshold: not a decimal number"),
    ({"threshold": True}, "alerts[1].threshold"),
    ({"threshold": 0.1234567}, "alerts[1].threshold: at most 6 decimal places"),
    ({"rule": "gpu_throttled_share", "threshold": 1.5}, "alerts[1].threshold: a share"),
    ({"rule": "utilization_below", "threshold": 40}, "alerts[1].threshold: a utilisation"),
    (
        {"rule": "gpu_offline_minutes", "threshold": 5, "window_hours": None},
        "alerts[1].threshold: minutes: at least 10",
    ),
    ({"rule": "gpu_offline_minutes", "threshold": 30}, "alerts[1].window_hours: gpu_offline"),
    ({"rule": "idle_cost_above", "threshold": 100.5}, "alerts[1].threshold: money must be"),
    ({"rule": "idle_cost_above", "threshold": "-3"}, "alerts[1].threshold: money: more than 0"),
    ({"rule": "idle_cost_above", "threshold": "1e30"}, "alerts[1].threshold: at most 6"),
    ({"window_hours": 0}, "alerts[1].window_hours: a whole number from 1 to 2160"),
    ({"window_hours": 24.5}, "alerts[1].window_hours"),
    ({"repeat_hours": -1}, "alerts[1].repeat_hours: a whole number from 0 to 8760"),
    ({"notify": "mailto:ops@example.com"}, "alerts[1].notify: a list of targets"),
    ({"notify": ["ftp://files.example.com/x"]}, "alerts[1].notify[0]: expected mailto:"),
    ({"notify": ["javascript:alert(1)"]}, "alerts[1].notify[0]: expected mailto:"),
    ({"notify": ["mailto:a@example.com,b@evil.example"]}, "alerts[1].notify[0]: mailto: takes"),
    ({"notify": ["mailto:a@example.com?cc=b@evil.example"]}, "alerts[1].notify[0]: mailto:"),
    (
        {"notify": ["mailto:not-an-address"]},
        "alerts[1].notify[0]: mailto: takes one plain address; not an email address",
    ),
    ({"notify": ["https://"]}, "alerts[1].notify[0]"),
    ({"notify": ["https://hooks.example.com/a b"]}, "alerts[1].notify[0]: no spaces"),
    ({"notify": ["https://hooks.example.com:99999/"]}, "alerts[1].notify[0]: not a valid URL"),
    ({"notify": ["owner"]}, "alerts[1].notify[0]: 'owner' only works with rules about"),
    (
        {"notify": ["mailto:a@example.com", "mailto:a@example.com"]},
        "alerts[1].notify[1]: appears twice",
    ),
    ({"name": "held-idle"}, "alerts[1].name: 'held-idle' appears twice"),
    ({"name": ""}, "alerts[1].name: required"),
    ({"name": "a/b"}, "alerts[1].name"),
    ({"emails": ["x"]}, "alerts[1].emails: unknown"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_rules_are_refused_naming_the_rule_and_field(
    training: None, change: dict[str, Any], message: str
) -> None:
    second = {**HELD, "name": "second", **change}
    second = {k: v for k, v in second.items() if v is not None}
    with pytest.raises(FleetFileError) as caught:
        rules_apply(HELD, second)
    assert str(caught.value).startswith(message.split(": ")[0] + ":"), str(caught.value)
    assert message in str(caught.value), str(caught.value)
    assert not Rule.objects.exists()  # nothing of a refused file is applied


def test_fleet_apply_refuses_a_bad_rule_with_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        'currency = "USD"\n[[alerts]]\nname = "x"\nrule = "utilization_below"\n'
        'threshold = 0.4\nnotify = ["gopher://old.example.com"]\n'
    )
    with pytest.raises(CommandError, match=r"alerts\[0\]\.notify\[0\]: expected mailto"):
        call_command("fleet_apply", str(path))


def test_not_a_table_array_is_refused() -> None:
    from billing.services import fleet_document_apply

    with pytest.raises(FleetFileError, match=r"^alerts: must be an array of tables"):
        fleet_document_apply(document={"currency": "USD", "alerts": {"name": "x"}})
