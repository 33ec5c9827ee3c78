"""Request id (with one access log line per request), Content Security Policy and garbage
collector pause middleware."""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
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


# --- the cyclic garbage collector, paused while a request is served ------------------------
_gc_lock = threading.Lock()
_gc_depth = 0  # requests (threads) inside gc_paused() now
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off for the block, then as it was before.

    A page of 10,000 GPUs makes some 10^5 objects that live until its response is made (each
    GPU's facts, sums, segments, rows). While they accumulate, the collector runs every few
    hundred allocations and walks the young ones again, and its full collections walk the
    whole heap: 30 % of the fleet board's time at 10,000 GPUs (docs/benchmarks.md). Those
    objects hold no reference cycles that matter; reference counting frees them when the
    response is done, and the collector runs again after. Nested and threaded use (the
    development server serves requests in threads) keep it off until the last block ends.
    """
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


class GcPauseMiddleware:
    """Serves each request with the cyclic garbage collector paused (``gc_paused``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with gc_paused():
            return self.get_response(request)
