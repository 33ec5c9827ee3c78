"""Ingest of MIG (DESIGN.md §9.5, docs/ingest.md "mig" and "instance"): a GPU's ``mig`` block
registers its instances, a sample naming ``instance`` is stored as that instance's sample, and
every bad field is named in the answer while nothing of a refused push is stored."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from telemetry.models import InstanceSample, MigInstance, RollupPending, Sample, Workload
from tests.telemetry.test_ingest import agent, base, gpu_block, push, sample  # noqa: F401

G = "GPU-mig-0"
M3 = "MIG-3333aaaa-0000-0000-0000-000000000003"
M2 = "MIG-2222aaaa-0000-0000-0000-000000000002"
M1 = "MIG-1111aaaa-0000-0000-0000-000000000001"
JOB = {"kind": "slurm", "id": "48213", "user": "alice"}


def mig(uuid: str, gi: int, profile: str, slices: int, memory_mb: int) -> dict[str, Any]:
    return {"uuid": uuid, "gi": gi, "ci": 0, "profile": profile, "slices": slices,
            "memory_mb": memory_mb}  # fmt: skip


LAYOUT = [
    mig(M3, 2, "3g.40gb", 3, 40448),
    mig(M2, 3, "2g.20gb", 2, 20096),
    mig(M1, 9, "1g.10gb", 1, 9984),
]


def block(instances: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return gpu_block(G, mig=LAYOUT if instances is None else instances, mig_slices=7, **extra)


def inst_sample(instance: str, start: dt.datetime, **fields: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"gpu": G, "instance": instance, "start": start.strftime(
        "%Y-%m-%dT%H:%M:%SZ"), "seconds": 60, "util_pct": 40.0, "procs": 1}  # fmt: skip
    s.update(fields)
    return s


def test_instances_are_registered_and_their_samples_stored(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    samples = [
        # the GPU's sample names the instances' workloads with their slice-weighted shares
        # (3/7 of 60 s), as the agent sends them: that registers them
        sample(G, base, util_pct=30.0, workloads=[{**JOB, "share_s": 25.714, "air_s": 18.0}]),
        inst_sample(
            M3,
            base,
            util_pct=70.0,
            sm_active=0.5,
            prof_s=60,
            workloads=[{**JOB, "share_s": 60.0, "air_s": 42.0}],
        ),  # fmt: skip
        inst_sample(M2, base, util_pct=0.0, procs=0, workloads=[]),
    ]
    r = a.post(push(samples, [block()]))
    assert r.status_code == 200, r.content
    assert r.json() == {"accepted": 3, "duplicates": 0, "rejected": []}
    rows = {m.uuid: m for m in MigInstance.objects.all()}
    assert set(rows) == {M3, M2, M1}
    m3 = rows[M3]
    assert (m3.gi, m3.ci, m3.profile, m3.slices, m3.memory_mb, m3.gpu_slices) == (
        2, 0, "3g.40gb", 3, 40448, 7)  # fmt: skip
    assert m3.gone_at is None
    # the GPU's own sample stays one row of Sample; the instances' are their own rows
    assert Sample.objects.count() == 1
    s3 = InstanceSample.objects.get(instance=m3)
    assert (s3.gpu_id, s3.seconds, s3.slices, s3.gpu_slices, s3.util_pct) == (
        m3.gpu_id, 60, 3, 7, 70.0)  # fmt: skip
    assert (s3.sm_active, s3.prof_s, s3.procs) == (0.5, 60.0, 1)
    job = Workload.objects.get(kind="slurm", key="48213")
    assert (s3.workload_ids, s3.workload_share_s, s3.workload_air_s) == ([job.pk], [60.0], [42.0])
    s2 = InstanceSample.objects.get(instance=rows[M2])
    assert (s2.workload_ids, s2.workload_share_s) == ([], [])  # an empty list: nothing held it
    # the hour is marked for the rollup
    assert RollupPending.objects.filter(hour=base).exists()


def test_a_duplicate_instance_sample_changes_nothing(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    body = push([inst_sample(M1, base, util_pct=10.0)], [block()])
    assert a.post(body).json() == {"accepted": 1, "duplicates": 0, "rejected": []}
    again = push([inst_sample(M1, base, util_pct=99.0)], [block()])
    assert a.post(again).json() == {"accepted": 0, "duplicates": 1, "rejected": []}
    assert InstanceSample.objects.get().util_pct == 10.0
    # the same start for another instance is another sample
    other = push([inst_sample(M2, base)], [block()])
    assert a.post(other).json()["accepted"] == 1


def test_a_reconfiguration_marks_the_old_instances_gone_and_keeps_their_samples(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
) -> None:
    a = agent()
    assert a.post(push([inst_sample(M3, base)], [block()])).json()["accepted"] == 1
    m4 = "MIG-4444aaaa-0000-0000-0000-000000000004"
    new = [mig(m4, 1, "4g.40gb", 4, 40448), mig(M3, 2, "3g.40gb", 3, 40448)]
    later = base + dt.timedelta(minutes=1)
    # a late sample of an instance destroyed since is still its instance's
    r = a.post(push([inst_sample(m4, later), inst_sample(M1, base)], [block(new)]))
    assert r.json() == {"accepted": 2, "duplicates": 0, "rejected": []}
    gone = {m.uuid for m in MigInstance.objects.filter(gone_at__isnull=False)}
    assert gone == {M2, M1}
    assert InstanceSample.objects.count() == 3
    # listed again: back
    a.post(push([], [block()]))
    assert set(
        MigInstance.objects.filter(gone_at__isnull=False).values_list("uuid", flat=True)
    ) == {m4}


@pytest.mark.parametrize(
    ("instances", "extra", "field", "error"),
    [
        ([{**LAYOUT[0], "slices": 9}], {}, "gpus[0].mig[0].slices", "1–8"),
        ([{**LAYOUT[0], "slices": 0}], {}, "gpus[0].mig[0].slices", "1–8"),
        ([{**LAYOUT[0], "slices": 5}], {"mig_slices": 4}, "gpus[0].mig[0].slices", "4 slices"),
        ([LAYOUT[0], {**LAYOUT[1], "uuid": M3}], {}, "gpus[0].mig[1].uuid", "listed twice"),
        (
            [LAYOUT[0], mig(M2, 1, "4g.40gb", 4, 40448), LAYOUT[2]],
            {},
            "gpus[0].mig",
            "add up to 8",
        ),  # fmt: skip
        ([{**LAYOUT[0], "gi": -1}], {}, "gpus[0].mig[0].gi", "0–32767"),
        ([{**LAYOUT[0], "memory_mb": "40gb"}], {}, "gpus[0].mig[0].memory_mb", "not a string"),
        ([{**LAYOUT[0], "profile": ""}], {}, "gpus[0].mig[0].profile", "1–50"),
        ([{**LAYOUT[0], "uuid": "MIG bad\u0007"}], {}, "gpus[0].mig[0].uuid", ""),
        ([{k: v for k, v in LAYOUT[0].items() if k != "ci"}], {}, "gpus[0].mig[0].ci", "required"),
        ([{**LAYOUT[0], "uuid": G}], {}, "gpus[0].mig[0].uuid", "not its GPU's"),
        (LAYOUT, {"mig_slices": 9}, "gpus[0].mig_slices", "1–8"),
    ],
)
def test_a_bad_mig_block_is_refused_naming_the_field(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    instances: list[dict[str, Any]],
    extra: dict[str, Any],
    field: str,
    error: str,
) -> None:
    a = agent()
    gpu = {**gpu_block(G), "mig": instances, "mig_slices": 7, **extra}
    r = a.post(push([sample(G, base)], [gpu]))
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["field"] == field, body
    assert error in body["error"], body
    assert not Sample.objects.exists() and not MigInstance.objects.exists()


def test_mig_slices_without_mig_is_refused(agent: Any, base: Any) -> None:  # noqa: F811
    r = agent().post(push([sample(G, base)], [gpu_block(G, mig_slices=7)]))
    assert (r.status_code, r.json()["field"]) == (400, "gpus[0].mig_slices")


def test_an_instance_listed_under_two_gpus_is_refused(agent: Any, base: Any) -> None:  # noqa: F811
    other = gpu_block("GPU-mig-1", index=1, mig=[LAYOUT[0]], mig_slices=7)
    r = agent().post(push([sample(G, base)], [block(), other]))
    assert (r.status_code, r.json()["field"]) == (400, "gpus[1].mig[0].uuid")
    assert "listed twice" in r.json()["error"]


def test_bad_instance_samples_are_rejected_naming_the_field(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    other_gpu = gpu_block("GPU-mig-1", index=1, mig=[mig(M2, 1, "2g.20gb", 2, 20096)])
    samples = [
        inst_sample("MIG-nobody", base),  # never listed
        inst_sample(M2, base),  # an instance of the other GPU
        inst_sample(M3, base, util_pct=101.0),  # the usual ranges hold
        inst_sample(M3, base, workloads=[{**JOB, "share_s": 61.0, "air_s": 1.0}]),
        {**inst_sample(M3, base), "instance": ""},
        inst_sample(M3, base + dt.timedelta(seconds=30)),  # not aligned
        inst_sample(M3, base),  # the one good sample
    ]
    r = a.post(push(samples, [block(LAYOUT[:1]), other_gpu]))
    assert r.status_code == 200, r.content
    got = {x["index"]: (x["field"], x["code"]) for x in r.json()["rejected"]}
    assert got == {
        0: ("instance", "unknown_instance"),
        1: ("instance", "unknown_instance"),
        2: ("util_pct", "invalid"),
        3: ("workloads[0].share_s", "invalid"),
        4: ("instance", "invalid"),
        5: ("start", "invalid"),
    }
    assert r.json()["accepted"] == 1
    assert InstanceSample.objects.get().instance.uuid == M3


def test_an_instance_sample_with_an_unknown_instance_only_is_400(agent: Any, base: Any) -> None:  # noqa: F811
    r = agent().post(push([inst_sample(M3, base)], [gpu_block(G)]))
    assert r.status_code == 400
    assert json.loads(r.content)["rejected"][0]["field"] == "instance"
    assert not InstanceSample.objects.exists()


def test_a_push_without_mig_reads_and_writes_nothing_of_it(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    a.post(push([sample(G, base)], [gpu_block(G)]))
    with CaptureQueriesContext(connection) as ctx:
        r = a.post(push([sample(G, base + dt.timedelta(minutes=1))], [gpu_block(G)]))
    assert r.json()["accepted"] == 1
    sqls = [str(q["sql"]) for q in ctx.captured_queries]
    assert sqls and not [q for q in sqls if "miginstance" in q or "instancesample" in q]
