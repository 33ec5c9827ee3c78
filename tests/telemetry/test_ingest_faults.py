"""Ingest under faults (docs/reliability.md):
PostgreSQL away → 503 fast; Redis away → still works."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone

from fleet.services import node_token_issue
from telemetry.models import Sample

ROOT = Path(__file__).resolve().parents[2]
URL = "/api/v1/ingest"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends


def _push(uuid: str, minutes: int = 0) -> bytes:
    """One sample of ``uuid``, starting 2 + ``minutes`` minutes ago, with its gpus block."""
    start = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=2 + minutes)
    sample = {
        "gpu": uuid,
        "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": 60,
        "util_pct": 50.0,
    }
    gpus = [{"uuid": uuid, "index": 0, "name": "NVIDIA H100 80GB HBM3"}]
    return json.dumps({"node": {}, "gpus": gpus, "samples": [sample]}).encode()


@pytest.mark.smoke
def test_database_unreachable_answers_503_json_fast() -> None:
    """A real server process whose DATABASE_URL points at a closed port: the token lookup
    fails to connect, and the agent gets a JSON 503 with Retry-After, not a 500."""
    script = textwrap.dedent(
        """
        import json, time
        import django
        django.setup()
        from django.test import Client
        body = json.dumps({"samples": []}).encode()
        began = time.monotonic()
        r = Client().post("/api/v1/ingest", data=body, content_type="application/json",
                          HTTP_AUTHORIZATION="Bearer gfn_12345678_" + "s" * 43)
        print(json.dumps({"status": r.status_code, "body": r.json(),
                          "retry_after": r.headers.get("Retry-After"),
                          "seconds": time.monotonic() - began}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL")}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{_closed_port()}/gpufleet",
        GPUFLEET_VAR_DIR=str(Path(settings.VAR_DIR)),
        LOG_LEVEL="CRITICAL",
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["status"] == 503, answer
    assert "database" in answer["body"]["detail"]
    assert answer["retry_after"]
    assert answer["seconds"] < 3.0  # refused connections fail at once (connect_timeout is 3 s)


def test_database_failing_mid_push_answers_503(db: Any, client: Any) -> None:
    node, token = node_token_issue(hostname="db-fails")
    lost = OperationalError("server closed the connection unexpectedly")
    with mock.patch("telemetry.ingest.ingest_store.push_store", side_effect=lost):
        r = client.post(
            URL,
            data=_push("GPU-db"),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    assert r.status_code == 503
    assert r.json()["detail"].startswith("database unavailable")
    assert not Sample.objects.exists()


def test_ingest_works_with_redis_down(db: Any, client: Any) -> None:
    """The cache (throttle, metrics) points at a dead Redis: ingest still stores and answers."""
    dead = f"redis://127.0.0.1:{_closed_port()}/0"
    caches: dict[str, Any] = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": dead,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
    node, token = node_token_issue(hostname="redis-down")
    with override_settings(CACHES=caches, REDIS_URL=dead, CELERY_BROKER_URL=dead):
        from django.core.cache import cache

        with pytest.raises(Exception):  # noqa: B017 - really down
            cache.get("x")
        began = time.monotonic()
        r = client.post(
            URL,
            data=_push("GPU-redis"),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        elapsed = time.monotonic() - began
    assert r.status_code == 200, r.content
    assert r.json() == {"accepted": 1, "duplicates": 0, "rejected": []}
    assert Sample.objects.count() == 1
    assert elapsed < 2.0


def test_database_error_inside_copy_answers_503(db: Any, client: Any, postgres: Any) -> None:
    """psycopg's own errors during COPY reach the API as Django's, so the agent sees 503."""
    import psycopg

    node, token = node_token_issue(hostname="copy-fails")
    with (
        # A one-sample push takes the one-statement path; force COPY.
        mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", 0),
        mock.patch.object(
            psycopg.Copy, "write_row", side_effect=psycopg.OperationalError("connection lost")
        ),
    ):
        r = client.post(
            URL,
            data=_push("GPU-copy"),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    assert r.status_code == 503, r.content
    assert not Sample.objects.exists()


def test_database_error_in_one_statement_answers_503(db: Any, client: Any, postgres: Any) -> None:
    """The small-batch path (one prepared statement, no COPY) maps psycopg's errors to 503 too."""
    import psycopg

    from telemetry.ingest_store import _PreparedCursor

    node, token = node_token_issue(hostname="stmt-fails")
    auth = f"Bearer {token}"
    ok = client.post(URL, data=_push("GPU-stmt"), content_type="application/json",
                     HTTP_AUTHORIZATION=auth)  # fmt: skip
    assert ok.status_code == 200, ok.content
    later = _push("GPU-stmt", minutes=1)
    with mock.patch.object(
        _PreparedCursor, "execute", side_effect=psycopg.OperationalError("connection lost")
    ):
        r = client.post(URL, data=later, content_type="application/json", HTTP_AUTHORIZATION=auth)
    assert r.status_code == 503, r.content
    assert Sample.objects.count() == 1
