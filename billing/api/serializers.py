"""Finance API shapes: query parameters, cost rows, break-even, cost profiles.

Cost rows leave the server through one function, ``cost_row_data``, for JSON and CSV alike;
``CostRowSerializer`` only documents that shape in the OpenAPI schema (a test keeps the two in
step). Money is rounded half-up to cents only here, at the edge (docs/api.md).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from zoneinfo import ZoneInfo

from rest_framework import serializers
from rest_framework.fields import empty

from billing.breakeven import TOKENS_PER_S_MAX, OwningInstead
from billing.cost_model import money_round
from billing.focus import DEFAULT_VERSION as FOCUS_DEFAULT_VERSION
from billing.focus import VERSIONS as FOCUS_VERSIONS
from billing.models import CostProfile
from billing.selectors import PERIODS, BreakevenResult, CostRow
from fleet.bounds import DATE_RANGE_TEXT, date_validator
from fleet.models import GpuModel, Node, Pool, Site, Team

MICRO = Decimal("0.000001")
HOURS_DECIMALS = 6
# The widest range one request may ask for: three years of daily rows is what a chargeback
# export needs; more is a mistake or an attack on the server's time.
MAX_RANGE_DAYS = 3 * 366
API_GROUP_BY = ("gpu", "node", "pool", "team", "site", "model", "fleet")


def money_str(value: Decimal | None) -> str | None:
    """Money as shown and exported: two decimals, rounded half-up (never banker's rounding)."""
    if value is None:
        return None
    return str(money_round(value))


def rate_str(value: Decimal | None) -> str | None:
    """A price per unit (per hour, per kWh, per million tokens): six decimals, half-up."""
    if value is None:
        return None
    return str(value.quantize(MICRO, rounding=ROUND_HALF_UP))


def num(value: float | None, places: int = HOURS_DECIMALS) -> float | None:
    """A measured quantity (hours, kWh, a fraction) rounded for the wire; NaN never leaves."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), places)


def iso(value: dt.datetime, zone: ZoneInfo) -> str:
    """ISO 8601 with the offset of the report time zone, e.g. 2026-11-02T00:00:00+01:00."""
    return value.astimezone(zone).isoformat()


# --- Cost rows ---------------------------------------------------------------------------------

COST_COLUMNS: tuple[str, ...] = (
    "key",
    "name",
    "period_start",
    "period_end",
    "gpu_count",
    "capacity_hours",
    "observed_hours",
    "air_hours",
    "held_hours",
    "parked_hours",
    "offline_hours",
    "utilization",
    "hours_in_air_per_day",
    "energy_kwh",
    "idle_energy_kwh",
    "energy_per_gpu_hour_kwh",
    "kwh_per_air_hour",
    "co2e_kg",
    "currency",
    "fixed_cost",
    "energy_cost",
    "total_cost",
    "idle_cost",
    "cost_per_air_hour",
    "priced",
    "throttled_hours",
    "throttled_power_cap_hours",
    "throttled_thermal_hours",
    "throttled_hw_slowdown_hours",
    "throttled_other_hours",
    "profiled_hours",
    "work_hours",
    "busy_not_working_hours",
    "work_utilization",
    "tensor_hours",
    "tensor_utilization",
    "cost_per_work_hour",
    "closed",
    "adjustment_for",
)
# Grouped by team, a row also names the team's cost centre, after its name (chargeback).
TEAM_COST_COLUMNS: tuple[str, ...] = (*COST_COLUMNS[:2], "cost_center", *COST_COLUMNS[2:])
_FLOAT_FIELDS = (
    "capacity_hours",
    "observed_hours",
    "air_hours",
    "held_hours",
    "parked_hours",
    "offline_hours",
    "utilization",
    "hours_in_air_per_day",
    "energy_kwh",
    "idle_energy_kwh",
    "energy_per_gpu_hour_kwh",
    "kwh_per_air_hour",
    "co2e_kg",
    "throttled_hours",
    "throttled_power_cap_hours",
    "throttled_thermal_hours",
    "throttled_hw_slowdown_hours",
    "throttled_other_hours",
    "profiled_hours",
    "work_hours",
    "busy_not_working_hours",
    "work_utilization",
    "tensor_hours",
    "tensor_utilization",
)
_MONEY_FIELDS = (
    "fixed_cost",
    "energy_cost",
    "total_cost",
    "idle_cost",
    "cost_per_air_hour",
    "cost_per_work_hour",
)


def cost_columns(group_by: str) -> tuple[str, ...]:
    """The columns of a cost row, in order, for rows grouped by ``group_by``."""
    return TEAM_COST_COLUMNS if group_by == "team" else COST_COLUMNS


def cost_row_data(
    row: CostRow, *, zone: ZoneInfo, cost_centers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One selector row as the API shows it (JSON) and exports it (CSV). With
    ``cost_centers`` (team name → cost centre) the row is a team's and names its cost centre
    ("" for a team without one and for the row of GPUs without a team)."""
    data: dict[str, Any] = {
        "key": row.key,
        "name": row.name,
        "period_start": iso(row.period_start, zone),
        "period_end": iso(row.period_end, zone),
        "gpu_count": row.gpu_count,
        "currency": row.currency,
        "priced": row.priced,
        "closed": row.closed,
        "adjustment_for": row.adjustment_for,
    }
    for name in _FLOAT_FIELDS:
        data[name] = num(getattr(row, name))
    for name in _MONEY_FIELDS:
        data[name] = money_str(getattr(row, name))
    if cost_centers is None:
        return {column: data[column] for column in COST_COLUMNS}
    data["cost_center"] = cost_centers.get(row.key, "")
    return {column: data[column] for column in TEAM_COST_COLUMNS}


class CommaListField(serializers.ListField):
    """A filter given as repeated parameters (``?team=a&team=b``), comma-separated
    (``?team=a,b``) or both."""

    child = serializers.CharField(max_length=255)

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, str):
            data = [data]
        values: list[str] = super().to_internal_value(data)
        names: list[str] = []
        for value in values:
            names += [part.strip() for part in value.split(",") if part.strip()]
        return list(dict.fromkeys(names))


