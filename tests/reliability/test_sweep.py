"""A bounded, seeded Hypothesis sweep of everything input bytes can reach (issue 13):

- arbitrary JSON to ``POST /api/v1/ingest`` (deep nesting, lone surrogates, huge and tiny
  numbers, NaN literals, long strings, huge lists), both as whole bodies and planted into one
  field of an otherwise valid push: no answer is a 5xx, every answer is JSON, and nothing
  invalid is stored (every stored sample, GPU and node passes the rules of docs/ingest.md);
- arbitrary query strings to every GET route of the URL matrix, as each kind of caller: no
  answer is a 5xx.

``derandomize=True``: the same examples every run (CI sees what a developer saw); the example
counts bound the time (about a minute on two cores).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any
from urllib.parse import quote

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.identifiers import identifier_error, text_error
from fleet.models import Gpu, Node
from fleet.services import node_token_issue
from telemetry.models import Sample
from tests.reliability.conftest import good_sample, gpu_block, push_body, recent_minute
from tests.reliability.test_hardening import _post
from tests.reliability.test_url_matrix import TABLE, _client, world  # noqa: F401


def sweep(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# --- values a hostile client sends -----------------------------------------------------------
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e-320, 5e-324, 1e308, 2**63, 2**64, 3600, 3601, 100.0000001]),
)
_strings = st.one_of(
    st.text(max_size=30),
    st.text(st.characters(codec=None, categories=["Cs", "Cc", "Zl", "Zp", "Cf"]), max_size=5),
    st.sampled_from(["", "..", "a/b", "\\", "2026-11-30T09:00:00Z", "NaN", "0001-01-01T00:00:00Z"]),
    st.integers(min_value=101, max_value=3000).map(lambda n: "x" * n),
)
_scalars = st.one_of(st.none(), st.booleans(), _numbers, _strings)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(_strings, inner, max_size=6)
    ),
    max_leaves=25,
)
# Where a planted value goes in a valid push.
_FIELDS = [
    ("samples",),
    ("gpus",),
    ("node",),
    ("samples", 0),
    ("samples", 0, "gpu"),
    ("samples", 0, "start"),
    ("samples", 0, "seconds"),
    ("samples", 0, "util_pct"),
    ("samples", 0, "mem_used_bytes"),
    ("samples", 0, "procs"),
    ("samples", 0, "energy_j"),
    ("samples", 0, "throttle_s"),
    ("samples", 0, "throttle_s", "thermal"),
    ("samples", 0, "active_s"),
    ("samples", 0, "sm_active"),
    ("samples", 0, "prof_s"),
    ("samples", 0, "tensor_active"),
    ("samples", 0, "workloads"),
    ("gpus", 0),
    ("gpus", 0, "uuid"),
    ("gpus", 0, "name"),
    ("gpus", 0, "index"),
    ("gpus", 0, "memory_total_bytes"),
    ("gpus", 0, "status"),
    ("node", "hostname"),
    ("node", "agent_version"),
    ("node", "spool_dropped_samples"),
]


def _deep(depth: int, opener: str) -> bytes:
    closer = "]" if opener == "[" else "}"
    inner = opener if opener == "[" else '{"a":'
    return (
        '{"samples": [' + inner * depth + "1" * (opener == "{") + closer * depth + "]}"
    ).encode()


_bodies = st.one_of(
    _json.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.integers(min_value=500, max_value=200_000), st.sampled_from(["[", "{"])).map(
        lambda t: _deep(*t)
    ),
    st.binary(max_size=200),
)


def _planted(value: Any, where: tuple[Any, ...], uuid: str) -> bytes:
    body = push_body([good_sample(uuid, recent_minute())], [gpu_block(uuid)])
    target: Any = body
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    return json.dumps(body).encode()


def _stored_is_valid(node: Node) -> None:
    """Everything ingest stored obeys the wire format's rules (docs/ingest.md)."""
    now = timezone.now()
    for s in Sample.objects.select_related("gpu"):
        assert s.gpu.node_id == node.pk
        assert 1 <= s.seconds <= 3600 and 0 <= s.util_pct <= 100
        assert s.start.timestamp() % 3600 + s.seconds <= 3600
        assert s.start + dt.timedelta(seconds=s.seconds) <= now + dt.timedelta(minutes=5)
        for value in (s.energy_j, s.power_w, s.mem_util_pct, s.active_s, s.sm_active):
            assert value is None or (math.isfinite(value) and value >= 0)
    for gpu in Gpu.objects.all():
        assert identifier_error(gpu.uuid, max_length=100) is None, gpu.uuid
        assert text_error(gpu.name, max_length=100) is None
    reported = Node.objects.get(pk=node.pk).reported_hostname
    assert not reported or identifier_error(reported, max_length=255) is None


