"""Queue pressure, the agent's side (DESIGN.md §9.2): parsing both ``squeue --json`` shapes,
slurmrestd and Kubernetes' pod lists (recorded answers in queue_fixtures/, each number below
worked out by hand from them), and the push through the spool. The same against a real Slurm
is tests/slurm/."""

from __future__ import annotations

import json
import random
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from telemetry.agent import cli
from telemetry.agent.client import Response
from telemetry.agent.clock import VirtualClock
from telemetry.agent.queue import (
    KIND,
    MAX_ENTRIES,
    SPOOL_FILE,
    QueueAgent,
    QueueDelivery,
    queue_url,
    snapshot,
)
from telemetry.agent.queue_k8s import KubeSource, pod_list_entries, quantity
from telemetry.agent.queue_slurm import (
    QueueError,
    SlurmrestdSource,
    SqueueSource,
    array_tasks,
    gpu_request,
    number,
    reason_class,
    squeue_entries,
    states,
    timestamp,
)
from telemetry.agent.spool import Spool

FIXTURES = Path(__file__).parent / "queue_fixtures"
SQUEUE_22 = FIXTURES / "squeue_22.05.json"
SQUEUE_23 = FIXTURES / "squeue_23.11.json"
LOOPBACK = "127.0.0.1"


def at(hour: int) -> str:
    return f"2026-11-30T{hour:02d}:00:00Z"


def slurm(
    id_: str,
    user: str,
    account: str,
    partition: str,
    gpus: int,
    model: str | None,
    reason: str,
    klass: str,
    submitted: str,
    eligible: str | None,
) -> dict[str, Any]:
    return {
        "kind": "slurm",
        "id": id_,
        "user": user,
        "account": account,
        "partition": partition,
        "gpus": gpus,
        "gpu_model": model,
        "reason": reason,
        "class": klass,
        "submitted": submitted,
        "eligible": eligible,
    }


# The fixtures' jobs, by hand (1796029200 is 2026-11-30T09:00:00Z, each hour 3600 more):
# 1001 runs: out. 1002: gres:gpu:4 per node × 2 nodes = 8. 1003: 2 typed h100 (23.11: its
# state list is PENDING + REQUEUED). 1004: a per-job request of 16 (its 2 nodes do not
# multiply it). 1005: nothing per node or per job; tres_req_str's untyped total gres/gpu=4,
# typed a100. 1006: held, eligible 0 → null. 1007 asks for no GPU: out. 1010: an array record
# of tasks 3,5-6 not split off yet → three entries of 1 GPU. 1013: task 2 of array 1010, split
# off → id 1010_2. 1020: 2 h100 × 3 nodes = 6, submitted to "gpu,gpu-long": counted in "gpu".
# 1021: PartitionTimeLimit has "Limit" in it → policy.
SLURM_EXPECTED = [
    slurm("1002", "alice", "nlp", "gpu", 8, None, "Resources", "capacity", at(9), at(9)),
    slurm("1003", "bob", "vision", "gpu", 2, "h100", "Priority", "capacity", at(10), at(10)),
    slurm("1004", "carol", "nlp", "gpu", 16, None, "QOSMaxGRESPerUser", "policy", at(10), at(11)),
    slurm("1005", "dave", "speech", "a100", 4, "a100", "AssocGrpGRES", "policy", at(11), at(11)),
    slurm("1006", "erin", "nlp", "gpu", 1, None, "JobHeldUser", "user", at(11), None),
    slurm("1010_3", "grace", "vision", "gpu", 1, None, "Priority", "capacity", at(12), at(12)),
    slurm("1010_5", "grace", "vision", "gpu", 1, None, "Priority", "capacity", at(12), at(12)),
    slurm("1010_6", "grace", "vision", "gpu", 1, None, "Priority", "capacity", at(12), at(12)),
    slurm(
        "1010_2",
        "grace",
        "vision",
        "gpu",
        1,
        None,
        "ReqNodeNotAvail, UnavailableNodes:gpu07",
        "capacity",
        at(12),
        at(12),
    ),
    slurm("1020", "heidi", "nlp", "gpu", 6, "h100", "BeginTime", "user", at(9), at(12)),
    slurm("1021", "ivan", "speech", "gpu", 1, None, "PartitionTimeLimit", "policy", at(10), at(10)),
]


