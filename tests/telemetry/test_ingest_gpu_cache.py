"""The per-process cache of a node's GPUs (telemetry.ingest): a guess the database confirms.

The GPUs here change behind ingest's back (``QuerySet.update`` sends no signal), as they
would when another process or an admin changes them: the cache must never let a sample through
that the database would refuse, nor refuse one it would accept.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Gpu
from telemetry import ingest
from telemetry.models import Sample
from tests.telemetry.test_ingest import agent, base, gpu_block, push, sample  # noqa: F401

GIB = 2**30


def test_steady_push_skips_the_gpu_query(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    a.post(push([sample("GPU-k0", base)], [gpu_block("GPU-k0")]))  # registers: cache cleared
    a.post(push([sample("GPU-k0", base + dt.timedelta(minutes=2))]))  # reads and caches
    with CaptureQueriesContext(connection) as queries:
        r = a.post(push([sample("GPU-k0", base + dt.timedelta(minutes=1))]))
    assert r.json()["accepted"] == 1
    # (A prepared statement is logged without its text: sql is None.)
    assert not any("FROM fleet_gpu WHERE" in (q["sql"] or "") for q in queries.captured_queries), [
        (q["sql"] or "")[:80] for q in queries.captured_queries
    ]


def test_gpu_moved_to_another_node_is_rejected(agent: Any, base: Any) -> None:  # noqa: F811
    a, b = agent(), agent()
    a.post(push([sample("GPU-m0", base)], [gpu_block("GPU-m0")]))
    Gpu.objects.filter(uuid="GPU-m0").update(node=b.node)  # no signal: the cache is stale
    r = a.post(push([sample("GPU-m0", base + dt.timedelta(minutes=1))]))
    assert r.status_code == 400
    assert r.json()["rejected"] == [
        {"index": 0, "field": "gpu", "error": "this GPU belongs to another node"}
    ]
    assert Sample.objects.filter(gpu__uuid="GPU-m0").count() == 1
    r = b.post(push([sample("GPU-m0", base + dt.timedelta(minutes=2))]))
    assert r.json()["accepted"] == 1


def test_gpu_memory_changed_behind_the_cache(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    a.post(push([sample("GPU-x0", base)], [gpu_block("GPU-x0", memory_total_bytes=80 * GIB)]))
    Gpu.objects.filter(uuid="GPU-x0").update(memory_total_bytes=40 * GIB)
    r = a.post(push([sample("GPU-x0", base + dt.timedelta(minutes=1), mem_used_bytes=60 * GIB)]))
    assert r.status_code == 400 and r.json()["rejected"][0]["field"] == "mem_used_bytes"
    Gpu.objects.filter(uuid="GPU-x0").update(memory_total_bytes=160 * GIB)
    r = a.post(push([sample("GPU-x0", base + dt.timedelta(minutes=2), mem_used_bytes=120 * GIB)]))
    assert r.json() == {"accepted": 1, "duplicates": 0, "rejected": []}


def test_registered_by_another_node_is_rejected(agent: Any, base: Any) -> None:  # noqa: F811
    a, b = agent(), agent()
    a.post(push([sample("GPU-r0", base)], [gpu_block("GPU-r0")]))
    b.post(push([sample("GPU-r1", base)], [gpu_block("GPU-r1")]))
    r = a.post(push([sample("GPU-r1", base + dt.timedelta(minutes=1))], [gpu_block("GPU-r1")]))
    assert r.json()["rejected"][0]["error"] == "this GPU belongs to another node"


def test_replay_with_stale_cache_checks_the_database(agent: Any, base: Any) -> None:  # noqa: F811
    a, b = agent(), agent()
    a.post(push([sample("GPU-d0", base)], [gpu_block("GPU-d0")]))
    Gpu.objects.filter(uuid="GPU-d0").update(node=b.node)
    # A duplicate takes the staging path, which cannot check the cache: it reads the database.
    r = a.post(push([sample("GPU-d0", base), sample("GPU-d0", base + dt.timedelta(minutes=1))]))
    assert r.status_code == 400
    assert Sample.objects.filter(gpu__uuid="GPU-d0").count() == 1


def test_orm_save_clears_the_cache(agent: Any, base: Any) -> None:  # noqa: F811
    a = agent()
    a.post(push([sample("GPU-s0", base)], [gpu_block("GPU-s0")]))
    a.post(push([sample("GPU-s0", base + dt.timedelta(minutes=1))]))
    assert a.node.pk in ingest._gpu_cache
    gpu = Gpu.objects.get(uuid="GPU-s0")
    gpu.save()
    assert a.node.pk not in ingest._gpu_cache