@pytest.fixture
def sweep_node(db: Any) -> tuple[Node, str]:
    return node_token_issue(hostname="sweep-node")


@sweep(150)
@given(body=_bodies)
def test_arbitrary_bodies_never_5xx_and_store_nothing_invalid(
    sweep_node: tuple[Node, str], body: bytes
) -> None:
    node, token = sweep_node
    r = _post(body, token)
    assert r.status_code < 500, (r.status_code, body[:200])
    assert r["Content-Type"] == "application/json"
    _stored_is_valid(node)


@sweep(250)
@given(value=_json, where=st.sampled_from(_FIELDS), n=st.integers(min_value=0, max_value=10**6))
def test_a_bad_value_in_any_field_never_5xx_and_stores_nothing_invalid(
    sweep_node: tuple[Node, str], value: Any, where: tuple[Any, ...], n: int
) -> None:
    node, token = sweep_node
    r = _post(_planted(value, where, f"GPU-sweep-{n}"), token)
    assert r.status_code < 500, (r.status_code, where, value)
    assert r["Content-Type"] == "application/json"
    _stored_is_valid(node)


@sweep(20)
@given(
    gpus=st.integers(min_value=0, max_value=300),
    samples=st.integers(min_value=0, max_value=3000),
    text=st.integers(min_value=0, max_value=100_000),
)
def test_huge_lists_and_strings_are_refused_or_bounded(
    sweep_node: tuple[Node, str], gpus: int, samples: int, text: int
) -> None:
    node, token = sweep_node
    start = recent_minute()
    body = push_body(
        [good_sample("GPU-big-0", start)] * samples,
        [gpu_block(f"GPU-big-{i}", i % 8) for i in range(gpus)],
        hostname="h" * text,
    )
    r = _post(body, token)
    assert r.status_code < 500
    assert Gpu.objects.filter(node=node).count() <= 64  # NODE_MAX_GPUS
    _stored_is_valid(node)


# --- query strings ----------------------------------------------------------------------------
_PARAMS = [
    "from", "to", "site", "pool", "team", "model", "sort", "dir", "order", "page", "start",
    "end", "group_by", "period", "format", "limit", "offset", "retired", "node", "uuid",
    "hostname", "name", "name__icontains", "cost_center", "tokens_per_s", "price_mode",
    "api_price_per_mtok", "api_input_price_per_mtok", "api_output_price_per_mtok",
    "output_share", "rental_rate_per_hour", "week", "part", "chart", "scope_kind", "kind",
]  # fmt: skip
_query_values = st.one_of(
    _strings,
    _numbers.map(str),
    st.sampled_from(
        [
            "0001-01-01",
            "9999-12-31",
            "2026-02-30",
            "1999-12-31",
            "2101-01-01",
            "0001-W01",
            "9999-W53",
            "-1",
            "1e999",
            "nan",
            "%FF",
            "%00",
            "true",
            "csv",
            "json",
            "xml",
            "99999999999999999999999",
        ]  # fmt: skip
    ),
)
_queries = st.lists(
    st.tuples(st.one_of(st.sampled_from(_PARAMS), _strings), _query_values), max_size=6
)
_GET_CHECKS = [
    (pattern, check)
    for pattern, checks in sorted(TABLE.items())
    for check in checks
    if check.method == "GET" and pattern != "admin/"
]
_CALLERS = ("viewer", "finance", "admin", "admin-token", "finance-token", "node")


def _query_string(pairs: list[tuple[str, str]]) -> str:
    """As a client may send it: percent-encoded UTF-8, surrogates and all (as their escapes)."""

    def enc(text: str) -> str:
        return quote(text.encode("utf-8", "surrogatepass"), safe="%")

    return "&".join(f"{enc(k)}={enc(v)}" for k, v in pairs)


@pytest.mark.parametrize(("pattern", "check"), _GET_CHECKS, ids=[p for p, _ in _GET_CHECKS])
def test_arbitrary_query_strings_never_5xx(
    world: dict[str, Any],  # noqa: F811
    pattern: str,
    check: Any,
) -> None:
    url = check.url(world)
    path, _, fixed = url.partition("?")

    @sweep(12)
    @given(pairs=_queries, caller=st.sampled_from(_CALLERS))
    def one(pairs: list[tuple[str, str]], caller: str) -> None:
        client, headers = _client(world, caller)
        query = "&".join(part for part in (fixed, _query_string(pairs)) if part)
        response = client.get(path, QUERY_STRING=query, **headers)
        if hasattr(response, "streaming_content"):
            b"".join(response.streaming_content)
        assert response.status_code < 500, (caller, path, query, response.status_code)

    one()
