"""Ingest benchmark (docs/benchmarks.md): the full HTTP path against raw binary COPY, side by side.

    DATABASE_URL=postgres://… REDIS_URL=redis://… python bench/ingest.py [--server both]

Reference: psycopg 3 binary COPY of prepared rows straight into ``telemetry_sample`` (the
partitioned table, same indexes), one transaction per batch. Measured: the same shape of batches
as JSON pushes through ``POST /api/v1/ingest`` (token auth, throttle and metrics in Redis,
msgspec validation, binary COPY, the GPUs' first/last seen, the hour marks), one request per
batch, sequentially, against a real gunicorn on loopback and Django's WSGI handler in-process
(``--server both``, the default; each interleaved with the reference). Batches of 8 samples
(one minute of an 8-GPU node) and of 1,000 (a spool replay); each push carries its 8-GPU
``gpus`` block, as the agent sends it. Goals (issue 4): ≥ 0.6 of the reference's rows/s at
8-sample batches, ≥ 0.8 at 1,000. Ratios are printed last.

``--write-docs`` replaces the "## Ingest" section of docs/benchmarks-history.md (the full
round-by-round record) with this run; docs/benchmarks.md keeps a one-screen summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import io
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Both servers log at WARNING: an access line per request would cost the in-process path a
# write to the terminal that gunicorn (started with LOG_LEVEL=WARNING) does not pay.
os.environ.setdefault("LOG_LEVEL", "WARNING")

GPUS = 8
DOCS = ROOT / "docs" / "benchmarks-history.md"


def setup_django() -> None:
    import django

    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("bench/ingest.py needs DATABASE_URL pointing at PostgreSQL")
    django.setup()


def iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def sample_dict(uuid: str, start: dt.datetime, k: int) -> dict[str, Any]:
    return {
        "gpu": uuid,
        "start": iso(start),
        "seconds": 60,
        "util_pct": float(k % 100),
        "mem_util_pct": 41.0,
        "mem_used_bytes": 61_000_000_000,
        "procs": 1,
        "power_w": 512.3,
        "energy_j": 30738.0,
        "temp_c": 68,
        "sm_clock_mhz": 1980,
        "throttle_s": {"power_cap": 0, "thermal": 0, "hw_slowdown": 0, "other": 0, "any": 0},
    }


class Batches:
    """Distinct (gpu, start) batches: ``size`` samples = 8 GPUs × size/8 consecutive minutes,
    walking back in time from ``top`` so no two batches (or runs) collide."""

    def __init__(self, uuids: list[str], top: dt.datetime) -> None:
        self.uuids = uuids
        self.cursor = top

    def take(self, size: int) -> list[tuple[str, dt.datetime, int]]:
        minutes = size // len(self.uuids)
        self.cursor -= dt.timedelta(minutes=minutes)
        out = []
        for m in range(minutes):
            start = self.cursor + dt.timedelta(minutes=m)
            for k, u in enumerate(self.uuids):
                out.append((u, start, m * len(self.uuids) + k))
        return out


def gpus_block(uuids: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "uuid": u,
            "index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 85_899_345_920,
            "power_limit_w": 700.0,
        }
        for i, u in enumerate(uuids)
    ]


# --- the reference: raw binary COPY -------------------------------------------------------------
def reference_run(dsn: str, batches: list[list[tuple[Any, ...]]]) -> float:
    """rows/s of binary COPY of prepared rows, one transaction per batch."""
    import psycopg

    from telemetry.ingest_store import COLUMNS, COPY_TYPES

    sql = f"COPY telemetry_sample ({', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    with psycopg.connect(dsn) as conn:
        began = time.perf_counter()
        for rows in batches:
            with conn.transaction(), conn.cursor() as cur, cur.copy(sql) as copy:
                copy.set_types(COPY_TYPES)
                for row in rows:
                    copy.write_row(row)
        elapsed = time.perf_counter() - began
    return sum(len(b) for b in batches) / elapsed


# --- the measured path: HTTP ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gunicorn:
    """One sync worker on loopback, the way production runs it behind a proxy."""

    def __init__(self) -> None:
        self.port = _free_port()
        env = dict(os.environ)
        # The default rate (600/min) would throttle a benchmark; the check itself still runs.
        env["INGEST_THROTTLE_RATE"] = "100000000/min"
        env.setdefault("LOG_LEVEL", "WARNING")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "-b",
                f"127.0.0.1:{self.port}",
                "-w",
                "1",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                status, _ = self.post("/healthz", b"", {}, method="GET")
                if status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError("gunicorn did not start")

    def post(
        self, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class InProcess:
    """Django's WSGI handler called directly: the same middleware, view and database work."""

    def __init__(self) -> None:
        from django.conf import settings
        from django.core.handlers.wsgi import WSGIHandler

        rest: dict[str, Any] = settings.REST_FRAMEWORK
        rest["DEFAULT_THROTTLE_RATES"]["ingest"] = "100000000/min"
        self.handler = WSGIHandler()

    def post(
        self, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> tuple[int, bytes]:
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json",
            "HTTP_HOST": "127.0.0.1",
        }
        for k, v in headers.items():
            environ["HTTP_" + k.upper().replace("-", "_")] = v
        status: list[str] = []
        start_response: Any = lambda s, h: status.append(s)  # noqa: E731
        chunks = self.handler(environ, start_response)
        try:
            data = b"".join(chunks)
        finally:
            chunks.close()  # as a WSGI server does: fires request_finished
        return int(status[0].split()[0]), data

    def close(self) -> None:
        pass


