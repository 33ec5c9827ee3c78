"""Content Security Policy, request ids and structured logs, token hashes.

The login lockout is tests/deploy/test_login_lockout.py."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from config.logging import JsonFormatter, RequestIdFilter, node_var, request_id_var


# --- Content Security Policy ------------------------------------------------------------------
@pytest.mark.smoke
@pytest.mark.django_db
def test_pages_carry_a_strict_content_security_policy(client: Any) -> None:
    for url in ("/accounts/login/", "/healthz", "/admin/login/"):
        response = client.get(url)
        assert response.status_code == 200, url
        policy = dict(
            part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";")
        )
        assert policy["script-src"] == "'self'", url  # no inline script, no CDN
        assert policy["default-src"] == "'self'"
        assert policy["object-src"] == "'none'"
        assert policy["frame-ancestors"] == "'none'"
        assert policy["form-action"] == "'self'"
        assert response["X-Frame-Options"] == "DENY"
        assert response["X-Content-Type-Options"] == "nosniff"


# --- Request ids and logs ---------------------------------------------------------------------
@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Everything logged during the test, as the production handler writes it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_request_id_is_kept_when_sane_and_replaced_otherwise(client: Any) -> None:
    kept = client.get("/healthz", HTTP_X_REQUEST_ID="req-42.a_b")
    assert kept["X-Request-ID"] == "req-42.a_b"
    for bad in ("has space", "x" * 65, 'quote"', ""):
        fresh = client.get("/healthz", HTTP_X_REQUEST_ID=bad)["X-Request-ID"]
        assert len(fresh) == 32 and int(fresh, 16) >= 0
    assert client.get("/healthz")["X-Request-ID"] != client.get("/healthz")["X-Request-ID"]


@override_settings(ROOT_URLCONF="tests.deploy.urls_logging")
def test_log_lines_carry_request_and_node_ids(client: Any, json_log: io.StringIO) -> None:
    client.get("/node", HTTP_X_REQUEST_ID="req-node-1")
    client.get("/plain", HTTP_X_REQUEST_ID="req-plain-2")
    records = lines(json_log)
    by_message = {r["message"]: r for r in records}
    rejected = by_message["3 samples rejected"]
    assert rejected["request_id"] == "req-node-1" and rejected["node"] == "gpu-07"
    assert rejected["level"] == "WARNING" and rejected["logger"] == "telemetry.ingest"
    assert rejected["time"].endswith("+00:00")
    access = [r for r in records if r["logger"] == "gpufleet.access"]
    assert [(r["request_id"], r["node"], r["path"], r["status"]) for r in access] == [
        ("req-node-1", "gpu-07", "/node", 200),
        ("req-plain-2", "-", "/plain", 200),  # the node id did not leak into the next request
    ]
    assert all(isinstance(r["duration_ms"], float) for r in access)
    assert by_message["page"]["node"] == "-"

    # Django logs 5xx answers after the middleware chain has returned: the ids are still there.
    client.get("/unavailable", HTTP_X_REQUEST_ID="req-503")
    error = [r for r in lines(json_log) if r["logger"] == "django.request"][-1]
    assert error["message"] == "Service Unavailable: /unavailable"
    assert (error["request_id"], error["node"], error["status_code"]) == ("req-503", "gpu-08", 503)
    # After the request, nothing is left behind in this thread.
    assert request_id_var.get() == "-" and node_var.get() == "-"


def test_json_formatter_writes_one_object_per_line_with_extras_and_tracebacks() -> None:
    formatter = JsonFormatter()
    token = node_var.set("gpu-09")
    try:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            record = logging.getLogger("x").makeRecord(
                "x", logging.ERROR, __file__, 1, "failed %s", ("once",), sys.exc_info()
            )
        record.__dict__["batch"] = 17
        text = formatter.format(record)
    finally:
        node_var.reset(token)
    assert "\n" not in text
    payload = json.loads(text)
    assert payload["message"] == "failed once"
    assert payload["node"] == "gpu-09" and payload["request_id"] == "-"
    assert payload["batch"] == 17
    assert "ValueError: boom" in payload["exc"]


# --- Tokens are stored hashed -----------------------------------------------------------------
@pytest.mark.django_db
def test_node_and_api_tokens_are_stored_only_as_hashes() -> None:
    from django.db import connection

    from fleet.models import ApiToken, NodeToken
    from fleet.services import api_token_issue, node_token_issue
    from fleet.tokens import token_hash

    _, node_token = node_token_issue(hostname="gpu-hash")
    _, api_token = api_token_issue(username="finance-hash", role="finance")
    for model, raw in ((NodeToken, node_token), (ApiToken, api_token)):
        row = model.objects.get(prefix="_".join(raw.split("_")[:2]))
        assert row.token_hash == token_hash(raw) != raw
        assert len(raw.split("_", 2)[2]) >= 43  # 256 random bits
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {model._meta.db_table}")  # noqa: S608
            stored = " ".join(str(v) for r in cursor.fetchall() for v in r)
        assert raw not in stored and raw.split("_", 2)[2] not in stored
