"""Check: the figures of closed months, as the close and the late data give them, against the
same window computed from the rollups with every month open (issue 19).

    DATABASE_URL=postgres://…/<name> python bench/closed_compare.py

Reads a database kept by ``bench/dashboard.py --keep --close-months N`` (pass the kept
database's own name, ``bench_<name>``). With no data arriving after the closes, a close must
read as the live computation did: every cost row (each grouping and period over the whole
window, the overview's summary and trend) equal to the cent, and no adjustment row. The
open reading runs in a transaction that marks every close open and is rolled back.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

FIELDS = (
    "fixed_cost",
    "energy_cost",
    "idle_cost",
    "total_cost",
    "capacity_hours",
    "air_hours",
    "offline_hours",
    "energy_kwh",
    "co2e_kg",
    "gpu_count",
)
CENT = Decimal("0.01")


def figures(start: dt.date, end: dt.date, now: dt.datetime) -> dict[tuple[Any, ...], Any]:
    from billing import selectors

    out: dict[tuple[Any, ...], Any] = {}
    for group_by in ("fleet", "team", "pool", "site", "model", "gpu", "node"):
        for period in ("all", "month", "day"):
            if group_by in ("gpu", "node") and period == "day":
                continue  # 90,000 rows: the monthly ones hold the same segments
            rows = selectors.cost_rows(
                start=start, end=end, group_by=group_by, period=period, now=now
            )
            for r in rows:
                for name in FIELDS:
                    key = (group_by, period, r.period_start, r.key, r.adjustment_for, name)
                    out[key] = getattr(r, name)
    summary, trend = selectors.fleet_overview(start=start, end=end, now=now)
    for name in FIELDS:
        out[("overview", name)] = getattr(summary.row, name)
    for r in trend:
        out[("trend", r.period_start, "total_cost")] = r.total_cost
    return out


def main() -> int:
    import django

    django.setup()
    from django.db import transaction

    from bench.dashboard import reuse_fleet
    from billing.models import MonthClose

    first, last = reuse_fleet()
    if first is None or last is None:
        print("no rollups here: build a data set with bench/dashboard.py --keep", file=sys.stderr)
        return 2
    closes = list(MonthClose.objects.filter(closed=True).values_list("month", flat=True))
    print(f"closed months: {', '.join(f'{m:%Y-%m}' for m in sorted(closes)) or 'none'}")
    start, end = first.date(), last.date() + dt.timedelta(days=1)
    started = time.perf_counter()
    closed = figures(start, end, last)
    print(f"  read with the closes: {time.perf_counter() - started:.1f} s")
    with transaction.atomic():
        MonthClose.objects.update(closed=False)
        started = time.perf_counter()
        live = figures(start, end, last)
        print(f"  read all open:        {time.perf_counter() - started:.1f} s")
        transaction.set_rollback(True)
    only = set(closed) ^ set(live)
    differ, worst_float, worst_money = 0, 0.0, Decimal(0)
    for key in set(closed) & set(live):
        a, b = closed[key], live[key]
        if isinstance(a, Decimal):
            worst_money = max(worst_money, abs(a - b))
            same = a.quantize(CENT) == b.quantize(CENT)
        else:
            worst_float = max(worst_float, abs(a - b) / max(abs(b), 1e-12))
            same = abs(a - b) <= 1e-9 * max(abs(b), 1.0)
        if not same:
            differ += 1
            print(f"  DIFFERS {key}: {a} closed, {b} open")
    for key in sorted(only, key=str)[:10]:
        print(f"  ONLY {'closed' if key in closed else 'open'}: {key}")
    print(
        f"{len(closed)} values; {differ} differ (money in cents, floats beyond 1e-9); "
        f"{len(only)} rows on one side only; largest difference: money {worst_money:.1e}, "
        f"floats {worst_float:.1e} (relative)"
    )
    return 1 if differ or only else 0


if __name__ == "__main__":
    sys.exit(main())