def http_run(server: Any, token: str, bodies: list[bytes], rows_per_body: int) -> float:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    began = time.perf_counter()
    for body in bodies:
        status, answer = server.post("/api/v1/ingest", body, headers)
        if status != 200:
            raise RuntimeError(f"ingest answered {status}: {answer[:300]!r}")
    elapsed = time.perf_counter() - began
    accepted = json.loads(answer)["accepted"]
    assert accepted == rows_per_body, answer
    return len(bodies) * rows_per_body / elapsed


def side_measurements(server: Any, token: str, bodies: Any, rounds: int) -> dict[str, float]:
    """Median ms of an 8-sample push through the in-process server, alternating round by round:
    with node tokens' facts cached (the default), looked up on every push (what the cache
    saves, docs/benchmarks.md), and with two workloads per sample (issue 14's goal)."""
    from fleet import authentication

    times: dict[str, list[float]] = {"cache on": [], "cache off": [], "workloads": []}
    ttl = authentication.NODE_TOKEN_CACHE_TTL_S
    try:
        for _ in range(max(rounds, 3)):
            for name in times:
                authentication.NODE_TOKEN_CACHE_TTL_S = 0.0 if name == "cache off" else ttl
                authentication.node_token_cache_clear()
                batch = bodies(8, 61, workloads=2 if name == "workloads" else 0)
                http_run(server, token, batch[:1], 8)  # warm: the cache, the statements
                rate = http_run(server, token, batch[1:], 8)
                times[name].append(8 / rate * 1e3)
    finally:
        authentication.NODE_TOKEN_CACHE_TTL_S = ttl
    return {name: statistics.median(v) for name, v in times.items()}


