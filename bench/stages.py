"""Stages of a page timed alone, to compare two checkouts on one kept bench database.

    cd <checkout> && DATABASE_URL=postgres://…/bench_c10k python <this file> [--repeat 7]

Imports the project from the current directory (run it from the checkout whose code is
measured, as ``bench/figures_compare.py dump`` does), so the same file times two checkouts
in turn. The database is one ``bench/dashboard.py --keep --close-months N`` leaves. Prints,
for the data set's window (its first to its last day), the median of ``--repeat`` runs
after one warm-up, wall and this process's CPU milliseconds, of:

- the fleet load (``loading._load``: settings, names, cost profiles, every GPU and its
  rates), with a digest of what it loaded (every GPU's info and the node names, by
  ``repr``): two checkouts that load the same fleet print the same digest;
- each closed month's booking computation (``closing.late_data_of``: the month recomputed
  per GPU and day less its frozen rows and the adjustments booked: what the task does per
  stale month), with the number of rows it would book and a digest of them.

A page's own timings (``bench/dashboard.py``, ``bench/pages_turn.py``) vary by tens of
percent on a shared machine; a stage alone, in turn, shows a change of a few percent of a
page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(median wall ms, median CPU ms, the last result) of ``repeat`` calls after one."""
    result = fn()
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return statistics.median(walls), statistics.median(cpus), result


def digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    import django

    django.setup()
    from django.db.models import Max, Min

    from billing.models import MonthClose
    from billing.selectors import closing, loading
    from billing.selectors.types import Filters
    from telemetry.models import HourlyUsage

    span = HourlyUsage.objects.aggregate(first=Min("hour"), last=Max("hour"))
    start, end = span["first"].date(), span["last"].date() + dt.timedelta(days=1)
    now = span["last"] + dt.timedelta(hours=1)
    print(f"checkout {os.getcwd()}, window {start} to {end}, {args.repeat} runs each")

    def load() -> Any:
        return loading._load(start=start, end=end, filters=Filters(), now=now)

    wall, cpu, loaded = timed(load, args.repeat)
    fleet = digest((sorted(loaded.gpus.items()), sorted(loaded.names.nodes.items())))
    print(f"  load          {wall:7.1f} ms wall {cpu:7.1f} ms CPU  {len(loaded.gpus)} GPUs {fleet}")
    for close in MonthClose.objects.filter(closed=True).order_by("month"):

        def book(close: Any = close) -> Any:
            return closing.late_data_of(close, now=now)[0]

        wall, cpu, late = timed(book, args.repeat)
        print(
            f"  book {close.month:%Y-%m}    {wall:7.1f} ms wall {cpu:7.1f} ms CPU  "
            f"{len(late)} rows to book {digest(sorted(repr(s.sums) for s in late))}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
