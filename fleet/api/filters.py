"""django-filter FilterSets of the inventory endpoints: related objects by their names."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Q, QuerySet
from django.utils import timezone

from fleet.models import Gpu, Node, Pool, Site, Team


class SiteFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    class Meta:
        model = Site
        fields = {"name": ["exact", "icontains"]}


class TeamFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    class Meta:
        model = Team
        fields = {"name": ["exact", "icontains"], "cost_center": ["exact"]}


class PoolFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    site = django_filters.CharFilter(field_name="site__name", help_text="Site name")
    team = django_filters.CharFilter(field_name="team__name", help_text="Team name")

    class Meta:
        model = Pool
        fields = {"name": ["exact", "icontains"]}


def _effective_site(queryset: QuerySet[Any], prefix: str, name: str) -> QuerySet[Any]:
    """The node's own site wins over its pool's (Node.effective_site)."""
    return queryset.filter(
        Q(**{f"{prefix}site__name": name})
        | Q(**{f"{prefix}site__isnull": True, f"{prefix}pool__site__name": name})
    )


class NodeFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    pool = django_filters.CharFilter(field_name="pool__name", help_text="Pool name")
    site = django_filters.CharFilter(method="filter_site", help_text="Effective site name")

    class Meta:
        model = Node
        fields = {"hostname": ["exact", "icontains"]}

    def filter_site(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        return _effective_site(queryset, "", value)


class GpuFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    node = django_filters.CharFilter(field_name="node__hostname", help_text="Node hostname")
    pool = django_filters.CharFilter(field_name="node__pool__name", help_text="Pool name")
    site = django_filters.CharFilter(method="filter_site", help_text="Effective site name")
    team = django_filters.CharFilter(
        method="filter_team", help_text="Effective team: the GPU's own, else its pool's"
    )
    model = django_filters.CharFilter(field_name="model__key", help_text="GPU model key")
    retired = django_filters.TypedChoiceFilter(
        method="filter_retired",
        choices=[("true", "true"), ("false", "false")],
        coerce=lambda value: value == "true",
        help_text="true: retired by now; false: not (yet) retired (any other value: 400)",
    )

    class Meta:
        model = Gpu
        fields = {"uuid": ["exact"]}

    def filter_site(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        return _effective_site(queryset, "node__", value)

    def filter_team(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        return queryset.filter(
            Q(team__name=value) | Q(team__isnull=True, node__pool__team__name=value)
        )

    def filter_retired(
        self, queryset: QuerySet[Any], name: str, value: bool | None
    ) -> QuerySet[Any]:
        if value is None:
            return queryset
        retired = Q(retired_at__isnull=False, retired_at__lte=timezone.now())
        return queryset.filter(retired) if value else queryset.exclude(retired)
