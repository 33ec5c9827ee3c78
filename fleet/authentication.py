"""Bearer-token authentication for node agents and for people using the finance API."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from fleet.models import ApiToken, Node, NodeToken
from fleet.tokens import API_KIND, NODE_KIND, token_matches, token_prefix

# Writing last_used on every request would make every ingest a second write; a minute's
# resolution is what an operator needs to see a token is alive.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def _bearer(request: Request) -> str | None:
    parts = get_authorization_header(request).split()
    if not parts or parts[0].lower() != b"bearer":
        return None
    if len(parts) != 2:
        raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError as exc:
        raise exceptions.AuthenticationFailed("invalid token") from exc


def _touch(token: NodeToken | ApiToken) -> bool:
    """Note the token's use (at most once a minute); returns whether it wrote."""
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        type(token).objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
        return True
    return False


class NodePrincipal:
    """What ``request.user`` is for a node agent: no person, no roles, only its node."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, *, node_id: int, hostname: str) -> None:
        self.node_id = node_id
        self.hostname = hostname
        self.pk = None

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False

    def __str__(self) -> str:
        return f"node:{self.hostname}"


@dataclass(frozen=True, slots=True)
class NodeTokenFacts:
    """What authentication knows of a node token: facts that never change while it exists
    (its id, hash and node; the hostname is the label it was issued for). Whether it is still
    live is not among them: every write made for the node checks that (telemetry.ingest)."""

    id: int
    prefix: str
    token_hash: str
    node_id: int
    hostname: str


# Node tokens' facts, kept per process for NODE_TOKEN_CACHE_TTL_S: the lookup was a round trip
# of every push (docs/benchmarks.md, "Ingest": what the cache saves). Only facts that cannot
# change under it are kept; revocation is checked by the write, and saving or deleting a token
# or a node through the ORM forgets every entry of this process.
NODE_TOKEN_CACHE_TTL_S = 300.0
_node_tokens: dict[str, tuple[float, NodeTokenFacts]] = {}
_node_tokens_lock = threading.Lock()
# When this process last wrote each node token's last use: at most once a minute per process.
_touched: dict[int, float] = {}


def node_token_cache_clear(prefix: str | None = None) -> None:
    """Forget the node token ``prefix`` (every token when None)."""
    with _node_tokens_lock:
        if prefix is None:
            _node_tokens.clear()
            _touched.clear()
        else:
            _node_tokens.pop(prefix, None)


@receiver(post_save, sender=NodeToken, dispatch_uid="fleet.authentication.token_saved")
@receiver(post_delete, sender=NodeToken, dispatch_uid="fleet.authentication.token_deleted")
@receiver(post_save, sender=Node, dispatch_uid="fleet.authentication.node_saved")
@receiver(post_delete, sender=Node, dispatch_uid="fleet.authentication.node_deleted")
def _node_token_changed(**kwargs: Any) -> None:
    node_token_cache_clear()


# The lookup as plain SQL: the ORM's query building cost about three times the round trip.
_NODE_TOKEN_SQL = (
    "SELECT t.id, t.token_hash, n.id, n.hostname FROM fleet_nodetoken t "
    "JOIN fleet_node n ON n.id = t.node_id WHERE t.prefix = %s AND t.revoked_at IS NULL"
)
# Its last use, at most once a minute (LAST_USED_RESOLUTION) and only forward.
_NODE_TOKEN_TOUCH = (
    "UPDATE fleet_nodetoken SET last_used_at = %s "
    "WHERE id = %s AND (last_used_at IS NULL OR last_used_at < %s)"
)


def _node_token_facts(prefix: str) -> NodeTokenFacts | None:
    """The facts of the live token ``prefix``, from this process's memory or the database."""
    with _node_tokens_lock:
        entry = _node_tokens.get(prefix)
    if entry is not None and entry[0] > time.monotonic():
        return entry[1]
    with connection.cursor() as cursor:
        cursor.execute(_NODE_TOKEN_SQL, [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    facts = NodeTokenFacts(
        id=row[0], prefix=prefix, token_hash=row[1], node_id=row[2], hostname=row[3]
    )
    with _node_tokens_lock:
        _node_tokens[prefix] = (time.monotonic() + NODE_TOKEN_CACHE_TTL_S, facts)
    return facts


def _node_token_touch(token_id: int) -> None:
    """Record the token's use, once a minute per process: operators see the token is alive."""
    now_mono = time.monotonic()
    if now_mono - _touched.get(token_id, -math.inf) < LAST_USED_RESOLUTION.total_seconds():
        return
    _touched[token_id] = now_mono
    now = timezone.now()
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_NODE_TOKEN_TOUCH, [adapt(now), token_id, adapt(now - LAST_USED_RESOLUTION)])


class NodeTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer gfn_…``: ``request.user`` is a :class:`NodePrincipal` and
    ``request.auth`` the token's :class:`NodeTokenFacts`."""

    def authenticate(self, request: Request) -> tuple[NodePrincipal, NodeTokenFacts] | None:
        raw = _bearer(request)
        if raw is None:
            return None
        prefix = token_prefix(raw)
        if prefix is None or not prefix.startswith(NODE_KIND + "_"):
            raise exceptions.AuthenticationFailed("invalid node token")
        facts = _node_token_facts(prefix)
        # The secret is checked against the hash on every request, cached or not.
        if facts is None or not token_matches(raw, facts.token_hash):
            raise exceptions.AuthenticationFailed("invalid or revoked node token")
        _node_token_touch(facts.id)
        return NodePrincipal(node_id=facts.node_id, hostname=facts.hostname), facts

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="ingest"'


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        raw = _bearer(request)
        if raw is None:
            return None
        prefix = token_prefix(raw)
        if prefix is None or not prefix.startswith(API_KIND + "_"):
            raise exceptions.AuthenticationFailed("invalid API token")
        token = (
            ApiToken.objects.select_related("user")
            .filter(prefix=prefix, revoked_at__isnull=True)
            .first()
        )
        if token is None or not token_matches(raw, token.token_hash):
            raise exceptions.AuthenticationFailed("invalid or revoked API token")
        if token.expires_at and token.expires_at <= timezone.now():
            raise exceptions.AuthenticationFailed("API token expired")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("user inactive")
        _touch(token)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'
