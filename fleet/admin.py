from typing import Any

from django.contrib import admin

from fleet.models import (
    ApiToken,
    FleetSettings,
    Gpu,
    GpuModel,
    Node,
    NodeToken,
    Pool,
    Site,
    SsoIdentity,
    Team,
)


@admin.register(FleetSettings)
class FleetSettingsAdmin(admin.ModelAdmin[FleetSettings]):
    list_display = ["currency", "report_time_zone", "active_util_pct", "target_utilization"]


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin[Site]):
    list_display = ["name", "pue", "price_per_kwh", "grid_g_per_kwh", "time_zone"]
    search_fields = ["name"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin[Team]):
    list_display = ["name", "cost_center"]
    search_fields = ["name", "cost_center"]


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin[Pool]):
    list_display = ["name", "site", "team"]
    list_filter = ["site", "team"]


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin[GpuModel]):
    list_display = ["key", "name", "max_power_w", "idle_power_w", "memory_gib"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin[Node]):
    list_display = [
        "hostname",
        "pool",
        "site",
        "agent_version",
        "driver_version",
        "last_seen_at",
        "alloc_problem",
    ]
    list_filter = ["pool", "site"]
    search_fields = ["hostname"]
    readonly_fields = ["alloc_problem", "alloc_skipped_files"]  # as the agent says them


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin[Gpu]):
    list_display = [
        "uuid",
        "node",
        "index",
        "name",
        "model",
        "team",
        "in_service_at",
        "retired_at",
        "last_seen_at",
    ]
    list_filter = ["model", "node__pool", "team"]
    search_fields = ["uuid", "node__hostname", "serial"]
    list_select_related = ["node", "model", "team"]


class _TokenAdmin(admin.ModelAdmin[Any]):
    """Tokens are issued by management command (shown once); here they can only be revoked."""

    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]
    list_display = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):  # type: ignore[no-untyped-def]
        from django.utils import timezone

        queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


@admin.register(NodeToken)
class NodeTokenAdmin(_TokenAdmin):
    list_display = ["prefix", "node", "created_at", "last_used_at", "revoked_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(_TokenAdmin):
    list_display = [
        "prefix",
        "user",
        "name",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    ]


@admin.register(SsoIdentity)
class SsoIdentityAdmin(admin.ModelAdmin[SsoIdentity]):
    """Which provider person each single sign-on account is (config/oidc.py). Read-only; an
    admin deletes a link to let another person at the provider take that account's name."""

    list_display = ["user", "subject", "issuer", "created_at"]
    search_fields = ["user__username", "subject"]
    readonly_fields = ["user", "issuer", "subject", "created_at"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False