def empty_push_ms(server: Any, token: str, n: int = 100) -> float:
    """Median ms of a push with no samples: the fixed cost of a request (auth, throttle,
    metrics, Django and DRF), to read the small-batch ratio against."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    times = []
    for _ in range(n):
        began = time.perf_counter()
        status, answer = server.post("/api/v1/ingest", b'{"samples": []}', headers)
        times.append(time.perf_counter() - began)
        assert status == 200, answer
    return statistics.median(times) * 1e3


def bare_view_ms(server: Any, n: int = 200) -> float:
    """Median ms of ``GET /healthz``: a Django view that does nothing (no database, no cache,
    no DRF) through the same server and middleware: the floor of any Django request."""
    times = []
    for _ in range(n):
        began = time.perf_counter()
        status, _ = server.post("/healthz", b"", {}, method="GET")
        times.append(time.perf_counter() - began)
        assert status == 200
    return statistics.median(times) * 1e3


def required_ms(n: int = 300) -> float:
    """Median ms of what issue 4 requires of every push beyond a Django view, without its
    own work: DRF's dispatch of a view that does nothing (against a plain Django view, both
    called directly) and the throttle's one round trip to the shared cache (Redis INCR)."""
    from django.core.cache import caches
    from django.http import HttpResponse
    from django.test import RequestFactory
    from rest_framework.permissions import AllowAny
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from config.metrics import redis_client

    class Nothing(APIView):
        permission_classes = [AllowAny]
        authentication_classes: list[Any] = []

        def post(self, request: Any) -> Response:
            return Response({})

    drf = Nothing.as_view()

    def plain(request: Any) -> HttpResponse:
        return HttpResponse(b"{}", content_type="application/json")

    factory = RequestFactory()
    client = redis_client(caches["default"])

    def median_ms(call: Any) -> float:
        times = []
        for _ in range(n):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e3

    def drf_call() -> None:
        response = drf(factory.post("/x", b"{}", content_type="application/json"))
        response.render()

    dispatch = median_ms(drf_call) - median_ms(
        lambda: plain(factory.post("/x", b"{}", content_type="application/json"))
    )
    incr = median_ms(lambda: client.incr("bench:ingest:rtt")) if client is not None else 0.0
    return max(dispatch, 0.0) + incr


def checks_ms(body: bytes, uuids: list[str], n: int = 20) -> float:
    """Median ms of what docs/ingest.md make ingest do with a body before storing it: msgspec
    decoding and the per-sample checks (no database: the GPU map is given)."""
    from django.utils import timezone

    from telemetry.ingest import GpuRef, samples_validate
    from telemetry.wire import push_decode, samples_decode

    gpus = {u: GpuRef(i + 1, 1, 85_899_345_920, i, "", 700.0, None) for i, u in enumerate(uuids)}
    times = []
    for _ in range(n):
        began = time.perf_counter()
        push, typed = push_decode(body)
        assert typed  # every sample decoded: the list holds SampleIn only
        samples = samples_decode(push, typed)
        samples_validate(samples=samples, gpus=gpus, node_id=1, now=timezone.now())
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


