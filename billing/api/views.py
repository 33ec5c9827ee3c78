"""Finance API (docs/api.md): costs as JSON or streamed CSV, break-even, cost profiles.

Views are thin: every figure comes from ``billing.selectors``, the same functions the dashboard
and the weekly email call, and is only rounded here for the wire.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from billing import focus, selectors
from billing.api.csv import CsvRenderer, csv_response
from billing.api.filters import CostProfileFilterSet
from billing.api.serializers import (
    BreakevenQuerySerializer,
    BreakevenSerializer,
    CostPageSerializer,
    CostProfileSerializer,
    CostsQuerySerializer,
    FocusQuerySerializer,
    breakeven_arguments,
    breakeven_data,
    cost_columns,
    cost_row_data,
)
from billing.models import CostProfile
from config.api import Pagination, ProtectedDeleteMixin
from fleet.models import FleetSettings
from fleet.permissions import CanViewCosts, CanViewCostsOrManageWrites
from fleet.selectors import team_cost_centers

_ERRORS = {
    400: OpenApiResponse(description="A bad parameter; the body names it"),
    401: OpenApiResponse(description="No or an invalid token / session"),
    403: OpenApiResponse(description="Authenticated, but not finance or admin"),
}


def period_chunks(start: dt.date, end: dt.date, period: str) -> Iterator[tuple[dt.date, dt.date]]:
    """Split [start, end) into sub-ranges whose edges are period edges, so that computing each
    sub-range alone gives exactly the rows of the whole (a bucket never straddles two chunks).

    Days and months: calendar months. Weeks: four ISO weeks, cut on Mondays. ``all``: one
    chunk, since its one row per group needs the whole range (and is small: one per group).
    """
    if period == "all":
        yield start, end
        return
    cursor = start
    while cursor < end:
        if period == "week":
            monday = cursor - dt.timedelta(days=cursor.weekday())
            edge = monday + dt.timedelta(weeks=4)
        else:
            edge = (cursor.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
        nxt = min(edge, end)
        yield cursor, nxt
        cursor = nxt


def cost_rows_chunked(
    *, start: dt.date, end: dt.date, group_by: str, period: str, filters: selectors.Filters
) -> Iterator[selectors.CostRow]:
    """The rows of ``selectors.cost_rows`` over [start, end) in the same order (period_start,
    then key), computed one month (or four weeks) at a time. Only one chunk's rows are in
    memory at once: a year of daily rows for 1,000 GPUs is ~31,000 rows per chunk, not
    365,000. The fleet is read once for all the chunks."""
    return selectors.cost_rows_in_parts(
        start=start,
        end=end,
        parts=period_chunks(start, end, period),
        group_by=group_by,
        period=period,
        filters=filters,
    )


class RowPagination(Pagination):
    """Limit/offset pages of computed rows (a list), with ``count``: up to 10,000 a page."""

    max_limit = 10_000


class CostRowPagination(RowPagination):
    """The costs' JSON pages. By default a cursor: ``next`` carries the place of the page's
    last row, and the next page is computed from its bucket on (no ``count``, forward only),
    so each page costs what its rows cost. With ``offset``, limit/offset pages with ``count``
    as before: the rows of each bucket are counted without computing them where the fleet
    allows (``selectors.cost_rows_counted``), and the page's buckets computed.
    The order is the selectors' (period_start, key), so pages are stable either way. Bad
    values answer 400 naming the parameter (config.api.Pagination)."""

    cursor_query_param = "cursor"

    def read(self, request: Request) -> tuple[int, int | None, selectors.RowPlace | None]:
        """(limit, offset or None for a cursor page, the cursor's place), or 400."""
        self.request = request
        self.limit = self.get_limit(request) or self.default_limit or 100
        raw = request.query_params.get(self.cursor_query_param)
        if self.offset_query_param in request.query_params:
            if raw is not None:
                raise ValidationError({"cursor": ["give either cursor or offset, not both"]})
            self.offset = self.get_offset(request)
            return self.limit, self.offset, None
        return self.limit, None, None if raw is None else cursor_place(raw)

    def counted_response(self, count: int, results: list[Any]) -> Response:
        self.count = count
        return self.get_paginated_response(results)

    def cursor_response(
        self, request: Request, place: selectors.RowPlace | None, results: list[Any]
    ) -> Response:
        following = None
        if place is not None:
            url = request.build_absolute_uri()
            following = replace_query_param(url, self.cursor_query_param, cursor_token(place))
        return Response({"next": following, "results": results})


def cursor_token(place: selectors.RowPlace) -> str:
    """A place as an opaque URL-safe token (base64 of a JSON list)."""
    raw = json.dumps([place[0].isoformat(), place[1], place[2]], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def cursor_place(text: str) -> selectors.RowPlace:
    try:
        day, key, adjusts = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        place = (dt.date.fromisoformat(day), key, adjusts)
        if not (isinstance(key, str) and isinstance(adjusts, str)):
            raise TypeError(key)
    except (ValueError, TypeError):
        raise ValidationError(
            {"cursor": ["not a cursor of this API: follow `next` as given"]}
        ) from None
    return place


class FinanceAPIView(APIView):
    """Money endpoints: finance or admin, by API token or session."""

    permission_classes = [CanViewCosts]
    renderer_classes = [JSONRenderer]

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        # Errors are JSON even when CSV was asked for: a client must be able to read them.
        renderer = getattr(request, "accepted_renderer", None)
        if isinstance(response, Response) and response.status_code >= 400 and renderer:
            if getattr(renderer, "format", None) != "json":
                request.accepted_renderer = JSONRenderer()
                request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    def clock(self) -> tuple[FleetSettings, Any, dt.date]:
        fleet_settings = FleetSettings.load()
        zone = fleet_settings.report_zone
        return fleet_settings, zone, timezone.now().astimezone(zone).date()


class CostsView(FinanceAPIView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        operation_id="costs_list",
        summary="Usage and cost rows per group and period",
        description=(
            "One row per group and period over [start, end) (dates in the report time zone). "
            "JSON is paginated in a stable order (period_start, key): by a cursor (follow "
            "`next`; each page computes only its rows), or with `offset` by limit/offset "
            "with `count` (rows counted per period, only the page's periods computed). CSV "
            "(`format=csv` or `Accept: text/csv`) streams every row with the same columns. "
            "Grouped by team, each row names the team's `cost_center` after its `name`. "
            "Money fields are decimal strings with two decimals, rounded half-up, in "
            "`currency`."
        ),
        parameters=[
            CostsQuerySerializer,
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
            OpenApiParameter("limit", OpenApiTypes.INT, description="Rows per page (JSON)"),
            OpenApiParameter(
                "cursor",
                OpenApiTypes.STR,
                description="Where the page starts: the token in the previous page's `next`",
            ),
            OpenApiParameter(
                "offset",
                OpenApiTypes.INT,
                description="First row (JSON): limit/offset pages with `count` instead of a cursor",
            ),
        ],
        responses={
            (200, "application/json"): CostPageSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            **_ERRORS,
        },
        tags=["finance"],
    )
    def get(self, request: Request) -> Any:
        fleet_settings, zone, today = self.clock()
        query = CostsQuerySerializer(data=request.query_params, context={"today": today})
        query.is_valid(raise_exception=True)
        params = query.validated_data
        paginator = CostRowPagination()
        limit, offset, after = paginator.read(request)  # 400 before any work
        filters = selectors.Filters(
            sites=tuple(params.get("site", ())),
            pools=tuple(params.get("pool", ())),
            teams=tuple(params.get("team", ())),
            models=tuple(params.get("model", ())),
        )
        wanted = {
            "start": params["start"],
            "end": params["end"],
            "group_by": params["group_by"],
            "period": params["period"],
            "filters": filters,
        }
        # Grouped by team, each row names its team's cost centre (chargeback).
        centers = team_cost_centers() if params["group_by"] == "team" else None
        if request.accepted_renderer.format == "csv":
            filename = "costs_{}_{}_{}_{}.csv".format(
                params["start"], params["end"], params["group_by"], params["period"]
            )
            return csv_response(
                (
                    cost_row_data(row, zone=zone, cost_centers=centers)
                    for row in cost_rows_chunked(**wanted)
                ),
                columns=cost_columns(params["group_by"]),
                filename=filename,
            )
        if offset is None:
            rows, place = selectors.cost_rows_after(**wanted, after=after, limit=limit)
            data = [cost_row_data(r, zone=zone, cost_centers=centers) for r in rows]
            return paginator.cursor_response(request, place, data)
        parts = period_chunks(params["start"], params["end"], params["period"])
        count, rows = selectors.cost_rows_counted(**wanted, parts=parts, offset=offset, limit=limit)
        data = [cost_row_data(r, zone=zone, cost_centers=centers) for r in rows]
        return paginator.counted_response(count, data)


class FocusView(FinanceAPIView):
    renderer_classes = [CsvRenderer, JSONRenderer]

    @extend_schema(
        operation_id="focus_export",
        summary="FinOps FOCUS export: one row per GPU, day and charge (CSV)",
        description=(
            "The FinOps Foundation's FOCUS format over [start, end) (local days of the report "
            "time zone; every time in the file is UTC). Owned GPUs: a fixed charge "
            "(depreciation and opex, per GPU-hour of capacity) and an energy charge (per "
            "kWh); rented GPUs: a rental charge. Amounts are unrounded (ten decimals), so "
            "sums equal the costs API to the cent. `version` 1.2 (default) or 1.0: exactly "
            "that version's columns, then custom `x_` columns. An empty range gives the "
            "header only. See docs/finance.md."
        ),
        parameters=[FocusQuerySerializer],
        responses={(200, "text/csv"): OpenApiTypes.STR, **_ERRORS},
        tags=["finance"],
    )
    def get(self, request: Request) -> Any:
        _, _, today = self.clock()
        query = FocusQuerySerializer(data=request.query_params, context={"today": today})
        query.is_valid(raise_exception=True)
        params = query.validated_data
        version = params["version"]
        charges = focus.focus_charges(start=params["start"], end=params["end"])
        return csv_response(
            (focus.focus_row(charge, version=version) for charge in charges),
            columns=focus.COLUMNS[version],
            filename="focus-{}_{}_{}.csv".format(version, params["start"], params["end"]),
        )


class BreakevenView(FinanceAPIView):
    @extend_schema(
        operation_id="breakeven_retrieve",
        summary="Break-even of owning a pool, or the whole fleet, against an API price (and "
        "renting); a rented pool: renting against the API (and owning)",
        parameters=[BreakevenQuerySerializer],
        responses={
            200: BreakevenSerializer,
            **_ERRORS,
            404: OpenApiResponse(description="No pool of that name"),
        },
        tags=["finance"],
    )
    def get(self, request: Request) -> Response:
        _, zone, today = self.clock()
        query = BreakevenQuerySerializer(data=request.query_params, context={"today": today})
        query.is_valid(raise_exception=True)
        params = dict(query.validated_data)
        workload, measured = selectors.breakeven_workload_measured(
            pool=params.get("pool"), start=params["start"], end=params["end"]
        )
        if "tokens_per_s" in params:
            source = "query"
        else:
            source = "measured" if measured is not None else "fleet file"
        try:
            result = selectors.breakeven_compute(**breakeven_arguments(params, workload))
        except LookupError:
            return Response({"pool": [f"no pool named {params['pool']!r}"]}, status=404)
        except ValueError as exc:
            message = str(exc)
            field = next((name for name in query.fields if message.startswith(str(name))), None)
            return Response({field: [message]} if field else {"detail": message}, status=400)
        return Response({**breakeven_data(result, zone=zone), "tokens_per_s_source": source})


class CostProfileViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet[CostProfile]):
    """How GPUs are paid for (owned or rented), per GPU, node, pool or site. The next
    ``fleet_apply`` makes the profiles exactly those of the fleet file again."""

    queryset = CostProfile.objects.order_by("scope_kind", "scope_name", "pk")
    serializer_class = CostProfileSerializer
    filterset_class = CostProfileFilterSet
    permission_classes = [CanViewCostsOrManageWrites]
