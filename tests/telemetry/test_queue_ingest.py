"""POST /api/v1/queue (DESIGN.md §9.2, docs/ingest.md "Queue"): every field checked and named
in the 4xx with nothing stored, the 10,000-entry cap, a cluster pushed by one node only,
duplicate snapshots changing nothing, and two pushes at once counting each interval once.

Times of pushes through the API are relative to the real clock (the server checks ``at``
against it); nothing depends on how long a test takes.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from fleet.services import node_token_issue, token_revoke
from fleet.tokens import token_prefix
from telemetry.models import PendingStretch, QueueCluster, QueueWaitHourly
from telemetry.queue import queue_snapshot_apply
from telemetry.queue_wire import MAX_PENDING, PendingJob, Snapshot

URL = "/api/v1/queue"


def iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def base() -> dt.datetime:
    """The start of the hour three hours ago: safely in the past, within retention."""
    now = timezone.now().astimezone(dt.UTC)
    return now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=3)


def job(job_id: str = "4711", **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "kind": "slurm",
        "id": job_id,
        "user": "alice",
        "account": "nlp",
        "partition": "h100",
        "gpus": 8,
        "gpu_model": "h100",
        "reason": "Resources",
        "class": "capacity",
        "submitted": "2026-11-30T08:00:00Z",
        "eligible": "2026-11-30T08:00:00Z",
    }
    entry.update(fields)
    return entry


def snapshot(at: dt.datetime, pending: list[dict[str, Any]], cluster: str = "hpc") -> bytes:
    return json.dumps({"cluster": cluster, "at": iso(at), "pending": pending}).encode()


@pytest.fixture
def agent(db: Any, client: Any) -> Callable[..., Any]:
    """``agent(hostname)`` → an object that posts snapshots with that node's token."""

    class Agent:
        def __init__(self, hostname: str) -> None:
            self.node, self.token = node_token_issue(hostname=hostname)

        def post(self, body: bytes) -> Any:
            return client.post(
                URL,
                data=body,
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {self.token}",
            )

    return Agent


def stored() -> tuple[int, int, int]:
    return (
        QueueCluster.objects.count(),
        PendingStretch.objects.count(),
        QueueWaitHourly.objects.count(),
    )


def state() -> tuple[list[Any], list[Any], list[Any]]:
    """Every queue row, to compare before and after a push that must change nothing."""
    return (
        list(QueueCluster.objects.order_by("pk").values()),
        list(PendingStretch.objects.order_by("pk").values()),
        list(QueueWaitHourly.objects.order_by("pk").values()),
    )


# --- the happy path ---------------------------------------------------------------------------
def test_snapshot_opens_stretches_and_answers_what_it_did(agent: Any, base: Any) -> None:
    a = agent("login-1")
    r = a.post(snapshot(base, [job("1"), job("2", gpus=2, **{"class": "user"}, user=None)]))
    assert r.status_code == 200, r.content
    assert r.json() == {
        "cluster": "hpc",
        "at": iso(base),
        "status": "applied",
        "pending": 2,
        "opened": 2,
        "closed": 0,
        "counted_s": 0.0,
    }
    cluster = QueueCluster.objects.get()
    assert (cluster.name, cluster.node_id, cluster.last_at) == ("hpc", a.node.pk, base)
    one = PendingStretch.objects.get(job_id="1")
    assert (one.kind, one.user_name, one.account, one.partition, one.gpus, one.gpu_model) == (
        "slurm",
        "alice",
        "nlp",
        "h100",
        8,
        "h100",
    )
    assert (one.reason_class, one.reason, one.first_seen_at, one.wait_started_at) == (
        "capacity",
        "Resources",
        base,
        base,
    )
    assert one.submitted_at == dt.datetime(2026, 11, 30, 8, tzinfo=dt.UTC)
    assert (one.ended_at, one.last_seen_at, one.split) == (None, None, False)
    two = PendingStretch.objects.get(job_id="2")
    assert (two.user_name, two.reason_class, two.gpus) == ("", "user", 2)

    # A minute later job 1 is gone: its stretch ends, 8 + 2 GPUs waited 60 s in the hour.
    r = a.post(snapshot(base + dt.timedelta(minutes=1), [job("2", gpus=2, **{"class": "user"})]))
    assert r.status_code == 200, r.content
    # user None → "alice" is a change of the job's names: its stretch is split.
    assert (r.json()["opened"], r.json()["closed"], r.json()["counted_s"]) == (1, 2, 60.0)
    waited = {
        (w.partition, w.user_name, w.reason_class): w.gpu_seconds
        for w in QueueWaitHourly.objects.all()
    }
    assert waited == {("h100", "alice", "capacity"): 480.0, ("h100", "", "user"): 120.0}
    gone = PendingStretch.objects.get(job_id="1")
    assert (gone.ended_at, gone.last_seen_at, gone.split) == (
        base + dt.timedelta(minutes=1),
        base,
        False,
    )