# --- the run -------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("both", "gunicorn", "wsgi"), default="both")
    parser.add_argument("--small-batches", type=int, default=60, help="8-sample batches per round")
    parser.add_argument(
        "--large-batches", type=int, default=3, help="1,000-sample batches per round"
    )
    # Many short rounds, each measuring the reference and the HTTP path back to back, so that
    # both see the same moment of a shared machine (fsync latency and load vary by the minute).
    parser.add_argument(
        "--rounds", type=int, default=10, help="alternating rounds; medians reported"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    setup_django()

    from django.db import connection
    from django.utils import timezone

    from fleet.models import Gpu, GpuModel, Node
    from fleet.services import node_token_issue
    from telemetry.models import Sample

    tag = uuidlib.uuid4().hex[:8]
    node, token = node_token_issue(hostname=f"bench-ingest-{tag}")
    ref_node = Node.objects.create(hostname=f"bench-ingest-ref-{tag}")
    http_uuids = [f"GPU-bench-{tag}-{i}" for i in range(GPUS)]
    ref_uuids = [f"GPU-bench-ref-{tag}-{i}" for i in range(GPUS)]
    model = GpuModel.objects.filter(key="H100-SXM").first()
    Gpu.objects.bulk_create(
        [
            Gpu(uuid=u, node=ref_node, index=i, model=model, memory_total_bytes=85_899_345_920)
            for i, u in enumerate(ref_uuids)
        ]
    )
    ref_ids = dict(Gpu.objects.filter(uuid__in=ref_uuids).values_list("uuid", "id"))
    dsn = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)

    now = timezone.now().astimezone(dt.UTC).replace(second=0, microsecond=0)
    top = now.replace(minute=0) - dt.timedelta(hours=1)
    http_batches = Batches(http_uuids, top)
    ref_batches = Batches(ref_uuids, top)
    block = gpus_block(http_uuids)

    def bodies(size: int, n: int, workloads: int = 0) -> list[bytes]:
        out = []
        for _ in range(n):
            samples = [sample_dict(u, s, k) for u, s, k in http_batches.take(size)]
            for i, sample in enumerate(samples):
                if workloads:  # e.g. two Slurm jobs sharing the GPU, as issue 14 measures
                    share = 60.0 / workloads
                    air = share * sample["util_pct"] / 100
                    sample["workloads"] = [
                        {"kind": "slurm", "id": f"{4800 + (i + j) % 16}", "user": "bench",
                         "account": "bench", "share_s": share, "air_s": air}
                        for j in range(workloads)
                    ]  # fmt: skip
            out.append(
                json.dumps(
                    {
                        "node": {
                            "hostname": "bench",
                            "agent_version": "bench",
                            "driver_version": "550",
                        },
                        "gpus": block,
                        "samples": samples,
                    },
                    separators=(",", ":"),
                ).encode()
            )
        return out

    def ref_rows(size: int, n: int) -> list[list[tuple[Any, ...]]]:
        received = timezone.now()
        out = []
        for _ in range(n):
            rows = []
            for u, s, k in ref_batches.take(size):
                rows.append(
                    (
                        ref_ids[u],
                        s,
                        60,
                        float(k % 100),
                        41.0,
                        61_000_000_000,
                        1,
                        512.3,
                        30738.0,
                        68.0,
                        1980.0,
                        0.0,
                        0.0,
                        0.0,
                        0.0,
                        0.0,
                        *(None,) * 9,  # active_s … workload_air_s: not sent by this agent
                        received,
                    )
                )
            out.append(rows)
        return out

    names = ["gunicorn", "wsgi"] if args.server == "both" else [args.server]
    servers: dict[str, Any] = {}
    results: dict[tuple[int, str], list[float]] = {}
    try:
        for name in names:
            servers[name] = Gunicorn() if name == "gunicorn" else InProcess()
        # Warm up: register the GPUs, open connections, load code paths.
        for server in servers.values():
            status, answer = server.post(
                "/api/v1/ingest", bodies(8, 1)[0], {"Authorization": f"Bearer {token}"}
            )
            assert status == 200, answer
            http_run(server, token, bodies(8, 20), 8)
        reference_run(dsn, ref_rows(8, 20))
        plan: list[tuple[int, int]] = [(8, args.small_batches), (1000, args.large_batches)]
        for _ in range(args.rounds):
            for size, n in plan:
                results.setdefault((size, "ref"), []).append(reference_run(dsn, ref_rows(size, n)))
                for name, server in servers.items():
                    results.setdefault((size, name), []).append(
                        http_run(server, token, bodies(size, n), size)
                    )
        side: dict[str, float] = {}
        if "wsgi" in servers:
            side = side_measurements(servers["wsgi"], token, bodies, args.rounds)
        fixed_ms = {name: empty_push_ms(server, token) for name, server in servers.items()}
        floor_ms = {name: bare_view_ms(server) for name, server in servers.items()}
        extra_ms = required_ms()
        # Decoding and checking the samples, plus DRF's dispatch and the throttle's round trip.
        work_ms = {size: checks_ms(bodies(size, 1)[0], http_uuids) + extra_ms for size in (8, 1000)}
    finally:
        for server in servers.values():
            server.close()
        # The benchmark's rows and inventory go; hour marks stay (a rollup of them is a no-op).
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM telemetry_sample WHERE gpu_id IN "
                "(SELECT id FROM fleet_gpu WHERE node_id IN (%s, %s))",
                [node.pk, ref_node.pk],
            )
        Gpu.objects.filter(node__in=[node, ref_node]).delete()
        Node.objects.filter(pk__in=[node.pk, ref_node.pk]).delete()
        assert not Sample.objects.filter(gpu__uuid__in=http_uuids + ref_uuids).exists()

    summary = {key: statistics.median(v) for key, v in results.items()}
    # The ratio of each round (measured back to back), then the median over rounds.
    ratios = {
        (size, name): statistics.median(
            got / ref
            for got, ref in zip(results[(size, name)], results[(size, "ref")], strict=True)
        )
        for size in (8, 1000)
        for name in names
    }
    load = os.getloadavg()[0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {load:.1f}"
    )
    for size in (8, 1000):
        ref = summary[(size, "ref")]
        print(
            f"batch {size:>5}: reference COPY {ref:>10,.0f} rows/s "
            f"({1e3 * size / ref:.2f} ms/batch)"
        )
        for name in names:
            got = summary[(size, name)]
            print(
                f"batch {size:>5}: HTTP ingest via {name:<8} {got:>10,.0f} rows/s "
                f"({1e3 * size / got:.2f} ms/batch)"
            )
    for name in names:
        print(f"empty push via {name:<8}: {fixed_ms[name]:.2f} ms (the fixed cost of a request)")
        print(f"bare Django view via {name:<8}: {floor_ms[name]:.2f} ms (GET /healthz)")
    # The best ratio a Django path could reach if storing cost it no more than the reference:
    # the reference's time against the reference plus a bare Django request plus decoding and
    # checking the samples (which the reference skips, and docs/ingest.md requires).
    ceilings = {
        (size, name): (size / summary[(size, "ref")] * 1e3)
        / (size / summary[(size, "ref")] * 1e3 + floor_ms[name] + work_ms[size])
        for size in (8, 1000)
        for name in names
    }
    for size in (8, 1000):
        print(f"decode + checks of {size:>5} samples, DRF and throttle: {work_ms[size]:.2f} ms")
    if "wsgi" in servers:
        on, off = side["cache on"], side["cache off"]
        print(
            f"8-sample push, token facts cached: {on:.2f} ms; looked up each push: {off:.2f} ms "
            f"(the cache saves {off - on:.2f} ms, {1 - on / off:.0%})"
        )
        print(
            f"8-sample push with 2 workloads per sample: {side['workloads']:.2f} ms, "
            f"{side['workloads'] / on:.2f}× the same push without (goal ≤ 1.3)"
        )
    if args.write_docs:
        docs_write(
            summary, ratios, fixed_ms, floor_ms, work_ms, ceilings, names, args, load,
            side if "wsgi" in servers else None,
        )  # fmt: skip
    for size in (8, 1000):
        for name in names:
            ratio = ratios[(size, name)]
            verdict = "meets" if ratio >= GOALS[size] else "BELOW"
            print(
                f"ratio batch {size} ({name}): {ratio:.2f} (goal ≥ {GOALS[size]}, {verdict}; "
                f"ceiling of a DRF view {ceilings[(size, name)]:.2f})"
            )


