"""DRF glue shared by every API: the exception handler that turns database outages into 503."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, InterfaceError, OperationalError
from django.db.models import ProtectedError
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

# Offsets past PostgreSQL's bigint would reach the database as an error, not an empty page.
_MAX_OFFSET = 2**63 - 1


class Pagination(LimitOffsetPagination):
    """Limit/offset pages with bounded sizes: ``limit`` 1–``max_limit`` (1,000), ``offset`` a
    whole number within bigint. A bad value answers 400 naming the parameter; DRF's own
    pagination falls back to the defaults silently, which hid typos in clients."""

    max_limit = 1000

    def get_limit(self, request: Request) -> int | None:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        return _whole_number(raw, self.limit_query_param, low=1, high=self.max_limit or _MAX_OFFSET)

    def get_offset(self, request: Request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        return _whole_number(raw, self.offset_query_param, low=0, high=_MAX_OFFSET)


def _whole_number(raw: str, name: str, *, low: int, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: [f"must be a whole number from {low} to {high}"]}) from None
    if not low <= value <= high:
        raise ValidationError({name: [f"must be a whole number from {low} to {high}"]})
    return value


logger = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    if isinstance(exc, DataError | IntegrityError):
        # The request carried a value the database refuses (out of range, NUL byte, a clash):
        # the client's fault and not worth retrying, so a 400 rather than a 503 that agents
        # would retry for ever.
        logger.info("database refused a value: %s", type(exc).__name__)
        return Response({"detail": "a value was refused by the database"}, status=400)
    if isinstance(exc, OperationalError | InterfaceError):
        # The database is away: say so quickly so agents back off and retry (docs/reliability.md).
        logger.warning("database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
        return Response(
            {"detail": "database unavailable, retry later"},
            status=503,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, DatabaseError):
        logger.exception("database error")
        return Response({"detail": "database error"}, status=503, headers={"Retry-After": "5"})
    return None


def not_found(request: Any, exception: Exception | None = None) -> Any:
    """404 handler: JSON under /api/ (clients parse it), Django's page elsewhere."""
    from django.http import JsonResponse
    from django.views.defaults import page_not_found

    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception or Exception("not found"))


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "still in use"
    default_code = "conflict"


class ProtectedDeleteMixin:
    """Deleting a site that pools or nodes still use is a 409 that says so, not a 500."""

    def perform_destroy(self, instance: Any) -> None:
        try:
            instance.delete()
        except ProtectedError as exc:
            users = sorted({str(obj) for obj in exc.protected_objects})[:10]
            raise Conflict(
                f"{instance} is still used by: {', '.join(users)}; reassign those first"
            ) from exc
