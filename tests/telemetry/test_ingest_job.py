"""A sample's ``job`` (docs/ingest.md): each bad field named in the answer, the sums added to
JobHour in the samples' own write on every path, and a duplicate sample adding nothing."""

from __future__ import annotations

import datetime as dt
from typing import Any
from unittest import mock

import pytest

from telemetry.models import JobHour, Sample, Workload
from tests.telemetry.test_ingest import agent, base, gpu_block, push, sample  # noqa: F401

# one-statement: ≤ 64 rows in one statement; copy: direct COPY in a transaction; a duplicate
# in a COPY batch takes the staging table (test_a_duplicate_push_adds_nothing).
PATHS = pytest.mark.parametrize("one_statement_max", [64, 0], ids=["one-statement", "copy"])
WL = {"kind": "slurm", "id": "48213", "user": "alice", "share_s": 60.0, "air_s": 45.0}
JOB = {
    "kind": "slurm",
    "id": "48213",
    "model": "llama-8b",
    "steps": 12.5,
    "samples": 400,
    "tokens": 819200,
    "flops": 2.0e16,
    "ckpt_bytes": 1.5e9,
    "wall_s": 60.0,
    "data_wait_s": 18.0,
    "compute_s": 39.0,
    "ckpt_s": 3.0,
}


def with_job(hour: dt.datetime, minute: int, **job: Any) -> dict[str, Any]:
    return sample(
        "GPU-j", hour + dt.timedelta(minutes=minute), workloads=[dict(WL)], job={**JOB, **job}
    )


def sums(row: JobHour) -> tuple[float, ...]:
    return (
        row.reports,
        row.steps,
        row.samples,
        row.tokens,
        row.flops,
        row.ckpt_bytes,
        row.wall_s,
        row.data_wait_s,
        row.compute_s,
        row.ckpt_s,
        row.flops_wall_s,
    )


@PATHS
def test_sums_are_stored_per_gpu_hour_workload_and_model(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    one_statement_max: int,
) -> None:
    """Minutes 0 and 1 of one hour, and minute 0 of the next: two rows. Minute 1 gave no flops:
    its wall time is not MFU's (flops_wall_s 60, not 120)."""
    a = agent()
    pushed = [
        with_job(base, 0),
        with_job(base, 1, steps=7.5, tokens=180800, flops=None),
        with_job(base, 60, model="bert"),
    ]
    pushed[1]["job"].pop("flops")
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        r = a.post(push(pushed, [gpu_block("GPU-j")]))
    assert r.json() == {"accepted": 3, "duplicates": 0, "rejected": []}
    wl = Workload.objects.get()
    first = JobHour.objects.get(hour=base)
    assert (first.workload_id, first.model, first.gpu.uuid) == (wl.pk, "llama-8b", "GPU-j")
    assert sums(first) == (
        2,
        20.0,  # 12.5 + 7.5
        800.0,
        1_000_000.0,  # 819,200 + 180,800
        2.0e16,
        3.0e9,
        120.0,
        36.0,
        78.0,
        6.0,
        60.0,
    )
    second = JobHour.objects.get(hour=base + dt.timedelta(hours=1))
    assert second.model == "bert" and second.reports == 1 and second.flops_wall_s == 60.0


@PATHS
def test_a_duplicate_push_adds_nothing(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    one_statement_max: int,
) -> None:
    a = agent()
    body = push([with_job(base, 0), with_job(base, 1)], [gpu_block("GPU-j")])
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        assert a.post(body).json()["accepted"] == 2
        assert a.post(body).json() == {"accepted": 0, "duplicates": 2, "rejected": []}
        # one old and one new sample: only the new one's job is added (the copy path goes
        # through the staging table here)
        mixed = push([with_job(base, 1), with_job(base, 2)], [gpu_block("GPU-j")])
        assert a.post(mixed).json() == {"accepted": 1, "duplicates": 1, "rejected": []}
    row = JobHour.objects.get()
    assert (row.reports, row.steps, row.wall_s) == (3, 37.5, 180.0)
    assert Sample.objects.count() == 3


