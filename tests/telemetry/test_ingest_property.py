"""Property: whatever a push holds, no stored sample breaks a range of docs/ingest.md, and no
rejected sample is stored."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.models import Gpu, Node
from telemetry.ingest import sample_batch_ingest
from telemetry.models import Sample

MEM = 80_000_000_000
NOW = timezone.now()
BASE = NOW.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=3)

# Mostly plausible values, with the edges and the bad ones mixed in.
numbers = st.one_of(
    st.floats(min_value=-10, max_value=110),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 60, 100, 3600, 5000, -0.0, 1e308]),
    st.sampled_from(["NaN", "Infinity", "12"]),
)
maybe = st.one_of(st.none(), numbers)
sample_st = st.fixed_dictionaries(
    {
        "seconds": st.one_of(st.sampled_from([60, 30, 1, 3600, 0, 3601, 45]), numbers),
        "util_pct": numbers,
    },
    optional={
        "mem_util_pct": maybe,
        "mem_used_bytes": st.one_of(st.integers(min_value=-5, max_value=MEM + 5), numbers),
        "procs": st.one_of(st.integers(min_value=-2, max_value=40_000), maybe),
        "power_w": maybe,
        "energy_j": maybe,
        "temp_c": st.one_of(st.floats(min_value=-60, max_value=160), maybe),
        "sm_active": st.one_of(st.floats(min_value=-0.5, max_value=1.5), maybe),
        "active_s": maybe,
        "throttle_s": st.fixed_dictionaries(
            {}, optional={k: maybe for k in ("power_cap", "thermal", "hw_slowdown", "other", "any")}
        ),
        "offset_s": st.sampled_from([0, 30, 59, 1800, 3540, 3599]),
    },
)


def _in_ranges(s: Sample) -> bool:
    d = s.seconds

    def within(v: float | None, lo: float, hi: float) -> bool:
        return v is None or lo <= v <= hi

    throttles = (
        s.throttle_power_cap_s,
        s.throttle_thermal_s,
        s.throttle_hw_slowdown_s,
        s.throttle_other_s,
        s.throttle_any_s,
    )
    offset = int(s.start.timestamp()) % 3600
    return (
        1 <= d <= 3600
        and offset + d <= 3600
        and within(s.util_pct, 0, 100)
        and within(s.mem_util_pct, 0, 100)
        and within(s.mem_used_bytes, 0, MEM)
        and within(s.procs, 0, 32767)
        and within(s.power_w, 0, 5000)
        and within(s.energy_j, 0, float("inf"))
        and (s.energy_j is None or s.energy_j < float("inf"))
        and within(s.temp_c, -50, 150)
        and within(s.sm_active, 0, 1)
        and within(s.active_s, 0, d)
        and all(within(t, 0, d) for t in throttles)
    )


@pytest.mark.django_db
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(sample_st, min_size=1, max_size=12))
def test_no_accepted_sample_breaks_a_range_and_no_rejected_one_is_stored(batch: Any) -> None:
    Sample.objects.all().delete()
    node, _ = Node.objects.get_or_create(hostname="prop-node")
    gpu, _ = Gpu.objects.get_or_create(uuid="GPU-prop", node=node, memory_total_bytes=MEM)
    samples: list[dict[str, Any]] = []
    for i, fields in enumerate(batch):
        fields = dict(fields)
        offset = fields.pop("offset_s", 0)
        # One hour per sample, so index i maps to a distinct (gpu, start).
        start = BASE - dt.timedelta(hours=i) + dt.timedelta(seconds=offset)
        samples.append({"gpu": gpu.uuid, "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"), **fields})
    payload = json.dumps({"samples": samples}).encode()

    result = sample_batch_ingest(node_id=node.pk, payload_bytes=payload, now=timezone.now())

    rejected = {r.index for r in result.rejected}
    assert result.accepted + result.duplicates + len(rejected) == len(samples)
    assert result.duplicates == 0
    rows = list(Sample.objects.all())
    assert len(rows) == result.accepted
    stored_starts = {r.start for r in rows}
    for i in rejected:
        start = BASE - dt.timedelta(hours=i) + dt.timedelta(seconds=batch[i].get("offset_s", 0))
        assert start not in stored_starts
    for row in rows:
        assert _in_ranges(row), row.__dict__
