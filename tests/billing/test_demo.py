"""``manage.py demo``: the fleet, the history through the ingest service, the rollup, the
logins, and the live agents' HTTP pushes to the served /api/v1/ingest."""

from __future__ import annotations

import datetime as dt
import io
import threading
import time
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone


@pytest.mark.smoke
@pytest.mark.django_db
def test_demo_generates_a_fleet_and_rolls_it_up() -> None:
    from django.contrib.auth import authenticate

    from billing.models import CostProfile
    from fleet.models import Gpu, Pool, Site, Team
    from telemetry.models import HourlyUsage, Sample

    # A minute into a 15-minute sample slot, the clock running: both runs below see the same
    # slots (a run crossing into the next slot would generate its samples, and rightly).
    slot = timezone.now().replace(second=0, microsecond=0)
    slot -= dt.timedelta(minutes=slot.minute % 15 - 1)
    traveller = time_machine.travel(slot, tick=True)
    traveller.start()
    out = io.StringIO()
    call_command("demo", no_serve=True, gpus=6, days=1, stdout=out, stderr=io.StringIO())
    lines = out.getvalue().strip().splitlines()
    assert lines[-1].startswith("Login: demo / demo")
    # An empty database: everything is created, nothing "updated" (a new pool's break-even
    # workload is part of creating it).
    applied = next(line for line in lines if line.startswith("applied fleet.toml:"))
    assert "6 pools created" in applied and "pools updated" not in applied, applied
    # No GPU of this small fleet goes offline: every sample arrives, and nothing is explained.
    assert "ingested 576 samples (0 rejected)" in lines
    assert set(Site.objects.values_list("name", flat=True)) == {"fra1", "ams1", "iad1"}
    assert Pool.objects.count() == 6 and Team.objects.count() == 4
    assert set(CostProfile.objects.values_list("kind", flat=True)) == {"owned", "rented"}
    gpus = Gpu.objects.count()
    assert gpus == 6  # one per group: every pool, model and fault is represented
    assert Gpu.objects.filter(node__pool__isnull=True).count() == 0
    assert Gpu.objects.values("model").distinct().count() == 5
    # 24 h of 15-minute samples per GPU came through the ingest service and were rolled up.
    assert Sample.objects.count() == gpus * 96
    # 24 h not aligned to the hour touch 24 or 25 clock hours; every (GPU, hour) is rolled up.
    hours = {
        (g, start.replace(minute=0, second=0))
        for g, start in Sample.objects.values_list("gpu_id", "start")
    }
    assert len(hours) in (gpus * 24, gpus * 25)
    assert HourlyUsage.objects.count() == len(hours)
    assert authenticate(username="demo", password="demo") is not None
    # Run again: nothing is generated twice, nothing breaks.
    call_command("demo", no_serve=True, gpus=6, days=1, stdout=io.StringIO(), stderr=io.StringIO())
    traveller.stop()
    assert Sample.objects.count() == gpus * 96


