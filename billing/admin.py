from typing import Any

from django.contrib import admin

from billing.models import CostProfile, ReportSubscription, WeeklyReport, WorkloadTeamRule


@admin.register(CostProfile)
class CostProfileAdmin(admin.ModelAdmin[CostProfile]):
    list_display = [
        "scope_kind",
        "scope_name",
        "kind",
        "purchase_price",
        "depreciation_years",
        "opex_per_hour",
        "rental_rate_per_hour",
    ]
    list_filter = ["scope_kind", "kind"]


@admin.register(WeeklyReport)
class WeeklyReportAdmin(admin.ModelAdmin[WeeklyReport]):
    list_display = ["week", "audience", "week_start", "sent_at"]
    readonly_fields = [f.name for f in WeeklyReport._meta.fields]


@admin.register(ReportSubscription)
class ReportSubscriptionAdmin(admin.ModelAdmin[ReportSubscription]):
    list_display = ["user", "opted_in"]


@admin.register(WorkloadTeamRule)
class WorkloadTeamRuleAdmin(admin.ModelAdmin[WorkloadTeamRule]):
    """Read-only: the fleet file's ``[[workload_teams]]`` own the rules (``fleet_apply``)."""

    list_display = ["position", "match", "team"]
    readonly_fields = ["position", "match_field", "pattern", "team"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