# -- Slurm parsing ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", [SQUEUE_22, SQUEUE_23], ids=["22.05", "23.11"])
def test_both_squeue_shapes_give_the_hand_worked_entries(path: Path) -> None:
    assert squeue_entries(json.loads(path.read_text())) == SLURM_EXPECTED


@pytest.mark.parametrize(
    "tres, expected",
    [
        ("gres:gpu:2", (2, None)),
        ("gres:gpu:h100:2", (2, "h100")),
        ("gres/gpu=4", (4, None)),
        ("gres/gpu:h100=4", (4, "h100")),
        ("gres/gpu:2", (2, None)),  # 23.02+'s per-node form
        ("gres/gpu:a100:3", (3, "a100")),
        ("gres:gpu", (1, None)),
        ("cpu=8,mem=64G,node=1,billing=8,gres/gpu=4,gres/gpu:h100=4", (4, "h100")),
        ("gres:gpu:a100:1,gres:gpu:h100:2", (3, None)),  # two types: no one model
        ("gres:shard:2", None),
        ("gres/gpumem=40G", None),
        ("cpu=1,mem=4G,node=1,billing=1", None),
        ("", None),
        (None, None),
    ],
)
def test_gpu_request_forms(tres: Any, expected: tuple[int, str | None] | None) -> None:
    assert gpu_request(tres) == expected


@pytest.mark.parametrize(
    "reason, klass",
    [
        ("Resources", "capacity"),
        ("Priority", "capacity"),
        ("ReqNodeNotAvail, UnavailableNodes:gpu[01-02]", "capacity"),
        ("QOSMaxGRESPerUser", "policy"),
        ("QOSGrpGRES", "policy"),
        ("AssocGrpGRES", "policy"),
        ("AssocMaxJobsLimit", "policy"),
        ("PartitionTimeLimit", "policy"),
        ("JobArrayTaskLimit", "policy"),
        ("Dependency", "user"),
        ("JobHeldUser", "user"),
        ("JobHeldAdmin", "user"),
        ("BeginTime", "user"),
        ("None", "user"),
    ],
)
def test_reason_classes(reason: str, klass: str) -> None:
    assert reason_class(reason) == klass


def test_array_task_strings() -> None:
    assert array_tasks("0-3") == [0, 1, 2, 3]
    assert array_tasks("1,3,5-7") == [1, 3, 5, 6, 7]
    assert array_tasks("0-15:4") == [0, 4, 8, 12]
    assert array_tasks("0-9%2") == list(range(10))  # the throttle is not a task
    assert array_tasks("0-99999", limit=3) == [0, 1, 2]


def test_numbers_states_and_times_in_both_shapes() -> None:
    assert number(5) == 5 and number({"set": True, "infinite": False, "number": 5}) == 5
    assert number({"set": False, "infinite": False, "number": 5}) is None
    assert number({"set": True, "infinite": True, "number": 0}) is None
    assert number(None) is None and number(True) is None
    assert states("PENDING") == ["PENDING"]
    assert states(["PENDING", "REQUEUED"]) == ["PENDING", "REQUEUED"]
    assert timestamp(1796029200) == "2026-11-30T09:00:00Z"
    assert timestamp({"set": True, "infinite": False, "number": 1796032800}) == at(10)
    assert timestamp(0) is None and timestamp({"set": False, "number": 0}) is None