# --- bad input --------------------------------------------------------------------------------
def _with(**fields: Any) -> Callable[[dt.datetime], bytes]:
    return lambda base: snapshot(base, [job(**fields)])


BAD_INPUT: list[tuple[str, Callable[[dt.datetime], bytes], int, str]] = [
    ("empty body", lambda b: b"", 400, "body"),
    ("malformed JSON", lambda b: b'{"cluster": ', 400, "body"),
    ("not an object", lambda b: b"[1, 2]", 400, "body"),
    ("NUL in a string", lambda b: snapshot(b, [job(user="a\u0000b")]), 400, "body"),
    (
        "cluster missing",
        lambda b: json.dumps({"at": iso(b), "pending": []}).encode(),
        400,
        "cluster",
    ),
    ("cluster empty", lambda b: snapshot(b, [], cluster=""), 400, "cluster"),
    ("cluster with /", lambda b: snapshot(b, [], cluster="a/b"), 400, "cluster"),
    ("cluster too long", lambda b: snapshot(b, [], cluster="c" * 101), 400, "cluster"),
    (
        "cluster a number",
        lambda b: json.dumps({"cluster": 7, "at": iso(b), "pending": []}).encode(),
        400,
        "cluster",
    ),
    ("at missing", lambda b: json.dumps({"cluster": "hpc", "pending": []}).encode(), 400, "at"),
    (
        "at naive",
        lambda b: json.dumps(
            {"cluster": "hpc", "at": b.strftime("%Y-%m-%dT%H:%M:%S"), "pending": []}
        ).encode(),
        400,
        "at",
    ),
    (
        "at not a time",
        lambda b: json.dumps({"cluster": "hpc", "at": "yesterday", "pending": []}).encode(),
        400,
        "at",
    ),
    # b is three hours before the current hour: + 5 h is at least an hour ahead of the clock
    ("at ahead", lambda b: snapshot(b + dt.timedelta(hours=5), []), 400, "at"),
    ("at too old", lambda b: snapshot(b - dt.timedelta(days=40), []), 400, "at"),
    (
        "at in year 1",
        lambda b: json.dumps(
            {"cluster": "hpc", "at": "0001-01-01T00:00:00+01:00", "pending": []}
        ).encode(),
        400,
        "at",
    ),
    (
        "at in year 9999",
        lambda b: json.dumps(
            {"cluster": "hpc", "at": "9999-12-31T23:59:59-01:00", "pending": []}
        ).encode(),
        400,
        "at",
    ),
    (
        "submitted in year 1",
        _with(submitted="0001-01-01T00:00:00+01:00"),
        400,
        "pending[0].submitted",
    ),
    (
        "pending missing",
        lambda b: json.dumps({"cluster": "hpc", "at": iso(b)}).encode(),
        400,
        "pending",
    ),
    (
        "pending not a list",
        lambda b: json.dumps({"cluster": "hpc", "at": iso(b), "pending": {}}).encode(),
        400,
        "pending",
    ),
    (
        "entry not an object",
        lambda b: json.dumps({"cluster": "hpc", "at": iso(b), "pending": [3]}).encode(),
        400,
        "pending[0]",
    ),
    (
        "kind missing",
        lambda b: snapshot(b, [{k: v for k, v in job().items() if k != "kind"}]),
        400,
        "pending[0].kind",
    ),
    ("kind unknown", _with(kind="pbs"), 400, "pending[0].kind"),
    (
        "id missing",
        lambda b: snapshot(b, [{k: v for k, v in job().items() if k != "id"}]),
        400,
        "pending[0].id",
    ),
    ("id empty", _with(job_id=""), 400, "pending[0].id"),
    ("id with spaces around", _with(job_id=" 12"), 400, "pending[0].id"),
    ("id a number", _with(job_id=12), 400, "pending[0].id"),
    ("gpus zero", _with(gpus=0), 400, "pending[0].gpus"),
    ("gpus negative", _with(gpus=-2), 400, "pending[0].gpus"),
    ("gpus fractional", _with(gpus=1.5), 400, "pending[0].gpus"),
    ("gpus a string", _with(gpus="2"), 400, "pending[0].gpus"),
    ("gpus a boolean", _with(gpus=True), 400, "pending[0].gpus"),
    ("gpus null", _with(gpus=None), 400, "pending[0].gpus"),
    ("gpus too many", _with(gpus=100_001), 400, "pending[0].gpus"),
    ("class unknown", _with(**{"class": "other"}), 400, "pending[0].class"),
    (
        "class missing",
        lambda b: snapshot(b, [{k: v for k, v in job().items() if k != "class"}]),
        400,
        "pending[0].class",
    ),
    (
        "reason missing",
        lambda b: snapshot(b, [{k: v for k, v in job().items() if k != "reason"}]),
        400,
        "pending[0].reason",
    ),
    ("reason empty", _with(reason=""), 400, "pending[0].reason"),
    ("user control character", _with(user="al\u0007ice"), 400, "pending[0].user"),
    ("account too long", _with(account="a" * 201), 400, "pending[0].account"),
    ("partition with a newline", _with(partition="h1\n00"), 400, "pending[0].partition"),
    ("gpu_model too long", _with(gpu_model="m" * 101), 400, "pending[0].gpu_model"),
    ("submitted naive", _with(submitted="2026-11-30T08:00:00"), 400, "pending[0].submitted"),
    (
        "submitted after at",
        lambda b: snapshot(b, [job(submitted=iso(b + dt.timedelta(hours=1)))]),
        400,
        "pending[0].submitted",
    ),
    ("submitted before 2000", _with(submitted="1999-12-31T00:00:00Z"), 400, "pending[0].submitted"),
    ("eligible not a time", _with(eligible="soon"), 400, "pending[0].eligible"),
    ("eligible after 2100", _with(eligible="2101-01-01T00:00:00Z"), 400, "pending[0].eligible"),
    ("a job twice", lambda b: snapshot(b, [job("9"), job("9", gpus=1)]), 400, "pending[1].id"),
    (
        "a bad entry after good ones",
        lambda b: snapshot(b, [job("1"), job("2"), job("3", gpus=0)]),
        400,
        "pending[2].gpus",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [pytest.param(b, s, f, id=name) for name, b, s, f in BAD_INPUT],
)
def test_bad_input_is_refused_naming_the_field_and_stores_nothing(
    agent: Any, base: Any, body: Callable[[dt.datetime], bytes], status: int, field: str
) -> None:
    r = agent("login-1").post(body(base))
    assert r.status_code == status, r.content
    answer = r.json()
    assert answer["field"] == field, answer
    assert answer["error"] and answer["detail"].startswith(f"{field}: ")
    assert stored() == (0, 0, 0)


def test_a_bad_push_after_good_ones_changes_nothing(agent: Any, base: Any) -> None:
    a = agent("login-1")
    assert a.post(snapshot(base, [job("1")])).status_code == 200
    before = state()
    r = a.post(snapshot(base + dt.timedelta(minutes=1), [job("1"), job("2", gpus=0)]))
    assert (r.status_code, r.json()["field"]) == (400, "pending[1].gpus")
    assert state() == before


def test_unknown_keys_are_ignored_and_null_or_empty_names_are_unknown(
    agent: Any, base: Any
) -> None:
    entry = job(
        "1",
        user=None,
        account=None,
        partition=None,
        gpu_model=None,
        submitted=None,
        eligible=None,
        extra="ignored",
    )
    # What squeue gives for a job without an account: "" (as the Slurm agent sends it).
    empty = job("2", user="", account="", partition="", gpu_model="")
    body = json.loads(snapshot(base, [entry, empty]))
    body["agent"] = {"version": "1.2.0"}
    r = agent("login-1").post(json.dumps(body).encode())
    assert r.status_code == 200, r.content
    for s in PendingStretch.objects.all():
        assert (s.user_name, s.account, s.partition, s.gpu_model) == ("", "", "", "")
    s = PendingStretch.objects.get(job_id="1")
    assert (s.submitted_at, s.eligible_at) == (None, None)


def test_token_needed_and_revoked_token_refused(agent: Any, client: Any, base: Any) -> None:
    r = client.post(URL, data=snapshot(base, []), content_type="application/json")
    assert r.status_code == 401
    a = agent("login-1")
    token_revoke(prefix=token_prefix(a.token) or "")
    r = a.post(snapshot(base, [job()]))
    assert r.status_code == 401
    assert stored() == (0, 0, 0)


# --- the cap ----------------------------------------------------------------------------------
def test_ten_thousand_entries_pass_and_one_more_is_413(agent: Any, base: Any) -> None:
    a = agent("login-1")
    good = [job(str(i), gpus=1) for i in range(MAX_PENDING)]
    r = a.post(snapshot(base, [*good, job("x", gpus=1)]))
    assert (r.status_code, r.json()["field"]) == (413, "pending")
    # Too many is answered before a bad entry is looked for.
    r = a.post(snapshot(base, [*good, job("x", gpus=0)]))
    assert (r.status_code, r.json()["field"]) == (413, "pending")
    assert stored() == (0, 0, 0)
    r = a.post(snapshot(base, [*good[:-1], good[0]]))
    assert (r.status_code, r.json()["field"]) == (400, f"pending[{MAX_PENDING - 1}].id")
    r = a.post(snapshot(base, good))
    assert r.status_code == 200, r.content
    assert PendingStretch.objects.count() == MAX_PENDING


# --- who may push a cluster -------------------------------------------------------------------
def test_a_cluster_belongs_to_the_first_node_that_pushes_it(agent: Any, base: Any) -> None:
    a, b = agent("login-1"), agent("login-2")
    assert a.post(snapshot(base, [job("1")])).status_code == 200
    before = state()
    r = b.post(snapshot(base + dt.timedelta(minutes=1), [job("2")]))
    assert r.status_code == 403, r.content
    assert r.json()["field"] == "cluster"
    assert state() == before
    # Another cluster is b's to take.
    assert b.post(snapshot(base, [job("2")], cluster="k8s-prod")).status_code == 200
    assert QueueCluster.objects.get(name="k8s-prod").node_id == b.node.pk


def test_a_cluster_from_the_fleet_file_is_adopted_by_its_first_pusher(
    agent: Any, base: Any
) -> None:
    QueueCluster.objects.create(name="hpc", created_at=base)  # as [[partitions]] creates it
    a, b = agent("login-1"), agent("login-2")
    assert a.post(snapshot(base, [job("1")])).status_code == 200
    assert QueueCluster.objects.get().node_id == a.node.pk
    assert b.post(snapshot(base + dt.timedelta(minutes=1), [])).status_code == 403


# --- duplicates -------------------------------------------------------------------------------
def test_duplicate_and_older_snapshots_change_nothing(agent: Any, base: Any) -> None:
    a = agent("login-1")
    first = snapshot(base, [job("1"), job("2", gpus=1)])
    second = snapshot(base + dt.timedelta(minutes=1), [job("1")])
    for body in (first, second):
        assert a.post(body).json()["status"] == "applied"
    before = state()
    r = a.post(second)
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["opened"], r.json()["closed"]) == ("duplicate", 0, 0)
    r = a.post(first)
    assert (r.status_code, r.json()["status"]) == (200, "stale")
    assert state() == before
    # 8 + 1 GPUs waited 60 s (one group, one hour): counted once however often it came.
    assert QueueWaitHourly.objects.get().gpu_seconds == 540.0


