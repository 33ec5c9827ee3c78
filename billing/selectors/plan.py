"""The Plan's demand (DESIGN.md §9.3; issue 42): GPU hours a day that the fleet's work wanted.

**Daily demand** of a pool = its air + held GPU hours (a GPU computing, or held by a job that
would not give it back) + the capacity-waited GPU hours of the Slurm partitions the fleet file
maps to it (jobs pending for GPUs: the demand that usage alone hides, since usage is capped by
capacity). A partition on several pools gives each an equal part of its wait. Days are the
report time zone's; an hour counts on the day it starts in. The fleet's demand is the sum over
its pools (GPUs in no pool and partitions on no pool included).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.db.models import F, Sum

from telemetry.models import HourlyUsage
from telemetry.queue_figures import capacity_waited_gpus_by_partition_hour, partition_pools

__all__ = ["FLEET", "daily_demand"]

FLEET = ""  # the key of the fleet's series (pool names are never empty)


def daily_demand(
    *, start: dt.date, end: dt.date, zone: dt.tzinfo
) -> dict[str, dict[dt.date, float]]:
    """Demand in GPU hours per pool name (and :data:`FLEET`) per day of ``[start, end)``;
    days without demand are absent."""
    from fleet.models import Pool

    lo = dt.datetime.combine(start, dt.time(), tzinfo=zone)
    hi = dt.datetime.combine(end, dt.time(), tzinfo=zone)
    names = dict(Pool.objects.values_list("pk", "name"))
    out: dict[str, dict[dt.date, float]] = defaultdict(lambda: defaultdict(float))

    def add(pool_id: int | None, hour: dt.datetime, gpu_hours: float) -> None:
        day = hour.astimezone(zone).date()
        out[FLEET][day] += gpu_hours
        if pool_id is not None and pool_id in names:
            out[names[pool_id]][day] += gpu_hours

    used = (
        HourlyUsage.objects.filter(hour__gte=lo, hour__lt=hi)
        .values("pool_id", "hour")
        .annotate(seconds=Sum(F("air_s") + F("held_s")))
        .order_by()
    )
    for row in used:
        add(row["pool_id"], row["hour"], float(row["seconds"] or 0.0) / 3600)
    pools = partition_pools()
    for (cluster, partition, hour), waited in capacity_waited_gpus_by_partition_hour(
        start=lo, end=hi
    ).items():
        mapped = pools.get((cluster, partition), [])
        if not mapped:
            add(None, hour, waited)
            continue
        for pool_id in mapped:
            add(pool_id, hour, waited / len(mapped))
    return {key: dict(days) for key, days in out.items()}
