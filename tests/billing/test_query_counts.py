"""Issue 19: the number of SQL queries of every dashboard page and of ``GET /api/v1/costs``
does not grow with the fleet. Each is counted on a fleet of 3 GPUs, then again once the same
database holds 30 (rollups written by the builder), with everything else the same.

The fleet mixes what makes the cost model branch per GPU: two sites, owned and rented pools,
two GPU models, a team set on the GPU, GPUs that enter service or retire inside the window,
and rows of the day in progress. On PostgreSQL both read paths are counted: the hourly rows
alone, and the daily pre-aggregate (``DailyUsage``, docs/benchmarks.md "Dashboard").
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.billing.conftest import FleetBuilder, at

pytestmark = pytest.mark.django_db

NOW = at("2026-03-10T12:30")
FIRST_DAY = dt.date(2026, 3, 3)
LAST_DAY = dt.date(2026, 3, 10)  # the day in progress, through 11:00
QUERY = f"from={FIRST_DAY.isoformat()}&to={LAST_DAY.isoformat()}"
PAGES = {
    "overview": f"/?{QUERY}",
    "fleet board": f"/fleet/?{QUERY}",
    "heatmap": f"/fleet/heatmap/?{QUERY}",
    "heatmap by utilisation": f"/fleet/heatmap/?{QUERY}&order=util",
    "teams & pools": f"/chargeback/?{QUERY}",
    "break-even": f"/breakeven/?{QUERY}",
    "GPU page": f"/gpus/GPU-count-0001/?{QUERY}",
    "alerts": "/alerts/",
    # A page computes the days its rows need, so a page that ends inside the range reads
    # fewer days (and may skip the day in progress): a limit both fleets' rows fit in keeps
    # the pages alike. The limit/offset page counts the rows without computing them.
    "GET /api/v1/costs by GPU and day": (
        f"/api/v1/costs?start={FIRST_DAY.isoformat()}&end=2026-03-11&group_by=gpu&period=day"
        "&limit=1000"
    ),
    "GET /api/v1/costs by GPU and day, limit/offset": (
        f"/api/v1/costs?start={FIRST_DAY.isoformat()}&end=2026-03-11&group_by=gpu&period=day"
        "&offset=0&limit=1000"
    ),
    "GET /api/v1/costs by team and month": (
        f"/api/v1/costs?start={FIRST_DAY.isoformat()}&end=2026-03-11&group_by=team&period=month"
    ),
}


class Fleet:
    """Inventory shared by both sizes; :meth:`grow` adds GPUs ``GPU-count-NNNN`` with one
    rollup row per hour from FIRST_DAY 00:00 to NOW's hour (exclusive)."""

    def __init__(self, fleet: FleetBuilder) -> None:
        self.b = fleet
        fleet.settings(currency="USD", report_time_zone="UTC", target_utilization=0.6)
        fra = fleet.site("fra1", pue="1.4", price_per_kwh="0.20")
        iad = fleet.site("iad1", pue="1.2", price_per_kwh="0.09")
        research, product = fleet.team("research"), fleet.team("product")
        self.data = fleet.team("data")
        self.pools = [
            fleet.pool("training", site=fra, team=research),
            fleet.pool("inference", site=iad, team=product),
        ]
        fleet.owned("pool:training")
        fleet.rented("pool:inference", rental_rate_per_hour="2.35")
        self.models = [fleet.model("H100-SXM"), fleet.model("A100-SXM", max_power_w=400)]
        self.count = 0
        self.node: Any = None

    def grow(self, n: int) -> None:
        start = dt.datetime.combine(FIRST_DAY, dt.time(), tzinfo=dt.UTC)
        hours = int((NOW.replace(minute=0) - start) / dt.timedelta(hours=1))
        rows = []
        for i in range(self.count, self.count + n):
            pool = self.pools[i % 2]
            if i % 4 == 0:  # nodes of 4 GPUs, each in one pool
                self.node = self.b.node(f"count-node-{i // 4:03d}", pool=pool)
            node = self.node
            pool = node.pool
            in_service = start + dt.timedelta(days=2) if i % 7 == 3 else start
            retired = start + dt.timedelta(days=5, hours=6) if i % 9 == 5 else None
            gpu = self.b.gpu(
                f"GPU-count-{i:04d}",
                node=node,
                index=i % 4,
                in_service_at=in_service,
                first_seen_at=in_service,
                retired_at=retired,
                last_seen_at=NOW if retired is None else retired,
                team=self.data if i % 5 == 2 else None,
                model=self.models[i % 3 == 1],
            )
            air = (i % 4 + 1) * 0.2
            for h in range(hours):
                hour = start + dt.timedelta(hours=h)
                if hour < in_service or (retired is not None and hour >= retired):
                    continue
                rows.append(
                    self.b.usage(
                        gpu,
                        hour,
                        samples=60,
                        observed_s=3600,
                        air_s=3600 * air,
                        held_s=600 if hour.hour in (9, 10) else 0,
                        parked_s=3600 * (1 - air) - (600 if hour.hour in (9, 10) else 0),
                        energy_j=3600 * (69 + 500 * air),
                        idle_energy_j=0,
                        power_w_mean=69 + 500 * air,
                        util_pct_mean=100 * air,
                    )
                )
        self.b.save(rows)
        self.count += n


