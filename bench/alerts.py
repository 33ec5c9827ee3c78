"""Benchmark: one evaluation of 20 alert rules against the overview page's queries.

    DATABASE_URL=postgres://… python bench/alerts.py [--gpus 1000] [--days 90] [--repeat 5]
        [--keep] [--reuse]

The data set is bench/dashboard.py's, built by its own builder in the same throwaway database
(``bench_<name>``; ``--keep`` keeps it, ``--reuse`` takes one kept by either script):
``--gpus`` GPUs on nodes of 8 in six pools, three sites, four teams, ``--days`` of hourly
rollups (1,000 × 90 days = 2.16 M rows), every GPU reporting until now.

Reference: the overview page's queries, ``billing.selectors.fleet_overview`` (the cards and
the daily trend: what the overview view computes), over the data set's days (the issue's
"same window") and, beside it, over the dashboard's default 30 days. Measured:
``alerts.services.alerts_evaluate()`` with 20 rules of every kind (windows of 24 h and 7 days
and the month to date; settings, figures, state changes and deliveries written; the
deliveries are their own Celery tasks, so their dispatch is left out). First the evaluation
that opens the alerts (none open before it) and a steady one (after a warm-up one; a minute
apart within the hour after the last rollup, every GPU reporting), ``--repeat`` times each;
medians, each run interleaved with the references so that load from neighbours on shared
cores hits all alike. The goal is checked against the slower of the two.

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
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (at most 25)")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--reuse", action="store_true", help="reuse a kept database")
    args = parser.parse_args()
    args.repeat = max(1, min(25, args.repeat))  # two evaluations a run, within one hour

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
    # The evaluations run in the hour after the data set's last rollup hour, a minute apart,
    # with every GPU seen at its start: a fleet that reports, as the rules see it every 5
    # minutes (time stands still for the GPUs, so none drifts offline during the runs).
    base = end + dt.timedelta(minutes=1)
    Gpu.objects.update(last_seen_at=base)
    Alert.objects.all().delete()
    fleet_document_apply(document={"currency": "USD", "alerts": rules()})
    services.deliveries_dispatch = lambda ids: None  # each delivery is its own task

    zone = FleetSettings.load().report_zone
    today = base.astimezone(zone).date()
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

    opened = alerts_evaluate(now=base)
    print(f"  an evaluation that opens the alerts: {opened.summary()}")
    print(f"  {Alert.objects.count()} alerts, {Delivery.objects.count()} deliveries written")

    steps = iter(range(1, 10_000))

    def steady() -> None:
        alerts_evaluate(now=base + dt.timedelta(minutes=next(steps)))

    def opening() -> float:
        Alert.objects.all().delete()  # not timed: the alerts and their deliveries go
        t0 = time.perf_counter()
        alerts_evaluate(now=base)
        return (time.perf_counter() - t0) * 1000

    # Interleaved, so that a neighbour's load on the shared cores hits all alike; each
    # timed steady call and reference comes right after a warm-up call of its own
    # (bench.dashboard.timed); the opening one after a steady run.
    runs: dict[str, list[float]] = {"steady": [], "opening": []}
    references: dict[str, list[float]] = {label: [] for label in ranges}
    for _ in range(args.repeat):
        runs["opening"].append(opening())
        runs["steady"] += timed(steady, 1)
        for label, (first, last) in ranges.items():
            references[label] += timed(functools.partial(overview, first, last), 1)
    measured = {name: statistics.median(times) for name, times in runs.items()}
    print(f"\n{gpus} GPUs × {args.days} days of rollups, {len(rules())} rules, {args.repeat} runs:")
    print(f"  alerts_evaluate, steady (every 5 min)        {measured['steady']:8.0f} ms")
    print(
        f"  alerts_evaluate, opening {opened.started} alerts          {measured['opening']:8.0f} ms"
    )
    ratios: dict[str, float] = {}
    for label, times in references.items():
        ref_ms = statistics.median(times)
        ratios[label] = max(measured.values()) / ref_ms
        per_steady, per_opening = measured["steady"] / ref_ms, measured["opening"] / ref_ms
        print(
            f"  reference: overview queries, {label:<28} {ref_ms:6.0f} ms   "
            f"ratio {per_steady:.2f}× steady, {per_opening:.2f}× opening"
        )
    ratio = next(iter(ratios.values()))
    print(
        f"\nratio evaluation / overview over the same {args.days} days, the slower evaluation: "
        f"{ratio:.2f}× (goal ≤ {GOAL_RATIO:.0f}×): {'met' if ratio <= GOAL_RATIO else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
