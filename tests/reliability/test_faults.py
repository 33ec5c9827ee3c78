"""The faults of docs/reliability.md,
end to end against real services, with nothing lost and nothing doubled.

The failures are real, not mocked: the gunicorn process is stopped and started again; the
agent process is killed with SIGKILL; PostgreSQL and Redis "stop" for the server process by a
TCP proxy in the test cutting every connection and refusing new ones (the machine's shared
PostgreSQL and Redis keep running for everybody else). What is stored is compared with what
the agent produced and with ``simulate`` (the closed-form fake fleet) for the same time range.

A worker killed mid-rollup and two rollups at once are covered with a real Celery worker by
tests/telemetry/test_rollup_celery.py; they are not repeated here.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from config.celery import worker_argv
from config.watchdog import EXIT_STUCK
from fleet.services import node_token_issue
from telemetry.agent.agent import Agent
from telemetry.agent.clock import VirtualClock
from telemetry.agent.fake import FakeFleet, simulate
from telemetry.models import HourlyUsage, RollupPending, Sample
from telemetry.pending import hours_mark
from telemetry.rollup import rollup_run
from tests.reliability.conftest import (
    INGEST,
    ROOT,
    Gunicorn,
    TcpProxy,
    database_address,
    db_url_for_test,
    post,
    process_group_stop,
    server_env,
    wait_for,
)

HOUR = 3600
THROTTLE_COLUMNS = {
    "power_cap": "throttle_power_cap_s",
    "thermal": "throttle_thermal_s",
    "hw_slowdown": "throttle_hw_slowdown_s",
    "other": "throttle_other_s",
    "any": "throttle_any_s",
}
VALUE_FIELDS = (
    "seconds",
    "util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "procs",
    "power_w",
    "energy_j",
    "temp_c",
    "sm_clock_mhz",
    "active_s",
    "sm_active",
)
ROLLUP_FIELDS = (
    "node_id",
    "pool_id",
    "team_id",
    "site_id",
    "samples",
    "observed_s",
    "air_s",
    "held_s",
    "parked_s",
    "energy_j",
    "idle_energy_j",
    "idle_s",
    "power_w_max",
    "temp_c_max",
    "throttle_power_cap_s",
    "throttle_thermal_s",
    "throttle_hw_slowdown_s",
    "throttle_other_s",
    "throttle_any_s",
    "sm_active_s",
    "sm_observed_s",
)


# --- what is stored, what should be -----------------------------------------------------------
def _key(uuid: str, start: Any) -> tuple[str, int]:
    if isinstance(start, str):
        start = dt.datetime.fromisoformat(start.replace("Z", "+00:00"))
    return uuid, int(start.timestamp())


def stored_samples() -> dict[tuple[str, int], dict[str, Any]]:
    """Every raw sample in the database as the wire's fields, keyed by (GPU UUID, start)."""
    out = {}
    for row in Sample.objects.select_related("gpu"):
        d = {f: getattr(row, f) for f in VALUE_FIELDS}
        d["throttle_s"] = {k: getattr(row, c) for k, c in THROTTLE_COLUMNS.items()}
        out[_key(row.gpu.uuid, row.start)] = d
    return out


