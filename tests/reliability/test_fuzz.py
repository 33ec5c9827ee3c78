"""Fuzzing: schemathesis over the project's own OpenAPI schema, in-process against the WSGI app,
as every role; and an end-to-end Hypothesis property of ingest through HTTP.

Bounded and seeded: ``derandomize=True`` (the same examples every run), a fixed number of
examples per operation, no deadline. Checks: no 5xx ever, and every response conforms to the
schema (status declared, content type, body shape).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.test import Client
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)
from schemathesis.generation import GenerationMode

from fleet.models import Gpu
from fleet.services import api_token_issue, node_token_issue
from telemetry.models import Sample
from tests.reliability.conftest import INGEST

# The schema as the code generates it now (the committed docs/openapi.yaml is held equal to
# it by tests/billing/test_schema.py).
_GENERATED = SchemaGenerator().get_schema(request=None, public=True)  # type: ignore[no-untyped-call]
RAW_SCHEMA = json.loads(json.dumps(_GENERATED, default=str))
SCHEMA = schemathesis.openapi.from_dict(RAW_SCHEMA)
OPERATIONS = {
    op.label: op
    for op in (r.ok() for r in SCHEMA.get_all_operations())  # type: ignore[union-attr]
}
# Examples per operation and generation mode. Writes get fewer: each one is a real write.
EXAMPLES = {"GET": 20, "POST": 15, "PUT": 10, "PATCH": 10, "DELETE": 8}
# Whether each status is documented is checked once, below, for every operation
# (test_every_operation_documents_its_statuses), rather than per fuzzed request.
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]
ROLES = ("viewer", "finance", "admin", "node", "anonymous")

APP = get_wsgi_application()


def test_schema_lists_every_api_operation() -> None:
    """The fuzzer sees the whole API: ingest, finance, inventory, schema."""
    paths = {label.split(" ", 1)[1] for label in OPERATIONS}
    assert {"/api/v1/ingest", "/api/v1/costs", "/api/v1/breakeven", "/api/v1/sites"} <= paths
    assert len(OPERATIONS) >= 30


@pytest.fixture
def wsgi_in_test_transaction() -> Any:
    """The WSGI handler closes the database connection at the end of each request, which
    would end the test's transaction: the test Client disconnects that handler, so do we."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_world(db: Any, wsgi_in_test_transaction: None) -> dict[str, Any]:
    """A small fleet with rollups, and a token for every role."""
    from billing.models import CostProfile
    from fleet.models import Node, Pool, Site, Team
    from telemetry.models import HourlyUsage

    site = Site.objects.create(name="fra1", pue="1.5", price_per_kwh="0.20", grid_g_per_kwh=400)
    team = Team.objects.create(name="research")
    pool = Pool.objects.create(name="inference", site=site, team=team)
    node, node_token = node_token_issue(hostname="gpu-07")
    Node.objects.filter(pk=node.pk).update(pool=pool)
    gpu = Gpu.objects.create(uuid="GPU-fuzz", node=node, index=0, memory_total_bytes=80 * 2**30)
    CostProfile.objects.create(
        scope_kind="pool",
        scope_name="inference",
        kind="owned",
        purchase_price="30000.00",
        depreciation_years="5",
        opex_per_hour="0.10",
    )
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(days=1)
    HourlyUsage.objects.bulk_create(
        HourlyUsage(
            gpu=gpu,
            hour=hour + dt.timedelta(hours=h),
            node=node,
            pool=pool,
            team=team,
            site=site,
            samples=60,
            observed_s=3600,
            air_s=3240 - 300 * h,
            held_s=360,
            energy_j=1_440_000,
            idle_energy_j=h * 1000,
            idle_s=h * 10,
            computed_at=timezone.now(),
        )
        for h in range(6)
    )
    tokens: dict[str, str | None] = {
        role: api_token_issue(username=f"fuzz-{role}", role=role)[1]
        for role in ("viewer", "finance", "admin")
    }
    tokens["node"] = node_token
    tokens["anonymous"] = None
    ids = {
        "sites": site.pk,
        "teams": team.pk,
        "pools": pool.pk,
        "nodes": node.pk,
        "gpus": gpu.pk,
        "cost-profiles": CostProfile.objects.get().pk,
    }
    return {"tokens": tokens, "ids": ids}


