"""Spool and delivery against a real HTTP server on 127.0.0.1, on a simulated clock."""

from __future__ import annotations

import logging
import random
import re
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest

from telemetry.agent.agent import SPOOL_FILE, Agent
from telemetry.agent.client import Delivery, ingest_url
from telemetry.agent.clock import VirtualClock
from telemetry.agent.fake import FakeFleet, simulate
from telemetry.agent.spool import Spool

T0 = 1796029200  # 2026-11-30T09:00:00Z
SPEC = "nodes=1,gpus=2,model=H100,pattern=training"


def sample(i: int, gpu: str = "GPU-a") -> dict[str, Any]:
    t = datetime.fromtimestamp(T0 + 60 * i, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"gpu": gpu, "start": t, "seconds": 60, "util_pct": float(i % 100)}


def delivery(spool: Spool, srv: Any, **kw: Any) -> Delivery:
    return Delivery(
        spool,
        url=ingest_url(srv.url),
        token=srv.token,
        node=lambda: {"hostname": "gpu-test-01", "agent_version": "1.0.0"},
        gpus=lambda: [{"uuid": "GPU-a", "index": 0, "name": "NVIDIA H100 80GB HBM3"}],
        rng=random.Random(1),
        **kw,
    )


def queued(tmp_path: Any, srv: Any, n: int, **kw: Any) -> tuple[Spool, Delivery]:
    """A spool holding samples 0 … n-1 of GPU-a, and a delivery of it to ``srv``."""
    sp = Spool(str(tmp_path / SPOOL_FILE))
    sp.add([sample(i) for i in range(n)])
    return sp, delivery(sp, srv, **kw)


def spooling_agent(
    api: Any, tmp_path: Any, srv: Any, clock: VirtualClock, host: str, *, token: str, seed: int
) -> Agent:
    """The real agent on ``api``, spooling in ``tmp_path`` and delivering to ``srv``."""
    agent = Agent(
        api,
        spool_dir=str(tmp_path),
        server=srv.url,
        token=token,
        hostname=host,
        clock=clock,
        rng=random.Random(seed),
    )
    assert agent.delivery is not None
    return agent


def keys(payloads: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["gpu"], s["start"]) for p in payloads for s in p["samples"]]


def test_server_down_for_a_simulated_hour_then_everything_once(tmp_path: Any, ingest: Any) -> None:
    clock = VirtualClock(T0)
    fleet = FakeFleet(SPEC, seed=1, epoch=T0)
    host = fleet.nodes[0]
    agent = spooling_agent(
        fleet.backend(host, clock.time), tmp_path, ingest, clock, host, token=ingest.token, seed=3
    )
    assert agent.delivery is not None
    d = agent.delivery
    ingest.down()
    attempts: list[float] = []
    # one simulated hour with the server unreachable (connection refused), ticking and
    # letting delivery try whenever its backoff allows
    for t in range(T0 + 1, T0 + 3601):
        clock.set(t + 0.001)
        agent.tick(t)
        if d.step(clock.time()) == "retry":
            attempts.append(clock.time())
    assert not ingest.requests
    assert agent.spool is not None and agent.spool.pending() == 2 * 60
    # full jitter: each wait is below min(300 s, 2^(n-1) s), so the gaps never exceed 300 s,
    # and backoff keeps the number of attempts small
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert max(gaps) <= 301 and 10 <= len(attempts) <= 60
    ingest.up()
    for t in range(T0 + 3601, T0 + 3601 + 400):
        clock.set(t + 0.001)
        agent.tick(t)
        d.step(clock.time())
    # every interval of the hour (and the few minutes after) delivered exactly once …
    got = keys(ingest.ok_payloads())
    assert len(got) == len(set(got))
    assert agent.spool.pending() == 0
    # … and equal, sample for sample, to the closed-form simulator over the same hour
    expected = [
        s
        for _, p in simulate(
            FakeFleet(SPEC, seed=1, epoch=T0),
            start=datetime.fromtimestamp(T0, UTC),
            end=datetime.fromtimestamp(T0 + 3600 + 360, UTC),
        )
        for s in p["samples"]
    ]
    delivered = [s for p in ingest.ok_payloads() for s in p["samples"]]
    assert sorted(delivered, key=lambda s: (s["start"], s["gpu"])) == sorted(
        expected, key=lambda s: (s["start"], s["gpu"])
    )
    # oldest first
    starts = [s["start"] for s in delivered]
    assert starts == sorted(starts)
    p0 = ingest.ok_payloads()[0]
    assert p0["node"]["hostname"] == host and len(p0["gpus"]) == 2
    agent.close()


