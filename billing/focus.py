"""The FinOps FOCUS export (docs/finance.md): one row per GPU, day and charge.

A FOCUS file is what FinOps tools import beside cloud and SaaS bills. Each GPU-day becomes
charges that finance can sum with everything else:

- owned GPUs (and GPUs without a cost profile): a fixed charge (depreciation and opex, priced
  per GPU-hour of capacity) and an energy charge (priced per kWh at the site's tariff × PUE);
- rented GPUs: a rental charge per GPU-hour of capacity (energy is in the rate).

The money is the cost model's, per GPU, day and stored attribution (node, pool, team, site as
they were), through the same computation as the costs API, so a FOCUS file summed by
``ResourceId`` or by ``SubAccountName`` gives the API's per-GPU and per-team figures. Amounts
are written unrounded (``DECIMALS`` places), so the sum of a month matches the API's rounded
figure to the cent however many rows it has.

Versions: ``1.2`` (the default) and ``1.0``, each with exactly its own FOCUS columns (from
the specification's column lists), then the product's own columns, prefixed ``x_``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from billing import cost_model as cm
from billing.models import CostProfile
from billing.selectors.closing import adjustment_negligible, compute
from billing.selectors.costs import _accumulate
from billing.selectors.types import Filters, _Acc, _Segment
from fleet.models import Gpu, Team

VERSIONS = ("1.2", "1.0")
DEFAULT_VERSION = "1.2"

# Every column of FOCUS 1.0 and 1.2, in the specification's (alphabetical) order.
COLUMNS_1_0: tuple[str, ...] = (
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)
_ADDED_IN_1_2 = frozenset(
    {
        "BillingAccountType",
        "CapacityReservationId",
        "CapacityReservationStatus",
        "CommitmentDiscountQuantity",
        "CommitmentDiscountUnit",
        "InvoiceId",
        "PricingCurrency",
        "PricingCurrencyContractedUnitPrice",
        "PricingCurrencyEffectiveCost",
        "PricingCurrencyListUnitPrice",
        "ServiceSubcategory",
        "SkuMeter",
        "SkuPriceDetails",
        "SubAccountType",
    }
)
COLUMNS_1_2: tuple[str, ...] = tuple(sorted(set(COLUMNS_1_0) | _ADDED_IN_1_2))
# The product's own columns (FOCUS custom columns), after the FOCUS ones.
CUSTOM_COLUMNS: tuple[str, ...] = ("x_GpuModel", "x_IdleCost", "x_Priced")
COLUMNS = {"1.0": COLUMNS_1_0 + CUSTOM_COLUMNS, "1.2": COLUMNS_1_2 + CUSTOM_COLUMNS}

# Amounts and quantities are written with this many decimals. Six would not do: a thousand
# identical GPUs share each day's rounding error, and 60,000 rows of up to 0.5e-6 can move a
# month's sum by 3 cents; at ten the bound is 3e-6.
DECIMALS = 10
_QUANTUM = Decimal(1).scaleb(-DECIMALS)

PROVIDER = "gpufleet"
BILLING_ACCOUNT_ID = "gpufleet"
BILLING_ACCOUNT_NAME = "GPU fleet"
SERVICE_NAME = "GPU fleet"
SERVICE_CATEGORY = "AI and Machine Learning"
SERVICE_SUBCATEGORY = "AI Platforms"
GPU_HOURS = "GPU-Hours"
KWH = "kWh"

# A correction below this is the same money split into other segments (28-digit Decimal
# sums taken in another order), not a change: no row. Far below the file's ten decimals.
_NEGLIGIBLE_MONEY = Decimal("1e-12")

FIXED = "fixed"  # an owned GPU's depreciation and opex (or 0 without a cost profile)
ENERGY = "energy"
RENTAL = "rental"
CHARGE_ORDER = {FIXED: 0, RENTAL: 0, ENERGY: 1}


@dataclass(frozen=True)
class FocusCharge:
    """One FOCUS row: one GPU, one local day, one attribution, one charge."""

    period_start: dt.datetime  # UTC
    period_end: dt.datetime
    billing_start: dt.datetime  # the month of the charge, UTC
    billing_end: dt.datetime
    charge: str  # FIXED | ENERGY | RENTAL
    gpu_uuid: str
    resource_name: str  # "host#index" as attributed that day
    model: str
    node: str | None
    pool: str | None
    team: str | None
    cost_center: str | None
    site: str | None
    pricing_quantity: Decimal  # capacity hours, or kWh
    unit_price: Decimal
    cost: Decimal
    consumed_quantity: Decimal  # air hours, or kWh
    idle_cost: Decimal
    priced: bool
    sku_price_scope: str  # the cost profile's scope ("pool:training"), or "site:NAME"
    currency: str
    adjusts: dt.date | None = None  # late data: the closed day this corrects


def _month_chunks(start: dt.date, end: dt.date) -> Iterator[tuple[dt.date, dt.date]]:
    """[start, end) cut at the first of each month: each computed alone, one month's rows in
    memory at a time (a month of 1,000 GPUs is ~60,000 rows)."""
    cursor = start
    while cursor < end:
        edge = (cursor.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
        yield cursor, min(edge, end)
        cursor = min(edge, end)


def _month_bounds(day: dt.date, zone: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    first = day.replace(day=1)
    after = (first + dt.timedelta(days=32)).replace(day=1)
    return (
        dt.datetime.combine(first, dt.time(), tzinfo=zone).astimezone(dt.UTC),
        dt.datetime.combine(after, dt.time(), tzinfo=zone).astimezone(dt.UTC),
    )


def _day_bounds(day: dt.date, zone: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    return (
        dt.datetime.combine(day, dt.time(), tzinfo=zone).astimezone(dt.UTC),
        dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=zone).astimezone(dt.UTC),
    )


def _profile_scopes() -> dict[str, str]:
    """Per GPU UUID, the scope of the cost profile it is priced by now (its SKU price)."""
    profiles = {(p.scope_kind, p.scope_name): p.scope for p in CostProfile.objects.all()}
    out: dict[str, str] = {}
    rows = Gpu.objects.values_list(
        "uuid", "node__hostname", "node__pool__name", "node__site__name", "node__pool__site__name"
    )
    for uuid, hostname, pool, node_site, pool_site in rows:
        found = cm.cost_profile_resolve(
            profiles=profiles,
            gpu_uuid=uuid,
            hostname=hostname,
            pool_name=pool,
            site_name=node_site or pool_site,
        )
        out[uuid] = found or "none"
    return out


def focus_charges(
    *, start: dt.date, end: dt.date, now: dt.datetime | None = None
) -> Iterator[FocusCharge]:
    """The charges of [start, end) (local days of the report time zone), ordered by day, GPU
    and charge; computed a month at a time. Raises ValueError naming a bad argument."""
    if end <= start:
        raise ValueError("end: must be after start")
    cost_centers = dict(Team.objects.values_list("id", "cost_center"))
    scopes = _profile_scopes()
    for chunk_start, chunk_end in _month_chunks(start, end):
        yield from _chunk_charges(
            start=chunk_start, end=chunk_end, now=now, cost_centers=cost_centers, scopes=scopes
        )


def _chunk_charges(
    *,
    start: dt.date,
    end: dt.date,
    now: dt.datetime | None,
    cost_centers: dict[int, str],
    scopes: dict[str, str],
) -> list[FocusCharge]:
    computation = compute(start=start, end=end, period="day", filters=Filters(), now=now)
    names = computation.names
    # Per GPU, day, stored attribution (and, for late data of a closed month, the day it
    # adjusts): the segments' hours and money summed by the selectors' own accumulator, so
    # every figure is the costs API's. Idle energy is priced per segment, at the terms the
    # accumulator used, to split idle cost between the fixed and the energy charge.
    groups: dict[tuple[Any, ...], tuple[_Segment, _Acc, list[Decimal]]] = {}
    for segment in computation.segments:
        ident = (
            segment.bucket.key,
            segment.gpu.id,
            segment.node_id,
            segment.pool_id,
            segment.team_id,
            segment.site_id,
            segment.adjusts,
        )
        entry = groups.get(ident)
        if entry is None:
            entry = groups[ident] = (segment, _Acc(), [Decimal(0)])
        _accumulate(entry[1], segment, names)
        site = segment.site_terms or names.site(segment.site_id)
        entry[2][0] += cm.energy_cost(
            kind=segment.gpu.kind,
            energy_kwh=cm.kwh_from_joules(energy_j=segment.sums["idle_energy_j"]),
            pue=site.pue,
            price_per_kwh=site.price_per_kwh,
        )
    out: list[FocusCharge] = []
    months: dict[dt.date, tuple[dt.datetime, dt.datetime]] = {}
    zone = computation.zone
    for (day, *_), (segment, acc, (energy_idle,)) in groups.items():
        adjusts = segment.adjusts
        if adjusts is None and acc.capacity_h <= 0 and acc.energy_kwh <= 0:
            continue
        if adjusts is not None and adjustment_negligible(acc):
            continue
        gpu = segment.gpu
        bounds = months.get(day.replace(day=1))
        if bounds is None:
            bounds = months[day.replace(day=1)] = _month_bounds(day, zone)
        site = segment.site_terms or names.site(segment.site_id)
        hostname = names.nodes.get(segment.node_id or 0)
        index = gpu.label.rpartition("#")[2] if "#" in gpu.label else None
        period = (segment.bucket.start, segment.bucket.end)
        if adjusts is not None:  # the charge period is the day corrected
            period = _day_bounds(adjusts, zone)
        common: dict[str, Any] = {
            "period_start": period[0],
            "period_end": period[1],
            "billing_start": bounds[0],
            "billing_end": bounds[1],
            "gpu_uuid": gpu.uuid,
            "resource_name": f"{hostname}#{index}" if hostname and index else gpu.label,
            "model": gpu.model_key,
            "node": hostname,
            "pool": names.pools.get(segment.pool_id or 0),
            "team": names.teams.get(segment.team_id or 0),
            "cost_center": cost_centers.get(segment.team_id or 0) or None,
            "site": site.name,
            "priced": acc.priced,
            "currency": computation.currency,
            "adjusts": adjusts,
        }
        air_h = cm.hours_from_seconds(seconds=acc.sums["air_s"])
        rented = gpu.kind == cm.RENTED
        if adjusts is None or abs(acc.fixed_cost) >= _NEGLIGIBLE_MONEY:
            out.append(
                FocusCharge(
                    charge=RENTAL if rented else FIXED,
                    pricing_quantity=acc.capacity_h,
                    unit_price=cm.mean_rate_per_hour(
                        fixed_cost=acc.fixed_cost, capacity_hours=acc.capacity_h
                    ),
                    cost=acc.fixed_cost,
                    consumed_quantity=air_h,
                    idle_cost=acc.idle_cost - energy_idle,
                    sku_price_scope=scopes.get(gpu.uuid, "none"),
                    **common,
                )
            )
        if adjusts is not None:
            energy_charged = abs(acc.energy_cost) >= _NEGLIGIBLE_MONEY
        else:
            energy_charged = acc.energy_kwh > 0
        if not rented and energy_charged:
            out.append(
                FocusCharge(
                    charge=ENERGY,
                    pricing_quantity=acc.energy_kwh,
                    unit_price=cm.to_decimal(site.pue) * cm.to_decimal(site.price_per_kwh),
                    cost=acc.energy_cost,
                    consumed_quantity=acc.energy_kwh,
                    idle_cost=energy_idle,
                    sku_price_scope=f"site:{site.name}" if site.name else "none",
                    **common,
                )
            )
    out.sort(
        key=lambda c: (
            c.adjusts is not None,
            c.period_start,
            c.gpu_uuid,
            CHARGE_ORDER[c.charge],
            c.team or "",
        )
    )
    return out


# --- formatting -----------------------------------------------------------------------------
def decimal_text(value: Decimal) -> str:
    """A FOCUS decimal: fixed point, always with a decimal point, ``DECIMALS`` places."""
    return format(value.quantize(_QUANTUM, rounding=ROUND_HALF_UP), "f")


def utc_text(moment: dt.datetime) -> str:
    """FOCUS date/time: ISO 8601 in UTC, ``YYYY-MM-DDTHH:mm:ssZ``."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_DESCRIPTIONS = {
    FIXED: "Depreciation and opex of GPU {name}",
    RENTAL: "Rental of GPU {name}",
    ENERGY: "Energy of GPU {name} at the site's tariff × PUE",
}
_SKU = {FIXED: "gpu-hours:owned", RENTAL: "gpu-hours:rented", ENERGY: "energy"}


