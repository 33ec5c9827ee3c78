"""The alert rule ``queue_waited_hours`` (DESIGN.md §9.2): per Slurm partition, the GPU hours
its jobs waited for capacity in the window, from snapshots applied through the queue service;
scoped by the pools the fleet file's ``[[partitions]]`` give a partition."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from alerts.fleetfile import rule_parse
from fleet.models import Pool, Site
from fleet.services import ApplyResult, FleetFileError
from telemetry.queue import queue_partitions_apply
from tests.alerts.test_rules import measure
from tests.telemetry.test_queue_figures import T0, j, push  # noqa: F401

RULE = "queue_waited_hours"


@pytest.fixture
def waited(push: Any) -> None:  # noqa: F811
    """Two hours of snapshots a minute apart (T0 … T0 + 119 min, each counting the minute
    after it; gone at T0 + 2 h):
    job 1 asks for 4 GPUs of h100 on Resources, job 2 for 2 GPUs of h100 on a QOS limit
    (policy), job 3 for 1 GPU of a100 on Priority. Capacity waits: h100 4 × 2 h = 8 GPU hours,
    a100 1 × 2 h = 2 GPU hours; job 2's 4 GPU hours are policy, not counted."""
    fra = Site.objects.create(name="fra1")
    Pool.objects.create(name="training", site=fra)
    Pool.objects.create(name="inference")
    queue_partitions_apply(
        document={
            "partitions": [
                {"cluster": "hpc", "name": "h100", "pools": ["training"]},
                {"cluster": "hpc", "name": "a100", "pools": ["inference"]},
            ]
        },
        result=ApplyResult(),
    )
    jobs = [
        j("1", 4, partition="h100"),
        j("2", 2, "policy", partition="h100", reason="QOSMaxGRESPerUser"),
        j("3", 1, partition="a100", reason="Priority"),
    ]
    for minute in range(120):
        push(minute * 60, jobs)
    push(120 * 60, [])  # all gone


def test_each_partition_s_capacity_wait_by_scope(waited: None) -> None:
    now = T0 + dt.timedelta(hours=3)  # the window: the 24 whole hours before now
    assert measure(RULE, "fleet", now) == {
        "partition:hpc/h100": Decimal(8),
        "partition:hpc/a100": Decimal(2),
    }
    assert measure(RULE, "pool:training", now) == {"partition:hpc/h100": Decimal(8)}
    assert measure(RULE, "site:fra1", now) == {"partition:hpc/h100": Decimal(8)}
    assert measure(RULE, "pool:inference", now) == {"partition:hpc/a100": Decimal(2)}
    # A window of the last hour only: T0 + 2 h … T0 + 3 h holds no capacity wait.
    assert measure(RULE, "fleet", now, window_hours=1) == {}
    # The last two hours: the second hour of waiting, 4 and 1 GPU hours.
    assert measure(RULE, "fleet", now, window_hours=2) == {
        "partition:hpc/h100": Decimal(4),
        "partition:hpc/a100": Decimal(1),
    }


@pytest.mark.django_db
@pytest.mark.parametrize("scope", ["team:research", "gpu:GPU-1"])
def test_the_rule_takes_only_scopes_partitions_have(scope: str) -> None:
    row = {"name": "waits", "rule": RULE, "scope": scope, "threshold": 10}
    with pytest.raises(FleetFileError) as caught:
        rule_parse(row, where="alerts[0]")
    kind = scope.partition(":")[0]
    assert str(caught.value) == (
        f"alerts[0].scope: queue_waited_hours takes fleet, site, pool, not {kind}"
    )


@pytest.mark.django_db
def test_a_pool_scope_rule_parses() -> None:
    Pool.objects.create(name="training")
    config = rule_parse(
        {"name": "waits", "rule": RULE, "scope": "pool:training", "threshold": 10},
        where="alerts[0]",
    )
    assert (config.kind, str(config.scope), config.window_hours) == (RULE, "pool:training", 24)


@pytest.mark.django_db
def test_a_partition_alert_links_to_the_queue_page_by_partition() -> None:
    from alerts.messages import subject_path
    from alerts.rules import Window

    window = Window(T0, T0 + dt.timedelta(hours=24))
    path = subject_path("partition:hpc/h100", window)
    assert path.startswith("/queue/?") and "group_by=partition" in path
    # 09:00 UTC to 09:00 the next day (the report zone is UTC here): both days shown
    assert "from=2026-11-30" in path and "to=2026-12-01" in path