def test_500_and_429_back_off_with_full_jitter_and_retry_after(tmp_path: Any, ingest: Any) -> None:
    sp, d = queued(tmp_path, ingest, 3)
    ingest.script = [500, 500, 503, 500]
    now = 1000.0
    for n in range(1, 5):
        assert d.step(now) == "retry"
        wait = d.next_attempt - now
        assert 0 <= wait < min(300.0, 2.0 ** (n - 1))  # full jitter in [0, 2^(n-1))
        assert d.step(now + wait - 1e-6) == "wait" or wait < 1e-6
        now = d.next_attempt
    ingest.script = [429]
    ingest.retry_after = "120"
    assert d.step(now) == "retry"
    assert d.next_attempt - now >= 120.0  # Retry-After honoured
    now = d.next_attempt
    assert d.step(now) == "sent"
    assert d.failures == 0
    assert keys(ingest.ok_payloads()) == [("GPU-a", sample(i)["start"]) for i in range(3)]
    assert sp.pending() == 0
    assert d.step(now) == "idle"


def test_400_naming_the_samples_quarantines_only_the_bad_sample(
    tmp_path: Any, ingest: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE))
    sp.add([sample(i) for i in range(5)])
    # sample 2 makes the server refuse any push that holds it, as a whole (400 naming "body")
    ingest.poison = {("GPU-a", sample(2)["start"])}
    d = delivery(sp, ingest, max_batch=4)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        assert d.drain(lambda: 0.0) == "idle"
    # [0-3] refused; an empty push is taken (so the samples are to blame); halve: [0, 1] sent;
    # [2, 3] refused → [2] refused → quarantined alone; then [3, 4] sent
    sizes = [(status, len(p["samples"])) for status, p in ingest.requests]
    assert sizes == [(400, 4), (200, 0), (200, 2), (400, 2), (400, 1), (200, 2)]
    assert keys(ingest.ok_payloads()) == [("GPU-a", sample(i)["start"]) for i in (0, 1, 3, 4)]
    ((_, status, reason, n),) = sp.quarantined()
    assert (status, n) == (400, 1) and '"field": "body"' in reason
    assert sp.counter("quarantined_samples") == 1
    # the empty push did not carry a drop count or samples; the last push reports the quarantine
    assert ingest.ok_payloads()[-1]["node"]["quarantined_batches"] == 1
    assert any("quarantined" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("status", ["400", "409", "422"])
def test_4xx_that_does_not_blame_a_sample_keeps_the_batch(
    tmp_path: Any, ingest: Any, status: str
) -> None:
    sp, d = queued(tmp_path, ingest, 3)
    # 400 to every push, the empty one too (so the samples are not to blame), or a 4xx that
    # names no sample: nothing may be quarantined, the batch waits for a later attempt
    ingest.mode = status
    assert d.step(0.0) == "retry"
    assert sp.pending() == 3 and not sp.quarantined()
    assert [len(p["samples"]) for _, p in ingest.requests] == ([3, 0] if status == "400" else [3])
    ingest.mode = "ok"
    assert d.drain(lambda: d.next_attempt) == "idle"
    assert keys(ingest.ok_payloads()) == [("GPU-a", sample(i)["start"]) for i in range(3)]


def test_400_naming_the_gpu_block_keeps_the_batch(tmp_path: Any, ingest: Any) -> None:
    sp, d = queued(tmp_path, ingest, 3)
    ingest.block_error = "gpus[0].name"  # the agent's own block is what the server refuses
    assert d.step(0.0) == "retry"
    assert d.step(d.next_attempt) == "retry"
    assert sp.pending() == 3 and not sp.quarantined()
    ingest.block_error = None
    assert d.step(d.next_attempt) == "sent"
    assert keys(ingest.ok_payloads()) == [("GPU-a", sample(i)["start"]) for i in range(3)]


def test_rejects_a_later_push_can_fix_are_retried_the_rest_quarantined(
    tmp_path: Any, ingest: Any
) -> None:
    sp, d = queued(tmp_path, ingest, 4)
    k = [("GPU-a", sample(i)["start"]) for i in range(4)]
    ingest.reject = {
        k[1]: ("gpu", "unknown GPU: list it in the push's gpus block"),
        k[2]: ("util_pct", "must be a number within 0–100"),
        k[3]: ("start", "the interval ends more than 5 minutes ahead of the server"),
    }
    assert d.step(0.0) == "sent"
    assert ingest.stored == {k[0]: 1}
    # the unknown GPU and the clock can be fixed by a later push: 1 and 3 stay queued
    assert [s["start"] for s in sp.oldest(10).samples] == [k[1][1], k[3][1]]  # type: ignore[union-attr]
    # the out-of-range sample is refused for good: kept aside with the server's reason
    ((_, status, reason, n),) = sp.quarantined()
    assert (status, n) == (200, 1) and '"field":"util_pct"' in reason
    assert d.failures == 1  # a backoff before they go again
    ingest.reject = {}
    assert d.drain(lambda: d.next_attempt) == "idle"
    assert ingest.stored == {k[0]: 1, k[1]: 1, k[3]: 1}
    assert d.failures == 0


def test_every_sample_rejected_for_the_gpu_is_retried_not_quarantined(
    tmp_path: Any, ingest: Any
) -> None:
    sp, d = queued(tmp_path, ingest, 3)
    ingest.reject = {("GPU-a", sample(i)["start"]): ("gpu", "unknown GPU: …") for i in range(3)}
    assert d.step(0.0) == "retry"
    assert ingest.requests[0][0] == 400  # the real server's answer when nothing was taken
    assert sp.pending() == 3 and not sp.quarantined()
    ingest.reject = {}
    assert d.step(d.next_attempt) == "sent" and sp.pending() == 0


def backlog_then_restart(
    tmp_path: Any, ingest: Any, fleet: FakeFleet, phase2_gpus: list[Any] | None = None
) -> tuple[Agent, VirtualClock, set[tuple[str, str]]]:
    """Phase 1: an agent with a wrong token spools three minutes of both GPUs (401 after
    401), then stops. Returns phase 2: a new agent on the same spool with the right token
    (the documented fix), not ticked yet, its clock at the restart; and the spooled keys."""
    host = fleet.nodes[0]
    clock = VirtualClock(T0)
    first = spooling_agent(
        fleet.backend(host, clock.time), tmp_path, ingest, clock, host, token="wrong", seed=3
    )
    assert first.delivery is not None
    for t in range(T0 + 1, T0 + 181):
        clock.set(t + 0.001)
        first.tick(t)
        first.delivery.step(clock.time())
    first.flush()
    first.close()
    assert {s for s, _ in ingest.requests} == {401} and not ingest.stored
    spooled = set(sqlite3.connect(tmp_path / SPOOL_FILE).execute("SELECT gpu, start FROM samples"))
    assert len(spooled) == 2 * 3
    ingest.requests.clear()
    clock = VirtualClock(T0 + 200)
    api = fleet.backend(host, clock.time)
    if phase2_gpus is not None:
        api.gpus = phase2_gpus
    second = spooling_agent(api, tmp_path, ingest, clock, host, token=ingest.token, seed=4)
    return second, clock, spooled


def test_backlog_after_a_restart_waits_for_the_gpus_and_is_delivered(
    tmp_path: Any, ingest: Any
) -> None:
    ingest.strict_gpus = True  # the server has never heard of these GPUs (the 401s)
    fleet = FakeFleet(SPEC, seed=1, epoch=T0)
    agent, clock, spooled = backlog_then_restart(tmp_path, ingest, fleet)
    d = agent.delivery
    assert d is not None
    # the sender runs before the first tick has listed the GPUs: nothing may leave yet
    assert d.step(clock.time()) == "wait"
    assert not ingest.requests
    clock.set(T0 + 201.001)
    agent.tick(T0 + 201)
    assert d.drain(clock.time) == "idle"
    assert set(ingest.stored) == spooled and set(ingest.stored.values()) == {1}
    assert agent.spool is not None and not agent.spool.quarantined()
    uuids = [g.uuid for g in fleet.node(fleet.nodes[0]).gpus]
    assert [g["uuid"] for g in ingest.requests[0][1]["gpus"]] == uuids
    agent.close()


def test_backlog_of_a_gpu_gone_after_the_restart_is_described_from_the_spool(
    tmp_path: Any, ingest: Any
) -> None:
    ingest.strict_gpus = True
    fleet = FakeFleet(SPEC, seed=1, epoch=T0)
    gpu0, gpu1 = fleet.node(fleet.nodes[0]).gpus
    # after the restart NVML lists only GPU 0; GPU 1's three minutes wait in the spool
    agent, clock, spooled = backlog_then_restart(tmp_path, ingest, fleet, [gpu0])
    assert agent.delivery is not None
    clock.set(T0 + 201.001)
    agent.tick(T0 + 201)
    assert agent.delivery.drain(clock.time) == "idle"
    assert set(ingest.stored) == spooled
    # GPU 1 is described by its last entry from before the restart, and said to be lost
    block = {g["uuid"]: g for g in ingest.requests[0][1]["gpus"]}
    assert block[gpu1.uuid] == {
        "uuid": gpu1.uuid,
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_bytes": 81559 * 1024 * 1024,
        "power_limit_w": 700.0,
        "status": "lost",
    }
    assert "status" not in block[gpu0.uuid]
    agent.close()


def test_quarantine_keeps_the_spool_bound(tmp_path: Any) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE), max_samples=3)
    for i in range(0, 6, 2):
        sp.add([sample(i), sample(i + 1)])
        batch = sp.oldest(2)
        assert batch is not None
        sp.settle(batch, quarantine=[0, 1], status=400, reason="bad")
    # 6 quarantined in rows of 2; beyond 3 samples the oldest rows go: one row of 2 is left
    assert [n for *_, n in sp.quarantined()] == [2]
    assert sp.counter("quarantine_trimmed") == 4 and sp.pending() == 0


