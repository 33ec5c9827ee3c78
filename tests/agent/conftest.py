"""Fixtures for the agent tests: a tiny real ingest server on 127.0.0.1, in a thread."""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from . import procfs as pf


class IngestServer:
    """Records every POST to /api/v1/ingest. ``mode`` decides the answer:

    ``ok`` (200 with accepted / duplicates / rejected, deduplicating on (gpu, start) like the
    real server, and 400 with the same body when every sample was rejected), a status such as
    ``500``, ``429``, ``400`` (a whole-request error naming ``samples``), ``hold`` (record the
    batch, then block until ``release`` is set and answer 200; the client never sees it if it
    dies first). ``down()`` closes the listening socket (connection refused), ``up()`` opens it
    again on the same port. ``script`` is a list of statuses used one per request before
    falling back to ``mode``.

    Like telemetry/ingest.py: with ``strict_gpus`` a sample of a GPU that no push's ``gpus``
    block has listed yet is rejected ("unknown GPU"); ``reject`` maps (gpu, start) to the
    (field, error) it is rejected with; a push holding a ``poison`` sample is refused whole
    (400 naming ``body``); ``block_error`` refuses every push whole, naming that field.
    """

    def __init__(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.mode = "ok"
        self.script: list[int] = []
        self.retry_after: str | None = None
        self.max_samples: int | None = None  # answer 413 above this
        self.reject: dict[tuple[str, str], tuple[str, str]] = {}  # (gpu, start) → field, error
        self.strict_gpus = False
        self.gpus: dict[str, dict[str, Any]] = {}  # uuid → its latest gpus-block entry
        self.poison: set[tuple[str, str]] = set()
        self.block_error: str | None = None
        self.hold_after: int | None = None  # hold the request after this many 200s
        self.token = "node-token"
        self.lock = threading.Lock()
        self.requests: list[tuple[int, dict[str, Any]]] = []  # (status answered, payload)
        self.stored: Counter[tuple[str, str]] = Counter()  # (gpu, start) → times stored
        self.received: Counter[tuple[str, str]] = Counter()  # (gpu, start) → times posted
        self.held = threading.Event()
        self.release = threading.Event()
        self.httpd: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(n))
                status, body, headers = owner.answer(self.headers, self.path, payload)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client is gone (killed while we held its batch)

        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def down(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def answer(
        self, headers: Any, path: str, payload: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        samples = payload.get("samples", [])
        keys = [(s["gpu"], s["start"]) for s in samples]
        with self.lock:
            for k in keys:
                self.received[k] += 1
            if path != "/api/v1/ingest":
                status = 404
            elif headers.get("Authorization") != f"Bearer {self.token}":
                status = 401
            elif self.script:
                status = self.script.pop(0)
            elif self.max_samples is not None and len(samples) > self.max_samples:
                status = 413
            elif self.mode == "hold":
                status = -1
            elif self.hold_after is not None and len(self.ok_payloads()) >= self.hold_after:
                self.hold_after = None
                status = -1
            elif self.block_error is not None or self.poison & set(keys):
                field = self.block_error or "body"
                self.requests.append((400, payload))
                return 400, {"detail": f"{field}: bad", "field": field, "error": "bad"}, {}
            else:
                status = 200 if self.mode == "ok" else int(self.mode)
        held = status == -1
        if held:
            with self.lock:
                self.requests.append((-1, payload))
            self.held.set()
            self.release.wait(timeout=30)
            status = 200
        if status != 200:
            with self.lock:
                self.requests.append((status, payload))
            hdrs = {"Retry-After": self.retry_after} if status == 429 and self.retry_after else {}
            return status, {"detail": f"status {status}", "field": "samples"}, hdrs
        accepted = duplicates = 0
        rejected = []
        with self.lock:
            for g in payload.get("gpus", []):
                self.gpus[g["uuid"]] = g
            for i, k in enumerate(keys):
                if k in self.reject:
                    field, error = self.reject[k]
                    rejected.append({"index": i, "field": field, "error": error})
                elif self.strict_gpus and k[0] not in self.gpus:
                    error = "unknown GPU: list it in the push's gpus block"
                    rejected.append({"index": i, "field": "gpu", "error": error})
                elif self.stored[k]:
                    duplicates += 1
                else:
                    self.stored[k] += 1
                    accepted += 1
            status = 400 if rejected and not accepted and not duplicates else 200
            if not held:
                self.requests.append((status, payload))
        body = {"accepted": accepted, "duplicates": duplicates, "rejected": rejected}
        return status, body, {}

    def ok_payloads(self) -> list[dict[str, Any]]:
        return [p for s, p in self.requests if s == 200]


@pytest.fixture
def ingest() -> Iterator[IngestServer]:
    srv = IngestServer()
    srv.up()
    yield srv
    srv.release.set()
    srv.down()


# A fake /proc and kubelet pod-log tree per test (tests/agent/procfs.py).
@pytest.fixture
def proc(tmp_path: Path) -> pf.FakeProc:
    return pf.FakeProc(tmp_path / "proc")


@pytest.fixture
def pods(tmp_path: Path) -> pf.FakePodLogs:
    return pf.FakePodLogs(tmp_path / "pods")