BIGINT_MAX = 2**63 - 1


def _huge_page(case: Any) -> bool:
    """``limit``/``offset`` beyond PostgreSQL's bigint on an inventory list (see below)."""
    query = case.query or {}
    for key in ("limit", "offset"):
        try:
            if abs(int(query.get(key, 0))) > BIGINT_MAX:
                return True
        except (TypeError, ValueError):
            pass
    return False


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


RELATED_NAMES = [
    ("pools", {"name": "p-nul", "site": "fra1\x00x"}),
    ("pools", {"name": "p-nul", "team": "research\x00x"}),
    ("nodes", {"hostname": "n-nul", "pool": "inference\x00x"}),
    ("gpus", {"uuid": "GPU-nul", "node": "gpu-07\x00x"}),
    ("gpus", {"uuid": "GPU-nul", "node": "gpu-07", "team": "research\x00x"}),
]


@pytest.mark.parametrize(("kind", "body"), RELATED_NAMES)
def test_nul_byte_in_a_related_name_is_not_a_server_error(
    kind: str, body: dict[str, Any], fuzz_world: dict[str, Any]
) -> None:
    """Found by the fuzzer: a NUL byte in a name that a write looks up (a node's pool, a GPU's
    node) reaches PostgreSQL, which refuses NUL in text: 503 "database error" for bad input.
    Plain CharFields reject NUL with a 400 (DRF's ProhibitNullCharactersValidator)."""
    token = fuzz_world["tokens"]["admin"]
    r = Client().post(
        f"/api/v1/{kind}",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert r.status_code == 400, (body, r.status_code, r.content[:200])


INVENTORY_LISTS = ["sites", "teams", "pools", "nodes", "gpus", "cost-profiles"]


@pytest.mark.parametrize("kind", INVENTORY_LISTS)
def test_huge_page_limit_is_not_a_server_error(kind: str, fuzz_world: dict[str, Any]) -> None:
    """Found by the fuzzer: ``?limit=<beyond bigint>`` reaches SQL's LIMIT unbounded, PostgreSQL
    raises NumericValueOutOfRange, and config.api answers 503 "database error" (a bad input
    must get a 4xx, docs/reliability.md). The default LimitOffsetPagination has no ``max_limit``."""
    token = fuzz_world["tokens"]["admin"]
    for query in (f"limit={10**30}", f"offset={10**30}", f"limit=5&offset={10**30}"):
        r = Client().get(f"/api/v1/{kind}?{query}", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert r.status_code in (200, 400), (query, r.status_code, r.content[:200])


# Statuses every operation can answer, by its kind, that its schema entry must declare.
def _statuses_due(label: str) -> set[str]:
    method, path = label.split(" ", 1)
    due = {"401", "403"}
    if path in ("/api/v1/schema",):
        due = {"401", "403"}
    if "{id}" in path:
        due.add("404")
    if method in ("POST", "PUT", "PATCH") or path in ("/api/v1/costs", "/api/v1/breakeven"):
        due.add("400")
    if path == "/api/v1/ingest":
        due = {"400", "401", "413", "503"}
    if label == "POST /api/v1/queue":  # the collector's push, as the ingest's
        due = {"400", "401", "403", "413", "503"}
    if label == "GET /api/v1/queue":
        due = {"400", "401", "403"}
    return due


def test_every_operation_documents_its_statuses() -> None:
    """Clients (and the fuzzer's status check) rely on the schema listing the error statuses
    an operation answers: 401 without credentials, 403 for the wrong role, 404 for a missing
    object, 400 for bad parameters or bodies."""
    missing = {}
    for path, item in RAW_SCHEMA["paths"].items():
        for method, op in item.items():
            label = f"{method.upper()} {path}"
            lacking = _statuses_due(label) - set(op.get("responses", {}))
            if lacking:
                missing[label] = sorted(lacking)
    assert not missing, missing


def _privileged(label: str) -> str:
    return "node" if label in ("POST /api/v1/ingest", "POST /api/v1/queue") else "admin"


def _strategy(label: str, world: dict[str, Any], mode: GenerationMode) -> Any:
    op = OPERATIONS[label]
    kind = label.split(" ", 1)[1].split("/")[3] if label.count("/") >= 4 else ""
    plain = op.as_strategy(generation_mode=mode)
    if "{id}" in label and kind in world["ids"]:
        # Half the time an object that exists, so the fuzzer gets past the 404.
        existing = op.as_strategy(generation_mode=mode, path_parameters={"id": world["ids"][kind]})
        return st.one_of(plain, existing)
    return plain


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_fuzz_operation(label: str, fuzz_world: dict[str, Any]) -> None:
    """Each generated request is sent as the role that may call the operation, then as one of
    the others in turn (so every role meets every operation): no 5xx, schema-conformant."""
    method = label.split(" ", 1)[0]
    main = _privileged(label)
    others = [r for r in ROLES if r != main]
    seen: dict[str, int] = {}
    counter = {"n": 0}

    @settings(
        max_examples=EXAMPLES.get(method, 10),
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def run(data: Any) -> None:
        mode = data.draw(st.sampled_from([GenerationMode.POSITIVE, GenerationMode.NEGATIVE]))
        case = data.draw(_strategy(label, fuzz_world, mode))
        other = others[counter["n"] % len(others)]
        counter["n"] += 1
        for role in (main, other):
            token = fuzz_world["tokens"][role]
            case.headers = {
                k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"
            }
            if token:
                case.headers["Authorization"] = f"Bearer {token}"
            response = case.call(app=APP)
            seen[f"{role}:{response.status_code}"] = (
                seen.get(f"{role}:{response.status_code}", 0) + 1
            )
            case.validate_response(response, checks=CHECKS)

    run()
    assert seen  # it really ran


# --- ingest, end to end through HTTP: a property ------------------------------------------------
MEM = 80_000_000_000
NUMBERS = st.one_of(
    st.floats(min_value=-10, max_value=110),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 60, 100, 3600, 5000, -0.0, 1e308, True, None]),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "12", "", "1e3"]),
)
SAMPLE = st.fixed_dictionaries(
    {
        "seconds": st.one_of(st.sampled_from([60, 30, 1, 3600, 0, 3601]), NUMBERS),
        "util_pct": NUMBERS,
    },
    optional={
        "mem_util_pct": NUMBERS,
        "mem_used_bytes": st.one_of(st.integers(min_value=-5, max_value=MEM + 5), NUMBERS),
        "procs": NUMBERS,
        "power_w": NUMBERS,
        "energy_j": NUMBERS,
        "temp_c": NUMBERS,
        "sm_clock_mhz": NUMBERS,
        "sm_active": st.one_of(st.floats(min_value=-0.5, max_value=1.5), NUMBERS),
        "active_s": NUMBERS,
        "throttle_s": st.one_of(
            NUMBERS,
            st.fixed_dictionaries(
                {},
                optional={
                    k: NUMBERS for k in ("power_cap", "thermal", "hw_slowdown", "other", "any")
                },
            ),
        ),
        "unknown_key": NUMBERS,
        # Where in its hour the sample starts, and which GPU it is for.
        "_offset": st.sampled_from([0, 30, 59, 1800, 3540, 3599]),
        "_start": st.sampled_from(["ok", "naive", "garbage", "future", "ancient", "number"]),
        "_gpu": st.sampled_from(["mine", "mine", "mine", "other", "unknown"]),
    },
)


