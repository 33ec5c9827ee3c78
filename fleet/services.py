"""Writes to the fleet inventory: tokens, GPU registration and the fleet file."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from fleet.bounds import date_error
from fleet.catalogue import CATALOGUE, catalogue_match
from fleet.identifiers import identifier_error, text_error
from fleet.models import (
    ApiToken,
    FleetSettings,
    Gpu,
    GpuModel,
    Node,
    NodeToken,
    Pool,
    Site,
    Team,
)
from fleet.roles import role_assign
from fleet.tokens import API_KIND, NODE_KIND, token_generate, token_hash


class FleetFileError(ValueError):
    """A fleet file that cannot be applied; the message names the table and field."""


# --- tokens ---------------------------------------------------------------------------------
def node_token_issue(*, hostname: str) -> tuple[Node, str]:
    """Create the node if needed and a new token for it; the token is shown only now.
    ValueError for a hostname that is not an identifier (fleet.identifiers)."""
    error = identifier_error(hostname, max_length=Node._meta.get_field("hostname").max_length or 0)
    if error is not None:
        raise ValueError(f"hostname: {error}")
    node, _ = Node.objects.get_or_create(hostname=hostname)
    token, prefix = token_generate(NODE_KIND)
    NodeToken.objects.create(node=node, prefix=prefix, token_hash=token_hash(token))
    return node, token


def api_token_issue(*, username: str, role: str, name: str = "") -> tuple[Any, str]:
    """Create the user if needed, put it in ``role`` and return a new API token for it."""
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username)
    if created:
        user.set_unusable_password()
        user.save()
    role_assign(user=user, role=role)
    token, prefix = token_generate(API_KIND)
    ApiToken.objects.create(user=user, prefix=prefix, token_hash=token_hash(token), name=name)
    return user, token


def token_revoke(*, prefix: str) -> str:
    """Revoke the node or API token with this visible prefix; says what was revoked."""
    now = timezone.now()
    for model in (NodeToken, ApiToken):
        token = model.objects.filter(prefix=prefix).first()
        if token is not None:
            if token.revoked_at is None:
                model.objects.filter(pk=token.pk).update(revoked_at=now)
            return f"revoked {model.__name__} {prefix}"
    raise LookupError(f"no token with prefix {prefix!r}")


# --- GPU registration (ingest) --------------------------------------------------------------
def gpu_model_for_name(device_name: str) -> GpuModel | None:
    entry = catalogue_match(device_name)
    if entry is None:
        return None
    model, _ = GpuModel.objects.get_or_create(
        key=entry.key,
        defaults={
            "name": entry.name,
            "max_power_w": entry.max_power_w,
            "idle_power_w": entry.idle_power_w,
            "memory_gib": entry.memory_gib,
        },
    )
    return model


def gpu_models_seed() -> int:
    """Make sure every catalogue entry has a row; returns how many were created."""
    created = 0
    for entry in CATALOGUE:
        _, was_created = GpuModel.objects.get_or_create(
            key=entry.key,
            defaults={
                "name": entry.name,
                "max_power_w": entry.max_power_w,
                "idle_power_w": entry.idle_power_w,
                "memory_gib": entry.memory_gib,
            },
        )
        created += was_created
    return created


# --- the fleet file -------------------------------------------------------------------------
@dataclass
class ApplyResult:
    created: dict[str, int] = field(default_factory=dict)
    updated: dict[str, int] = field(default_factory=dict)
    # GPUs whose in-service window changed: their rollups must be recomputed.
    gpus_window_changed: list[int] = field(default_factory=list)

    def count(self, kind: str, created: bool, changed: bool) -> None:
        if created:
            self.created[kind] = self.created.get(kind, 0) + 1
        elif changed:
            self.updated[kind] = self.updated.get(kind, 0) + 1

    def summary(self) -> str:
        parts = [f"{n} {k} created" for k, n in sorted(self.created.items())]
        parts += [f"{n} {k} updated" for k, n in sorted(self.updated.items())]
        return ", ".join(parts) if parts else "no changes"


def _zone(name: str, where: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise FleetFileError(f"{where}: unknown time zone {name!r}") from exc


def fleet_datetime(value: Any, *, zone: ZoneInfo, where: str) -> dt.datetime | None:
    """A TOML datetime/date or ISO string as an aware datetime; naive ones are in ``zone``."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, dt.date):
        parsed = dt.datetime.combine(value, dt.time())
    elif isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise FleetFileError(f"{where}: not an ISO date or datetime: {value!r}") from exc
    else:
        raise FleetFileError(f"{where}: expected a date or datetime, got {value!r}")
    error = date_error(parsed.date())
    if error is not None:
        raise FleetFileError(f"{where}: {error}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=zone)
    return parsed.astimezone(dt.UTC)


def fleet_decimal(
    value: Any, *, where: str, minimum: Decimal | None = Decimal(0), money: bool = True
) -> Decimal:
    """A decimal from the fleet file; money must be a string (floats lose cents)."""
    if isinstance(value, bool):
        raise FleetFileError(f"{where}: expected a number, got {value!r}")
    if money and isinstance(value, float):
        raise FleetFileError(f'{where}: money must be a string such as "0.21", not a float')
    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError) as exc:
        raise FleetFileError(f"{where}: not a decimal number: {value!r}") from exc
    if not number.is_finite() or (minimum is not None and number < minimum):
        raise FleetFileError(f"{where}: must be a finite number ≥ {minimum}")
    return number


