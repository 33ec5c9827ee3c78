"""Benchmark: one evaluation of 20 alert rules against the overview page's queries.

    DATABASE_URL=postgres://… python bench/alerts.py [--gpus 1000] [--days 90] [--repeat 5]
        [--keep] [--reuse]

The data set is bench/dashboard.py's, built by its own builder in the same throwaway database
(``bench_<name>``; ``--keep`` keeps it, ``--reuse`` takes one kept by either script):
``--gpus`` GPUs on nodes of 8 in six pools, three sites, four teams, ``--days`` of hourly
rollups (1,000 × 90 days = 2.16 M rows), every GPU reporting until now.

Reference: the overview page's queries, ``billing.selectors.fleet_overview`` (the cards and
the daily trend, what the overview view computes) over the last 30 days, the dashboard's
default range and the longest window of the rules. Measured: ``alerts.services.
alerts_evaluate()`` with 20 rules of every kind over windows of 24 h, 7 days, 30 days and the
month to date (settings, figures, state changes, deliveries written; the deliveries are their
own Celery tasks, so their dispatch is left out). First the evaluation that opens the alerts,
then ``--repeat`` steady ones five minutes apart, as beat runs them; medians of warm runs.

Goal (issue 17): one evaluation ≤ 2× the reference, both measured in this run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

GOAL_RATIO = 2.0
REFERENCE_DAYS = 30


def rules() -> list[dict[str, Any]]:
    """Twenty rules as a fleet might write them: every kind, scopes from a GPU to the fleet."""
    ops = ["mailto:ops@example.com"]
    table: list[dict[str, Any]] = []

    def add(rule: str, scope: str, threshold: Any, window: int | None = 24, **extra: Any) -> None:
        row = {"name": f"r{len(table):02d}", "rule": rule, "scope": scope, "threshold": threshold}
        if window is not None:
            row["window_hours"] = window
        table.append({**row, "notify": ops, **extra})

    for pool in ("pool-0", "pool-1", "pool-2", "pool-3"):
        add("gpu_held_hours", f"pool:{pool}", 7)
    add("gpu_parked_hours", "pool:pool-4", 8)
    add("gpu_parked_hours", "pool:pool-5", 8)
    add("gpu_throttled_share", "fleet", 0.1)
    add("gpu_throttled_share", "site:fra1", 0.2)
    add("gpu_offline_minutes", "fleet", 30, window=None)
    add("gpu_offline_minutes", "gpu:GPU-bench-00007", 60, window=None)
    add("utilization_below", "fleet", 0.5, window=168)
    add("utilization_below", "team:research", 0.45, window=168)
    add("utilization_below", "pool:pool-1", 0.4)
    add("utilization_below", "site:ams1", 0.5, window=168)
    add("idle_cost_above", "team:product", "500.00")
    add("idle_cost_above", "team:data", "2000.00")
    add("idle_cost_above", "fleet", "10000.00")
    add("budget_month", "fleet", "500000.00", window=None)
    add("budget_month", "site:iad1", "50000.00", window=None)
    add("budget_month", "team:platform", "80000.00", window=None)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--reuse", action="store_true", help="reuse a kept database")
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    if not settings.IS_POSTGRES:
        print("bench/alerts.py needs PostgreSQL: set DATABASE_URL", file=sys.stderr)
        return 2
    # The database of bench/dashboard.py (same name): either script may reuse the other's.
    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = f"bench_{db['NAME']}"
    name = connection.creation.create_test_db(
        verbosity=0, autoclobber=True, keepdb=args.reuse, serialize=False
    )
    try:
        return run(args, name)
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(name, verbosity=0)


def run(args: argparse.Namespace, name: str) -> int:
    from django.utils import timezone

    from alerts import services
    from alerts.models import Alert, Delivery
    from alerts.services import alerts_evaluate
    from bench.dashboard import build_fleet, reuse_fleet, timed
    from billing import selectors
    from billing.services import fleet_document_apply
    from fleet.models import FleetSettings, Gpu

    start, end = reuse_fleet() if args.reuse else (None, None)
    if start is None or end is None:
        start, end = build_fleet(args.gpus, args.days)
    gpus = Gpu.objects.count()
    print(f"database {name}: {gpus} GPUs, rollups {start:%Y-%m-%d %H:%M} to {end:%H:%M} UTC")
    # Every GPU reported just now, whenever the data set was built.
    Gpu.objects.update(last_seen_at=timezone.now())
    Alert.objects.all().delete()
    fleet_document_apply(document={"currency": "USD", "alerts": rules()})
    services.deliveries_dispatch = lambda ids: None  # each delivery is its own task

    zone = FleetSettings.load().report_zone
    today = timezone.now().astimezone(zone).date()
    # The overview over the data set's days (bench/dashboard.py's range), and over the
    # dashboard's default 30 days: the two readings of "the same window".
    ranges = {
        f"{args.days} days (the data set)": (start.astimezone(zone).date(), today),
        f"{REFERENCE_DAYS} days (the default range)": (
            today - dt.timedelta(days=REFERENCE_DAYS - 1),
            today,
        ),
    }

    def overview(first: dt.date, last: dt.date) -> None:
        selectors.fleet_overview(start=first, end=last + dt.timedelta(days=1))

    now = timezone.now()
    t0 = time.perf_counter()
    opened = alerts_evaluate(now=now)
    first_ms = (time.perf_counter() - t0) * 1000
    print(f"  first evaluation: {opened.summary()}")
    print(f"  {Alert.objects.count()} alerts, {Delivery.objects.count()} deliveries written")

    steps = iter(range(1, 10_000))

    def steady() -> None:
        alerts_evaluate(now=now + dt.timedelta(minutes=5 * next(steps)))

    # Interleaved, so that a neighbour's load on the shared cores hits both alike; each
    # timed call comes right after a warm-up call of its own (bench.dashboard.timed).
    evaluation: list[float] = []
    references: dict[str, list[float]] = {label: [] for label in ranges}
    for _ in range(args.repeat):
        evaluation += timed(steady, 1)
        for label, (first, last) in ranges.items():
            references[label] += timed(functools.partial(overview, first, last), 1)
    eval_ms = statistics.median(evaluation)
    print(f"\n{gpus} GPUs × {args.days} days of rollups, {len(rules())} rules, {args.repeat} runs:")
    print(f"  alerts_evaluate, steady (every 5 min)      {eval_ms:8.0f} ms")
    print(f"  alerts_evaluate, first (opens the alerts)  {first_ms:8.0f} ms (one run)")
    ratios = {}
    for label, times in references.items():
        ref_ms = statistics.median(times)
        ratios[label] = eval_ms / ref_ms
        print(
            f"  reference: overview queries, {label:<28} {ref_ms:8.0f} ms   "
            f"ratio {eval_ms / ref_ms:.2f}× steady, {first_ms / ref_ms:.2f}× first"
        )
    ratio = next(iter(ratios.values()))
    print(
        f"\nratio evaluation / overview over the same {args.days} days: {ratio:.2f}× "
        f"(goal ≤ {GOAL_RATIO:.0f}×): {'met' if ratio <= GOAL_RATIO else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
