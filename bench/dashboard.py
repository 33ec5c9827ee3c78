"""Benchmark: server time of each dashboard page on PostgreSQL, against the raw table.

    DATABASE_URL=postgres://… python bench/dashboard.py [--gpus 1000] [--days 90]
        [--repeat 10] [--raw-days 7] [--goal-ms 500] [--keep] [--reuse] [--build-only]
        [--close-months N]

Builds a throwaway test database (``test_<name>``, dropped at the end unless ``--keep``) with
``--gpus`` GPUs on nodes of 8 in six pools, three sites, four teams, and ``--days`` of hourly
rollups per GPU (1,000 × 90 days = 2.16 M rows), written by one ``INSERT … SELECT``. Then it
times every page through Django's full stack (middleware, view, selectors, template) as a
logged-in finance user: a warm-up, then ``--repeat`` requests, p50/p95 and the SQL query count.

The raw reference: ``--raw-days`` of one-minute raw samples for every GPU (1,000 × 7 days =
10 M rows), and the fleet's per-day figures (air, held, parked hours, energy) computed from
them with one GROUP BY, side by side with the overview page over the same days (which reads
the rollups). Goal (issue 6): p95 ≤ 500 ms per page at 1,000 GPUs × 90 days; issue 19: ≤ 1 s
at 10,000 GPUs × 90 days and at 1,000 GPUs × 365 days (``--goal-ms 1000``; ``--raw-days 0``
skips the raw reference, 100 M samples at 10,000 GPUs). The finance API is timed too: the
first JSON page of ``GET /api/v1/costs`` per GPU and day, and per team and month.

``--close-months N`` closes the last N months that have ended (``billing.month_close``, as
``manage.py close_month`` does) before timing, oldest first, where they are not closed yet:
the pages then read those months' frozen figures and find their late data (issue 19).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

GOAL_MS = 500.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--raw-days", type=int, default=7, help="days of raw samples for the reference; 0: none"
    )
    parser.add_argument(
        "--goal-ms", type=float, default=GOAL_MS, help="p95 goal per page (1000 at 10,000 GPUs)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the test database")
    parser.add_argument(
        "--only",
        default="",
        help="time only the pages whose name contains one of these (comma-separated: 'api,heat')",
    )
    parser.add_argument(
        "--build-only", action="store_true", help="build (or reuse) the data set, time nothing"
    )
    parser.add_argument(
        "--close-months",
        type=int,
        default=0,
        metavar="N",
        help="close the last N months that have ended before timing (docs/finance.md)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse a database kept by --keep (same --gpus/--days) instead of building it",
    )
    args = parser.parse_args()

    db_name = bench_database("bench", reuse=args.reuse)
    if db_name is None:
        print("bench/dashboard.py needs PostgreSQL: set DATABASE_URL", file=sys.stderr)
        return 2
    from django.db import connection

    print(f"database {db_name}: {args.gpus} GPUs × {args.days} days of hourly rollups")
    try:
        return run(args)
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(db_name, verbosity=0)


def bench_database(prefix: str, *, reuse: bool) -> str | None:
    """Django set up to serve pages in-process, on a database of its own
    (``<prefix>_<name>``, apart from the test suite's ``test_<name>``); ``None`` without
    PostgreSQL."""
    import django

    django.setup()
    logging.disable(logging.INFO)  # no access log line per timed request
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    if not settings.IS_POSTGRES:
        return None
    setup_test_environment()
    settings.ALLOWED_HOSTS = ["*"]
    finder = "billing.staticfiles.PlotlyJsFinder"
    settings.STATICFILES_FINDERS = [
        "django.contrib.staticfiles.finders.FileSystemFinder",
        "django.contrib.staticfiles.finders.AppDirectoriesFinder",
        finder,
    ]
    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = f"{prefix}_{db['NAME']}"
    # serialize=False: no in-memory copy of the contents (2 M rows on --reuse), which only
    # TransactionTestCase needs.
    name: str = connection.creation.create_test_db(
        verbosity=0, autoclobber=True, keepdb=reuse, serialize=False
    )
    return name


def build_fleet(gpus: int, days: int) -> tuple[dt.datetime, dt.datetime]:
    from decimal import Decimal

    from django.db import connection
    from django.utils import timezone

    from billing.models import CostProfile
    from fleet.models import FleetSettings, Gpu, GpuModel, Node, Pool, Site, Team

    fs = FleetSettings.load()
    fs.currency, fs.report_time_zone = "USD", "UTC"
    fs.save()
    now = timezone.now()
    end = now.replace(minute=0, second=0, microsecond=0)
    start = end - dt.timedelta(days=days)
    sites = [
        Site.objects.create(name=n, pue=Decimal(p), price_per_kwh=Decimal(c), grid_g_per_kwh=g)
        for n, p, c, g in (
            ("fra1", "1.35", "0.21", 380),
            ("ams1", "1.25", "0.17", 330),
            ("iad1", "1.2", "0.09", 390),
        )
    ]
    teams = [Team.objects.create(name=n) for n in ("research", "product", "data", "platform")]
    pools = [
        Pool.objects.create(name=f"pool-{i}", site=sites[i % 3], team=teams[i % 4])
        for i in range(6)
    ]
    for i, pool in enumerate(pools):
        if i % 3 == 2:
            CostProfile.objects.create(
                scope_kind="pool",
                scope_name=pool.name,
                kind="rented",
                rental_rate_per_hour=Decimal("2.49"),
            )
        else:
            CostProfile.objects.create(
                scope_kind="pool",
                scope_name=pool.name,
                kind="owned",
                purchase_price=Decimal("30000"),
                depreciation_years=Decimal("5"),
                opex_per_hour=Decimal("0.12"),
            )
    model, _ = GpuModel.objects.get_or_create(
        key="H100-SXM",
        defaults={
            "name": "NVIDIA H100 SXM",
            "max_power_w": 700,
            "idle_power_w": 69,
            "memory_gib": 80,
        },
    )
    nodes = Node.objects.bulk_create(
        Node(hostname=f"gpu-{i:04d}", pool=pools[i % 6]) for i in range((gpus + 7) // 8)
    )
    Gpu.objects.bulk_create(
        Gpu(
            uuid=f"GPU-bench-{i:05d}",
            node=nodes[i // 8],
            index=i % 8,
            model=model,
            name="NVIDIA H100 80GB HBM3",
            in_service_at=start,
            first_seen_at=start,
            last_seen_at=now,
        )
        for i in range(gpus)
    )
    # Every GPU × every hour, utilisation varying by GPU and hour of day. The usage sums not
    # written out here (the profiling ones) are 0, whatever USAGE_SUMS holds.
    from tqdm import tqdm

    from telemetry.models import USAGE_SUM_COLUMNS

    written = (
        "samples observed_s air_s held_s parked_s energy_j idle_energy_j idle_s"
        " throttle_power_cap_s throttle_thermal_s throttle_hw_slowdown_s throttle_other_s"
        " throttle_any_s sm_active_s sm_observed_s"
    ).split()
    zeros = [c for c in USAGE_SUM_COLUMNS if c not in written]
    # Written a day at a time, hour after hour for the whole fleet, as the rollup writes them
    # in production: each day's (and month's) rows then lie together in the table, as they
    # do there (one statement for every GPU's whole history wrote them GPU after GPU, and a
    # read of a few days visited every page of the daily table).
    t0 = time.perf_counter()
    rows = 0
    chunks = [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]
    with connection.cursor() as cursor, tqdm(total=len(chunks), unit="day", desc="rollups") as bar:
        for day in chunks:
            cursor.execute(
                f"""
            INSERT INTO telemetry_hourlyusage (
                gpu_id, hour, node_id, pool_id, team_id, site_id, samples, observed_s, air_s,
                held_s, parked_s, energy_j, idle_energy_j, idle_s, power_w_mean, power_w_max,
                temp_c_max, util_pct_mean, mem_util_pct_mean, throttle_power_cap_s,
                throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s, throttle_any_s,
                sm_active_s, sm_observed_s, {"".join(c + ", " for c in zeros)}computed_at)
            SELECT g.id, h, n.id, p.id, p.team_id, p.site_id, 60, 3600, 3600 * u.u,
                   3600 * (1 - u.u) * 0.5, 3600 * (1 - u.u) * 0.5,
                   3600 * (69 + 560 * u.u), CASE WHEN u.u < 0.05 THEN 3600 * 69 ELSE 0 END,
                   CASE WHEN u.u < 0.05 THEN 3600 ELSE 0 END, 69 + 560 * u.u, 700,
                   40 + 40 * u.u, 100 * u.u, 50 * u.u, 0, 0, 0, 0, 0, 0, 0,
                   {"0, " * len(zeros)}now()
            FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id
            JOIN fleet_pool p ON p.id = n.pool_id
            CROSS JOIN generate_series(greatest(%s::timestamptz, %s::timestamptz),
                                       least(%s::timestamptz, %s::timestamptz)
                                       - interval '1 hour', interval '1 hour') AS h
            CROSS JOIN LATERAL (SELECT greatest(0, least(1,
                0.45 + 0.35 * sin(g.id + extract(hour from h) / 3.82)
                + 0.1 * sin(g.id * 7 + extract(epoch from h) / 86400))) AS u) u
            ORDER BY h, g.id
            """,
                [start, day, end, day + dt.timedelta(days=1)],
            )
            rows += cursor.rowcount
            bar.update()
        # What autovacuum does after such an insert, for the three tables (the daily and
        # monthly rows are written by the hourly table's triggers): statistics (without them
        # the planner takes the 91 k daily rows for a few hundred) and the visibility map
        # (without it every index-only read visits the heap).
        for table in ("telemetry_hourlyusage", "telemetry_dailyusage", "telemetry_monthlyusage"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    print(f"  {rows:,} rollup rows in {time.perf_counter() - t0:.1f} s")
    return start, end


def close_months(count: int, end: dt.datetime) -> None:
    """Close the last ``count`` months that have ended by ``end`` (oldest first)."""
    from billing.month_close import month_close

    last = end.date().replace(day=1)  # the month in progress: not closed
    months: list[dt.date] = []
    for _ in range(count):
        last = (last - dt.timedelta(days=1)).replace(day=1)
        months.insert(0, last)
    for month in months:
        started = time.perf_counter()
        result = month_close(month=month, by="bench", now=end)
        took = time.perf_counter() - started
        print(f"  {result.message} ({took:.1f} s)")
    if months:
        from django.db import connection

        # What autovacuum does after the closes' inserts (as for the rollups above): without
        # statistics the planner takes a closed month's rows for one and joins them in loops.
        with connection.cursor() as cursor:
            for table in ("billing_closedsegment", "billing_closedclassday"):
                cursor.execute(f"VACUUM ANALYZE {table}")


def reuse_fleet() -> tuple[dt.datetime | None, dt.datetime | None]:
    """The hours of a database kept by an earlier ``--keep`` run, or ``None`` to build one."""
    from django.db.models import Max, Min

    from telemetry.models import HourlyUsage

    span = HourlyUsage.objects.aggregate(first=Min("hour"), last=Max("hour"))
    if span["first"] is None:
        return None, None
    print(f"  reusing the kept database: {HourlyUsage.objects.count():,} rollup rows")
    return span["first"], span["last"] + dt.timedelta(hours=1)


def build_raw(raw_days: int, end: dt.datetime) -> tuple[dt.datetime, int]:
    from django.db import connection

    from telemetry.models import Sample
    from telemetry.partitions import partitions_maintain

    start = end - dt.timedelta(days=raw_days)
    if Sample.objects.filter(start__gte=start).exists():
        return start, Sample.objects.filter(start__gte=start).count()
    partitions_maintain()
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO telemetry_sample (gpu_id, start, seconds, util_pct, procs, power_w,
                                          energy_j, received_at)
            SELECT g.id, m, 60, u.u * 100, CASE WHEN u.u > 0.3 THEN 1 ELSE 0 END,
                   69 + 560 * u.u, 60 * (69 + 560 * u.u), now()
            FROM fleet_gpu g
            CROSS JOIN generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute',
                                       interval '1 minute') AS m
            CROSS JOIN LATERAL (SELECT greatest(0, least(1,
                0.45 + 0.35 * sin(g.id + extract(hour from m) / 3.82))) AS u) u
            """,
            [start, end],
        )
        rows = cursor.rowcount
        cursor.execute("ANALYZE telemetry_sample")
    print(f"  {rows:,} raw samples ({raw_days} days × 1 min) in {time.perf_counter() - t0:.1f} s")
    return start, rows


