"""Request id (with one access log line per request) and Content Security Policy middleware."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.core.signals import request_finished
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from config.logging import node_var, request_id_var

access_logger = logging.getLogger("gpufleet.access")

# Probes and scrapes arrive every few seconds; at INFO they would drown the lines that matter.
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# Scripts only from our own origin (chart data travels in json_script blocks, read by static
# scripts). Plotly.js injects a <style> element for its own CSS, hence 'unsafe-inline' for
# styles only; no script is ever inline.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class RequestIdMiddleware:
    """Gives every request an id (kept from ``X-Request-ID`` when sane) for logs and replies,
    and writes one access line per request with the request and node ids.

    Both ids live until the response is closed (``request_finished``), not until this
    middleware returns: Django logs 5xx answers (``django.request``) after the middleware chain
    has returned, and those lines need the ids most. They are cleared then, because a gunicorn
    sync worker serves request after request in the same thread and a node id left behind would
    label the next request's lines.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex
        request_id_var.set(request_id)
        node_var.set("-")
        started = time.perf_counter()
        response = self.get_response(request)
        response["X-Request-ID"] = request_id
        access_logger.log(
            logging.DEBUG if request.path in _QUIET_PATHS else logging.INFO,
            "%s %s %s",
            request.method,
            request.path,
            response.status_code,
            extra={
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "duration_ms": round((time.perf_counter() - started) * 1000, 1),
            },
        )
        return response


@receiver(request_finished, dispatch_uid="config.middleware.request_ids_clear")
def request_ids_clear(**kwargs: Any) -> None:
    """The response has been sent and closed: its ids must not label what comes next."""
    request_id_var.set("-")
    node_var.set("-")


class ContentSecurityPolicyMiddleware:
    """Adds the policy above to every response that has none of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response
