from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from billing.models import (
    CostProfile,
    MonthClose,
    MonthCloseEvent,
    ReportSubscription,
    WeeklyReport,
    WorkloadTeamRule,
)
from billing.month_close import month_close, month_ended_check, month_reopen


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


class MonthCloseEventInline(admin.TabularInline[MonthCloseEvent, MonthClose]):
    """A close's history on its page: read-only, as the record must be."""

    model = MonthCloseEvent
    fields = ("action", "at", "by", "reason")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReopenForm(forms.Form):
    """The reason the admin action asks for before it reopens (``month_reopen`` records it)."""

    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Why the month is reopened: recorded with who and when.",
    )


@admin.register(MonthClose)
class MonthCloseAdmin(admin.ModelAdmin[MonthClose]):
    """Closes (docs/finance.md): add one to close a month; the actions close a reopened month
    again or reopen one through ``month_reopen`` (with a reason, latest month first), as
    ``close_month`` and ``reopen_month`` do. A close is never deleted: deleting it would
    reopen the month with no reason, no record and no latest-first check."""

    form = MonthCloseForm
    list_display = ["month", "closed", "closed_at", "closed_by", "segments_count"]
    actions = ["close_again", "reopen"]

    def get_inlines(self, request: HttpRequest, obj: MonthClose | None) -> Any:
        # The history on a close's page; the add form (closing a month) has none yet.
        return [MonthCloseEventInline] if obj is not None else []

    def has_delete_permission(self, request: HttpRequest, obj: MonthClose | None = None) -> bool:
        return False

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

    @admin.action(
        description="Reopen the selected months (asks for a reason)", permissions=["change"]
    )
    def reopen(self, request: HttpRequest, queryset: QuerySet[MonthClose]) -> HttpResponse | None:
        """A page asking for the reason first; then each month through ``month_reopen``, the
        latest first, so selecting April and March reopens both while March alone is refused
        under a closed April."""
        form = ReopenForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            for close in sorted(queryset, key=lambda c: c.month, reverse=True):
                try:
                    result = month_reopen(
                        month=close.month,
                        by=request.user.get_username(),
                        reason=form.cleaned_data["reason"],
                    )
                except ValueError as exc:
                    self.message_user(request, str(exc), level=messages.ERROR)
                else:
                    self.message_user(request, result.message)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Reopen months",
            "opts": self.model._meta,
            "closes": queryset,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/billing/monthclose/reopen.html", context)


@admin.register(MonthCloseEvent)
class MonthCloseEventAdmin(admin.ModelAdmin[MonthCloseEvent]):
    """Every close and reopen, read-only: the audit trail of docs/finance.md."""

    list_display = ["close", "action", "at", "by", "reason"]
    list_filter = ["action"]
    readonly_fields = ["close", "action", "at", "by", "reason"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkloadTeamRule)
class WorkloadTeamRuleAdmin(admin.ModelAdmin[WorkloadTeamRule]):
    """Read-only: the fleet file's ``[[workload_teams]]`` own the rules (``fleet_apply``)."""

    list_display = ["position", "match", "team"]
    readonly_fields = ["position", "match_field", "pattern", "team"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