def test_squeue_source_runs_squeue_json(tmp_path: Path) -> None:
    fake = tmp_path / "squeue"
    fake.write_text(f'#!/bin/sh\n[ "$1" = --json ] || exit 3\ncat {SQUEUE_23}\n')
    fake.chmod(0o755)
    assert SqueueSource(str(fake))() == SLURM_EXPECTED


def test_squeue_source_failures_give_no_entries(tmp_path: Path) -> None:
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    with pytest.raises(QueueError, match="took over"):
        SqueueSource(str(slow), timeout_s=0.5)()
    garbled = tmp_path / "garbled"
    garbled.write_text("#!/bin/sh\necho 'squeue: error: invalid option'\n")
    garbled.chmod(0o755)
    with pytest.raises(QueueError, match="no JSON"):
        SqueueSource(str(garbled))()
    with pytest.raises(QueueError, match="cannot run"):
        SqueueSource(str(tmp_path / "absent"))()


# -- recorded HTTP answers on loopback --------------------------------------------------------


class Recorder:
    """A loopback HTTP(S) server answering GETs from ``routes`` (path → (status, body)) and
    POSTs from ``script`` (statuses, then 200); every request recorded."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.routes: dict[str, tuple[int, bytes]] = {}
        self.script: list[int] = []
        self.requests: list[tuple[str, str, Any, bytes]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                # headers as a message: names case-insensitive (urllib sends X-slurm-user-token)
                owner.requests.append((method, self.path, self.headers, body))
                if method == "POST":
                    status = owner.script.pop(0) if owner.script else 200
                    data = b'{"detail": "x"}'
                else:
                    status, data = owner.routes.get(urlsplit(self.path).path, (404, b"{}"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._answer("POST")

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://{LOOPBACK}:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def http() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


@pytest.fixture
def serviceaccount(tmp_path: Path) -> Path:
    """A service account directory as Kubernetes mounts it: token, and the CA that signed the
    API server's certificate (here a self-signed one for 127.0.0.1)."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(tmp_path / "key.pem"), "-out", str(sa / "ca.crt"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    (sa / "token").write_text("sa-token-1\n")
    (sa / "namespace").write_text("gpufleet\n")
    return sa


@pytest.fixture
def apiserver(serviceaccount: Path, tmp_path: Path) -> Iterator[Recorder]:
    r = Recorder(tls=(serviceaccount / "ca.crt", tmp_path / "key.pem"))
    yield r
    r.close()


def test_slurmrestd_tries_the_newest_version_first_and_keeps_the_one_answered(
    http: Recorder, tmp_path: Path
) -> None:
    http.routes["/slurm/v0.0.40/jobs"] = (200, SQUEUE_23.read_bytes())
    jwt = tmp_path / "jwt"
    jwt.write_text("eyJhbGciOiJIUzI1NiJ9.first\n")
    source = SlurmrestdSource(http.url, str(jwt))
    assert source() == SLURM_EXPECTED
    tried = [path for _, path, _, _ in http.requests]
    assert tried == [f"/slurm/v0.0.{v}/jobs" for v in (43, 42, 41, 40)]
    assert http.requests[-1][2]["X-SLURM-USER-TOKEN"] == "eyJhbGciOiJIUzI1NiJ9.first"
    jwt.write_text("eyJhbGciOiJIUzI1NiJ9.rotated\n")  # read again at every poll
    assert source() == SLURM_EXPECTED
    assert [p for _, p, _, _ in http.requests[4:]] == ["/slurm/v0.0.40/jobs"]
    assert http.requests[-1][2]["X-SLURM-USER-TOKEN"] == "eyJhbGciOiJIUzI1NiJ9.rotated"