def _known(value: list[str], model: Any, field: str, what: str) -> list[str]:
    """Unknown names are an error, not an empty export: a typo must not look like zero cost."""
    found = set(model.objects.filter(**{f"{field}__in": value}).values_list(field, flat=True))
    missing = [v for v in value if v not in found]
    if missing:
        raise serializers.ValidationError(f"unknown {what}: {', '.join(missing)}")
    return value


class RangeQuerySerializer(serializers.Serializer[Any]):
    start = serializers.DateField(
        required=False,
        validators=[date_validator],
        help_text=(
            "First day (YYYY-MM-DD, report time zone). Default: first day of this month. "
            f"From {DATE_RANGE_TEXT}."
        ),
    )
    end = serializers.DateField(
        required=False,
        validators=[date_validator],
        help_text=(
            "Day after the last day (exclusive). Default: tomorrow (month to date). "
            f"From {DATE_RANGE_TEXT}."
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        today: dt.date = self.context["today"]
        end = attrs.get("end") or today + dt.timedelta(days=1)
        start = attrs.get("start") or today.replace(day=1)
        if "start" not in attrs and start >= end:
            start = end - dt.timedelta(days=1)
        if start >= end:
            raise serializers.ValidationError({"end": ["must be after start (end is exclusive)"]})
        if (end - start).days > MAX_RANGE_DAYS:
            raise serializers.ValidationError(
                {"start": [f"the range may span at most {MAX_RANGE_DAYS} days"]}
            )
        attrs["start"], attrs["end"] = start, end
        return attrs


class CostsQuerySerializer(RangeQuerySerializer):
    group_by = serializers.ChoiceField(
        choices=API_GROUP_BY,
        default="gpu",
        help_text="One row per GPU (UUID), node (hostname), pool, team, site, model, or the fleet.",
    )
    period = serializers.ChoiceField(
        choices=PERIODS,
        default="all",
        help_text="Buckets: day, ISO week (from Monday), calendar month, or the whole range.",
    )
    site = CommaListField(required=False, help_text="Site names (repeat or comma-separate).")
    pool = CommaListField(required=False, help_text="Pool names.")
    team = CommaListField(required=False, help_text="Team names.")
    model = CommaListField(required=False, help_text="GPU model keys, e.g. H100-SXM.")

    def validate_site(self, value: list[str]) -> list[str]:
        return _known(value, Site, "name", "site")

    def validate_pool(self, value: list[str]) -> list[str]:
        return _known(value, Pool, "name", "pool")

    def validate_team(self, value: list[str]) -> list[str]:
        return _known(value, Team, "name", "team")

    def validate_model(self, value: list[str]) -> list[str]:
        return _known(value, GpuModel, "key", "model")


class FocusQuerySerializer(RangeQuerySerializer):
    version = serializers.ChoiceField(
        choices=FOCUS_VERSIONS,
        default=FOCUS_DEFAULT_VERSION,
        help_text="FOCUS version of the columns: 1.2 (what FinOps tools import today) or 1.0.",
    )


class CostRowSerializer(serializers.Serializer[Any]):
    """Documents one cost row (what ``cost_row_data`` produces); money is a decimal string."""

    key = serializers.CharField(help_text="GPU UUID, hostname, or pool/team/site/model name")
    name = serializers.CharField()
    cost_center = serializers.CharField(
        required=False,
        help_text="group_by=team only: the team's cost centre as the fleet file sets it now "
        '("" where none)',
    )
    period_start = serializers.DateTimeField(help_text="ISO 8601 with offset; clipped to query")
    period_end = serializers.DateTimeField()
    gpu_count = serializers.IntegerField()
    capacity_hours = serializers.FloatField()
    observed_hours = serializers.FloatField()
    air_hours = serializers.FloatField()
    held_hours = serializers.FloatField()
    parked_hours = serializers.FloatField()
    offline_hours = serializers.FloatField()
    utilization = serializers.FloatField(allow_null=True, help_text="air / capacity hours, 0–1")
    hours_in_air_per_day = serializers.FloatField(allow_null=True)
    energy_kwh = serializers.FloatField()
    idle_energy_kwh = serializers.FloatField()
    energy_per_gpu_hour_kwh = serializers.FloatField(allow_null=True)
    kwh_per_air_hour = serializers.FloatField(allow_null=True)
    co2e_kg = serializers.FloatField()
    currency = serializers.CharField(help_text="ISO 4217 code of every money field")
    fixed_cost = serializers.DecimalField(max_digits=20, decimal_places=2)
    energy_cost = serializers.DecimalField(max_digits=20, decimal_places=2)
    total_cost = serializers.DecimalField(max_digits=20, decimal_places=2)
    idle_cost = serializers.DecimalField(max_digits=20, decimal_places=2)
    cost_per_air_hour = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True)
    priced = serializers.BooleanField(help_text="false: a GPU without cost profile or site")
    throttled_hours = serializers.FloatField()
    throttled_power_cap_hours = serializers.FloatField()
    throttled_thermal_hours = serializers.FloatField()
    throttled_hw_slowdown_hours = serializers.FloatField()
    throttled_other_hours = serializers.FloatField()
    profiled_hours = serializers.FloatField(
        help_text="Hours covered by profiling data (Σ prof_s of samples with sm_active); 0 without"
    )
    work_hours = serializers.FloatField(
        allow_null=True,
        help_text="Σ sm_active × prof_s / 3600: hours the SMs really worked; null without data",
    )
    busy_not_working_hours = serializers.FloatField(
        allow_null=True,
        help_text="Air hours of the samples with sm_active − work hours, ≥ 0; null without data",
    )
    work_utilization = serializers.FloatField(
        allow_null=True, help_text="work hours / profiled hours, 0–1; null without data"
    )
    tensor_hours = serializers.FloatField(
        allow_null=True, help_text="Σ tensor_active × prof_s / 3600; null without data"
    )
    tensor_utilization = serializers.FloatField(
        allow_null=True,
        help_text="tensor hours / Σ prof_s of samples with tensor_active, 0–1; null without data",
    )
    cost_per_work_hour = serializers.DecimalField(
        max_digits=20,
        decimal_places=2,
        allow_null=True,
        help_text="Total cost of the GPU-hours with sm_active / their work hours; null without",
    )
    closed = serializers.BooleanField(
        help_text="true: the period lies in closed months; its figures are those of the close"
    )
    adjustment_for = serializers.CharField(
        allow_null=True,
        help_text=(
            "YYYY-MM on an adjustment row: what late data changed in that closed month, "
            "booked in this period (the first open month after it); null on regular rows"
        ),
    )


class CostPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(
        required=False, help_text="Every row of the range (limit/offset pages only)"
    )
    next = serializers.URLField(allow_null=True, help_text="The next page; null on the last")
    previous = serializers.URLField(
        allow_null=True, required=False, help_text="limit/offset pages only"
    )
    results = CostRowSerializer(many=True)


# --- Break-even --------------------------------------------------------------------------------


class _NoBlank:
    """A number parameter given empty (``?tokens_per_s=``) is a mistake, not "left out"
    (which takes the default): DRF would read a blank optional form value as absent."""

    def get_value(self, dictionary: Any) -> Any:
        value = super().get_value(dictionary)  # type: ignore[misc]
        name = getattr(self, "field_name", "")
        if value is empty and name in dictionary:
            return dictionary[name]  # "" → "A valid number is required."
        return value


class _FiniteFloatField(_NoBlank, serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        value = float(super().to_internal_value(data))
        if not math.isfinite(value):
            raise serializers.ValidationError("must be a finite number")
        return value


class _PriceField(_NoBlank, serializers.DecimalField):
    pass


def _price(help_text: str) -> serializers.DecimalField:
    return _PriceField(
        max_digits=14,
        decimal_places=6,
        min_value=Decimal("0"),
        required=False,
        help_text=help_text,
    )


class BreakevenQuerySerializer(RangeQuerySerializer):
    """Every workload parameter left out is the break-even page's default: the pool's
    ``breakeven`` table of the fleet file, else the fleet's ``[breakeven]``, else the
    product's (``selectors.breakeven_workload``). The four price parameters come as a set:
    none (the defaults) or a complete one."""

    pool = serializers.CharField(
        max_length=100,
        required=False,
        help_text="Pool name. Left out: the whole fleet, every GPU not rented as one pool",
    )
    tokens_per_s = _FiniteFloatField(
        min_value=0.000001,
        max_value=TOKENS_PER_S_MAX,
        required=False,
        help_text="Tokens per second one GPU of the pool serves at full load. Default: the "
        "pool's jobs measured in the window (gpufleet_hook), else the fleet file's "
        "tokens_per_s_per_gpu (the pool's, else the fleet's), else 2000",
    )
    api_price_per_mtok = _price("Blended API price per million tokens")
    api_input_price_per_mtok = _price("API price per million input tokens")
    api_output_price_per_mtok = _price("API price per million output tokens")
    output_share = _FiniteFloatField(
        min_value=0, max_value=1, required=False, help_text="Share of tokens that are output"
    )
    rental_rate_per_hour = _price(
        "On-demand rental rate per GPU-hour to compare owning with. Default: the fleet "
        "file's, else 2.35"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        split = ("api_input_price_per_mtok", "api_output_price_per_mtok", "output_share")
        given = [k for k in split if k in attrs]
        if "api_price_per_mtok" in attrs:
            if given:
                raise serializers.ValidationError(
                    {
                        "api_price_per_mtok": [
                            "give a blended price or input/output prices, not both"
                        ]
                    }
                )
        elif given and len(given) != len(split):
            missing = [k for k in split if k not in attrs]
            raise serializers.ValidationError(
                {
                    k: [
                        "required: api_price_per_mtok, or api_input_price_per_mtok, "
                        "api_output_price_per_mtok and output_share (or none of them: the "
                        "defaults)"
                    ]
                    for k in missing
                }
            )
        return attrs


def breakeven_arguments(params: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """``breakeven_compute``'s arguments: the query's, the rest from ``workload`` (the
    fleet file's keys, ``selectors.breakeven_workload``)."""
    args = dict(params)
    args["pool"] = params.get("pool")
    args.setdefault("tokens_per_s", float(workload["tokens_per_s_per_gpu"]))
    args.setdefault("rental_rate_per_hour", Decimal(str(workload["rental_rate_per_hour"])))
    prices = ("api_price_per_mtok", "api_input_price_per_mtok", "api_output_price_per_mtok")
    if not any(k in params for k in (*prices, "output_share")):
        if "api_price_per_mtok" in workload:
            args["api_price_per_mtok"] = Decimal(str(workload["api_price_per_mtok"]))
        else:
            for key in prices[1:]:
                args[key] = Decimal(str(workload[key]))
            args["output_share"] = float(workload["output_share"])
    return args


class CurvePointSerializer(serializers.Serializer[Any]):
    utilization = serializers.FloatField()
    own_cost_per_mtok = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True)


class OwningInsteadSerializer(serializers.Serializer[Any]):
    models = serializers.ListField(
        child=serializers.CharField(), help_text="The GPU models of the pool, priced"
    )
    gpus = serializers.IntegerField(help_text="The fleet's owned GPUs of those models")
    fixed_rate_per_hour = serializers.DecimalField(max_digits=20, decimal_places=6)
    pue = serializers.FloatField()
    price_per_kwh = serializers.DecimalField(max_digits=20, decimal_places=6)
    breakeven_utilization = serializers.FloatField(
        allow_null=True, help_text="Owning against the API; null: never"
    )
    cost_per_mtok = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True)
    cost_per_month = serializers.DecimalField(max_digits=20, decimal_places=2)
    rent_per_month = serializers.DecimalField(max_digits=20, decimal_places=2)
    savings_per_month = serializers.DecimalField(
        max_digits=20,
        decimal_places=2,
        help_text="Renting − owning; positive: owning would be cheaper",
    )
    curve = CurvePointSerializer(many=True)


class BreakevenSerializer(serializers.Serializer[Any]):
    """Documents the break-even answer. Rates (per hour, kWh, million tokens) carry six
    decimals; monthly amounts two. With ``comparison`` "rented" the pool is rented: the
    ``own_*`` figures, ``fixed_rate_per_hour``, ``breakeven_utilization`` and
    ``savings_per_month`` are then renting's, and ``owning_instead`` prices owning."""

    pool = serializers.CharField(
        allow_null=True, help_text="null: the whole fleet, every GPU not rented as one pool"
    )
    comparison = serializers.ChoiceField(
        choices=["owned", "rented"],
        help_text="owned: owning against the API (and renting on demand); rented: every "
        "capacity hour of the pool was rented, so renting against the API (and owning)",
    )
    gpus = serializers.IntegerField(help_text="GPUs with capacity in the window")
    owned_share = serializers.FloatField(
        help_text="Owned share of the capacity hours (scales PUE × price in C(u))"
    )
    currency = serializers.CharField()
    window_start = serializers.DateTimeField()
    window_end = serializers.DateTimeField()
    tokens_per_s = serializers.FloatField()
    tokens_per_s_source = serializers.ChoiceField(
        choices=["query", "measured", "fleet file"],
        help_text="Where tokens_per_s came from: the query; what the pool's training loops "
        "measured in the window (tokens per second of their time neither waiting for data "
        "nor checkpointing, gpufleet_hook); else the fleet file's (or the product's) default",
    )
    api_price_per_mtok = serializers.DecimalField(max_digits=20, decimal_places=6)
    fixed_rate_per_hour = serializers.DecimalField(max_digits=20, decimal_places=6)
    p_active_kw = serializers.FloatField()
    p_idle_kw = serializers.FloatField()
    pue = serializers.FloatField()
    price_per_kwh = serializers.DecimalField(max_digits=20, decimal_places=6)
    utilization = serializers.FloatField(allow_null=True)
    breakeven_utilization = serializers.FloatField(
        allow_null=True, help_text="null: owning never beats this API price"
    )
    own_cost_per_mtok = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True)
    own_cost_per_month = serializers.DecimalField(max_digits=20, decimal_places=2)
    api_cost_per_month = serializers.DecimalField(max_digits=20, decimal_places=2)
    savings_per_month = serializers.DecimalField(
        max_digits=20, decimal_places=2, help_text="API − own; positive: owning is cheaper"
    )
    rental_rate_per_hour = serializers.DecimalField(
        max_digits=20, decimal_places=6, allow_null=True
    )
    rent_breakeven_utilization = serializers.FloatField(
        allow_null=True, help_text="Owning against renting on demand; null for a rented pool"
    )
    curve = CurvePointSerializer(many=True)
    owning_instead = OwningInsteadSerializer(
        allow_null=True,
        help_text="A rented pool owned instead, at the fleet's own fixed rate and tariff for "
        "that GPU model; null for owned pools and where the fleet owns no GPU of the model",
    )


def _curve_data(curve: Iterable[tuple[float, Decimal]]) -> list[dict[str, Any]]:
    return [{"utilization": num(u), "own_cost_per_mtok": rate_str(cost)} for u, cost in curve]


def _owning_instead_data(instead: OwningInstead | None) -> dict[str, Any] | None:
    if instead is None:
        return None
    return {
        "models": list(instead.models),
        "gpus": instead.gpus,
        "fixed_rate_per_hour": rate_str(instead.fixed_rate_per_hour),
        "pue": num(float(instead.pue)),
        "price_per_kwh": rate_str(instead.price_per_kwh),
        "breakeven_utilization": num(instead.breakeven_utilization),
        "cost_per_mtok": rate_str(instead.cost_per_mtok),
        "cost_per_month": money_str(instead.cost_per_month),
        "rent_per_month": money_str(instead.rent_per_month),
        "savings_per_month": money_str(instead.savings_per_month),
        "curve": _curve_data(instead.curve),
    }


def breakeven_data(result: BreakevenResult, *, zone: ZoneInfo) -> dict[str, Any]:
    return {
        "pool": result.pool,
        "comparison": result.comparison,
        "gpus": result.gpus,
        "owned_share": num(result.owned_share),
        "currency": result.currency,
        "window_start": iso(result.window_start, zone),
        "window_end": iso(result.window_end, zone),
        "tokens_per_s": num(result.tokens_per_s),
        "api_price_per_mtok": rate_str(result.api_price_per_mtok),
        "fixed_rate_per_hour": rate_str(result.fixed_rate_per_hour),
        "p_active_kw": num(result.p_active_kw),
        "p_idle_kw": num(result.p_idle_kw),
        "pue": num(result.pue),
        "price_per_kwh": rate_str(result.price_per_kwh),
        "utilization": num(result.utilization),
        "breakeven_utilization": num(result.breakeven_utilization),
        "own_cost_per_mtok": rate_str(result.own_cost_per_mtok),
        "own_cost_per_month": money_str(result.own_cost_per_month),
        "api_cost_per_month": money_str(result.api_cost_per_month),
        "savings_per_month": money_str(result.savings_per_month),
        "rental_rate_per_hour": rate_str(result.rental_rate_per_hour),
        "rent_breakeven_utilization": num(result.rent_breakeven_utilization),
        "curve": _curve_data(result.curve),
        "owning_instead": _owning_instead_data(result.owning_instead),
    }


# --- Cost profiles -----------------------------------------------------------------------------


class CostProfileSerializer(serializers.ModelSerializer[CostProfile]):
    scope = serializers.CharField(read_only=True, help_text="kind:name, as in the fleet file")

    class Meta:
        model = CostProfile
        fields = [
            "id",
            "scope",
            "scope_kind",
            "scope_name",
            "kind",
            "purchase_price",
            "depreciation_years",
            "opex_per_hour",
            "rental_rate_per_hour",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def value(name: str) -> Any:
            if name in attrs:
                return attrs[name]
            if self.instance is not None:
                return getattr(self.instance, name)
            return CostProfile._meta.get_field(name).get_default()  # type: ignore[union-attr]

        if value("kind") == "owned" and value("depreciation_years") <= 0:
            raise serializers.ValidationError({"depreciation_years": ["must be > 0 when owned"]})
        scope_kind, scope_name = value("scope_kind"), value("scope_name")
        # A GPU may be priced before its agent first reports it; the other scopes must exist.
        scope_models: dict[str, tuple[Any, str]] = {
            "node": (Node, "hostname"),
            "pool": (Pool, "name"),
            "site": (Site, "name"),
        }
        if scope_kind in scope_models:
            model, field = scope_models[scope_kind]
            if not model.objects.filter(**{field: scope_name}).exists():
                raise serializers.ValidationError(
                    {"scope_name": [f"no {scope_kind} named {scope_name!r}"]}
                )
        return attrs