def _in_ranges(s: Sample) -> bool:
    d = s.seconds

    def within(v: float | None, lo: float, hi: float) -> bool:
        return v is None or (math.isfinite(v) and lo <= v <= hi)

    throttles = (
        s.throttle_power_cap_s,
        s.throttle_thermal_s,
        s.throttle_hw_slowdown_s,
        s.throttle_other_s,
        s.throttle_any_s,
    )
    return (
        1 <= d <= 3600
        and int(s.start.timestamp()) % 3600 + d <= 3600
        and within(s.util_pct, 0, 100)
        and within(s.mem_util_pct, 0, 100)
        and within(s.mem_used_bytes, 0, MEM)
        and within(s.procs, 0, 32767)
        and within(s.power_w, 0, 5000)
        and within(s.energy_j, 0, 1e308)
        and within(s.temp_c, -50, 150)
        and within(s.sm_active, 0, 1)
        and within(s.active_s, 0, d)
        and all(within(t, 0, d) for t in throttles)
    )


def _encode(value: Any) -> str:
    """JSON as a careless agent writes it: NaN and Infinity as bare literals."""
    return json.dumps(value, allow_nan=True)


@pytest.mark.django_db
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(batch=st.lists(SAMPLE, min_size=1, max_size=8))
def test_ingest_property_through_http(batch: list[dict[str, Any]]) -> None:
    """Whatever a push holds: the answer is 200 or 400 (never 5xx), it accounts for every
    sample, exactly the accepted samples are stored, every stored one is within docs/ingest.md's
    ranges, no rejected one is stored, and another node's GPU is never written."""
    from fleet.models import Node, NodeToken

    Sample.objects.all().delete()
    node = Node.objects.filter(hostname="prop-http").first()
    if node is None:
        node, token = node_token_issue(hostname="prop-http")
        other = Node.objects.create(hostname="prop-other")
        Gpu.objects.create(uuid="GPU-prop-other", node=other, memory_total_bytes=MEM)
        test_ingest_property_through_http.token = token
    token = test_ingest_property_through_http.token
    assert NodeToken.objects.filter(node=node).exists()
    base = timezone.now().astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    samples = []
    for i, fields in enumerate(batch):
        fields = dict(fields)
        offset = fields.pop("_offset", 0)
        how = fields.pop("_start", "ok")
        which = fields.pop("_gpu", "mine")
        # One hour per sample, hours apart, so index i is a distinct (gpu, start).
        start = base - dt.timedelta(hours=2 + i) + dt.timedelta(seconds=offset)
        start_value: Any = {
            "ok": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "naive": start.strftime("%Y-%m-%dT%H:%M:%S"),
            "garbage": "the day before yesterday",
            "future": (base + dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ancient": (base - dt.timedelta(days=40)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "number": start.timestamp(),
        }[how]
        gpu = {"mine": "GPU-prop-mine", "other": "GPU-prop-other", "unknown": "GPU-prop-x"}[which]
        samples.append({"gpu": gpu, "start": start_value, **fields})
    body = _encode(
        {
            "node": {"hostname": "prop-http"},
            "samples": samples,
            "gpus": [
                {"uuid": "GPU-prop-mine", "index": 0, "memory_total_bytes": MEM},
                {"uuid": "GPU-prop-other", "index": 1, "memory_total_bytes": 1},
            ],
        }
    )

    r = Client().post(
        INGEST, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )

    assert r.status_code in (200, 400), r.content[:500]
    answer = r.json()
    if "field" in answer:  # the whole push refused: nothing stored
        assert r.status_code == 400
        assert not Sample.objects.exists()
        return
    rejected = {x["index"] for x in answer["rejected"]}
    assert all(x["field"] and x["error"] for x in answer["rejected"])
    assert answer["duplicates"] == 0
    assert answer["accepted"] + len(rejected) == len(samples)
    assert r.status_code == (400 if not answer["accepted"] else 200)
    rows = list(Sample.objects.select_related("gpu"))
    assert len(rows) == answer["accepted"]
    assert all(row.gpu.uuid == "GPU-prop-mine" for row in rows)
    stored = {row.start for row in rows}
    for i in rejected:
        start = base - dt.timedelta(hours=2 + i) + dt.timedelta(seconds=batch[i].get("_offset", 0))
        if batch[i].get("_start", "ok") == "ok":
            assert start not in stored, (i, answer)
    for row in rows:
        assert _in_ranges(row), row.__dict__
    assert Gpu.objects.get(uuid="GPU-prop-other").memory_total_bytes == MEM
