"""Builders for billing tests: inventory, cost profiles and hourly rollups written directly.

The selectors read only ``HourlyUsage``; writing its rows by hand lets a test state exactly the
sums docs/metrics.md works from, independently of the rollup code.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    """``at("2026-03-02T05")`` → that UTC hour (minutes optional)."""
    if len(text) == 13:
        text += ":00"
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


class FleetBuilder:
    """Creates inventory and rollup rows with short calls; every default is stated here."""

    def __init__(self) -> None:
        from django.utils import timezone

        self._computed_at = timezone.now()

    def settings(self, **values: Any) -> Any:
        from fleet.models import FleetSettings

        obj, _ = FleetSettings.objects.update_or_create(pk=1, defaults=values)
        return obj

    def site(
        self,
        name: str = "fra1",
        *,
        pue: str = "1.5",
        price_per_kwh: str = "0.20",
        grid_g_per_kwh: float = 400.0,
    ) -> Any:
        from fleet.models import Site

        return Site.objects.create(
            name=name,
            pue=Decimal(pue),
            price_per_kwh=Decimal(price_per_kwh),
            grid_g_per_kwh=grid_g_per_kwh,
        )

    def team(self, name: str) -> Any:
        from fleet.models import Team

        return Team.objects.create(name=name)

    def pool(self, name: str, *, site: Any = None, team: Any = None) -> Any:
        from fleet.models import Pool

        return Pool.objects.create(name=name, site=site, team=team)

    def node(self, hostname: str, *, pool: Any = None, site: Any = None) -> Any:
        from fleet.models import Node

        return Node.objects.create(hostname=hostname, pool=pool, site=site)

    def model(
        self, key: str = "H100-SXM", *, max_power_w: float = 700, idle_power_w: float = 69
    ) -> Any:
        from fleet.models import GpuModel

        obj, _ = GpuModel.objects.get_or_create(
            key=key,
            defaults={
                "name": f"NVIDIA {key}",
                "max_power_w": max_power_w,
                "idle_power_w": idle_power_w,
            },
        )
        return obj

    def gpu(
        self,
        uuid: str,
        *,
        node: Any,
        index: int = 0,
        in_service_at: dt.datetime | None = None,
        first_seen_at: dt.datetime | None = None,
        retired_at: dt.datetime | None = None,
        team: Any = None,
        model: Any = None,
        last_seen_at: dt.datetime | None = None,
    ) -> Any:
        from fleet.models import Gpu

        return Gpu.objects.create(
            uuid=uuid,
            node=node,
            index=index,
            in_service_at=in_service_at,
            first_seen_at=first_seen_at,
            retired_at=retired_at,
            team=team,
            model=model,
            last_seen_at=last_seen_at,
        )

    def owned(
        self,
        scope: str,
        *,
        purchase_price: str = "30000.00",
        depreciation_years: str = "5",
        opex_per_hour: str = "0.10",
    ) -> Any:
        from billing.models import CostProfile

        kind, _, name = scope.partition(":")
        return CostProfile.objects.create(
            scope_kind=kind,
            scope_name=name,
            kind="owned",
            purchase_price=Decimal(purchase_price),
            depreciation_years=Decimal(depreciation_years),
            opex_per_hour=Decimal(opex_per_hour),
        )

    def rented(self, scope: str, *, rental_rate_per_hour: str) -> Any:
        from billing.models import CostProfile

        kind, _, name = scope.partition(":")
        return CostProfile.objects.create(
            scope_kind=kind,
            scope_name=name,
            kind="rented",
            rental_rate_per_hour=Decimal(rental_rate_per_hour),
        )

    def usage(self, gpu: Any, hour: dt.datetime, **values: Any) -> Any:
        """An unsaved rollup row; attribution defaults to the GPU's current one."""
        from telemetry.models import HourlyUsage

        node = values.pop("node", gpu.node)
        pool = values.pop("pool", node.pool if node is not None else None)
        site = values.pop("site", (node.site or (pool.site if pool else None)) if node else None)
        team = values.pop("team", gpu.team or (pool.team if pool else None))
        return HourlyUsage(
            gpu=gpu,
            hour=hour,
            node=node,
            pool=pool,
            team=team,
            site=site,
            computed_at=self._computed_at,
            **values,
        )

    def save(self, rows: list[Any]) -> None:
        from telemetry.models import HourlyUsage

        HourlyUsage.objects.bulk_create(rows)