def _alert_per_gpu(first: int, n: int) -> None:
    """One firing alert per GPU ``first`` … ``first + n - 1``, of one rule."""
    from alerts.models import Rule
    from tests.alerts.conftest import open_alert, rules_apply

    if not Rule.objects.filter(name="held").exists():
        rules_apply(
            {"name": "held", "rule": "gpu_held_hours", "scope": "pool:training", "threshold": 1}
        )
    rule = Rule.objects.get(name="held")
    for i in range(first, first + n):
        open_alert(rule, f"gpu:GPU-count-{i:04d}", subject_label=f"GPU-count-{i:04d}", now=NOW)


def _counts(client: Any, sql: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """(status, queries) per page (``sql``, when given, receives their text)."""
    counts = {}
    for name, url in PAGES.items():
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(url)
        counts[name] = (response.status_code, len(ctx.captured_queries))
        if sql is not None:
            sql += [q["sql"] for q in ctx.captured_queries]
    return counts


@pytest.mark.parametrize("daily", [False, True], ids=["hourly rows", "daily rows"])
def test_queries_per_page_are_the_same_for_3_and_30_gpus(
    fleet: FleetBuilder, make_user: Any, daily: bool
) -> None:
    from django.test import Client

    from telemetry.models import DailyUsageState
    from telemetry.rollup import daily_usage_rebuild

    if daily:
        if connection.vendor != "postgresql":
            pytest.skip("DailyUsage is kept on PostgreSQL only")
        daily_usage_rebuild(zone_name="UTC")  # the triggers keep it from here on
    else:
        DailyUsageState.objects.all().delete()  # no state: the selectors read hourly rows
    inventory = Fleet(fleet)
    # Finance sees every page with its money; a viewer the pages without money (and a 403
    # where a page is money only), each its own path through the views.
    clients = {role: Client() for role in ("finance", "viewer")}
    for role, client in clients.items():
        client.force_login(make_user(role))
    with time_machine.travel(NOW, tick=False):
        inventory.grow(3)
        _alert_per_gpu(0, 3)
        small = {}
        for role, client in clients.items():
            _counts(client)  # warm: the session, content types, first-use writes
            small[role] = _counts(client)
        inventory.grow(27)
        _alert_per_gpu(3, 27)
        sql: list[str] = []
        large = {role: _counts(client, sql) for role, client in clients.items()}
    assert large == small
    assert all(status == 200 and n > 0 for status, n in small["finance"].values())
    assert small["viewer"]["overview"][0] == 200 and small["viewer"]["break-even"][0] == 403
    # The path named is the path counted: whole days come from the daily rows, or not at all.
    assert any(re.search(r"\btelemetry_dailyusage\b", q) for q in sql) is daily
