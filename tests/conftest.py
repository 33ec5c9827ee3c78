"""Suite-wide fixtures: real services (fail in CI, skip locally when absent), roles, clients."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def service_missing(what: str) -> None:
    """A test that needs a real service: in CI it fails, elsewhere it skips."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI but unavailable", pytrace=False)
    pytest.skip(f"{what} unavailable")


@pytest.fixture
def postgres() -> None:
    """Marks a test that must run on PostgreSQL."""
    if not settings.IS_POSTGRES:
        service_missing("PostgreSQL (DATABASE_URL)")


@pytest.fixture
def redis_url() -> str:
    """The URL of a reachable Redis, for tests that need the broker or cache."""
    import redis

    url = settings.REDIS_URL or os.environ.get("REDIS_URL", "")
    if not url:
        service_missing("Redis (REDIS_URL)")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        service_missing(f"Redis at {url}")
    return url


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    """``make_user("finance")`` → a user in that role (``None`` → a user with no role)."""
    from django.contrib.auth import get_user_model

    from fleet.roles import role_assign

    counter = {"n": 0}

    def make(role: str | None, username: str | None = None, password: str = "pw-Secret-123") -> Any:
        counter["n"] += 1
        user = get_user_model().objects.create_user(
            username=username or f"{role or 'norole'}{counter['n']}", password=password
        )
        if role:
            role_assign(user=user, role=role)
        return user

    return make


@pytest.fixture
def role_client(client: Any, make_user: Callable[..., Any]) -> Callable[[str | None], Any]:
    """``role_client("viewer")`` → a Django test client logged in with that role."""

    def make(role: str | None) -> Any:
        if role is None:
            return client
        client.force_login(make_user(role))
        return client

    return make


@pytest.fixture(autouse=True)
def _node_token_cache_clear() -> None:
    """Authentication keeps node tokens' facts in process memory; a rolled-back test database
    reuses primary keys and prefixes may repeat, which no real database does, so start every
    test with it empty."""
    from fleet.authentication import node_token_cache_clear

    node_token_cache_clear()
