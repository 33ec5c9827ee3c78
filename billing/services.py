"""Writes of billing: cost profiles, break-even workloads and workload team rules from the
fleet file."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Protocol

from django import forms
from django.core.exceptions import ValidationError
from django.db import transaction

from billing.forms import BREAKEVEN_KEYS, PRICE_KEYS, BreakevenForm
from billing.models import CostProfile, WorkloadTeamRule
from fleet.identifiers import text_error
from fleet.models import FleetSettings, Gpu, Node, Pool, Site, Team
from fleet.services import ApplyResult, FleetFileError, fleet_decimal, fleet_file_apply
from telemetry.queue import queue_partitions_apply

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


def breakeven_workload(table: Any, where: str) -> dict[str, Any]:
    """A fleet file's break-even table, checked by the break-even form's own fields (one set
    of bounds for the page, the email and the file): money as strings, numbers as floats."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise FleetFileError(f"{where}: must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in BREAKEVEN_KEYS:
            known = ", ".join(BREAKEVEN_KEYS)
            raise FleetFileError(f"{where}.{key}: unknown (known: {known})")
        field = BreakevenForm.base_fields[BREAKEVEN_KEYS[key]]
        if isinstance(value, bool):
            raise FleetFileError(f"{where}.{key}: must be a number")
        money = isinstance(field, forms.DecimalField)
        if money:
            value = fleet_decimal(value, where=f"{where}.{key}")  # money must be a string
        try:
            cleaned = field.clean(value)
        except ValidationError as exc:
            raise FleetFileError(f"{where}.{key}: {' '.join(exc.messages)}") from None
        out[key] = str(cleaned) if money else float(cleaned)
    if "api_price_per_mtok" in out and PRICE_KEYS & out.keys() - {"api_price_per_mtok"}:
        raise FleetFileError(
            f"{where}: give either api_price_per_mtok (blended) or the input and output prices"
        )
    return out


def breakeven_workloads_apply(
    *, document: dict[str, Any], result: ApplyResult, new_pools: frozenset[str] = frozenset()
) -> None:
    """The fleet's (``[breakeven]``) and each pool's (``pools[].breakeven``) workload; a table
    left out of the file resets to none (the page's own defaults). A pool in ``new_pools``
    was created by this apply: its workload is part of creating it, not an update."""
    fs = FleetSettings.load()
    workload = breakeven_workload(document.get("breakeven"), "breakeven")
    if fs.breakeven != workload:
        FleetSettings.objects.filter(pk=fs.pk).update(breakeven=workload)
        result.count("settings", False, True)
    for i, row in enumerate(document.get("pools", [])):
        workload = breakeven_workload(row.get("breakeven"), f"pools[{i}].breakeven")
        if (
            Pool.objects.filter(name=row["name"])
            .exclude(breakeven=workload)
            .update(breakeven=workload)
            and row["name"] not in new_pools
        ):
            result.count("pools", False, True)


WORKLOAD_TEAM_KEYS = ("match", "team")


def workload_teams_apply(*, rows: Any, result: ApplyResult) -> None:
    """Make the workload team rules exactly the fleet file's ``[[workload_teams]]``, in file
    order (the first rule that matches a workload wins; docs/metrics.md, "Workloads")."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FleetFileError("workload_teams: must be an array of tables ([[workload_teams]])")
    wanted: list[tuple[str, str, int]] = []
    for i, row in enumerate(rows):
        where = f"workload_teams[{i}]"
        unknown = sorted(set(row) - set(WORKLOAD_TEAM_KEYS))
        if unknown:
            known = ", ".join(WORKLOAD_TEAM_KEYS)
            raise FleetFileError(f"{where}.{unknown[0]}: unknown (known: {known})")
        match = row.get("match")
        field_name, _, pattern = match.partition(":") if isinstance(match, str) else ("", "", "")
        if field_name not in WorkloadTeamRule.MATCH_FIELDS or not pattern or pattern == "*":
            raise FleetFileError(
                f"{where}.match: expected account:NAME, user:NAME, kind:KIND or id:ID "
                f"(a trailing * matches any ending), not {match!r}"
            )
        error = text_error(pattern, max_length=200)
        if error is not None:
            raise FleetFileError(f"{where}.match: {error}")
        team_name = row.get("team")
        if not isinstance(team_name, str) or not team_name:
            raise FleetFileError(f"{where}.team: required")
        team = Team.objects.filter(name=team_name).first()
        if team is None:
            raise FleetFileError(f"{where}.team: no team named {team_name!r}")
        wanted.append((field_name, pattern, team.pk))
    have = list(
        WorkloadTeamRule.objects.order_by("position").values_list(
            "match_field", "pattern", "team_id"
        )
    )
    if have == wanted:
        return
    WorkloadTeamRule.objects.all().delete()
    WorkloadTeamRule.objects.bulk_create(
        WorkloadTeamRule(position=i, match_field=f, pattern=p, team_id=t)
        for i, (f, p, t) in enumerate(wanted)
    )
    result.updated["workload_teams"] = len(wanted)


# Sections of the fleet file that apps above billing own (alerts' ``[[alerts]]``). The owning
# app registers its section from its AppConfig.ready(), so the dependency keeps pointing down:
# billing calls whatever is registered and imports none of them. Each is called with the whole
# document, inside fleet_document_apply's transaction, after the inventory and cost profiles it
# may refer to; it raises FleetFileError naming the table and field.
class FleetSection(Protocol):
    def __call__(self, *, document: dict[str, Any], result: ApplyResult) -> None: ...


_FLEET_SECTIONS: dict[str, FleetSection] = {}


def fleet_section_register(*, key: str, apply: FleetSection) -> None:
    """Have ``fleet_document_apply`` also apply ``apply`` (idempotent per ``key``)."""
    _FLEET_SECTIONS[key] = apply


@transaction.atomic
def fleet_document_apply(*, document: dict[str, Any]) -> ApplyResult:
    """A whole fleet file: the inventory (fleet), then cost profiles and break-even workloads,
    then the sections other apps registered (``fleet_section_register``); recomputes the
    rollups of GPUs whose in-service window moved and rebuilds the daily pre-aggregate when
    the report time zone changed, in the same transaction."""
    from telemetry.rollup import daily_usage_ensure
    from telemetry.services import gpu_hours_invalidate

    existing = set(Pool.objects.values_list("name", flat=True))
    result = fleet_file_apply(document=document)
    cost_profiles_apply(rows=document.get("cost_profiles", []), result=result)
    new_pools = frozenset(Pool.objects.values_list("name", flat=True)) - existing
    breakeven_workloads_apply(document=document, result=result, new_pools=new_pools)
    workload_teams_apply(rows=document.get("workload_teams", []), result=result)
    queue_partitions_apply(document=document, result=result)
    for section_apply in _FLEET_SECTIONS.values():
        section_apply(document=document, result=result)
    if result.gpus_window_changed:
        gpu_hours_invalidate(gpu_ids=result.gpus_window_changed)
    # The daily pre-aggregate holds local days of the report time zone: a new zone rebuilds
    # it, so no page sees the old days.
    daily_usage_ensure()
    return result
