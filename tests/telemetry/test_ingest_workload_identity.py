"""Whose names count for a workload, and what a push may register (docs/ingest.md, "Whose
names count" and "New workloads per hour"): issue 47, items 8 and 9.

- A workload's user, account and name come from the node that first reported it; another
  node's different names are kept beside them as claims, never over them, and shown.
- Only samples that are stored register or rename workloads: a resent sample changes nothing.
- A node registers at most ``INGEST_MAX_NEW_WORKLOADS_PER_HOUR`` new workloads per UTC hour;
  past it the whole push is answered 429 naming ``workloads`` and nothing of it is stored.

Every behaviour is checked on both ways PostgreSQL registers workloads (one statement, and the
generic path SQLite takes), and on both ways it stores samples (one statement, COPY).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from fleet.models import Node, Site
from telemetry import ingest_store
from telemetry.agent import client as client_module
from telemetry.agent.spool import Spool
from telemetry.ingest import IngestError, sample_batch_ingest
from telemetry.models import Sample, Workload, WorkloadClaim, WorkloadRegistrations
from tests.telemetry.test_ingest import agent, base, gpu_block, push, sample  # noqa: F401

JOB = {"kind": "slurm", "id": "48213", "user": "alice", "account": "nlp", "name": "train-llm"}


@pytest.fixture(params=["one-statement", "generic"])
def register_path(request: Any) -> Iterator[str]:
    """Both ways workloads are registered (on SQLite both are the generic one)."""
    with mock.patch.object(
        ingest_store, "WORKLOADS_ONE_STATEMENT", request.param == "one-statement"
    ):
        yield request.param


STORE_PATHS = pytest.mark.parametrize(
    "one_statement_max", [64, 0], ids=["store-one-statement", "store-copy"]
)


def held(*workloads: dict[str, Any], share_s: float = 30.0) -> list[dict[str, Any]]:
    return [{**w, "share_s": share_s / len(workloads), "air_s": 0.0} for w in workloads]


def jobs(first: int, count: int) -> list[dict[str, Any]]:
    """``count`` distinct Slurm jobs of alice, ids from ``first``."""
    return [{**JOB, "id": str(i)} for i in range(first, first + count)]


def names(key: str = "48213") -> tuple[str, str, str]:
    w = Workload.objects.get(key=key)
    return (w.user_name, w.account, w.name)


def claims() -> set[tuple[str, str, str]]:
    return set(WorkloadClaim.objects.values_list("node__hostname", "field", "value"))


def two_nodes(agent: Any) -> tuple[Any, Any]:  # noqa: F811
    """Two nodes of one site: a job id means the same workload on both."""
    site = Site.objects.create(name="fra1")
    a, b = agent("node-a"), agent("node-b")
    Node.objects.filter(pk__in=[a.node.pk, b.node.pk]).update(site=site)
    return a, b


def post_ok(node: Any, samples: list[dict[str, Any]], *gpus: str) -> dict[str, Any]:
    r = node.post(push(samples, [gpu_block(g) for g in gpus]))
    assert r.status_code == 200, r.content
    body: dict[str, Any] = r.json()
    return body


# --- 47.8: one node cannot rename another's workload -----------------------------------------
@pytest.mark.smoke
def test_another_nodes_names_are_claims_beside_the_identity(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    register_path: str,
) -> None:
    a, b = two_nodes(agent)
    post_ok(a, [sample("GPU-a", base, workloads=held(JOB))], "GPU-a")
    job = Workload.objects.get(key="48213")
    assert job.identity_node_id == a.node.pk

    # Node B says the job is mallory's, charged to "finance"; its name agrees with A's.
    hostile = {**JOB, "user": "mallory", "account": "finance"}
    body = post_ok(b, [sample("GPU-b", base, workloads=held(hostile))], "GPU-b")
    assert body == {"accepted": 1, "duplicates": 0, "rejected": []}  # its sample counts
    assert names() == ("alice", "nlp", "train-llm")
    assert claims() == {("node-b", "user", "mallory"), ("node-b", "account", "finance")}
    # Its sample's share is still the job's: only the names are refused.
    stored = Sample.objects.get(gpu__uuid="GPU-b")
    assert stored.workload_ids == [job.pk]

    # A name B sends where A sent none is a claim too: the owner has not said it.
    post_ok(a, [sample("GPU-a", base + dt.timedelta(minutes=1), workloads=held(POD))])
    post_ok(b, [sample("GPU-b", base + dt.timedelta(minutes=1), workloads=held(POD_NAMED))])
    assert names("chat/web-1") == ("", "chat", "")
    assert ("node-b", "user", "mallory") in claims()
    assert ("node-b", "name", "phish") in claims()

    # The node that owns the identity still renames it.
    renamed = {**JOB, "name": "train-llm-v2"}
    post_ok(a, [sample("GPU-a", base + dt.timedelta(minutes=2), workloads=held(renamed))])
    assert names() == ("alice", "nlp", "train-llm-v2")
    assert WorkloadClaim.objects.count() == 4


POD = {"kind": "k8s", "id": "chat/web-1", "account": "chat"}
POD_NAMED = {**POD, "user": "mallory", "name": "phish"}


def test_a_claim_is_kept_once_with_first_and_last_seen(
    db: Any,
    base: Any,  # noqa: F811
    register_path: str,
) -> None:
    """Called as the API calls it, with the server's clock as ``now``: the claim's last seen
    moves in steps of five minutes (CLAIM_SEEN_RESOLUTION), its first seen never."""
    site = Site.objects.create(name="fra1")
    a = Node.objects.create(hostname="node-a", site=site)
    b = Node.objects.create(hostname="node-b", site=site)
    t = timezone.now().replace(microsecond=0)

    def send(node: Node, minute: int, workload: dict[str, Any], now: dt.datetime) -> None:
        gpu = f"GPU-{node.hostname}"
        s = sample(gpu, base + dt.timedelta(minutes=minute), workloads=held(workload))
        body = push([s], [gpu_block(gpu)])
        assert sample_batch_ingest(node_id=node.pk, payload_bytes=body, now=now).accepted == 1

    send(a, 0, JOB, t)
    hostile = {**JOB, "user": "mallory"}
    send(b, 0, hostile, t)
    send(b, 1, hostile, t + dt.timedelta(minutes=4))  # within the resolution: untouched
    claim = WorkloadClaim.objects.get()
    assert (claim.node_id, claim.field, claim.value) == (b.pk, "user", "mallory")
    assert (claim.first_seen_at, claim.last_seen_at) == (t, t)
    send(b, 2, hostile, t + dt.timedelta(minutes=6))
    claim.refresh_from_db()
    assert (claim.first_seen_at, claim.last_seen_at) == (t, t + dt.timedelta(minutes=6))
    assert names() == ("alice", "nlp", "train-llm")


def test_a_workload_without_an_owner_is_adopted_by_the_next_node(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    register_path: str,
) -> None:
    """A workload registered before identities had owners (and not rolled up since, so the
    migration found no node for it) takes the names of the next node to report it."""
    a, b = two_nodes(agent)
    post_ok(a, [sample("GPU-a", base, workloads=held(JOB))], "GPU-a")
    Workload.objects.update(identity_node=None)
    post_ok(b, [sample("GPU-b", base, workloads=held({**JOB, "user": "bob"}))], "GPU-b")
    job = Workload.objects.get()
    assert (job.identity_node_id, job.user_name) == (b.node.pk, "bob")
    assert not WorkloadClaim.objects.exists()


def test_the_workload_page_shows_the_conflicting_claims(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    role_client: Any,
) -> None:
    a, b = two_nodes(agent)
    post_ok(a, [sample("GPU-a", base, workloads=held(JOB))], "GPU-a")
    job = Workload.objects.get()
    page = role_client("viewer").get(f"/workloads/{job.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="conflicting-claims-count">0<' in html and 'id="claims-table"' not in html

    post_ok(b, [sample("GPU-b", base, workloads=held({**JOB, "user": "mallory"}))], "GPU-b")
    html = role_client("viewer").get(f"/workloads/{job.pk}/").content.decode()
    assert '<a href="#conflicting-claims">1</a>' in html
    table = html[html.index('id="claims-table"') :]
    assert ">node-b<" in table and ">user<" in table and ">mallory<" in table
    facts = html[: html.index('id="claims-table"')]
    assert "<dd>alice</dd>" in facts and "node-a" in facts  # the identity and where it is from


# --- 47.9: duplicates change nothing; new workloads per hour are capped ----------------------
@STORE_PATHS
@pytest.mark.smoke
def test_a_resent_sample_registers_and_renames_nothing(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    register_path: str,
    one_statement_max: int,
) -> None:
    a = agent()
    first = sample("GPU-d", base, workloads=held(JOB))
    post_ok(a, [first], "GPU-d")
    rows = (Workload.objects.count(), WorkloadClaim.objects.count(), Sample.objects.count())
    assert rows == (1, 0, 1)

    # The same (gpu, start) again: the job renamed, and 31 workloads never seen before.
    again = sample(
        "GPU-d",
        base,
        workloads=held({**JOB, "user": "mallory", "name": "renamed"}, *jobs(1000, 31)),
    )
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        body = post_ok(a, [again])
    assert body == {"accepted": 0, "duplicates": 1, "rejected": []}
    after = (Workload.objects.count(), WorkloadClaim.objects.count(), Sample.objects.count())
    assert after == rows
    assert names() == ("alice", "nlp", "train-llm")
    assert Sample.objects.get().workload_ids == [Workload.objects.get().pk]


@pytest.mark.smoke
def test_a_key_repeated_in_one_push_registers_only_the_stored_samples_workloads(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    register_path: str,
) -> None:
    """Within one push the first sample of a (gpu, start) is stored; a repeat is a duplicate
    and names nothing."""
    a = agent()
    stored = sample("GPU-k", base, workloads=held(JOB))
    repeat = sample("GPU-k", base, workloads=held(*jobs(2000, 5)))
    body = post_ok(a, [stored, repeat], "GPU-k")
    assert body == {"accepted": 1, "duplicates": 1, "rejected": []}
    assert list(Workload.objects.values_list("key", flat=True)) == ["48213"]


@override_settings(INGEST_MAX_NEW_WORKLOADS_PER_HOUR=40)
@STORE_PATHS
@pytest.mark.smoke
def test_new_workloads_past_the_hourly_cap_answer_429_and_store_nothing(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    register_path: str,
    one_statement_max: int,
) -> None:
    a, other = agent(), agent()
    at = [base + dt.timedelta(minutes=m) for m in range(10)]
    # 32 new workloads, then 8 more: 40, the cap, exactly.
    post_ok(a, [sample("GPU-c", at[0], workloads=held(*jobs(0, 32)))], "GPU-c")
    post_ok(a, [sample("GPU-c", at[1], workloads=held(*jobs(100, 8)))])
    assert Workload.objects.count() == 40

    # One more new one (with one known): the whole push is refused, the agent resends later.
    before = (Workload.objects.count(), Sample.objects.count())
    late = [
        sample("GPU-c", at[2]),
        sample("GPU-c", at[3], workloads=held(*jobs(0, 1), *jobs(200, 1))),
    ]
    sent = timezone.now()
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        r = a.post(push(late))
    answered = timezone.now()
    assert r.status_code == 429, r.content
    assert r.json()["field"] == "workloads"
    assert "INGEST_MAX_NEW_WORKLOADS_PER_HOUR (40)" in r.json()["error"]
    # Retry-After: the whole seconds to the next UTC hour, as the server's clock saw them.
    next_hour = (sent + dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    left_s = ((next_hour - answered).total_seconds(), (next_hour - sent).total_seconds())
    assert left_s[0] - 1 <= int(r["Retry-After"]) <= left_s[1] + 1
    assert (Workload.objects.count(), Sample.objects.count()) == before

    # Known workloads still come in, and the cap is per node.
    post_ok(a, [sample("GPU-c", at[4], workloads=held(*jobs(0, 32)))])
    post_ok(other, [sample("GPU-o", at[0], workloads=held(*jobs(300, 32)))], "GPU-o")
    assert Workload.objects.count() == 72


@override_settings(INGEST_MAX_NEW_WORKLOADS_PER_HOUR=40)
def test_a_push_with_more_new_workloads_than_the_cap_is_413_so_the_agent_halves_it(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    register_path: str,
) -> None:
    a = agent()
    two = [
        sample("GPU-h", base, workloads=held(*jobs(0, 32))),
        sample("GPU-h", base + dt.timedelta(minutes=1), workloads=held(*jobs(100, 32))),
    ]
    r = a.post(push(two, [gpu_block("GPU-h")]))
    assert r.status_code == 413 and r.json()["field"] == "workloads", r.content
    assert not Workload.objects.exists() and not Sample.objects.exists()
    post_ok(a, two[:1])  # half of it fits
    assert Workload.objects.count() == 32


def test_the_cap_counts_per_utc_hour_and_only_capped_pushes(
    db: Any,
    base: Any,  # noqa: F811
    register_path: str,
) -> None:
    node = Node.objects.create(hostname="node-h")
    hour = timezone.now().replace(minute=30, second=0, microsecond=0)

    def send(minute: int, first_job: int, now: dt.datetime, cap: int | None = 40) -> Any:
        s = sample(
            "GPU-q", base + dt.timedelta(minutes=minute), workloads=held(*jobs(first_job, 30))
        )
        body = push([s], [gpu_block("GPU-q")])
        return sample_batch_ingest(
            node_id=node.pk, payload_bytes=body, now=now, max_new_workloads_per_hour=cap
        )

    # The demo's history and other callers without a cap neither stop at it nor count.
    assert send(0, 0, hour, cap=None).accepted == 1
    assert send(1, 100, hour, cap=None).accepted == 1
    assert not WorkloadRegistrations.objects.exists()
    assert send(2, 200, hour).accepted == 1  # 30 of 40
    with pytest.raises(IngestError) as refused:
        send(3, 300, hour)  # 60 > 40
    assert (refused.value.status, refused.value.field) == (429, "workloads")
    assert refused.value.retry_after_s == 30 * 60
    # The next UTC hour starts a new count, and the past hour's row is dropped.
    assert send(3, 300, hour + dt.timedelta(minutes=31)).accepted == 1
    counts = list(WorkloadRegistrations.objects.values_list("hour", "registered"))
    assert counts == [(hour.replace(minute=0) + dt.timedelta(hours=1), 30)]
    assert Workload.objects.count() == 120


@override_settings(INGEST_MAX_NEW_WORKLOADS_PER_HOUR=40)
def test_the_agent_keeps_a_batch_refused_for_the_cap_and_delivers_it_after_the_hour(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    client: Any,
    tmp_path: Any,
) -> None:
    """The real delivery code against the server: a 429 naming ``workloads`` leaves the
    batch in the spool (no sample lost), and the next hour's try stores it."""
    a = agent()
    post_ok(a, [sample("GPU-s", base, workloads=held(*jobs(0, 32)))], "GPU-s")
    post_ok(a, [sample("GPU-s", base + dt.timedelta(minutes=1), workloads=held(*jobs(100, 8)))])

    def post(url: str, token: str, body: bytes, timeout: float) -> client_module.Response:
        r = client.post(url, data=body, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
        after = r.headers.get("Retry-After")
        return client_module.Response(r.status_code, r.content, float(after) if after else None)

    spool = Spool(str(tmp_path / "spool.db"))
    spool.add([sample("GPU-s", base + dt.timedelta(minutes=2), workloads=held(*jobs(200, 1)))])
    delivery = client_module.Delivery(
        spool,
        url="/api/v1/ingest",
        token=a.token,
        node=lambda: {"hostname": "gpu-s"},
        gpus=lambda: [gpu_block("GPU-s")],
        post=post,
    )
    assert delivery.step(0.0) == "retry"
    assert spool.pending() == 1 and delivery.stats.statuses == {429: 1}
    assert delivery.next_attempt >= 1.0  # it waits: at least the 1 s backoff, at most 300 s
    with time_machine.travel(timezone.now() + dt.timedelta(hours=1), tick=False):
        assert delivery.step(delivery.next_attempt) == "sent"
    assert spool.pending() == 0
    assert Workload.objects.filter(key="200").exists() and Sample.objects.count() == 3


# --- the admin gives a workload's names to the node that runs it --------------------------------
def test_the_admin_moves_a_workloads_names_to_the_claiming_node(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    make_user: Any,
    client: Any,
) -> None:
    a, b = two_nodes(agent)
    post_ok(a, [sample("GPU-a", base, workloads=held({**JOB, "user": "early"}))], "GPU-a")
    post_ok(b, [sample("GPU-b", base, workloads=held(JOB))], "GPU-b")
    job = Workload.objects.get(key="48213")
    assert names() == ("early", "nlp", "train-llm")  # node A reported first
    client.force_login(make_user("admin"))
    url = f"/admin/telemetry/workload/{job.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and b"alice" in page.content  # B's claim is listed

    # Only the owner can be changed: a name posted with it is ignored.
    r = client.post(url, {"identity_node": b.node.pk, "user_name": "typed", **_NO_INLINES})
    assert r.status_code == 302, r.content
    job.refresh_from_db()
    assert job.identity_node_id == b.node.pk and job.user_name == "early"
    post_ok(b, [sample("GPU-b", base + dt.timedelta(minutes=1), workloads=held(JOB))])
    assert names() == ("alice", "nlp", "train-llm")  # the new owner's report sets them
    assert client.post(f"/admin/telemetry/workload/{job.pk}/delete/").status_code == 403


# The claims inline's management form, which a change form posts.
_NO_INLINES = {
    "claims-TOTAL_FORMS": "0",
    "claims-INITIAL_FORMS": "0",
    "claims-MIN_NUM_FORMS": "0",
    "claims-MAX_NUM_FORMS": "1000",
}