def test_slurmrestd_refusals(http: Recorder, tmp_path: Path) -> None:
    jwt = tmp_path / "jwt"
    jwt.write_text("t")
    with pytest.raises(QueueError, match="answers none of"):
        SlurmrestdSource(http.url, str(jwt))()  # every version 404
    http.routes["/slurm/v0.0.43/jobs"] = (401, b"{}")
    with pytest.raises(QueueError, match="refused the token"):
        SlurmrestdSource(http.url, str(jwt))()
    with pytest.raises(QueueError, match="JWT file"):
        SlurmrestdSource(http.url, str(tmp_path / "absent"))()


# The recorded pod lists, by hand: ml/train-0 asks 4 in "main" (the sidecar none), waits
# Unschedulable, names a Kueue queue and a GPU product. ml/bound-0 has a node: out.
# web/nginx-7d9c asks for no GPU: out. ml/limits-only gives limits only: containers 1 + 1 = 2,
# its init container 3, so 3 (the larger); no PodScheduled condition yet. research/sweep-17:
# gated, 8, no eligible time. research/serve-1 runs: out.
K8S_EXPECTED = [
    {
        "kind": "k8s",
        "id": "ml/train-0",
        "user": "ml",
        "account": "ml",
        "partition": "h100-queue",
        "gpus": 4,
        "gpu_model": "NVIDIA-H100-80GB-HBM3",
        "reason": "Unschedulable",
        "class": "capacity",
        "submitted": "2026-11-30T09:00:00Z",
        "eligible": "2026-11-30T09:00:00Z",
    },
    {
        "kind": "k8s",
        "id": "ml/limits-only",
        "user": "ml",
        "account": "ml",
        "partition": "default",
        "gpus": 3,
        "gpu_model": None,
        "reason": "Pending",
        "class": "user",
        "submitted": "2026-11-30T09:30:00Z",
        "eligible": "2026-11-30T09:30:00Z",
    },
    {
        "kind": "k8s",
        "id": "research/sweep-17",
        "user": "research",
        "account": "research",
        "partition": "default",
        "gpus": 8,
        "gpu_model": None,
        "reason": "SchedulingGated",
        "class": "policy",
        "submitted": "2026-11-30T10:00:00Z",
        "eligible": None,
    },
]


def test_pod_lists_give_the_hand_worked_entries() -> None:
    pages = [json.loads((FIXTURES / f"k8s_pods_page{n}.json").read_text()) for n in (1, 2)]
    assert pod_list_entries(pages[0]) + pod_list_entries(pages[1]) == K8S_EXPECTED
    assert quantity("2") == 2 and quantity(2) == 2 and quantity("2000m") == 2
    assert quantity("1.5") == 0 and quantity(None) == 0 and quantity(True) == 0


def test_kube_source_lists_pending_pods_page_by_page_over_tls(
    apiserver: Recorder, serviceaccount: Path
) -> None:
    page1 = (FIXTURES / "k8s_pods_page1.json").read_bytes()
    token = json.loads(page1)["metadata"]["continue"]
    pages = {None: page1, token: (FIXTURES / "k8s_pods_page2.json").read_bytes()}

    # one route answers both pages, by the continue token
    class Routes(dict[str, tuple[int, bytes]]):
        def get(self, key: str, default: Any = None) -> Any:
            query = parse_qs(urlsplit(apiserver.requests[-1][1]).query)
            return (200, pages[query.get("continue", [None])[0]])

    apiserver.routes = Routes()
    source = KubeSource(api=apiserver.url, sa_dir=str(serviceaccount))
    assert source() == K8S_EXPECTED
    assert len(apiserver.requests) == 2
    for _, path, headers, _ in apiserver.requests:
        assert urlsplit(path).path == "/api/v1/pods"  # every namespace
        query = parse_qs(urlsplit(path).query)
        assert query["fieldSelector"] == ["status.phase=Pending"] and query["limit"] == ["500"]
        assert headers["Authorization"] == "Bearer sa-token-1"
    assert parse_qs(urlsplit(apiserver.requests[1][1]).query)["continue"] == [token]