RAW_FLEET_DAILY = """
    -- The overview's daily fleet figures straight from raw samples (docs/metrics.md sums).
    SELECT date_trunc('day', start AT TIME ZONE 'UTC') AS day,
           sum(util_pct / 100 * seconds) / 3600 AS air_h,
           sum(CASE WHEN procs > 0 THEN (1 - util_pct / 100) * seconds ELSE 0 END) / 3600
               AS held_h,
           sum(CASE WHEN procs > 0 THEN 0 ELSE (1 - util_pct / 100) * seconds END) / 3600
               AS parked_h,
           sum(coalesce(energy_j, power_w * seconds, 0)) / 3.6e6 AS kwh,
           sum(seconds) / 3600 AS observed_h
    FROM telemetry_sample WHERE start >= %s AND start < %s
    GROUP BY 1 ORDER BY 1
"""


def timed(fn: Callable[[], None], repeat: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]


def page_urls(start: dt.datetime, end: dt.datetime) -> dict[str, str]:
    """Each timed page's URL over the data set's window [start, end) (its first and last
    hour): the dashboard pages and the finance API's calls."""
    from billing.api.views import cursor_token
    from fleet.models import Gpu

    first = start.date()
    last = (end - dt.timedelta(hours=1)).date()
    rng = f"from={first}&to={last}"
    api_rng = f"start={first}&end={last + dt.timedelta(days=1)}"
    gpu_uuid = Gpu.objects.order_by("id").values_list("uuid", flat=True).first()
    return {
        "overview": f"/?{rng}",
        "fleet board": f"/fleet/?{rng}",
        "heatmap": f"/fleet/heatmap/?{rng}",
        "heatmap by utilisation": f"/fleet/heatmap/?{rng}&order=util",
        "teams & pools": f"/chargeback/?{rng}",
        "break-even": f"/breakeven/?{rng}&pool=pool-0&tokens_per_s=2000&price_mode=blended"
        "&api_price_per_mtok=0.60&rental_rate_per_hour=2.35",
        "gpu detail": f"/gpus/{gpu_uuid}/?{rng}",
        # The finance API's first JSON page (limit 100) over the whole window; the end date
        # is exclusive there. Cursor pages (the default); one from the middle of the window
        # (what following `next` costs); and limit/offset pages, which count every row (per
        # bucket, without computing them) and compute the page's buckets.
        "api gpu/day": f"/api/v1/costs?{api_rng}&group_by=gpu&period=day",
        "api gpu/day, mid cursor": f"/api/v1/costs?{api_rng}&group_by=gpu&period=day"
        f"&cursor={cursor_token((first + (last - first) / 2, '', ''))}",
        "api gpu/day, offset+count": f"/api/v1/costs?{api_rng}&group_by=gpu&period=day&offset=0",
        # By week, the weeks across a closed month's edge (with --close-months) are counted
        # in pieces; a page from the middle of the rows.
        "api gpu/week, offset+count": f"/api/v1/costs?{api_rng}&group_by=gpu&period=week"
        f"&offset={Gpu.objects.count() * 6}",
        "api team/month": f"/api/v1/costs?{api_rng}&group_by=team&period=month",
    }


