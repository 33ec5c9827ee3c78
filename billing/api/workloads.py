"""``GET /api/v1/workloads``: who held the GPUs, with their hours and money (docs/api.md,
"Workloads"). Finance or admin. Every figure from ``billing.workloads.workload_figures``, the
function the Workloads page calls; rounded here for the wire only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from billing.api.csv import CsvRenderer, csv_response
from billing.api.serializers import (
    CommaListField,
    RangeQuerySerializer,
    _known,
    iso,
    money_str,
    num,
)
from billing.api.views import _ERRORS, FinanceAPIView, RowPagination
from billing.workloads import GROUP_BY, WorkloadFilters, WorkloadRow, workload_figures
from fleet.models import Site, Team
from fleet.selectors import team_cost_centers
from telemetry.models import WORKLOAD_KINDS

WORKLOAD_COLUMNS: tuple[str, ...] = (
    "key",
    "kind",
    "name",
    "user",
    "account",
    "team",
    "site",
    "gpus",
    "workloads",
    "first_seen",
    "last_seen",
    "gpu_hours",
    "air_hours",
    "held_hours",
    "utilization",
    "energy_kwh",
    "cost",
    "idle_cost",
    "currency",
    "priced",
)
# Grouped by team, a row also names the team's cost centre, after its key (chargeback).
WORKLOAD_TEAM_COLUMNS: tuple[str, ...] = ("key", "cost_center", *WORKLOAD_COLUMNS[1:])
QUERY_KEYS = frozenset(
    {"start", "end", "group_by", "kind", "user", "account", "team", "site", "format"}
    | {"limit", "offset"}
)


def workload_row_data(
    row: WorkloadRow, *, zone: ZoneInfo, cost_centers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One selector row as the API shows it (JSON) and exports it (CSV). With
    ``cost_centers`` (team name → cost centre) the row is a team's and names its cost centre
    ("" where none)."""
    data = {
        "key": row.key,
        "kind": row.kind,
        "name": row.name,
        "user": row.user,
        "account": row.account,
        "team": row.team,
        "site": row.site,
        "gpus": row.gpus,
        "workloads": row.workloads,
        "first_seen": iso(row.first_seen, zone) if row.first_seen else None,
        "last_seen": iso(row.last_seen, zone) if row.last_seen else None,
        "gpu_hours": num(row.gpu_hours),
        "air_hours": num(row.air_hours),
        "held_hours": num(row.held_hours),
        "utilization": num(row.utilization),
        "energy_kwh": num(row.energy_kwh),
        "cost": money_str(row.cost),
        "idle_cost": money_str(row.idle_cost),
        "currency": row.currency,
        "priced": row.priced,
    }
    if cost_centers is None:
        return data
    return {"key": row.key, "cost_center": cost_centers.get(row.key, ""), **data}


class WorkloadsQuerySerializer(RangeQuerySerializer):
    group_by = serializers.ChoiceField(
        choices=GROUP_BY,
        default="workload",
        help_text="One row per workload (site, kind, id), user, account or team.",
    )
    kind = CommaListField(required=False, help_text=f"Workload kinds: {', '.join(WORKLOAD_KINDS)}.")
    user = CommaListField(required=False, help_text="User names.")
    account = CommaListField(required=False, help_text="Accounts (Kubernetes: namespaces).")
    team = CommaListField(required=False, help_text="Team names (after [[workload_teams]]).")
    site = CommaListField(required=False, help_text="Site names (where the GPUs were).")

    def validate_kind(self, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in WORKLOAD_KINDS]
        if unknown:
            known = ", ".join(WORKLOAD_KINDS)
            raise serializers.ValidationError(f"unknown kind: {', '.join(unknown)} ({known})")
        return value

    def validate_team(self, value: list[str]) -> list[str]:
        return _known(value, Team, "name", "team")

    def validate_site(self, value: list[str]) -> list[str]:
        return _known(value, Site, "name", "site")