def test_once_print_in_a_kubernetes_pod(
    apiserver: Recorder,
    serviceaccount: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The whole command, the API server found as a pod finds it (one page here)."""
    page = json.loads((FIXTURES / "k8s_pods_page1.json").read_text())
    del page["metadata"]["continue"]
    apiserver.routes["/api/v1/pods"] = (200, json.dumps(page).encode())
    host, port = apiserver.url.removeprefix("https://").split(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    monkeypatch.setenv("GPUFLEET_K8S_SA_DIR", str(serviceaccount))
    assert cli.main(["--queue", "k8s", "--cluster", "eks", "--once", "--print"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["cluster"] == "eks" and snap["pending"] == K8S_EXPECTED[:2]


def test_kube_source_without_rights_says_what_to_grant(
    apiserver: Recorder, serviceaccount: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.routes["/api/v1/pods"] = (403, b'{"kind": "Status", "reason": "Forbidden"}')
    host, port = apiserver.url.removeprefix("https://").split(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    with pytest.raises(QueueError, match="ClusterRole"):
        KubeSource(sa_dir=str(serviceaccount))()  # the in-cluster address from the environment
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ValueError, match="inside the cluster"):
        KubeSource(sa_dir=str(serviceaccount))


def test_kube_source_checks_the_api_servers_certificate(
    apiserver: Recorder, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(other / "k.pem"), "-out", str(other / "ca.crt")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (other / "token").write_text("t")
    with pytest.raises(QueueError, match="CERTIFICATE_VERIFY_FAILED"):
        KubeSource(api=apiserver.url, sa_dir=str(other))()
    assert apiserver.requests == []


# -- the snapshot and its delivery ------------------------------------------------------------


def test_snapshot_and_url() -> None:
    snap = snapshot("hpc", 1796029260.7, SLURM_EXPECTED)
    assert snap == {"cluster": "hpc", "at": "2026-11-30T09:01:00Z", "pending": SLURM_EXPECTED}
    assert queue_url("https://fleet.example/") == "https://fleet.example/api/v1/queue"
    assert queue_url("https://fleet.example/api/v1/ingest") == "https://fleet.example/api/v1/queue"


def test_snapshot_keeps_at_most_10000_entries_those_asking_most() -> None:
    many = [dict(SLURM_EXPECTED[0], id=str(i), gpus=2) for i in range(MAX_ENTRIES)]
    small = dict(SLURM_EXPECTED[0], id="small", gpus=1)
    big = dict(SLURM_EXPECTED[0], id="big", gpus=8)
    pending = snapshot("hpc", 0, [small, *many, big])["pending"]
    assert len(pending) == MAX_ENTRIES
    ids = [e["id"] for e in pending]
    # the one 1-GPU job and the last-submitted-equal 2-GPU job (the last in order) go
    assert "small" not in ids and "big" in ids and str(MAX_ENTRIES - 1) not in ids
    assert ids[0] == "0" and ids[-1] == "big"  # the source's order is kept


def fixed_source(entries: list[dict[str, Any]]) -> Any:
    return lambda: list(entries)


def test_a_503_then_success_delivers_the_snapshot_once(http: Recorder, tmp_path: Path) -> None:
    http.script = [503]
    agent = QueueAgent(
        fixed_source(SLURM_EXPECTED[:2]),
        cluster="hpc",
        spool_dir=str(tmp_path),
        server=http.url,
        token="node-token",
        rng=random.Random(1),
    )
    assert agent.delivery is not None
    snap = agent.poll(1796029200)
    assert snap == {"cluster": "hpc", "at": at(9), "pending": SLURM_EXPECTED[:2]}
    d = agent.delivery
    assert d.step(1000.0) == "retry"
    assert d.spool.payloads_pending(KIND) == 1  # still spooled
    assert d.step(1000.0) == "wait"  # backing off: nothing sent
    assert d.step(d.next_attempt) == "sent"
    assert d.step(d.next_attempt) == "idle"
    posts = [(path, h, body) for method, path, h, body in http.requests if method == "POST"]
    assert [p for p, _, _ in posts] == ["/api/v1/queue", "/api/v1/queue"]
    assert posts[0][2] == posts[1][2]  # the same snapshot again: its (cluster, at) is its key
    assert json.loads(posts[1][2]) == snap
    assert posts[1][1]["Authorization"] == "Bearer node-token"
    assert d.statuses == {503: 1, 200: 1}
    agent.close()


def test_snapshots_wait_in_the_spool_across_a_restart(tmp_path: Path) -> None:
    sent: list[bytes] = []
    answers = [Response(0, error="connection refused")] * 2

    def post(url: str, token: str, body: bytes, timeout: float) -> Response:
        sent.append(body)
        return answers.pop(0) if answers else Response(200, b"{}")

    clock = VirtualClock(1796029200)
    first = QueueAgent(
        fixed_source([]), cluster="hpc", spool_dir=str(tmp_path), server="http://x", token="t",
        post=post, clock=clock,
    )  # fmt: skip
    assert first.delivery is not None
    first.poll(1796029200)
    assert first.delivery.step(0.0) == "retry"
    first.poll(1796029260)
    first.poll(1796029260)  # the same minute twice: kept once
    first.close()
    second = QueueAgent(
        fixed_source([]), cluster="hpc", spool_dir=str(tmp_path), server="http://x", token="t",
        post=post, clock=clock,
    )  # fmt: skip
    assert second.delivery is not None
    assert second.delivery.drain(lambda: 1e9) == "retry"
    assert second.delivery.drain(lambda: 1e9) == "wait"  # backing off
    assert second.delivery.drain(lambda: 1e9 + 3600) == "idle"
    got = [json.loads(b)["at"] for b in sent]
    assert got == [at(9), at(9), at(9), "2026-11-30T09:01:00Z"]
    assert json.loads(sent[-1]) == {"cluster": "hpc", "at": "2026-11-30T09:01:00Z", "pending": []}
    second.close()


def test_a_refused_snapshot_is_dropped_and_counted_not_retried(tmp_path: Path) -> None:
    calls: list[int] = []

    def post(url: str, token: str, body: bytes, timeout: float) -> Response:
        calls.append(1)
        return Response(400, b'{"field": "pending[0].gpus", "error": "must be at least 1"}')

    spool = Spool(str(tmp_path / SPOOL_FILE))
    spool.payload_add(KIND, at(9), {"cluster": "c", "at": at(9), "pending": []}, max_keep=5)
    d = QueueDelivery(spool, url="http://x/api/v1/queue", token="t", post=post)
    assert d.step(0.0) == "refused"
    assert d.step(0.0) == "idle" and len(calls) == 1
    assert spool.counter("refused_queue") == 1
    spool.close()


def test_the_spool_keeps_the_newest_snapshots_when_full(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / SPOOL_FILE))
    for h in range(9, 14):
        spool.payload_add(KIND, at(h), {"at": at(h)}, max_keep=3)
    assert spool.payloads_pending(KIND) == 3 and spool.counter("dropped_queue") == 2
    head = spool.payload_oldest(KIND)
    assert head is not None and head[1] == {"at": at(11)}
    spool.close()


def test_run_polls_on_the_grid_skips_a_failed_poll_and_delivers_at_stop(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    calls = iter([SLURM_EXPECTED[:1], None, SLURM_EXPECTED[1:3]])

    def source() -> list[dict[str, Any]]:
        got = next(calls)
        if got is None:
            raise QueueError("squeue --json took over 30 s")
        return got

    def post(url: str, token: str, body: bytes, timeout: float) -> Response:
        sent.append(json.loads(body))
        return Response(200, b"{}")

    agent = QueueAgent(
        source,
        cluster="hpc",
        spool_dir=str(tmp_path),
        server="http://x",
        token="t",
        clock=VirtualClock(1796029200 + 17.5),
        post=post,
    )
    agent.run(threading.Event(), max_polls=3)
    agent.close()
    # polls at 09:01, 09:02 (failed: no snapshot, never an empty one) and 09:03
    assert [s["at"] for s in sent] == ["2026-11-30T09:01:00Z", "2026-11-30T09:03:00Z"]
    assert [s["pending"] for s in sent] == [SLURM_EXPECTED[:1], SLURM_EXPECTED[1:3]]
    assert agent.failed_polls == 1


# -- the command line -------------------------------------------------------------------------


def fake_squeue(tmp_path: Path, fixture: Path) -> str:
    path = tmp_path / "squeue"
    path.write_text(f"#!/bin/sh\ncat {fixture}\n")
    path.chmod(0o755)
    return str(path)


def test_once_print_prints_the_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    squeue = fake_squeue(tmp_path, SQUEUE_22)
    argv = ["--queue", "slurm", "--cluster", "hpc", "--squeue", squeue, "--once", "--print"]
    assert cli.main(argv) == 0
    snap = json.loads(capsys.readouterr().out)
    assert set(snap) == {"cluster", "at", "pending"}
    assert snap["cluster"] == "hpc" and snap["pending"] == SLURM_EXPECTED
    assert not (tmp_path / SPOOL_FILE).exists()


def test_once_sends_through_the_spool(
    http: Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    squeue = fake_squeue(tmp_path, SQUEUE_23)
    monkeypatch.setenv("GPUFLEET_QUEUE", "slurm")
    monkeypatch.setenv("GPUFLEET_CLUSTER", "hpc")
    monkeypatch.setenv("GPUFLEET_SQUEUE", squeue)
    spool = tmp_path / "spool"
    argv = ["--server", http.url, "--token", "tok", "--spool", str(spool), "--once"]
    assert cli.main(argv) == 0
    [(method, path, headers, body)] = http.requests
    assert (method, path, headers["Authorization"]) == ("POST", "/api/v1/queue", "Bearer tok")
    assert json.loads(body)["pending"] == SLURM_EXPECTED
    assert Spool(str(spool / SPOOL_FILE)).payloads_pending(KIND) == 0


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--queue", "slurm", "--once", "--print"], "--cluster"),
        (
            ["--queue", "slurm", "--cluster", "c", "--slurmrestd", "u", "--once", "--print"],
            "--jwt-file",
        ),
        (["--queue", "slurm", "--cluster", "c"], "--server and --token"),
        (["--queue", "slurm", "--cluster", "c", "--print"], "--print needs --once"),
        (["--queue", "slurm", "--cluster", "c", "--queue-interval", "0"], "at least 1"),
    ],
)
def test_bad_command_lines(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GPUFLEET_SERVER", "GPUFLEET_TOKEN", "GPUFLEET_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(argv) == 2
    assert says in capsys.readouterr().err


def test_slurmrestd_names_the_tokens_user(http: Recorder, tmp_path: Path) -> None:
    """22.05's slurmrestd wants X-SLURM-USER-NAME beside the token: the token's ``sun``."""
    http.routes["/slurm/v0.0.43/jobs"] = (200, b'{"jobs": []}')
    # header {"alg":"HS256","typ":"JWT"};
    # claims {"exp":1796477142,"iat":1796476542,"sun":"gpufleet"}
    claims = "eyJleHAiOjE3OTY0NzcxNDIsImlhdCI6MTc5NjQ3NjU0Miwic3VuIjoiZ3B1ZmxlZXQifQ"
    jwt = tmp_path / "jwt"
    jwt.write_text(f"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.{claims}.c2ln\n")
    assert SlurmrestdSource(http.url, str(jwt))() == []
    assert http.requests[0][2]["X-SLURM-USER-NAME"] == "gpufleet"
