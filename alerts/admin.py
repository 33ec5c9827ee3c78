"""Read-only views of alert state: rules come from the fleet file, alerts and deliveries
from the evaluator; editing them here would bypass both."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from alerts.models import Alert, Delivery, DeliveryAttempt, Rule


class _ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Rule)
class RuleAdmin(_ReadOnly):
    list_display = ["name", "kind", "scope", "threshold", "window_hours", "repeat_hours", "active"]
    list_filter = ["kind", "active"]


@admin.register(Alert)
class AlertAdmin(_ReadOnly):
    list_display = ["rule", "subject_label", "value", "firing_since", "resolved_at", "notices"]
    list_filter = ["rule"]


@admin.register(Delivery)
class DeliveryAdmin(_ReadOnly):
    list_display = ["alert", "event", "channel", "status", "attempts", "created_at", "sent_at"]
    list_filter = ["status", "channel", "event"]


@admin.register(DeliveryAttempt)
class DeliveryAttemptAdmin(_ReadOnly):
    list_display = ["delivery", "number", "started_at", "ok", "status_code", "duration_ms"]
