"""Benchmark: the FOCUS export of a month against the costs API's per-GPU daily CSV.

    DATABASE_URL=postgres://… python bench/focus.py [--gpus 1000] [--days 30] [--keep]
        [--reuse]

Builds a throwaway database like bench/dashboard.py (``--gpus`` GPUs with hourly rollups over
``--days`` + 2 days), then streams, through Django's full stack as a finance user, the same
``--days`` local days twice each, interleaved after a warm-up:

- the reference: ``GET /api/v1/costs?group_by=gpu&period=day&format=csv`` (one row per GPU
  and day, from the same selectors);
- ``GET /api/v1/focus`` (one row per GPU, day and charge: about two per GPU-day).

Prints both times, the ratio (goal, issue 20: ≤ 2), the rows and bytes of each, and the peak
memory Python allocated while each streamed (tracemalloc, in a further run of each: tracing
slows Python several times over), against the size of the file: a stream holds one month's
computation and charges, not the text of the file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

GOAL_RATIO = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the test database")
    parser.add_argument("--reuse", action="store_true", help="reuse a database kept by --keep")
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    if not settings.IS_POSTGRES:
        print("bench/focus.py needs PostgreSQL: set DATABASE_URL", file=sys.stderr)
        return 2
    setup_test_environment()
    settings.ALLOWED_HOSTS = ["*"]
    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = f"bench_focus_{db['NAME']}"
    db_name = connection.creation.create_test_db(
        verbosity=0, autoclobber=True, keepdb=args.reuse, serialize=False
    )
    try:
        return run(args)
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(db_name, verbosity=0)


def stream(client: object, url: str, *, traced: bool = False) -> tuple[float, int, int, int]:
    """Seconds, rows, bytes and (``traced``) peak traced memory of streaming ``url`` to the
    end. Tracing slows Python several times over, so the timed runs are not traced."""
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    response = client.get(url)  # type: ignore[attr-defined]
    assert response.status_code == 200, (url, response.status_code)
    size = lines = 0
    for chunk in response.streaming_content:
        size += len(chunk)
        lines += chunk.count(b"\n")
    seconds = time.perf_counter() - t0
    peak = 0
    if traced:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return seconds, lines - 1, size, peak


def run(args: argparse.Namespace) -> int:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from bench.dashboard import build_fleet, reuse_fleet
    from fleet.roles import role_assign

    start, end = reuse_fleet() if args.reuse else (None, None)
    if start is None or end is None:
        start, end = build_fleet(args.gpus, args.days + 2)
    user, _ = get_user_model().objects.get_or_create(username="bench-finance")
    role_assign(user=user, role="finance")
    client = Client()
    client.force_login(user)
    last = end.date()  # exclusive: the day in progress is left out
    first = last - dt.timedelta(days=args.days)
    span = f"start={first}&end={last}"
    urls = {
        "costs CSV": f"/api/v1/costs?group_by=gpu&period=day&format=csv&{span}",
        "FOCUS 1.2": f"/api/v1/focus?{span}",
    }
    for url in urls.values():  # warm-up: caches, connections, first queries
        stream(client, url)
    print(f"\n{args.days} days of {args.gpus} GPUs, streamed to the end (one run each):")
    print(f"  {'export':<10} {'seconds':>8} {'rows':>8} {'MiB':>7} {'peak MiB':>9}")
    results = {}
    for name, url in urls.items():
        results[name] = stream(client, url)
    for name, url in urls.items():  # memory: a traced run of each, apart from the timing
        seconds, rows, size, _ = results[name]
        peak = stream(client, url, traced=True)[3]
        print(f"  {name:<10} {seconds:8.2f} {rows:8,d} {size / 2**20:7.1f} {peak / 2**20:9.1f}")
    ratio = results["FOCUS 1.2"][0] / results["costs CSV"][0]
    verdict = "ok" if ratio <= GOAL_RATIO else "OVER"
    print(f"  FOCUS / costs: {ratio:.2f} (goal ≤ {GOAL_RATIO:.0f}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
