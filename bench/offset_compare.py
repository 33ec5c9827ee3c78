"""Check: limit/offset pages of the finance API (their ``count`` and rows, as
``counting.bucket_counts`` finds them) against every row computed part by part (issue 19).

    DATABASE_URL=postgres://…/<name> python bench/offset_compare.py \\
        [--cases gpu/day,gpu/week,team/week,gpu/all]

Reads a database kept by ``bench/dashboard.py --keep`` (pass the kept database's own name,
``bench_<name>``), with months closed or not. For each grouping/period over the data set's
whole window: every row through ``cost_rows_in_parts`` (what a page without a count
streams), then the first page, one a third of the way in and the last, each of 100 rows:
the count must be the number of rows and each row equal to its counterpart (money to the
cent, floats within 1e-9 relative, everything else exactly). One ``now`` for both sides.
Prints the seconds of each, and exits 1 where anything differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

CASES = "gpu/day,gpu/week,gpu/month,gpu/all,node/week,team/day,team/week,model/week,site/all"
CENT = Decimal("0.01")


def differences(got: list[Any], want: list[Any]) -> list[tuple[Any, ...]]:
    """(key, field, got, wanted) of each field that differs between two lists of rows."""
    if len(got) != len(want):
        return [("rows", "count", len(got), len(want))]
    out = []
    for a, b in zip(got, want, strict=True):
        for field in dataclasses.fields(a):
            x, y = getattr(a, field.name), getattr(b, field.name)
            if isinstance(x, float) and isinstance(y, float):
                same = abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1.0)
            elif isinstance(x, Decimal) and isinstance(y, Decimal):
                same = x.quantize(CENT) == y.quantize(CENT)
            else:
                same = x == y
            if not same:
                out.append((a.key, field.name, x, y))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=CASES, help="group_by/period pairs, comma-separated")
    args = parser.parse_args()
    import django

    django.setup()
    from django.utils import timezone

    from bench.dashboard import reuse_fleet
    from billing import selectors
    from billing.api.views import period_chunks

    first, last = reuse_fleet()
    if first is None or last is None:
        print("no rollups here: build a data set with bench/dashboard.py --keep", file=sys.stderr)
        return 2
    start, end = first.date(), (last - dt.timedelta(hours=1)).date() + dt.timedelta(days=1)
    now = timezone.now()
    bad = 0
    for case in args.cases.split(","):
        group_by, period = case.split("/")
        query = {"start": start, "end": end, "group_by": group_by, "period": period, "now": now}
        started = time.perf_counter()
        every = list(selectors.cost_rows_in_parts(**query, parts=period_chunks(start, end, period)))
        whole_s = time.perf_counter() - started
        for offset in sorted({0, len(every) // 3, max(0, len(every) - 100)}):
            started = time.perf_counter()
            count, page = selectors.cost_rows_counted(
                **query, parts=period_chunks(start, end, period), offset=offset, limit=100
            )
            page_s = time.perf_counter() - started
            found = differences(page, every[offset : offset + 100])
            if count != len(every):
                found.insert(0, ("page", "count", count, len(every)))
            bad += bool(found)
            print(
                f"  {case:<11} offset {offset:>7,}: count {count:,} of {len(every):,} rows, "
                f"page {'same' if not found else 'DIFFERS'} ({page_s:.2f} s; every row "
                f"{whole_s:.1f} s)"
            )
            for item in found[:3]:
                print(f"    {item}")
    print(f"{bad} pages differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