def test_a_sample_repeated_in_one_push_adds_once(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    r = a.post(push([with_job(base, 0), with_job(base, 0, steps=99)], [gpu_block("GPU-j")]))
    assert r.json()["accepted"] + r.json()["duplicates"] == 2
    assert JobHour.objects.get().steps == 12.5  # the first of a repeated key is stored


def test_a_job_without_workloads_and_one_naming_none(agent: Any, base: Any) -> None:  # noqa: F811
    """Without ``kind``/``id`` the job is the workload's with the largest share; without
    workloads it has no workload (two such samples add to one row)."""
    a = agent()
    bare = {k: v for k, v in JOB.items() if k not in ("kind", "id")}
    pushed = [
        sample("GPU-j", base, job=bare),
        sample("GPU-j", base + dt.timedelta(minutes=1), job=bare),
        sample(
            "GPU-j",
            base + dt.timedelta(minutes=2),
            workloads=[
                {**WL, "share_s": 20.0, "air_s": 1.0},
                {**WL, "id": "7", "share_s": 40, "air_s": 30},
            ],
            job=bare,
        ),
    ]
    assert a.post(push(pushed, [gpu_block("GPU-j")])).json()["accepted"] == 3
    none = JobHour.objects.get(workload__isnull=True)
    assert none.reports == 2 and none.steps == 25.0
    named = JobHour.objects.get(workload__isnull=False)
    assert named.workload is not None and named.workload.key == "7"


BAD = [
    ({"model": ""}, "job.model"),
    ({"model": "x" * 201}, "job.model"),
    ({"model": 7}, "job.model"),
    ({"model": "bad\u0007name"}, "job.model"),
    ({"steps": -1}, "job.steps"),
    ({"samples": -0.5}, "job.samples"),
    ({"tokens": "many"}, "job.tokens"),
    ({"flops": -1e15}, "job.flops"),
    ({"ckpt_bytes": -1}, "job.ckpt_bytes"),
    ({"wall_s": -1}, "job.wall_s"),
    ({"wall_s": 61.0}, "job.wall_s"),  # more than the sample's 60 s
    ({"data_wait_s": -1}, "job.data_wait_s"),
    ({"data_wait_s": 61.0}, "job.data_wait_s"),
    ({"compute_s": 60.7}, "job.compute_s"),  # > wall × 1.01
    ({"ckpt_s": 3601}, "job.ckpt_s"),
    ({"data_wait_s": 30.0, "compute_s": 30.0, "ckpt_s": 1.0}, "job.wall_s"),  # 61 > 60.6
    ({"kind": "pbs"}, "job.kind"),
    ({"id": "9999"}, "job.id"),  # not among the sample's workloads
    ({"kind": None}, "job.kind"),  # id without kind
    ({"wall_s": None}, "job.wall_s"),
]


@pytest.mark.parametrize(("change", "field"), BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_each_bad_field_is_named_and_nothing_is_stored(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    change: dict[str, Any],
    field: str,
) -> None:
    a = agent()
    job = {**JOB, **change}
    for k in [k for k, v in change.items() if v is None]:
        job.pop(k)
    s = sample("GPU-j", base, workloads=[dict(WL)], job=job)
    r = a.post(push([s], [gpu_block("GPU-j")]))
    assert r.status_code == 400
    (rejected,) = r.json()["rejected"]
    assert rejected["field"] == field, rejected
    assert not JobHour.objects.exists() and not Sample.objects.exists()


def test_the_parts_may_pass_the_wall_time_by_one_per_cent(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    s = sample(
        "GPU-j",
        base,
        workloads=[dict(WL)],
        job={**JOB, "data_wait_s": 20.0, "compute_s": 40.0, "ckpt_s": 0.6},  # 60.6 = 60 × 1.01
    )
    assert a.post(push([s], [gpu_block("GPU-j")])).json()["accepted"] == 1
    assert JobHour.objects.get().data_wait_s == 20.0
