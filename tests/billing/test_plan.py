"""The Plan's pure parts (billing/plan.py, DESIGN.md §9.3), each worked out by hand."""

from __future__ import annotations

import datetime as dt

import pytest

from billing.plan import backtest, consolidation_replay, runout_date, seasonal_naive, smape
from tests.billing.conftest import FleetBuilder

# A demand with a weekly season and a trend: 100 GPU hours a day on weekdays, 40 at weekends,
# growing by 1 GPU hour a day (day 0 is a Monday).
MONDAY = dt.date(2026, 9, 7)


def demand(days: int) -> list[float]:
    return [(40.0 if d % 7 >= 5 else 100.0) + d for d in range(days)]


def test_smape_by_hand() -> None:
    # |110 − 100| × 2 / 210 = 0.095238…; |50 − 50| = 0; both zero: 0. Mean of three.
    assert smape([100, 50, 0], [110, 50, 0]) == pytest.approx((20 / 210) / 3)
    assert smape([10], [0]) == 2.0  # all wrong: the maximum
    with pytest.raises(ValueError):
        smape([1, 2], [1])


def test_seasonal_naive_repeats_the_last_week() -> None:
    history = demand(14)  # days 0–13; the last week is days 7–13
    assert seasonal_naive(history, 9) == [
        107.0,
        108.0,
        109.0,
        110.0,
        111.0,
        52.0,
        53.0,
        107.0,
        108.0,
    ]


def test_the_backtest_of_seasonal_naive_is_the_trend_it_misses() -> None:
    """With a trend of 1 a day, seasonal naive forecasts each day 7 lower than it comes: a
    weekday of value v is forecast v − 7, a weekend day w as w − 7. For the 35 days of
    demand(35) and 4 origins of 7 days (days 7–34), each cut's sMAPE is the mean over its
    week of 2·7 / (2v − 7), worked out here independently of the code."""
    history = demand(35)
    expected = []
    for cut in (7, 14, 21, 28):
        week = history[cut : cut + 7]
        expected.append(sum(14 / (2 * v - 7) for v in week) / 7)
    assert backtest(history, seasonal_naive, horizon=7, origins=4) == pytest.approx(
        sum(expected) / 4
    )
    with pytest.raises(ValueError):
        backtest(demand(20), seasonal_naive, horizon=7, origins=4)


def test_the_runout_date_by_hand() -> None:
    """Capacity 160 GPU hours a day (8 GPUs × 20 h) at a target of 75 %: 120 GPU hours. The
    weekdays of demand() pass 120 when 100 + d > 120, so on day 21 (d = 21 is a Monday:
    121); the weekends never before (40 + d > 120 from d = 81)."""
    got = runout_date(MONDAY, demand(90), capacity=160, target=0.75)
    assert got == MONDAY + dt.timedelta(days=21) == dt.date(2026, 9, 28)
    assert runout_date(MONDAY, demand(21), capacity=160, target=0.75) is None


def test_the_consolidation_replay_on_a_hand_built_week() -> None:
    """Pool A uses 2 GPUs in working hours (9–17, 8 h a day, 5 days) and 0 otherwise; pool B
    (8 GPUs) uses 7 in working hours and 3 otherwise. Together 9 in working hours: 1 over
    B's 8 for 40 hours → 40 GPU hours; the excess is 1 in 40 of the week's 168 hours, so
    its 95th percentile (rank 0.95 × 167 = 158.65 of the sorted hours: the last 40 are 1)
    is 1."""
    used_a, used_b = [], []
    for day in range(7):
        for hour in range(24):
            working = day < 5 and 9 <= hour < 17
            used_a.append(2.0 if working else 0.0)
            used_b.append(7.0 if working else 3.0)
    r = consolidation_replay(used_a, used_b, capacity_b=8)
    assert (r.overflow_gpu_hours, r.overflow_p95_gpus, r.hours_over) == (40.0, 1.0, 40)
    # With room for all of it: nothing overflows.
    assert consolidation_replay(used_a, used_b, capacity_b=9).overflow_gpu_hours == 0.0


# --- daily demand from the database --------------------------------------------------------------
def test_daily_demand_is_air_held_and_capacity_waits_by_pool(fleet: FleetBuilder) -> None:
    """Pools training (GPUs t1, t2) and burst (b1); partition hpc/h100 on both. On 30 Nov
    (UTC): t1 is in the air 0.5 h and held 0.5 h at 09:00, t2 in the air the hour, b1 parked
    (no demand); a 4-GPU job waits for capacity from 09:00 to 10:00 (4 GPU hours, 2 to each
    pool) while a 2-GPU job waits on its QOS (policy: no demand). At 10:00 t1 is parked. On
    1 Dec t1 is in the air 00:00–01:00.
    training: 1 + 1 + 2 = 4 on 30 Nov, 1 on 1 Dec; burst: 2; the fleet: 6 and 1."""
    from billing.selectors.plan import FLEET, daily_demand
    from fleet.models import Node
    from fleet.services import ApplyResult
    from telemetry.queue import queue_partitions_apply, queue_snapshot_apply
    from telemetry.queue_wire import PendingJob, Snapshot

    nine = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
    training, burst = fleet.pool("training"), fleet.pool("burst")
    t1 = fleet.gpu("GPU-t1", node=fleet.node("gpu-t", pool=training))
    t2 = fleet.gpu("GPU-t2", node=t1.node, index=1)
    b1 = fleet.gpu("GPU-b1", node=fleet.node("gpu-b", pool=burst))
    hour = dt.timedelta(hours=1)
    fleet.save(
        [
            fleet.usage(t1, nine, observed_s=3600, air_s=1800, held_s=1800),
            fleet.usage(t2, nine, observed_s=3600, air_s=3600),
            fleet.usage(b1, nine, observed_s=3600, parked_s=3600),
            fleet.usage(t1, nine + hour, observed_s=3600, parked_s=3600),
            fleet.usage(t1, nine + 15 * hour, observed_s=3600, air_s=3600),
        ]
    )
    both = {"cluster": "hpc", "name": "h100", "pools": ["training", "burst"]}
    queue_partitions_apply(document={"partitions": [both]}, result=ApplyResult())

    def job(job_id: str, gpus: int, cls: str, reason: str) -> PendingJob:
        return PendingJob(
            "slurm", job_id, "alice", "nlp", "h100", gpus, "", cls, reason, None, None
        )

    node = Node.objects.create(hostname="login-1")
    jobs = [job("1", 4, "capacity", "Resources"), job("2", 2, "policy", "QOSMaxGRESPerUser")]
    for minute in range(61):
        at = nine + dt.timedelta(minutes=minute)
        snapshot = Snapshot("hpc", at, jobs if minute < 60 else [])
        queue_snapshot_apply(node_id=node.pk, snapshot=snapshot, now=at)

    got = daily_demand(start=dt.date(2026, 11, 30), end=dt.date(2026, 12, 2), zone=dt.UTC)
    first, second = dt.date(2026, 11, 30), dt.date(2026, 12, 1)
    assert got["training"] == {first: pytest.approx(4.0), second: pytest.approx(1.0)}
    assert got["burst"] == {first: pytest.approx(2.0)}
    assert got[FLEET] == {first: pytest.approx(6.0), second: pytest.approx(1.0)}