@contextlib.contextmanager
def migrated_back(app: str, migration: str) -> Iterator[Any]:
    """The models as of ``app``'s ``migration`` (its historical apps), with the database
    migrated back to it; forward to the latest again when the block ends, also on failure.
    For a ``transaction=True`` test of a data migration."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [(app, migration)]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        yield executor.loader.project_state(before).apps
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.fixture
def fleet(db: Any) -> FleetBuilder:
    return FleetBuilder()


# --- the worked example of docs/metrics.md ------------------------------------------------------
EXAMPLE_DAY = dt.date(2026, 3, 2)
EXAMPLE_NOW = at("2026-03-10T12")
NEXT_DAY = EXAMPLE_DAY + dt.timedelta(days=1)


def day_query(**extra: str) -> dict[str, str]:
    """The worked example's day as an API query."""
    return {"start": EXAMPLE_DAY.isoformat(), "end": NEXT_DAY.isoformat(), **extra}


@pytest.fixture
def frozen() -> Any:
    """The clock stopped at the worked example's ``now``."""
    import time_machine

    with time_machine.travel(EXAMPLE_NOW, tick=False):
        yield


@pytest.fixture
def finance(role_client: Any, frozen: Any) -> Any:
    """A finance user's client, at the worked example's ``now``."""
    return role_client("finance")


@pytest.fixture
def worked_example(fleet: FleetBuilder) -> Any:
    """One owned GPU (30,000.00 over 5 years, opex 0.10/h) at a site with PUE 1.5, 0.20/kWh and
    400 g/kWh, in service from 2026-03-02 00:00 UTC, and the rollups of its first day.

    The 1,200 samples of 60 s, spread over 20 hours of 60 samples (3,600 s observed each):
      hours 00–09: 60 samples at 90 %, 400 W, procs 1 → air 60×54 = 3,240 s, held 60×6 = 360 s,
                   energy 3,600 s × 400 W = 1,440,000 J; none below 5 % → idle 0 J, 0 s.
      hours 10–14: 60 samples at 0 %, 120 W, procs 1 → held 3,600 s, energy = idle energy
                   = 3,600 × 120 = 432,000 J, idle_s 3,600.
      hours 15–19: 60 samples at 0 %, 70 W, procs 0 → parked 3,600 s, energy = idle energy
                   = 3,600 × 70 = 252,000 J, idle_s 3,600.
      hours 20–23: no samples (offline).
    Sums: air 10 × 3,240 = 32,400 s = 9 h; held 10 × 360 + 5 × 3,600 = 21,600 s = 6 h;
    parked 18,000 s = 5 h; observed 72,000 s = 20 h; energy 14,400,000 + 2,160,000 + 1,260,000
    = 17,820,000 J = 4.95 kWh; idle energy 3,420,000 J = 0.95 kWh over 36,000 s.
    """
    site = fleet.site("fra1", pue="1.5", price_per_kwh="0.20", grid_g_per_kwh=400.0)
    team = fleet.team("research")
    pool = fleet.pool("inference", site=site, team=team)
    node = fleet.node("gpu-07", pool=pool)
    gpu = fleet.gpu("GPU-example", node=node, index=0, in_service_at=at("2026-03-02T00"))
    fleet.owned(
        "pool:inference", purchase_price="30000.00", depreciation_years="5", opex_per_hour="0.10"
    )
    rows = []
    for h in range(10):
        rows.append(
            fleet.usage(
                gpu,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                air_s=3240,
                held_s=360,
                energy_j=1_440_000,
            )
        )
    for h in range(10, 15):
        rows.append(
            fleet.usage(
                gpu,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                held_s=3600,
                energy_j=432_000,
                idle_energy_j=432_000,
                idle_s=3600,
            )
        )
    for h in range(15, 20):
        rows.append(
            fleet.usage(
                gpu,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                parked_s=3600,
                energy_j=252_000,
                idle_energy_j=252_000,
                idle_s=3600,
            )
        )
    fleet.save(rows)
    return gpu


