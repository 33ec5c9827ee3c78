"""bench/sizing.py's derivation (docs/deploy.md "Sizing"): measured figures in, the table's
numbers out, against values worked out by hand from round figures."""

from __future__ import annotations

import pytest

from bench.sizing import Figures, derive, rollup_limit_gpus

# Per GPU: 24 hourly rows, one daily row and 24 workload rows a day (100 GPUs, one day).
FIGURES = Figures(
    gpus=100,
    minutes=1440,
    raw_bytes_per_sample=300,
    hourly_rows=2400,
    daily_rows=100,
    workload_rows=2400,
    hourly_bytes_per_row=500,
    daily_bytes_per_row=10_600,
    workload_bytes_per_row=250,
    hourly_bytes_per_row_packed=400,
    daily_bytes_per_row_packed=600,
    workload_bytes_per_row_packed=200,
    wal_ingest_per_sample=500,
    wal_rollup_per_gpu_hour=120_000,
    rollup_fixed_wal=100,
    fpi_per_checkpoint_per_gpu=8_000,
    push_server_cpu_ms=1.0,
    push_client_cpu_ms=0.8,
    push_server_cpu_ms_basic=0.6,
    push_client_cpu_ms_basic=0.5,
    rollup_fixed_server_ms=5,
    rollup_server_ms_per_gpu=0.1,
    rollup_server_ms_per_gpu_sample=0.01,
    rollup_client_ms_per_run=5,
)


def test_a_fleet_whose_rollup_keeps_up_with_the_beat() -> None:
    d = derive(FIGURES, 9_600, push_ms=3.0)  # 1,200 nodes
    assert d.pushes_per_s == pytest.approx(20)
    # 3.0 ms + what profiling and workloads add: 0.3 ms of service, 0.4 ms of PostgreSQL.
    assert d.push_ms == pytest.approx(3.7)
    assert d.web_busy == pytest.approx(0.074)
    assert d.web_processes == 2  # 0.074 / 0.5 → 1, but never fewer than 2
    # Minute 60: 5 ms + 9,600 × (0.1 + 0.01 × 60) ms, plus the worker's 5 ms.
    assert d.rollup_last_run_s == pytest.approx(6.730)
    assert d.rollup_every_s == 60
    # The hour's runs: 60 × 5 ms + 9,600 × (60 × 0.1 + 0.01 × 1,830) ms = 233.58 s an hour.
    assert d.pg_rollup_cores == pytest.approx(233.58 / 3600)
    assert d.pg_ingest_cores == pytest.approx(0.020)
    assert d.pg_cores == 2
    assert d.lag_mean_s == pytest.approx(30 + 233.58 / 60 + 0.005)
    assert d.lag_max_s == pytest.approx(60 + 6.730)
    assert d.raw_per_day == 9_600 * 1_440 * 300 == 4_147_200_000
    assert d.raw_retention == 36 * 4_147_200_000
    # Per GPU-day 24 × 400 + 600 + 24 × 200 = 15,000 B; superseded per GPU 24 × 100 + 10,000
    # + 24 × 50 = 13,600 B.
    assert d.rollup_per_day == pytest.approx(9_600 * 15_000)
    assert d.rollup_per_year == pytest.approx(9_600 * 15_000 * 365)
    assert d.rollup_superseded == pytest.approx(9_600 * 13_600)
    # Five minutes: 9,600 × 5 × 500 of samples, 5 runs × (9,600 × 2,000 + 100), 9,600 × 8,000.
    assert d.wal_per_checkpoint == pytest.approx(24_000_000 + 96_000_500 + 76_800_000)
    assert d.wal_per_day == pytest.approx(288 * 196_800_500)


def test_a_rollup_longer_than_the_beat_runs_every_other_minute() -> None:
    d = derive(FIGURES, 100_000, push_ms=3.0)
    # Minute 60: 5 ms + 100,000 × 0.7 ms + 5 ms = 70.01 s: the next beat finds the lock held.
    assert d.rollup_last_run_s == pytest.approx(70.010)
    assert d.rollup_every_s == 120
    # 30 runs at minutes 2, 4, … 60: 30 × 5 ms + 100,000 × (30 × 0.1 + 0.01 × 930) ms.
    assert d.pg_rollup_cores == pytest.approx(1230.15 / 3600)
    assert d.lag_mean_s == pytest.approx(60 + 1230.15 / 30 + 0.005)
    assert d.lag_max_s == pytest.approx(120 + 70.010)
    # 2.5 runs per five minutes.
    assert d.wal_per_checkpoint == pytest.approx(
        250_000_000 + 2.5 * (100_000 * 2_000 + 100) + 800_000_000
    )
    # The fleet whose last run takes 60 s: (60 - 0.005 - 0.005) s / 0.7 ms per GPU.
    assert rollup_limit_gpus(FIGURES, 60) == 85_700