def focus_row(charge: FocusCharge, *, version: str) -> dict[str, Any]:
    """One charge as the cells of a FOCUS row of ``version`` (None: an empty, null cell)."""
    cost = decimal_text(charge.cost)
    price = decimal_text(charge.unit_price)
    energy = charge.charge == ENERGY
    unit = KWH if energy else GPU_HOURS
    unpriced = charge.charge == FIXED and charge.sku_price_scope == "none"
    sku_kind = "gpu-hours:unpriced" if unpriced else _SKU[charge.charge]
    sku = f"{sku_kind}:{charge.model or 'unknown'}"
    tags = {
        "team": charge.team,
        "pool": charge.pool,
        "site": charge.site,
        "cost_center": charge.cost_center,
        "node": charge.node,
        "model": charge.model or None,
    }
    row: dict[str, Any] = {
        "AvailabilityZone": None,
        "BilledCost": cost,
        "BillingAccountId": BILLING_ACCOUNT_ID,
        "BillingAccountName": BILLING_ACCOUNT_NAME,
        "BillingAccountType": "Billing Account",
        "BillingCurrency": charge.currency,
        "BillingPeriodEnd": utc_text(charge.billing_end),
        "BillingPeriodStart": utc_text(charge.billing_start),
        "CapacityReservationId": None,
        "CapacityReservationStatus": None,
        "ChargeCategory": "Usage",
        "ChargeClass": None,
        "ChargeDescription": _DESCRIPTIONS[charge.charge].format(name=charge.resource_name),
        "ChargeFrequency": "Usage-Based" if energy else "Recurring",
        "ChargePeriodEnd": utc_text(charge.period_end),
        "ChargePeriodStart": utc_text(charge.period_start),
        "CommitmentDiscountCategory": None,
        "CommitmentDiscountId": None,
        "CommitmentDiscountName": None,
        "CommitmentDiscountQuantity": None,
        "CommitmentDiscountStatus": None,
        "CommitmentDiscountType": None,
        "CommitmentDiscountUnit": None,
        "ConsumedQuantity": decimal_text(charge.consumed_quantity),
        "ConsumedUnit": unit,
        "ContractedCost": cost,
        "ContractedUnitPrice": price,
        "EffectiveCost": cost,
        "InvoiceId": None,
        "InvoiceIssuerName": PROVIDER,
        "ListCost": cost,
        "ListUnitPrice": price,
        "PricingCategory": "Standard",
        "PricingCurrency": charge.currency,
        "PricingCurrencyContractedUnitPrice": price,
        "PricingCurrencyEffectiveCost": cost,
        "PricingCurrencyListUnitPrice": price,
        "PricingQuantity": decimal_text(charge.pricing_quantity),
        "PricingUnit": unit,
        "ProviderName": PROVIDER,
        "PublisherName": PROVIDER,
        "RegionId": charge.site,
        "RegionName": charge.site,
        "ResourceId": charge.gpu_uuid,
        "ResourceName": charge.resource_name,
        "ResourceType": "GPU",
        "ServiceCategory": SERVICE_CATEGORY,
        "ServiceName": SERVICE_NAME,
        "ServiceSubcategory": SERVICE_SUBCATEGORY,
        "SkuId": sku,
        "SkuMeter": "Energy" if energy else "GPU Hours",
        "SkuPriceDetails": None,
        "SkuPriceId": f"{sku}:{charge.sku_price_scope}",
        "SubAccountId": charge.team,
        "SubAccountName": charge.team,
        "SubAccountType": "Team" if charge.team else None,
        "Tags": json.dumps(tags, sort_keys=True, ensure_ascii=False),
        "x_GpuModel": charge.model or None,
        "x_IdleCost": decimal_text(charge.idle_cost),
        "x_Priced": charge.priced,
    }
    if charge.adjusts is not None:
        # Late data for a closed day, booked in this billing period: a correction of that
        # day's charge, with no quantities or prices of its own (FOCUS allows them null on
        # a correction; the costs agree with BilledCost).
        row.update(dict.fromkeys(_NOT_ON_CORRECTIONS))
        row["ChargeCategory"] = "Adjustment"
        row["ChargeClass"] = "Correction"
        row["ChargeDescription"] = (
            f"Late data for {charge.adjusts:%Y-%m-%d}, a closed day: "
            + _DESCRIPTIONS[charge.charge].format(name=charge.resource_name)
        )
    return {column: row[column] for column in COLUMNS[version]}


_NOT_ON_CORRECTIONS = (
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedUnitPrice",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "SkuId",
    "SkuMeter",
    "SkuPriceId",
)
