"""Liveness, readiness and the service's own Prometheus metrics.

- ``/healthz``: the process answers. For container health checks and liveness probes: it never
  depends on another service, so an outage elsewhere does not restart healthy web processes.
- ``/readyz``: the database and the broker answer (503 otherwise). For deploy gates, readiness
  probes and alerting. The cache is reported but does not gate: ingest works without it
  (docs/reliability.md).
- ``/metrics``: Prometheus text, for a bearer ``METRICS_TOKEN`` or an admin session.

Where a read replica is set, ``/readyz`` reports it (``replica``, ``replica_lag_s``, ``reads``)
without gating on it: reads fall back to the primary when it is down or behind (docs/deploy.md,
"Read replica").
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from config.replica import replica_configured, replica_report

# A probe that waits longer than its caller's timeout tells nobody anything.
BROKER_TIMEOUT_S = 1.0


@require_GET
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """Permission: public. The process is up (says nothing about its dependencies)."""
    return JsonResponse({"status": "ok"})


def _error(exc: BaseException) -> str:
    # The class name only: the message may carry a host name or a user, and this is public.
    return f"error: {type(exc).__name__}"


def _database_check() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        return _error(exc)


def _broker_check(url: str) -> str:
    try:
        if url.startswith(("redis://", "rediss://", "unix://")):
            import redis

            client = redis.Redis.from_url(
                url, socket_connect_timeout=BROKER_TIMEOUT_S, socket_timeout=BROKER_TIMEOUT_S
            )
            try:
                client.ping()
            finally:
                client.close()
        else:  # another kombu transport (AMQP…): open and close a connection
            from kombu.connection import Connection

            with Connection(url, connect_timeout=BROKER_TIMEOUT_S) as conn:  # type: ignore[no-untyped-call]
                conn.ensure_connection(max_retries=1)
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return _error(exc)


def _cache_check() -> str:
    try:
        cache.get("readyz")
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return _error(exc)


@require_GET
@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    """Permission: public. The database (and the broker, where one is set) answer."""
    gating = {"database": _database_check()}
    if settings.CELERY_BROKER_URL:
        gating["broker"] = _broker_check(settings.CELERY_BROKER_URL)
    info: dict[str, object] = {"cache": _cache_check()} if settings.REDIS_URL else {}
    if replica_configured():
        info.update(replica_report())
    ready = all(value == "ok" for value in gating.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", **gating, **info},
        status=200 if ready else 503,
    )


def _metrics_allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    auth = request.headers.get("Authorization", "")
    # Constant-time comparison: the token is a long-lived secret held by the scraper.
    if token and hmac.compare_digest(auth.encode(), f"Bearer {token}".encode()):
        return True
    user = request.user
    return bool(user.is_authenticated and user.has_perm("fleet.manage_fleet"))


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """Permission: bearer ``METRICS_TOKEN`` or an admin session (metrics name nodes)."""
    from config.metrics import CONTENT_TYPE, metrics_render

    if not _metrics_allowed(request):
        if request.user.is_authenticated:
            return HttpResponse("forbidden\n", status=403, content_type="text/plain")
        response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(metrics_render(), content_type=CONTENT_TYPE)