def test_401_is_not_quarantined(tmp_path: Any, ingest: Any) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE))
    sp.add([sample(0)])
    d = delivery(sp, ingest)
    d.token = "wrong"
    assert d.step(0.0) == "retry"  # an operator fixes a token; the data must wait, not go
    assert sp.pending() == 1 and not sp.quarantined()


def test_413_halves_the_batch(tmp_path: Any, ingest: Any) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE))
    sp.add([sample(i) for i in range(20)])
    ingest.max_samples = 6
    d = delivery(sp, ingest, max_batch=20)
    assert d.drain(lambda: 0.0) == "idle"
    # 20 → 413; 10 → 413; 5 fits, and batches stay at 5 from then on
    assert [len(p["samples"]) for p in ingest.ok_payloads()] == [5, 5, 5, 5]
    assert keys(ingest.ok_payloads()) == [("GPU-a", sample(i)["start"]) for i in range(20)]


def test_full_spool_drops_oldest_and_reports_it_once(tmp_path: Any, ingest: Any) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE), max_samples=10)
    sp.add([sample(i) for i in range(15)])
    assert sp.pending() == 10
    d = delivery(sp, ingest, max_batch=4)
    assert d.step(0.0) == "sent"
    first = ingest.ok_payloads()[0]
    # samples 0–4 were dropped; the oldest left is 5
    assert first["samples"][0]["start"] == sample(5)["start"]
    assert first["node"]["spool_dropped_samples"] == 5
    assert d.drain(lambda: 0.0) == "idle"
    assert all("spool_dropped_samples" not in p["node"] for p in ingest.ok_payloads()[1:])
    assert sp.counter("dropped_total") == 5 and sp.dropped_pending() == 0


