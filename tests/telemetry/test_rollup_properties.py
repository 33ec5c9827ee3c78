"""Property: however samples arrive — shuffled, replayed, late in several waves with a rollup
after each — every rollup row ends the same, and equal to the rules of docs/metrics.md computed
here independently, in Python, from the samples themselves."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from telemetry.models import HourlyUsage, RollupPending, Sample
from telemetry.rollup import rollup_run
from tests.telemetry.conftest import rollup_rows, rows_approx_equal, sample, samples_ingest

pytestmark = pytest.mark.django_db

GB = 1_000_000_000
MEMORY_TOTAL = 80 * GB
HOURS = 3

opt = st.none

sample_spec = st.fixed_dictionaries(
    {
        "gpu": st.integers(0, 1),
        "minute": st.integers(0, HOURS * 60 - 1),
        "util": st.floats(0, 100),
        "procs": opt() | st.integers(0, 3),
        "mem_used": opt() | st.sampled_from([0, 3_999_999_999, 4 * GB, 60 * GB]),
        "power_w": opt() | st.floats(0, 700),
        "energy_j": opt() | st.floats(0, 42_000),
        "thermal": opt() | st.floats(0, 60),
        "power_cap": opt() | st.floats(0, 60),
        "any": opt() | st.floats(0, 60),
        "sm_active": opt() | st.floats(0, 1),
    }
)


def expected_rows(
    specs: list[dict[str, Any]], gpus: list[Any], t0: dt.datetime, active_util_pct: float = 5.0
) -> dict[tuple[int, dt.datetime], dict[str, float]]:
    """docs/metrics.md per sample, summed per (gpu, hour) — the independent path."""
    sums: dict[tuple[int, dt.datetime], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in specs:
        gpu = gpus[s["gpu"]]
        start = t0 + dt.timedelta(minutes=s["minute"])
        if gpu.in_service_at and start < gpu.in_service_at:
            continue
        d = 60.0
        air = s["util"] / 100 * d
        held = (s["procs"] is not None and s["procs"] > 0) or (
            s["procs"] is None
            and s["mem_used"] is not None
            and s["mem_used"] >= 0.05 * MEMORY_TOTAL
        )
        energy = (
            s["energy_j"]
            if s["energy_j"] is not None
            else (s["power_w"] * d if s["power_w"] is not None else 0.0)
        )
        row = sums[(gpu.pk, start.replace(minute=0))]
        row["samples"] += 1
        row["observed_s"] += d
        row["air_s"] += air
        row["held_s" if held else "parked_s"] += d - air
        row["energy_j"] += energy
        if s["util"] < active_util_pct:
            row["idle_energy_j"] += energy
            row["idle_s"] += d
        row["throttle_any_s"] += (
            s["any"] if s["any"] is not None else max(s["thermal"] or 0.0, s["power_cap"] or 0.0)
        )
        if s["sm_active"] is not None:
            row["sm_active_s"] += s["sm_active"] * d
            row["sm_observed_s"] += d
    return sums


def to_samples(specs: list[dict[str, Any]], gpus: list[Any], t0: dt.datetime) -> list[Any]:
    return [
        sample(
            gpus[s["gpu"]],
            t0 + dt.timedelta(minutes=s["minute"]),
            util=s["util"],
            procs=s["procs"],
            mem_used_bytes=s["mem_used"],
            power_w=s["power_w"],
            energy_j=s["energy_j"],
            throttle_thermal_s=s["thermal"],
            throttle_power_cap_s=s["power_cap"],
            throttle_any_s=s["any"],
            sm_active=s["sm_active"],
        )
        for s in specs
    ]


def reset() -> None:
    Sample.objects.all().delete()
    HourlyUsage.objects.all().delete()
    RollupPending.objects.all().delete()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=st.lists(
        sample_spec, min_size=1, max_size=30, unique_by=lambda s: (s["gpu"], s["minute"])
    ),
    data=st.data(),
)
def test_arrival_order_replays_and_delays_change_no_rollup(
    make_gpu: Any, t0: dt.datetime, specs: list[dict[str, Any]], data: st.DataObject
) -> None:
    # The second GPU enters service 70 minutes into the window: its earlier samples never count.
    gpus = [
        make_gpu(memory_total_bytes=MEMORY_TOTAL),
        make_gpu(memory_total_bytes=MEMORY_TOTAL, in_service_at=t0 + dt.timedelta(minutes=70)),
    ]
    reset()
    samples_ingest(to_samples(specs, gpus, t0))
    rollup_run()
    clean = rollup_rows()
    want = expected_rows(specs, gpus, t0)
    assert clean.keys() == want.keys()
    for key, row in want.items():
        for field, value in row.items():
            assert clean[key][field] == pytest.approx(value, rel=1e-9, abs=1e-6), (key, field)

    # The same samples shuffled, some replayed, delivered in waves with a rollup after each.
    replays = data.draw(st.lists(st.sampled_from(specs), max_size=10), label="replays")
    arrivals = data.draw(st.permutations(specs + replays), label="arrival order")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(arrivals)), max_size=3), label="cuts"))
    reset()
    for lo, hi in zip([0, *cuts], [*cuts, len(arrivals)], strict=True):
        if lo < hi:
            samples_ingest(to_samples(arrivals[lo:hi], gpus, t0))
            rollup_run()
    rows_approx_equal(rollup_rows(), clean)
