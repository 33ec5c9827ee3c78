"""A small fleet with hourly rollups made by hand, for the dashboard tests (no tests here).

Every GPU is in service from ``DAY0`` 00:00 UTC and has one rollup row per hour for
``DAYS`` days. Its utilisation is fixed per GPU, so page figures can be checked by hand.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.utils import timezone

DAYS = 3


def day0() -> dt.date:
    """The first day of the data: DAYS whole days that lie wholly in the past."""
    return timezone.now().astimezone(dt.UTC).date() - dt.timedelta(days=DAYS + 1)


def range_query(**extra: str) -> str:
    """The dashboard's query string covering exactly the data days."""
    first = day0()
    last = first + dt.timedelta(days=DAYS - 1)
    parts = [f"from={first.isoformat()}", f"to={last.isoformat()}"]
    parts += [f"{k}={v}" for k, v in extra.items()]
    return "&".join(parts)


def make_fleet(n_gpus: int, *, air_fraction: float | None = None) -> list[Any]:
    """Two sites, two teams, two pools (one owned, one rented); ``n_gpus`` GPUs over nodes
    of two, alternating between the pools. GPU i runs at ``air_fraction`` (default
    (i % 4 + 1) × 15 %) with the rest held for 2 h a day, parked otherwise."""
    from billing.models import CostProfile
    from fleet.models import FleetSettings, Gpu, GpuModel, Node, Pool, Site, Team
    from telemetry.models import HourlyUsage

    fs = FleetSettings.load()
    fs.currency, fs.report_time_zone, fs.target_utilization = "USD", "UTC", 0.6
    fs.save()
    fra, _ = Site.objects.get_or_create(
        name="fra1",
        defaults={"pue": Decimal("1.5"), "price_per_kwh": Decimal("0.20"), "grid_g_per_kwh": 400},
    )
    iad, _ = Site.objects.get_or_create(name="iad1", defaults={"pue": Decimal("1.2")})
    research, _ = Team.objects.get_or_create(name="research")
    product, _ = Team.objects.get_or_create(name="product")
    training, _ = Pool.objects.get_or_create(name="training", site=fra, team=research)
    inference, _ = Pool.objects.get_or_create(name="inference", site=iad, team=product)
    h100, _ = GpuModel.objects.get_or_create(
        key="H100-SXM",
        defaults={
            "name": "NVIDIA H100 SXM",
            "max_power_w": 700,
            "idle_power_w": 69,
            "memory_gib": 80,
        },
    )
    CostProfile.objects.get_or_create(
        scope_kind="pool",
        scope_name="training",
        defaults={
            "kind": "owned",
            "purchase_price": Decimal("30000"),
            "depreciation_years": Decimal("5"),
            "opex_per_hour": Decimal("0.10"),
        },
    )
    CostProfile.objects.get_or_create(
        scope_kind="pool",
        scope_name="inference",
        defaults={"kind": "rented", "rental_rate_per_hour": Decimal("2.35")},
    )
    start = dt.datetime.combine(day0(), dt.time(), tzinfo=dt.UTC)
    now = timezone.now()
    gpus = []
    rows = []
    base = Gpu.objects.count()
    for i in range(base, base + n_gpus):
        pool = training if i % 2 == 0 else inference
        node, _ = Node.objects.get_or_create(hostname=f"node-{i // 2:03d}", defaults={"pool": pool})
        gpu = Gpu.objects.create(
            uuid=f"GPU-test-{i:04d}",
            node=node,
            index=i % 2,
            name="NVIDIA H100 80GB HBM3",
            model=h100,
            in_service_at=start,
            first_seen_at=start,
            last_seen_at=now,
        )
        gpus.append(gpu)
        air = air_fraction if air_fraction is not None else (i % 4 + 1) * 0.15
        for h in range(DAYS * 24):
            hour = start + dt.timedelta(hours=h)
            held = 3600 * (1 - air) if hour.hour in (9, 10) else 0.0
            rows.append(
                HourlyUsage(
                    gpu=gpu,
                    hour=hour,
                    node=node,
                    pool=pool,
                    team=pool.team,
                    site=pool.site,
                    samples=60,
                    observed_s=3600,
                    air_s=3600 * air,
                    held_s=held,
                    parked_s=3600 * (1 - air) - held,
                    energy_j=3600 * (69 + 560 * air),
                    idle_energy_j=0.0 if air else 3600 * 69,
                    idle_s=0.0 if air else 3600,
                    power_w_mean=69 + 560 * air,
                    power_w_max=700,
                    temp_c_max=40 + 40 * air,
                    util_pct_mean=air * 100,
                    throttle_any_s=60.0 if h % 24 == 12 else 0.0,
                    throttle_thermal_s=60.0 if h % 24 == 12 else 0.0,
                    computed_at=now,
                )
            )
    HourlyUsage.objects.bulk_create(rows)
    return gpus
