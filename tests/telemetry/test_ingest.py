"""POST /api/v1/ingest: the wire format (docs/ingest.md) and every bad input of docs/reliability.md.

Each bad input is checked for its status, the field its body names, and that nothing was
stored. Times are relative to the real clock (the server checks them against it).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from fleet.models import Gpu, Node
from fleet.services import node_token_issue, token_revoke
from telemetry.models import RollupPending, Sample

URL = "/api/v1/ingest"
OTHER_NODE_REJECT = {
    "field": "gpu",
    "error": "this GPU belongs to another node",
    "code": "other_node",
}
H100 = "NVIDIA H100 80GB HBM3"
MEM = 85_899_345_920


def iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hour_floor(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


@pytest.fixture
def base() -> dt.datetime:
    """The start of the hour three hours ago: the next two hours are safely in the past too."""
    return hour_floor(timezone.now()) - dt.timedelta(hours=3)


def gpu_block(uuid: str, index: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "index": index,
        "name": H100,
        "memory_total_bytes": MEM,
        "power_limit_w": 700.0,
        **extra,
    }


def sample(uuid: str, start: dt.datetime, **fields: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "gpu": uuid,
        "start": iso(start),
        "seconds": 60,
        "util_pct": 73.5,
        "mem_util_pct": 41.0,
        "mem_used_bytes": 61_000_000_000,
        "procs": 1,
        "power_w": 512.3,
        "energy_j": 30738.0,
        "temp_c": 68,
        "sm_clock_mhz": 1980,
        "throttle_s": {"power_cap": 0, "thermal": 0, "hw_slowdown": 0, "other": 0, "any": 0},
    }
    s.update(fields)
    return s


def push(
    samples: list[dict[str, Any]], gpus: list[dict[str, Any]] | None = None, **node: Any
) -> bytes:
    body = {
        "node": {
            "hostname": "gpu-07",
            "agent_version": "1.0.0",
            "driver_version": "550.54.15",
            **node,
        },
        "gpus": gpus if gpus is not None else [],
        "samples": samples,
    }
    return json.dumps(body).encode()  # the stdlib writes float("nan") as a bare NaN literal


@pytest.fixture
def agent(db: Any, client: Any) -> Callable[..., Any]:
    """``agent()`` → an object that posts pushes with a fresh node's token."""

    class Agent:
        def __init__(self, hostname: str) -> None:
            self.node, self.token = node_token_issue(hostname=hostname)

        def post(self, body: bytes, **headers: Any) -> Any:
            return client.post(
                URL,
                data=body,
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {self.token}",
                **headers,
            )

    counter = {"n": 0}

    def make(hostname: str | None = None) -> Agent:
        counter["n"] += 1
        return Agent(hostname or f"node-{counter['n']}")

    return make


def stored() -> int:
    return Sample.objects.count()


