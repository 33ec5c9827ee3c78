"""Bearer-token authentication for node agents and for people using the finance API."""

from __future__ import annotations

import threading
import time
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

    def __init__(self, node: Node, *, token_checked: bool = True) -> None:
        self.node = node
        self.pk = None
        # False when the token came from this process's cache: whoever writes for the node
        # checks that it is still not revoked (telemetry.ingest does, within its write).
        self.token_checked = token_checked

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False

    def __str__(self) -> str:
        return f"node:{self.node.hostname}"


def _node_token_sql() -> tuple[str, list[str]]:
    """The token lookup as plain SQL (token and node columns in one row), built once.

    Every ingest runs it: the ORM's query compilation (select_related, filters) cost about
    three times the round trip itself (docs/benchmarks.md, "## Ingest").
    """
    fields = Node._meta.concrete_fields
    node_fields = [f.attname for f in fields]
    qn = connection.ops.quote_name
    columns = ", ".join(f"n.{qn(str(f.column))}" for f in fields)
    sql = (
        f"SELECT t.id, t.token_hash, t.last_used_at, t.created_at, {columns} "  # noqa: S608
        f"FROM {qn(NodeToken._meta.db_table)} t "
        f"JOIN {qn(Node._meta.db_table)} n ON n.id = t.node_id "
        "WHERE t.prefix = %s AND t.revoked_at IS NULL"
    )
    return sql, node_fields


_node_token_query: tuple[str, list[str]] | None = None

# Node tokens, cached per process for NODE_TOKEN_CACHE_TTL_S (longer than an agent's push
# interval, so a steady agent is always a hit): the lookup was a round trip of every push. The
# cache only saves the read: the secret is checked against the cached hash on every request, a
# write made for the node checks in the database that the token is still not revoked
# (NodePrincipal.token_checked), what this process writes to the node row is written to the
# cached row too (node_token_cache_note), and saving or deleting a token or a node through the
# ORM clears the cache of this process.
NODE_TOKEN_CACHE_TTL_S = 300.0
_node_tokens: dict[str, tuple[float, tuple[Any, ...]]] = {}
_node_tokens_lock = threading.Lock()


def node_token_cache_clear(prefix: str | None = None) -> None:
    """Forget the cached node token ``prefix`` (every cached token when None)."""
    with _node_tokens_lock:
        if prefix is None:
            _node_tokens.clear()
        else:
            _node_tokens.pop(prefix, None)


# Where a cached lookup row holds what this process writes: the token's last use, then the
# node's columns from this position on (in _node_token_sql's order).
_LAST_USED_AT = 2
_NODE_FROM = 4


def _cached_row_update(prefix: str, values: dict[int, Any]) -> None:
    """Set positions of the cached row of ``prefix``; a row not cached is left alone."""
    with _node_tokens_lock:
        entry = _node_tokens.get(prefix)
        if entry is not None:
            row = list(entry[1])
            for position, value in values.items():
                row[position] = value
            _node_tokens[prefix] = (entry[0], tuple(row))


def node_token_cache_note(prefix: str, node_changes: dict[str, Any]) -> None:
    """Bring the cached row of ``prefix`` up to date with what was written to its node
    (attribute name → new value)."""
    if _node_token_query is None:
        return  # nothing was looked up, so nothing is cached
    names = _node_token_query[1]
    _cached_row_update(
        prefix, {_NODE_FROM + names.index(name): value for name, value in node_changes.items()}
    )


@receiver(post_save, sender=NodeToken, dispatch_uid="fleet.authentication.token_saved")
@receiver(post_delete, sender=NodeToken, dispatch_uid="fleet.authentication.token_deleted")
@receiver(post_save, sender=Node, dispatch_uid="fleet.authentication.node_saved")
@receiver(post_delete, sender=Node, dispatch_uid="fleet.authentication.node_deleted")
def _node_token_changed(**kwargs: Any) -> None:
    node_token_cache_clear()


def _node_token_row(prefix: str) -> tuple[tuple[Any, ...] | None, bool]:
    """The lookup row of a live token ``prefix`` → (row or None, whether read just now)."""
    global _node_token_query
    with _node_tokens_lock:
        entry = _node_tokens.get(prefix)
    if entry is not None and entry[0] > time.monotonic():
        return entry[1], False
    if _node_token_query is None:
        _node_token_query = _node_token_sql()
    with connection.cursor() as cursor:
        cursor.execute(_node_token_query[0], [prefix])
        row = cursor.fetchone()
    if row is not None:
        with _node_tokens_lock:
            _node_tokens[prefix] = (time.monotonic() + NODE_TOKEN_CACHE_TTL_S, tuple(row))
    return row, True


class NodeTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[NodePrincipal, NodeToken] | None:
        raw = _bearer(request)
        if raw is None:
            return None
        prefix = token_prefix(raw)
        if prefix is None or not prefix.startswith(NODE_KIND + "_"):
            raise exceptions.AuthenticationFailed("invalid node token")
        row, checked = _node_token_row(prefix)
        if row is None or not token_matches(raw, row[1]):
            raise exceptions.AuthenticationFailed("invalid or revoked node token")
        assert _node_token_query is not None  # set by _node_token_row
        node = Node.from_db(connection.alias, _node_token_query[1], list(row[_NODE_FROM:]))
        token = NodeToken(
            id=row[0],
            prefix=prefix,
            token_hash=row[1],
            last_used_at=row[_LAST_USED_AT],
            created_at=row[3],
            node=node,
        )
        if connection.vendor == "sqlite":  # SQLite hands datetimes back naive or as text
            convert = getattr(connection.ops, "convert_datetimefield_value")  # noqa: B009
            for attr in ("last_used_at", "created_at"):
                value = getattr(token, attr)
                if value is not None:
                    setattr(token, attr, convert(value, None, connection))
            for f in Node._meta.concrete_fields:
                value = getattr(node, f.attname)
                if value is not None and f.get_internal_type() == "DateTimeField":
                    setattr(node, f.attname, convert(value, None, connection))
        token._state.adding = False
        token._state.db = connection.alias
        if _touch(token):
            _cached_row_update(prefix, {_LAST_USED_AT: token.last_used_at})
        return NodePrincipal(node, token_checked=checked), token

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