def test_failed_push_keeps_the_drop_count(tmp_path: Any, ingest: Any) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE), max_samples=2)
    sp.add([sample(i) for i in range(3)])
    d = delivery(sp, ingest)
    ingest.script = [500]
    assert d.step(0.0) == "retry"
    assert sp.dropped_pending() == 1  # not reported yet: the push failed
    assert d.step(d.next_attempt) == "sent"
    assert ingest.ok_payloads()[0]["node"]["spool_dropped_samples"] == 1
    assert sp.dropped_pending() == 0


def test_reject_list_is_logged(
    tmp_path: Any, ingest: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE))
    sp.add([sample(i) for i in range(3)])
    ingest.reject = {("GPU-a", sample(1)["start"]): ("util_pct", "out of range")}
    d = delivery(sp, ingest)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        assert d.step(0.0) == "sent"
    msg = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(msg) == 1
    assert msg[0].startswith("server rejected 1 of 3 samples")
    assert '"index":1' in msg[0] and "util_pct" in msg[0]
    assert d.stats.samples_rejected == 1
    # a rejected sample is not retried (it would be rejected again) but kept aside
    assert sp.pending() == 0
    assert [n for *_, n in sp.quarantined()] == [1]


def test_spool_skips_intervals_already_reported(tmp_path: Any) -> None:
    path = str(tmp_path / SPOOL_FILE)
    sp = Spool(path)
    assert sp.add([sample(0), sample(1)]) == 2
    sp.close()
    # a restarted agent (new connection) produces a partial sample for the interval the
    # previous run already flushed on shutdown: it must not be stored twice
    sp = Spool(path)
    assert sp.add([sample(1), sample(2)]) == 1
    assert [s["start"] for s in sp.oldest(10).samples] == [sample(i)["start"] for i in range(3)]  # type: ignore[union-attr]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_full_spool_is_logged_at_once_then_at_most_every_ten_minutes(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clock = VirtualClock(T0)
    fleet = FakeFleet(SPEC, seed=1, epoch=T0)
    host = fleet.nodes[0]
    # no server: the spool (4 samples = two minutes of two GPUs) only fills
    agent = Agent(
        fleet.backend(host, clock.time), spool_dir=str(tmp_path), clock=clock, spool_max_samples=4
    )
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        for t in range(T0 + 1, T0 + 1801):
            clock.set(t + 0.001)
            agent.tick(t)
        agent.flush()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("spool full")]
    # 30 minutes × 2 GPUs = 60 samples, 4 kept: 56 dropped, 2 at each minute from minute 2 on.
    # Minute 2 (09:03:00) logs at once; then minute 12 (10 min later) the 20 of minutes 3–12;
    # minute 22 the 20 of minutes 13–22; the stop the 14 of minutes 23–29.
    counts = [re.search(r"dropped the (\d+) oldest .*, (\d+) in all", m) for m in lines]
    assert [(int(c[1]), int(c[2])) for c in counts if c] == [(2, 2), (20, 22), (20, 42), (14, 56)]
    assert agent.spool is not None and agent.spool.counter("dropped_total") == 56
    agent.close()