@pytest.fixture
def profiled_example(worked_example: Any) -> Any:
    """The worked example's GPU with profiling data (NVML GPM or dcgm-exporter) in each of its
    20 observed hours, 3,600 s profiled per hour (docs/metrics.md, "Work"):
      hours 00–09 (90 % util): SM active 0.30, tensor active 0.15 → 1,080 work s and 540
                   tensor s per hour, 3,240 air s of samples with sm_active;
      hours 10–19 (0 % util): SM and tensor active 0.
    Sums: work 10,800 s = 3.0 h; tensor 5,400 s = 1.5 h; profiled 72,000 s = 20 h; air of the
    profiled samples 9.0 h; 20 GPU-hours with data, their energy all of the day's 4.95 kWh.
    """
    from django.db.models import F

    from telemetry.models import HourlyUsage

    rows = HourlyUsage.objects.filter(gpu=worked_example)
    rows.update(
        sm_observed_s=3600,
        tensor_observed_s=3600,
        sm_hours=1,
        sm_hours_energy_j=F("energy_j"),
    )
    rows.filter(hour__lt=at("2026-03-02T10")).update(
        sm_active_s=1080, sm_air_s=F("air_s"), tensor_active_s=540
    )
    return worked_example


# --- the workload example of docs/metrics.md ---------------------------------------------------
@pytest.fixture
def workload_hour() -> dt.datetime:
    """02:00 UTC two days ago: in the past, inside raw retention, the same local day in UTC."""
    from django.utils import timezone

    today = timezone.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - dt.timedelta(days=2) + dt.timedelta(hours=2)


def workload_span(hour: dt.datetime) -> dict[str, dt.date]:
    return {"start": hour.date(), "end": hour.date() + dt.timedelta(days=1)}


@pytest.fixture
def workload_example(fleet: FleetBuilder, workload_hour: dt.datetime) -> dict[str, Any]:
    """docs/metrics.md's workload example (worked by hand in tests/billing/test_workloads.py):
    GPU A shared by jobs 101 and 102 at 80 %, GPU B held idle by job 103, for one hour, from
    raw samples through the rollup."""
    from django.utils import timezone

    from telemetry.models import Workload
    from telemetry.rollup import rollup_run
    from tests.telemetry.conftest import sample, samples_ingest

    hour = workload_hour
    fleet.settings(currency="EUR", report_time_zone="UTC")
    site = fleet.site("fra1", pue="1.5", price_per_kwh="0.20")
    research = fleet.team("research")
    pool = fleet.pool("training", site=site, team=research)
    node = fleet.node("gpu-01", pool=pool)
    in_service = hour - dt.timedelta(days=30)
    a = fleet.gpu("GPU-A", node=node, index=0, in_service_at=in_service)
    b = fleet.gpu("GPU-B", node=node, index=1, in_service_at=in_service)
    fleet.owned("pool:training", purchase_price="30000.00", opex_per_hour="0.10")
    jobs = {}
    for key, user, account in (("101", "alice", "nlp"), ("102", "bob", "vision"),
                               ("103", "carol", "nlp")):  # fmt: skip
        jobs[key] = Workload.objects.create(
            site=site, kind="slurm", key=key, user_name=user, account=account,
            name=f"job-{key}", created_at=timezone.now(),
        )  # fmt: skip
    minutes = [hour + dt.timedelta(minutes=m) for m in range(60)]
    rows = [
        sample(a, t, util=80.0, energy_j=24_000.0, procs=2,
               workload_ids=[jobs["101"].pk, jobs["102"].pk],
               workload_share_s=[30.0, 30.0], workload_air_s=[24.0, 24.0])
        for t in minutes
    ] + [
        sample(b, t, util=0.0, energy_j=4_200.0, procs=0, workload_ids=[jobs["103"].pk],
               workload_share_s=[60.0], workload_air_s=[0.0])
        for t in minutes
    ]  # fmt: skip
    samples_ingest(rows)
    rollup_run()
    return {"jobs": jobs, "a": a, "b": b, "research": research, "site": site}


@pytest.fixture(autouse=True)
def _report_chart_cache(monkeypatch: Any) -> Any:
    """Each test starts with no rendered report chart: report_chart caches PNGs under their
    figure's hash, and the shared Redis outlives a test (and a run)."""
    import uuid

    from django.core.cache.backends.locmem import LocMemCache

    from billing import report_chart

    fresh = LocMemCache(f"report-chart-{uuid.uuid4().hex}", {})
    monkeypatch.setattr(report_chart, "cache", fresh)
    return fresh
