from django.contrib import admin

from billing.models import CostProfile, ReportSubscription, WeeklyReport


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
