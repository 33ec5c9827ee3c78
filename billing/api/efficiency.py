"""``GET /api/v1/efficiency``: what training loops reported, per workload, model, pool or team
(docs/api.md, "Job efficiency"; DESIGN.md §9.4). Any role; the money (``cost_per_mtok``)
only for finance and admin. Every figure from ``billing.efficiency.efficiency_figures``;
rounded here for the wire only."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from billing.api.csv import CsvRenderer, csv_response
from billing.api.serializers import RangeQuerySerializer, num, rate_str
from billing.api.views import _ERRORS, FinanceAPIView, RowPagination
from billing.efficiency import GROUP_BY, EfficiencyFigures, efficiency_figures
from fleet.permissions import CanViewDashboard

EFFICIENCY_COLUMNS: tuple[str, ...] = (
    "key",
    "kind",
    "gpu_hours",
    "steps",
    "samples",
    "tokens",
    "mfu",
    "data_starved_share",
    "checkpoint_share",
    "tokens_per_gpu_hour",
)
# What only finance and admin see.
MONEY_COLUMNS: tuple[str, ...] = ("cost_per_mtok", "currency", "priced")
QUERY_KEYS = frozenset({"start", "end", "group_by", "format", "limit", "offset"})
# Shares and MFU are fractions: four decimals keep a tenth of a percent.
SHARE_DECIMALS = 4


def efficiency_row_data(figures: EfficiencyFigures, *, money: bool) -> dict[str, Any]:
    """One row as the API shows it (JSON) and exports it (CSV); ``money``: with the cost per
    million tokens (finance, admin)."""
    row = figures.row
    data: dict[str, Any] = {
        "key": row.key,
        "kind": row.kind,
        "gpu_hours": num(row.gpu_hours),
        "steps": num(row.steps),
        "samples": num(row.samples),
        "tokens": num(row.tokens),
        "mfu": num(row.mfu, SHARE_DECIMALS),
        "data_starved_share": num(row.data_starved_share, SHARE_DECIMALS),
        "checkpoint_share": num(row.checkpoint_share, SHARE_DECIMALS),
        "tokens_per_gpu_hour": num(row.tokens_per_gpu_hour),
    }
    if money:
        data["cost_per_mtok"] = rate_str(figures.cost_per_mtok)
        data["currency"] = figures.currency
        data["priced"] = figures.priced
    return data


class EfficiencyQuerySerializer(RangeQuerySerializer):
    group_by = serializers.ChoiceField(
        choices=GROUP_BY,
        default="workload",
        help_text="One row per workload (its id), training model name, pool or team.",
    )


class EfficiencyRowSerializer(serializers.Serializer[Any]):
    """Documents one row (what ``efficiency_row_data`` produces)."""

    key = serializers.CharField(help_text="Workload id, model name, pool or team name")
    kind = serializers.CharField(allow_null=True, help_text="group_by=workload: slurm, k8s, …")
    gpu_hours = serializers.FloatField(help_text="Σ wall_s of the job sums / 3600")
    steps = serializers.FloatField()
    samples = serializers.FloatField()
    tokens = serializers.FloatField()
    mfu = serializers.FloatField(
        allow_null=True,
        help_text="flops / (dense bf16 peak × GPU seconds), 0–1; null: no peak known or no flops",
    )
    data_starved_share = serializers.FloatField(allow_null=True, help_text="data_wait_s / wall_s")
    checkpoint_share = serializers.FloatField(allow_null=True, help_text="ckpt_s / wall_s")
    tokens_per_gpu_hour = serializers.FloatField(allow_null=True)
    cost_per_mtok = serializers.DecimalField(
        max_digits=20,
        decimal_places=6,
        allow_null=True,
        required=False,
        help_text="Finance and admin only: the cost of the GPU hours reported / tokens × 1e6; "
        "null without tokens",
    )
    currency = serializers.CharField(required=False, help_text="Finance and admin only")
    priced = serializers.BooleanField(
        required=False,
        help_text="Finance and admin only; false: a GPU without cost profile or site",
    )


class EfficiencyPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = EfficiencyRowSerializer(many=True)


class EfficiencyView(FinanceAPIView):
    # Any role: viewers see the rows without money (DESIGN.md §9.4).
    permission_classes = [CanViewDashboard]
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        operation_id="efficiency_list",
        summary="Job efficiency (MFU, data-starved and checkpoint shares, cost per Mtok)",
        description=(
            "What training loops reported through gpufleet_hook, one row per group over "
            "[start, end) (dates in the report time zone), most GPU hours first. JSON is "
            "paginated (limit/offset); CSV (`format=csv` or `Accept: text/csv`) streams every "
            "row with the same columns. `cost_per_mtok`, `currency` and `priced` are only "
            "there for finance and admin. An unknown parameter is an error (400 naming it)."
        ),
        parameters=[
            EfficiencyQuerySerializer,
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
            OpenApiParameter("limit", OpenApiTypes.INT, description="Rows per page (JSON)"),
            OpenApiParameter("offset", OpenApiTypes.INT, description="First row (JSON)"),
        ],
        responses={
            (200, "application/json"): EfficiencyPageSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            **_ERRORS,
            403: OpenApiResponse(description="Authenticated, but no role"),
        },
        tags=["finance"],
    )
    def get(self, request: Request) -> Any:
        unknown = sorted(set(request.query_params) - QUERY_KEYS)
        if unknown:
            known = ", ".join(sorted(QUERY_KEYS))
            raise serializers.ValidationError({unknown[0]: [f"unknown parameter (known: {known})"]})
        _, _, today = self.clock()
        query = EfficiencyQuerySerializer(data=request.query_params, context={"today": today})
        query.is_valid(raise_exception=True)
        params = query.validated_data
        paginator = RowPagination()
        paginator.get_limit(request), paginator.get_offset(request)  # 400 before any work
        money = bool(request.user.has_perm("fleet.view_costs"))
        rows = efficiency_figures(
            start=params["start"], end=params["end"], group_by=params["group_by"]
        )
        if request.accepted_renderer.format == "csv":
            filename = "efficiency_{}_{}_{}.csv".format(
                params["start"], params["end"], params["group_by"]
            )
            return csv_response(
                (efficiency_row_data(row, money=money) for row in rows),
                columns=EFFICIENCY_COLUMNS + MONEY_COLUMNS if money else EFFICIENCY_COLUMNS,
                filename=filename,
            )
        page = paginator.paginate_queryset(rows, request) or []
        return paginator.get_paginated_response([efficiency_row_data(r, money=money) for r in page])
