"""What marks closed months stale when it changes (DESIGN.md §9.1, docs/finance.md).

A closed month's figures depend, beside its rollup rows (marked by triggers on the hourly
table), on the cost profiles, the sites' terms, the attribution of nodes, pools and GPUs
(offline hours go to the current one), the GPUs' service dates and models, and the report
time zone. Saving or deleting any of them through Django (the admin, the fleet file, a
script using the ORM) marks every closed month stale, in the same transaction; the task
then books what changed, or nothing. Bookkeeping saves that change none of it (a GPU's
``last_seen_at``, a node's agent version) mark nothing. A change made with SQL or
``QuerySet.update`` sends no signal: run ``manage.py adjust_closed --all`` after it.

On SQLite the hourly table's triggers (billing migration 0013) are made again after every
``migrate``: SQLite remakes a table to alter it, and a remade table has lost its triggers.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models.signals import post_delete, post_migrate, post_save

from billing.models import CostProfile
from fleet.models import FleetSettings, Gpu, GpuModel, Node, Pool, Site, Team

# Per model, the fields whose change alone moves no closed month's figure.
_BOOKKEEPING: dict[type, frozenset[str]] = {
    Gpu: frozenset({"last_seen_at", "first_seen_at", "lost_at", "name", "serial"}),
    Node: frozenset({"last_seen_at", "reported_hostname", "agent_version", "driver_version"}),
}
WATCHED = (CostProfile, FleetSettings, Site, Team, Pool, GpuModel, Node, Gpu)


def _changed(sender: type, **kwargs: Any) -> None:
    fields = kwargs.get("update_fields")
    if fields and frozenset(fields) <= _BOOKKEEPING.get(sender, frozenset()):
        return
    from billing.month_close import closed_stale_mark

    closed_stale_mark()


# The SQLite triggers of billing 0013, made where missing: a day's margin either side of a
# closed month (no time zones in SQLite; a neighbour marked too is recomputed to nothing).
_SQLITE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS billing_stale_hourly_{op} AFTER {event} ON telemetry_hourlyusage
BEGIN
    INSERT INTO billing_closedmonthstale (month, token, marked_at)
    SELECT c.month, lower(hex(randomblob(16))), strftime('%Y-%m-%d %H:%M:%f', 'now')
    FROM billing_monthclose c
    WHERE c.closed AND {row}.hour >= date(c.month, '-1 day')
      AND {row}.hour < date(c.month, '+1 month', '+1 day')
    ON CONFLICT (month) DO UPDATE SET token = excluded.token, marked_at = excluded.marked_at;
END
"""
SQLITE_TRIGGERS = tuple(
    _SQLITE_TRIGGER.format(op=op, event=event, row=row)
    for op, event, row in (
        ("insert", "INSERT", "NEW"),
        ("update", "UPDATE", "NEW"),
        ("delete", "DELETE", "OLD"),
    )
)


def sqlite_triggers_ensure(*, using: str = "default", **kwargs: Any) -> None:
    """After ``migrate`` on SQLite: the hourly table's stale-marking triggers, where missing."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    tables = set(connection.introspection.table_names())
    if not {"telemetry_hourlyusage", "billing_closedmonthstale"} <= tables:
        return  # (migrated back before them)
    with connection.cursor() as cursor:
        for statement in SQLITE_TRIGGERS:
            cursor.execute(statement)


def connect() -> None:
    """Called once by ``BillingConfig.ready``."""
    post_migrate.connect(sqlite_triggers_ensure, dispatch_uid="billing.signals.sqlite_triggers")
    for model in WATCHED:
        uid = f"billing.signals.stale.{model.__name__}"
        post_save.connect(_changed, sender=model, dispatch_uid=f"{uid}.save")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"{uid}.delete")
