"""Queue figures (DESIGN.md §9.2): stretches across snapshots, waited GPU hours by class with
Δt capped at 2 × the push interval, waits p50/p95, and the fleet file's [[partitions]].

Every figure is worked out by hand in the test's comments. Snapshots are applied through the
service at fixed times (the service does not look at the clock; the API's clock checks are
in test_queue_ingest.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fleet.models import Gpu, Node, Pool
from fleet.services import ApplyResult, FleetFileError
from telemetry.models import (
    HourlyUsage,
    PendingStretch,
    QueueCluster,
    QueuePartition,
    QueueWaitHourly,
)
from telemetry.queue import hour_segments, queue_partitions_apply, queue_snapshot_apply
from telemetry.queue_figures import (
    capacity_waited_gpus_by_partition_hour,
    partition_hours,
    partition_pools,
    percentile,
    queue_rows,
    waits_python,
    waits_sql,
)
from telemetry.queue_wire import PendingJob, Snapshot

T0 = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
HOUR = dt.timedelta(hours=1)


def j(
    job_id: str,
    gpus: int = 1,
    cls: str = "capacity",
    *,
    user: str = "alice",
    account: str = "nlp",
    partition: str = "h100",
    reason: str = "Resources",
) -> PendingJob:
    return PendingJob(
        kind="slurm",
        job_id=job_id,
        user=user,
        account=account,
        partition=partition,
        gpus=gpus,
        gpu_model="",
        reason_class=cls,
        reason=reason,
        submitted=None,
        eligible=None,
    )


@pytest.fixture
def push(db: Any) -> Any:
    """``push(seconds after T0, jobs, cluster="hpc")`` applies a snapshot → its result."""
    node = Node.objects.create(hostname="login-1")

    def apply(offset_s: float, jobs: list[PendingJob], cluster: str = "hpc") -> Any:
        at = T0 + offset_s * S
        return queue_snapshot_apply(node_id=node.pk, snapshot=Snapshot(cluster, at, jobs), now=at)

    return apply


def waited_by_class() -> dict[str, float]:
    out: dict[str, float] = {}
    for w in QueueWaitHourly.objects.all():
        out[w.reason_class] = out.get(w.reason_class, 0.0) + w.gpu_seconds
    return out


# --- pure parts --------------------------------------------------------------------------------
def test_hour_segments_cut_at_the_hour() -> None:
    assert hour_segments(T0 + 3570 * S, 120) == [(T0, 30.0), (T0 + HOUR, 90.0)]
    assert hour_segments(T0, 60) == [(T0, 60.0)]
    assert hour_segments(T0, 0) == []


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0
    # rank 0.5 × 3 = 1.5 → 20 + 0.5 × (30 − 20) = 25; rank 0.95 × 3 = 2.85 → 30 + 0.85 × 10.
    assert percentile([40.0, 10.0, 30.0, 20.0], 0.5) == 25.0
    assert percentile([40.0, 10.0, 30.0, 20.0], 0.95) == pytest.approx(38.5)


# --- stretches -------------------------------------------------------------------------------
def test_a_job_pending_over_five_snapshots_is_one_stretch(push: Any) -> None:
    for k in range(5):
        push(60 * k, [j("1", gpus=4)])
    assert PendingStretch.objects.count() == 1
    push(300, [])  # gone
    s = PendingStretch.objects.get()
    assert (s.first_seen_at, s.last_seen_at, s.ended_at, s.split) == (
        T0,
        T0 + 240 * S,
        T0 + 300 * S,
        False,
    )
    # Five intervals of 60 s (after each of the five snapshots that listed it) × 4 GPUs.
    assert waited_by_class() == {"capacity": 4 * 5 * 60.0}
    rows = queue_rows(start=T0, end=T0 + HOUR, group_by="partition")
    assert rows == [
        {
            "key": "h100",
            "cluster": "hpc",
            "waited_gpu_hours": pytest.approx(1200 / 3600),
            "waited_gpu_hours_capacity": pytest.approx(1200 / 3600),
            "waited_gpu_hours_policy": 0.0,
            "waited_gpu_hours_user": 0.0,
            "jobs": 1,
            "wait_p50_s": 300.0,
            "wait_p95_s": 300.0,
            # No [[partitions]] entry: no pools, so nothing held for it.
            "wanted_while_held_gpu_hours": 0.0,
        }
    ]


def test_a_gap_counts_at_most_two_push_intervals(push: Any) -> None:
    # K (2 GPUs, policy) is listed at 0, 60, 660 and 720 s: the agent was away for 10 min.
    # L (3 GPUs, user) is listed at 0 and 60 s, and is gone at 660 s.
    k, lj = j("K", gpus=2, cls="policy"), j("L", gpus=3, cls="user")
    push(0, [k, lj])
    push(60, [k, lj])
    push(660, [k])
    push(720, [k])
    # Intervals: 0→60 (60 s), 60→660 (600 s, capped at 120 s), 660→720 (60 s).
    # K: 2 GPUs × (60 + 120 + 60) = 480 GPU-s. L: 3 × (60 + 120) = 540 GPU-s.
    assert waited_by_class() == {"policy": 480.0, "user": 540.0}
    ell = PendingStretch.objects.get(job_id="L")
    # Gone in the gap: it ends where its counting ends, 60 + 120 s.
    assert (ell.last_seen_at, ell.ended_at) == (T0 + 60 * S, T0 + 180 * S)
    kay = PendingStretch.objects.get(job_id="K")
    assert (kay.first_seen_at, kay.ended_at) == (T0, None)
    rows = {r["key"]: r for r in queue_rows(start=T0, end=T0 + HOUR, group_by="user")}
    row = rows["alice"]
    assert row["waited_gpu_hours_policy"] == pytest.approx(480 / 3600)
    assert row["waited_gpu_hours_user"] == pytest.approx(540 / 3600)
    assert row["waited_gpu_hours"] == pytest.approx(1020 / 3600)
    # Waits: L 180 s; K still pending, so far to the cluster's latest snapshot: 720 s.
    # p50 = (180 + 720) / 2 = 450; p95 = 180 + 0.95 × 540 = 693.
    assert (row["jobs"], row["wait_p50_s"], row["wait_p95_s"]) == (2, 450.0, pytest.approx(693))


def test_an_interval_across_the_hour_is_split_between_the_hours(push: Any) -> None:
    push(3570, [j("1", gpus=2)])
    push(3630, [j("1", gpus=2)])
    by_hour = {w.hour: w.gpu_seconds for w in QueueWaitHourly.objects.all()}
    assert by_hour == {T0: 60.0, T0 + HOUR: 60.0}  # 2 GPUs × 30 s each side
    assert capacity_waited_gpus_by_partition_hour(start=T0, end=T0 + 2 * HOUR) == {
        ("hpc", "h100", T0): pytest.approx(60 / 3600),
        ("hpc", "h100", T0 + HOUR): pytest.approx(60 / 3600),
    }
    # Hours are whole: [T0 + 1 h, …) holds only the second half.
    rows = queue_rows(start=T0 + HOUR, end=T0 + 2 * HOUR, group_by="cluster")
    assert rows[0]["waited_gpu_hours"] == pytest.approx(60 / 3600)


def test_a_change_of_class_or_gpus_splits_the_stretch_and_keeps_the_wait(push: Any) -> None:
    push(0, [j("1", cls="user", reason="JobHeldUser")])
    push(60, [j("1", cls="user", reason="JobHeldAdmin")])  # same class: updated in place
    assert PendingStretch.objects.get().reason == "JobHeldAdmin"
    push(120, [j("1", cls="capacity")])  # released: now waits for resources
    push(180, [j("1", gpus=2, cls="capacity")])  # asks for more
    push(240, [])
    stretches = list(PendingStretch.objects.order_by("first_seen_at"))
    assert [(s.reason_class, s.gpus, s.split) for s in stretches] == [
        ("user", 1, True),
        ("capacity", 1, True),
        ("capacity", 2, False),
    ]
    assert [s.ended_at for s in stretches] == [T0 + 120 * S, T0 + 180 * S, T0 + 240 * S]
    assert {s.wait_started_at for s in stretches} == {T0}
    # user: 2 intervals × 1 GPU × 60 s; capacity: 1 × 60 + 2 × 60.
    assert waited_by_class() == {"user": 120.0, "capacity": 180.0}
    (row,) = queue_rows(start=T0, end=T0 + HOUR, group_by="account")
    assert (row["key"], row["jobs"], row["wait_p50_s"]) == ("nlp", 1, 240.0)


def test_a_job_that_comes_back_is_a_new_wait(push: Any) -> None:
    push(0, [j("1")])
    push(60, [])  # started
    push(120, [j("1")])  # requeued
    push(180, [])
    (row,) = queue_rows(start=T0, end=T0 + HOUR, group_by="cluster")
    assert (row["key"], row["jobs"], row["wait_p50_s"]) == ("hpc", 2, 60.0)


# --- waits -----------------------------------------------------------------------------------
def _five_waits(push: Any) -> None:
    """Jobs a–e (1 GPU each) first listed at 0 s and gone at 60, 120, 180, 240 and 600 s;
    a and b are bob's, the rest alice's; e is in partition "a100"."""
    gone = {"a": 60, "b": 120, "c": 180, "d": 240, "e": 600}
    for t in range(0, 660, 60):
        push(
            t,
            [
                j(
                    name,
                    user="bob" if name in "ab" else "alice",
                    partition="a100" if name == "e" else "h100",
                )
                for name, end in gone.items()
                if t < end
            ],
        )


def test_p50_and_p95_of_the_waits(push: Any) -> None:
    _five_waits(push)
    rows = queue_rows(start=T0, end=T0 + HOUR, group_by="cluster")
    # Waits 60, 120, 180, 240, 600: p50 = 180; p95 at rank 3.8 = 240 + 0.8 × 360 = 528.
    # Waited: Σ waits × 1 GPU = 1,200 GPU-s.
    assert rows == [
        {
            "key": "hpc",
            "waited_gpu_hours": pytest.approx(1200 / 3600),
            "waited_gpu_hours_capacity": pytest.approx(1200 / 3600),
            "waited_gpu_hours_policy": 0.0,
            "waited_gpu_hours_user": 0.0,
            "jobs": 5,
            "wait_p50_s": 180.0,
            "wait_p95_s": pytest.approx(528.0),
            "wanted_while_held_gpu_hours": 0.0,  # no pools
        }
    ]
    users = {r["key"]: r for r in queue_rows(start=T0, end=T0 + HOUR, group_by="user")}
    # bob: 60, 120 → p50 90, p95 60 + 0.95 × 60 = 117; alice: 180, 240, 600 → p50 240,
    # p95 at rank 1.9 = 240 + 0.9 × 360 = 564. Worst (most waited) first: alice 1,020 GPU-s.
    assert list(users) == ["alice", "bob"]
    assert (users["bob"]["jobs"], users["bob"]["wait_p50_s"]) == (2, 90.0)
    assert users["bob"]["wait_p95_s"] == pytest.approx(117.0)
    assert (users["alice"]["wait_p50_s"], users["alice"]["wait_p95_s"]) == (
        240.0,
        pytest.approx(564.0),
    )
    assert users["alice"]["waited_gpu_hours"] == pytest.approx(1020 / 3600)


def _waits(start: dt.datetime, end: dt.datetime, group_by: str) -> Any:
    from django.db import connection

    waits = waits_sql if connection.vendor == "postgresql" else waits_python
    return waits(start, end, group_by)


def test_a_job_pending_at_the_end_counts_its_wait_so_far(push: Any) -> None:
    _five_waits(push)
    # Window [T0, T0 + 150 s): a and b are gone in it (60, 120); c, d and e were still
    # pending at its end and count 150 s each. Waits 60, 120, 150, 150, 150.
    waits = _waits(T0, T0 + 150 * S, "cluster")
    assert waits == {("hpc",): (5, 150.0, 150.0)}
    # From 200 s: a, b and c are gone before it; d (240) and e (600) overlap it.
    assert _waits(T0 + 200 * S, T0 + HOUR, "cluster") == {("hpc",): (2, 420.0, 582.0)}


@pytest.mark.parametrize("group_by", ["partition", "account", "user", "cluster"])
def test_waits_in_sql_equal_waits_in_python(push: Any, postgres: Any, group_by: str) -> None:
    _five_waits(push)
    push(0, [j("x", gpus=3)], cluster="other")
    push(90, [j("x", gpus=3), j("y", account="cv", partition="h100")], cluster="other")
    for start, end in ((T0, T0 + HOUR), (T0 + 100 * S, T0 + 500 * S)):
        sql, python = waits_sql(start, end, group_by), waits_python(start, end, group_by)
        assert sql.keys() == python.keys()
        for key in sql:
            assert sql[key] == pytest.approx(python[key]), key


def test_partitions_of_two_clusters_are_two_rows(push: Any) -> None:
    push(0, [j("1")])
    push(0, [j("1", gpus=2)], cluster="other")
    push(60, [j("1")])
    push(60, [j("1", gpus=2)], cluster="other")
    rows = queue_rows(start=T0, end=T0 + HOUR, group_by="partition")
    assert [(r["cluster"], r["key"], r["waited_gpu_hours"] * 3600) for r in rows] == [
        ("other", "h100", pytest.approx(120.0)),
        ("hpc", "h100", pytest.approx(60.0)),
    ]
    with pytest.raises(ValueError, match="group_by"):
        queue_rows(start=T0, end=T0 + HOUR, group_by="pool")


# --- [[partitions]] ---------------------------------------------------------------------------
def test_partitions_from_the_fleet_file_map_to_pools(db: Any) -> None:
    train = Pool.objects.create(name="training")
    burst = Pool.objects.create(name="burst")
    result = ApplyResult()
    doc = {
        "partitions": [
            {"cluster": "hpc", "name": "h100", "pools": ["training", "burst"]},
            {"cluster": "hpc", "name": "debug", "pools": []},
        ]
    }
    queue_partitions_apply(document=doc, result=result)
    assert result.created == {"partitions": 2}
    assert partition_pools() == {
        ("hpc", "h100"): sorted([train.pk, burst.pk]),
        ("hpc", "debug"): [],
    }
    assert QueueCluster.objects.get().node_id is None  # the first node to push owns it
    again = ApplyResult()
    queue_partitions_apply(document=doc, result=again)
    assert (again.created, again.updated) == ({}, {})
    # Exactly those of the file: one dropped, one changed.
    queue_partitions_apply(
        document={"partitions": [{"cluster": "hpc", "name": "h100", "pools": ["burst"]}]},
        result=ApplyResult(),
    )
    assert partition_pools() == {("hpc", "h100"): [burst.pk]}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ({"cluster": "hpc"}, "partitions: must be an array of tables"),
        ([{"name": "h100", "pools": []}], "partitions[0].cluster: required"),
        ([{"cluster": "hpc", "pools": []}], "partitions[0].name: required"),
        ([{"cluster": "a/b", "name": "h100"}], "partitions[0].cluster: must not contain"),
        ([{"cluster": "hpc", "name": " h100"}], "partitions[0].name: must not begin"),
        ([{"cluster": "hpc", "name": "h100", "pools": "training"}], "partitions[0].pools:"),
        (
            [{"cluster": "hpc", "name": "h100", "pools": ["nope"]}],
            "partitions[0].pools[0]: no pool named 'nope'",
        ),
        (
            [{"cluster": "hpc", "name": "h100"}, {"cluster": "hpc", "name": "h100"}],
            "partitions[1].name: partition 'h100' of 'hpc' listed twice",
        ),
    ],
)
def test_bad_partitions_are_refused_naming_the_field(db: Any, rows: Any, message: str) -> None:
    with pytest.raises(FleetFileError) as exc:
        queue_partitions_apply(document={"partitions": rows}, result=ApplyResult())
    assert str(exc.value).startswith(message)
    assert not QueuePartition.objects.exists()


def test_fleet_document_applies_partitions_through_the_section_hook(db: Any) -> None:
    """How billing's fleet_document_apply is to call it (see the report to the lead): here
    registered as a fleet section for the length of the test."""
    from billing import services

    services.fleet_section_register(key="partitions", apply=queue_partitions_apply)
    try:
        services.fleet_document_apply(
            document={
                "currency": "USD",
                "pools": [{"name": "training"}],
                "partitions": [{"cluster": "hpc", "name": "h100", "pools": ["training"]}],
            }
        )
    finally:
        services._FLEET_SECTIONS.pop("partitions", None)
    pool = Pool.objects.get(name="training")
    assert partition_pools() == {("hpc", "h100"): [pool.pk]}


# --- wanted while held ---------------------------------------------------------------------------
def idle_gpus(
    pool: Pool, hours: list[dt.datetime], held_s: list[float], parked_s: float = 0
) -> None:
    """One GPU per entry of ``held_s`` in ``pool`` (its own node), each with an hourly rollup
    in every hour of ``hours``: that many held seconds and ``parked_s`` parked."""
    node = Node.objects.create(hostname=f"{pool.name}-{Node.objects.count()}", pool=pool)
    for index, held in enumerate(held_s):
        gpu = Gpu.objects.create(uuid=f"GPU-{pool.name}-{node.pk}-{index}", node=node, index=index)
        for hour in hours:
            HourlyUsage.objects.create(
                gpu=gpu, hour=hour, pool=pool, node=node, samples=60, observed_s=3600.0,
                air_s=3600.0 - held - parked_s, held_s=held, parked_s=parked_s,
                computed_at=T0,
            )  # fmt: skip


def wait_two_hours(push: Any, jobs: list[PendingJob]) -> None:
    """``jobs`` pending from T0, a snapshot a minute, gone at T0 + 2 h: 120 intervals of 60 s,
    60 in the 09:00 hour and 60 in the 10:00 hour."""
    for k in range(120):
        push(60 * k, jobs)
    push(7200, [])


def partitions(mapping: dict[str, list[str]]) -> None:
    doc = {
        "partitions": [
            {"cluster": "hpc", "name": name, "pools": pools} for name, pools in mapping.items()
        ]
    }
    queue_partitions_apply(document=doc, result=ApplyResult())


def test_four_gpus_waited_two_hours_while_three_sat_held_is_six_gpu_hours(push: Any) -> None:
    """A job of 4 GPUs waits 2 h (capacity) in partition h100 → 4 GPU hours waited in each
    hour. Its pool has 3 GPUs, held all of both hours (air 0): 3 GPU hours each hour. Per
    hour min(4, 3) = 3, over 2 hours 6 GPU hours. Another pool's held GPU counts nothing,
    nor does a policy wait."""
    training, other = Pool.objects.create(name="training"), Pool.objects.create(name="other")
    partitions({"h100": ["training"]})
    idle_gpus(training, [T0, T0 + HOUR], [3600.0, 3600.0, 3600.0])
    idle_gpus(other, [T0, T0 + HOUR], [3600.0])
    wait_two_hours(push, [j("1", gpus=4), j("2", gpus=8, cls="policy", reason="QOSMaxGRES")])
    hours = partition_hours(start=T0, end=T0 + 2 * HOUR)
    assert sorted(hours) == [("hpc", "h100", T0), ("hpc", "h100", T0 + HOUR)]
    first = hours[("hpc", "h100", T0)]
    assert (first.waited_gpu_hours, first.idle_gpu_hours, first.wanted_gpu_hours) == (
        pytest.approx(4.0),
        3.0,
        3.0,
    )
    assert len(first.idle_s_by_gpu) == 3
    (row,) = queue_rows(start=T0, end=T0 + 2 * HOUR, group_by="partition")
    assert row["waited_gpu_hours"] == pytest.approx(4 * 2 + 8 * 2)
    assert row["wanted_while_held_gpu_hours"] == pytest.approx(6.0)
    # One hour of the two: 3.
    (row,) = queue_rows(start=T0 + HOUR, end=T0 + 2 * HOUR, group_by="partition")
    assert row["wanted_while_held_gpu_hours"] == pytest.approx(3.0)


def test_parked_gpus_count_and_the_wait_caps_what_is_wanted(push: Any) -> None:
    """2 GPUs waited for; the pool's 4 GPUs each held 1,800 s and parked 900 s an hour:
    4 × 2,700 s = 3 GPU hours idle ≥ 2 waited → 2 an hour, 4 over the two hours."""
    training = Pool.objects.create(name="training")
    partitions({"h100": ["training"]})
    idle_gpus(training, [T0, T0 + HOUR], [1800.0] * 4, parked_s=900.0)
    wait_two_hours(push, [j("1", gpus=2)])
    (row,) = queue_rows(start=T0, end=T0 + 2 * HOUR, group_by="cluster")
    assert (row["key"], row["wanted_while_held_gpu_hours"]) == ("hpc", pytest.approx(4.0))


@pytest.mark.parametrize(
    ("group_by", "expected"),
    [
        # alice waits for 3 GPUs, bob for 1: 4 waited an hour, 2 idle → 2 wanted an hour,
        # alice's part 3/4 = 1.5, bob's 0.5; over 2 hours 3.0 and 1.0.
        ("user", {"alice": 3.0, "bob": 1.0}),
        # Both in account nlp.
        ("account", {"nlp": 4.0}),
        ("partition", {"h100": 4.0}),
    ],
)
def test_wanted_hours_are_shared_by_each_groups_capacity_wait(
    push: Any, group_by: str, expected: dict[str, float]
) -> None:
    training = Pool.objects.create(name="training")
    partitions({"h100": ["training"]})
    idle_gpus(training, [T0, T0 + HOUR], [3600.0, 3600.0])
    wait_two_hours(push, [j("1", gpus=3), j("2", gpus=1, user="bob")])
    rows = queue_rows(start=T0, end=T0 + 2 * HOUR, group_by=group_by)
    assert {r["key"]: r["wanted_while_held_gpu_hours"] for r in rows} == {
        k: pytest.approx(v) for k, v in expected.items()
    }


def test_no_held_gpus_or_no_pools_want_nothing(push: Any) -> None:
    """The pool's GPU was busy all the time (air 3,600 s): nothing held, nothing wanted; a
    partition with no [[partitions]] entry has no pools."""
    training = Pool.objects.create(name="training")
    partitions({"h100": ["training"]})
    idle_gpus(training, [T0, T0 + HOUR], [0.0])
    wait_two_hours(push, [j("1", gpus=2), j("2", gpus=2, partition="a100")])
    rows = queue_rows(start=T0, end=T0 + 2 * HOUR, group_by="partition")
    assert {r["key"]: r["wanted_while_held_gpu_hours"] for r in rows} == {
        "h100": 0.0,
        "a100": 0.0,
    }


def test_the_admin_hands_a_cluster_to_another_node_and_lists_stretches(
    push: Any, make_user: Any, client: Any
) -> None:
    """QueueCluster: only its node can be changed (a collector moved to another login node);
    PendingStretch: read-only; neither can be added or deleted by hand."""
    push(0, [j("77", gpus=2)])
    cluster = QueueCluster.objects.get()
    other = Node.objects.create(hostname="login-2")
    client.force_login(make_user("admin"))
    url = f"/admin/telemetry/queuecluster/{cluster.pk}/change/"
    assert client.get(url).status_code == 200
    r = client.post(url, {"node": other.pk, "name": "typed"})
    assert r.status_code == 302, r.content
    cluster.refresh_from_db()
    assert (cluster.node_id, cluster.name) == (other.pk, "hpc")
    assert client.post(f"/admin/telemetry/queuecluster/{cluster.pk}/delete/").status_code == 403
    assert client.get("/admin/telemetry/queuecluster/add/").status_code == 403
    listing = client.get("/admin/telemetry/pendingstretch/?reason_class=capacity")
    assert listing.status_code == 200 and b">77<" in listing.content
    stretch = PendingStretch.objects.get()
    change = f"/admin/telemetry/pendingstretch/{stretch.pk}/change/"
    assert client.get(change).status_code == 200  # a view, not a form
    assert client.post(change, {}).status_code == 403
