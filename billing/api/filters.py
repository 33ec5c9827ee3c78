"""django-filter FilterSet of the cost-profile endpoint."""

from __future__ import annotations

import django_filters

from billing.models import CostProfile


class CostProfileFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    class Meta:
        model = CostProfile
        fields = {"scope_kind": ["exact"], "scope_name": ["exact"], "kind": ["exact"]}
