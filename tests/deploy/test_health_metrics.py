"""/healthz, /readyz and /metrics."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core.cache import cache
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_caches(url: str | None = None) -> dict[str, Any]:
    """``CACHES`` whose Redis refuses every connection (a stopped Redis), with short timeouts."""
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url or f"redis://127.0.0.1:{closed_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        }
    }


@pytest.mark.smoke
@pytest.mark.django_db
def test_healthz_and_readyz_answer_when_all_is_up(client: Any) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok" and body["database"] == "ok"
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.django_db
def test_readyz_is_503_when_the_broker_is_unreachable(client: Any) -> None:
    with override_settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{closed_port()}/0"):
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["database"] == "ok"
    assert body["broker"].startswith("error: ")
    # /healthz does not care: the process is up.
    with override_settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{closed_port()}/0"):
        assert client.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_readyz_does_not_gate_on_the_cache(client: Any, redis_url: str) -> None:
    # Ingest works without the cache (docs/reliability.md), so a cache outage is reported,
    # not fatal.
    dead = f"redis://127.0.0.1:{closed_port()}/0"
    with override_settings(CACHES=dead_caches(dead), REDIS_URL=dead, CELERY_BROKER_URL=redis_url):
        response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["cache"].startswith("error: ")


def test_readyz_is_503_when_the_database_is_unreachable() -> None:
    code = """
import django
django.setup()
from django.test import Client
r = Client().get("/readyz")
print(r.status_code, r.json()["database"], r.json()["status"])
h = Client().get("/healthz")
print("healthz", h.status_code)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL")}
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{closed_port()}/gpufleet",
        "ALLOWED_HOSTS": "testserver",
    }
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "503 error: OperationalError unavailable"
    assert lines[1] == "healthz 200"


# --- /metrics ---------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-z_:][a-z0-9_:]*)(\{(.*)\})? (-?[0-9.e+]+)$")


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Strictly parse Prometheus text format 0.0.4 as /metrics writes it."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge") and name not in types
            assert (kind == "counter") == name.endswith("_total"), name
            types[name] = kind
            continue
        if line.startswith("# HELP "):
            continue
        match = _SAMPLE.match(line)
        assert match, f"bad line {line!r}"
        name, _, labels_text, value = match.groups()
        assert name in types, f"{name} has no TYPE line before it"
        labels = tuple(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels_text or ""))
        samples[(name, labels)] = float(value)
    return samples


@pytest.fixture
def metrics_client(client: Any) -> Any:
    with override_settings(METRICS_TOKEN="m3trics-t0ken"):
        yield client


@pytest.mark.django_db
def test_metrics_needs_the_token_or_an_admin(metrics_client: Any, role_client: Any) -> None:
    anonymous = metrics_client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    wrong = metrics_client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 401
    good = metrics_client.get("/metrics", HTTP_AUTHORIZATION="Bearer m3trics-t0ken")
    assert good.status_code == 200
    assert good["Content-Type"].startswith("text/plain; version=0.0.4")
    assert role_client("finance").get("/metrics").status_code == 403
    assert role_client("admin").get("/metrics").status_code == 200


@pytest.mark.django_db
def test_metrics_without_a_token_configured_refuses_bearers(client: Any) -> None:
    with override_settings(METRICS_TOKEN=""):
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


