"""The simulated fleet's training loops (``jobs=1``, the demo's llm-training pool): what the
hook would report, and what the server makes of it (DESIGN.md §9.4). Over a two-hour cycle
of a run (118 minutes computing or waiting, the 2-minute checkpoint stall) the healthy run's
MFU is 52 %, the starved run's 18 % with 55 % of its time waiting on data, and each spends
2/120 of its time checkpointing, worked out from the pattern's own numbers."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from telemetry.agent.fake import FakeFleet, PatternGpu, simulate

SPEC = "nodes=1,gpus=2,model=H100,pattern=training|starved,site=fra1,workloads=1,jobs=1"
EPOCH = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
PEAK = 989e12  # H100 SXM, dense bf16


def busy_cycle(fleet: FakeFleet) -> int:
    """The first minute m (a multiple of 120) from which both GPUs run a job for two hours."""
    gpus = [g for g in fleet.node(fleet.nodes[0]).gpus if isinstance(g, PatternGpu)]
    m = int(EPOCH.timestamp()) // 60
    while not all(g._busy_slot(m // 360) and g._busy_slot((m + 119) // 360) for g in gpus):
        m += 120
    return m


def test_a_two_hour_cycle_reports_the_pattern_s_shares() -> None:
    fleet = FakeFleet(SPEC, seed=3, epoch=EPOCH)
    m = busy_cycle(fleet)
    training, starved = fleet.node(fleet.nodes[0]).gpus
    assert isinstance(training, PatternGpu) and isinstance(starved, PatternGpu)
    for gpu, mfu, waits in ((training, 0.52, 0.06), (starved, 0.18, 0.55)):
        job = gpu.job(m * 60, (m + 120) * 60)
        assert job is not None
        assert (job["wall_s"], job["ckpt_s"]) == (7200.0, 120.0)
        assert job["data_wait_s"] / job["wall_s"] == pytest.approx(waits, abs=1e-6)
        assert job["flops"] / (PEAK * job["wall_s"]) == pytest.approx(mfu)
        assert job["data_wait_s"] + job["compute_s"] + job["ckpt_s"] == pytest.approx(7200.0)
    # Without jobs=1 the same GPUs report nothing.
    plain = FakeFleet(SPEC.replace(",jobs=1", ""), seed=3, epoch=EPOCH)
    assert plain.node(plain.nodes[0]).gpus[0].job(m * 60, (m + 120) * 60) is None


@pytest.mark.django_db
def test_the_server_shows_mfu_and_data_starved_shares_of_the_simulated_jobs() -> None:
    """The simulated samples (15-minute intervals) through the ingest service and the rollup:
    per model, the figures of the cycle above."""
    from fleet.models import Node
    from telemetry.efficiency import job_efficiency
    from telemetry.ingest import sample_batch_ingest
    from telemetry.rollup import rollup_run

    fleet = FakeFleet(SPEC, seed=3, epoch=EPOCH)
    m = busy_cycle(fleet)
    start = dt.datetime.fromtimestamp(m * 60, dt.UTC)
    end = start + dt.timedelta(hours=2)
    node = Node.objects.create(hostname=fleet.nodes[0])
    payloads: list[dict[str, Any]] = [
        p for _, p in simulate(fleet, start=start, end=end, interval_s=900, batch_intervals=8)
    ]
    assert all("job" in s for p in payloads for s in p["samples"])
    for payload in payloads:
        sample_batch_ingest(node_id=node.pk, payload_bytes=json.dumps(payload).encode(), now=end)
    rollup_run(wait=True)
    rows = {r.key: r for r in job_efficiency(start=start, end=end, group_by="model")}
    assert set(rows) == {"llama-3-8b", "vit-h-14"}
    for model, mfu, waits in (("llama-3-8b", 0.52, 0.06), ("vit-h-14", 0.18, 0.55)):
        row = rows[model]
        assert row.gpu_hours == pytest.approx(2.0)
        assert row.mfu == pytest.approx(mfu)
        assert row.data_starved_share == pytest.approx(waits, abs=1e-6)
        assert row.checkpoint_share == pytest.approx(2 / 120)