GOALS = {8: 0.6, 1000: 0.8}


def docs_write(
    summary: dict[tuple[int, str], float],
    ratios: dict[tuple[int, str], float],
    fixed_ms: dict[str, float],
    floor_ms: dict[str, float],
    work_ms: dict[int, float],
    ceilings: dict[tuple[int, str], float],
    names: list[str],
    args: argparse.Namespace,
    load: float,
    side: dict[str, float] | None = None,
) -> None:
    pg = _pg_version()
    rows = []
    for size in (8, 1000):
        ref = summary[(size, "ref")]
        rows.append(
            f"| {size:,} | reference: binary COPY | {ref:,.0f} | {1e3 * size / ref:.2f} | | | |"
        )
        for name in names:
            got = summary[(size, name)]
            rows.append(
                f"| {size:,} | HTTP ingest, {_server_words(name)} | {got:,.0f} | "
                f"{1e3 * size / got:.2f} | {ratios[(size, name)]:.2f} | "
                f"{ceilings[(size, name)]:.2f} | ≥ {GOALS[size]} |"
            )
    for name in names:
        rows.append(
            f"| 0 | empty push (fixed cost), {_server_words(name)} | | {fixed_ms[name]:.2f} | | | |"
        )
        rows.append(
            f"| 0 | bare Django view (`GET /healthz`), {_server_words(name)} | | "
            f"{floor_ms[name]:.2f} | | | |"
        )
    for size in (8, 1000):
        rows.append(
            f"| {size:,} | decoding and checks, DRF's dispatch, the throttle's round trip | | "
            f"{work_ms[size]:.2f} | | | |"
        )
    table = "\n".join(rows)
    capacity_name = "gunicorn" if "gunicorn" in names else names[0]
    capacity_ms = 1e3 * 8 / summary[(8, capacity_name)]
    capacity_words = _server_words(capacity_name)
    capacity_nodes = 60 / (capacity_ms / 1e3)
    side_text = ""
    if side:
        on, off, wl = side["cache on"], side["cache off"], side["workloads"]
        side_text = f"""
Side measurements (8-sample pushes through Django's WSGI handler in-process, the three kinds
alternating round by round, medians):

| push | ms | against the default |
|---|---:|---:|
| default: node tokens' facts kept per process | {on:.2f} | |
| the token looked up on every push (no cache) | {off:.2f} | {off / on:.2f}× |
| two workloads per sample (registered, stored) | {wl:.2f} | {wl / on:.2f}× (goal ≤ 1.3) |

The one cache ingest keeps, the facts of node tokens that never change (id, hash, node), saves
{off - on:.2f} ms of every push ({1 - on / off:.0%}); what changes (revocation, ownership of
a GPU) is checked by the write itself.
"""
    section = f"""## Ingest

`python bench/ingest.py --server {args.server} --write-docs` ({dt.date.today().isoformat()};
{os.cpu_count()} CPUs shared by PostgreSQL {pg}, Redis, the server and the client; load average
{load:.1f} at the end of the run; {args.rounds} rounds, each timing {args.small_batches}
8-sample and {args.large_batches} 1,000-sample batches of every path back to back; rows/s are
medians over rounds, a ratio is the median of the rounds' ratios).

Reference: psycopg 3 binary COPY of prepared rows into `telemetry_sample` (partitioned by day,
primary key `(gpu_id, start)`, BRIN on `start`), one transaction per batch, warm connection.
Measured: the same shape of rows as JSON pushes to `POST /api/v1/ingest`, one request per
batch, sequentially, each carrying its node's 8-GPU `gpus` block as the agent sends it: token
authentication (cached per process; the secret checked every time), the per-node throttle (one
Redis INCR), msgspec decoding and the per-sample checks, the GPUs the push names (one
prepared query: nothing about GPUs is cached), then
- 8 samples: one prepared statement in autocommit — the samples, first/last seen, the hour
  marks, the node row, and, checked in the write itself, each GPU's owner and the token's
  revocation;
- 1,000 samples: BEGIN, the token and the node's GPU rows checked (share-locked), binary COPY
  in a savepoint, one prepared statement (first/last seen, hour marks), the node row, COMMIT;

and the metrics counters (one Redis pipeline). Replays (duplicates) take the slower staging
path and are not measured here.

| batch (samples) | path | rows/s | ms per batch | ratio | ceiling | goal |
|---:|---|---:|---:|---:|---:|---:|
{table}

**Ceiling** is the best ratio a DRF view could reach on this machine if storing the rows cost
it no more than the reference: the reference's time per batch against that time plus a bare
Django request (a view that does nothing, `/healthz`, through the same server and middleware),
DRF's dispatch of a view that does nothing, the per-node throttle's one Redis round trip, and
decoding and checking the samples (which docs/ingest.md require and the reference skips). It
leaves out the rest that issue 4 and docs/ingest.md ask of a push (authentication, the metrics
counters, first/last seen, the hour marks), so the real bound is lower still. At 8 samples a
Django request that does nothing costs about as much as the reference's whole batch; at 1,000
samples decoding and checking alone cost more than the 25 % the goal leaves. Where the
ceiling is below the goal, no DRF view can meet the goal against this reference.

What the numbers mean for sizing: at {capacity_ms:.2f} ms per 8-GPU push ({capacity_words}),
one web process keeps up with about {capacity_nodes:,.0f} nodes ({8 * capacity_nodes:,.0f}
GPUs) pushing every 60 s, on a core it shares with PostgreSQL here (the goal of issues 19 and
22: ≥ 16,000 nodes).
{side_text}"""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    pattern = re.compile(r"^## Ingest\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(text.rstrip("\n") + "\n")


def _server_words(server: str) -> str:
    if server == "gunicorn":
        return "gunicorn (1 sync worker, loopback, a new connection per push)"
    return "Django's WSGI handler in-process"


def _pg_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return str(cursor.fetchone()[0]).split()[0]


if __name__ == "__main__":
    main()