# --- the happy path ---------------------------------------------------------------------------
@pytest.mark.smoke
def test_push_stores_samples_registers_gpus_and_node_metadata(agent: Any, base: Any) -> None:
    a = agent()
    gpus = [gpu_block("GPU-a", 0), gpu_block("GPU-b", 1, name="NVIDIA L40S")]
    samples = [
        sample("GPU-a", base + dt.timedelta(minutes=m), util_pct=10.0 * m, unknown_key=1)
        for m in range(3)
    ] + [sample("GPU-b", base + dt.timedelta(minutes=59), energy_j=None, power_w=300.0)]
    r = a.post(push(samples, gpus, spool_dropped_samples=4, extra="ignored"))
    assert r.status_code == 200, r.content
    assert r.json() == {"accepted": 4, "duplicates": 0, "rejected": []}

    gpu_a = Gpu.objects.get(uuid="GPU-a")
    gpu_b = Gpu.objects.get(uuid="GPU-b")
    assert (gpu_a.node_id, gpu_a.index, gpu_a.memory_total_bytes) == (a.node.pk, 0, MEM)
    assert gpu_a.model is not None and gpu_a.model.key == "H100-SXM"
    assert gpu_b.model is not None and gpu_b.model.key == "L40S"
    assert gpu_a.first_seen_at == base
    assert gpu_a.last_seen_at == base + dt.timedelta(minutes=3)  # end of the latest sample
    assert gpu_b.first_seen_at == base + dt.timedelta(minutes=59)

    rows = {(s.gpu_id, s.start): s for s in Sample.objects.all()}
    assert len(rows) == 4
    s = rows[(gpu_a.pk, base + dt.timedelta(minutes=2))]
    assert (s.seconds, s.util_pct, s.mem_used_bytes, s.procs, s.power_w) == (
        60,
        20.0,
        61_000_000_000,
        1,
        512.3,
    )
    assert (s.energy_j, s.temp_c, s.throttle_thermal_s, s.throttle_any_s) == (30738.0, 68.0, 0, 0)
    assert rows[(gpu_b.pk, base + dt.timedelta(minutes=59))].energy_j is None

    node = Node.objects.get(pk=a.node.pk)
    assert (node.reported_hostname, node.agent_version, node.driver_version) == (
        "gpu-07",
        "1.0.0",
        "550.54.15",
    )
    assert node.last_seen_at is not None
    assert node.spool_dropped_total == 4
    assert set(RollupPending.objects.values_list("hour", flat=True)) == {base}
    assert RollupPending.objects.filter(hour=base).exists()  # stored as Django stores it


@pytest.mark.smoke
def test_replay_changes_nothing_and_counts_duplicates(agent: Any, base: Any) -> None:
    a = agent()
    first = [sample("GPU-r", base + dt.timedelta(minutes=m)) for m in range(5)]
    assert a.post(push(first, [gpu_block("GPU-r")])).json()["accepted"] == 5
    before = list(Sample.objects.order_by("start").values_list("start", "util_pct", "received_at"))
    versions = dict(RollupPending.objects.values_list("hour", "version"))

    # The same samples again, with other values, plus one new and one twice in the batch.
    replay = [sample("GPU-r", base + dt.timedelta(minutes=m), util_pct=99.0) for m in range(5)]
    replay += [sample("GPU-r", base + dt.timedelta(minutes=7))] * 2
    r = a.post(push(replay, agent_version="1.0.1", spool_dropped_samples=2))
    assert r.status_code == 200
    assert r.json() == {"accepted": 1, "duplicates": 6, "rejected": []}
    node = Node.objects.get(pk=a.node.pk)
    assert (node.agent_version, node.spool_dropped_total) == ("1.0.1", 2)
    after = list(Sample.objects.order_by("start").values_list("start", "util_pct", "received_at"))
    assert after[:5] == before
    assert len(after) == 6

    # A pure replay stores nothing and marks nothing.
    versions = dict(RollupPending.objects.values_list("hour", "version"))
    r = a.post(push(replay[:5]))
    assert r.json() == {"accepted": 0, "duplicates": 5, "rejected": []}
    assert dict(RollupPending.objects.values_list("hour", "version")) == versions


def test_hours_marked_once_per_hour_touched(agent: Any, base: Any, postgres: Any) -> None:
    a = agent()
    samples = [sample("GPU-h", base + dt.timedelta(minutes=m)) for m in (0, 30, 59, 60, 61, 125)]
    assert a.post(push(samples, [gpu_block("GPU-h")])).json()["accepted"] == 6
    marks = dict(RollupPending.objects.values_list("hour", "version"))
    assert marks == {base: 1, base + dt.timedelta(hours=1): 1, base + dt.timedelta(hours=2): 1}
    # A later sample in one hour bumps only that hour's version.
    a.post(push([sample("GPU-h", base + dt.timedelta(minutes=90))]))
    marks = dict(RollupPending.objects.values_list("hour", "version"))
    assert marks == {base: 1, base + dt.timedelta(hours=1): 2, base + dt.timedelta(hours=2): 1}


