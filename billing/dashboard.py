"""View helpers of the dashboard: the filters kept in the URL, ranges, small lookups.

Nothing here computes a metric: every figure comes from ``billing.selectors`` (docs/metrics.md).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db.models import Min, Q
from django.db.models.functions import Coalesce
from django.http import QueryDict
from django.utils import timezone

from billing import cost_model as cm
from billing.charts import PartialDay
from billing.forms import PRESETS, FilterForm
from billing.models import CostProfile
from billing.selectors import Filters
from fleet.models import FleetSettings, Gpu

DEFAULT_DAYS = 30
MAX_DAYS = 400  # a bound on what one page may ask the selectors for
FILTER_KEYS = ("site", "pool", "team", "model")


def preset_range(key: str, today: dt.date) -> tuple[dt.date, dt.date]:
    """The inclusive days of a period shortcut, seen from ``today`` (report time zone):
    weeks start on Monday (ISO), quarters in January, April, July and October."""
    monday = today - dt.timedelta(days=today.weekday())
    first_of_month = today.replace(day=1)
    if key == "last_30_days":
        return today - dt.timedelta(days=DEFAULT_DAYS - 1), today
    if key == "this_week":
        return monday, today
    if key == "last_week":
        return monday - dt.timedelta(weeks=1), monday - dt.timedelta(days=1)
    if key == "month_to_date":
        return first_of_month, today
    if key == "last_month":
        end = first_of_month - dt.timedelta(days=1)
        return end.replace(day=1), end
    if key == "last_quarter":
        quarter_start = dt.date(today.year, (today.month - 1) // 3 * 3 + 1, 1)
        end = quarter_start - dt.timedelta(days=1)
        return dt.date(end.year, end.month - 2, 1), end
    raise ValueError(f"period: unknown shortcut {key!r}")


def period_label(start: dt.date, end: dt.date) -> str:
    """An inclusive range of days as people write it: "15 Jun 2026", "8–14 Jun 2026",
    "28 May – 3 Jun 2026", "28 Dec 2025 – 3 Jan 2026"."""
    if start == end:
        return f"{start.day} {start:%b %Y}"
    if (start.year, start.month) == (end.year, end.month):
        return f"{start.day}–{end.day} {end:%b %Y}"
    if start.year == end.year:
        return f"{start.day} {start:%b} – {end.day} {end:%b %Y}"
    return f"{start.day} {start:%b %Y} – {end.day} {end:%b %Y}"


@dataclass
class DashboardFilters:
    """What the filter bar says: an inclusive date range in the report time zone and the
    site/pool/team/model restriction. ``end`` here is inclusive (what a person types);
    ``end_exclusive`` is what the selectors take."""

    start: dt.date
    end: dt.date
    filters: Filters
    form: FilterForm
    fleet_settings: FleetSettings
    extra: dict[str, str] = field(default_factory=dict)
    today: dt.date = field(default_factory=dt.date.today)  # in the report time zone
    preset: str = ""  # the period shortcut that chose the range, if one did

    @property
    def end_exclusive(self) -> dt.date:
        return self.end + dt.timedelta(days=1)

    @property
    def days(self) -> int:
        return (self.end_exclusive - self.start).days

    @property
    def currency(self) -> str:
        return self.fleet_settings.currency

    @property
    def target_utilization(self) -> float:
        return float(self.fleet_settings.target_utilization)

    @property
    def label(self) -> str:
        """The range in words, as every card says it."""
        return period_label(self.start, self.end)

    @property
    def partial_day(self) -> dt.date | None:
        """Today, when the range holds it: its figures so far are a part of a day."""
        return self.today if self.start <= self.today <= self.end else None

    def range_params(self) -> list[tuple[str, str]]:
        """The range alone: the shortcut that chose it, else its two days."""
        if self.preset:
            return [("period", self.preset)]
        return [("from", self.start.isoformat()), ("to", self.end.isoformat())]

    def params(self) -> list[tuple[str, str]]:
        pairs = self.range_params()
        for key, values in zip(
            FILTER_KEYS,
            (self.filters.sites, self.filters.pools, self.filters.teams, self.filters.models),
            strict=True,
        ):
            pairs += [(key, v) for v in values]
        return pairs

    @property
    def querystring(self) -> str:
        """The filters as a query string, to carry them on every link (no leading ``?``)."""
        return urlencode(self.params())

    def with_params(self, **extra: str) -> str:
        return urlencode(self.params() + [(k, v) for k, v in extra.items() if v != ""])

    @property
    def active(self) -> bool:
        return any(
            (self.filters.sites, self.filters.pools, self.filters.teams, self.filters.models)
        )

    @property
    def range_querystring(self) -> str:
        """The range without the other filters (the filter bar's "Clear filters")."""
        return urlencode(self.range_params())

    def presets(self, keep: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The period shortcuts as links that keep the other filters and ``keep``."""
        others = [(k, v) for k, v in self.params() if k not in ("period", "from", "to")]
        out = []
        for key, label in PRESETS.items():
            start, end = preset_range(key, self.today)
            out.append(
                {
                    "key": key,
                    "label": label,
                    "dates": period_label(start, end),
                    "qs": urlencode([("period", key), *others, *keep]),
                    "active": (start, end) == (self.start, self.end),
                }
            )
        return out


def dashboard_filters(query: QueryDict, *, today: dt.date | None = None) -> DashboardFilters:
    """Parse ``?from=&to=&site=&pool=&team=&model=`` (each filter repeatable). Bad values are
    reported on the form and replaced by the defaults (the last 30 days, the whole fleet)."""
    fleet_settings = FleetSettings.load()
    if today is None:
        today = timezone.now().astimezone(fleet_settings.report_zone).date()
    form = FilterForm(query)
    form.is_valid()  # errors are shown; cleaned_data holds what was valid
    data: dict[str, Any] = getattr(form, "cleaned_data", {})
    preset = data.get("period") or ""
    given = (data.get("from"), data.get("to"))
    if preset and given not in ((None, None), preset_range(preset, today)):
        preset = ""  # the filter bar's days were changed: they win over the shortcut
    if preset:
        start, end = preset_range(preset, today)
    else:
        end = data.get("to") or today
        start = data.get("from") or end - dt.timedelta(days=DEFAULT_DAYS - 1)
    if start > end:
        start, end = end, start
    if (end - start).days >= MAX_DAYS:
        start = end - dt.timedelta(days=MAX_DAYS - 1)
    filters = Filters(
        sites=tuple(data.get("site") or ()),
        pools=tuple(data.get("pool") or ()),
        teams=tuple(data.get("team") or ()),
        models=tuple(data.get("model") or ()),
    )
    return DashboardFilters(
        start=start,
        end=end,
        filters=filters,
        form=form,
        fleet_settings=fleet_settings,
        today=today,
        preset=preset,
    )


def first_data_at() -> dt.datetime | None:
    """When the fleet's data begins: the earliest GPU's start of capacity (its in-service
    date, else its first sample: ``Gpu.service_start``); None before any GPU."""
    first: dt.datetime | None = Gpu.objects.aggregate(
        first=Min(Coalesce("in_service_at", "first_seen_at"))
    )["first"]
    return first


def partial_days(flt: DashboardFilters, *, data_from: dt.datetime | None) -> list[PartialDay]:
    """The days of the range whose figures cover a part of the day (report time zone): the
    day the data began (``data_from``: the fleet's first data, or one GPU's) when it began
    after midnight, and today so far. A window that starts before the data shows its first
    day as a part, not as a dip."""
    marks: dict[dt.date, str] = {}
    if data_from is not None:
        local = data_from.astimezone(flt.fleet_settings.report_zone)
        if flt.start <= local.date() <= flt.end and local.time() != dt.time():
            marks[local.date()] = f"partial day: data from {local:%H:%M}"
    today = flt.partial_day
    if today is not None:
        marks[today] = f"{marks[today]}, so far" if today in marks else "today, so far"
    return [PartialDay(day=day, label=label) for day, label in sorted(marks.items())]


def window_hours_to_now(start: dt.datetime, end: dt.datetime, *, now: dt.datetime) -> float:
    """The hours of [start, end) cut off at ``now``: the period the selectors spread capacity
    over (recoverable GPUs, the break-even's month; ``_Computation.window_hours``)."""
    return float(cm.hours_between(start=start, end=max(start, min(end, now))))


def range_bounds(flt: DashboardFilters) -> tuple[dt.datetime, dt.datetime]:
    """The range as aware datetimes [start, end) in the report time zone."""
    zone = flt.fleet_settings.report_zone
    start = dt.datetime.combine(flt.start, dt.time(), tzinfo=zone)
    end = dt.datetime.combine(flt.end_exclusive, dt.time(), tzinfo=zone)
    return start, end


def gpu_cost_profile(gpu: Gpu) -> CostProfile | None:
    """The cost profile that applies to this GPU, by ``cost_model.cost_profile_resolve``
    (the most specific scope wins: GPU, node, pool, site). One query for all its scopes."""
    node = gpu.node
    site = node.effective_site
    pool_name = node.pool.name if node.pool_id and node.pool else None
    site_name = site.name if site is not None else None
    query = Q(pk__in=[])
    for kind, name in cm.cost_profile_scopes(
        gpu_uuid=gpu.uuid, hostname=node.hostname, pool_name=pool_name, site_name=site_name
    ):
        query |= Q(scope_kind=kind, scope_name=name)
    return cm.cost_profile_resolve(
        profiles={(p.scope_kind, p.scope_name): p for p in CostProfile.objects.filter(query)},
        gpu_uuid=gpu.uuid,
        hostname=node.hostname,
        pool_name=pool_name,
        site_name=site_name,
    )


def pool_rental_rate(pool: str | None) -> Decimal | None:
    """The rate per GPU-hour of the pool's own rented cost profile (scope ``pool:NAME``), if it
    has one: the break-even form's on-demand rate for that pool, so the form never shows the
    product's default beside a pool priced otherwise."""
    if not pool:
        return None
    rate: Decimal | None = (
        CostProfile.objects.filter(scope_kind="pool", scope_name=pool, kind="rented")
        .values_list("rental_rate_per_hour", flat=True)
        .first()
    )
    return rate


SORTS = {
    # key: (label, attribute path on the board row, worst-first direction)
    "util": ("Utilisation", "utilization", "asc"),
    "work": ("Work utilisation", "work_utilization", "asc"),
    "air": ("Hours in the air / day", "hours_in_air_per_day", "asc"),
    "idle_cost": ("Idle cost", "idle_cost", "desc"),
    "offline": ("Offline hours", "offline_hours", "desc"),
    "throttled": ("Throttled hours", "throttled_hours", "desc"),
    "last_seen": ("Last seen", "last_seen", "asc"),
    "name": ("GPU", "name", "asc"),
}
MONEY_SORTS = {"idle_cost"}


def blocks(row: Any) -> list[dict[str, Any]]:
    """The 24-hour bar of one row: air / held / parked / offline as shares of capacity."""
    capacity = row.capacity_hours or 0.0
    out = []
    for attr, label, css in (
        ("air_hours", "In the air", "air"),
        ("held_hours", "Held", "held"),
        ("parked_hours", "Parked", "parked"),
        ("offline_hours", "Offline", "offline"),
    ):
        hours = getattr(row, attr) or 0.0
        share = hours / capacity if capacity else 0.0
        out.append(
            {
                "css": css,
                "label": label,
                "width": f"{share * 100:.2f}",
                "per_day": f"{share * 24:.1f}",
            }
        )
    return out
