"""Writes of billing: cost profiles from the fleet file."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from billing.models import CostProfile
from fleet.models import Gpu, Node, Pool, Site
from fleet.services import ApplyResult, FleetFileError, fleet_decimal

_SCOPE_MODELS: dict[str, tuple[Any, str]] = {
    "gpu": (Gpu, "uuid"),
    "node": (Node, "hostname"),
    "pool": (Pool, "name"),
    "site": (Site, "name"),
}


def cost_profiles_apply(*, rows: list[dict[str, Any]], result: ApplyResult) -> None:
    """Make the cost profiles exactly those in ``rows`` (the fleet file's ``cost_profiles``)."""
    wanted: dict[tuple[str, str], dict[str, Any]] = {}
    for i, row in enumerate(rows):
        where = f"cost_profiles[{i}]"
        scope = str(row.get("scope", ""))
        kind_name, _, name = scope.partition(":")
        if kind_name not in _SCOPE_MODELS or not name:
            raise FleetFileError(
                f"{where}.scope: expected gpu:UUID, node:HOST, pool:NAME or site:NAME"
            )
        model, field = _SCOPE_MODELS[kind_name]
        if kind_name != "gpu" and not model.objects.filter(**{field: name}).exists():
            raise FleetFileError(f"{where}.scope: no {kind_name} named {name!r}")
        kind = row.get("kind")
        if kind not in ("owned", "rented"):
            raise FleetFileError(f'{where}.kind: must be "owned" or "rented"')
        values: dict[str, Any] = {"kind": kind}
        if kind == "owned":
            if "purchase_price" not in row:
                raise FleetFileError(f"{where}.purchase_price: required for an owned GPU")
            values["purchase_price"] = fleet_decimal(
                row["purchase_price"], where=f"{where}.purchase_price"
            )
            years = fleet_decimal(
                row.get("depreciation_years", 5), where=f"{where}.depreciation_years", money=False
            )
            if years <= 0:
                raise FleetFileError(f"{where}.depreciation_years: must be > 0")
            values["depreciation_years"] = years
            values["opex_per_hour"] = fleet_decimal(
                row.get("opex_per_hour", "0"), where=f"{where}.opex_per_hour"
            )
            values["rental_rate_per_hour"] = Decimal("0")
        else:
            if "rental_rate_per_hour" not in row:
                raise FleetFileError(f"{where}.rental_rate_per_hour: required for a rented GPU")
            values["rental_rate_per_hour"] = fleet_decimal(
                row["rental_rate_per_hour"], where=f"{where}.rental_rate_per_hour"
            )
            values["purchase_price"] = Decimal("0")
            values["depreciation_years"] = Decimal("5")
            values["opex_per_hour"] = Decimal("0")
        if (kind_name, name) in wanted:
            raise FleetFileError(f"{where}.scope: {scope} appears twice")
        wanted[(kind_name, name)] = values

    for (kind_name, name), values in wanted.items():
        profile = CostProfile.objects.filter(scope_kind=kind_name, scope_name=name).first()
        if profile is None:
            CostProfile.objects.create(scope_kind=kind_name, scope_name=name, **values)
            result.count("cost_profiles", True, False)
            continue
        changed = [k for k, v in values.items() if getattr(profile, k) != v]
        for k in changed:
            setattr(profile, k, values[k])
        if changed:
            profile.save(update_fields=changed)
            result.count("cost_profiles", False, True)
    stale = [p.pk for p in CostProfile.objects.all() if (p.scope_kind, p.scope_name) not in wanted]
    if stale:
        CostProfile.objects.filter(pk__in=stale).delete()
        result.updated["cost_profiles_removed"] = len(stale)