# --- two pushes at once -----------------------------------------------------------------------
def _apply_together(
    node_id: int, snapshots: list[Snapshot], now: dt.datetime, monkeypatch: Any
) -> list[str]:
    """Apply each snapshot in its own thread, released together; → their statuses.

    Each thread, once it has read the cluster's latest snapshot time, waits for the other to
    have read it too. Under the cluster's row lock the other cannot get there (it waits for
    the lock), so the wait gives up and the first goes on: that only slows the test. Without
    the lock both read the same time and both count the interval, which the test sees."""
    from django.db import connections

    import telemetry.queue

    barrier = threading.Barrier(len(snapshots))
    real = telemetry.queue.counted_seconds

    def counted_after_both_read(previous: Any, at: Any) -> float:
        try:
            barrier.wait(timeout=2)
        except threading.BrokenBarrierError:
            pass
        return real(previous, at)

    monkeypatch.setattr(telemetry.queue, "counted_seconds", counted_after_both_read)
    start = threading.Barrier(len(snapshots))
    statuses: list[str] = []
    errors: list[BaseException] = []

    def run(s: Snapshot) -> None:
        try:
            start.wait()
            statuses.append(queue_snapshot_apply(node_id=node_id, snapshot=s, now=now).status)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(s,)) for s in snapshots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return sorted(statuses)