@pytest.mark.django_db
def test_metrics_report_counters_lag_drops_and_last_seen(metrics_client: Any) -> None:
    from config.metrics import COUNTER_PREFIX, COUNTERS, counter_get, counter_incr
    from fleet.models import Gpu, Node
    from telemetry.models import RollupPending

    cache.delete_many([COUNTER_PREFIX + c.name for c in COUNTERS])
    counter_incr("ingest_requests", 3)
    counter_incr("ingest_samples_accepted", 100)
    counter_incr("ingest_samples_accepted", 20)
    counter_incr("ingest_samples_duplicate")
    counter_incr("ingest_samples_rejected", 7)
    assert counter_get("ingest_samples_accepted") == 120

    seen = NOW - dt.timedelta(seconds=90)
    a = Node.objects.create(
        hostname="gpu-a",
        spool_dropped_total=5,
        last_seen_at=seen,
        agent_version="1.4.2",
        driver_version="550.54.15",
    )
    Node.objects.create(hostname='we"ird\\node', spool_dropped_total=37)  # never seen
    Gpu.objects.create(uuid="GPU-1", node=a)
    for hours_ago, marked_s_ago in ((3, 125), (1, 30)):
        hour = NOW.replace(minute=0) - dt.timedelta(hours=hours_ago)
        RollupPending.objects.create(hour=hour)
        RollupPending.objects.filter(hour=hour).update(
            marked_at=NOW - dt.timedelta(seconds=marked_s_ago)
        )
    # An older hour set aside after failing: counted on its own, not waiting for a worker.
    aside = NOW.replace(minute=0) - dt.timedelta(hours=9)
    RollupPending.objects.create(hour=aside, failures=5, set_aside_at=NOW)
    RollupPending.objects.filter(hour=aside).update(marked_at=NOW - dt.timedelta(hours=8))

    with time_machine.travel(NOW, tick=False):
        text = metrics_client.get("/metrics", HTTP_AUTHORIZATION="Bearer m3trics-t0ken")
    samples = parse_exposition(text.content.decode())

    assert samples[("gpufleet_metrics_counters_up", ())] == 1
    assert samples[("gpufleet_ingest_requests_total", ())] == 3
    assert samples[("gpufleet_ingest_samples_accepted_total", ())] == 120
    assert samples[("gpufleet_ingest_samples_duplicate_total", ())] == 1
    assert samples[("gpufleet_ingest_samples_rejected_total", ())] == 7
    assert samples[("gpufleet_rollup_lag_seconds", ())] == 125.0  # the oldest mark in the queue
    assert samples[("gpufleet_rollups_pending", ())] == 2
    assert samples[("gpufleet_rollups_set_aside", ())] == 1
    assert samples[("gpufleet_nodes", ())] == 2
    assert samples[("gpufleet_gpus", ())] == 1
    assert samples[("gpufleet_agent_spool_dropped_samples_total", ())] == 42
    dropped = "gpufleet_node_spool_dropped_samples_total"
    assert samples[(dropped, (("node", "gpu-a"),))] == 5
    assert samples[(dropped, (("node", 'we\\"ird\\\\node'),))] == 37  # escaped label value
    last_seen = {k[1]: v for k, v in samples.items() if k[0].startswith("gpufleet_node_last")}
    assert last_seen == {(("node", "gpu-a"),): seen.timestamp()}
    # Versions as _info series (value 1, the versions in labels), one per node.
    info = {frozenset(k[1]): v for k, v in samples.items() if k[0] == "gpufleet_node_info"}
    assert info == {
        frozenset(
            {("node", "gpu-a"), ("agent_version", "1.4.2"), ("driver_version", "550.54.15")}
        ): 1,
        frozenset({("node", 'we\\"ird\\\\node'), ("agent_version", ""), ("driver_version", "")}): 1,
    }
    [build] = [k[1] for k in samples if k[0] == "gpufleet_build_info"]
    assert dict(build)["version"] == importlib.metadata.version("gpufleet")
    assert dict(build)["python_version"] == platform.python_version()


@pytest.mark.django_db
def test_metrics_rollup_lag_is_zero_when_nothing_waits(metrics_client: Any) -> None:
    text = metrics_client.get("/metrics", HTTP_AUTHORIZATION="Bearer m3trics-t0ken")
    samples = parse_exposition(text.content.decode())
    assert samples[("gpufleet_rollup_lag_seconds", ())] == 0
    assert samples[("gpufleet_rollups_pending", ())] == 0
    assert samples[("gpufleet_rollups_set_aside", ())] == 0
    assert samples[("gpufleet_agent_spool_dropped_samples_total", ())] == 0


@pytest.mark.django_db
def test_metrics_survive_a_cache_outage(metrics_client: Any) -> None:
    from config.metrics import counter_get, counter_incr

    with override_settings(CACHES=dead_caches()):
        counter_incr("ingest_requests")  # never raises
        assert counter_get("ingest_requests") == 0
        response = metrics_client.get("/metrics", HTTP_AUTHORIZATION="Bearer m3trics-t0ken")
    assert response.status_code == 200
    samples = parse_exposition(response.content.decode())
    assert samples[("gpufleet_metrics_counters_up", ())] == 0
    # Absent, not 0: a 0 would look like a counter reset to Prometheus.
    assert not any(name.startswith("gpufleet_ingest_") for name, _ in samples)
    assert ("gpufleet_rollup_lag_seconds", ()) in samples
