"""Hourly rollups: the per-sample rules of docs/metrics.md by hand-computed numbers, the worked
example, idempotency, late data, attribution history, the watermark, and the command."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest
from django.core.management import call_command

from telemetry import rollup
from telemetry.models import HourlyUsage, RollupPending
from telemetry.pending import hours_mark
from telemetry.rollup import rollup_hours, rollup_run
from tests.telemetry.conftest import rollup_rows, rows_approx_equal, sample, samples_ingest

pytestmark = pytest.mark.django_db

H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)
GB = 1_000_000_000


def row(gpu: Any, hour: dt.datetime) -> HourlyUsage:
    return HourlyUsage.objects.get(gpu_id=gpu.pk, hour=hour)


@pytest.mark.smoke
def test_per_sample_rules_by_hand(make_gpu: Any, t0: dt.datetime) -> None:
    gpu = make_gpu(memory_total_bytes=80 * GB)
    samples_ingest(
        [
            # h0: 50 % of 60 s with a process: 30 s air, 30 s held; energy from power 300 W × 60 s.
            sample(gpu, t0, util=50, procs=1, power_w=300, mem_util_pct=40, temp_c=61),
            # h1: procs 0 wins over memory in use: the rest is parked.
            sample(gpu, t0 + H, util=50, procs=0, mem_used_bytes=70 * GB),
            # h2: procs unknown, memory used exactly 5 % of 80 GB: held (≥).
            sample(gpu, t0 + 2 * H, util=20, mem_used_bytes=4 * GB),
            # h3: procs unknown, memory just under 5 %: parked.
            sample(gpu, t0 + 3 * H, util=20, mem_used_bytes=int(3.99 * GB)),
            # h4: procs and memory unknown: parked.
            sample(gpu, t0 + 4 * H, util=20),
            # h5: the energy counter wins over power × d.
            sample(gpu, t0 + 5 * H, util=50, energy_j=1000.0, power_w=300),
            # h6: neither energy nor power: energy 0, no mean power.
            sample(gpu, t0 + 6 * H, util=50),
            # h7: below the active threshold (5 %) is idle; at it is not.
            sample(gpu, t0 + 7 * H, util=4.9, power_w=100),
            sample(gpu, t0 + 7 * H + M, util=5.0, power_w=200),
            # h8: throttle "any": the largest reason where not sent, as sent where sent.
            sample(gpu, t0 + 8 * H, throttle_power_cap_s=10, throttle_thermal_s=20),
            sample(
                gpu,
                t0 + 8 * H + M,
                throttle_power_cap_s=10,
                throttle_thermal_s=20,
                throttle_hw_slowdown_s=5,
                throttle_other_s=1,
                throttle_any_s=25,
            ),
            # h9: sm_active × d over the samples that carry it.
            sample(gpu, t0 + 9 * H, util=80, sm_active=0.5),
            sample(gpu, t0 + 9 * H + M, util=80),
            # h10: active_s measured directly wins over u × d.
            sample(gpu, t0 + 10 * H, util=50, active_s=40, procs=1),
            # h11/h12: a sample counts wholly in the hour of its start (30 s past the boundary).
            sample(gpu, t0 + 12 * H - 30 * dt.timedelta(seconds=1), seconds=30, util=100),
            sample(gpu, t0 + 12 * H, seconds=30, util=100, power_w=400),
        ]
    )
    result = rollup_run()
    assert result.hours == 13 and result.rows == 13 and not result.busy
    assert RollupPending.objects.count() == 0 and result.lag_s == 0.0

    r = row(gpu, t0)
    assert (r.samples, r.observed_s, r.air_s, r.held_s, r.parked_s) == (1, 60, 30, 30, 0)
    assert (r.energy_j, r.idle_energy_j, r.idle_s) == (18000, 0, 0)
    assert (r.power_w_mean, r.power_w_max, r.temp_c_max) == (300, 300, 61)
    assert (r.util_pct_mean, r.mem_util_pct_mean) == (50, 40)
    assert (r.node_id, r.pool_id, r.team_id, r.site_id) == (
        gpu.node_id,
        gpu.node.pool_id,
        gpu.node.pool.team_id,
        gpu.node.pool.site_id,
    )
    r = row(gpu, t0 + H)
    assert (r.air_s, r.held_s, r.parked_s) == (30, 0, 30)
    r = row(gpu, t0 + 2 * H)
    assert (r.air_s, r.held_s, r.parked_s) == pytest.approx((12, 48, 0))
    r = row(gpu, t0 + 3 * H)
    assert (r.air_s, r.held_s, r.parked_s) == pytest.approx((12, 0, 48))
    r = row(gpu, t0 + 4 * H)
    assert (r.air_s, r.held_s, r.parked_s) == pytest.approx((12, 0, 48))
    assert r.mem_util_pct_mean is None and r.power_w_mean is None
    r = row(gpu, t0 + 5 * H)
    assert r.energy_j == 1000 and r.power_w_mean == pytest.approx(1000 / 60)
    r = row(gpu, t0 + 6 * H)
    assert (r.energy_j, r.power_w_mean, r.power_w_max) == (0, None, None)
    r = row(gpu, t0 + 7 * H)
    assert (r.samples, r.energy_j, r.idle_energy_j, r.idle_s) == (2, 18000, 6000, 60)
    assert r.util_pct_mean == pytest.approx(4.95) and r.power_w_mean == pytest.approx(150)
    r = row(gpu, t0 + 8 * H)
    assert (
        r.throttle_power_cap_s,
        r.throttle_thermal_s,
        r.throttle_hw_slowdown_s,
        r.throttle_other_s,
        r.throttle_any_s,
    ) == (20, 40, 5, 1, 45)
    r = row(gpu, t0 + 9 * H)
    assert (r.sm_active_s, r.sm_observed_s, r.observed_s) == (30, 60, 120)
    r = row(gpu, t0 + 10 * H)
    assert (r.air_s, r.held_s, r.parked_s) == (40, 20, 0)
    r = row(gpu, t0 + 11 * H)
    assert (r.samples, r.observed_s, r.air_s, r.energy_j) == (1, 30, 30, 0)
    r = row(gpu, t0 + 12 * H)
    assert (r.samples, r.observed_s, r.energy_j) == (1, 30, 12000)
    # No sample in h0's neighbours of other GPUs, and no row without samples.
    assert HourlyUsage.objects.count() == 13


def test_memory_rule_needs_the_gpus_total(make_gpu: Any, t0: dt.datetime) -> None:
    gpu = make_gpu(memory_total_bytes=None)
    samples_ingest([sample(gpu, t0, util=10, mem_used_bytes=50 * GB)])
    rollup_run()
    r = row(gpu, t0)
    assert (r.air_s, r.held_s, r.parked_s) == pytest.approx((6, 0, 54))


def test_samples_outside_in_service_window_are_excluded(make_gpu: Any, t0: dt.datetime) -> None:
    gpu = make_gpu(in_service_at=t0 + 2 * H + 30 * M, retired_at=t0 + 4 * H)
    samples_ingest(
        [
            sample(gpu, t0 + H, util=100),  # before in service
            sample(gpu, t0 + 2 * H, util=100),  # same hour, still before
            sample(gpu, t0 + 2 * H + 30 * M, util=100),  # at in_service: counts
            sample(gpu, t0 + 3 * H + 59 * M, util=100),  # counts
            sample(gpu, t0 + 4 * H, util=100),  # at retired: excluded
        ]
    )
    rollup_run()
    assert {k[1]: v["samples"] for k, v in rollup_rows().items()} == {t0 + 2 * H: 1, t0 + 3 * H: 1}
    from telemetry.models import Sample

    assert Sample.objects.filter(gpu=gpu).count() == 5  # stored, though not counted


@pytest.mark.smoke
def test_design_worked_example(make_gpu: Any, t0: dt.datetime) -> None:
    """docs/metrics.md: 1,200 samples of 60 s in one day → air 9.0 h, held 6.0 h, parked 5.0 h,
    observed 20.0 h, 4.95 kWh of which 0.95 kWh idle."""
    gpu = make_gpu()
    starts = [t0 + i * M for i in range(1200)]  # 20 hours observed, 4 offline at the end
    rows = [sample(gpu, s, util=90, power_w=400, procs=1) for s in starts[:600]]
    rows += [sample(gpu, s, util=0, power_w=120, procs=1) for s in starts[600:900]]
    rows += [sample(gpu, s, util=0, power_w=70, procs=0) for s in starts[900:]]
    samples_ingest(rows)
    result = rollup_run()
    assert result.hours == 20 and result.rows == 20
    qs = HourlyUsage.objects.filter(gpu=gpu)
    sums = {
        f: sum(getattr(r, f) for r in qs)
        for f in (
            "samples",
            "observed_s",
            "air_s",
            "held_s",
            "parked_s",
            "energy_j",
            "idle_energy_j",
        )
    }
    assert sums["samples"] == 1200
    assert sums["observed_s"] / 3600 == pytest.approx(20.0)
    assert sums["air_s"] / 3600 == pytest.approx(9.0)
    assert sums["held_s"] / 3600 == pytest.approx(6.0)
    assert sums["parked_s"] / 3600 == pytest.approx(5.0)
    assert sums["energy_j"] / 3.6e6 == pytest.approx(4.95)
    assert sums["idle_energy_j"] / 3.6e6 == pytest.approx(0.95)


def test_rerun_is_idempotent_and_late_samples_reroll_their_hour(
    make_gpu: Any, t0: dt.datetime
) -> None:
    gpu = make_gpu()
    samples_ingest(sample(gpu, t0 + i * M, util=50, power_w=200, procs=1) for i in range(0, 120, 2))
    rollup_run()
    first = rollup_rows()
    assert rollup_run().hours == 0  # nothing marked: nothing done
    stamp = row(gpu, t0).computed_at
    hours_mark([t0, t0 + H])
    result = rollup_run()
    assert (result.hours, result.rows) == (2, 0)  # recomputed; unchanged, so nothing rewritten
    assert rollup_rows() == first  # same sums, however often
    assert rollup_hours([t0, t0 + H]) == 0 and rollup_rows() == first
    assert row(gpu, t0).computed_at == stamp

    # A late sample (and a replayed duplicate) for the first hour only.
    untouched = row(gpu, t0 + H).computed_at
    samples_ingest(
        [sample(gpu, t0 + M, util=100, power_w=300, procs=1), sample(gpu, t0, util=0, power_w=1)]
    )  # duplicate of (gpu, t0): ignored
    assert rollup_run().hours == 1
    r = row(gpu, t0)
    assert (r.samples, r.air_s, r.energy_j) == (31, 30 * 30 + 60, 30 * 12000 + 18000)
    assert row(gpu, t0 + H).computed_at == untouched


def test_attribution_is_kept_when_the_gpu_moves(
    make_gpu: Any, fleet: dict[str, Any], t0: dt.datetime
) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0, util=10)])
    rollup_run()
    a = (fleet["node_a"].pk, fleet["pool_a"].pk, fleet["team_a"].pk, fleet["site_a"].pk)
    attribution = ("node_id", "pool_id", "team_id", "site_id")
    assert tuple(rollup_rows()[(gpu.pk, t0)][f] for f in attribution) == a

    # Moved to node-b, with a team of its own; node-b's site overrides its pool's.
    gpu.node = fleet["node_b"]
    gpu.team = fleet["team_a"]
    gpu.save()
    fleet["node_b"].site = fleet["site_a"]
    fleet["node_b"].save()
    samples_ingest([sample(gpu, t0 + M, util=10), sample(gpu, t0 + H, util=10)])
    rollup_run()
    rows = rollup_rows()
    assert rows[(gpu.pk, t0)]["samples"] == 2  # re-rolled …
    assert tuple(rows[(gpu.pk, t0)][f] for f in attribution) == a  # … history kept
    assert tuple(rows[(gpu.pk, t0 + H)][f] for f in attribution) == (
        fleet["node_b"].pk,
        fleet["pool_b"].pk,
        fleet["team_a"].pk,
        fleet["site_a"].pk,
    )


def test_rows_without_counting_samples_are_deleted_on_reroll(
    make_gpu: Any, t0: dt.datetime
) -> None:
    from telemetry.services import gpu_hours_invalidate

    gpu, other = make_gpu(), make_gpu()
    samples_ingest(
        [sample(gpu, t0, util=10), sample(gpu, t0 + H, util=10), sample(other, t0, util=10)]
    )
    rollup_run()
    assert len(rollup_rows()) == 3
    gpu.in_service_at = t0 + H
    gpu.save()
    assert gpu_hours_invalidate(gpu_ids=[gpu.pk]) == 2
    result = rollup_run()
    # Hour 1 recomputed to the same numbers (not rewritten); hour 0's row deleted.
    assert (result.hours, result.rows, result.deleted) == (2, 0, 1)
    assert set(rollup_rows()) == {(gpu.pk, t0 + H), (other.pk, t0)}


def test_hours_before_the_retention_horizon_are_left_alone(
    make_gpu: Any, t0: dt.datetime, settings: Any
) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0, util=10)])
    rollup_run()
    before = rollup_rows()
    # Retention has passed that hour (its raw samples may be gone); re-marking it must not
    # recompute it, let alone delete the only record of it.
    settings.RAW_RETENTION_DAYS = 1
    from telemetry.models import Sample

    Sample.objects.all().delete()
    hours_mark([t0])
    result = rollup_run()
    assert (result.hours, result.skipped_hours, result.deleted) == (0, 1, 0)
    assert rollup_rows() == before and RollupPending.objects.count() == 0


def test_a_mark_bumped_during_the_batch_survives(
    make_gpu: Any, t0: dt.datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0, util=10)])
    late = [sample(gpu, t0 + M, util=90)]

    recompute = rollup._recompute

    def recompute_then_ingest(hours: list[dt.datetime], **kwargs: Any) -> tuple[int, int]:
        # Ingest lands after the upsert read its samples but before the marks are cleared.
        result = recompute(hours, **kwargs)
        monkeypatch.setattr(rollup, "_recompute", recompute)
        samples_ingest(late)
        return result

    monkeypatch.setattr(rollup, "_recompute", recompute_then_ingest)
    rollup_run()
    mark = RollupPending.objects.get()  # still marked, at the new version
    assert (mark.hour, mark.version) == (t0, 2)
    assert row(gpu, t0).samples == 1
    rollup_run()
    assert row(gpu, t0).samples == 2 and not RollupPending.objects.exists()


def test_max_hours_and_lag(make_gpu: Any, t0: dt.datetime) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0 + i * H, util=10) for i in range(3)])
    RollupPending.objects.update(marked_at=t0)  # marked long ago
    result = rollup_run(max_hours=2)
    assert (result.hours, result.rows) == (2, 2)
    assert result.lag_s > 2 * 86400  # the third hour still waits since t0
    assert list(RollupPending.objects.values_list("hour", flat=True)) == [t0 + 2 * H]


def test_batches_are_cut_by_count_and_span(make_gpu: Any, t0: dt.datetime) -> None:
    from telemetry.rollup import _batches

    hours = [t0 + i * H for i in range(30)] + [t0 + 100 * H]
    assert [len(b) for b in _batches(hours)] == [24, 6, 1]
    gpu = make_gpu()
    samples_ingest([sample(gpu, h, util=10) for h in hours])
    batches: list[int] = []
    result = rollup_run(on_batch=batches.append)
    assert batches == [24, 6, 1] and result.hours == 31 and len(rollup_rows()) == 31


@pytest.mark.smoke
def test_rollup_command_prints_its_result_and_backfills(make_gpu: Any, t0: dt.datetime) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0 + i * H, util=50, power_w=100) for i in range(3)])
    out = io.StringIO()
    call_command("rollup", stdout=out, stderr=io.StringIO())
    assert out.getvalue().strip().splitlines()[-1].startswith("rollup: 3 hours rolled, 3 rows")
    expected = rollup_rows()

    HourlyUsage.objects.filter(hour=t0).delete()  # lost, or computed by older rules
    HourlyUsage.objects.filter(hour=t0 + H).update(air_s=-1)
    out = io.StringIO()
    call_command("rollup", stdout=out, stderr=io.StringIO())
    assert "0 hours rolled" in out.getvalue()  # nothing was marked
    call_command("rollup", "--all", stdout=out, stderr=io.StringIO())
    assert out.getvalue().strip().splitlines()[-1].startswith("rollup: 3 hours rolled")
    assert rollup_rows() == expected


def test_selectors(make_gpu: Any, t0: dt.datetime) -> None:
    from telemetry.selectors import gpu_hourly_series, gpu_recent_samples, rollup_lag_seconds

    gpu, other = make_gpu(), make_gpu()
    samples_ingest([sample(gpu, t0 + i * 30 * M, util=10) for i in range(6)])
    samples_ingest([sample(other, t0, util=10)])
    RollupPending.objects.update(marked_at=t0)
    assert rollup_lag_seconds(now=t0 + 90 * dt.timedelta(seconds=1)) == 90
    rollup_run()
    assert rollup_lag_seconds() == 0
    series = list(gpu_hourly_series(gpu_id=gpu.pk, start=t0 + H, end=t0 + 3 * H))
    assert [(r.hour, r.samples) for r in series] == [(t0 + H, 2), (t0 + 2 * H, 2)]
    recent = list(gpu_recent_samples(gpu_id=gpu.pk, since=t0 + 90 * M))
    assert [s.start for s in recent] == [t0 + 90 * M, t0 + 120 * M, t0 + 150 * M]


def test_rollup_rows_equal_helper_can_fail() -> None:
    # The comparison the property and fault tests rest on must notice a difference.
    from tests.telemetry.conftest import ROLLUP_FIELDS

    key = (1, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    a = {key: dict.fromkeys(ROLLUP_FIELDS, 1.0)}
    rows_approx_equal(a, {key: dict.fromkeys(ROLLUP_FIELDS, 1.0 + 1e-12)})
    with pytest.raises(AssertionError):
        rows_approx_equal(a, {key: {**a[key], "air_s": 1.0 + 1e-6}})
    with pytest.raises(AssertionError):
        rows_approx_equal(a, {})


def test_a_sparse_batch_recomputes_only_its_hours(make_gpu: Any, t0: dt.datetime) -> None:
    gpu = make_gpu()
    samples_ingest([sample(gpu, t0 + h * H, util=10) for h in range(8)])
    rollup_run()
    HourlyUsage.objects.filter(hour=t0 + 3 * H).update(air_s=-1)  # a row nobody marked
    samples_ingest([sample(gpu, t0 + M, util=10), sample(gpu, t0 + 7 * H + M, util=10)])
    result = rollup_run()  # one batch: hours 0 and 7 only
    assert (result.hours, result.rows) == (2, 2)
    assert row(gpu, t0 + 3 * H).air_s == -1
    assert (row(gpu, t0).samples, row(gpu, t0 + 7 * H).samples) == (2, 2)


def test_subnormal_values_count_as_zero_and_do_not_wedge_the_queue(
    make_gpu: Any, t0: dt.datetime
) -> None:
    # Inside every range ingest checks, yet on PostgreSQL 5e-324 / 100 raises "underflow".
    gpu = make_gpu()
    tiny = 5e-324
    samples_ingest(
        [
            sample(gpu, t0, util=tiny, energy_j=tiny, mem_util_pct=tiny, procs=1),
            sample(gpu, t0 + M, util=tiny, power_w=tiny, mem_util_pct=tiny, procs=1),
        ]
    )
    result = rollup_run()
    assert (result.hours, result.rows) == (1, 1) and not RollupPending.objects.exists()
    r = row(gpu, t0)
    assert (r.air_s, r.held_s, r.energy_j, r.power_w_mean, r.util_pct_mean) == (0, 120, 0, 0, 0)
