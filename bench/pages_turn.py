"""Dashboard pages of two checkouts timed in turn, on one kept bench database.

    DATABASE_URL=postgres://…/bench_y10k python bench/pages_turn.py BEFORE_DIR AFTER_DIR \\
        [--pages "overview,fleet board" | "overview;api gpu/day, offset+count"] [--rounds 3]
        [--requests 3]

``bench/dashboard.py`` times each page of one checkout; run twice, minutes apart, on a machine
whose speed drifts by tens of percent (docs/benchmarks.md), two checkouts' figures are not
comparable. This script alternates them: for each page and round, one process per checkout
(``BEFORE_DIR`` first in odd rounds, ``AFTER_DIR`` first in even ones) logs in, makes one
warm-up request and ``--requests`` timed ones through Django's test client, as
``bench/dashboard.py`` does, and gives their median. Each page's line gives the median of
each side's round medians, their ratio, and each round's pair. The pages and their URLs are
``bench/dashboard.py``'s (``page_urls``) of this checkout, the same for both sides. The
database is the one ``bench/dashboard.py --keep`` leaves; both checkouts must have its
migrations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# One page of one checkout, run in that checkout (its own code): logs in, one warm-up request,
# then the timed ones; prints their milliseconds as JSON.
_ONE_PAGE = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
import logging
logging.disable(logging.INFO)
from django.contrib.auth import get_user_model
from django.test import Client
from fleet.roles import role_assign
user, _ = get_user_model().objects.get_or_create(username="bench-finance")
role_assign(user=user, role="finance")
client = Client()
client.force_login(user)
url = sys.argv[1]
assert client.get(url).status_code == 200, url
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    client.get(url)
    times.append((time.perf_counter() - t) * 1000)
print(json.dumps(times))
"""


def one_page(checkout: Path, url: str, requests: int) -> float:
    """The median of ``requests`` timed requests of ``url`` in a process of ``checkout``."""
    done = subprocess.run(
        [sys.executable, "-c", _ONE_PAGE, url, str(requests)],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
    )
    times: list[float] = json.loads(done.stdout.strip().splitlines()[-1])
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--pages", default="overview,fleet board,teams & pools,break-even")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from bench.dashboard import page_urls, reuse_fleet

    start, end = reuse_fleet()
    if start is None or end is None:
        sys.exit("no kept data set in this database: build one with bench/dashboard.py --keep")
    urls = page_urls(start, end)
    print(f"{'page':<26} {'before ms':>10} {'after ms':>10} {'after/before':>13}  rounds")
    # Pages apart by commas, or by semicolons where a page's name holds a comma
    # ("api gpu/day, offset+count").
    for page in args.pages.split(";" if ";" in args.pages else ","):
        medians: dict[str, list[float]] = {"before": [], "after": []}
        for round_no in range(args.rounds):
            order = ("before", "after") if round_no % 2 == 0 else ("after", "before")
            for side in order:
                checkout = args.before if side == "before" else args.after
                medians[side].append(one_page(checkout.resolve(), urls[page], args.requests))
        before, after = statistics.median(medians["before"]), statistics.median(medians["after"])
        rounds = " ".join(
            f"{b:.0f}/{a:.0f}" for b, a in zip(medians["before"], medians["after"], strict=True)
        )
        print(f"{page:<26} {before:10.0f} {after:10.0f} {after / before:13.2f}  {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
