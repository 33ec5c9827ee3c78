"""Ingest of the second wave's sample fields (docs/ingest.md): ``workloads`` (who held the GPU)
and the profiling means (``sm_occupancy``, ``tensor_active``, ``dram_active``, ``prof_s``).

Each rule rejects the sample naming ``workloads[i].<field>``; workloads are registered per
(site of the node, kind, id); a sample's workloads are stored with it, on every write path.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from unittest import mock

import pytest

from fleet.models import Node, Pool, Site
from fleet.services import token_revoke
from telemetry.models import Sample, Workload
from tests.telemetry.test_ingest import agent, base, gpu_block, push, sample  # noqa: F401

PATHS = pytest.mark.parametrize("one_statement_max", [64, 0], ids=["one-statement", "copy"])
JOB = {"kind": "slurm", "id": "48213", "user": "alice", "account": "nlp", "name": "train-llm"}
POD = {"kind": "k8s", "id": "chat/inference-7d9f", "account": "chat"}


def held(*entries: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(e) for e in entries]


@PATHS
def test_workloads_are_registered_and_stored_with_their_samples(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    one_statement_max: int,
) -> None:
    site = Site.objects.create(name="fra1")
    a = agent()
    Node.objects.filter(pk=a.node.pk).update(pool=Pool.objects.create(name="p", site=site))
    samples = [
        sample(
            "GPU-w",
            base + dt.timedelta(minutes=m),
            util_pct=50.0,
            workloads=held(
                {**JOB, "share_s": 40.0, "air_s": 25.0}, {**POD, "share_s": 20, "air_s": 5}
            ),
        )
        for m in (0, 1)
    ]
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        r = a.post(push(samples, [gpu_block("GPU-w")]))
    assert r.json() == {"accepted": 2, "duplicates": 0, "rejected": []}
    job = Workload.objects.get(kind="slurm")
    pod = Workload.objects.get(kind="k8s")
    assert (job.site, job.key, job.user_name, job.account, job.name) == (
        site,
        "48213",
        "alice",
        "nlp",
        "train-llm",
    )
    assert (pod.key, pod.account, pod.user_name) == ("chat/inference-7d9f", "chat", "")
    stored = Sample.objects.order_by("start").first()
    assert stored is not None
    ids = dict(
        zip(
            stored.workload_ids or [],
            zip(stored.workload_share_s or [], stored.workload_air_s or [], strict=True),
            strict=True,
        )
    )
    assert ids == {job.pk: (40.0, 25.0), pod.pk: (20.0, 5.0)}


def test_a_sample_without_workloads_stores_none(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    assert a.post(push([sample("GPU-n", base)], [gpu_block("GPU-n")])).json()["accepted"] == 1
    stored = Sample.objects.get()
    assert (stored.workload_ids, stored.workload_share_s, stored.workload_air_s) == (None,) * 3
    assert not Workload.objects.exists()


def test_identity_is_site_kind_id_and_names_are_the_latest(agent: Any, base: Any) -> None:  # noqa: F811
    """The same job id at two sites is two workloads; at one site one, whichever node sent
    it; a later push of the node that first reported it replaces the names it sends and
    leaves those it leaves out (the names of other nodes: test_ingest_workload_identity)."""
    fra, ams = Site.objects.create(name="fra1"), Site.objects.create(name="ams1")
    a, b, c = agent(), agent(), agent()
    Node.objects.filter(pk=a.node.pk).update(site=fra)
    Node.objects.filter(pk=b.node.pk).update(site=fra)
    Node.objects.filter(pk=c.node.pk).update(site=ams)
    job = {**JOB, "share_s": 60.0, "air_s": 30.0}
    for i, node in enumerate((a, b, c)):
        s = sample(f"GPU-i{i}", base, workloads=[job])
        assert node.post(push([s], [gpu_block(f"GPU-i{i}")])).json()["accepted"] == 1
    assert Workload.objects.filter(kind="slurm", key="48213").count() == 2
    renamed = {**{k: v for k, v in job.items() if k != "user"}, "name": "train-llm-v2"}
    later = sample("GPU-i0", base + dt.timedelta(minutes=1), workloads=[renamed])
    assert a.post(push([later])).json()["accepted"] == 1
    w = Workload.objects.get(site=fra, key="48213")
    assert (w.user_name, w.name) == ("alice", "train-llm-v2")


def test_a_node_without_a_site_has_one_identity_per_workload(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    job = {**JOB, "share_s": 60.0, "air_s": 30.0}
    for m in (0, 1, 2):
        s = sample("GPU-ns", base + dt.timedelta(minutes=m), workloads=[job])
        assert a.post(push([s], [gpu_block("GPU-ns")])).json()["accepted"] == 1
    assert Workload.objects.filter(site__isnull=True).count() == 1


def test_replay_with_other_workloads_changes_nothing(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    first = sample("GPU-r", base, workloads=[{**JOB, "share_s": 60.0, "air_s": 30.0}])
    assert a.post(push([first], [gpu_block("GPU-r")])).json()["accepted"] == 1
    again = sample("GPU-r", base, workloads=[{**POD, "share_s": 60.0, "air_s": 30.0}])
    assert a.post(push([again])).json() == {"accepted": 0, "duplicates": 1, "rejected": []}
    stored = Sample.objects.get()
    assert stored.workload_ids == [Workload.objects.get(kind="slurm").pk]


def test_revoked_token_registers_no_workload(agent: Any, base: Any, postgres: Any) -> None:  # noqa: F811
    a = agent()
    a.post(push([sample("GPU-t", base)], [gpu_block("GPU-t")]))
    token_revoke(prefix="_".join(a.token.split("_")[:2]))
    s = sample(
        "GPU-t", base + dt.timedelta(minutes=1), workloads=[{**JOB, "share_s": 9, "air_s": 1}]
    )
    assert a.post(push([s])).status_code == 401
    assert not Workload.objects.exists() and Sample.objects.count() == 1


def _w(**fields: Any) -> dict[str, Any]:
    return {**JOB, "share_s": 30.0, "air_s": 10.0, **fields}


BAD_WORKLOADS: list[tuple[str, list[dict[str, Any]], str]] = [
    ("share 0", [_w(share_s=0)], "workloads[0].share_s"),
    ("share over seconds", [_w(share_s=61)], "workloads[0].share_s"),
    ("share negative", [_w(share_s=-1)], "workloads[0].share_s"),
    ("air over share", [_w(air_s=31)], "workloads[0].air_s"),
    ("air negative", [_w(air_s=-0.5)], "workloads[0].air_s"),
    ("shares over seconds", [_w(), _w(id="2", share_s=30.6)], "workloads"),
    ("unknown kind", [_w(kind="vm")], "workloads[0].kind"),
    ("empty id", [_w(id="")], "workloads[0].id"),
    ("id of 201 characters", [_w(id="9" * 201)], "workloads[0].id"),
    ("control character in id", [_w(id="48\x0713")], "workloads[0].id"),
    ("id with surrounding space", [_w(id=" 48213")], "workloads[0].id"),
    ("newline in user", [_w(user="ali\nce")], "workloads[0].user"),
    ("account of 201 characters", [_w(account="a" * 201)], "workloads[0].account"),
    # Every string (docs/ingest.md): 1–200 characters when sent, no control characters.
    ("empty kind", [_w(kind="")], "workloads[0].kind"),
    ("control character in kind", [_w(kind="slu\x07rm")], "workloads[0].kind"),
    ("kind of 201 characters", [_w(kind="s" * 201)], "workloads[0].kind"),
    ("empty user", [_w(user="")], "workloads[0].user"),
    ("user of 201 characters", [_w(user="u" * 201)], "workloads[0].user"),
    ("empty account", [_w(account="")], "workloads[0].account"),
    ("control character in account", [_w(account="nl\x1bp")], "workloads[0].account"),
    ("empty name", [_w(name="")], "workloads[0].name"),
    ("name of 201 characters", [_w(name="n" * 201)], "workloads[0].name"),
    ("tab in name", [_w(name="train\tllm")], "workloads[0].name"),
    ("the second entry's empty user", [_w(share_s=10), _w(id="2", user="")], "workloads[1].user"),
    ("listed twice", [_w(share_s=10), _w(share_s=10)], "workloads[1].id"),
    ("33 entries", [_w(id=str(i), share_s=1, air_s=0) for i in range(33)], "workloads"),
    ("share as a string", [_w(share_s="30")], "workloads[0].share_s"),
    ("air missing", [{k: v for k, v in _w().items() if k != "air_s"}], "workloads[0].air_s"),
    ("not a list", {"kind": "slurm"}, "workloads"),  # type: ignore[list-item]
]


@pytest.mark.parametrize(
    ("workloads", "field"),
    [(w, f) for _, w, f in BAD_WORKLOADS],
    ids=[n for n, _, _ in BAD_WORKLOADS],
)
def test_every_workload_rule_rejects_the_sample_naming_the_field(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    workloads: Any,
    field: str,
) -> None:
    a = agent()
    good = sample("GPU-b", base)
    bad = sample("GPU-b", base + dt.timedelta(minutes=1), workloads=workloads)
    r = a.post(push([good, bad], [gpu_block("GPU-b")]))
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["accepted"] == 1
    assert [(x["index"], x["field"]) for x in body["rejected"]] == [(1, field)], body
    assert Sample.objects.count() == 1 and not Workload.objects.exists()


def test_user_account_and_name_may_be_left_out_or_null(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    bare = {"kind": "user", "id": "alice", "share_s": 20.0, "air_s": 5.0}
    nulls = {"kind": "slurm", "id": "7", "user": None, "account": None, "name": None}
    ws = [bare, {**nulls, "share_s": 20.0, "air_s": 5.0}]
    r = a.post(push([sample("GPU-o", base, workloads=ws)], [gpu_block("GPU-o")]))
    assert r.json() == {"accepted": 1, "duplicates": 0, "rejected": []}
    names = set(Workload.objects.values_list("key", "user_name", "account", "name"))
    assert names == {("alice", "", "", ""), ("7", "", "", "")}


def test_shares_may_pass_seconds_by_half_a_second(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    ws = [_w(share_s=30.25, air_s=0), _w(id="2", share_s=30.25, air_s=0)]
    r = a.post(push([sample("GPU-h", base, workloads=ws)], [gpu_block("GPU-h")]))
    assert r.json() == {"accepted": 1, "duplicates": 0, "rejected": []}


@PATHS
def test_profiling_means_are_stored(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    one_statement_max: int,
) -> None:
    a = agent()
    fields = {"sm_active": 0.4, "sm_occupancy": 0.25, "tensor_active": 0.125, "dram_active": 0.5}
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        r = a.post(push([sample("GPU-p", base, prof_s=59, **fields)], [gpu_block("GPU-p")]))
    assert r.json()["accepted"] == 1
    s = Sample.objects.get()
    assert (s.sm_active, s.sm_occupancy, s.tensor_active, s.dram_active, s.prof_s) == (
        0.4,
        0.25,
        0.125,
        0.5,
        59.0,
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"sm_occupancy": 1.5}, "sm_occupancy"),
        ({"tensor_active": -0.1}, "tensor_active"),
        ({"dram_active": "0.5"}, "dram_active"),
        ({"prof_s": 0}, "prof_s"),
        ({"prof_s": 61}, "prof_s"),
    ],
)
def test_profiling_fields_out_of_range_are_rejected(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    fields: dict[str, Any],
    field: str,
) -> None:
    a = agent()
    r = a.post(push([sample("GPU-q", base, sm_active=0.5, **fields)], [gpu_block("GPU-q")]))
    assert r.status_code == 400
    assert r.json()["rejected"][0]["field"] == field
    assert not Sample.objects.exists()
