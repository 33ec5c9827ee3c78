"""Fixtures for the reliability suite (issue 9): real servers on loopback and a TCP proxy that
stands in for a network cable, so a test can "stop" PostgreSQL or Redis for one server process
without touching the machine's shared services.

- :class:`TcpProxy` forwards 127.0.0.1:port → a target; ``cut()`` closes every connection and
  refuses new ones (what a stopped service or a pulled cable looks like to a client),
  ``restore()`` listens again on the same port; ``hold()`` forwards requests but keeps the
  answers back (a client killed while its request is in flight).
- :class:`Gunicorn` runs the real WSGI app (``config.wsgi``) in a subprocess against the test
  database, on a fixed port, so a test can stop and restart it.
- :func:`push_body` builds a docs/ingest.md push; :func:`post` sends one with the stdlib only.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(settings.BASE_DIR)
INGEST = "/api/v1/ingest"
LOOPBACK = "127.0.0.1"


# --- small helpers ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def db_url_for_test(host: str | None = None, port: int | None = None) -> str:
    """The URL of the database this test runs on (pytest-django's test database)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    host = host or s["HOST"] or LOOPBACK
    port = port or int(s["PORT"] or 5432)
    return f"postgres://{auth}@{host}:{port}/{s['NAME']}"


def database_address() -> tuple[str, int]:
    s = connection.settings_dict
    return (s["HOST"] or LOOPBACK), int(s["PORT"] or 5432)


def iso(moment: dt.datetime | float) -> str:
    if not isinstance(moment, dt.datetime):
        moment = dt.datetime.fromtimestamp(moment, dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def recent_minute(minutes_ago: int = 5) -> dt.datetime:
    """A whole minute ``minutes_ago`` before now (UTC), whose 60 s interval is in the past."""
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    return now - dt.timedelta(minutes=minutes_ago)


MEMORY = 85_899_345_920


def gpu_block(uuid: str, index: int = 0, memory: int | None = MEMORY) -> dict[str, Any]:
    block: dict[str, Any] = {"uuid": uuid, "index": index, "name": "NVIDIA H100 80GB HBM3"}
    if memory is not None:
        block["memory_total_bytes"] = memory
    return block


def good_sample(uuid: str, start: dt.datetime, **fields: Any) -> dict[str, Any]:
    sample: dict[str, Any] = {
        "gpu": uuid,
        "start": iso(start),
        "seconds": 60,
        "util_pct": 73.5,
        "mem_util_pct": 41.0,
        "mem_used_bytes": 61_000_000_000,
        "procs": 1,
        "power_w": 512.3,
        "energy_j": 30738.0,
        "temp_c": 68,
        "sm_clock_mhz": 1980,
        "throttle_s": {"power_cap": 0, "thermal": 0, "hw_slowdown": 0, "other": 0},
    }
    sample.update(fields)
    return sample


def push_body(
    samples: list[dict[str, Any]], gpus: list[dict[str, Any]] | None = None, hostname: str = "n"
) -> dict[str, Any]:
    return {
        "node": {"hostname": hostname, "agent_version": "1.0.0", "driver_version": "550.54.15"},
        "gpus": gpus or [],
        "samples": samples,
    }


def post(url: str, token: str | None, body: bytes, timeout: float = 10.0) -> tuple[int, Any]:
    """POST ``body`` as JSON with the stdlib → (status, decoded JSON or text); 0 = no answer."""
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            status, data = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, data = exc.code, exc.read()
    except OSError:
        return 0, None
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode("utf-8", "replace")


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


# --- a TCP proxy: the "cable" between a process and a service ---------------------------------
class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target`` in threads.

    ``cut()``: every open connection is reset and the port refuses new ones, as when the
    service stops. ``restore()``: the same port accepts again. ``hold()``: requests still
    reach the target, but its answers are kept back until ``release()`` (``held`` is set when
    the first answer is being kept). ``answers`` holds every byte the target sent back.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._holding = threading.Event()
        self.held = threading.Event()
        self._release = threading.Event()
        # Set from the first instant of a cut: nothing more is forwarded on any connection, so
        # a client that grabs another open connection while the others are being reset gets no
        # answer on it either (a stopped service answers nothing).
        self._dead = threading.Event()
        self.answers = bytearray()
        self.connections = 0
        self.restore()

    @property
    def address(self) -> tuple[str, int]:
        return LOOPBACK, self.port

    def restore(self) -> None:
        self._dead.clear()
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        self._dead.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            self._refusing_wait()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                # RST rather than FIN: the client sees the connection die, as with a crash.
                conn.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                conn.close()
            except OSError:
                pass

    def _refusing_wait(self) -> None:
        """Until the port refuses connections. A listener closed while another thread is
        blocked in its accept() stays open in the kernel until that accept returns: a client
        reconnecting within milliseconds of a cut (a Celery worker does) was accepted, then
        closed, and took that for a working broker. Connecting wakes the accept (the thread
        sees the cut and drops the connection), after which the port refuses."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=1):
                    pass
            except OSError:
                return
            time.sleep(0.01)
        raise AssertionError(f"port {self.port} still accepts connections after the cut")

    def hold(self) -> None:
        self.held.clear()
        self._release.clear()
        self._holding.set()

    def release(self) -> None:
        self._holding.clear()
        self._release.set()

    def close(self) -> None:
        self.release()
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answer: bool) -> None:
        try:
            while True:
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready:
                    if src.fileno() < 0:
                        return
                    continue
                data = src.recv(65536)
                if not data:
                    break
                if answer:
                    with self._lock:
                        self.answers += data
                    if self._holding.is_set():
                        self.held.set()
                        self._release.wait(timeout=60)
                if self._dead.is_set():
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
            src.close()
            dst.close()


@pytest.fixture
def proxy() -> Iterator[Callable[[tuple[str, int]], TcpProxy]]:
    made: list[TcpProxy] = []

    def make(target: tuple[str, int]) -> TcpProxy:
        p = TcpProxy(target)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


# --- gunicorn ---------------------------------------------------------------------------------
def process_group_stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a server or worker started in its own process group: SIGTERM (a clean shutdown),
    SIGKILL after 15 s. Its children go with it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class Gunicorn:
    """The real WSGI app in gunicorn on 127.0.0.1:``port``; ``stop()``/``start()`` keep the port."""

    def __init__(self, env: dict[str, str], log: Path, workers: int = 1, threads: int = 2) -> None:
        self.port = free_port()
        self.env = env
        self.log = log
        self.workers = workers
        self.threads = threads
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "--bind",
                f"{LOOPBACK}:{self.port}",
                "--workers",
                str(self.workers),
                "--threads",
                str(self.threads),
                "--timeout",
                "60",
                "--graceful-timeout",
                "5",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"gunicorn exited:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:  # noqa: S310
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"gunicorn did not come up:\n{self.output()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            process_group_stop(self.proc)
        self.proc = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def server_env(*, database_url: str, redis_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a server or worker process started by a test."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL")}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=database_url,
        GPUFLEET_VAR_DIR=str(settings.VAR_DIR),
        LOG_LEVEL="WARNING",
        # Fail fast when the "cable" is cut, rather than after the 3 s default.
        DATABASE_CONNECT_TIMEOUT="2",
        **extra,
    )
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator[Callable[..., Gunicorn]]:
    """``gunicorn(database_url=…, redis_url=…)`` → a started server; stopped afterwards."""
    made: list[Gunicorn] = []

    def make(
        *, database_url: str | None = None, redis_url: str | None = None, **extra: str
    ) -> Gunicorn:
        env = server_env(
            database_url=database_url or db_url_for_test(), redis_url=redis_url, **extra
        )
        server = Gunicorn(env, tmp_path / f"gunicorn{len(made)}.log")
        made.append(server)
        server.start()
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def pg(postgres: None, transactional_db: Any) -> None:
    """PostgreSQL with committed data: other processes (gunicorn, workers) see the test's rows."""
