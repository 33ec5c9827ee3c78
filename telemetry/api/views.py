"""``POST /api/v1/ingest``: a thin DRF view over ``telemetry.ingest.sample_batch_ingest``.

The view authenticates the node, throttles it, enforces the body limit and turns the service's
result into JSON. It never touches ``request.data``: the body is read once, as bytes, and
decoded by msgspec in the service (a DRF parser and serializer would cost ~50× more per row).
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any

from django.conf import settings
from django.core.cache import cache, caches
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from config.logging import node_var
from config.metrics import counters_incr, redis_client
from fleet.authentication import (
    NodePrincipal,
    NodeTokenAuthentication,
    NodeTokenFacts,
    node_token_cache_clear,
)
from fleet.permissions import IsNode
from telemetry.ingest import sample_batch_ingest
from telemetry.ingest_store import TokenRevoked
from telemetry.wire import IngestError

logger = logging.getLogger(__name__)
_cache_warned_at = 0.0


class NodeIngestThrottle(BaseThrottle):
    """Per-node fixed-window rate limit (setting ``ingest``) counted in the shared cache.

    A fixed window costs one cache increment per request, where DRF's sliding window would
    read and write the whole request history. When the cache (Redis) is down the request is
    let through: throttling protects the service, and refusing agents because Redis is away
    would turn a cache outage into data loss (docs/reliability.md).
    """

    scope = "ingest"

    def __init__(self) -> None:
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)
        self.num_requests, self.duration = _rate_parse(str(rate) if rate else None)
        self._wait = 0.0

    def allow_request(self, request: Request, view: Any) -> bool:
        if not self.num_requests or not self.duration:
            return True
        principal = request.user
        if not isinstance(principal, NodePrincipal):
            return True
        now = time.time()
        window = int(now // self.duration)
        key = f"throttle:{self.scope}:{principal.node_id}:{window}"
        try:
            count = _window_count(key, self.duration + 1)
        except Exception:  # noqa: BLE001 - a cache outage must not stop ingest
            global _cache_warned_at
            if now - _cache_warned_at > 60:  # once a minute, not once a request
                _cache_warned_at = now
                logger.warning("ingest throttle skipped: cache unavailable", exc_info=True)
            return True
        if count <= self.num_requests:
            return True
        self._wait = (window + 1) * self.duration - now
        return False

    def wait(self) -> float | None:
        return self._wait


def _rate_parse(rate: str | None) -> tuple[int, int]:
    """``"600/min"`` → (600, 60), as DRF reads its rates; None → no limit."""
    if not rate:
        return 0, 0
    num, period = rate.split("/")
    return int(num), {"s": 1, "m": 60, "h": 3600, "d": 86400}[period[0]]


def _window_count(key: str, timeout: int) -> int:
    """Add one to the counter ``key`` and return it; the first count sets its expiry."""
    backend = caches["default"]
    # Redis INCR creates a missing key: one round trip, where Django's incr() needs two
    # (EXISTS, INCR) and add-then-incr three. The client is cached per backend (config.metrics).
    client = redis_client(backend)
    if client is not None:
        full_key = backend.make_and_validate_key(key)
        count = int(client.incr(full_key))
        if count == 1:
            client.expire(full_key, timeout)
        return count
    try:
        return int(cache.incr(key))
    except ValueError:  # no counter yet in this window
        return 1 if cache.add(key, 1, timeout=timeout) else int(cache.incr(key))


def _error(status: int, field_name: str, error: str) -> Response:
    return Response(IngestError(status, field_name, error).body(), status=status)


def _body_read(request: Request) -> bytes | Response:
    """The raw body, at most ``INGEST_MAX_BODY_BYTES`` (after gzip), or the 4xx to answer."""
    limit = settings.INGEST_MAX_BODY_BYTES
    too_big = f"the body is larger than {limit} bytes (INGEST_MAX_BODY_BYTES)"
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return _error(400, "Content-Length", "not an integer")
    if declared > limit:
        # Refuse before reading: a client must not make us buffer more than the limit.
        return _error(413, "body", too_big)
    payload = request._request.read(limit + 1)
    if len(payload) > limit:
        return _error(413, "body", too_big)
    encoding = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower()
    if encoding in ("", "identity"):
        return payload
    if encoding != "gzip":
        return _error(415, "Content-Encoding", "only gzip or identity are accepted")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        # max_length caps the inflated size: a small gzip bomb cannot fill the memory.
        plain = inflater.decompress(payload, limit + 1)
    except zlib.error:
        return _error(400, "body", "not valid gzip data")
    if len(plain) > limit or inflater.unconsumed_tail:
        return _error(413, "body", too_big)
    return plain


class IngestView(APIView):
    """Permission: a node token (IsNode); the token decides the node (docs/ingest.md)."""

    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]
    throttle_classes = [NodeIngestThrottle]
    renderer_classes = [JSONRenderer]
    parser_classes: list[Any] = []

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="accepted, duplicates, rejected"),
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="bad push or every sample bad"),
            401: OpenApiResponse(description="missing, wrong or revoked node token"),
            413: OpenApiResponse(OpenApiTypes.OBJECT, description="body or batch too large"),
            429: OpenApiResponse(
                description="throttled, or the node's new workloads of this hour are at the cap"
            ),
            503: OpenApiResponse(description="database unavailable: retry later"),
        },
        description="Push interval samples of the node's GPUs (wire format: docs/ingest.md).",
    )
    def post(self, request: Request) -> Response:
        principal, token = request.user, request.auth
        assert isinstance(principal, NodePrincipal) and isinstance(token, NodeTokenFacts)
        node_var.set(principal.hostname)  # every log line of this request names the node
        # Every authenticated push counts, refused ones too; the push's counters go to the
        # cache together, in one round trip, once the answer is known.
        counters = {"ingest_requests": 1}
        try:
            payload = _body_read(request)
            if isinstance(payload, Response):
                return payload
            try:
                result = sample_batch_ingest(
                    node_id=principal.node_id,
                    token_id=token.id,
                    payload_bytes=payload,
                    now=timezone.now(),
                    counters=counters,
                    max_new_workloads_per_hour=settings.INGEST_MAX_NEW_WORKLOADS_PER_HOUR,
                )
            except IngestError as exc:
                headers = None
                if exc.retry_after_s is not None:
                    headers = {"Retry-After": str(exc.retry_after_s)}
                return Response(exc.body(), status=exc.status, headers=headers)
            except TokenRevoked:
                # Revoked after this process read it: refuse as authentication would have.
                node_token_cache_clear(token.prefix)
                raise exceptions.AuthenticationFailed("invalid or revoked node token") from None
            return Response(result.body(), status=result.status)
        finally:
            counters_incr(counters)


class QueuePushView(APIView):
    """``POST /api/v1/queue``: one snapshot of a cluster's pending GPU jobs (DESIGN.md §9.2,
    docs/ingest.md "Queue"), over ``telemetry.queue.queue_snapshot_ingest``.

    Permission: a node token (IsNode), as ingest; the node must own the cluster (the first
    node to push for it). Throttled in the node's ingest window."""

    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]
    throttle_classes = [NodeIngestThrottle]
    renderer_classes = [JSONRenderer]
    parser_classes: list[Any] = []

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={
            200: OpenApiResponse(
                OpenApiTypes.OBJECT, description="applied, a duplicate, or stale (ignored)"
            ),
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="a bad field, named"),
            401: OpenApiResponse(description="missing, wrong or revoked node token"),
            403: OpenApiResponse(OpenApiTypes.OBJECT, description="cluster of another node"),
            413: OpenApiResponse(OpenApiTypes.OBJECT, description="body or pending too large"),
            429: OpenApiResponse(description="throttled"),
            503: OpenApiResponse(description="database unavailable: retry later"),
        },
        description="Push a snapshot of a cluster's pending GPU jobs (docs/ingest.md, Queue).",
    )
    def post(self, request: Request) -> Response:
        from telemetry.queue import queue_snapshot_ingest

        principal, token = request.user, request.auth
        assert isinstance(principal, NodePrincipal) and isinstance(token, NodeTokenFacts)
        node_var.set(principal.hostname)
        payload = _body_read(request)
        if isinstance(payload, Response):
            return payload
        try:
            result = queue_snapshot_ingest(
                node_id=principal.node_id,
                token_id=token.id,
                payload_bytes=payload,
                now=timezone.now(),
            )
        except IngestError as exc:
            return Response(exc.body(), status=exc.status)
        except TokenRevoked:
            node_token_cache_clear(token.prefix)
            raise exceptions.AuthenticationFailed("invalid or revoked node token") from None
        return Response(result.body(), status=200)
