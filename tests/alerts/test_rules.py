"""What each rule measures, against figures computed by hand from docs/metrics.md's worked
example (one owned GPU, 30,000.00 over 5 years, opex 0.10/h, PUE 1.5, 0.20 per kWh; its first
day: 9 h in the air, 6 h held, 5 h parked, 4 h offline)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from alerts import figures
from alerts.rules import RULE_KINDS, Measurement, RuleConfig, Scope
from tests.alerts.conftest import at

RATE = Decimal(30000) / Decimal(43830) + Decimal("0.10")  # fixed rate per hour
TOLERANCE = Decimal("0.000002")  # stored values keep six decimals


def measure(
    kind: str, scope: str, now: dt.datetime, *, window_hours: int | None = 24
) -> dict[str, Decimal]:
    rule_kind = RULE_KINDS[kind]
    config = RuleConfig(
        name="r",
        kind=kind,
        scope=Scope.parse(scope),
        threshold=Decimal(1),
        window_hours=window_hours,
    )
    with figures.memo():
        found: list[Measurement] = rule_kind.measure(config, rule_kind.window_of(config, now), now)
    return {m.subject: m.value for m in found}


def near(a: Decimal, b: Decimal) -> bool:
    return abs(a - b) <= TOLERANCE


def test_a_gpus_held_and_parked_hours_over_its_first_day(worked_example: Any) -> None:
    now = at("2026-03-03T00") + dt.timedelta(minutes=20)  # the window ends at the whole hour
    assert measure("gpu_held_hours", "fleet", now) == {"gpu:GPU-example": Decimal(6)}
    assert measure("gpu_parked_hours", "pool:inference", now) == {"gpu:GPU-example": Decimal(5)}
    assert measure("gpu_held_hours", "pool:elsewhere", now) == {}
    # The last 6 hours of that day: hours 18–19 parked, 20–23 nothing.
    assert measure("gpu_parked_hours", "fleet", now, window_hours=6) == {
        "gpu:GPU-example": Decimal(2)
    }


def test_a_gpu_that_moved_counts_only_its_hours_in_the_scope(fleet: Any) -> None:
    training, inference = fleet.pool("training"), fleet.pool("inference")
    node = fleet.node("gpu-01", pool=inference)
    gpu = fleet.gpu("GPU-moved", node=node, index=3, in_service_at=at("2026-03-01T00"))
    rows = [
        fleet.usage(gpu, at(f"2026-03-02T{h:02d}"), pool=training, observed_s=3600, held_s=1800)
        for h in range(6)
    ] + [
        fleet.usage(
            gpu,
            at(f"2026-03-02T{h:02d}"),
            pool=inference,
            observed_s=3600,
            held_s=900,
            throttle_any_s=1800,
        )
        for h in range(6, 12)
    ]
    fleet.save(rows)
    now = at("2026-03-02T12")
    assert measure("gpu_held_hours", "pool:training", now) == {"gpu:GPU-moved": Decimal("3")}
    assert measure("gpu_held_hours", "pool:inference", now) == {"gpu:GPU-moved": Decimal("1.5")}
    assert measure("gpu_held_hours", "fleet", now) == {"gpu:GPU-moved": Decimal("4.5")}
    assert measure("gpu_held_hours", "gpu:GPU-moved", now) == {"gpu:GPU-moved": Decimal("4.5")}
    # Throttled 6 × 0.5 h of 12 observed hours.
    assert measure("gpu_throttled_share", "fleet", now) == {"gpu:GPU-moved": Decimal("0.25")}
    assert measure("gpu_throttled_share", "pool:inference", now) == {
        "gpu:GPU-moved": Decimal("0.5")
    }


@pytest.mark.parametrize(
    ("now", "hours", "utilization", "idle_cost"),
    [
        # The whole first day: docs/metrics.md's 37.5 % and idle 12.051940.
        (at("2026-03-03T00"), 24, Decimal("0.375"), Decimal("12.051940")),
        # Hours 00–11: 9 h in the air of 12; 3 idle hours at the rate, and the idle energy of
        # hours 10–11 (2 × 432,000 J = 0.24 kWh × 1.5 × 0.20 = 0.072).
        (
            at("2026-03-02T12") + dt.timedelta(minutes=17),
            12,
            Decimal("0.75"),
            RATE * 3 + Decimal("0.072"),
        ),
        # 18:00 the day before to 06:00: in service from midnight, 6 capacity hours, 5.4 in
        # the air; the window crosses a report day (figures up to its end less up to its start).
        (at("2026-03-02T06"), 12, Decimal("0.9"), RATE * Decimal("0.6")),
    ],
)
def test_scope_utilisation_and_idle_cost_over_a_window_of_hours(
    worked_example: Any, now: dt.datetime, hours: int, utilization: Decimal, idle_cost: Decimal
) -> None:
    for scope in ("fleet", "pool:inference", "team:research", "site:fra1", "gpu:GPU-example"):
        util = measure("utilization_below", scope, now, window_hours=hours)
        idle = measure("idle_cost_above", scope, now, window_hours=hours)
        assert set(util) == set(idle) == {scope}
        assert near(util[scope], utilization), (scope, util)
        assert near(idle[scope], idle_cost), (scope, idle)
    assert measure("utilization_below", "pool:other", now, window_hours=hours) == {}


def test_budget_is_the_month_to_date_total_cost(worked_example: Any) -> None:
    # In service from 2 March 00:00 to now (10 March 12:00): 204 capacity hours at the rate,
    # and the first day's 4.95 kWh × 1.5 × 0.20 = 1.485 of energy.
    now = at("2026-03-10T12") + dt.timedelta(minutes=40)
    found = measure("budget_month", "team:research", now, window_hours=None)
    assert near(found["team:research"], RATE * 204 + Decimal("1.485"))
    # On the 1st of April, April so far: nothing yet.
    assert measure("budget_month", "fleet", at("2026-04-01T00") + dt.timedelta(minutes=5)) in (
        {},
        {"fleet": Decimal(0)},
    )


def test_offline_minutes_are_the_silence_of_gpus_in_service(fleet: Any) -> None:
    now = at("2026-03-02T12")
    pool, other = fleet.pool("training"), fleet.pool("other")
    node, far = fleet.node("gpu-01", pool=pool), fleet.node("gpu-02", pool=other)
    start = at("2026-03-01T00")
    minutes = dt.timedelta(minutes=1)
    for index, (uuid, values) in enumerate(
        {
            "GPU-silent": {"in_service_at": start, "last_seen_at": now - 40 * minutes},
            "GPU-fresh": {"in_service_at": start, "last_seen_at": now - 3 * minutes},
            "GPU-retired": {
                "in_service_at": start,
                "retired_at": now - 60 * minutes,
                "last_seen_at": start,
            },
            "GPU-never": {"in_service_at": now - 120 * minutes},  # never reported
            "GPU-unknown": {},  # no in-service date, never seen: not in service
            "GPU-later": {"in_service_at": now + 1440 * minutes},
        }.items()
    ):
        fleet.gpu(uuid, node=node, index=index, **values)
    fleet.gpu("GPU-far", node=far, index=0, in_service_at=start, last_seen_at=now - 60 * minutes)
    found = measure("gpu_offline_minutes", "pool:training", now, window_hours=None)
    assert found == {
        "gpu:GPU-silent": Decimal(40),
        "gpu:GPU-fresh": Decimal(3),
        "gpu:GPU-never": Decimal(120),
    }
    assert measure("gpu_offline_minutes", "fleet", now, window_hours=None)["gpu:GPU-far"] == 60


def test_the_rules_share_their_readings_and_windows_agree(
    worked_example: Any, django_assert_max_num_queries: Any
) -> None:
    """Twenty rules, four windows of scope figures: the selectors compute once up to the
    windows' common end, and once more up to each start that is not the common first
    midnight (1 March): 3 computations, not 8; each rule's value is still its own window's."""
    from alerts.models import Alert
    from alerts.services import alerts_evaluate
    from tests.alerts.conftest import rules_apply

    rules_apply(
        {"name": "day", "rule": "utilization_below", "threshold": 0.9, "window_hours": 24},
        {
            "name": "two-days",
            "rule": "utilization_below",
            "scope": "team:research",
            "threshold": 0.9,
            "window_hours": 48,
        },  # fmt: skip
        {
            "name": "half",
            "rule": "idle_cost_above",
            "scope": "pool:inference",
            "threshold": "1.00",
            "window_hours": 12,
        },  # fmt: skip
        {"name": "month", "rule": "budget_month", "threshold": "1.00"},
        *[
            {"name": f"h{i}", "rule": "gpu_held_hours", "scope": "pool:inference", "threshold": 1}
            for i in range(16)
        ],
    )
    with django_assert_max_num_queries(250) as captured:
        alerts_evaluate(now=at("2026-03-03T00") + dt.timedelta(minutes=5))
    sql = [q["sql"] for q in captured.captured_queries]
    assert sum('FROM "billing_costprofile"' in q for q in sql) == 3
    assert sum('AS "throttled_s"' in q for q in sql) == 1  # alerts.figures' GPU-hours GROUP BY
    values = dict(Alert.objects.values_list("rule__name", "value"))
    assert near(values["day"], Decimal("0.375")) and near(values["two-days"], Decimal("0.375"))
    # 12:00–24:00 of the first day: 12 idle hours at the rate; the idle energy of hours 12–14
    # (3 × 432,000 J) and 15–19 (5 × 252,000 J) = 0.71 kWh × 1.5 × 0.20 = 0.213.
    assert near(values["half"], RATE * 12 + Decimal("0.213"))
    assert near(values["month"], Decimal("20.312105"))  # the worked example's total
    assert values["h0"] == Decimal(6)


def test_docs_list_every_rule_kind_in_one_table() -> None:
    """docs/alerts.md's rules table is one Markdown table: a blank line inside it would end
    it and show the rows after it as text."""
    from pathlib import Path

    from django.conf import settings

    doc = (Path(settings.BASE_DIR) / "docs" / "alerts.md").read_text()
    start = doc.index("| rule | subjects |")
    table = doc[start:].split("\n\n", 1)[0].splitlines()
    listed = [line.split("|")[1].strip().strip("`") for line in table[2:]]
    assert sorted(listed) == sorted(RULE_KINDS)
