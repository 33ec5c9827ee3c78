"""docs/reliability.md, case by case:
every bad input gets a clear 4xx with a JSON body naming the field,
never a 500, and stores nothing wrong. Each case goes through the whole HTTP stack of the real
endpoint (middleware, authentication, throttle, view, service, PostgreSQL or SQLite)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from fleet.models import Gpu
from fleet.services import api_token_issue, node_token_issue, token_revoke
from telemetry.models import RollupPending, Sample
from tests.reliability.conftest import (
    INGEST,
    MEMORY,
    good_sample,
    gpu_block,
    iso,
    push_body,
    recent_minute,
)

UUID = "GPU-bad-input-0"
OTHER_UUID = "GPU-of-another-node"


@pytest.fixture
def node_token(db: Any) -> str:
    _, token = node_token_issue(hostname="bad-input-node")
    return token


def _post(client: Client, body: bytes | str, token: str | None, **extra: Any) -> Any:
    headers: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.generic(
        "POST", INGEST, data=body, content_type="application/json", **headers, **extra
    )


def _one(**fields: Any) -> bytes:
    """A push of one sample: the good sample with ``fields`` changed (None → key removed)."""
    sample = good_sample(UUID, recent_minute())
    for key, value in fields.items():
        if value is None:
            sample.pop(key, None)
        else:
            sample[key] = value
    return json.dumps(push_body([sample], [gpu_block(UUID)])).encode()


def _one_raw(key: str, literal: str) -> bytes:
    """A push whose sample holds ``key: <literal>`` verbatim (NaN, Infinity: not JSON)."""
    body = _one(**{key: "__LITERAL__"}).decode()
    return body.replace('"__LITERAL__"', literal).encode()


@dataclass(frozen=True)
class Row:
    """One bad input: the body, the status and the field the answer must name."""

    id: str
    body: Callable[[], bytes]
    status: int
    field: str
    settings: dict[str, Any] = dc_field(default_factory=dict)
    # "request": the whole push is refused (``field`` at the top level);
    # "sample": the only sample is rejected (``rejected[0].field``), so the answer is 400.
    level: str = "sample"


def _future_start() -> str:
    # The interval [start, start + 60 s) ends 10–11 minutes ahead of the server's clock: far
    # enough past the 5-minute allowance that a slow request cannot bring it back within it.
    start = timezone.now().astimezone(dt.UTC).replace(second=0, microsecond=0)
    return iso(start + dt.timedelta(minutes=10))


def _before_retention() -> str:
    start = timezone.now().astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    return iso(start - dt.timedelta(days=36))


ROWS = [
    Row("malformed-json", lambda: b'{"samples": [', 400, "body", level="request"),
    Row("not-an-object", lambda: b"[1, 2, 3]", 400, "body", level="request"),
    Row("empty-body", lambda: b"", 400, "body", level="request"),
    Row(
        "body-over-limit",
        lambda: _one(padding="x" * 5000),
        413,
        "body",
        settings={"INGEST_MAX_BODY_BYTES": 4096},
        level="request",
    ),
    Row(
        "too-many-samples",
        lambda: json.dumps(
            push_body(
                [good_sample(UUID, recent_minute(m)) for m in range(5, 11)], [gpu_block(UUID)]
            )
        ).encode(),
        413,
        "samples",
        settings={"INGEST_MAX_SAMPLES": 5},
        level="request",
    ),
    Row("nan-literal", lambda: _one_raw("util_pct", "NaN"), 400, "util_pct"),
    Row("infinity-literal", lambda: _one_raw("power_w", "Infinity"), 400, "power_w"),
    Row("minus-infinity-literal", lambda: _one_raw("energy_j", "-Infinity"), 400, "energy_j"),
    Row("nan-string", lambda: _one(util_pct="NaN"), 400, "util_pct"),
    Row("infinity-string", lambda: _one(energy_j="Infinity"), 400, "energy_j"),
    Row("number-as-string", lambda: _one(util_pct="12"), 400, "util_pct"),
    Row("negative-util", lambda: _one(util_pct=-0.5), 400, "util_pct"),
    Row("util-above-100", lambda: _one(util_pct=100.01), 400, "util_pct"),
    Row("mem-util-above-100", lambda: _one(mem_util_pct=101), 400, "mem_util_pct"),
    Row("negative-power", lambda: _one(power_w=-1), 400, "power_w"),
    Row("power-above-5000", lambda: _one(power_w=5000.5), 400, "power_w"),
    Row("negative-energy", lambda: _one(energy_j=-1.0), 400, "energy_j"),
    Row("temp-above-150", lambda: _one(temp_c=151), 400, "temp_c"),
    Row("negative-procs", lambda: _one(procs=-1), 400, "procs"),
    Row("sm-active-above-1", lambda: _one(sm_active=1.5), 400, "sm_active"),
    Row("memory-used-above-total", lambda: _one(mem_used_bytes=MEMORY + 1), 400, "mem_used_bytes"),
    Row("negative-memory-used", lambda: _one(mem_used_bytes=-1), 400, "mem_used_bytes"),
    Row("seconds-zero", lambda: _one(seconds=0), 400, "seconds"),
    Row("seconds-above-3600", lambda: _one(seconds=3601), 400, "seconds"),
    Row("seconds-fractional", lambda: _one(seconds=59.5), 400, "seconds"),
    Row(
        "throttle-above-seconds",
        lambda: _one(throttle_s={"thermal": 61}),
        400,
        "throttle_s.thermal",
    ),
    Row("active-above-seconds", lambda: _one(active_s=61), 400, "active_s"),
    Row("naive-timestamp", lambda: _one(start=iso(recent_minute())[:-1]), 400, "start"),
    Row("unparseable-timestamp", lambda: _one(start="yesterday at noon"), 400, "start"),
    Row("timestamp-not-a-string", lambda: _one(start=1_700_000_000), 400, "start"),
    Row("end-over-5-min-ahead", lambda: _one(start=_future_start()), 400, "start"),
    Row("start-before-retention", lambda: _one(start=_before_retention()), 400, "start"),
    Row(
        "crosses-an-hour",
        lambda: _one(
            start=iso(
                timezone.now().astimezone(dt.UTC).replace(minute=59, second=30, microsecond=0)
                - dt.timedelta(hours=2)
            ),
            seconds=60,
        ),
        400,
        "start",
    ),
    Row("missing-util", lambda: _one(util_pct=None), 400, "util_pct"),
    Row(
        "unknown-gpu",
        lambda: json.dumps(push_body([good_sample("GPU-nobody", recent_minute())])).encode(),
        400,
        "gpu",
    ),
    Row(
        "gpu-of-another-node",
        lambda: json.dumps(
            push_body([good_sample(OTHER_UUID, recent_minute())], [gpu_block(OTHER_UUID)])
        ).encode(),
        400,
        "gpu",
    ),
]


def _nothing_stored() -> None:
    assert Sample.objects.count() == 0
    assert not RollupPending.objects.exists()


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_ingest_input(row: Row, node_token: str) -> None:
    # The GPU of another node: registered by its own node first (docs/ingest.md: first wins).
    from fleet.models import Node

    other = Node.objects.create(hostname="the-other-node")
    Gpu.objects.create(uuid=OTHER_UUID, node=other, memory_total_bytes=MEMORY)

    with override_settings(**row.settings):
        response = _post(Client(), row.body(), node_token)

    assert response.status_code == row.status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    if row.level == "request":
        assert body["field"] == row.field, body
        assert body["detail"] and body["error"]
    else:
        assert body["accepted"] == 0 and body["duplicates"] == 0, body
        assert [r["index"] for r in body["rejected"]] == [0], body
        assert body["rejected"][0]["field"] == row.field, body
        assert body["rejected"][0]["error"]
    _nothing_stored()
    # The other node's GPU still belongs to it.
    assert Gpu.objects.get(uuid=OTHER_UUID).node_id == other.pk


def test_body_over_the_default_limit_is_refused_before_reading(node_token: str) -> None:
    """At the real default (8 MiB): the declared length alone is enough to answer 413."""
    from django.conf import settings

    limit = settings.INGEST_MAX_BODY_BYTES
    body = b'{"samples": [], "pad": "' + b"x" * limit + b'"}'
    response = _post(Client(), body, node_token)
    assert response.status_code == 413
    assert response.json()["field"] == "body"
    _nothing_stored()
    assert not Gpu.objects.exists()


def test_a_batch_with_good_and_bad_samples_stores_exactly_the_good(node_token: str) -> None:
    samples = [
        good_sample(UUID, recent_minute(5)),
        good_sample(UUID, recent_minute(6), util_pct=140),
        good_sample(UUID, recent_minute(7), mem_used_bytes=MEMORY * 2),
        good_sample(UUID, recent_minute(8)),
    ]
    body = json.dumps(push_body(samples, [gpu_block(UUID)])).encode()
    response = _post(Client(), body, node_token)
    assert response.status_code == 200
    answer = response.json()
    assert answer["accepted"] == 2 and answer["duplicates"] == 0
    assert [(r["index"], r["field"]) for r in answer["rejected"]] == [
        (1, "util_pct"),
        (2, "mem_used_bytes"),
    ]
    stored = {iso(s.start) for s in Sample.objects.all()}
    assert stored == {samples[0]["start"], samples[3]["start"]}


# --- authentication and roles -----------------------------------------------------------------
def test_wrong_token_401(node_token: str) -> None:
    wrong = node_token[:-4] + ("aaaa" if not node_token.endswith("aaaa") else "bbbb")
    for token in (wrong, "gfn_00000000_" + "x" * 43, "not-a-token", None):
        response = _post(Client(), _one(), token)
        assert response.status_code == 401, token
        assert response.json()["detail"]
        assert response["WWW-Authenticate"].startswith("Bearer")
    _nothing_stored()
    assert not Gpu.objects.exists()


def test_revoked_token_401(node_token: str) -> None:
    assert _post(Client(), _one(), node_token).status_code == 200
    Sample.objects.all().delete()
    RollupPending.objects.all().delete()
    token_revoke(prefix="_".join(node_token.split("_")[:2]))
    response = _post(Client(), _one(), node_token)
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]
    _nothing_stored()


def test_api_token_cannot_ingest(db: Any) -> None:
    _, api_token = api_token_issue(username="fin", role="finance")
    response = _post(Client(), _one(), api_token)
    assert response.status_code == 401
    _nothing_stored()


FINANCE = [
    "/api/v1/costs",
    "/api/v1/costs?format=csv",
    "/api/v1/breakeven?pool=p&tokens_per_s=1&api_price_per_mtok=1",
    "/api/v1/cost-profiles",
]


@pytest.mark.parametrize("url", FINANCE)
def test_finance_call_as_viewer_403(db: Any, url: str) -> None:
    _, token = api_token_issue(username="viewer-1", role="viewer")
    response = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 403
    assert "detail" in json.loads(
        b"".join(getattr(response, "streaming_content", [response.content]))
    )


@pytest.mark.parametrize("url", FINANCE)
def test_finance_call_with_node_token_refused(node_token: str, url: str) -> None:
    response = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {node_token}")
    assert response.status_code in (401, 403)
    assert "detail" in response.json()
