"""The worker watchdog and a message lost to kombu's unacked set (config/watchdog.py).

After a Redis blip, kombu's consumer can take a message off the queue (``BRPOP``), file it as
unacknowledged and never hand it to the worker. The queue is then empty (``LLEN`` 0), and kombu
would hand the message out again only after its visibility timeout (an hour). Made
deterministic here by a worker whose consumer drops the first delivery of a marked message
(tests/reliability/lossy_worker.py), with no further beat tick to hide the loss: the watchdog
must put the message back and exit, and the fresh worker the supervisor starts (this test, as
systemd and compose do) runs it, so the rollups are done within a minute.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import uuid as uuidlib
from pathlib import Path

import pytest
from django.utils import timezone

from config.celery import worker_argv
from config.watchdog import EXIT_STUCK, WatchState
from tests.reliability.conftest import (
    ROOT,
    db_url_for_test,
    process_group_stop,
    server_env,
    wait_for,
)
from tests.reliability.lossy_worker import LOSE

HOUR = 3600


def test_only_messages_taken_long_enough_ago_and_never_received_are_overdue() -> None:
    state = WatchState(last_received=0.0)
    state.take("a", 10.0)
    state.take("b", 12.0)
    state.take("c", 14.0)
    state.forget(("b",))  # the worker received its task
    assert state.overdue(now=14.0, after=5) == []
    assert state.overdue(now=15.0, after=5) == ["a"]  # 5 s
    assert state.overdue(now=19.5, after=5) == ["a", "c"]  # oldest first


def _pending_rollups() -> None:
    """Two simulated hours of one 4-GPU node, ingested in this process: two hours marked."""
    from fleet.services import node_token_issue
    from telemetry.agent.fake import FakeFleet, simulate
    from telemetry.ingest import sample_batch_ingest

    start = dt.datetime.fromtimestamp(time.time() // HOUR * HOUR - 3 * HOUR, dt.UTC)
    fleet = FakeFleet("nodes=1,gpus=4,model=H100,pattern=mixed", seed=0, epoch=start)
    node, _ = node_token_issue(hostname=fleet.nodes[0])
    for _host, payload in simulate(
        fleet, start=start, end=start + dt.timedelta(hours=2), interval_s=300, batch_intervals=24
    ):
        sample_batch_ingest(
            node_id=node.pk, payload_bytes=json.dumps(payload).encode(), now=timezone.now()
        )


@pytest.mark.slow
def test_a_message_lost_to_the_unacked_set_is_put_back_and_run_within_a_minute(
    pg: None, redis_url: str, tmp_path: Path
) -> None:
    import redis
    from celery import Celery

    from telemetry.models import HourlyUsage, RollupPending

    _pending_rollups()
    assert RollupPending.objects.count() == 2

    queue = f"h6-lost-{uuidlib.uuid4().hex[:8]}"
    env = server_env(
        database_url=db_url_for_test(),
        redis_url=redis_url,
        CELERY_BROKER_URL=redis_url,
        WORKER_STUCK_AFTER_S="5",
        WORKER_WATCHDOG_INTERVAL_S="1",
    )
    log = tmp_path / "worker.log"
    argv = worker_argv(queue=queue, name=f"{queue}@%h")
    assert argv[1:3] == ["-m", "celery"]
    lossy = [sys.executable, "-m", "tests.reliability.lossy_worker", *argv[3:]]

    def start_worker() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            lossy,
            cwd=ROOT,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    worker = start_worker()
    exits: list[int] = []
    sender = Celery("h6-sender", broker=redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        wait_for(lambda: "ready." in log.read_text(errors="replace"), "worker ready", 60)
        sent = time.monotonic()
        # One rollup, as beat sends it, and no tick after it: nothing else will come.
        sender.send_task("telemetry.tasks.rollup_task", queue=queue, headers={LOSE: "1"})
        wait_for(lambda: client.llen(queue) == 0, "the consumer to take the message", 30)

        def rolled_up() -> bool:
            nonlocal worker
            code = worker.poll()
            if code is not None:  # the supervisor's part
                exits.append(code)
                worker = start_worker()
            return not RollupPending.objects.exists() and HourlyUsage.objects.count() == 8

        wait_for(rolled_up, "the lost rollup to run", timeout=60)
        took_s = time.monotonic() - sent
        if not exits:  # the same worker ran it once put back, then shut down
            exits.append(worker.wait(timeout=30))
    finally:
        process_group_stop(worker)
        sender.close()
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    output = log.read_text(errors="replace")
    assert exits == [EXIT_STUCK], output[-3000:]
    assert "never reached it as tasks" in output
    assert took_s < 60
