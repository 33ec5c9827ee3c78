"""``GET /api/v1/alerts`` (docs/alerts.md): any role; money values only for finance and
admin. Thin: rows come from ``alerts.selectors``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from alerts import figures
from alerts.api.filters import AlertFilterSet
from alerts.api.serializers import AlertSerializer
from alerts.models import Alert
from alerts.selectors import alert_data, alerts_query
from fleet.models import FleetSettings
from fleet.permissions import CanViewDashboard


class AlertListView(generics.ListAPIView[Alert]):
    """Alerts, open ones first (newest first), then resolved ones, most recent first."""

    permission_classes = [CanViewDashboard]
    renderer_classes = [JSONRenderer]
    serializer_class = AlertSerializer
    filterset_class = AlertFilterSet

    def get_queryset(self) -> Any:
        return alerts_query()

    @extend_schema(
        operation_id="alerts_list",
        summary="Alerts: firing and resolved, with who was told",
        description=(
            "One alert per firing episode of a rule for a subject (a GPU, or the rule's "
            "scope). Paginated (limit/offset). Money values (idle_cost_above, budget_month) "
            "are null with `values_hidden: true` for callers who may not see money."
        ),
        parameters=[
            # A filter by method: its type is stated here (the schema cannot infer it).
            OpenApiParameter(
                "since",
                OpenApiTypes.DATETIME,
                description="Alerts firing at or after this moment (ISO 8601): open, or "
                "resolved since",
            )
        ],
        responses={
            200: AlertSerializer(many=True),
            400: OpenApiResponse(description="A bad filter; the body names it"),
            401: OpenApiResponse(description="No or an invalid token / session"),
            403: OpenApiResponse(description="Authenticated, but no role"),
        },
        tags=["alerts"],
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        costs = bool(request.user.has_perm("fleet.view_costs"))
        currency = FleetSettings.load().currency
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        with figures.memo():  # the report time zone, read once for every row's link
            rows = [alert_data(a, costs=costs, currency=currency) for a in page or []]
        return self.get_paginated_response(rows)
