"""Spool and delivery against a real HTTP server on 127.0.0.1, on a simulated clock."""

from __future__ import annotations

import logging
import random
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


def keys(payloads: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["gpu"], s["start"]) for p in payloads for s in p["samples"]]


def test_server_down_for_a_simulated_hour_then_everything_once(tmp_path: Any, ingest: Any) -> None:
    clock = VirtualClock(T0)
    fleet = FakeFleet(SPEC, seed=1, epoch=T0)
    host = fleet.nodes[0]
    agent = Agent(
        fleet.backend(host, clock.time),
        spool_dir=str(tmp_path),
        server=ingest.url,
        token=ingest.token,
        hostname=host,
        clock=clock,
        rng=random.Random(3),
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
    sp = Spool(str(tmp_path / SPOOL_FILE))
    sp.add([sample(i) for i in range(3)])
    d = delivery(sp, ingest)
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


def test_other_4xx_quarantines_the_batch_and_the_queue_moves_on(
    tmp_path: Any, ingest: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sp = Spool(str(tmp_path / SPOOL_FILE))
    sp.add([sample(i) for i in range(5)])
    d = delivery(sp, ingest, max_batch=2)
    ingest.script = [400]
    with caplog.at_level(logging.ERROR, logger="gpufleet.agent"):
        assert d.step(0.0) == "quarantined"
    assert sp.quarantined()[0][1:] == (400, '{"detail": "status 400", "field": "samples"}', 2)
    assert "quarantined" in caplog.text
    assert d.drain(lambda: 0.0) == "idle"
    # samples 0, 1 are kept aside; 2, 3, 4 delivered; the count is reported to the server
    assert keys(ingest.ok_payloads()) == [("GPU-a", sample(i)["start"]) for i in (2, 3, 4)]
    assert all(p["node"]["quarantined_batches"] == 1 for p in ingest.ok_payloads())
    assert sp.counter("quarantined_samples") == 2


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
    ingest.reject = {("GPU-a", sample(1)["start"])}
    d = delivery(sp, ingest)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        assert d.step(0.0) == "sent"
    msg = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(msg) == 1
    assert msg[0].startswith("server rejected 1 of 3 samples")
    assert '"index":1' in msg[0] and "util_pct" in msg[0]
    assert d.stats.samples_rejected == 1
    assert sp.pending() == 0  # a rejected sample is not retried: it would be rejected again


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
