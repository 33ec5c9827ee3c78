"""Liveness, readiness and the service's own Prometheus metrics."""

from __future__ import annotations

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


@require_GET
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """Permission: public. The process is up (says nothing about its dependencies)."""
    return JsonResponse({"status": "ok"})


@require_GET
@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    """Permission: public. The database (and the broker, where one is set) answer."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"error: {type(exc).__name__}"
    if settings.CELERY_BROKER_URL:
        try:
            import redis

            redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=1).ping()
            checks["broker"] = "ok"
        except Exception as exc:  # noqa: BLE001
            checks["broker"] = f"error: {type(exc).__name__}"
    if settings.REDIS_URL:
        try:
            cache.get("readyz")
            checks["cache"] = "ok"
        except Exception as exc:  # noqa: BLE001
            checks["cache"] = f"error: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", **checks}, status=200 if ready else 503
    )


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """Permission: bearer ``METRICS_TOKEN`` or an admin session (metrics name nodes)."""
    from config.metrics import metrics_render

    token = settings.METRICS_TOKEN
    auth = request.headers.get("Authorization", "")
    allowed = bool(token) and auth == f"Bearer {token}"
    allowed = allowed or (
        request.user.is_authenticated and request.user.has_perm("fleet.manage_fleet")
    )
    if not allowed:
        return HttpResponse(
            "forbidden\n",
            status=403 if request.user.is_authenticated else 401,
            content_type="text/plain",
        )
    return HttpResponse(metrics_render(), content_type="text/plain; version=0.0.4")