def _jobs(n: int, gpus: int = 2) -> list[PendingJob]:
    return [
        PendingJob(
            kind="slurm",
            job_id=str(i),
            user="alice",
            account="nlp",
            partition="h100",
            gpus=gpus,
            gpu_model="",
            reason_class="capacity",
            reason="Priority",
            submitted=None,
            eligible=None,
        )
        for i in range(n)
    ]


@pytest.mark.django_db(transaction=True)
def test_the_same_snapshot_twice_at_once_counts_once(monkeypatch: Any, postgres: Any) -> None:
    from fleet.models import Node

    node = Node.objects.create(hostname="login-1")
    t0 = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)
    queue_snapshot_apply(node_id=node.pk, snapshot=Snapshot("hpc", t0, _jobs(50)), now=t0)
    again = Snapshot("hpc", t0 + dt.timedelta(seconds=60), _jobs(50))
    statuses = _apply_together(node.pk, [again, again], t0, monkeypatch)
    assert statuses == ["applied", "duplicate"]
    # 50 jobs × 2 GPUs × 60 s, once.
    assert sum(QueueWaitHourly.objects.values_list("gpu_seconds", flat=True)) == 6000.0
    assert PendingStretch.objects.count() == 50


@pytest.mark.django_db(transaction=True)
def test_two_snapshots_at_once_give_what_one_after_the_other_gives(
    monkeypatch: Any, postgres: Any
) -> None:
    from fleet.models import Node

    node = Node.objects.create(hostname="login-1")
    t0 = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)
    queue_snapshot_apply(node_id=node.pk, snapshot=Snapshot("hpc", t0, _jobs(50)), now=t0)
    s1 = Snapshot("hpc", t0 + dt.timedelta(seconds=60), _jobs(50))
    s2 = Snapshot("hpc", t0 + dt.timedelta(seconds=120), _jobs(40))
    statuses = _apply_together(node.pk, [s1, s2], t0, monkeypatch)
    # Whichever came first, the jobs waited 120 s (60 + 60, or one interval of 120 s when
    # the later snapshot came first and the earlier one was then stale).
    assert statuses in (["applied", "applied"], ["applied", "stale"])
    assert sum(QueueWaitHourly.objects.values_list("gpu_seconds", flat=True)) == 50 * 2 * 120.0
    assert PendingStretch.objects.filter(ended_at__isnull=True).count() == 40
    ended = set(PendingStretch.objects.filter(ended_at__isnull=False).values_list("ended_at"))
    assert ended == {(t0 + dt.timedelta(seconds=120),)}
