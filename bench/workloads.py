"""Benchmark: the Workloads page and API on PostgreSQL, against the overview in the same run.

    DATABASE_URL=postgres://… python bench/workloads.py [--gpus 1000] [--days 90]
        [--workloads 50000] [--repeat 10] [--keep] [--reuse] [--daily-only]

Builds a throwaway database (``bench_<name>``, as bench/dashboard.py, whose fleet and hourly
rollups it reuses: ``--gpus`` GPUs on nodes of 8, ``--days`` of hourly rows), then about
``--workloads`` workloads: Slurm jobs that each hold the 8 GPUs of one node for a run of whole
hours (node-hours / workloads long), one hourly workload row per GPU and hour (1,000 × 90 days
= 2.16 M rows), written by one ``INSERT … SELECT`` with the same utilisation and energy as the
GPU's hourly row. Times, as a logged-in finance user through Django's full stack, the
Workloads page, ``GET /api/v1/workloads?group_by=account`` and the overview, interleaved, over
the whole range and the last 30 days: p50/p95 and the ratio to the overview. Goal (issue 14):
Workloads page p95 ≤ 500 ms at 1,000 GPUs × 90 days and 50,000 workloads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

GOAL_MS = 500.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--workloads", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the test database")
    parser.add_argument("--reuse", action="store_true", help="reuse a database kept by --keep")
    parser.add_argument(
        "--daily-only",
        action="store_true",
        help="skip the run with the daily tables out of use (the hourly rows' fallback)",
    )
    args = parser.parse_args()

    from bench.dashboard import bench_database

    db_name = bench_database("bench_wl", reuse=args.reuse)
    if db_name is None:
        print("bench/workloads.py needs PostgreSQL: set DATABASE_URL", file=sys.stderr)
        return 2
    from django.db import connection

    print(f"database {db_name}: {args.gpus} GPUs × {args.days} days, ~{args.workloads:,} workloads")
    try:
        return run(args)
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(db_name, verbosity=0)


def build_workloads(start: dt.datetime, end: dt.datetime, workloads: int) -> int:
    """Slurm jobs of one node's 8 GPUs each, back to back on every node; → jobs made."""
    from django.db import connection

    from fleet.models import Node, Site

    nodes = Node.objects.count()
    hours = int((end - start).total_seconds() // 3600)
    run_h = max(1, -(-nodes * hours // workloads))  # ceil: about `workloads` jobs in all
    per_node = -(-hours // run_h)
    site = Site.objects.order_by("pk").first()
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        # Job n runs on node n // per_node, in its (n % per_node)-th run of run_h hours; ids
        # from 1 so the rollup rows below can name them by arithmetic.
        cursor.execute(
            """
            INSERT INTO telemetry_workload (id, site_id, kind, key, user_name, account, name,
                                            first_seen_at, last_seen_at, created_at)
            SELECT n + 1, %(site)s, 'slurm', (100000 + n)::text, 'user-' || (n %% 97),
                   'acct-' || (n %% 13), 'job-' || (n %% 7),
                   %(start)s::timestamptz + (n %% %(per_node)s) * %(run_h)s * interval '1 hour',
                   %(start)s::timestamptz + ((n %% %(per_node)s) + 1) * %(run_h)s
                       * interval '1 hour',
                   now()
            FROM generate_series(0, %(jobs)s - 1) AS n
            """,
            {
                "site": site.pk if site else None,
                "start": start,
                "per_node": per_node,
                "run_h": run_h,
                "jobs": nodes * per_node,
            },
        )
        jobs = int(cursor.rowcount)
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('telemetry_workload', 'id'), %s)", [jobs]
        )
        # One row per GPU and hour, as the rollup writes them: the whole hour held by the
        # node's job of that hour, air and energy as the GPU's hourly row says.
        cursor.execute(
            """
            INSERT INTO telemetry_workloadhourlyusage (
                workload_id, gpu_id, hour, node_id, pool_id, team_id, site_id, samples,
                gpu_s, air_s, energy_j, computed_at)
            SELECT (hu.node_id - %(node0)s) * %(per_node)s
                       + (extract(epoch FROM hu.hour - %(start)s::timestamptz)::bigint
                          / 3600 / %(run_h)s) + 1,
                   hu.gpu_id, hu.hour, hu.node_id, hu.pool_id, hu.team_id, hu.site_id, 60,
                   3600, hu.air_s, hu.energy_j, now()
            FROM telemetry_hourlyusage AS hu
            WHERE hu.hour >= %(start)s AND hu.hour < %(end)s
            """,
            {
                "node0": Node.objects.order_by("pk").values_list("pk", flat=True).first(),
                "per_node": per_node,
                "start": start,
                "end": end,
                "run_h": run_h,
            },
        )
        rows = cursor.rowcount
        cursor.execute("ANALYZE telemetry_workload")
        cursor.execute("ANALYZE telemetry_workloadhourlyusage")
    print(
        f"  {jobs:,} workloads ({run_h} h × 8 GPUs each), {rows:,} workload rollup rows in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return jobs


def run(args: argparse.Namespace) -> int:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from bench.dashboard import build_fleet, reuse_fleet
    from fleet.roles import role_assign
    from telemetry.models import Workload, WorkloadDailyState
    from telemetry.rollup import workload_daily_rebuild

    start, end = reuse_fleet() if args.reuse else (None, None)
    if start is None or end is None:
        start, end = build_fleet(args.gpus, args.days)
    if not Workload.objects.exists():
        build_workloads(start, end, args.workloads)
    user, _ = get_user_model().objects.get_or_create(username="bench-finance")
    role_assign(user=user, role="finance")
    client = Client()
    client.force_login(user)
    last = (end - dt.timedelta(hours=1)).date()
    ranges = {
        f"{args.days} days": (start.date(), last),
        "30 days": (last - dt.timedelta(days=29), last),
    }
    worst = 0.0
    for path in ("daily rows",) if args.daily_only else ("hourly rows", "daily rows"):
        if path == "hourly rows":  # the daily table out of use: the selector reads hours
            WorkloadDailyState.objects.all().delete()
        else:
            t0 = time.perf_counter()
            days = workload_daily_rebuild()
            print(f"\nWorkloadDailyUsage rebuilt ({days} days) in {time.perf_counter() - t0:.1f} s")
        worst = measure(args, client, ranges, path)
    print(
        f"\nworkloads page worst p95 {worst:.0f} ms (goal ≤ {GOAL_MS:.0f} ms): "
        f"{'met' if worst <= GOAL_MS else 'NOT met'}"
    )
    return 0


def measure(args: argparse.Namespace, client: Any, ranges: dict[str, Any], path: str) -> float:
    """Every page over each range, interleaved → the Workloads page's worst p95 (ms)."""
    from bench.dashboard import p95

    worst = 0.0
    print(f"\n{path}: {args.repeat} requests each, interleaved (one round: every page once):")
    print(f"  {'page':<38} {'p50 ms':>8} {'p95 ms':>8} {'/ overview p50':>15}")
    for label, (first, final) in ranges.items():
        rng = f"from={first}&to={final}"
        api = f"start={first}&end={final + dt.timedelta(days=1)}"
        pages = {
            f"overview, {label}": f"/?{rng}",
            f"workloads page, {label}": f"/workloads/?{rng}",
            f"API group_by=account, {label}": f"/api/v1/workloads?{api}&group_by=account",
            # The overview's workloads panel, which the overview fetches after it loads.
            f"overview's workloads panel, {label}": f"/overview/workloads/?{rng}",
        }
        times: dict[str, list[float]] = {name: [] for name in pages}
        for url in pages.values():  # warm-up
            assert client.get(url).status_code == 200, url
        for _ in range(args.repeat):
            for name, url in pages.items():
                t0 = time.perf_counter()
                response = client.get(url)
                times[name].append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200, (url, response.status_code)
        overview = statistics.median(times[f"overview, {label}"])
        for name, values in times.items():
            if name.startswith("workloads page"):
                worst = max(worst, p95(values))
            print(
                f"  {name:<38} {statistics.median(values):8.0f} {p95(values):8.0f} "
                f"{statistics.median(values) / overview:14.2f}×"
            )
    return worst


if __name__ == "__main__":
    sys.exit(main())
