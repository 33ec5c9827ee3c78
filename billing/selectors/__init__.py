"""Period figures for the dashboard, the finance API and the email (docs/metrics.md; their
API fields: docs/api.md).

How a figure is made, and why this way:
- Only rollups are read, never the raw table: on PostgreSQL the whole months of a window from
  the monthly pre-aggregate (``telemetry.MonthlyUsage``, period ``all`` or ``month``), a
  month partly in the window as its monthly rows less its daily rows outside the window
  where those are fewer (the month in progress: its monthly rows alone), its other whole
  days from the daily one (``telemetry.DailyUsage``), the day in progress (where its daily
  row cannot stand for it) and the GPUs whose depreciation ends inside it from hourly rows
  (``telemetry.HourlyUsage``); hourly rows only on SQLite. They are summed in SQL per GPU,
  period bucket, stored attribution (node, pool, team, site as it was in that hour) and
  depreciation phase; the open stretches of a window around closed months in one statement
  per GPU (each stretch's observed seconds beside the sums, for its own offline hours). The
  number of queries is fixed (about eight), whatever the number of GPUs.
- Capacity, offline hours and every cost come from ``billing.cost_model`` per GPU, in Python;
  groups (node, pool, team, site, model, fleet) are sums of those per-GPU pieces, so a group's
  figure is always the sum of its parts and ratios are ratios of sums. Rows grouped by neither
  GPU nor node read their sums already added per price class in SQL (each GPU's observed
  seconds still per GPU, for its offline hours): the same figures to the cent.
- Offline hours (capacity with no samples) belong to the GPU's *current* node, pool, team
  and site: nothing was stored for them.
- An owned GPU's rate drops when depreciation ends. The rollup hours are split in SQL into the
  hours before the one that contains that moment (phase 0), that hour (1) and the hours after
  (2); each phase has one rate, that of hour 1 being its pro-rata mean. Phase 0 is the only
  phase of rented GPUs and of GPUs without a profile.
- Buckets (day, ISO week, month) are in the report time zone. Rollups are UTC hours, so a zone
  whose offset is not a whole number of hours in the query is approximated by a fixed offset
  rounded to the hour (docs/metrics.md).

Money is Decimal in full precision (round only when shown); hours are floats.
"""

from billing.selectors.breakeven import (
    BreakevenResult,
    breakeven_compute,
    breakeven_workload,
    breakeven_workload_measured,
)
from billing.selectors.costs import (
    DeferredRow,
    FleetSummary,
    RowPlace,
    cost_rows,
    cost_rows_after,
    cost_rows_by,
    cost_rows_counted,
    cost_rows_deferred_by,
    cost_rows_in_parts,
    fleet_overview,
    fleet_summary,
    fleet_trend,
    gpu_utilizations,
)
from billing.selectors.types import (
    GROUP_BY,
    OFFLINE_NOW_AFTER,
    PERIODS,
    THROTTLE_REASONS,
    UNASSIGNED_NAME,
    CostRow,
    Filters,
    offline_now,
)
from billing.selectors.utilisation import UtilizationRow, utilization_by_day, utilization_listed

__all__ = [
    "GROUP_BY",
    "OFFLINE_NOW_AFTER",
    "PERIODS",
    "THROTTLE_REASONS",
    "UNASSIGNED_NAME",
    "BreakevenResult",
    "CostRow",
    "DeferredRow",
    "Filters",
    "FleetSummary",
    "UtilizationRow",
    "breakeven_compute",
    "breakeven_workload",
    "breakeven_workload_measured",
    "RowPlace",
    "cost_rows",
    "cost_rows_after",
    "cost_rows_by",
    "cost_rows_counted",
    "cost_rows_deferred_by",
    "cost_rows_in_parts",
    "fleet_overview",
    "fleet_summary",
    "fleet_trend",
    "gpu_utilizations",
    "offline_now",
    "utilization_by_day",
    "utilization_listed",
]