class WorkloadRowSerializer(serializers.Serializer[Any]):
    """Documents one workload row (what ``workload_row_data`` produces). Text fields that
    differ within a group (a user's accounts) are null."""

    key = serializers.CharField(help_text="Workload id, user, account or team name")
    cost_center = serializers.CharField(
        required=False,
        help_text="group_by=team only: the team's cost centre as the fleet file sets it "
        '("" where none)',
    )
    kind = serializers.CharField(allow_null=True, help_text="slurm, k8s, container or user")
    name = serializers.CharField(allow_null=True)
    user = serializers.CharField(allow_null=True)
    account = serializers.CharField(allow_null=True)
    team = serializers.CharField(allow_null=True)
    site = serializers.CharField(allow_null=True)
    gpus = serializers.IntegerField(help_text="Distinct GPUs held")
    workloads = serializers.IntegerField(help_text="Distinct workloads in the group")
    first_seen = serializers.DateTimeField(allow_null=True)
    last_seen = serializers.DateTimeField(allow_null=True)
    gpu_hours = serializers.FloatField(help_text="Σ share_s / 3600")
    air_hours = serializers.FloatField()
    held_hours = serializers.FloatField(help_text="GPU hours − air hours")
    utilization = serializers.FloatField(allow_null=True, help_text="air / GPU hours, 0–1")
    energy_kwh = serializers.FloatField()
    cost = serializers.DecimalField(max_digits=20, decimal_places=2)
    idle_cost = serializers.DecimalField(
        max_digits=20, decimal_places=2, help_text="Σ hourly cost × held / GPU hours"
    )
    currency = serializers.CharField()
    priced = serializers.BooleanField(help_text="false: a GPU without cost profile or site")


class WorkloadPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = WorkloadRowSerializer(many=True)


class WorkloadsView(FinanceAPIView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        operation_id="workloads_list",
        summary="Workloads (Slurm jobs, pods, containers, users) with their hours and money",
        description=(
            "One row per group over [start, end) (dates in the report time zone), the worst "
            "idle cost first. JSON is paginated (limit/offset); CSV (`format=csv` or "
            "`Accept: text/csv`) streams every row with the same columns. Money fields are "
            "decimal strings with two decimals, rounded half-up, in `currency`. An unknown "
            "parameter is an error (400 naming it)."
        ),
        parameters=[
            WorkloadsQuerySerializer,
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
            OpenApiParameter("limit", OpenApiTypes.INT, description="Rows per page (JSON)"),
            OpenApiParameter("offset", OpenApiTypes.INT, description="First row (JSON)"),
        ],
        responses={
            (200, "application/json"): WorkloadPageSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            **_ERRORS,
        },
        tags=["finance"],
    )
    def get(self, request: Request) -> Any:
        unknown = sorted(set(request.query_params) - QUERY_KEYS)
        if unknown:
            known = ", ".join(sorted(QUERY_KEYS))
            raise serializers.ValidationError({unknown[0]: [f"unknown parameter (known: {known})"]})
        _, zone, today = self.clock()
        query = WorkloadsQuerySerializer(data=request.query_params, context={"today": today})
        query.is_valid(raise_exception=True)
        params = query.validated_data
        paginator = RowPagination()
        paginator.get_limit(request), paginator.get_offset(request)  # 400 before any work
        filters = WorkloadFilters(
            kinds=tuple(params.get("kind", ())),
            users=tuple(params.get("user", ())),
            accounts=tuple(params.get("account", ())),
            teams=tuple(params.get("team", ())),
            sites=tuple(params.get("site", ())),
        )
        rows = workload_figures(
            start=params["start"], end=params["end"], group_by=params["group_by"], filters=filters
        )
        centers = team_cost_centers() if params["group_by"] == "team" else None
        if request.accepted_renderer.format == "csv":
            filename = "workloads_{}_{}_{}.csv".format(
                params["start"], params["end"], params["group_by"]
            )
            return csv_response(
                (workload_row_data(row, zone=zone, cost_centers=centers) for row in rows),
                columns=WORKLOAD_TEAM_COLUMNS if centers is not None else WORKLOAD_COLUMNS,
                filename=filename,
            )
        page = paginator.paginate_queryset(rows, request) or []
        return paginator.get_paginated_response(
            [workload_row_data(r, zone=zone, cost_centers=centers) for r in page]
        )