def run(args: argparse.Namespace) -> int:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from fleet.roles import role_assign

    start, end = reuse_fleet() if args.reuse else (None, None)
    if start is None or end is None:
        start, end = build_fleet(args.gpus, args.days)
    if args.close_months:
        close_months(args.close_months, end)
    if args.build_only:
        return 0
    user, _ = get_user_model().objects.get_or_create(username="bench-finance")
    role_assign(user=user, role="finance")
    client = Client()
    client.force_login(user)
    pages = page_urls(start, end)
    print(f"\npages over {args.days} days, {args.gpus} GPUs, {args.repeat} requests each:")
    print(
        f"  {'page':<14} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8}  goal p95 ≤ {args.goal_ms:.0f}"
    )
    worst = 0.0
    for name, url in pages.items():
        if not any(part in name for part in args.only.split(",")):
            continue

        def get(url: str = url) -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        times = timed(get, args.repeat)
        with CaptureQueriesContext(connection) as ctx:
            get()
        worst = max(worst, p95(times))
        flag = "ok" if p95(times) <= args.goal_ms else "OVER"
        print(
            f"  {name:<14} {statistics.median(times):8.0f} {p95(times):8.0f} "
            f"{len(ctx.captured_queries):8d}  {flag}"
        )

    if args.raw_days <= 0:
        verdict = "met" if worst <= args.goal_ms else "NOT met"
        print(f"\nworst p95 {worst:.0f} ms (goal ≤ {args.goal_ms:.0f} ms): {verdict}")
        return 0
    raw_start, _ = build_raw(args.raw_days, end)

    def raw() -> None:
        with connection.cursor() as cursor:
            cursor.execute(RAW_FLEET_DAILY, [raw_start, end])
            cursor.fetchall()

    raw_range = f"from={raw_start.date()}&to={(end - dt.timedelta(hours=1)).date()}"

    def page() -> None:
        assert client.get(f"/?{raw_range}").status_code == 200

    raw_times = timed(raw, max(3, args.repeat // 3))
    page_times = timed(page, args.repeat)
    ratio = statistics.median(raw_times) / statistics.median(page_times)
    print(f"\nsame {args.raw_days} days of fleet figures, {args.gpus} GPUs:")
    print(f"  raw table, one GROUP BY:        p50 {statistics.median(raw_times):8.0f} ms")
    print(
        f"  overview page from the rollups: p50 {statistics.median(page_times):8.0f} ms "
        "(the whole page: all cards, every chart, template)"
    )
    print(f"  ratio raw / page: {ratio:.1f}×")
    print(
        f"\nworst page p95 {worst:.0f} ms (goal ≤ {args.goal_ms:.0f} ms): "
        f"{'met' if worst <= args.goal_ms else 'NOT met'}; raw/page ratio {ratio:.1f}×"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
