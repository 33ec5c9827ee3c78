"""The Workloads page's figures (billing/workload_page.py) against the full path
(``workload_figures_by`` pricing every workload): the same worst workloads in the same order,
the same users and accounts, on a seeded fleet with everything the ranking must not get wrong —
two sites at different energy prices, owned and rented GPUs, a GPU without a cost profile, a
GPU whose depreciation ends inside the window (priced per hour, its bounds apart), team rules,
a user without a name, and workloads whose figures tie exactly."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from billing.workload_page import workload_page_figures
from billing.workloads import WorkloadFilters, WorkloadRow, workload_figures_by
from telemetry.models import Workload, WorkloadHourlyUsage
from tests.billing.conftest import FleetBuilder

START = dt.date(2026, 3, 1)
END = dt.date(2026, 3, 4)
LIMIT = 7


@pytest.fixture
def seeded(fleet: FleetBuilder) -> None:
    from billing.models import WorkloadTeamRule
    from telemetry.rollup import workload_daily_rebuild

    rng = random.Random(20)
    fleet.settings(currency="EUR", report_time_zone="UTC")
    cheap = fleet.site("cheap", pue="1.1", price_per_kwh="0.05")
    dear = fleet.site("dear", pue="1.6", price_per_kwh="0.40")
    research, infer = fleet.team("research"), fleet.team("inference")
    pools = [
        fleet.pool("train", site=cheap, team=research),
        fleet.pool("serve", site=dear, team=infer),
        fleet.pool("rent", site=dear, team=None),
        fleet.pool("bare", site=cheap, team=research),
    ]
    fleet.owned("pool:train", purchase_price="30000.00", opex_per_hour="0.10")
    fleet.owned("pool:serve", purchase_price="8766.00", depreciation_years="1")
    fleet.rented("pool:rent", rental_rate_per_hour="2.35")  # "bare" has no profile
    fleet.owned("gpu:GPU-01", purchase_price="50000.00")  # node n0's GPUs: two rates
    gpus, nodes = [], []
    for p, pool in enumerate(pools):
        node = fleet.node(f"n{p}", pool=pool)
        nodes.append(node)
        for i in range(3):
            # serve's first GPU: depreciation (1 year) ends on 2 March, inside the window.
            since = dt.datetime(2025, 3, 2, 12 if (p, i) == (1, 0) else 0, tzinfo=dt.UTC)
            gpus.append(fleet.gpu(f"GPU-{p}{i}", node=node, index=i, in_service_at=since))
    WorkloadTeamRule.objects.create(position=0, match_field="account", pattern="ml*", team=infer)
    users = ["ann", "bo", "", "cy"]
    jobs = [
        Workload.objects.create(
            site=cheap, kind=rng.choice(["slurm", "k8s", "user"]), key=f"j{n:02d}",
            user_name=users[n % 4], account=["mlops", "physics", ""][n % 3],
            created_at=timezone.now(),
        )
        for n in range(40)
    ]  # fmt: skip
    rows = []
    for n, job in enumerate(jobs):
        twin = n >= 30  # j30..j39: the same hours on the same GPU class, figures tied exactly
        on = [gpus[3]] if twin else rng.sample(gpus, rng.randint(1, 3))
        for gpu in on:
            for h in sorted(rng.sample(range(72), 4 if twin else rng.randint(1, 8))):
                hour = dt.datetime(2026, 3, 1, tzinfo=dt.UTC) + dt.timedelta(hours=h)
                if twin:
                    hour = dt.datetime(2026, 3, 1, 10 + n - 30, tzinfo=dt.UTC)
                gpu_s = 3600.0 if twin else rng.choice([900.0, 1800.0, 3600.0])
                air = 0.0 if twin else gpu_s * rng.choice([0, 0.25, 0.5, 1])
                node = gpu.node
                if gpu == gpus[6] and h % 2:  # GPU-20 (rented) sat in node n3 then
                    node = nodes[3]
                rows.append(
                    WorkloadHourlyUsage(
                        workload=job, gpu=gpu, hour=hour, node=node, pool=node.pool,
                        team=node.pool.team, site=node.pool.site, samples=60, gpu_s=gpu_s,
                        air_s=air, energy_j=gpu_s * rng.choice([100.0, 3000.0]),
                        computed_at=timezone.now(),
                    )
                )  # fmt: skip
    WorkloadHourlyUsage.objects.bulk_create(rows, ignore_conflicts=True)
    assert workload_daily_rebuild() == 3


def _owner_view(rows: list[WorkloadRow]) -> list[tuple[Any, ...]]:
    """What the page shows of a user or account (its workloads, not its GPUs), money to 1e-9
    (the full path adds up each workload's money, the page prices the user's sums once) and
    hours to 1e-9."""
    q = Decimal("1e-9")
    return [
        (r.key, r.workloads, r.priced, r.cost.quantize(q), r.idle_cost.quantize(q),
         round(r.gpu_hours, 9), round(r.air_hours, 9), round(r.energy_kwh, 9))
        for r in rows
    ]  # fmt: skip


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the ranking statement")
@pytest.mark.parametrize("worst", ["idle_cost", "held_hours"])
@pytest.mark.parametrize(
    "filters",
    [
        WorkloadFilters(),
        WorkloadFilters(teams=("inference",)),
        WorkloadFilters(teams=("research", "(none)")),
        WorkloadFilters(users=("ann", "")),
        WorkloadFilters(sites=("dear",)),
    ],
    ids=["all", "team-by-rule", "team-or-none", "users", "site"],
)
def test_the_page_ranks_as_pricing_every_workload(
    seeded: None, worst: str, filters: WorkloadFilters
) -> None:
    full = workload_figures_by(
        start=START,
        end=END,
        group_bys=("workload", "user", "account"),
        filters=filters,
        limits={"workload": LIMIT},
        worst=worst,
    )
    page = workload_page_figures(start=START, end=END, filters=filters, limit=LIMIT, worst=worst)
    assert len(full["workload"]) == min(LIMIT, page.total) > 0
    assert page.workloads == full["workload"]
    assert page.total == sum(u.workloads for u in full["user"])
    assert _owner_view(page.users) == _owner_view(full["user"])
    assert _owner_view(page.accounts) == _owner_view(full["account"])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the ranking statement")
def test_ties_at_the_limit_are_broken_as_the_full_path_breaks_them(seeded: None) -> None:
    """j30..j39 hold one unpriced GPU for an hour each: idle cost 0, one held hour. By held
    hours they tie exactly, and a limit inside the tie keeps the first by key."""
    only = WorkloadFilters(workloads=tuple(
        Workload.objects.filter(key__gte="j30").values_list("pk", flat=True)
    ))  # fmt: skip
    page = workload_page_figures(start=START, end=END, filters=only, limit=4, worst="held_hours")
    assert [r.key for r in page.workloads] == ["j30", "j31", "j32", "j33"]
    assert {r.held_hours for r in page.workloads} == {1.0} and page.total == 10


def test_sqlite_and_hourly_windows_take_the_full_path(seeded: None) -> None:
    """Where the statement cannot run (SQLite) or the daily rows cannot answer (the daily
    table out of use), the page is workload_figures_by's, unchanged."""
    from telemetry.models import WorkloadDailyState

    WorkloadDailyState.objects.all().delete()
    page = workload_page_figures(start=START, end=END, filters=WorkloadFilters(), limit=LIMIT)
    full = workload_figures_by(
        start=START, end=END, group_bys=("workload", "user", "account"), limits={"workload": LIMIT}
    )
    assert page.workloads == full["workload"] and page.users == full["user"]
    assert page.accounts == full["account"] and page.total == 40


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the ranking statement")
def test_held_energy_counts_in_the_ranking(fleet: FleetBuilder) -> None:
    """One owned GPU (0.784462697/h: 30,000 over 5 years + 0.10) at a site where a kWh drawn
    costs 2.00 (PUE 2 × 1.00). Job "long" held it an hour drawing nothing: idle 0.78. Job
    "hot" held it half an hour drawing 1 kWh: 0.39 + 2.00 = 2.39. The worst one is "hot"."""
    from telemetry.rollup import workload_daily_rebuild

    fleet.settings(currency="EUR", report_time_zone="UTC")
    site = fleet.site("dear", pue="2.0", price_per_kwh="1.00")
    node = fleet.node("n", pool=fleet.pool("p", site=site))
    gpu = fleet.gpu("GPU-X", node=node, in_service_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    fleet.owned("pool:p")
    for key, h, gpu_s, energy_j in (("long", 5, 3600.0, 0.0), ("hot", 6, 1800.0, 3_600_000.0)):
        job = Workload.objects.create(site=site, kind="user", key=key, created_at=timezone.now())
        WorkloadHourlyUsage.objects.create(
            workload=job, gpu=gpu, hour=dt.datetime(2026, 3, 1, h, tzinfo=dt.UTC), site=site,
            pool=node.pool, samples=60, gpu_s=gpu_s, air_s=0.0, energy_j=energy_j,
            computed_at=timezone.now(),
        )  # fmt: skip
    workload_daily_rebuild()
    page = workload_page_figures(start=START, end=END, filters=WorkloadFilters(), limit=1)
    assert [(r.key, r.idle_cost.quantize(Decimal("0.01"))) for r in page.workloads] == [
        ("hot", Decimal("2.39"))
    ]
    assert page.total == 2


@pytest.mark.parametrize(
    "filters", [WorkloadFilters(), WorkloadFilters(sites=("cheap",))], ids=["all", "site"]
)
def test_the_overview_panels_accounts_are_the_accounts_of_the_full_path(
    seeded: None, filters: WorkloadFilters
) -> None:
    """The overview's panel reads every account from the page's statement (PostgreSQL) or
    sums them per account (SQLite): the same hours and money as pricing every workload."""
    from billing.workload_page import workload_account_figures
    from billing.workloads import workload_figures

    got = workload_account_figures(start=START, end=END, filters=filters)
    full = workload_figures(start=START, end=END, group_by="account", filters=filters)
    q = Decimal("1e-9")
    assert [(r.key, r.cost.quantize(q), r.idle_cost.quantize(q), round(r.held_hours, 9))
            for r in got] == [
        (r.key, r.cost.quantize(q), r.idle_cost.quantize(q), round(r.held_hours, 9))
        for r in full
    ]  # fmt: skip