def test_first_seen_lowered_by_late_earlier_sample(agent: Any, base: Any) -> None:
    a = agent()
    a.post(push([sample("GPU-f", base + dt.timedelta(minutes=30))], [gpu_block("GPU-f")]))
    gpu = Gpu.objects.get(uuid="GPU-f")
    assert gpu.first_seen_at == base + dt.timedelta(minutes=30)
    a.post(push([sample("GPU-f", base - dt.timedelta(hours=5))]))
    gpu.refresh_from_db()
    assert gpu.first_seen_at == base - dt.timedelta(hours=5)
    assert gpu.last_seen_at == base + dt.timedelta(minutes=31)  # not moved back


def test_lost_gpu_and_spool_drops(agent: Any, base: Any) -> None:
    a = agent()
    a.post(push([sample("GPU-l", base)], [gpu_block("GPU-l"), gpu_block("GPU-m", 1)]))
    assert Gpu.objects.get(uuid="GPU-l").lost_at is None
    r = a.post(
        push(
            [],
            [gpu_block("GPU-l", status="lost"), gpu_block("GPU-m", 1, status="lost")],
            spool_dropped_samples=7,
        )
    )
    assert r.status_code == 200 and r.json() == {"accepted": 0, "duplicates": 0, "rejected": []}
    lost_l = Gpu.objects.get(uuid="GPU-l").lost_at
    lost_m = Gpu.objects.get(uuid="GPU-m").lost_at
    assert lost_l is not None and lost_m is not None
    a.post(push([], [], spool_dropped_samples=5))
    assert Node.objects.get(pk=a.node.pk).spool_dropped_total == 12
    # Still lost: the time it was first reported stands. Listed present again: cleared. Not
    # listed at all: unchanged.
    a.post(push([], [gpu_block("GPU-l", status="lost"), gpu_block("GPU-m", 1, status="lost")]))
    assert Gpu.objects.get(uuid="GPU-l").lost_at == lost_l
    a.post(push([sample("GPU-l", base + dt.timedelta(minutes=5))], [gpu_block("GPU-l")]))
    assert Gpu.objects.get(uuid="GPU-l").lost_at is None
    assert Gpu.objects.get(uuid="GPU-m").lost_at == lost_m


