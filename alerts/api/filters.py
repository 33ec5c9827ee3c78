"""Filters of ``GET /api/v1/alerts`` (django-filter: a bad value answers 400 naming it)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet

from alerts.models import FIRING, RESOLVED, Alert
from alerts.rules import RULE_KINDS
from fleet.bounds import date_error


def _bounded(value: Any) -> None:
    if isinstance(value, dt.datetime):
        error = date_error(value.date())
        if error is not None:
            raise ValidationError(error, code="date_range")


class AlertFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    state = django_filters.ChoiceFilter(
        choices=[(FIRING, FIRING), (RESOLVED, RESOLVED)],
        method="filter_state",
        help_text="firing: open now; resolved: closed (any other value: 400)",
    )
    rule = django_filters.CharFilter(field_name="rule__name", help_text="A rule's name")
    rule_kind = django_filters.ChoiceFilter(
        field_name="rule__kind",
        choices=[(k, k) for k in RULE_KINDS],
        help_text="The rule kind, e.g. gpu_held_hours",
    )
    subject = django_filters.CharFilter(
        field_name="subject", help_text="Exactly, e.g. gpu:GPU-2f6e… or pool:training or fleet"
    )
    since = django_filters.IsoDateTimeFilter(
        method="filter_since",
        validators=[_bounded],
        help_text="Alerts firing at or after this moment (ISO 8601): open, or resolved since",
    )
    until = django_filters.IsoDateTimeFilter(
        field_name="firing_since",
        lookup_expr="lt",
        validators=[_bounded],
        help_text="Alerts that started firing before this moment (ISO 8601)",
    )

    class Meta:
        model = Alert
        fields: list[str] = []

    def filter_state(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        if value == FIRING:
            return queryset.filter(resolved_at__isnull=True)
        return queryset.filter(resolved_at__isnull=False)

    def filter_since(self, queryset: QuerySet[Any], name: str, value: Any) -> QuerySet[Any]:
        return queryset.filter(Q(resolved_at__isnull=True) | Q(resolved_at__gte=value))
