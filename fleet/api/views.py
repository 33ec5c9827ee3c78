"""Inventory endpoints, NetBox style: one router entry, ModelViewSet, FilterSet and serializer
each. Reads for finance and admin (sites carry tariffs, i.e. money), writes for admin only."""

from __future__ import annotations

from rest_framework import viewsets

from config.api import ProtectedDeleteMixin
from fleet.api import filters, serializers
from fleet.models import Gpu, Node, Pool, Site, Team
from fleet.permissions import CanViewCostsOrManageWrites

# Nodes and GPUs carry samples and cost history: they are retired (GPU ``retired_at``), never
# deleted through the API, as with the fleet file (docs/deploy.md).
NO_DELETE = ["get", "post", "put", "patch", "head", "options"]


class SiteViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet[Site]):
    """Sites: PUE, electricity price and grid carbon intensity."""

    queryset = Site.objects.order_by("name", "pk")
    serializer_class = serializers.SiteSerializer
    filterset_class = filters.SiteFilterSet
    permission_classes = [CanViewCostsOrManageWrites]


class TeamViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet[Team]):
    """Teams that GPU time is charged back to."""

    queryset = Team.objects.order_by("name", "pk")
    serializer_class = serializers.TeamSerializer
    filterset_class = filters.TeamFilterSet
    permission_classes = [CanViewCostsOrManageWrites]


class PoolViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet[Pool]):
    """Pools of nodes, each at a site and for a team."""

    queryset = Pool.objects.select_related("site", "team").order_by("name", "pk")
    serializer_class = serializers.PoolSerializer
    filterset_class = filters.PoolFilterSet
    permission_classes = [CanViewCostsOrManageWrites]


class NodeViewSet(viewsets.ModelViewSet[Node]):
    """GPU servers. Created by ``issue_node_token`` or here; never deleted through the API."""

    queryset = Node.objects.select_related("pool", "pool__site", "site").order_by("hostname", "pk")
    serializer_class = serializers.NodeSerializer
    filterset_class = filters.NodeFilterSet
    permission_classes = [CanViewCostsOrManageWrites]
    http_method_names = NO_DELETE


class GpuViewSet(viewsets.ModelViewSet[Gpu]):
    """GPUs. Registered by their agents; retire one with ``retired_at`` instead of deleting."""

    queryset = Gpu.objects.select_related(
        "node", "node__pool", "node__pool__site", "node__site", "model", "team"
    ).order_by("node__hostname", "index", "uuid", "pk")
    serializer_class = serializers.GpuSerializer
    filterset_class = filters.GpuFilterSet
    permission_classes = [CanViewCostsOrManageWrites]
    http_method_names = NO_DELETE
