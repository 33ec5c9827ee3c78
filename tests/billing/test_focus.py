"""GET /api/v1/focus: the FinOps FOCUS export, by hand and against the costs API.

Independent paths: the worked example of docs/metrics.md worked out by hand; the costs API's
rounded figures (per GPU and day, per team) against sums of the file's unrounded amounts; the
FOCUS specification's column lists and rules, written out here from the specification
(1.2 and 1.0); and, for 1.0, the FinOps Foundation's own validator where it is installed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from billing.cost_model import money_round
from tests.billing.conftest import at, day_query
from tests.conftest import service_missing

FOCUS = "/api/v1/focus"
COSTS = "/api/v1/costs"

# FOCUS 1.2, from the specification's column definitions: column → (feature level, nulls
# allowed, data type). M mandatory, C conditional, R recommended.
SPEC_1_2: dict[str, tuple[str, bool, str]] = {
    "AvailabilityZone": ("R", True, "String"),
    "BilledCost": ("M", False, "Decimal"),
    "BillingAccountId": ("M", False, "String"),
    "BillingAccountName": ("M", True, "String"),
    "BillingAccountType": ("C", False, "String"),
    "BillingCurrency": ("M", False, "String"),
    "BillingPeriodEnd": ("M", False, "DateTime"),
    "BillingPeriodStart": ("M", False, "DateTime"),
    "CapacityReservationId": ("C", True, "String"),
    "CapacityReservationStatus": ("C", True, "String"),
    "ChargeCategory": ("M", False, "String"),
    "ChargeClass": ("M", True, "String"),
    "ChargeDescription": ("M", True, "String"),
    "ChargeFrequency": ("R", False, "String"),
    "ChargePeriodEnd": ("M", False, "DateTime"),
    "ChargePeriodStart": ("M", False, "DateTime"),
    "CommitmentDiscountCategory": ("C", True, "String"),
    "CommitmentDiscountId": ("C", True, "String"),
    "CommitmentDiscountName": ("C", True, "String"),
    "CommitmentDiscountQuantity": ("C", True, "Decimal"),
    "CommitmentDiscountStatus": ("C", True, "String"),
    "CommitmentDiscountType": ("C", True, "String"),
    "CommitmentDiscountUnit": ("C", True, "String"),
    "ConsumedQuantity": ("C", True, "Decimal"),
    "ConsumedUnit": ("C", True, "String"),
    "ContractedCost": ("M", False, "Decimal"),
    "ContractedUnitPrice": ("C", True, "Decimal"),
    "EffectiveCost": ("M", False, "Decimal"),
    "InvoiceId": ("R", True, "String"),
    "InvoiceIssuerName": ("M", False, "String"),
    "ListCost": ("M", False, "Decimal"),
    "ListUnitPrice": ("C", True, "Decimal"),
    "PricingCategory": ("C", True, "String"),
    "PricingCurrency": ("C", True, "String"),
    "PricingCurrencyContractedUnitPrice": ("C", True, "Decimal"),
    "PricingCurrencyEffectiveCost": ("C", True, "Decimal"),
    "PricingCurrencyListUnitPrice": ("C", True, "Decimal"),
    "PricingQuantity": ("M", True, "Decimal"),
    "PricingUnit": ("M", True, "String"),
    "ProviderName": ("M", False, "String"),
    "PublisherName": ("M", False, "String"),
    "RegionId": ("C", True, "String"),
    "RegionName": ("C", True, "String"),
    "ResourceId": ("C", True, "String"),
    "ResourceName": ("C", True, "String"),
    "ResourceType": ("C", True, "String"),
    "ServiceCategory": ("M", False, "String"),
    "ServiceName": ("M", False, "String"),
    "ServiceSubcategory": ("R", False, "String"),
    "SkuId": ("C", True, "String"),
    "SkuMeter": ("C", True, "String"),
    "SkuPriceDetails": ("C", True, "JSON"),
    "SkuPriceId": ("C", True, "String"),
    "SubAccountId": ("C", True, "String"),
    "SubAccountName": ("C", True, "String"),
    "SubAccountType": ("C", True, "String"),
    "Tags": ("C", True, "JSON"),
}
# FOCUS 1.0 has these columns of 1.2 (the others came in 1.1 and 1.2), with the same rules.
ONLY_1_2 = {
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
SPEC = {
    "1.2": SPEC_1_2,
    "1.0": {c: rule for c, rule in SPEC_1_2.items() if c not in ONLY_1_2},
}
CHARGE_CATEGORIES = {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}
CHARGE_FREQUENCIES = {"One-Time", "Recurring", "Usage-Based"}
PRICING_CATEGORIES = {"Standard", "Dynamic", "Committed", "Other"}
AI_SUBCATEGORIES = {
    "AI Platforms",
    "Bots",
    "Generative AI",
    "Machine Learning",
    "Natural Language Processing",
    "Other (AI and Machine Learning)",
}
UTC_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
DECIMAL = re.compile(r"^-?\d+\.\d+$")  # always with a decimal point, never an exponent


def read(response: Any) -> tuple[list[str], list[dict[str, str]]]:
    assert response.status_code == 200, getattr(response, "content", b"")[:500]
    assert response["Content-Type"].startswith("text/csv")
    text = b"".join(response.streaming_content).decode()
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def number(text: str) -> Decimal | None:
    try:
        return Decimal(text) if text else None
    except ArithmeticError:
        return None


def focus_spec_problems(header: list[str], rows: list[dict[str, str]], version: str) -> list[str]:
    """Every rule of the FOCUS specification the file breaks (an empty list: none)."""
    spec = SPEC[version]
    problems: list[str] = []
    focus_columns = [c for c in header if not c.startswith("x_")]
    if set(focus_columns) != set(spec):
        problems.append(f"columns: {sorted(set(focus_columns) ^ set(spec))}")
    if header[: len(focus_columns)] != focus_columns:
        problems.append("custom columns must come after the FOCUS columns")
    for n, row in enumerate(rows):
        for column, (_level, nulls, kind) in spec.items():
            value = row.get(column, "")
            if value == "":
                if not nulls:
                    problems.append(f"row {n}: {column} is null")
                continue
            if kind == "Decimal" and not DECIMAL.match(value):
                problems.append(f"row {n}: {column} {value!r} is not a decimal")
            if kind == "DateTime" and not UTC_TIME.match(value):
                problems.append(f"row {n}: {column} {value!r} is not UTC ISO 8601")
            if kind == "JSON" and not isinstance(json.loads(value), dict):
                problems.append(f"row {n}: {column} is not a JSON object")
        category = row["ChargeCategory"]
        if category not in CHARGE_CATEGORIES:
            problems.append(f"row {n}: ChargeCategory {category!r}")
        if row["ChargeFrequency"] not in CHARGE_FREQUENCIES:
            problems.append(f"row {n}: ChargeFrequency {row['ChargeFrequency']!r}")
        if row["ChargeClass"] not in ("", "Correction"):
            problems.append(f"row {n}: ChargeClass {row['ChargeClass']!r}")
        if row["ServiceCategory"] == "AI and Machine Learning" and version == "1.2":
            if row["ServiceSubcategory"] not in AI_SUBCATEGORIES:
                problems.append(f"row {n}: ServiceSubcategory {row['ServiceSubcategory']!r}")
        if row["PricingCategory"] and row["PricingCategory"] not in PRICING_CATEGORIES:
            problems.append(f"row {n}: PricingCategory {row['PricingCategory']!r}")
        # Nulls that go together.
        for value, unit in (
            ("ConsumedQuantity", "ConsumedUnit"),
            ("PricingQuantity", "PricingUnit"),
        ):
            if (row[value] == "") != (row[unit] == ""):
                problems.append(f"row {n}: {value} and {unit} must be null together")
        if (row["RegionId"] == "") != (row["RegionName"] == ""):
            problems.append(f"row {n}: RegionName null iff RegionId null")
        if (row["SubAccountId"] == "") != (row["SubAccountName"] == ""):
            problems.append(f"row {n}: SubAccountName null iff SubAccountId null")
        if row["ResourceId"] and not row["ResourceType"]:
            problems.append(f"row {n}: ResourceType null with a ResourceId")
        usage = category in ("Usage", "Purchase") and row["ChargeClass"] != "Correction"
        if category == "Usage" and row["ChargeClass"] != "Correction":
            if row["ConsumedQuantity"] == "":
                problems.append(f"row {n}: ConsumedQuantity null on a usage row")
        if category != "Usage" and row["ConsumedQuantity"] != "":
            problems.append(f"row {n}: ConsumedQuantity set on a {category} row")
        for column in ("ListUnitPrice", "ContractedUnitPrice", "PricingQuantity", "SkuId"):
            if usage and row[column] == "":
                problems.append(f"row {n}: {column} null on a usage row")
        if usage and version == "1.2" and row["SkuPriceId"] == "":
            problems.append(f"row {n}: SkuPriceId null on a usage row")
        # Costs and unit prices agree: price × quantity = cost; without a price, = BilledCost.
        billed, quantity = number(row["BilledCost"]), number(row["PricingQuantity"])
        for cost_column, price_column in (
            ("ListCost", "ListUnitPrice"),
            ("ContractedCost", "ContractedUnitPrice"),
        ):
            cost, price = number(row[cost_column]), number(row[price_column])
            if price is not None and quantity is not None and row["ChargeClass"] == "":
                if cost is None or abs(price * quantity - cost) > Decimal("1e-6"):
                    problems.append(f"row {n}: {price_column} × PricingQuantity ≠ {cost_column}")
            elif price is None and cost != billed:
                problems.append(f"row {n}: {cost_column} ≠ BilledCost without a unit price")
        if row["EffectiveCost"] != row["BilledCost"]:
            problems.append(f"row {n}: EffectiveCost ≠ BilledCost (no commitments here)")
        if not row["ChargePeriodStart"] < row["ChargePeriodEnd"]:
            problems.append(f"row {n}: charge period not [start, end)")
        if row["ChargeClass"] != "Correction" and not (
            row["BillingPeriodStart"] <= row["ChargePeriodStart"]
            and row["ChargePeriodEnd"] <= row["BillingPeriodEnd"]
        ):
            problems.append(f"row {n}: charge period outside its billing period")
        tags = json.loads(row["Tags"])
        missing = {"team", "pool", "site", "cost_center"} - tags.keys()
        if missing:
            problems.append(f"row {n}: Tags lacks {sorted(missing)}")
    return problems


# --- the worked example, by hand ---------------------------------------------------------------
@pytest.mark.smoke
def test_focus_rows_equal_the_worked_example(worked_example: Any, finance: Any) -> None:
    from fleet.models import Team

    Team.objects.filter(name="research").update(cost_center="CC-4100")
    header, rows = read(finance.get(FOCUS, day_query()))
    assert header[-3:] == ["x_GpuModel", "x_IdleCost", "x_Priced"]
    fixed, energy = rows
    # Fixed: 24 capacity hours at 30,000 / 43,830 + 0.10 = 0.78446269678302… per GPU-hour:
    # 18.8271047227926… (the API's 18.83); 9 air hours consumed; idle 15 h × the rate.
    assert fixed["ChargeCategory"] == "Usage" and fixed["ChargeClass"] == ""
    assert fixed["ChargeFrequency"] == "Recurring"
    assert fixed["PricingUnit"] == "GPU-Hours" and fixed["PricingQuantity"] == "24.0000000000"
    assert fixed["ListUnitPrice"] == fixed["ContractedUnitPrice"] == "0.7844626968"
    for column in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost"):
        assert fixed[column] == "18.8271047228", column
    assert fixed["ConsumedQuantity"] == "9.0000000000" and fixed["ConsumedUnit"] == "GPU-Hours"
    assert fixed["x_IdleCost"] == "11.7669404517"  # 15 × 0.78446269678302…
    # Energy: 4.95 kWh at 0.20 × PUE 1.5 = 0.30 per kWh: 1.485 (the API's 1.49, half-up);
    # idle 0.95 kWh × 0.30 = 0.285.
    assert energy["ChargeFrequency"] == "Usage-Based"
    assert energy["PricingUnit"] == energy["ConsumedUnit"] == "kWh"
    assert energy["PricingQuantity"] == energy["ConsumedQuantity"] == "4.9500000000"
    assert energy["ListUnitPrice"] == "0.3000000000"
    assert energy["BilledCost"] == energy["EffectiveCost"] == "1.4850000000"
    assert energy["x_IdleCost"] == "0.2850000000"
    for row in rows:
        assert row["ResourceId"] == "GPU-example" and row["ResourceName"] == "gpu-07#0"
        assert row["ResourceType"] == "GPU"
        assert row["ChargePeriodStart"] == "2026-03-02T00:00:00Z"
        assert row["ChargePeriodEnd"] == "2026-03-03T00:00:00Z"
        assert row["BillingPeriodStart"] == "2026-03-01T00:00:00Z"
        assert row["BillingPeriodEnd"] == "2026-04-01T00:00:00Z"
        assert row["RegionId"] == row["RegionName"] == "fra1"
        assert row["SubAccountId"] == row["SubAccountName"] == "research"
        assert row["SubAccountType"] == "Team"
        assert row["ServiceCategory"] == "AI and Machine Learning"
        assert row["BillingCurrency"] == row["PricingCurrency"] == "USD"
        assert json.loads(row["Tags"]) == {
            "team": "research",
            "pool": "inference",
            "site": "fra1",
            "cost_center": "CC-4100",
            "node": "gpu-07",
            "model": None,
        }
        assert row["x_Priced"] == "true"
    assert fixed["SkuPriceId"] == "gpu-hours:owned:unknown:pool:inference"
    assert energy["SkuPriceId"] == "energy:unknown:site:fra1"
    assert focus_spec_problems(header, rows, "1.2") == []


def test_focus_times_are_utc_for_a_zone_east_of_utc(
    worked_example: Any, fleet: Any, finance: Any
) -> None:
    """Days are local days of the report time zone, written in UTC: Berlin's 2 March (UTC+1
    in winter) is [1 March 23:00Z, 2 March 23:00Z); its month starts 28 February 23:00Z."""
    fleet.settings(report_time_zone="Europe/Berlin")
    _, rows = read(finance.get(FOCUS, day_query()))
    assert {r["ChargePeriodStart"] for r in rows} == {"2026-03-01T23:00:00Z"}
    assert {r["ChargePeriodEnd"] for r in rows} == {"2026-03-02T23:00:00Z"}
    assert {r["BillingPeriodStart"] for r in rows} == {"2026-02-28T23:00:00Z"}
    assert {r["BillingPeriodEnd"] for r in rows} == {"2026-03-31T22:00:00Z"}  # summer time


# --- sums against the costs API ----------------------------------------------------------------
@pytest.fixture
def mixed_fleet(worked_example: Any, fleet: Any) -> Any:
    """Beside the worked example: a rented GPU (2.35/h) whose node moved from one team's pool
    to another's at 12:00 on 3 March, a GPU with no cost profile, and an owned GPU whose
    depreciation (one year, 8,766 h) ends at 06:00 on 4 March, over 2–5 March."""
    site = worked_example.node.pool.site
    other_site = fleet.site("ams2", pue="1.2", price_per_kwh="0.31", grid_g_per_kwh=300.0)
    vision, nlp = fleet.team("vision"), fleet.team("nlp")
    pool_a = fleet.pool("train-a", site=other_site, team=vision)
    pool_b = fleet.pool("train-b", site=other_site, team=nlp)
    rented_node = fleet.node("rent-01", pool=pool_b)
    rented = fleet.gpu("GPU-rented", node=rented_node, index=3, in_service_at=at("2026-03-01T00"))
    fleet.rented("node:rent-01", rental_rate_per_hour="2.35")
    bare = fleet.gpu(
        "GPU-bare", node=fleet.node("bare-01", site=site), in_service_at=at("2026-03-02T08")
    )
    old_node = fleet.node("old-01", pool=pool_a)
    old = fleet.gpu("GPU-old", node=old_node, index=1, in_service_at=at("2025-03-04T00"))
    fleet.owned("gpu:GPU-old", purchase_price="8766.00", depreciation_years="1", opex_per_hour="0")
    rows = []
    for day in (2, 3, 4):
        for hour in range(0, 24, 2):
            moment = at(f"2026-03-{day:02d}T{hour:02d}")
            before_move = moment < at("2026-03-03T12")
            rows.append(
                fleet.usage(
                    rented,
                    moment,
                    samples=60,
                    observed_s=3600,
                    air_s=1800 + 60 * hour,
                    held_s=1800 - 60 * hour,
                    energy_j=1_800_000,
                    node=rented_node,
                    pool=pool_a if before_move else pool_b,
                    team=vision if before_move else nlp,
                    site=other_site,
                )
            )
            rows.append(
                fleet.usage(
                    bare, moment, samples=60, observed_s=3600, air_s=900.5, energy_j=700_001
                )
            )
            rows.append(
                fleet.usage(
                    old,
                    moment,
                    samples=60,
                    observed_s=3600,
                    air_s=3000,
                    parked_s=600,
                    energy_j=2_000_000,
                    idle_energy_j=300_000,
                )
            )
    fleet.save(rows)
    return worked_example


def _money(text: str) -> Decimal:
    return Decimal(text)


def test_focus_sums_equal_the_costs_api_to_the_cent(mixed_fleet: Any, finance: Any) -> None:
    query = {"start": "2026-03-02", "end": "2026-03-05"}
    header, rows = read(finance.get(FOCUS, query))
    assert focus_spec_problems(header, rows, "1.2") == []
    # The example: 2 rows on its day, then 1 a day (offline: no energy); GPU-old and GPU-bare
    # 2 a day; GPU-rented 1 a day, 2 on 2 March (its offline hours go to its current team,
    # nlp) and on 3 March (the move).
    assert len(rows) == (2 + 1 + 1) + 3 * 2 + 3 * 2 + (2 + 2 + 1)
    per_gpu_day: dict[tuple[str, str], dict[str, Decimal]] = defaultdict(
        lambda: defaultdict(Decimal)
    )
    per_team: dict[str, Decimal] = defaultdict(Decimal)
    per_team_idle: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        key = (row["ResourceId"], row["ChargePeriodStart"][:10])
        charge = "energy_cost" if row["PricingUnit"] == "kWh" else "fixed_cost"
        per_gpu_day[key][charge] += _money(row["BilledCost"])
        per_gpu_day[key]["idle_cost"] += _money(row["x_IdleCost"])
        per_team[row["SubAccountName"]] += _money(row["BilledCost"])
        per_team_idle[row["SubAccountName"]] += _money(row["x_IdleCost"])
    api = finance.get(COSTS, {**query, "group_by": "gpu", "period": "day", "limit": 100}).json()
    assert len(api["results"]) == len(per_gpu_day) == 4 * 3 and api["next"] is None
    for api_row in api["results"]:
        mine = per_gpu_day[(api_row["key"], api_row["period_start"][:10])]
        for field in ("fixed_cost", "energy_cost", "idle_cost"):
            assert str(money_round(mine[field])) == api_row[field], (api_row["key"], field)
        total = money_round(mine["fixed_cost"] + mine["energy_cost"])
        assert str(total) == api_row["total_cost"]
    teams = finance.get(COSTS, {**query, "group_by": "team", "period": "all"}).json()
    # The GPU with no team: an empty SubAccountName, the API's key "" ("(none)").
    assert (
        {r["key"] for r in teams["results"]} == set(per_team) == {"", "research", "vision", "nlp"}
    )
    for api_row in teams["results"]:
        assert str(money_round(per_team[api_row["key"]])) == api_row["total_cost"]
        assert str(money_round(per_team_idle[api_row["key"]])) == api_row["idle_cost"]
    # The rented GPU's day of the move is two rows (one per team); its energy costs nothing.
    moved = [
        r for r in rows if r["ResourceId"] == "GPU-rented" and "03-03" in r["ChargePeriodStart"]
    ]
    assert sorted(r["SubAccountName"] for r in moved) == ["nlp", "vision"]
    assert all(r["PricingUnit"] == "GPU-Hours" for r in moved)
    # Before 12:00, 6 hours observed for vision; after it 6 observed and the 12 offline
    # (no rollup: the current team) for nlp: at 2.35/h, 14.10 and 42.30.
    assert [(r["SubAccountName"], r["BilledCost"]) for r in moved] == [
        ("nlp", "42.3000000000"),
        ("vision", "14.1000000000"),
    ]
    # The GPU with no cost profile: a fixed charge of 0, marked unpriced.
    bare = [r for r in rows if r["ResourceId"] == "GPU-bare" and r["PricingUnit"] != "kWh"]
    assert {r["BilledCost"] for r in bare} == {"0.0000000000"}
    assert {r["x_Priced"] for r in bare} == {"false"}
    assert {r["SkuId"] for r in bare} == {"gpu-hours:unpriced:unknown"}


def test_focus_depreciation_end_day_is_priced_pro_rata(mixed_fleet: Any, finance: Any) -> None:
    """GPU-old: 8,766.00 over one year = 1.00/h until 06:00 on 4 March, then opex 0: that day
    costs 6 hours × 1.00 = 6.00 for 24 GPU-hours, a unit price of 0.25."""
    _, rows = read(finance.get(FOCUS, {"start": "2026-03-04", "end": "2026-03-05"}))
    (fixed,) = [r for r in rows if r["ResourceId"] == "GPU-old" and r["PricingUnit"] != "kWh"]
    assert fixed["BilledCost"] == "6.0000000000"
    assert fixed["PricingQuantity"] == "24.0000000000"
    assert fixed["ListUnitPrice"] == "0.2500000000"


# --- versions, columns, validators ---------------------------------------------------------------
def test_focus_1_0_has_exactly_the_1_0_columns(mixed_fleet: Any, finance: Any) -> None:
    header, rows = read(
        finance.get(FOCUS, {"start": "2026-03-02", "end": "2026-03-05", "version": "1.0"})
    )
    assert [c for c in header if not c.startswith("x_")] == sorted(SPEC["1.0"])
    assert focus_spec_problems(header, rows, "1.0") == []
    header_12, rows_12 = read(finance.get(FOCUS, {"start": "2026-03-02", "end": "2026-03-05"}))
    assert [c for c in header_12 if not c.startswith("x_")] == sorted(SPEC["1.2"])
    # The same charges either way: only the columns differ.
    assert [r["BilledCost"] for r in rows] == [r["BilledCost"] for r in rows_12]


def test_focus_empty_range_is_a_header_only_file(db: Any, finance: Any) -> None:
    header, rows = read(finance.get(FOCUS, {"start": "2026-01-01", "end": "2026-02-01"}))
    assert rows == [] and header[0] == "AvailabilityZone"


def test_focus_spec_check_catches_a_broken_file(worked_example: Any, finance: Any) -> None:
    """The spec check itself can fail: a null BilledCost, a price that does not match, an
    exponent, a local time."""
    header, rows = read(finance.get(FOCUS, day_query()))
    broken = [dict(r) for r in rows]
    broken[0]["BilledCost"] = ""
    broken[1]["ListUnitPrice"] = "0.4000000000"
    broken[1]["PricingQuantity"] = "4.95E0"
    broken[1]["ChargePeriodStart"] = "2026-03-02T01:00:00+01:00"
    problems = focus_spec_problems(header, broken, "1.2")
    assert any("BilledCost is null" in p for p in problems)
    assert any("ListUnitPrice × PricingQuantity" in p for p in problems)
    assert any("PricingQuantity '4.95E0' is not a decimal" in p for p in problems)
    assert any("ChargePeriodStart" in p for p in problems)


# Rules of focus-validator 1.0.0's "1.0" set that FOCUS 1.0 itself contradicts, skipped with
# its override file (nothing else is): four check for pre-1.0 column names (FOCUS 1.0 renamed
# InvoiceIssuer, Provider and Publisher to ...Name and spells ResourceId so), and one reads a
# ChargeType column, which FOCUS 1.0 replaced by ChargeCategory.
KNOWN_VALIDATOR_DEFECTS = (
    "InvoiceIssuer_Required",
    "Provider_Required",
    "Publisher_Required",
    "ResourceID_Required",
    "SkuPriceId_Nullable",
)


def focus_validator(data: Path, overrides: Path) -> str:
    """Runs the FinOps Foundation's validator (``focus-validator`` 1.0.0 from PyPI, in its own
    environment: ``FOCUS_VALIDATOR`` names its executable; dev.py installs it) on ``data``
    for FOCUS 1.0; returns what it printed."""
    executable = os.environ.get("FOCUS_VALIDATOR") or shutil.which("focus-validator") or ""
    if not Path(executable).is_file():
        service_missing("focus-validator (FOCUS_VALIDATOR)")
    # It reads its rule files relative to the working directory: run it from its install.
    package = subprocess.run(
        [
            str(Path(executable).parent / "python"),
            "-c",
            "import focus_validator, os; print(os.path.dirname(focus_validator.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    command = [executable, "--data-file", str(data), "--validate-version", "1.0"]
    result = subprocess.run(
        [*command, "--override-file", str(overrides)],
        capture_output=True,
        text=True,
        cwd=Path(package).parent,
        timeout=300,
    )
    return result.stdout + result.stderr


def test_focus_1_0_passes_the_finops_focus_validator(
    mixed_fleet: Any, finance: Any, tmp_path: Path
) -> None:
    response = finance.get(FOCUS, {"start": "2026-03-02", "end": "2026-03-05", "version": "1.0"})
    text = b"".join(response.streaming_content).decode()
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(json.dumps({"overrides": list(KNOWN_VALIDATOR_DEFECTS)}))  # YAML ⊃ JSON
    data = tmp_path / "focus-1.0.csv"
    data.write_text(text)
    output = focus_validator(data, overrides)
    # It exits 0 either way: its verdict is its last line.
    assert "Validation succeeded." in output, output[-4000:]
    assert "Validation failed" not in output, output[-4000:]
    # And it does judge the file: a charge frequency FOCUS does not know fails it.
    data.write_text(text.replace(",Recurring,", ",Sometimes,", 1))
    output = focus_validator(data, overrides)
    assert "ChargeFrequency_Enum failed" in output and "Validation failed" in output, output


# --- permissions and bad input -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("role", "status"), [(None, 401), ("viewer", 403), ("finance", 200), ("admin", 200)]
)
def test_focus_permissions(role_client: Any, frozen: Any, role: str | None, status: int) -> None:
    response = role_client(role).get(FOCUS, day_query())
    assert response.status_code in ((status, 403) if role is None else (status,))
    if status != 200:
        assert "BilledCost" not in response.content.decode()


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"version": "2.0"}, "version"),
        ({"version": "1.1"}, "version"),
        ({"start": "2026-03-05", "end": "2026-03-02"}, "end"),
        ({"start": "2020-01-01", "end": "2026-03-02"}, "start"),
        ({"start": "2026-13-01", "end": "2026-03-02"}, "start"),
        ({"start": "2026-03-01", "end": "tomorrow"}, "end"),
    ],
)
def test_focus_bad_input_names_the_parameter(
    finance: Any, query: dict[str, str], field: str
) -> None:
    response = finance.get(FOCUS, {**day_query(), **query})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert field in response.json()
