"""Job efficiency with its money (DESIGN.md §9.4; docs/metrics.md, "Job efficiency"): the
figures of ``telemetry.efficiency.job_efficiency`` per workload, model, pool or team, and what
a million of their tokens cost.

**Cost per million tokens** = the cost of the GPU hours the job sums cover / their tokens ×
1e6. Those GPU hours are priced as a workload's are (``billing.workloads.gpu_seconds_cost``):
per GPU and site, the reported GPU seconds at the GPU's fixed rate over the hours they fall
in, plus (owned GPUs) the energy those seconds drew × PUE × price. So a job that reported on
half of its GPU time is charged for that half, and its tokens are set against it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from billing.breakeven import measured_cost_per_mtok
from billing.cost_model import ONE_HOUR
from billing.workloads import GpuSeconds, gpu_seconds_cost, team_rule_match, team_rules_load
from fleet.models import FleetSettings
from telemetry.efficiency import GROUP_BY, EfficiencyRow, job_efficiency

__all__ = ["GROUP_BY", "EfficiencyFigures", "efficiency_figures"]


@dataclass
class EfficiencyFigures:
    """One group's job efficiency (``row``) and the money of its reported GPU hours."""

    row: EfficiencyRow
    cost: Decimal
    cost_per_mtok: Decimal | None  # None without tokens
    currency: str
    priced: bool  # False when a GPU it ran on has no cost profile or no site

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.row.as_dict(),
            "cost": self.cost,
            "cost_per_mtok": self.cost_per_mtok,
            "currency": self.currency,
            "priced": self.priced,
        }


def _moment(day: dt.date, zone: dt.tzinfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=zone).astimezone(dt.UTC)


def efficiency_figures(
    *, start: dt.date, end: dt.date, group_by: str, workload_ids: Sequence[int] | None = None
) -> list[EfficiencyFigures]:
    """One row per ``group_by`` (workload, model, pool, team) over the local days [start, end)
    of the report time zone, most GPU hours first: MFU (with the fleet file's ``[[peaks]]``),
    data-starved and checkpoint shares, tokens per GPU hour, and the cost per million tokens.
    Teams follow the ``[[workload_teams]]`` rules, as the workloads' do. ``workload_ids``:
    only the reports of these workloads (a page's rows)."""
    if end <= start:
        raise ValueError("end: must be after start")
    fleet_settings = FleetSettings.load()
    zone = fleet_settings.report_zone
    rules = team_rules_load()
    rows = job_efficiency(
        start=_moment(start, zone),
        end=_moment(end, zone),
        group_by=group_by,
        team_of=lambda kind, key, user, account: team_rule_match(
            rules, kind=kind, key=key, user=user, account=account
        ),
        workload_ids=workload_ids,
    )
    out = []
    for row in rows:
        cost, priced = gpu_seconds_cost(
            pieces=[
                GpuSeconds(
                    gpu_id=p.gpu_id,
                    site_id=p.site_id,
                    start=p.first_hour,
                    end=p.last_hour + ONE_HOUR,
                    gpu_s=p.wall_s,
                    energy_j=p.energy_j,
                )
                for p in row.parts
            ]
        )
        out.append(
            EfficiencyFigures(
                row=row,
                cost=cost,
                cost_per_mtok=measured_cost_per_mtok(cost=cost, tokens=row.tokens),
                currency=fleet_settings.currency,
                priced=priced,
            )
        )
    return out
