"""Job efficiency figures (telemetry/efficiency.py, DESIGN.md §9.4), worked out by hand from
JobHour rows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from telemetry.efficiency import job_efficiency, peak_flops
from telemetry.models import JobHour, Workload

H100_SXM = "NVIDIA H100 80GB HBM3"


def job_hour(gpu: Any, hour: dt.datetime, workload: Any, model: str, **sums: float) -> JobHour:
    return JobHour.objects.create(gpu=gpu, hour=hour, workload=workload, model=model, **sums)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA GeForce RTX 4090", None),
        ("", None),
    ],
)
def test_peaks_by_nvml_name(name: str, peak: float | None) -> None:
    assert peak_flops(name) == peak


def test_peaks_overridden_by_key_then_by_name() -> None:
    assert peak_flops(H100_SXM, {"H100-SXM": 900e12}) == 900e12
    assert peak_flops(H100_SXM, {"H100-SXM": 900e12, H100_SXM: 950e12}) == 950e12
    assert peak_flops("NVIDIA GeForce RTX 4090", {"RTX-4090": 165e12}) == 165e12


def test_mfu_and_shares_worked_out_by_hand(
    make_gpu: Any, fleet: dict[str, Any], t0: dt.datetime
) -> None:
    """Job 48213 on 2 H100 SXM GPUs for one hour (3600 s each): flops 2 × 989e12 × 3600 × 0.5
    → MFU 0.5; data wait 900 + 1,260 of 7,200 s → 0.3; checkpoint 360 of 7,200 → 0.05;
    tokens 7.2e8 over 2 GPU hours → 3.6e8 per GPU hour. Job 7 on an RTX 4090 (no peak):
    MFU null. A row at ``end`` is outside."""
    a = make_gpu(name=H100_SXM)
    b = make_gpu(name=H100_SXM)
    c = make_gpu(name="NVIDIA GeForce RTX 4090", node=fleet["node_b"])
    job = Workload.objects.create(kind="slurm", key="48213", created_at=t0)
    other = Workload.objects.create(kind="slurm", key="7", account="nlp", created_at=t0)
    half = 989e12 * 3600 * 0.5
    for gpu, wait in ((a, 900.0), (b, 1260.0)):
        job_hour(
            gpu,
            t0,
            job,
            "llama-8b",
            steps=500,
            tokens=3.6e8,
            flops=half,
            wall_s=3600,
            data_wait_s=wait,
            ckpt_s=180,
            flops_wall_s=3600,
        )
    job_hour(c, t0, other, "bert", steps=10, tokens=1e6, flops=1e15, wall_s=1800, flops_wall_s=1800)
    job_hour(a, t0 + dt.timedelta(hours=1), job, "llama-8b", steps=1, wall_s=60, flops_wall_s=60)

    rows = job_efficiency(start=t0, end=t0 + dt.timedelta(hours=1), group_by="workload")
    assert [(r.key, r.kind) for r in rows] == [("48213", "slurm"), ("7", "slurm")]
    first, second = rows
    assert first.gpu_hours == 2.0
    assert first.steps == 1000 and first.tokens == 7.2e8
    assert first.mfu == pytest.approx(0.5, rel=1e-12)
    assert first.data_starved_share == pytest.approx(0.3)
    assert first.checkpoint_share == pytest.approx(0.05)
    assert first.tokens_per_gpu_hour == pytest.approx(3.6e8)
    assert second.gpu_hours == 0.5 and second.mfu is None
    assert second.data_starved_share == 0.0 and second.tokens_per_gpu_hour == 2e6

    # overrides: a peak for the RTX 4090 by key → 1e15 / (165e12 × 1800)
    rows = job_efficiency(
        start=t0, end=t0 + dt.timedelta(hours=1), group_by="model", peaks={"RTX-4090": 165e12}
    )
    by = {r.key: r for r in rows}
    assert by["bert"].mfu == pytest.approx(1e15 / (165e12 * 1800))
    assert by["llama-8b"].mfu == pytest.approx(0.5)

    # pools and teams: GPUs a, b on node-a (pool-a, team-a), c on node-b (pool-b, team-b); a
    # team rule moves workload 7 to team-a
    rows = job_efficiency(start=t0, end=t0 + dt.timedelta(hours=2), group_by="pool")
    assert {r.key: r.gpu_hours for r in rows} == {
        "pool-a": pytest.approx(2 + 60 / 3600),
        "pool-b": 0.5,
    }
    team_a = fleet["team_a"].pk
    rows = job_efficiency(
        start=t0,
        end=t0 + dt.timedelta(hours=1),
        group_by="team",
        team_of=lambda kind, key, user, account: team_a if account == "nlp" else None,
    )
    assert [(r.key, r.gpu_hours) for r in rows] == [("team-a", 2.5)]
    # MFU of the group over the rows with a known peak only: 48213's
    assert rows[0].mfu == pytest.approx(0.5)


def test_unknown_group_and_no_rows(db: Any, t0: dt.datetime) -> None:
    with pytest.raises(ValueError, match="group_by"):
        job_efficiency(start=t0, end=t0, group_by="gpu")
    assert job_efficiency(start=t0, end=t0 + dt.timedelta(days=1), group_by="team") == []


def test_workloads_apart_by_id_filtered_and_their_parts(
    make_gpu: Any, fleet: dict[str, Any], t0: dt.datetime
) -> None:
    """Job "1" at two sites is two workloads, two rows; ``workload_ids`` keeps one. A part's
    energy: the workload rollup's energy × wall / its GPU seconds (2,000,000 × 900 / 3,600 =
    500,000 J), capped at all of it (wall 3,600 s of 1,800 GPU s → 1,000,000 J)."""
    from telemetry.models import WorkloadHourlyUsage

    a, b = make_gpu(name=H100_SXM), make_gpu(name=H100_SXM)
    here = Workload.objects.create(kind="slurm", key="1", site=fleet["site_a"], created_at=t0)
    there = Workload.objects.create(kind="slurm", key="1", site=fleet["site_b"], created_at=t0)
    job_hour(a, t0, here, "m", wall_s=900, tokens=10)
    job_hour(b, t0, there, "m", wall_s=3600, tokens=20)
    for gpu, workload, gpu_s, energy_j in ((a, here, 3600, 2e6), (b, there, 1800, 1e6)):
        WorkloadHourlyUsage.objects.create(
            workload=workload,
            gpu=gpu,
            hour=t0,
            gpu_s=gpu_s,
            energy_j=energy_j,
            computed_at=t0,
            site=fleet["site_a"],
        )
    end = t0 + dt.timedelta(hours=1)
    rows = job_efficiency(start=t0, end=end, group_by="workload")
    assert [(r.key, r.workload_id, r.tokens) for r in rows] == [
        ("1", there.pk, 20),
        ("1", here.pk, 10),
    ]
    assert [(p.gpu_id, p.site_id, p.wall_s, p.energy_j) for p in rows[0].parts] == [
        (b.pk, fleet["site_a"].pk, 3600, 1e6)
    ]
    assert rows[1].parts[0].energy_j == 500_000
    assert rows[1].parts[0].first_hour == t0 == rows[1].parts[0].last_hour
    (only,) = job_efficiency(start=t0, end=end, group_by="workload", workload_ids=[here.pk])
    assert only.workload_id == here.pk
    assert job_efficiency(start=t0, end=end, group_by="workload", workload_ids=[]) == []
