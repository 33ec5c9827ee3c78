from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from billing.models import (
    CostProfile,
    MonthClose,
    ReportSubscription,
    WeeklyReport,
    WorkloadTeamRule,
)
from billing.month_close import month_close, month_ended_check


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


class MonthCloseForm(forms.ModelForm[MonthClose]):
    """Closing a month from the admin: any day of it, checked like ``close_month``."""

    month = forms.DateField(help_text="Any day of the month to close (YYYY-MM-DD)")

    class Meta:
        model = MonthClose
        fields = ["month"]

    def clean_month(self) -> dt.date:
        month: dt.date = self.cleaned_data["month"].replace(day=1)
        if MonthClose.objects.filter(month=month).exists():
            raise forms.ValidationError(
                f"{month:%Y-%m} has a close already: use the action on its row to close it again"
            )
        try:
            month_ended_check(month=month)
        except ValueError as exc:
            raise forms.ValidationError(str(exc).removeprefix("month: ")) from exc
        return month


@admin.register(MonthClose)
class MonthCloseAdmin(admin.ModelAdmin[MonthClose]):
    """Closes (docs/finance.md): add one to close a month; reopening is ``reopen_month``
    (it needs a reason, recorded here)."""

    form = MonthCloseForm
    list_display = [
        "month",
        "closed",
        "closed_at",
        "closed_by",
        "segments_count",
        "reopened_at",
        "reopened_by",
        "reopen_reason",
    ]
    actions = ["close_again"]

    def get_readonly_fields(self, request: HttpRequest, obj: MonthClose | None = None) -> Any:
        if obj is None:
            return []
        return [f.name for f in MonthClose._meta.fields]

    def save_model(self, request: HttpRequest, obj: MonthClose, form: Any, change: bool) -> None:
        if change:
            return
        result = month_close(month=obj.month, by=request.user.get_username())
        obj.pk = result.close.pk
        self.message_user(request, result.message)

    @admin.action(description="Close the selected months again (reopened ones)")
    def close_again(self, request: HttpRequest, queryset: QuerySet[MonthClose]) -> None:
        for close in queryset:
            try:
                result = month_close(month=close.month, by=request.user.get_username())
            except ValueError as exc:
                self.message_user(request, str(exc), level=messages.ERROR)
            else:
                self.message_user(request, result.message)


@admin.register(WorkloadTeamRule)
class WorkloadTeamRuleAdmin(admin.ModelAdmin[WorkloadTeamRule]):
    """Read-only: the fleet file's ``[[workload_teams]]`` own the rules (``fleet_apply``)."""

    list_display = ["position", "match", "team"]
    readonly_fields = ["position", "match_field", "pattern", "team"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
