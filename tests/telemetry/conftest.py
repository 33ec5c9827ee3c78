"""Fixtures for telemetry tests: a small fleet, raw samples written as ingest writes them
(rows plus hour marks), and rollup rows read back as plain dicts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from django.utils import timezone

from telemetry.models import HOURLY_STATS, USAGE_SUM_COLUMNS

# Columns compared between two rollups: everything but the keys, the surrogate id and
# computed_at.
ROLLUP_FIELDS = (
    "node_id",
    "pool_id",
    "team_id",
    "site_id",
    *USAGE_SUM_COLUMNS,
    *(c.name for c in HOURLY_STATS),
)


@pytest.fixture
def t0() -> dt.datetime:
    """Midnight UTC three days ago: inside raw retention, wholly in the past."""
    today = timezone.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - dt.timedelta(days=3)


@pytest.fixture
def fleet(db: Any) -> dict[str, Any]:
    """Two sites, teams, pools and nodes; GPUs are made with ``make_gpu``."""
    from fleet.models import Node, Pool, Site, Team

    site_a = Site.objects.create(name="site-a")
    site_b = Site.objects.create(name="site-b")
    team_a = Team.objects.create(name="team-a")
    team_b = Team.objects.create(name="team-b")
    pool_a = Pool.objects.create(name="pool-a", site=site_a, team=team_a)
    pool_b = Pool.objects.create(name="pool-b", site=site_b, team=team_b)
    node_a = Node.objects.create(hostname="node-a", pool=pool_a)
    node_b = Node.objects.create(hostname="node-b", pool=pool_b)
    return {
        "site_a": site_a,
        "site_b": site_b,
        "team_a": team_a,
        "team_b": team_b,
        "pool_a": pool_a,
        "pool_b": pool_b,
        "node_a": node_a,
        "node_b": node_b,
    }


@pytest.fixture
def make_gpu(fleet: dict[str, Any]) -> Callable[..., Any]:
    """``make_gpu(memory_total_bytes=…, in_service_at=…, node=…)`` → a Gpu on node-a."""
    from fleet.models import Gpu

    counter = {"n": 0}

    def make(**fields: Any) -> Any:
        counter["n"] += 1
        fields.setdefault("node", fleet["node_a"])
        fields.setdefault("memory_total_bytes", 80_000_000_000)
        return Gpu.objects.create(uuid=f"GPU-test-{counter['n']}", index=counter["n"], **fields)

    return make


def sample(
    gpu: Any, start: dt.datetime, *, seconds: int = 60, util: float = 0.0, **fields: Any
) -> Any:
    """One raw sample as ingest stores it (values as sent, no fallbacks applied)."""
    from telemetry.models import Sample

    return Sample(
        gpu_id=gpu.pk if hasattr(gpu, "pk") else gpu,
        start=start,
        seconds=seconds,
        util_pct=util,
        received_at=timezone.now(),
        **fields,
    )


def samples_ingest(rows: Iterable[Any]) -> int:
    """Store samples the way ingest does: a duplicate (gpu, start) changes nothing, and every
    hour touched is marked for the rollup. → rows offered."""
    from telemetry.models import Sample
    from telemetry.pending import hours_mark

    rows = list(rows)
    Sample.objects.bulk_create(rows, ignore_conflicts=True)
    hours_mark(r.start.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0) for r in rows)
    return len(rows)


def rollup_rows() -> dict[tuple[int, dt.datetime], dict[str, Any]]:
    """Every HourlyUsage row as {(gpu_id, hour): {field: value}}, ids and computed_at left out."""
    from telemetry.models import HourlyUsage

    return {
        (r["gpu_id"], r["hour"]): {f: r[f] for f in ROLLUP_FIELDS}
        for r in HourlyUsage.objects.values("gpu_id", "hour", *ROLLUP_FIELDS)
    }


def rows_approx_equal(a: dict[Any, dict[str, Any]], b: dict[Any, dict[str, Any]]) -> None:
    """Same keys, same values; floats to 1e-9 relative (sums of floats in another order)."""
    assert a.keys() == b.keys()
    for key in a:
        for field in ROLLUP_FIELDS:
            x, y = a[key][field], b[key][field]
            if isinstance(x, float) and isinstance(y, float):
                assert x == pytest.approx(y, rel=1e-9, abs=1e-9), (key, field)
            else:
                assert x == y, (key, field)