PEAK_KEYS = ("model", "tflops")


def fleet_peaks(rows: Any) -> dict[str, float]:
    """The fleet file's ``[[peaks]]`` (``model``, ``tflops``: the dense bf16 peak in TFLOP/s
    that MFU divides by, DESIGN.md §9.4) as stored in ``FleetSettings.peaks``: TFLOP/s by
    catalogue key. A ``model`` is read as a GPU's NVML name is (``H100-SXM``, ``H100 SXM`` and
    ``NVIDIA H100 80GB HBM3`` are all the catalogue's H100 SXM); a name the catalogue does not
    know is kept as written and applies to GPUs that report exactly that name. Raises
    ``FleetFileError`` naming the row and field."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FleetFileError("peaks: must be an array of tables ([[peaks]])")
    keys = {entry.key.casefold(): entry.key for entry in CATALOGUE}
    out: dict[str, float] = {}
    for i, row in enumerate(rows):
        where = f"peaks[{i}]"
        unknown = sorted(set(row) - set(PEAK_KEYS))
        if unknown:
            raise FleetFileError(f"{where}.{unknown[0]}: unknown (known: {', '.join(PEAK_KEYS)})")
        model = row.get("model")
        if not isinstance(model, str) or not model.strip():
            raise FleetFileError(f'{where}.model: required (a GPU model such as "H100-SXM")')
        error = text_error(model, max_length=100)
        if error is not None:
            raise FleetFileError(f"{where}.model: {error}")
        tflops = row.get("tflops")
        # A number, not a string: a peak is no money, and "989" in quotes is a typo to catch.
        if isinstance(tflops, bool) or not isinstance(tflops, int | float):
            raise FleetFileError(f"{where}.tflops: required, a number of TFLOP/s such as 989")
        if not math.isfinite(tflops) or tflops <= 0:
            raise FleetFileError(f"{where}.tflops: must be a finite number > 0, not {tflops!r}")
        entry = catalogue_match(model)
        key = keys.get(model.casefold()) or (entry.key if entry is not None else model)
        if key in out:
            raise FleetFileError(f"{where}.model: {model!r} is {key}, which an earlier row sets")
        out[key] = float(tflops)
    return out


def _table(document: dict[str, Any], name: str) -> list[dict[str, Any]]:
    rows = document.get(name, [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FleetFileError(f"{name}: must be an array of tables ([[{name}]])")
    for i, row in enumerate(rows):
        key = "hostname" if name == "nodes" else "uuid" if name == "gpus" else "name"
        if name == "cost_profiles":
            continue
        if not row.get(key):
            raise FleetFileError(f"{name}[{i}].{key}: required")
        # The same rule as ingest and the admin: these names end up in URLs and pages.
        max_length = Node._meta.get_field("hostname").max_length if key == "hostname" else 100
        error = identifier_error(row[key], max_length=max_length or 100)
        if error is not None:
            raise FleetFileError(f"{name}[{i}].{key}: {error}")
    return rows


def _upsert(model: Any, lookup: dict[str, Any], values: dict[str, Any]) -> tuple[Any, bool, bool]:
    """get-or-create, then update only fields that differ: (obj, created, changed)."""
    obj = model.objects.filter(**lookup).first()
    if obj is None:
        return model.objects.create(**lookup, **values), True, False
    changed = [k for k, v in values.items() if getattr(obj, k) != v]
    for k in changed:
        setattr(obj, k, values[k])
    if changed:
        obj.save(update_fields=changed)
    return obj, False, bool(changed)


def _ref(model: Any, field_name: str, value: Any, where: str) -> Any:
    if value in (None, ""):
        return None
    obj = model.objects.filter(**{field_name: value}).first()
    if obj is None:
        raise FleetFileError(f"{where}: no {model.__name__.lower()} named {value!r}")
    return obj


@transaction.atomic
def fleet_file_apply(*, document: dict[str, Any]) -> ApplyResult:
    """Apply the inventory part of a fleet file (docs/deploy.md); cost profiles and break-even
    workloads are billing's (``billing.services.fleet_document_apply`` applies it all).

    Idempotent: the same document twice changes nothing. Never deletes anything.
    """
    result = ApplyResult()
    if not document.get("currency"):
        raise FleetFileError('currency: required (an ISO 4217 code such as "USD")')
    currency = str(document["currency"]).upper()
    if len(currency) != 3 or not currency.isalpha():
        raise FleetFileError(f"currency: not an ISO 4217 code: {document['currency']!r}")
    report_tz = str(document.get("report_time_zone", "UTC"))
    zone = _zone(report_tz, "report_time_zone")
    fs = FleetSettings.load()
    values: dict[str, Any] = {"currency": currency, "report_time_zone": report_tz}
    if "active_util_pct" in document:
        active = float(document["active_util_pct"])
        if not 0 <= active <= 100:
            raise FleetFileError("active_util_pct: must be within 0–100")
        values["active_util_pct"] = active
    if "target_utilization" in document:
        target = float(document["target_utilization"])
        if not 0 < target <= 1:
            raise FleetFileError("target_utilization: must be within (0, 1]")
        values["target_utilization"] = target
    values["peaks"] = fleet_peaks(document.get("peaks", []))
    _, _, changed = _upsert(FleetSettings, {"pk": fs.pk}, values)
    result.count("settings", False, changed)

    for i, row in enumerate(_table(document, "sites")):
        where = f"sites[{i}]"
        pue = fleet_decimal(
            row.get("pue", 1), where=f"{where}.pue", minimum=Decimal(1), money=False
        )
        site_values: dict[str, Any] = {
            "pue": pue,
            "price_per_kwh": fleet_decimal(
                row.get("price_per_kwh", "0"), where=f"{where}.price_per_kwh"
            ),
            "grid_g_per_kwh": float(row.get("grid_g_per_kwh", 0)),
            "time_zone": str(row.get("time_zone", "UTC")),
        }
        if site_values["grid_g_per_kwh"] < 0:
            raise FleetFileError(f"{where}.grid_g_per_kwh: must be ≥ 0")
        _zone(site_values["time_zone"], f"{where}.time_zone")
        _, created, changed = _upsert(Site, {"name": row["name"]}, site_values)
        result.count("sites", created, changed)

    for i, row in enumerate(_table(document, "teams")):
        cost_center = row.get("cost_center", "")
        error = text_error(cost_center, max_length=100)
        if error is not None:
            raise FleetFileError(f"teams[{i}].cost_center: {error}")
        _, created, changed = _upsert(Team, {"name": row["name"]}, {"cost_center": cost_center})
        result.count("teams", created, changed)

    for i, row in enumerate(_table(document, "pools")):
        where = f"pools[{i}]"
        pool_values = {
            "site": _ref(Site, "name", row.get("site"), f"{where}.site"),
            "team": _ref(Team, "name", row.get("team"), f"{where}.team"),
        }
        _, created, changed = _upsert(Pool, {"name": row["name"]}, pool_values)
        result.count("pools", created, changed)

    for i, row in enumerate(_table(document, "nodes")):
        where = f"nodes[{i}]"
        node_values = {
            "pool": _ref(Pool, "name", row.get("pool"), f"{where}.pool"),
            "site": _ref(Site, "name", row.get("site"), f"{where}.site"),
        }
        _, created, changed = _upsert(Node, {"hostname": row["hostname"]}, node_values)
        result.count("nodes", created, changed)

    for i, row in enumerate(_table(document, "gpus")):
        where = f"gpus[{i}]"
        gpu_values: dict[str, Any] = {
            "in_service_at": fleet_datetime(
                row.get("in_service"), zone=zone, where=f"{where}.in_service"
            ),
            "retired_at": fleet_datetime(row.get("retired"), zone=zone, where=f"{where}.retired"),
        }
        if (
            gpu_values["in_service_at"]
            and gpu_values["retired_at"]
            and gpu_values["retired_at"] <= gpu_values["in_service_at"]
        ):
            raise FleetFileError(f"{where}.retired: must be after in_service")
        if "team" in row:
            gpu_values["team"] = _ref(Team, "name", row.get("team"), f"{where}.team")
        if "model" in row:
            gpu_values["model"] = _ref(GpuModel, "key", row.get("model"), f"{where}.model")
        existing = Gpu.objects.filter(uuid=row["uuid"]).first()
        if row.get("node"):
            gpu_values["node"] = _ref(Node, "hostname", row["node"], f"{where}.node")
        elif existing is None:
            raise FleetFileError(f"{where}.node: required for a GPU that has not reported yet")
        before = (existing.in_service_at, existing.retired_at) if existing else None
        gpu, created, changed = _upsert(Gpu, {"uuid": row["uuid"]}, gpu_values)
        if before is not None and before != (gpu.in_service_at, gpu.retired_at):
            result.gpus_window_changed.append(gpu.pk)
        result.count("gpus", created, changed)
    return result
