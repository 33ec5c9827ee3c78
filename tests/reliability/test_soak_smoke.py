"""bench/soak.py, tiny and bounded (48 GPUs, 10 s intervals, ~20 s) on the test database: the
script runs, and its own checks hold (stored = sent, rollups equal a clean recomputation).
The real soak (2,000 GPUs) is run by hand; its numbers are in docs/benchmarks.md ("## Soak")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.models import HourlyUsage, Sample
from tests.reliability.conftest import ROOT, db_url_for_test, server_env


@pytest.mark.slow
def test_soak_smoke(pg: None, redis_url: str, tmp_path: Path) -> None:
    env = server_env(database_url=db_url_for_test(), redis_url=redis_url)
    out = subprocess.run(
        [
            sys.executable,
            "bench/soak.py",
            "--gpus",
            "48",
            "--duration",
            "22",
            "--keep-db",
            "--database-url",
            db_url_for_test(),
            "--redis-url",
            redis_url,
            "--workers",
            "1",
            "--senders",
            "2",
            "--rollup-every",
            "5",
            "--log-dir",
            str(tmp_path),
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["intervals"] >= 1
    assert result["sent"] == result["stored"] == 48 * result["intervals"]
    assert result["rollups_equal_clean_run"]
    # The script's numbers are the database's.
    assert Sample.objects.count() == result["stored"]
    assert HourlyUsage.objects.count() == result["rollup_rows"] >= 48
    # Two workers on separate queues both took rollup tasks (sent two at a time), and the
    # rows still equal one clean run: the lock kept their runs apart.
    by_worker = result["rollup_tasks_by_worker"]
    assert set(by_worker) == {"worker-rollups", "worker-all"}
    assert all(n >= 1 for n in by_worker.values()), by_worker
