"""The rollup's queue in the admin: the hours marked out of date, those set aside after
failing ``ROLLUP_MAX_FAILURES`` times with their last error, and the action that puts them
back in the queue once the cause is fixed (docs/deploy.md, "An hour set aside")."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.dateparse import parse_datetime

from telemetry.models import PendingStretch, QueueCluster, RollupPending, Workload, WorkloadClaim
from telemetry.rollup import rollup_marks_requeue


class SetAsideFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("set_aside", "set aside"), ("queued", "in the queue")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "set_aside":
            return queryset.filter(set_aside_at__isnull=False)
        if self.value() == "queued":
            return queryset.filter(set_aside_at__isnull=True)
        return queryset


@admin.register(RollupPending)
class RollupPendingAdmin(admin.ModelAdmin[RollupPending]):
    """Read-only: ingest and the rollup keep the marks; an operator puts set-aside hours back
    in the queue once the cause is fixed (bad samples corrected or deleted)."""

    list_display = ["hour", "version", "marked_at", "failures", "set_aside_at", "error"]
    list_filter = [SetAsideFilter]
    # No links to a mark's page: on SQLite ingest writes the hour as text with an offset,
    # which the ORM's lookups by primary key do not find (the action below does not use them).
    list_display_links = None
    ordering = ["hour"]
    actions = ["requeue"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="last error")
    def error(self, mark: RollupPending) -> str:
        return mark.last_error[:200]

    @admin.action(description="Put back in the queue (failures reset)")
    def requeue(self, request: HttpRequest, queryset: QuerySet[RollupPending]) -> None:
        count = rollup_marks_requeue(hours=self._hours(request, queryset))
        self.message_user(
            request,
            f"{count} hours put back in the queue; the next rollup recomputes them.",
            messages.SUCCESS,
        )

    @staticmethod
    def _hours(request: HttpRequest, queryset: QuerySet[RollupPending]) -> list[dt.datetime]:
        """The hours the action applies to: all those listed, or those ticked, read from the
        form (the queryset of ticked marks is filtered by primary key: see above)."""
        if request.POST.get("select_across") == "1":
            return list(queryset.values_list("hour", flat=True))
        hours = [parse_datetime(value) for value in request.POST.getlist(ACTION_CHECKBOX_NAME)]
        return [h for h in hours if h is not None]


class WorkloadClaimInline(admin.TabularInline[WorkloadClaim, Workload]):
    model = WorkloadClaim
    fields = readonly_fields = ("node", "field", "value", "first_seen_at", "last_seen_at")
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin[Workload]):
    """Workloads as ingest registered them, with what other nodes claimed for their names
    (docs/ingest.md, "Whose names count"). Only ``identity_node`` can be changed: when a node
    reported a job before the node that runs it, an operator gives the names to the right
    node (its next report sets them); names themselves are never typed in here."""

    list_display = ["key", "kind", "site", "user_name", "account", "name", "identity_node"]
    list_filter = ["kind", "site"]
    search_fields = ["key", "user_name", "account", "name"]
    readonly_fields = (
        "site",
        "kind",
        "key",
        "user_name",
        "account",
        "name",
        "first_seen_at",
        "last_seen_at",
        "created_at",
    )
    fields = (*readonly_fields[:6], "identity_node", *readonly_fields[6:])
    inlines = [WorkloadClaimInline]
    list_select_related = ["site", "identity_node"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Rollups and money refer to workloads: they are never deleted by hand.
        return False


@admin.register(QueueCluster)
class QueueClusterAdmin(admin.ModelAdmin[QueueCluster]):
    """The clusters queue collectors push (docs/agent.md, "Queue pressure"). Only ``node``
    can be changed: when a collector moves to another login node, an operator hands the
    cluster to it (or clears it: the next node to push takes it); the queue service keeps the
    rest."""

    list_display = ["name", "node", "last_at", "created_at"]
    search_fields = ["name"]
    readonly_fields = ("name", "last_at", "created_at")
    fields = ("name", "node", "last_at", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Its waits are the queue's history: never deleted by hand.
        return False


@admin.register(PendingStretch)
class PendingStretchAdmin(admin.ModelAdmin[PendingStretch]):
    """Read-only: each job's stretch of waiting as the queue service stored it, to answer
    "why does this job count" (its reason and class, first and last seen, when it ended)."""

    list_display = [
        "job_id",
        "cluster",
        "partition",
        "user_name",
        "account",
        "gpus",
        "reason",
        "reason_class",
        "first_seen_at",
        "ended_at",
    ]
    list_filter = ["cluster", "reason_class", "partition"]
    search_fields = ["job_id", "user_name", "account"]
    list_select_related = ["cluster"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
