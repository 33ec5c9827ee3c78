"""The money of queue pressure (DESIGN.md §9.2; docs/metrics.md, "Queue pressure"): what the
GPU hours that jobs wanted while the partition's GPUs sat held or parked cost.

The hours are telemetry's (``telemetry.queue_figures``: one definition of waited and wanted
hours); here only their price, through the cost model:

- a GPU hour's rate is the GPU's fixed rate over that UTC hour (``cost_model.
  mean_fixed_rate_per_hour``: the pro-rata rate of the hour depreciation ends in), its cost
  profile resolved as its cost rows resolve it (gpu > node > pool > site);
- a partition hour's rate is the mean of its pools' GPUs' rates weighted by their held +
  parked seconds in that hour (``cost_model.mean_rate_per_hour``): the wanted hours are taken
  pro rata from every GPU that sat held or parked;
- **wanted while held cost** of a group = Σ over partition hours of its wanted GPU hours ×
  that hour's rate. Energy is not in it: a job on that GPU would have drawn its own.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from billing import cost_model as cm
from billing.selectors.calendar import _local_midnight, _report_zone

# The one place a GPU's cost terms and service start are resolved for hour-by-hour pricing
# (the workloads' money prices their GPU hours the same way).
from billing.workloads import pricing_load
from telemetry.queue_figures import PartitionHour, QueueFigures, queue_figures

__all__ = [
    "QueueOverview",
    "gpu_hour_rates",
    "partition_hour_rate",
    "queue_cost_rows",
    "queue_overview",
    "queue_window",
]


def queue_window(
    *, start: dt.date, end: dt.date, zone_name: str
) -> tuple[dt.datetime, dt.datetime]:
    """Days ``[start, end)`` of the report time zone as the UTC moments the queue figures
    take (their hours are UTC hours; a zone whose midnights are not on UTC hours is taken at
    the whole-hour offset the cost rows use)."""
    zone = _report_zone(zone_name, start, end)
    return _local_midnight(start, zone).astimezone(dt.UTC), _local_midnight(end, zone).astimezone(
        dt.UTC
    )


def gpu_hour_rates(
    *, gpu_hours: Iterable[tuple[int, dt.datetime]]
) -> dict[tuple[int, dt.datetime], Decimal]:
    """The fixed rate (money per hour) of each (GPU id, UTC hour): the cost model's mean
    fixed rate over ``[hour, hour + 1 h)`` at the GPU's cost profile; 0 without a profile."""
    wanted = set(gpu_hours)
    pricing = pricing_load({gpu_id for gpu_id, _ in wanted})
    out: dict[tuple[int, dt.datetime], Decimal] = {}
    for gpu_id, hour in wanted:
        price = pricing.get(gpu_id)
        out[(gpu_id, hour)] = cm.mean_fixed_rate_per_hour(
            terms=price.terms if price is not None else None,
            service_start=price.service_start if price is not None else None,
            start=hour,
            end=hour + cm.ONE_HOUR,
        )
    return out


def partition_hour_rate(
    hour: PartitionHour, rates: dict[tuple[int, dt.datetime], Decimal]
) -> Decimal:
    """The rate of one partition hour's held and parked GPUs: their rates weighted by their
    held + parked hours (``rates`` from :func:`gpu_hour_rates`); 0 where none sat idle."""
    idle_hours = Decimal(0)
    idle_cost = Decimal(0)
    for gpu_id, seconds in hour.idle_s_by_gpu.items():
        gpu_h = cm.hours_from_seconds(seconds)
        idle_hours += gpu_h
        idle_cost += cm.fixed_cost_at_rate(
            fixed_rate_per_hour=rates[(gpu_id, hour.hour)], capacity_hours=gpu_h
        )
    return cm.mean_rate_per_hour(fixed_cost=idle_cost, capacity_hours=idle_hours)


def queue_cost_rows(
    *, start: dt.datetime, end: dt.datetime, group_by: str, money: bool = True
) -> list[dict[str, Any]]:
    """``telemetry.queue_figures.queue_rows`` (same rows, same order) with, when ``money``,
    ``wanted_while_held_cost`` (Decimal, full precision) on each: its wanted GPU hours per
    partition hour × that partition hour's rate. Without ``money`` nothing is priced."""
    figures = queue_figures(start=start, end=end, group_by=group_by)
    if not money:
        return [g.row for g in figures.groups]
    return _priced(figures)


def _priced(figures: QueueFigures) -> list[dict[str, Any]]:
    """The groups' rows with ``wanted_while_held_cost`` (:func:`queue_cost_rows`)."""
    used = {place for g in figures.groups for place, gpu_h in g.wanted.items() if gpu_h > 0}
    rates = gpu_hour_rates(
        gpu_hours=(
            (gpu_id, place[2])
            for place in used
            for gpu_id in figures.partition_hours[place].idle_s_by_gpu
        )
    )
    hour_rates = {
        place: partition_hour_rate(figures.partition_hours[place], rates) for place in used
    }
    rows = []
    for group in figures.groups:
        cost = sum(
            (
                cm.fixed_cost_at_rate(fixed_rate_per_hour=hour_rates[place], capacity_hours=gpu_h)
                for place, gpu_h in group.wanted.items()
                if gpu_h > 0
            ),
            Decimal(0),
        )
        rows.append({**group.row, "wanted_while_held_cost": cost})
    return rows


@dataclass(frozen=True)
class QueueOverview:
    """The overview's queue figures over its days, every cluster: GPU hours waited for
    capacity, the part of them wanted while the partitions' GPUs sat held or parked, its cost
    (None: not asked), and both per day of the report time zone (days without capacity waits
    are absent)."""

    waited_gpu_hours: float
    wanted_gpu_hours: float
    wanted_cost: Decimal | None
    days: dict[dt.date, tuple[float, float]]


def queue_overview(
    *, start: dt.date, end: dt.date, zone_name: str, money: bool
) -> QueueOverview | None:
    """:class:`QueueOverview` for the report days ``[start, end)``; None when no queue
    collector reported a pending GPU job in them (the overview then shows nothing of it)."""
    lo, hi = queue_window(start=start, end=end, zone_name=zone_name)
    figures = queue_figures(start=lo, end=hi, group_by="cluster")
    if not figures.groups:
        return None
    zone = _report_zone(zone_name, start, end)
    days: dict[dt.date, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for place in figures.partition_hours.values():
        day = days[place.hour.astimezone(zone).date()]
        day[0] += place.waited_gpu_hours
        day[1] += place.wanted_gpu_hours
    rows = _priced(figures) if money else [g.row for g in figures.groups]
    return QueueOverview(
        waited_gpu_hours=sum(r["waited_gpu_hours_capacity"] for r in rows),
        wanted_gpu_hours=sum(r["wanted_while_held_gpu_hours"] for r in rows),
        wanted_cost=sum((r["wanted_while_held_cost"] for r in rows), Decimal(0)) if money else None,
        days={d: (w, h) for d, (w, h) in sorted(days.items())},
    )
