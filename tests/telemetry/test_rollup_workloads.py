"""The rollup of the second wave's sample fields (docs/metrics.md, "Workloads" and "Work"):
held and parked of samples that name workloads, the per-workload hourly rows, and the
profiling sums. Every expected number is worked out by hand below; both dialects."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from telemetry.models import HourlyUsage, Workload, WorkloadHourlyUsage
from telemetry.rollup import rollup_run
from tests.telemetry.conftest import sample, samples_ingest


@pytest.fixture
def hour() -> dt.datetime:
    """An hour two days ago (UTC): in the past, inside raw retention."""
    now = timezone.now().astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    return now - dt.timedelta(days=2)


def _workloads(fleet: dict[str, Any]) -> dict[str, Workload]:
    made = {}
    for key, user, account in (
        ("101", "alice", "nlp"),
        ("102", "bob", "vision"),
        ("103", "carol", "nlp"),
    ):
        made[key] = Workload.objects.create(
            site=fleet["site_a"],
            kind="slurm",
            key=key,
            user_name=user,
            account=account,
            created_at=timezone.now(),
        )
    return made


def _minutes(hour: dt.datetime) -> list[dt.datetime]:
    return [hour + dt.timedelta(minutes=m) for m in range(60)]


def test_the_worked_example_rolls_up_per_gpu_and_per_workload(
    fleet: dict[str, Any], make_gpu: Any, hour: dt.datetime
) -> None:
    """docs/metrics.md's workload example. GPU A: 60 samples at 80 %, 400 W, two jobs sharing
    it all hour (share 30 s and air 24 s each per sample). GPU B: 60 samples at 0 %, 70 W,
    one job holding its allocation all hour (share 60, air 0)."""
    w = _workloads(fleet)
    a, b = make_gpu(), make_gpu()
    both = [w["101"].pk, w["102"].pk]
    rows = [
        sample(a, t, util=80.0, energy_j=24_000.0, workload_ids=both,
               workload_share_s=[30.0, 30.0], workload_air_s=[24.0, 24.0])
        for t in _minutes(hour)
    ] + [
        sample(b, t, util=0.0, energy_j=4_200.0, procs=0, workload_ids=[w["103"].pk],
               workload_share_s=[60.0], workload_air_s=[0.0])
        for t in _minutes(hour)
    ]  # fmt: skip
    samples_ingest(rows)
    rollup_run()
    gpu_a = HourlyUsage.objects.get(gpu=a)
    # air 60 × 48 s; held: Σ share − air = 60 − 48 = 12 s per sample; parked 0.
    assert (gpu_a.air_s, gpu_a.held_s, gpu_a.parked_s) == (2880.0, 720.0, 0.0)
    gpu_b = HourlyUsage.objects.get(gpu=b)
    # procs 0 would make it parked; the allocation holds it: held 60 s per sample.
    assert (gpu_b.air_s, gpu_b.held_s, gpu_b.parked_s) == (0.0, 3600.0, 0.0)
    got = {
        (r.workload.key, r.gpu_id): (r.samples, r.gpu_s, r.air_s, r.energy_j, r.pool_id, r.team_id)
        for r in WorkloadHourlyUsage.objects.select_related("workload")
    }
    pool, team = fleet["pool_a"].pk, fleet["team_a"].pk
    assert got == {
        # energy: 60 × 24,000 J × 30 / 60 = 720,000 J each; 60 × 4,200 J = 252,000 J.
        ("101", a.pk): (60, 1800.0, 1440.0, 720_000.0, pool, team),
        ("102", a.pk): (60, 1800.0, 1440.0, 720_000.0, pool, team),
        ("103", b.pk): (60, 3600.0, 0.0, 252_000.0, pool, team),
    }
    job = Workload.objects.get(pk=w["101"].pk)
    assert (job.first_seen_at, job.last_seen_at) == (hour, hour + dt.timedelta(hours=1))


@pytest.mark.parametrize(
    ("util", "shares", "procs", "held", "parked"),
    [
        (0.0, [60.4], 0, 60.0, 0.0),  # shares past d (within the slack): held is at most d − air
        (50.0, [10.0], 1, 0.0, 30.0),  # a share inside the air time holds nothing beyond it
        (50.0, [40.0], 1, 10.0, 20.0),  # 40 − 30 air = 10 held, the rest parked
        (0.0, [], 1, 0.0, 60.0),  # an empty list: nothing held it, procs notwithstanding
    ],
)
def test_held_is_the_shares_beyond_the_air_time_clamped(
    make_gpu: Any,
    fleet: dict[str, Any],
    hour: dt.datetime,
    util: float,
    shares: list[float],
    procs: int,
    held: float,
    parked: float,
) -> None:
    w = _workloads(fleet)
    gpu = make_gpu()
    ids = [w["101"].pk][: len(shares)]
    samples_ingest(
        [sample(gpu, hour, util=util, procs=procs, workload_ids=ids, workload_share_s=shares,
                workload_air_s=[0.0] * len(shares))]
    )  # fmt: skip
    rollup_run()
    row = HourlyUsage.objects.get(gpu=gpu)
    assert (row.held_s, row.parked_s) == (held, parked)
    assert row.air_s + row.held_s + row.parked_s == 60.0


def test_samples_without_workloads_follow_procs_and_memory_as_before(
    make_gpu: Any, hour: dt.datetime
) -> None:
    gpu = make_gpu()
    samples_ingest(
        [
            sample(gpu, hour, util=25.0, procs=1),
            sample(gpu, hour + dt.timedelta(minutes=1), util=25.0, procs=0),
        ]
    )
    rollup_run()
    row = HourlyUsage.objects.get(gpu=gpu)
    assert (row.air_s, row.held_s, row.parked_s) == (30.0, 45.0, 45.0)
    assert not WorkloadHourlyUsage.objects.exists()


def test_rerun_and_late_samples_end_as_one_clean_run(
    fleet: dict[str, Any], make_gpu: Any, hour: dt.datetime
) -> None:
    w = _workloads(fleet)
    gpu = make_gpu()
    first = [
        sample(gpu, t, util=50.0, workload_ids=[w["101"].pk], workload_share_s=[60.0],
               workload_air_s=[30.0])
        for t in _minutes(hour)[:30]
    ]  # fmt: skip
    samples_ingest(first)
    rollup_run()
    before = list(WorkloadHourlyUsage.objects.values_list("pk", "computed_at", "gpu_s"))
    samples_ingest(first)  # a replay: duplicates change nothing, the hour is re-marked
    rollup_run()
    after = list(WorkloadHourlyUsage.objects.values_list("pk", "computed_at", "gpu_s"))
    if connection.vendor == "postgresql":  # an unchanged row is not even rewritten
        assert after == before
    assert [row[2] for row in after] == [row[2] for row in before] == [1800.0]
    late = [
        sample(gpu, t, util=50.0, workload_ids=[w["102"].pk], workload_share_s=[60.0],
               workload_air_s=[30.0])
        for t in _minutes(hour)[30:]
    ]  # fmt: skip
    samples_ingest(late)
    rollup_run()
    got = dict(WorkloadHourlyUsage.objects.values_list("workload__key", "gpu_s"))
    assert got == {"101": 1800.0, "102": 1800.0}


def test_rows_no_sample_counts_for_are_deleted(
    fleet: dict[str, Any], make_gpu: Any, hour: dt.datetime
) -> None:
    """The GPU's service start moves past the hour: its samples no longer count, and neither
    GPU nor workload rows of that hour remain."""
    w = _workloads(fleet)
    gpu = make_gpu()
    samples_ingest(
        [sample(gpu, hour, util=10.0, workload_ids=[w["101"].pk], workload_share_s=[60.0],
                workload_air_s=[6.0])]
    )  # fmt: skip
    rollup_run()
    assert WorkloadHourlyUsage.objects.count() == 1
    type(gpu).objects.filter(pk=gpu.pk).update(in_service_at=hour + dt.timedelta(hours=1))
    from telemetry.pending import hours_mark

    hours_mark([hour])
    rollup_run()
    assert not WorkloadHourlyUsage.objects.exists() and not HourlyUsage.objects.exists()


def test_profiling_sums_are_means_over_prof_s(make_gpu: Any, hour: dt.datetime) -> None:
    """Two samples with profiling data, one over 30 of its 60 s, one without prof_s (the whole
    interval), and one without any: work, tensor and busy-but-not-working seconds, the hours
    with data and their energy, and the hour's occupancy and DRAM means."""
    gpu = make_gpu()
    samples_ingest(
        [
            sample(gpu, hour, util=90.0, energy_j=1000.0, sm_active=0.5, tensor_active=0.25,
                   sm_occupancy=0.3, dram_active=0.4, prof_s=30.0),
            sample(gpu, hour + dt.timedelta(minutes=1), util=50.0, energy_j=2000.0,
                   sm_active=0.25, sm_occupancy=0.6, dram_active=0.1),
            sample(gpu, hour + dt.timedelta(minutes=2), util=100.0, energy_j=500.0),
        ]
    )  # fmt: skip
    rollup_run()
    row = HourlyUsage.objects.get(gpu=gpu)
    assert row.sm_active_s == 0.5 * 30 + 0.25 * 60  # 30 work seconds
    assert row.sm_observed_s == 30 + 60
    assert row.sm_air_s == 54.0 + 30.0  # the air of the samples with sm_active
    assert (row.tensor_active_s, row.tensor_observed_s) == (0.25 * 30, 30.0)
    assert (row.sm_hours, row.sm_hours_energy_j) == (1, 3500.0)
    assert row.sm_occupancy_mean == pytest.approx((0.3 * 30 + 0.6 * 60) / 90)
    assert row.dram_active_mean == pytest.approx((0.4 * 30 + 0.1 * 60) / 90)


