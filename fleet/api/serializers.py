"""Inventory shapes for the REST API. Related objects are named by their natural keys (site,
pool and team names, node hostnames, GPU model keys), the same names the fleet file and the
finance API's ``key`` column use. Tokens never appear here, not even their hashes."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rest_framework import serializers

from fleet.models import Gpu, GpuModel, Node, Pool, Site, Team


class NameRelatedField(serializers.SlugRelatedField):  # type: ignore[type-arg]
    """A related object named by its natural key; a NUL byte (which no name holds and
    PostgreSQL refuses in text) is an invalid name, answered 400 before any query."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("invalid")
        return super().to_internal_value(data)


class SiteSerializer(serializers.ModelSerializer[Site]):
    class Meta:
        model = Site
        fields = ["id", "name", "pue", "price_per_kwh", "grid_g_per_kwh", "time_zone"]

    def validate_time_zone(self, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise serializers.ValidationError(f"unknown time zone {value!r}") from exc
        return value


class TeamSerializer(serializers.ModelSerializer[Team]):
    class Meta:
        model = Team
        fields = ["id", "name", "cost_center"]


class PoolSerializer(serializers.ModelSerializer[Pool]):
    site = NameRelatedField(
        slug_field="name", queryset=Site.objects.all(), allow_null=True, required=False
    )
    team = NameRelatedField(
        slug_field="name", queryset=Team.objects.all(), allow_null=True, required=False
    )

    class Meta:
        model = Pool
        fields = ["id", "name", "site", "team"]


class NodeSerializer(serializers.ModelSerializer[Node]):
    pool = NameRelatedField(
        slug_field="name", queryset=Pool.objects.all(), allow_null=True, required=False
    )
    site = NameRelatedField(
        slug_field="name",
        queryset=Site.objects.all(),
        allow_null=True,
        required=False,
        help_text="Overrides the pool's site",
    )
    effective_site = serializers.CharField(
        source="effective_site.name",
        read_only=True,
        allow_null=True,
        help_text="The node's site, else its pool's",
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "hostname",
            "pool",
            "site",
            "effective_site",
            "reported_hostname",
            "agent_version",
            "driver_version",
            "last_seen_at",
            "spool_dropped_total",
            "created_at",
        ]
        read_only_fields = [
            "reported_hostname",
            "agent_version",
            "driver_version",
            "last_seen_at",
            "spool_dropped_total",
            "created_at",
        ]


class GpuSerializer(serializers.ModelSerializer[Gpu]):
    node = NameRelatedField(slug_field="hostname", queryset=Node.objects.all())
    model = NameRelatedField(
        slug_field="key", queryset=GpuModel.objects.all(), allow_null=True, required=False
    )
    team = NameRelatedField(
        slug_field="name",
        queryset=Team.objects.all(),
        allow_null=True,
        required=False,
        help_text="Overrides the pool's team",
    )
    pool = serializers.CharField(source="node.pool.name", read_only=True, allow_null=True)
    site = serializers.CharField(source="node.effective_site.name", read_only=True, allow_null=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "uuid",
            "node",
            "index",
            "name",
            "serial",
            "model",
            "memory_total_bytes",
            "power_limit_w",
            "team",
            "pool",
            "site",
            "in_service_at",
            "retired_at",
            "first_seen_at",
            "last_seen_at",
            "lost_at",
            "created_at",
        ]
        read_only_fields = ["first_seen_at", "last_seen_at", "lost_at", "created_at"]

    def validate_uuid(self, value: str) -> str:
        # The UUID is how agents and the cost history name the GPU: it is fixed once created.
        if self.instance is not None and value != self.instance.uuid:
            raise serializers.ValidationError("cannot be changed")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def value(name: str) -> Any:
            if name in attrs:
                return attrs[name]
            return getattr(self.instance, name) if self.instance is not None else None

        start, end = value("in_service_at"), value("retired_at")
        if start and end and end <= start:
            raise serializers.ValidationError({"retired_at": ["must be after in_service_at"]})
        return attrs