def test_gpu_metadata_refreshed_from_block(agent: Any, base: Any) -> None:
    a = agent()
    a.post(push([], [gpu_block("GPU-u", 0, name="NVIDIA A100-SXM4-80GB")]))
    a.post(push([], [gpu_block("GPU-u", 3, memory_total_bytes=MEM // 2, power_limit_w=400.0)]))
    gpu = Gpu.objects.get(uuid="GPU-u")
    assert (gpu.index, gpu.memory_total_bytes, gpu.power_limit_w, gpu.name) == (
        3,
        MEM // 2,
        400.0,
        H100,
    )
    assert gpu.model is not None and gpu.model.key == "H100-SXM"


# --- ownership and tokens ----------------------------------------------------------------------
def test_gpu_of_another_node_is_rejected_and_not_moved(agent: Any, base: Any) -> None:
    a, b = agent(), agent()
    a.post(push([sample("GPU-o", base)], [gpu_block("GPU-o")]))
    r = b.post(push([sample("GPU-o", base + dt.timedelta(minutes=1))], [gpu_block("GPU-o")]))
    assert r.status_code == 400
    assert r.json()["rejected"] == [
        {
            "index": 0,
            "field": "gpu",
            "error": "this GPU belongs to another node",
            "code": "other_node",
        }
    ]
    assert Gpu.objects.get(uuid="GPU-o").node_id == a.node.pk
    assert stored() == 1


def test_unknown_gpu_without_block_is_rejected(agent: Any, base: Any) -> None:
    r = agent().post(push([sample("GPU-nobody", base)]))
    assert r.status_code == 400
    assert r.json()["rejected"][0]["field"] == "gpu"
    assert stored() == 0 and not Gpu.objects.exists()


@pytest.mark.smoke
def test_wrong_or_revoked_token_is_401(agent: Any, client: Any, base: Any) -> None:
    a = agent()
    body = push([sample("GPU-t", base)], [gpu_block("GPU-t")])
    prefix = "_".join(a.token.split("_")[:2])
    token_revoke(prefix=prefix)
    r = a.post(body)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    for auth in ("", "Bearer nonsense", f"Bearer {a.token}x", "Bearer gfa_12345678_secret"):
        r = client.post(URL, data=body, content_type="application/json", HTTP_AUTHORIZATION=auth)
        assert r.status_code == 401, auth
    assert stored() == 0 and not Gpu.objects.exists()


@pytest.mark.parametrize("path", ["one statement", "copy", "empty push", "new GPU only"])
def test_token_revoked_while_cached_is_401(agent: Any, base: Any, postgres: Any, path: str) -> None:
    """Authentication caches the token per process; a revocation made elsewhere (no signal
    here: token_revoke updates in SQL) still refuses the next push on every write path."""
    from unittest import mock

    from fleet.authentication import _node_tokens

    a = agent()
    assert a.post(push([sample("GPU-v", base)], [gpu_block("GPU-v")])).status_code == 200
    assert a.post(push([sample("GPU-v", base + dt.timedelta(minutes=1))])).status_code == 200
    prefix = "_".join(a.token.split("_")[:2])
    assert prefix in _node_tokens  # the next push authenticates from the cache
    before = (stored(), Gpu.objects.count(), Node.objects.get(pk=a.node.pk).spool_dropped_total)
    token_revoke(prefix=prefix)
    later = [sample("GPU-v", base + dt.timedelta(minutes=m)) for m in (5, 6)]
    bodies = {
        "one statement": push(later, spool_dropped_samples=2),
        "copy": push(later, spool_dropped_samples=2),
        "empty push": push([]),
        "new GPU only": push([], [gpu_block("GPU-v2", 1)]),
    }
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", 0 if path == "copy" else 64):
        r = a.post(bodies[path])
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert r["WWW-Authenticate"] == 'Bearer realm="ingest"'
    after = (stored(), Gpu.objects.count(), Node.objects.get(pk=a.node.pk).spool_dropped_total)
    assert after == before
    assert prefix not in _node_tokens
    assert a.post(bodies[path]).status_code == 401  # and from the database from now on


# --- bad input (docs/reliability.md) -----------------------------------------------------
BAD_SAMPLES: list[tuple[str, dict[str, Any], str]] = [
    ("util over 100", {"util_pct": 100.5}, "util_pct"),
    ("util negative", {"util_pct": -1}, "util_pct"),
    ("util as string", {"util_pct": "50"}, "util_pct"),
    ("util NaN string", {"util_pct": "NaN"}, "util_pct"),
    ("util Infinity string", {"util_pct": "Infinity"}, "util_pct"),
    ("util NaN literal", {"util_pct": float("nan")}, "util_pct"),
    ("util Infinity literal", {"util_pct": float("inf")}, "util_pct"),
    ("util huge", {"util_pct": 1e400}, "util_pct"),
    ("util bool", {"util_pct": True}, "util_pct"),
    ("util null", {"util_pct": None}, "util_pct"),
    ("mem util over 100", {"mem_util_pct": 101}, "mem_util_pct"),
    ("seconds 0", {"seconds": 0}, "seconds"),
    ("seconds 3601", {"seconds": 3601}, "seconds"),
    ("seconds string", {"seconds": "60"}, "seconds"),
    ("seconds fraction", {"seconds": 60.5}, "seconds"),
    ("power over 5000", {"power_w": 5000.1}, "power_w"),
    ("power negative", {"power_w": -3}, "power_w"),
    ("power -Infinity literal", {"power_w": float("-inf")}, "power_w"),
    ("energy negative", {"energy_j": -0.5}, "energy_j"),
    ("energy string", {"energy_j": "1"}, "energy_j"),
    ("temp too cold", {"temp_c": -51}, "temp_c"),
    ("temp too hot", {"temp_c": 150.5}, "temp_c"),
    ("throttle above seconds", {"throttle_s": {"thermal": 61}}, "throttle_s.thermal"),
    ("throttle negative", {"throttle_s": {"power_cap": -1}}, "throttle_s.power_cap"),
    ("throttle any above seconds", {"throttle_s": {"any": 60.5}}, "throttle_s.any"),
    ("throttle string", {"throttle_s": {"other": "0"}}, "throttle_s.other"),
    ("memory above total", {"mem_used_bytes": MEM + 1}, "mem_used_bytes"),
    ("memory negative", {"mem_used_bytes": -1}, "mem_used_bytes"),
    ("memory beyond bigint", {"mem_used_bytes": 2**70}, "mem_used_bytes"),
    ("procs negative", {"procs": -1}, "procs"),
    ("procs beyond smallint", {"procs": 40_000}, "procs"),
    ("sm_active above 1", {"sm_active": 1.01}, "sm_active"),
    ("active_s above seconds", {"active_s": 61}, "active_s"),
    ("clock NaN string", {"sm_clock_mhz": "NaN"}, "sm_clock_mhz"),
    ("naive timestamp", {"start": "@naive"}, "start"),
    ("unparseable timestamp", {"start": "30/11/2026 09:00"}, "start"),
    ("timestamp as number", {"start": 1796029200}, "start"),
    ("start not on the interval", {"start": "@+30s"}, "start"),
    ("start not on a whole second", {"start": "@+0.5s"}, "start"),
    ("interval crosses the hour", {"start": "@+59m", "seconds": 120}, "start"),
    ("interval ends in the future", {"start": "@future"}, "start"),
    ("start before retention", {"start": "@old"}, "start"),
    ("gpu missing", {"gpu": None}, "gpu"),
    ("util missing", {"util_pct": "@drop"}, "util_pct"),
    ("start missing", {"start": "@drop"}, "start"),
    ("sample not an object", {"@replace": [1, 2]}, "sample"),
]


def _bad_sample(base: dt.datetime, change: dict[str, Any]) -> Any:
    if "@replace" in change:
        return change["@replace"]
    s = sample("GPU-x", base)
    for key, value in change.items():
        if value == "@drop":
            del s[key]
        elif value == "@naive":
            s[key] = base.replace(tzinfo=None).isoformat()
        elif value == "@+30s":
            s[key] = iso(base + dt.timedelta(seconds=30))
        elif value == "@+0.5s":
            s[key] = (base + dt.timedelta(seconds=0.5)).isoformat()
        elif value == "@+59m":
            s[key] = iso(base + dt.timedelta(minutes=59))
        elif value == "@future":
            now = timezone.now()
            s[key] = iso(now.replace(second=0, microsecond=0) + dt.timedelta(minutes=6))
        elif value == "@old":
            old = base - dt.timedelta(days=settings.RAW_RETENTION_DAYS, hours=1)
            s[key] = iso(old)
        else:
            s[key] = value
    return s


@pytest.mark.parametrize(
    ("change", "field"), [(c, f) for _, c, f in BAD_SAMPLES], ids=[n for n, _, _ in BAD_SAMPLES]
)
def test_bad_sample_is_rejected_naming_its_field(
    agent: Any, base: Any, change: Any, field: Any
) -> None:
    a = agent()
    a.post(push([], [gpu_block("GPU-x")]))  # registered: only the sample is at fault
    r = a.post(push([_bad_sample(base, change)]))
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["accepted"] == 0 and body["duplicates"] == 0
    assert len(body["rejected"]) == 1
    assert body["rejected"][0]["index"] == 0
    assert body["rejected"][0]["field"] == field, body
    assert body["rejected"][0]["error"]
    assert stored() == 0
    assert not RollupPending.objects.exists()


@pytest.mark.smoke
def test_mixed_batch_stores_the_valid_samples(agent: Any, base: Any) -> None:
    a = agent()
    samples: list[Any] = [
        sample("GPU-mx", base),
        sample("GPU-mx", base + dt.timedelta(minutes=1), util_pct=101),
        sample("GPU-mx", base + dt.timedelta(minutes=2)),
        sample("GPU-mx", base + dt.timedelta(minutes=3), temp_c="hot"),
        sample("GPU-mx", base + dt.timedelta(minutes=4), power_w=float("nan")),
        sample("GPU-mx", base + dt.timedelta(minutes=5)),
    ]
    r = a.post(push(samples, [gpu_block("GPU-mx")]))
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["accepted"], body["duplicates"]) == (3, 0)
    assert [(x["index"], x["field"]) for x in body["rejected"]] == [
        (1, "util_pct"),
        (3, "temp_c"),
        (4, "power_w"),
    ]
    starts = sorted(Sample.objects.values_list("start", flat=True))
    assert starts == [base + dt.timedelta(minutes=m) for m in (0, 2, 5)]


def test_partial_interval_keeps_its_aligned_start(agent: Any, base: Any) -> None:
    """A 60 s interval the agent saw only 23 s of starts on the minute with seconds=23."""
    a = agent()
    r = a.post(
        push(
            [
                sample(
                    "GPU-p", base + dt.timedelta(minutes=1), seconds=23, throttle_s={"thermal": 23}
                )
            ],
            [gpu_block("GPU-p")],
        )
    )
    assert r.json() == {"accepted": 1, "duplicates": 0, "rejected": []}


BAD_PUSHES: list[tuple[str, bytes, str]] = [
    ("truncated JSON", b'{"samples": [', "body"),
    ("not JSON", b"hello", "body"),
    ("empty body", b"", "body"),
    ("JSON array", b"[]", "body"),
    ("samples missing", b'{"gpus": []}', "samples"),
    ("samples not a list", b'{"samples": {}}', "samples"),
    ("NUL in a string", b'{"samples": [], "node": {"hostname": "a\\u0000b"}}', "body"),
    ("gpu block uuid missing", b'{"samples": [], "gpus": [{"index": 0}]}', "gpus[0].uuid"),
    (
        "gpu block memory string",
        b'{"samples": [], "gpus": [{"uuid": "G", "memory_total_bytes": "1"}]}',
        "gpus[0].memory_total_bytes",
    ),
    (
        "node spool_dropped_samples negative",
        b'{"samples": [], "node": {"spool_dropped_samples": -1}}',
        "node.spool_dropped_samples",
    ),
    (
        "node agent_version too long",
        b'{"samples": [], "node": {"agent_version": "' + b"9" * 51 + b'"}}',
        "node.agent_version",
    ),
]


@pytest.mark.parametrize(
    ("body", "field"), [(b, f) for _, b, f in BAD_PUSHES], ids=[n for n, _, _ in BAD_PUSHES]
)
def test_bad_push_is_400_naming_the_field(agent: Any, body: Any, field: Any) -> None:
    r = agent().post(body)
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field, r.json()
    assert stored() == 0 and not Gpu.objects.exists()


def test_body_over_the_limit_is_413_before_reading(agent: Any, base: Any) -> None:
    a = agent()
    body = push([sample("GPU-big", base)], [gpu_block("GPU-big")])
    with override_settings(INGEST_MAX_BODY_BYTES=len(body) - 1):
        r = a.post(body)
        assert r.status_code == 413
        assert r.json()["field"] == "body"
        # gzip: the inflated size counts (a small bomb is refused too).
        r = a.post(gzip.compress(body), HTTP_CONTENT_ENCODING="gzip")
        assert r.status_code == 413 and r.json()["field"] == "body"
    r = a.post(gzip.compress(body), HTTP_CONTENT_ENCODING="gzip")
    assert r.status_code == 200 and r.json()["accepted"] == 1


def test_actual_read_is_capped_when_content_length_lies(rf: Any, agent: Any) -> None:
    """A server that hands over more than Content-Length said (or none) is still capped."""
    import io

    from telemetry.api.views import _body_read

    request = rf.post(URL, data=b"x" * 100, content_type="application/json")
    request._stream = io.BytesIO(b"x" * 100)  # the stream runs past the declared length
    request.META["CONTENT_LENGTH"] = "10"
    with override_settings(INGEST_MAX_BODY_BYTES=50):
        from rest_framework.request import Request

        answer = _body_read(Request(request))
    assert not isinstance(answer, bytes)
    assert answer.status_code == 413 and answer.data["field"] == "body"


def test_too_many_samples_is_413(agent: Any, base: Any) -> None:
    a = agent()
    samples = [sample("GPU-n", base + dt.timedelta(minutes=m)) for m in range(4)]
    with override_settings(INGEST_MAX_SAMPLES=3):
        r = a.post(push(samples, [gpu_block("GPU-n")]))
    assert r.status_code == 413
    assert r.json()["field"] == "samples"
    assert stored() == 0


def test_throttled_per_node_when_over_the_rate(agent: Any, base: Any) -> None:
    from django.core.cache import cache

    rest = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"ingest": "2/day"}}
    a, b = agent(), agent()
    with override_settings(REST_FRAMEWORK=rest):
        for node in (a.node, b.node):
            import time

            cache.delete(f"throttle:ingest:{node.pk}:{int(time.time() // 86400)}")
        assert a.post(push([])).status_code == 200
        assert a.post(push([])).status_code == 200
        r = a.post(push([]))
        assert r.status_code == 429 and "Retry-After" in r.headers
        assert b.post(push([])).status_code == 200  # per node


def test_steady_state_push_query_count(
    agent: Any, base: Any, postgres: Any, django_assert_max_num_queries: Any
) -> None:
    """Auth, the GPUs, then COPY and one merge statement and the hour mark: no per-row ORM."""
    a = agent()
    a.post(push([sample("GPU-q0", base)], [gpu_block(f"GPU-q{i}", i) for i in range(8)]))
    a.post(push([sample("GPU-q0", base + dt.timedelta(minutes=1))]))  # token/node touched
    batch = [sample(f"GPU-q{i}", base + dt.timedelta(minutes=m)) for i in range(8) for m in (2, 3)]
    # token, GPUs, SAVEPOINT, [CREATE TEMP], COPY, merge, hours_mark, RELEASE (test transaction)
    with django_assert_max_num_queries(8):
        r = a.post(push(batch, [gpu_block(f"GPU-q{i}", i) for i in range(8)]))
    assert r.json() == {"accepted": 16, "duplicates": 0, "rejected": []}


def test_metrics_counted(agent: Any, base: Any) -> None:
    from config.metrics import counter_get

    names = (
        "ingest_requests",
        "ingest_samples_accepted",
        "ingest_samples_duplicate",
        "ingest_samples_rejected",
    )
    before = {n: counter_get(n) for n in names}
    a = agent()
    a.post(push([sample("GPU-c", base), sample("GPU-c", base, util_pct=-1)], [gpu_block("GPU-c")]))
    a.post(push([sample("GPU-c", base)]))
    after = {n: counter_get(n) - before[n] for n in names}
    assert after == {
        "ingest_requests": 2,
        "ingest_samples_accepted": 1,
        "ingest_samples_duplicate": 1,
        "ingest_samples_rejected": 1,
    }


def test_small_push_is_two_statements(
    agent: Any, base: Any, postgres: Any, django_assert_num_queries: Any
) -> None:
    """A steady small push: the token's facts come from this process's memory, then the GPUs
    it mentions (one prepared query) and one statement (samples, first/last seen, hour marks,
    the node row, ownership and the token's revocation check) in autocommit: no BEGIN, COPY or
    COMMIT, and nothing registered or refreshed when the gpus block is unchanged."""
    a = agent()
    a.post(push([sample("GPU-s0", base)], [gpu_block(f"GPU-s{i}", i) for i in range(8)]))
    batch = [sample(f"GPU-s{i}", base + dt.timedelta(minutes=1)) for i in range(8)]
    block = [gpu_block(f"GPU-s{i}", i) for i in range(8)]
    with django_assert_num_queries(2):
        r = a.post(push(batch, block, spool_dropped_samples=3))
    assert r.json() == {"accepted": 8, "duplicates": 0, "rejected": []}
    assert Node.objects.get(pk=a.node.pk).spool_dropped_total == 3
    gpu = Gpu.objects.get(uuid="GPU-s0")
    assert gpu.first_seen_at == base
    # Last seen is kept to 5 minutes: the end of the first sample (base + 1 min) stands until a
    # sample ends 5 minutes or more after it.
    assert gpu.last_seen_at == base + dt.timedelta(minutes=1)
    assert Gpu.objects.get(uuid="GPU-s3").last_seen_at == base + dt.timedelta(minutes=2)


@pytest.mark.parametrize("one_statement_max", [0, 64])
def test_last_seen_resolution(agent: Any, base: Any, postgres: Any, one_statement_max: int) -> None:
    """Both store paths: last seen moves only by 5 minutes or more; first seen always moves."""
    from unittest import mock

    a = agent()
    a.post(push([sample("GPU-l", base + dt.timedelta(minutes=10))], [gpu_block("GPU-l")]))
    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        seen = []
        for m in (11, 14, 15, 16):
            a.post(push([sample("GPU-l", base + dt.timedelta(minutes=m))]))
            gpu = Gpu.objects.get(uuid="GPU-l")
            seen.append((gpu.last_seen_at - base) // dt.timedelta(minutes=1))
        # Ends 12 and 15 are within 5 min of 11; 16 is 5 min after it; 17 within 5 of 16.
        assert seen == [11, 11, 16, 16]
        a.post(push([sample("GPU-l", base + dt.timedelta(minutes=9))]))  # earlier: moves
        gpu = Gpu.objects.get(uuid="GPU-l")
        assert (gpu.first_seen_at, gpu.last_seen_at) == (
            base + dt.timedelta(minutes=9),
            base + dt.timedelta(minutes=16),
        )


def test_prepared_statements_survive_partition_changes(
    agent: Any, base: Any, postgres: Any
) -> None:
    """Ingest's statements are prepared once per connection; creating and dropping daily
    partitions (the periodic tasks) in between must not break them."""
    from unittest import mock

    from telemetry.partitions import partitions_maintain, retention_apply

    a = agent()
    assert a.post(push([sample("GPU-p", base)], [gpu_block("GPU-p")])).status_code == 200

    def both_paths(minute: int) -> list[int]:
        accepted = []
        for limit in (64, 0):  # the one prepared statement; COPY and the prepared seen/marks
            with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", limit):
                r = a.post(push([sample("GPU-p", base + dt.timedelta(minutes=minute + limit))]))
            accepted.append(r.json()["accepted"])
        return accepted

    assert both_paths(1) == [1, 1]  # prepares both
    later = timezone.now() + dt.timedelta(days=10)
    assert partitions_maintain(now=later)  # new partitions attached
    retention_apply(now=later)  # old ones dropped
    assert both_paths(2) == [1, 1]
    assert stored() == 5


@pytest.mark.parametrize("one_statement_max", [0, 10_000])
def test_duplicates_counted_on_both_paths(
    agent: Any, base: Any, postgres: Any, one_statement_max: int
) -> None:
    """COPY (+ staging on a duplicate) and the one-statement path count duplicates alike."""
    from unittest import mock

    with mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max):
        a = agent()
        first = [sample("GPU-d", base + dt.timedelta(minutes=m)) for m in range(3)]
        assert a.post(push(first, [gpu_block("GPU-d")])).json()["accepted"] == 3
        versions = dict(RollupPending.objects.values_list("hour", "version"))
        again = first + [sample("GPU-d", base + dt.timedelta(minutes=4))] * 2
        again += [sample("GPU-d", base, util_pct=101.0)]  # rejected: stores nothing
        r = a.post(push(again))
        assert r.json()["accepted"] == 1 and r.json()["duplicates"] == 4
        assert [x["index"] for x in r.json()["rejected"]] == [5]
        assert stored() == 4
        marks = dict(RollupPending.objects.values_list("hour", "version"))
        assert marks == {h: v + 1 for h, v in versions.items()}
