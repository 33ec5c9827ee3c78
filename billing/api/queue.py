"""``/api/v1/queue``: GET, who waited for GPUs while GPUs sat held (docs/api.md, "Queue"),
and POST, a node's snapshot of its cluster's pending jobs (``telemetry.api.views.
QueuePushView``, docs/ingest.md "Queue"), on one URL (DESIGN.md §9.2).

GET: any role (``fleet.view_dashboard``), by API token or session; the money column only for
finance and admin (``fleet.view_costs``): a viewer's rows, JSON and CSV, have no
``wanted_while_held_cost`` at all. Every figure from ``billing.selectors.queue.
queue_cost_rows``, the function the Queue page calls; rounded here for the wire only.
POST: as before, a node token only, throttled in the node's ingest window."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from billing.api.csv import CsvRenderer, csv_response
from billing.api.serializers import RangeQuerySerializer, money_str, num
from billing.api.views import _ERRORS, FinanceAPIView, RowPagination
from billing.selectors.queue import queue_cost_rows, queue_window
from fleet.permissions import CanViewDashboard
from telemetry.api.views import QueuePushView
from telemetry.queue_figures import GROUP_BYS

if TYPE_CHECKING:
    from rest_framework.permissions import _SupportsHasPermission

# The columns of DESIGN.md §9.2, in its order; the last is money (finance, admin).
QUEUE_COLUMNS: tuple[str, ...] = (
    "key",
    "waited_gpu_hours",
    "waited_gpu_hours_capacity",
    "waited_gpu_hours_policy",
    "waited_gpu_hours_user",
    "jobs",
    "wait_p50_s",
    "wait_p95_s",
    "wanted_while_held_gpu_hours",
    "wanted_while_held_cost",
)
QUEUE_HOURS_COLUMNS: tuple[str, ...] = QUEUE_COLUMNS[:-1]
QUERY_KEYS = frozenset({"start", "end", "group_by", "format", "limit", "offset"})


def queue_columns(*, money: bool) -> tuple[str, ...]:
    return QUEUE_COLUMNS if money else QUEUE_HOURS_COLUMNS


def queue_row_data(row: dict[str, Any], *, group_by: str, money: bool) -> dict[str, Any]:
    """One selector row as the API shows it (JSON) and exports it (CSV). A partition's key is
    ``cluster/partition`` (two clusters may both have a partition ``gpu``; a cluster name
    has no ``/``)."""
    key = row["key"]
    if group_by == "partition":
        key = f"{row['cluster']}/{key}"
    data: dict[str, Any] = {
        "key": key,
        "waited_gpu_hours": num(row["waited_gpu_hours"]),
        "waited_gpu_hours_capacity": num(row["waited_gpu_hours_capacity"]),
        "waited_gpu_hours_policy": num(row["waited_gpu_hours_policy"]),
        "waited_gpu_hours_user": num(row["waited_gpu_hours_user"]),
        "jobs": row["jobs"],
        "wait_p50_s": num(row["wait_p50_s"], 1),
        "wait_p95_s": num(row["wait_p95_s"], 1),
        "wanted_while_held_gpu_hours": num(row["wanted_while_held_gpu_hours"]),
    }
    if money:
        data["wanted_while_held_cost"] = money_str(row["wanted_while_held_cost"])
    return data


class QueueQuerySerializer(RangeQuerySerializer):
    group_by = serializers.ChoiceField(
        choices=GROUP_BYS,
        default="partition",
        help_text="One row per partition (key cluster/partition), account, user or cluster.",
    )


class QueueRowSerializer(serializers.Serializer[Any]):
    """Documents one queue row (what ``queue_row_data`` produces)."""

    key = serializers.CharField(
        help_text='cluster/partition, account, user or cluster ("" where the agent sent none)'
    )
    waited_gpu_hours = serializers.FloatField(help_text="Σ gpus × Δt / 3600, all classes")
    waited_gpu_hours_capacity = serializers.FloatField(
        help_text="Reasons Resources, Priority, ReqNodeNotAvail"
    )
    waited_gpu_hours_policy = serializers.FloatField(help_text="QOS*, Assoc*, *Limit*")
    waited_gpu_hours_user = serializers.FloatField(help_text="Dependency, JobHeld*, BeginTime, …")
    jobs = serializers.IntegerField(help_text="Jobs whose pending overlaps the range")
    wait_p50_s = serializers.FloatField(allow_null=True, help_text="Median wait, seconds")
    wait_p95_s = serializers.FloatField(allow_null=True, help_text="95th percentile wait, s")
    wanted_while_held_gpu_hours = serializers.FloatField(
        help_text="Per partition hour min(capacity-waited GPUs, held + parked GPUs of its "
        "pools) × 1 h; an account's or user's part by its share of the capacity wait"
    )
    wanted_while_held_cost = serializers.DecimalField(
        max_digits=20,
        decimal_places=2,
        required=False,
        help_text="Finance and admin only: those GPU hours at their GPUs' fixed hourly rate, "
        "in the fleet's currency",
    )


class QueuePageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = QueueRowSerializer(many=True)


class QueueView(FinanceAPIView, QueuePushView):
    """GET: the queue rows (any role; money for finance and admin). POST: a node's snapshot,
    exactly ``QueuePushView`` (its node-token authentication, permission and throttle)."""

    permission_classes = [CanViewDashboard]
    renderer_classes = [JSONRenderer, CsvRenderer]

    _method = "GET"

    def initialize_request(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Request:
        # What the request's authenticators depend on, known before DRF's request exists
        # (drf-spectacular builds its mock requests here too, one per method).
        self._method = request.method or "GET"
        return super().initialize_request(request, *args, **kwargs)

    def _push(self) -> bool:
        return self._method == "POST"

    def get_authenticators(self) -> list[BaseAuthentication]:
        if self._push():
            return [auth() for auth in QueuePushView.authentication_classes]
        # The API's own (API token, session): FinanceAPIView states none of its own.
        return [auth() for auth in FinanceAPIView.authentication_classes]

    def get_permissions(self) -> Sequence[_SupportsHasPermission]:
        if self._push():
            return [permission() for permission in QueuePushView.permission_classes]
        return [permission() for permission in self.permission_classes]

    def get_renderers(self) -> list[BaseRenderer]:
        if self._push():
            return [renderer() for renderer in QueuePushView.renderer_classes]
        return [renderer() for renderer in self.renderer_classes]

    def get_throttles(self) -> list[BaseThrottle]:
        if self._push():
            return [throttle() for throttle in QueuePushView.throttle_classes]
        return []

    @extend_schema(
        operation_id="queue_list",
        summary="Queue pressure: GPU hours waited, waits, and wanted while GPUs sat held",
        description=(
            "One row per group over [start, end) (dates in the report time zone; the UTC "
            "hours that start in it), the most waited GPU hours first. Any role; "
            "`wanted_while_held_cost` only for finance and admin (a viewer's rows have no "
            "such field, JSON or CSV). JSON is paginated (limit/offset); CSV (`format=csv` "
            "or `Accept: text/csv`) streams every row with the same columns. Money is a "
            "decimal string with two decimals, rounded half-up, in the fleet's currency. An "
            "unknown parameter is an error (400 naming it)."
        ),
        parameters=[
            QueueQuerySerializer,
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
            OpenApiParameter("limit", OpenApiTypes.INT, description="Rows per page (JSON)"),
            OpenApiParameter("offset", OpenApiTypes.INT, description="First row (JSON)"),
        ],
        responses={
            (200, "application/json"): QueuePageSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            **_ERRORS,
            403: OpenApiResponse(description="Authenticated, but with no role"),
        },
        tags=["queue"],
    )
    def get(self, request: Request) -> Any:
        unknown = sorted(set(request.query_params) - QUERY_KEYS)
        if unknown:
            known = ", ".join(sorted(QUERY_KEYS))
            raise serializers.ValidationError({unknown[0]: [f"unknown parameter (known: {known})"]})
        fleet_settings, _, today = self.clock()
        query = QueueQuerySerializer(data=request.query_params, context={"today": today})
        query.is_valid(raise_exception=True)
        params = query.validated_data
        paginator = RowPagination()
        paginator.get_limit(request), paginator.get_offset(request)  # 400 before any work
        money = request.user.has_perm("fleet.view_costs")
        group_by = params["group_by"]
        start, end = queue_window(
            start=params["start"], end=params["end"], zone_name=fleet_settings.report_time_zone
        )
        rows = queue_cost_rows(start=start, end=end, group_by=group_by, money=money)
        if request.accepted_renderer.format == "csv":
            filename = "queue_{}_{}_{}.csv".format(params["start"], params["end"], group_by)
            return csv_response(
                (queue_row_data(row, group_by=group_by, money=money) for row in rows),
                columns=queue_columns(money=money),
                filename=filename,
            )
        page = paginator.paginate_queryset(rows, request) or []
        return paginator.get_paginated_response(
            [queue_row_data(row, group_by=group_by, money=money) for row in page]
        )