def wire(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample as sent, in the shape of :func:`stored_samples` (absent fields → None)."""
    d = {f: sample.get(f) for f in VALUE_FIELDS}
    throttle = sample.get("throttle_s") or {}
    d["throttle_s"] = {k: throttle.get(k) for k in THROTTLE_COLUMNS}
    return d


def simulated(
    fleet: FakeFleet, start: float, end: float, interval_s: int
) -> dict[tuple[str, int], dict[str, Any]]:
    out = {}
    for _host, payload in simulate(
        fleet,
        start=dt.datetime.fromtimestamp(start, dt.UTC),
        end=dt.datetime.fromtimestamp(end, dt.UTC),
        interval_s=interval_s,
        batch_intervals=60,
    ):
        for s in payload["samples"]:
            out[_key(s["gpu"], s["start"])] = wire(s)
    return out


def assert_same(
    stored: dict[Any, dict[str, Any]],
    expected: dict[Any, dict[str, Any]],
    *,
    energy_rel: float = 0.0,
) -> None:
    wrong = []
    for key, want in expected.items():
        got = stored.get(key)
        if got is None:
            wrong.append(f"{key}: missing")
            continue
        for field, value in want.items():
            have = got[field]
            if field == "energy_j" and energy_rel and value is not None and have is not None:
                if not math.isclose(have, value, rel_tol=energy_rel):
                    wrong.append(f"{key}.{field}: {have} != {value}")
            elif have != value and not (
                isinstance(value, float)
                and have is not None
                and math.isclose(have, value, rel_tol=1e-12)
            ):
                wrong.append(f"{key}.{field}: {have!r} != {value!r}")
    assert not wrong, f"{len(wrong)} differences, first: {wrong[:10]}"


def rollups() -> dict[tuple[int, dt.datetime], tuple[Any, ...]]:
    return {
        (r["gpu_id"], r["hour"]): tuple(
            round(r[f], 6) if isinstance(r[f], float) else r[f] for f in ROLLUP_FIELDS
        )
        for r in HourlyUsage.objects.values("gpu_id", "hour", *ROLLUP_FIELDS)
    }


def clean_rollups() -> dict[tuple[int, dt.datetime], tuple[Any, ...]]:
    """The rows one clean run computes from the stored samples (the current rows are kept)."""
    from django.db import transaction

    before = rollups()
    with transaction.atomic():
        sid = transaction.savepoint()
        HourlyUsage.objects.all().delete()
        RollupPending.objects.all().delete()
        hours = {
            s.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
            for s in Sample.objects.values_list("start", flat=True)
        }
        hours_mark(hours)
        rollup_run()
        clean = rollups()
        transaction.savepoint_rollback(sid)
    assert rollups() == before
    return clean


def _hour_floor(t: float) -> int:
    return int(t // HOUR * HOUR)


# --- an agent on a simulated clock, in this process -------------------------------------------
class SimAgent:
    """The real agent (sampling, summaries, spool, delivery over HTTP) on a VirtualClock that
    the test moves second by second, so an hour passes in about a second."""

    def __init__(
        self,
        fleet: FakeFleet,
        server: str,
        token: str,
        spool: Path,
        start: int,
        interval_s: int = 60,
    ) -> None:
        self.clock = VirtualClock(start - 1)
        self.host = fleet.nodes[0]
        self.agent = Agent(
            fleet.backend(self.host, self.clock.time),
            spool_dir=str(spool),
            server=server,
            token=token,
            interval_s=interval_s,
            hostname=self.host,
            clock=self.clock,
            rng=random.Random(7),
            max_batch=500,
        )
        assert self.agent.delivery is not None
        self.delivery = self.agent.delivery
        self.delivery.timeout_s = 10.0
        self.produced: dict[tuple[str, int], dict[str, Any]] = {}
        self.outcomes: list[str] = []
        self.t = start - 1
        self._tick()

    def _tick(self) -> None:
        self.clock.set(self.t)
        for s in self.agent.tick(self.t):
            key = _key(s["gpu"], s["start"])
            assert key not in self.produced
            self.produced[key] = wire(s)

    def run_until(self, end: int, *, deliver_every: int = 60) -> None:
        while self.t < end:
            self.t += 1
            self._tick()
            if self.t % deliver_every == 7:
                self.outcomes.append(self.delivery.step(float(self.t)))

    def drain(self) -> None:
        self.delivery.next_attempt = 0.0
        assert self.delivery.drain(lambda: float(self.t)) == "idle"
        assert self.delivery.spool.pending() == 0

    def close(self) -> None:
        self.agent.close()


def _window() -> int:
    """A simulated start: a whole hour, 3 hours ago (well inside retention, wholly past)."""
    return _hour_floor(time.time()) - 3 * HOUR


SPEC = "nodes=1,gpus=4,model=H100,pattern=mixed"


@pytest.mark.slow
def test_server_down_for_an_hour_then_back(
    pg: None, gunicorn: Callable[..., Gunicorn], tmp_path: Path
) -> None:
    """Up for 5 simulated minutes, the server process stopped for an hour, then started again:
    the agent spooled the hour and delivered it once; the database holds exactly what the
    agent produced, which is what ``simulate`` computes for the same fleet and time range."""
    start = _window()
    fleet = FakeFleet(SPEC, seed=0, epoch=start - HOUR)
    _, token = node_token_issue(hostname=fleet.nodes[0])
    server = gunicorn()
    agent = SimAgent(fleet, server.url, token, tmp_path / "spool", start)
    try:
        # Deliveries happen at second 7 of each minute: +10 s lets the last one go out.
        agent.run_until(start + 5 * 60 + 10)
        assert agent.outcomes.count("sent") >= 4
        stored_early = Sample.objects.count()
        assert stored_early == len(agent.produced)

        server.stop()
        before = len(agent.outcomes)
        agent.run_until(start + 65 * 60 + 10)
        assert set(agent.outcomes[before:]) <= {"retry", "wait"}
        assert 0 in agent.delivery.stats.statuses  # really unreachable
        assert agent.delivery.spool.pending() == 60 * 4  # the hour, spooled
        assert Sample.objects.count() == stored_early

        server.start()
        agent.run_until(start + 75 * 60)
        agent.drain()
    finally:
        agent.close()

    stored = stored_samples()
    assert set(stored) == set(agent.produced)  # everything produced, once (the key is unique)
    assert_same(stored, agent.produced)
    full = simulated(FakeFleet(SPEC, seed=0, epoch=start - HOUR), start, start + 75 * 60, 60)
    assert len(full) == 75 * 4
    assert_same(stored, full)
    # The only samples outside the window are the partial interval before it (the agent
    # started just before ``start``), with the seconds it observed, and the last one after.
    extra = set(stored) - set(full)
    assert all(k[1] < start or k[1] >= start + 75 * 60 for k in extra)
    assert all(stored[k]["seconds"] < 60 for k in extra if k[1] < start)


def _agent_cli(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "telemetry.agent.cli"],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _spool_keys(spool: Path) -> set[tuple[str, int]]:
    db = sqlite3.connect(str(spool / "spool.sqlite3"))
    try:
        return {_key(g, s) for g, s in db.execute("SELECT gpu, start FROM samples")}
    finally:
        db.close()


@pytest.mark.slow
def test_agent_killed_mid_send_and_restarted(
    pg: None, gunicorn: Callable[..., Gunicorn], proxy: Callable[..., TcpProxy], tmp_path: Path
) -> None:
    """The real agent process (``--fake``, a sped-up simulated clock) is SIGKILLed while a push
    is in flight: the server has stored the batch, the agent never saw the answer. Restarted
    on the same spool it sends that batch again; the server counts it as duplicates. Nothing
    it had produced is lost, nothing is stored twice, and every full interval stored is what
    ``simulate`` computes."""
    spec = "nodes=1,gpus=2,model=A100,pattern=training|inference"
    interval = 10
    speed = 30
    # An anchor in the future: the sped-up clock then runs from ~5 h ago towards the anchor,
    # always in the past of the server's clock (ScaledClock: anchor + (now - anchor) × speed).
    anchor = time.time() + 600
    fleet = FakeFleet(spec, seed=0, epoch=anchor)
    host = fleet.nodes[0]
    _, token = node_token_issue(hostname=host)
    server = gunicorn()
    cable = proxy(("127.0.0.1", server.port))
    spool = tmp_path / "spool"
    env = {
        **os.environ,
        "GPUFLEET_SERVER": f"http://127.0.0.1:{cable.port}",
        "GPUFLEET_TOKEN": token,
        "GPUFLEET_SPOOL": str(spool),
        "GPUFLEET_INTERVAL": str(interval),
        "GPUFLEET_FAKE": spec,
        "GPUFLEET_FAKE_SPEED": str(speed),
        "GPUFLEET_FAKE_EPOCH": str(anchor),
        "GPUFLEET_HOSTNAME": host,
    }
    log = tmp_path / "agent.log"
    agent = _agent_cli(env, log)
    try:
        wait_for(lambda: Sample.objects.count() >= 12, "the first pushes", timeout=40)
        cable.hold()
        wait_for(cable.held.is_set, "a push in flight", timeout=20)
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
        cable.release()
        # What the killed agent had produced: stored, or still in its spool.
        in_db_at_kill = set(stored_samples())
        in_spool_at_kill = _spool_keys(spool)
        assert in_spool_at_kill & in_db_at_kill  # the batch in flight: stored, not acknowledged
        before_kill = in_db_at_kill | in_spool_at_kill

        answers_before = len(cable.answers)
        agent = _agent_cli(env, log)
        wait_for(
            lambda: Sample.objects.count() >= len(before_kill) + 12,
            "pushes after restart",
            timeout=40,
        )
        os.killpg(agent.pid, signal.SIGTERM)  # a clean stop: flush, one last push
        assert agent.wait(timeout=30) == 0
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(timeout=10)

    assert _spool_keys(spool) == set()
    stored = stored_samples()
    assert before_kill <= set(stored)  # nothing lost
    duplicates = [
        int(n) for n in re.findall(rb'"duplicates":(\d+)', bytes(cable.answers[answers_before:]))
    ]
    assert sum(duplicates) >= 1  # the in-flight batch came again and changed nothing
    full = {k: v for k, v in stored.items() if v["seconds"] == interval}
    assert len(full) >= 16
    lo = min(k[1] for k in full)
    hi = max(k[1] for k in full) + interval
    expected = simulated(FakeFleet(spec, seed=0, epoch=anchor), lo, hi, interval)
    # A tick skipped under load (logged) gives the next second no energy baseline: compare
    # energy to 1 % then; every other field exactly.
    skipped = "skipped" in log.read_text(errors="replace")
    assert_same(full, {k: expected[k] for k in full}, energy_rel=0.01 if skipped else 1e-9)


@pytest.mark.slow
def test_postgres_down_during_ingest(
    pg: None, gunicorn: Callable[..., Gunicorn], proxy: Callable[..., TcpProxy], tmp_path: Path
) -> None:
    """The server's PostgreSQL connection is cut (and refused) for 20 simulated minutes:
    ingest answers 503 with Retry-After at once, the agent keeps its samples and retries, and
    after PostgreSQL is back everything is stored, once."""
    cable = proxy(database_address())
    server = gunicorn(database_url=db_url_for_test(host="127.0.0.1", port=cable.port))
    start = _window()
    fleet = FakeFleet(SPEC, seed=0, epoch=start - HOUR)
    _, token = node_token_issue(hostname=fleet.nodes[0])
    agent = SimAgent(fleet, server.url, token, tmp_path / "spool", start)
    try:
        agent.run_until(start + 5 * 60 + 10)
        assert Sample.objects.count() == len(agent.produced)

        cable.cut()
        began = time.monotonic()
        status, body = post(f"{server.url}{INGEST}", token, b'{"samples": []}')
        elapsed = time.monotonic() - began
        assert status == 503, body
        assert "database" in body["detail"]
        assert elapsed < 3.0  # fast: connection refused, not a hang
        agent.run_until(start + 25 * 60)
        assert agent.delivery.stats.statuses.get(503, 0) >= 1
        assert agent.delivery.spool.pending() >= 15 * 4

        cable.restore()
        agent.run_until(start + 35 * 60)
        agent.drain()
    finally:
        agent.close()
    stored = stored_samples()
    assert set(stored) == set(agent.produced)
    full = simulated(FakeFleet(SPEC, seed=0, epoch=start - HOUR), start, start + 35 * 60, 60)
    assert_same(stored, full)


@pytest.mark.slow
def test_redis_down_ingest_works_and_rollups_catch_up(
    pg: None,
    redis_url: str,
    gunicorn: Callable[..., Gunicorn],
    proxy: Callable[..., TcpProxy],
    tmp_path: Path,
) -> None:
    """Redis (cache, throttle, broker) cut for the server and a real Celery worker: ingest
    still answers 200 quickly and stores; once Redis is back, the periodic rollup task (sent
    as beat sends it) reaches the worker and the rollups equal a clean recomputation."""
    from urllib.parse import urlsplit

    import redis
    from celery import Celery

    parts = urlsplit(redis_url)
    cable = proxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    via_cable = f"redis://127.0.0.1:{cable.port}{parts.path or '/0'}"
    server = gunicorn(redis_url=via_cable)
    queue = f"h9-rollup-{uuidlib.uuid4().hex[:8]}"
    env = server_env(
        database_url=db_url_for_test(), redis_url=via_cable, CELERY_BROKER_URL=via_cable
    )
    worker_log = tmp_path / "worker.log"
    # As systemd and compose do: a worker that exits is started again. The watchdog
    # (config/watchdog.py) makes a worker that lost its consumer in the blip exit.
    env.update(WORKER_STUCK_AFTER_S="5", WORKER_WATCHDOG_INTERVAL_S="1")

    def start_worker() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            worker_argv(queue=queue, name=f"{queue}@%h"),
            cwd=ROOT,
            env=env,
            stdout=worker_log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    worker = start_worker()
    sender = Celery("h9-sender", broker=via_cable)
    try:
        wait_for(lambda: "ready." in worker_log.read_text(errors="replace"), "worker ready", 60)
        start = _window()
        fleet = FakeFleet(SPEC, seed=0, epoch=start - HOUR)
        _, token = node_token_issue(hostname=fleet.nodes[0])

        cable.cut()
        payloads = list(
            simulate(
                fleet,
                start=dt.datetime.fromtimestamp(start, dt.UTC),
                end=dt.datetime.fromtimestamp(start + 2 * HOUR, dt.UTC),
                interval_s=60,
                batch_intervals=10,
            )
        )
        slowest = 0.0
        for _host, payload in payloads:
            began = time.monotonic()
            status, body = post(f"{server.url}{INGEST}", token, json.dumps(payload).encode())
            slowest = max(slowest, time.monotonic() - began)
            assert status == 200, body
            assert body["accepted"] == len(payload["samples"])
        assert slowest < 3.0
        assert Sample.objects.count() == 2 * 60 * 4
        assert RollupPending.objects.count() == 2  # hours marked, waiting for the broker
        assert not HourlyUsage.objects.exists()

        cable.restore()
        # As beat does (config/celery.py: every 60 s, expiring before the next), in
        # compressed time. A message the consumer took off the queue in the blip and never
        # ran would wait in kombu's unacked set for its visibility timeout (an hour): the
        # watchdog puts it back and restarts the worker (tests/reliability/
        # test_watchdog_unacked.py makes that loss happen every time).
        beat_every = 10.0
        sent_at = -beat_every

        def rolled_up() -> bool:
            nonlocal worker, sent_at
            if worker.poll() == EXIT_STUCK:  # the supervisor's part
                worker = start_worker()
            if time.monotonic() - sent_at >= beat_every:
                sender.send_task("telemetry.tasks.rollup_task", queue=queue, expires=beat_every - 1)
                sent_at = time.monotonic()
            return not RollupPending.objects.exists() and HourlyUsage.objects.count() == 8

        # Within a minute of Redis's return, the worker's reconnect backoff and a restart
        # by its watchdog included (a bound on the wait, not a performance figure).
        wait_for(rolled_up, "the rollup after Redis returned", timeout=60)
        assert rollups() == clean_rollups()
    finally:
        process_group_stop(worker)
        sender.close()
        client = redis.Redis.from_url(redis_url)
        client.delete(queue, f"_kombu.binding.{queue}")


@pytest.mark.slow
def test_replayed_week_changes_nothing(db: Any, postgres: None) -> None:
    """A week of one node's pushes, then the same week again (an agent restored from a backup
    of its spool): every replayed sample is a duplicate, nothing is re-marked, and the rollups
    are those of one clean run."""
    start = _hour_floor(time.time()) - 8 * 24 * HOUR
    end = start + 7 * 24 * HOUR
    fleet = FakeFleet(SPEC, seed=3, epoch=start)
    _, token = node_token_issue(hostname=fleet.nodes[0])
    payloads = [
        json.dumps(p).encode()
        for _h, p in simulate(
            fleet,
            start=dt.datetime.fromtimestamp(start, dt.UTC),
            end=dt.datetime.fromtimestamp(end, dt.UTC),
            interval_s=300,
            batch_intervals=24,
        )
    ]
    client = Client()
    sent = 0
    for body in payloads:
        r = client.post(
            INGEST, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
        assert r.status_code == 200
        assert r.json()["duplicates"] == 0 and not r.json()["rejected"]
        sent += r.json()["accepted"]
    assert sent == 7 * 24 * 12 * 4 == Sample.objects.count()
    rollup_run()
    first = rollups()
    assert len(first) == 7 * 24 * 4
    samples_before = stored_samples()

    for body in payloads:
        r = client.post(
            INGEST, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
        assert r.status_code == 200
        answer = r.json()
        assert answer["accepted"] == 0 and not answer["rejected"]
        assert answer["duplicates"] == len(json.loads(body)["samples"])
    assert not RollupPending.objects.exists()  # duplicates mark no hour
    assert rollup_run().hours == 0
    assert stored_samples() == samples_before
    assert rollups() == first == clean_rollups()