def test_an_hour_without_profiling_has_none(make_gpu: Any, hour: dt.datetime) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, hour, util=90.0, energy_j=1000.0)])
    rollup_run()
    row = HourlyUsage.objects.get(gpu=gpu)
    assert (row.sm_observed_s, row.tensor_observed_s, row.sm_hours) == (0.0, 0.0, 0)
    assert (row.sm_occupancy_mean, row.dram_active_mean) == (None, None)


def _workload_reference(rows: list[Any], in_service: dict[int, dt.datetime]) -> dict[Any, Any]:
    """The workload rows worked out in Python from the samples, as docs/metrics.md defines
    them: per (workload, GPU, hour) the samples that name it, Σ share_s, Σ air_s and Σ the
    sample's energy × share_s / seconds; samples before the GPU's service start do not count."""
    out: dict[Any, list[float]] = {}
    for s in rows:
        if s.workload_ids is None or s.start < in_service.get(s.gpu_id, s.start):
            continue
        hour = s.start.replace(minute=0, second=0, microsecond=0)
        for wid, share, air in zip(
            s.workload_ids, s.workload_share_s, s.workload_air_s, strict=True
        ):
            acc = out.setdefault((wid, s.gpu_id, hour), [0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += share
            acc[2] += air
            acc[3] += s.energy_j * share / s.seconds
    return {k: tuple(v) for k, v in out.items()}


def _workload_stored() -> dict[Any, Any]:
    return {
        (r.workload_id, r.gpu_id, r.hour): (r.samples, r.gpu_s, r.air_s, r.energy_j)
        for r in WorkloadHourlyUsage.objects.all()
    }


def test_every_mix_of_workloads_in_an_hour_sums_as_the_reference(
    fleet: dict[str, Any], make_gpu: Any, hour: dt.datetime
) -> None:
    """Seeded random hours of every kind the rollup tells apart (docs/benchmarks.md,
    "Workloads"): the same workloads all hour, a job ending and another starting, the same
    jobs listed in another order, more than four sharing, samples without workloads or with
    an empty list between; delivered in two halves (the hours re-rolled with more samples),
    then a GPU's service start moved into an hour. Every row equals the Python reference.
    Values on a binary grid, so every sum is exact whatever the order of addition."""
    import random

    from telemetry.pending import hours_mark

    rng = random.Random(14)
    ids = [
        Workload.objects.create(
            site=fleet["site_a"], kind="slurm", key=f"r{i}", created_at=timezone.now()
        ).pk
        for i in range(8)
    ]
    gpus = [make_gpu() for _ in range(4)]
    hours = [hour + dt.timedelta(hours=h) for h in range(3)]
    kinds = ["same", "switch", "order", "many", "gaps"]
    rows = []
    for gpu in gpus:
        for h in hours:
            kind = rng.choice(kinds)
            sets = {
                "same": [rng.sample(ids, 2)],
                "switch": [rng.sample(ids, 1), rng.sample(ids, 2)],
                "order": [[ids[0], ids[1]], [ids[1], ids[0]]],
                "many": [rng.sample(ids, 6)],
                "gaps": [rng.sample(ids, 3), None, []],
            }[kind]
            for minute in range(0, 60, 4):
                chosen = sets[(minute // 20) % len(sets)]
                share = [rng.choice([15.0, 30.0, 60.0]) for _ in chosen or []]
                rows.append(
                    sample(
                        gpu,
                        h + dt.timedelta(minutes=minute),
                        util=50.0,
                        energy_j=rng.choice([6_000.0, 12_000.0, 24_000.0]),
                        workload_ids=chosen,
                        workload_share_s=share if chosen is not None else None,
                        workload_air_s=[s / 2 for s in share] if chosen is not None else None,
                    )
                )
    rng.shuffle(rows)
    samples_ingest(rows[: len(rows) // 2])
    rollup_run()
    assert _workload_stored() == _workload_reference(rows[: len(rows) // 2], {})
    samples_ingest(rows[len(rows) // 2 :])
    rollup_run()
    assert _workload_stored() == _workload_reference(rows, {})
    moved = hours[1] + dt.timedelta(minutes=30)
    type(gpus[0]).objects.filter(pk=gpus[0].pk).update(in_service_at=moved)
    hours_mark(hours)
    rollup_run()
    assert _workload_stored() == _workload_reference(rows, {gpus[0].pk: moved})
    seen = dict(Workload.objects.filter(pk__in=ids).values_list("pk", "last_seen_at"))
    for wid in ids:
        ends = [
            s.start + dt.timedelta(seconds=s.seconds)
            for s in rows
            if s.workload_ids and wid in s.workload_ids
        ]
        assert seen[wid] == (max(ends) if ends else None)
