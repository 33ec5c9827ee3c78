"""A node writes only its own GPUs, at once after a move, on every database and write path.

Ingest reads the GPUs a push mentions, validates, then writes; the write itself checks, in its
transaction, that the node still owns each GPU (telemetry.ingest_store). These tests change the
GPUs behind ingest's back (``QuerySet.update`` sends no signal), as another process, the admin
or ``fleet_apply`` would, and also between ingest's read and its write.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any
from unittest import mock

import pytest

from fleet.models import Gpu, Node
from telemetry import ingest
from telemetry.models import Sample
from tests.telemetry.test_ingest import (  # noqa: F401
    OTHER_NODE_REJECT,
    agent,
    base,
    gpu_block,
    push,
    sample,
)

GIB = 2**30
# The write paths: PostgreSQL's one statement (≤ 64 rows) and its COPY path (patched bound 0);
# SQLite has one path, and runs each case alike.
PATHS = pytest.mark.parametrize("one_statement_max", [64, 0], ids=["one-statement", "copy"])


def moved_after_validation(uuid: str, to: Node, one_statement_max: int) -> Any:
    """Patches for one push: the write path, and an admin's move of ``uuid`` to ``to`` that
    commits after ingest has read and validated the push, before its write."""
    validate = ingest.samples_validate

    def validate_then_move(**kwargs: Any) -> Any:
        result = validate(**kwargs)
        Gpu.objects.filter(uuid=uuid).update(node=to)  # no signal
        return result

    stack = contextlib.ExitStack()
    stack.enter_context(
        mock.patch("telemetry.ingest_store.ONE_STATEMENT_MAX_ROWS", one_statement_max)
    )
    stack.enter_context(
        mock.patch("telemetry.ingest.samples_validate", side_effect=validate_then_move)
    )
    return stack


def test_gpu_moved_to_another_node_is_rejected_at_once(agent: Any, base: Any) -> None:  # noqa: F811
    a, b = agent(), agent()
    a.post(push([sample("GPU-m0", base)], [gpu_block("GPU-m0")]))
    Gpu.objects.filter(uuid="GPU-m0").update(node=b.node)  # no signal
    r = a.post(push([sample("GPU-m0", base + dt.timedelta(minutes=1))], [gpu_block("GPU-m0")]))
    assert r.status_code == 400
    assert r.json()["rejected"] == [
        {
            "index": 0,
            "field": "gpu",
            "error": "this GPU belongs to another node",
            "code": "other_node",
        }
    ]
    assert Sample.objects.filter(gpu__uuid="GPU-m0").count() == 1
    r = b.post(push([sample("GPU-m0", base + dt.timedelta(minutes=2))]))
    assert r.json()["accepted"] == 1


@PATHS
def test_move_between_read_and_write_is_refused_by_the_write(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    one_statement_max: int,
) -> None:
    """The GPU moves after ingest read and validated against it: the write refuses its rows
    (and only its rows) and the answer says why, as if the read had seen the move."""
    a, b = agent(), agent()
    first = [sample("GPU-w0", base), sample("GPU-w1", base)]
    assert a.post(push(first, [gpu_block("GPU-w0"), gpu_block("GPU-w1", 1)])).status_code == 200
    later = [
        sample(uuid, base + dt.timedelta(minutes=m))
        for m in (1, 2)
        for uuid in ("GPU-w0", "GPU-w1")
    ]
    with moved_after_validation("GPU-w1", b.node, one_statement_max):
        r = a.post(push(later))
    assert r.status_code == 200, r.content
    assert r.json() == {
        "accepted": 2,
        "duplicates": 0,
        "rejected": [
            {
                "index": 1,
                "field": "gpu",
                "error": "this GPU belongs to another node",
                "code": "other_node",
            },
            {
                "index": 3,
                "field": "gpu",
                "error": "this GPU belongs to another node",
                "code": "other_node",
            },
        ],
    }
    assert Sample.objects.filter(gpu__uuid="GPU-w0").count() == 3
    assert Sample.objects.filter(gpu__uuid="GPU-w1").count() == 1


@PATHS
def test_move_between_read_and_write_of_a_replay(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    one_statement_max: int,
) -> None:
    """A replay (duplicates take PostgreSQL's staging path) of a GPU moved after the read:
    nothing stored for it, and its rows are rejected rather than counted as duplicates."""
    a, b = agent(), agent()
    a.post(push([sample("GPU-d0", base)], [gpu_block("GPU-d0")]))
    replay = [sample("GPU-d0", base), sample("GPU-d0", base + dt.timedelta(minutes=1))]
    with moved_after_validation("GPU-d0", b.node, one_statement_max):
        r = a.post(push(replay))
    assert r.status_code == 400
    assert [x["index"] for x in r.json()["rejected"]] == [0, 1]
    assert Sample.objects.filter(gpu__uuid="GPU-d0").count() == 1


def test_fleet_apply_move_takes_effect_on_the_next_push(agent: Any, base: Any) -> None:  # noqa: F811
    """The documented way to move a GPU: a ``node`` key in the fleet file."""
    from billing.services import fleet_document_apply

    a, b = agent("old-node"), agent("new-node")
    a.post(push([sample("GPU-f0", base)], [gpu_block("GPU-f0")]))
    fleet_document_apply(
        document={"currency": "USD", "gpus": [{"uuid": "GPU-f0", "node": "new-node"}]}
    )
    r = a.post(push([sample("GPU-f0", base + dt.timedelta(minutes=1))], [gpu_block("GPU-f0")]))
    assert r.status_code == 400 and r.json()["rejected"][0]["field"] == "gpu"
    assert Gpu.objects.get(uuid="GPU-f0").node == Node.objects.get(hostname="new-node")
    assert b.post(push([sample("GPU-f0", base + dt.timedelta(minutes=2))])).status_code == 200


def test_gpu_memory_changed_behind_ingest(agent: Any, base: Any) -> None:  # noqa: F811
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
    assert Gpu.objects.get(uuid="GPU-r1").node_id == b.node.pk  # not taken over
