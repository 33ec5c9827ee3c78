"""The fleet file's ``[[alerts]]`` (docs/alerts.md), applied by ``fleet_apply`` through
billing's section hook (``billing.services.fleet_section_register``, see ``alerts.apps``).

Every value is checked here, once, naming the table and field (``alerts[2].threshold: …``);
the evaluator trusts what is stored. The rules are exactly those in the file: a rule left out
is made inactive (kept, so its alerts' history stays readable) and its open alerts close.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Q
from django.utils import timezone

from alerts.models import Alert, Rule
from alerts.rules import (
    MAX_WINDOW_HOURS,
    MONEY,
    PLACES,
    RULE_KINDS,
    WINDOW_HOURS,
    RuleConfig,
    Scope,
)
from alerts.targets import MAX_TARGETS, SYMBOLS, target_error
from fleet.identifiers import identifier_error
from fleet.models import Pool, Site, Team
from fleet.services import ApplyResult, FleetFileError, fleet_decimal

KEYS = ("name", "rule", "scope", "threshold", "window_hours", "notify", "repeat_hours")
MAX_REPEAT_HOURS = 8760
# The stored columns hold 24 digits, 6 after the point.
MAX_THRESHOLD = Decimal(10) ** 17
_SCOPE_MODELS: dict[str, Any] = {"site": Site, "pool": Pool, "team": Team}


def _whole(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FleetFileError(f"{where}: a whole number from {low} to {high}")
    return value


def rule_parse(row: dict[str, Any], *, where: str) -> RuleConfig:
    """One ``[[alerts]]`` table as a RuleConfig; FleetFileError naming the field."""
    unknown = sorted(set(row) - set(KEYS))
    if unknown:
        raise FleetFileError(f"{where}.{unknown[0]}: unknown (known: {', '.join(KEYS)})")
    name = row.get("name")
    error = identifier_error(name, max_length=100) if name else "required"
    if error is not None or not isinstance(name, str):
        raise FleetFileError(f"{where}.name: {error or 'must be a string'}")
    kind_name = row.get("rule")
    kind = RULE_KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        known = ", ".join(RULE_KINDS)
        raise FleetFileError(f"{where}.rule: unknown rule {kind_name!r} (known: {known})")

    scope_text = row.get("scope", "fleet")
    try:
        scope = Scope.parse(scope_text) if isinstance(scope_text, str) else Scope.parse("")
    except ValueError as exc:
        raise FleetFileError(f"{where}.scope: {exc}, not {scope_text!r}") from None
    if kind.scopes is not None and scope.kind not in kind.scopes:
        raise FleetFileError(
            f"{where}.scope: {kind.name} takes {', '.join(kind.scopes)}, not {scope.kind}"
        )
    if scope.kind in _SCOPE_MODELS:
        if not _SCOPE_MODELS[scope.kind].objects.filter(name=scope.name).exists():
            raise FleetFileError(f"{where}.scope: no {scope.kind} named {scope.name!r}")
    elif scope.kind == "gpu":  # a GPU may be named before it first reports, as in [[gpus]]
        error = identifier_error(scope.name, max_length=100)
        if error is not None:
            raise FleetFileError(f"{where}.scope: {error}")

    window_hours: int | None = None
    if kind.window == WINDOW_HOURS:
        window_hours = _whole(
            row.get("window_hours", 24), f"{where}.window_hours", 1, MAX_WINDOW_HOURS
        )
    elif "window_hours" in row:
        raise FleetFileError(f"{where}.window_hours: {kind.name} has no window; leave it out")

    if "threshold" not in row:
        raise FleetFileError(f"{where}.threshold: required")
    threshold = fleet_decimal(
        row["threshold"], where=f"{where}.threshold", minimum=None, money=kind.unit == MONEY
    )
    error = kind.check(threshold, window_hours)
    if error is None and (
        abs(threshold) >= MAX_THRESHOLD or threshold != threshold.quantize(PLACES)
    ):
        error = "at most 6 decimal places and below 1e17"
    if error is not None:
        raise FleetFileError(
            f"{where}.threshold: {error} for {kind.name}, not {row['threshold']!r}"
        )

    notify = row.get("notify", [])
    if not isinstance(notify, list):
        raise FleetFileError(f'{where}.notify: a list of targets, e.g. ["mailto:ops@example.com"]')
    if len(notify) > MAX_TARGETS:
        raise FleetFileError(f"{where}.notify: at most {MAX_TARGETS} targets")
    for j, target in enumerate(notify):
        if isinstance(target, str) and target in SYMBOLS and target in kind.symbols:
            error = None
        elif isinstance(target, str) and target in SYMBOLS:
            error = f"{target!r} only works with rules about workloads"
        else:
            error = target_error(target)
        if error is None and target in notify[:j]:
            error = "appears twice"
        if error is not None:
            raise FleetFileError(f"{where}.notify[{j}]: {error}")
    repeat_hours = _whole(row.get("repeat_hours", 24), f"{where}.repeat_hours", 0, MAX_REPEAT_HOURS)
    return RuleConfig(
        name=name,
        kind=kind.name,
        scope=scope,
        threshold=threshold,
        window_hours=window_hours,
        notify=tuple(notify),
        repeat_hours=repeat_hours,
    )


def _close_open(rule: Rule, note: str) -> None:
    """Close a rule's open alerts without notifying: its rule is gone or now means another
    thing; the next evaluation opens new ones where the new rule fires."""
    Alert.objects.filter(rule=rule, resolved_at__isnull=True).update(
        resolved_at=timezone.now(), note=note
    )


def alerts_section_apply(*, document: dict[str, Any], result: ApplyResult) -> None:
    """Make the active rules exactly the file's ``[[alerts]]`` (idempotent)."""
    rows = document.get("alerts", [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FleetFileError("alerts: must be an array of tables ([[alerts]])")
    wanted: dict[str, tuple[int, RuleConfig]] = {}
    for i, row in enumerate(rows):
        config = rule_parse(row, where=f"alerts[{i}]")
        if config.name in wanted:
            raise FleetFileError(f"alerts[{i}].name: {config.name!r} appears twice")
        wanted[config.name] = (i, config)

    now = timezone.now()
    existing = {r.name: r for r in Rule.objects.all()}
    for name, (position, config) in wanted.items():
        values: dict[str, Any] = {
            "kind": config.kind,
            "scope": str(config.scope),
            "threshold": config.threshold,
            "window_hours": config.window_hours,
            "notify": list(config.notify),
            "repeat_hours": config.repeat_hours,
            "position": position,
            "active": True,
        }
        rule = existing.get(name)
        if rule is None:
            Rule.objects.create(name=name, applied_at=now, **values)
            result.count("alerts", True, False)
            continue
        changed = [k for k, v in values.items() if getattr(rule, k) != v]
        if not changed:
            continue
        if rule.active and ({"kind", "scope"} & set(changed)):
            _close_open(rule, "closed: the rule's kind or scope changed in the fleet file")
        for k in changed:
            setattr(rule, k, values[k])
        rule.applied_at = now
        rule.save(update_fields=[*changed, "applied_at"])
        result.count("alerts", False, True)

    removed = [r for name, r in existing.items() if name not in wanted and r.active]
    for rule in removed:
        _close_open(rule, "closed: the rule was removed from the fleet file")
    if removed:
        Rule.objects.filter(Q(pk__in=[r.pk for r in removed])).update(active=False, applied_at=now)
        result.updated["alerts_removed"] = len(removed)
