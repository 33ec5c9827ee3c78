"""DRF glue shared by every API: the exception handler that turns database outages into 503."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    if isinstance(exc, OperationalError | InterfaceError):
        # The database is away: say so quickly so agents back off and retry (DESIGN §5).
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