@pytest.mark.django_db
def test_demo_says_why_samples_are_missing_and_keeps_logs_out_of_the_bars(
    monkeypatch: Any, capfd: Any
) -> None:
    """A GPU that falls off the bus half-way sends nothing after: the demo says so, and how
    many samples that is. A log line written while a progress bar draws gets its own line."""
    import logging
    import re

    from billing.management.commands import demo
    from telemetry import ingest
    from telemetry.models import Sample

    real_spec = demo.demo_spec

    def spec_with_a_lost_gpu(gpus: int) -> tuple[list[dict[str, Any]], list[str]]:
        groups, pools = real_spec(gpus)
        groups[0] = {**groups[0], "falls_off_bus": "0.0@+12h"}  # node 0, GPU 0, after 12 h
        return groups, pools

    real_ingest = ingest.sample_batch_ingest
    calls = {"n": 0}

    def ingest_and_log(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the bar is drawn by then
            logging.getLogger("telemetry.ingest").warning("a warning while the bar draws")
        return real_ingest(**kwargs)

    monkeypatch.setattr(demo, "demo_spec", spec_with_a_lost_gpu)
    monkeypatch.setattr(ingest, "sample_batch_ingest", ingest_and_log)
    call_command("demo", no_serve=True, gpus=6, days=1)
    out, err = capfd.readouterr()

    # 6 GPUs × 96 intervals possible; GPU 0 of the first node sent its first 12 h only.
    assert Sample.objects.count() == 6 * 96 - 48
    assert (
        "ingested 528 of 576 possible samples (0 rejected); the 48 missing were never sent" in out
    )
    lost = re.search(
        r"^  (gpu-\S+#0) fell off the bus at (.+) UTC .*: 48 samples, 12.0 h offline", out, re.M
    )
    assert lost, out
    # Every piece of the bars' output is either a bar or a whole log line, never both.
    pieces = [p for p in re.split(r"[\r\n]", err) if p.strip()]
    logged = [p for p in pieces if "a warning while the bar draws" in p]
    assert len(logged) == 1 and re.match(r"^\d{4}-\d\d-\d\d \S+ WARNING ", logged[0]), pieces
    assert all("%|" in p for p in pieces if p not in logged), pieces
    # The rollup's own line is not repeated inside its bar: the demo says it on stdout.
    assert "INFO telemetry.rollup" not in err and "rolled up: rollup:" in out


@pytest.mark.django_db
def test_fresh_refuses_to_delete_a_server_database(settings: Any) -> None:
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        pytest.skip("only meaningful with DATABASE_URL set")
    with pytest.raises(CommandError, match="--fresh"):
        call_command("demo", fresh=True, no_serve=True, stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_live_agents_post_to_the_served_ingest_endpoint(live_server: Any) -> None:
    """The streaming part is real HTTP with node tokens: samples arrive via /api/v1/ingest."""
    from billing.management.commands.demo import _floor, _live_agents, demo_spec
    from fleet.models import Node
    from fleet.services import node_token_issue
    from telemetry.agent.fake import FakeFleet
    from telemetry.models import Sample

    groups, _ = demo_spec(6)
    since = _floor(timezone.now(), 60) - dt.timedelta(minutes=3)
    fleet = FakeFleet(groups, seed=3, epoch=since)
    tokens = {h: node_token_issue(hostname=h) for h in fleet.nodes}
    stop = threading.Event()
    agents = threading.Thread(
        target=_live_agents, args=(fleet, tokens, live_server.url, since, 60, stop), daemon=True
    )
    agents.start()
    deadline = time.monotonic() + 60
    while Sample.objects.count() < 6 * 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    agents.join(timeout=30)
    assert Sample.objects.count() >= 6 * 3  # 3 whole minutes × 6 GPUs at least
    assert Node.objects.filter(last_seen_at__isnull=False).count() == len(fleet.nodes)


@pytest.mark.django_db(transaction=True)
def test_demo_sets_site_url_to_the_url_it_serves_on(
    settings: Any, monkeypatch: Any, free_tcp_port: int
) -> None:
    """Links in the weekly email and its preview point at the demo's own server."""
    import urllib.request

    from billing.management.commands.demo import Command, _floor
    from telemetry.agent.fake import FakeFleet

    monkeypatch.delenv("SITE_URL", raising=False)
    settings.SITE_URL = "http://localhost:8000"
    command = Command(stdout=io.StringIO(), stderr=io.StringIO())
    now = _floor(timezone.now(), 60)
    opts = {"host": "127.0.0.1", "port": free_tcp_port, "verbosity": 0, "live_interval": 60}
    serving = threading.Thread(
        target=command._serve,
        args=(FakeFleet("nodes=1,gpus=1", epoch=now), {}, now, opts, time.monotonic()),
        daemon=True,
    )
    serving.start()
    try:
        deadline = time.monotonic() + 30
        while "Dashboard:" not in command.stdout._out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert settings.SITE_URL == f"http://localhost:{free_tcp_port}"
        with urllib.request.urlopen(f"{settings.SITE_URL}/healthz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        command.stop.set()
        serving.join(timeout=30)
    assert not serving.is_alive()


@pytest.mark.django_db
def test_the_demo_queue_waits_as_its_docstring_says() -> None:
    """One day of billing/demo/queue.py through the queue service: alice 8 GPUs × 10 h and
    bob 4 × 4 h wait for capacity (96 GPU-h), carol 2 × 10 h for her QOS (20), dave 1 × 6 h
    for a dependency (6); a snapshot every 120 s from 08:00, the day closed at 18:00."""
    from billing.demo.queue import CLUSTER, queue_snapshots, snapshots_per_day
    from fleet.models import Node
    from telemetry.queue import queue_snapshot_apply
    from telemetry.queue_figures import queue_rows

    day = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    snapshots = list(queue_snapshots(day, day + dt.timedelta(days=1)))
    assert len(snapshots) == snapshots_per_day() == 301
    assert (snapshots[0].at.hour, snapshots[-1].at.hour, snapshots[-1].jobs) == (8, 18, [])
    node = Node.objects.create(hostname="login-1")
    for snapshot in snapshots:
        queue_snapshot_apply(node_id=node.pk, snapshot=snapshot, now=snapshot.at)
    (row,) = queue_rows(start=day, end=day + dt.timedelta(days=1), group_by="cluster")
    assert row["key"] == CLUSTER
    assert row["waited_gpu_hours_capacity"] == pytest.approx(96.0)
    assert row["waited_gpu_hours_policy"] == pytest.approx(20.0)
    assert row["waited_gpu_hours_user"] == pytest.approx(6.0)
    assert row["jobs"] == 4
    users = queue_rows(start=day, end=day + dt.timedelta(days=1), group_by="user")
    assert [(r["key"], round(r["waited_gpu_hours"], 6)) for r in users] == [
        ("alice", 80.0),
        ("carol", 20.0),
        ("bob", 16.0),
        ("dave", 6.0),
    ]
    # A second day has new job ids: another four jobs, not the same ones waiting longer.
    second = day + dt.timedelta(days=1)
    for snapshot in queue_snapshots(second, second + dt.timedelta(days=1)):
        queue_snapshot_apply(node_id=node.pk, snapshot=snapshot, now=snapshot.at)
    (both,) = queue_rows(start=day, end=day + dt.timedelta(days=2), group_by="cluster")
    assert both["jobs"] == 8 and both["waited_gpu_hours_capacity"] == pytest.approx(192.0)
