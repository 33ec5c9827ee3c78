"""Every figure the billing selectors produce, dumped to JSON, to compare two versions of the
code on one database: a refactoring must leave each value identical (Decimal exact).

    DATABASE_URL=postgres://…/<db> python bench/figures_compare.py build [--gpus 1000] [--days 90]
    cd <checkout> && DATABASE_URL=… python <this file> late
    cd <checkout> && DATABASE_URL=… python <this file> dump --out before.json [--repeat 5]
        (--repeat 0: no timings)
    cd <checkout> && DATABASE_URL=… python <this file> time --out times.jsonl [--repeat 9]
    python bench/figures_compare.py compare before.json after.json [--cents]

``build`` migrates the database named by ``DATABASE_URL`` (a database of its own: it writes
the fleet there) and writes ``bench/dashboard.py``'s data set into it (``--gpus`` GPUs on
nodes of 8, six pools, three sites, four teams, ``--days`` of hourly rollups), then varies
it so every path of the selectors runs: the GPUs of one node end their depreciation inside
the window (split hour), those of another are retired mid-window, another node has no pool
(no cost profile, no site: not priced) and one GPU has no model.

``late`` closes the window's first two whole months with the checkout's code, then makes
late data for them (rewritten hours, GPUs moved to another node, a repriced profile): a
checkout that books late data when it is written must give the figures one that works it
out on each read gave (its booking run first: ``manage.py adjust_closed``).

``dump`` imports the project from the current directory (run it from the checkout whose code
is measured), so the same file measures two checkouts on the same data. It fixes ``now`` at
the data's last hour, and reads ``cost_rows_by`` for every group_by and period (and
``cost_rows`` of each grouping that is neither GPU nor node, alone), unfiltered
and with a site, a pool, a team, a model and a GPU filter; ``fleet_summary``,
``fleet_overview``, ``fleet_trend``, ``utilization_by_day``, ``utilization_listed`` and
``breakeven_compute`` for an owned and a rented pool: in the report zone UTC (daily table),
Europe/Berlin (hourly rows) and Asia/Kolkata (a fixed whole-hour offset), each set in that
process only (nothing is written: two checkouts can dump at once). PostgreSQL sums the
rollups' floats in one order on every run (no parallel workers, no synchronised scans), so a
difference is the code's, not the database's. Decimals are written as their exact text,
floats as ``repr``. Then (unless ``--repeat 0``) it times the
overview's selectors (``fleet_overview``) and the cost rows of every GPU and model
(``cost_rows_by``, period all) against a raw reference in the same run: one ``GROUP BY`` of the
daily table per GPU (the same sums, no cost model), and the cost rows per GPU and day (90 k
segments through the cost model). ``time`` takes the timings alone, one JSON line per run, so
that two checkouts can be timed in turn on a shared machine.

``compare`` lists every path whose value differs (exit 1), or says they are identical. With
``--cents`` money (every Decimal) need only be equal to the cent and floats to 1e-9 relative,
for a change that adds the same sums in another order (segments priced per price class):
it prints the largest relative difference it saw.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

ZONES = ("UTC", "Europe/Berlin", "Asia/Kolkata")


def _setup(project: Path) -> None:
    sys.path.insert(0, str(project))
    import django

    django.setup()


def build(args: argparse.Namespace) -> int:
    _setup(Path(__file__).resolve().parent.parent)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from bench.dashboard import build_fleet
    from fleet.models import Gpu, Node
    from telemetry.rollup import daily_usage_ensure

    t0 = time.perf_counter()
    start, end = build_fleet(args.gpus, args.days)
    # The variations (see the module docstring), on GPUs the data set already has.
    mid = start + (end - start) / 2
    nodes = list(Node.objects.order_by("id")[:3])
    Gpu.objects.filter(node=nodes[0]).update(
        in_service_at=mid - dt.timedelta(days=365 * 5, hours=7, minutes=20)
    )
    Gpu.objects.filter(node=nodes[1]).update(retired_at=mid + dt.timedelta(minutes=30))
    Node.objects.filter(pk=nodes[2].pk).update(pool=None)
    with connection.cursor() as cursor:  # its rollups as stored: no pool, team or site
        cursor.execute(
            "UPDATE telemetry_hourlyusage SET pool_id = NULL, team_id = NULL, site_id = NULL"
            " WHERE node_id = %s",
            [nodes[2].pk],
        )
        cursor.execute("ANALYZE telemetry_hourlyusage")
        cursor.execute("ANALYZE telemetry_dailyusage")
    Gpu.objects.filter(pk=Gpu.objects.order_by("-id").values("pk")[:1]).update(model=None)
    daily_usage_ensure()  # the daily table in the report zone (UTC), as the app keeps it
    print(f"built in {time.perf_counter() - t0:.0f} s: {args.gpus} GPUs × {args.days} days")
    return 0


def late(args: argparse.Namespace) -> int:
    """Close the window's first two whole months, then make late data for them: rewritten
    hours (more energy and air for 40 GPUs on one day of each), a node's GPUs moved to
    another node (their offline hours go elsewhere now) and an owned profile repriced.
    Runs the checkout's own code (the current directory), as ``dump`` does."""
    _setup(Path.cwd())
    from django.db.models import F

    from billing.models import CostProfile
    from billing.month_close import month_close
    from fleet.models import Gpu, Node
    from telemetry.models import HourlyUsage

    start, _, now = _window()
    first = (
        start if start.day == 1 else (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    )
    second = (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    for month in (first, second):
        print(month_close(month=month, by="bench", now=now).message)
    ids = list(Gpu.objects.order_by("id").values_list("id", flat=True)[40:80])
    for month in (first, second):
        day = dt.datetime.combine(month + dt.timedelta(days=9), dt.time(), tzinfo=dt.UTC)
        HourlyUsage.objects.filter(
            gpu_id__in=ids, hour__gte=day, hour__lt=day + dt.timedelta(days=1)
        ).update(energy_j=F("energy_j") * 1.5, air_s=F("observed_s"))
    nodes = list(Node.objects.exclude(pool=None).order_by("id")[3:5])
    for gpu in Gpu.objects.filter(node=nodes[0]):
        gpu.node = nodes[1]
        gpu.save()
    profile = CostProfile.objects.filter(kind="owned").order_by("id").first()
    assert profile is not None and profile.purchase_price is not None
    profile.purchase_price = profile.purchase_price * 11 / 10
    profile.save()
    print(f"late data for {first:%Y-%m} and {second:%Y-%m}")
    return 0


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Decimal):
        return f"D:{value}"
    if isinstance(value, float):
        return f"F:{value!r}"
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value


def _window() -> tuple[dt.date, dt.date, dt.datetime]:
    from django.db.models import Max, Min

    from telemetry.models import HourlyUsage

    span = HourlyUsage.objects.aggregate(first=Min("hour"), last=Max("hour"))
    now = span["last"] + dt.timedelta(hours=1)
    return span["first"].date(), now.date() + dt.timedelta(days=1), now


def _figures(start: dt.date, end: dt.date, now: dt.datetime, *, full: bool) -> dict[str, Any]:
    """``full``: every group_by with every filter and period; otherwise (another zone, the
    same code on other buckets) no rows per GPU per day or week but unfiltered (a JSON of
    100 MB each)."""
    from billing import selectors as s
    from fleet.models import Gpu

    gpu = Gpu.objects.order_by("id").values_list("uuid", flat=True)[5]
    filters = {
        "all": s.Filters(),
        "site": s.Filters(sites=("ams1",)),
        "pool": s.Filters(pools=("pool-2",)),
        "team": s.Filters(teams=("research",)),
        "model": s.Filters(models=("H100-SXM",)),
        "gpu": s.Filters(gpus=(gpu,)),
    }
    out: dict[str, Any] = {}
    span: dict[str, Any] = {"start": start, "end": end, "now": now}
    for label, f in filters.items():
        for period in s.PERIODS:
            groups: tuple[str, ...] = s.GROUP_BY
            if period in ("day", "week") and not (full and label == "all"):
                groups = tuple(g for g in groups if g != "gpu")
            out[f"cost_rows_by/{label}/{period}"] = s.cost_rows_by(
                group_bys=groups, period=period, filters=f, **span
            )
            # Each grouping alone, as the finance API reads it: rows per team, pool, site,
            # model and the fleet come from the computation by price class.
            for group_by in ("team", "pool", "site", "model", "fleet"):
                out[f"cost_rows/{label}/{period}/{group_by}"] = s.cost_rows(
                    group_by=group_by, period=period, filters=f, **span
                )
        out[f"fleet_summary/{label}"] = s.fleet_summary(filters=f, **span)
    out["fleet_overview"] = s.fleet_overview(**span)
    out["fleet_trend"] = s.fleet_trend(**span)
    out["utilization_by_day"] = s.utilization_by_day(**span)
    out["utilization_by_day/pool"] = s.utilization_by_day(filters=filters["pool"], **span)
    out["utilization_listed"] = s.utilization_listed(**span)
    for pool in ("pool-0", "pool-2"):
        out[f"breakeven/{pool}"] = s.breakeven_compute(
            pool=pool,
            tokens_per_s=2000,
            api_price_per_mtok=Decimal("0.60"),
            rental_rate_per_hour=Decimal("2.35"),
            **span,
        )
    return out


def _timed(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


RAW_PER_GPU = """
    SELECT gpu_id, sum(observed_s), sum(air_s), sum(held_s), sum(parked_s), sum(energy_j),
           sum(idle_energy_j)
    FROM telemetry_dailyusage WHERE day >= %s AND day < %s GROUP BY gpu_id
"""


def _timings(repeat: int, start: dt.date, end: dt.date, now: dt.datetime) -> dict[str, float]:
    """Median ms of the overview's selectors and of the cost rows, and of the raw reference,
    in the report zone UTC (the daily table)."""
    from django.db import connection

    from billing import selectors as s

    span: dict[str, Any] = {"start": start, "end": end, "now": now}

    def raw() -> None:
        with connection.cursor() as cursor:
            cursor.execute(RAW_PER_GPU, [start, end])
            cursor.fetchall()

    return {
        "raw GROUP BY per GPU": _timed(raw, repeat),
        "fleet_overview": _timed(lambda: s.fleet_overview(**span), repeat),
        "cost_rows_by gpu+model, all": _timed(
            lambda: s.cost_rows_by(group_bys=("gpu", "model"), **span), repeat
        ),
        "cost_rows gpu, day": _timed(
            lambda: s.cost_rows(group_by="gpu", period="day", **span), max(1, repeat // 3)
        ),
    }


def _print_timings(timings: dict[str, float]) -> None:
    reference = timings["raw GROUP BY per GPU"]
    for what, ms in timings.items():
        print(f"  {what:<30} p50 {ms:8.1f} ms  {ms / reference:6.2f}× raw")


def dump(args: argparse.Namespace) -> int:
    _setup(Path.cwd())
    from billing import selectors as s
    from fleet.models import FleetSettings

    print(f"code: {Path(s.__file__).resolve()}")
    from django.db import connection

    with connection.cursor() as cursor:
        # Sums of floats in one order on every run: no parallel workers (each sums a part),
        # no scan that starts where another process's scan of the table has got to.
        cursor.execute("SET max_parallel_workers_per_gather = 0")
        cursor.execute("SET synchronize_seqscans = off")
    start, end, now = _window()
    stored = FleetSettings.load()
    load = FleetSettings.__dict__["load"]
    out: dict[str, Any] = {}
    try:
        for name in ZONES:
            # The zone in this process only (nothing written): two checkouts can dump at once.
            shown = FleetSettings(
                **{f.attname: getattr(stored, f.attname) for f in stored._meta.fields}
            )
            shown.report_time_zone = name
            FleetSettings.load = classmethod(lambda cls, shown=shown: shown)  # type: ignore[method-assign, assignment]
            t0 = time.perf_counter()
            out[name] = _plain(_figures(start, end, now, full=name == "UTC"))
            print(f"  figures in {name}: {time.perf_counter() - t0:.1f} s")
    finally:
        FleetSettings.load = load  # type: ignore[method-assign]
    timings = _timings(args.repeat, start, end, now) if args.repeat else {}
    if timings:
        _print_timings(timings)
    Path(args.out).write_text(json.dumps({"figures": out, "timings_ms": timings}, indent=0))
    print(f"wrote {args.out}")
    return 0


def time_only(args: argparse.Namespace) -> int:
    """The timings of ``dump`` alone (report zone as set: UTC on the built data set), one
    JSON line appended to ``--out``: run it for two checkouts in turn, several times."""
    _setup(Path.cwd())
    from billing import selectors as s

    start, end, now = _window()
    timings = _timings(args.repeat, start, end, now)
    _print_timings(timings)
    with Path(args.out).open("a") as f:
        f.write(json.dumps({"code": str(Path(s.__file__).resolve()), **timings}) + "\n")
    return 0


# ``compare --cents``: floats equal to this relative difference (sums taken in another order).
FLOAT_RELATIVE = 1e-9


def _same(a: Any, b: Any, cents: bool, widest: list[float]) -> bool:
    """Whether two dumped values are the same: identical, or with ``cents`` money (every
    Decimal) equal to the cent and floats to ``FLOAT_RELATIVE``; ``widest`` keeps the largest
    relative difference seen."""
    if a == b:
        return True
    if not (cents and isinstance(a, str) and isinstance(b, str) and a[:2] == b[:2]):
        return False
    if a.startswith("D:"):
        x, y = Decimal(a[2:]), Decimal(b[2:])
        if x == y:  # 0 and -0, or 0E-28
            return True
        widest[0] = max(widest[0], float(abs(x - y) / max(abs(x), abs(y))))
        return x.quantize(Decimal("0.01")) == y.quantize(Decimal("0.01"))
    if a.startswith("F:"):
        f, g = float(a[2:]), float(b[2:])
        if f == g:
            return True
        relative = abs(f - g) / max(abs(f), abs(g))
        widest[0] = max(widest[0], relative)
        return relative <= FLOAT_RELATIVE
    return False


def _differences(
    a: Any,
    b: Any,
    path: str,
    found: list[str],
    cents: bool = False,
    widest: list[float] | None = None,
) -> None:
    widest = widest if widest is not None else [0.0]
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            if key not in a or key not in b:
                found.append(f"{path}/{key}: only in {'after' if key not in a else 'before'}")
            else:
                _differences(a[key], b[key], f"{path}/{key}", found, cents, widest)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _differences(x, y, f"{path}[{i}]", found, cents, widest)
    elif not _same(a, b, cents, widest):
        found.append(f"{path}: {a!r} → {b!r}")


def compare(args: argparse.Namespace) -> int:
    before = json.loads(Path(args.before).read_text())
    after = json.loads(Path(args.after).read_text())
    found: list[str] = []
    widest = [0.0]
    _differences(before["figures"], after["figures"], "", found, args.cents, widest)
    for line in found[:50]:
        print(line)
    values = json.dumps(before["figures"]).count('"D:') + json.dumps(before["figures"]).count('"F:')
    if found:
        print(f"{len(found)} differences")
    elif args.cents:
        print(
            f"equal: {values:,} Decimal and float values, money to the cent and floats to "
            f"{FLOAT_RELATIVE:g} relative (largest relative difference {widest[0]:.1e})"
        )
    else:
        print(f"identical: {values:,} Decimal and float values")
    for what, ms in before["timings_ms"].items():
        new = after["timings_ms"].get(what, float("nan"))
        print(f"  {what:<30} before {ms:8.1f} ms  after {new:8.1f} ms  after/before {new / ms:.2f}")
    return 1 if found else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build")
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--days", type=int, default=90)
    sub.add_parser("late")
    p = sub.add_parser("dump")
    p.add_argument("--out", required=True)
    p.add_argument("--repeat", type=int, default=5)
    p = sub.add_parser("time")
    p.add_argument("--out", required=True)
    p.add_argument("--repeat", type=int, default=9)
    p = sub.add_parser("compare")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument(
        "--cents",
        action="store_true",
        help="money equal to the cent, floats to 1e-9 relative (a change that sums in another "
        "order, e.g. per price class); default: every value identical",
    )
    args = parser.parse_args()
    commands = {"build": build, "late": late, "dump": dump, "time": time_only, "compare": compare}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