def test_restart_inside_an_interval_loses_the_rest_of_it_and_invents_nothing(
    tmp_path: Any,
) -> None:
    """The worst case docs/agent.md states: a clean stop 1 s into a 60 s interval and a restart
    right away; the interval keeps its 1 s, the 58 s seen after the restart are not sent."""
    fleet = FakeFleet("nodes=1,gpus=1,model=H100,pattern=training", seed=1, epoch=T0)
    host = fleet.nodes[0]
    clock = VirtualClock(T0)

    def run_agent(t_from: int, t_to: int) -> None:
        agent = Agent(fleet.backend(host, clock.time), spool_dir=str(tmp_path), clock=clock)
        for t in range(t_from, t_to + 1):
            clock.set(t + 0.001)
            agent.tick(t)
        agent.flush()  # the clean stop
        agent.close()

    run_agent(T0 + 1, T0 + 1)  # reads second T0 only, then stops
    run_agent(T0 + 3, T0 + 120)  # back 2 s later: seconds T0+2 … T0+119
    sp = Spool(str(tmp_path / SPOOL_FILE))
    batch = sp.oldest(10)
    assert batch is not None
    assert [(s["start"], s["seconds"]) for s in batch.samples] == [
        ("2026-11-30T09:00:00Z", 1),  # not 1 + 58: a (gpu, start) is reported once
        ("2026-11-30T09:01:00Z", 60),
    ]
