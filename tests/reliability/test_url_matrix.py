"""Every URL × every kind of caller, with the status each must get.

``TABLE`` lists every URL pattern of ``config.urls`` (the admin site as one entry: Django's
staff check guards all of it). ``test_every_url_pattern_is_in_the_table`` walks the resolver,
so a URL added without an entry here fails the suite until someone decides who may call it.

Callers: anonymous; a browser session of each role; an API token of each role; a node token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

CALLERS = (
    "anon",
    "viewer",
    "finance",
    "admin",
    "viewer-token",
    "finance-token",
    "admin-token",
    "node",
)


def _all(status: int) -> dict[str, int]:
    return dict.fromkeys(CALLERS, status)


# What each kind of endpoint answers, by caller.
PUBLIC = _all(200)
# The finance API and inventory reads: finance and admin, by session or API token.
COSTS = {
    "anon": 401,
    "viewer": 403,
    "finance": 200,
    "admin": 200,
    "viewer-token": 403,
    "finance-token": 200,
    "admin-token": 200,
    "node": 401,
}


# Inventory writes: admin only. Created → 201, changed → 200, deleted → 204.
def _admin_write(ok: int) -> dict[str, int]:
    return {**COSTS, "finance": 403, "finance-token": 403, "admin": ok, "admin-token": ok}


# Schema and docs: any role.
ANY_ROLE = {**COSTS, "viewer": 200, "viewer-token": 200}
# Server-rendered pages: a session with a role; a bearer token is no login (→ login page).
PAGE = {
    "anon": 302,
    "viewer": 200,
    "finance": 200,
    "admin": 200,
    "viewer-token": 302,
    "finance-token": 302,
    "admin-token": 302,
    "node": 302,
}
PAGE_COSTS = {**PAGE, "viewer": 403}
PAGE_ADMIN_ONLY = {**PAGE, "viewer": 403, "finance": 403}
# The Django admin: staff (the admin role) only; others are sent to its login page.
ADMIN_SITE = {**PAGE, "viewer": 302, "finance": 302}
# Metrics: an admin session or METRICS_TOKEN (not set here); a bearer that is not the metrics
# token is no login, and the view says 401 with a challenge.
METRICS = {
    "anon": 401,
    "viewer": 403,
    "finance": 403,
    "admin": 200,
    "viewer-token": 401,
    "finance-token": 401,
    "admin-token": 401,
    "node": 401,
}
# Ingest: a node token only; a session or an API token is not a node.
INGEST_POST = {**_all(401), "node": 200}
INGEST_GET = {**_all(401), "node": 405}


@dataclass(frozen=True)
class Check:
    method: str
    path: Callable[[dict[str, Any]], str] | str
    expected: dict[str, int]
    data: Callable[[dict[str, Any], str], Any] | None = None

    def url(self, world: dict[str, Any]) -> str:
        return self.path(world) if callable(self.path) else self.path


def _ingest_body(world: dict[str, Any], caller: str) -> Any:
    from tests.reliability.conftest import good_sample, gpu_block, push_body, recent_minute

    uuid = f"GPU-matrix-{caller}"
    return push_body([good_sample(uuid, recent_minute())], [gpu_block(uuid)])


def _queue_body(world: dict[str, Any], caller: str) -> Any:
    """A queue snapshot (DESIGN.md §9.2): one job waiting for 2 GPUs, of this caller's cluster."""
    from tests.reliability.conftest import iso, recent_minute

    at = iso(recent_minute())
    job = {
        "kind": "slurm",
        "id": "101",
        "user": "alice",
        "account": "ml",
        "partition": "gpu",
        "gpus": 2,
        "gpu_model": None,
        "reason": "Resources",
        "class": "capacity",
        "submitted": at,
        "eligible": at,
    }
    return {"cluster": f"matrix-{caller}", "at": at, "pending": [job]}


def _named(prefix: str, **extra: Any) -> Callable[[dict[str, Any], str], Any]:
    def make(world: dict[str, Any], caller: str) -> Any:
        return {"name": f"{prefix}-{caller}", **extra}

    return make


def _detail(kind: str) -> Callable[[dict[str, Any]], str]:
    return lambda w: f"/api/v1/{kind}/{w[kind].pk}"


def _inventory(
    kind: str, create: Callable[[dict[str, Any], str], Any], patch: Any
) -> tuple[str, str, list[Check], list[Check]]:
    lst = [
        Check("GET", f"/api/v1/{kind}", COSTS),
        Check("POST", f"/api/v1/{kind}", _admin_write(201), create),
    ]
    det = [
        Check("GET", _detail(kind), COSTS),
        Check("PATCH", _detail(kind), _admin_write(200), lambda w, c: patch),
    ]
    return f"api/v1/^{kind}$", f"api/v1/^{kind}/(?P<pk>[^/.]+)$", lst, det


TABLE: dict[str, list[Check]] = {
    # The site's icon, for pages that name none (the weekly email's preview): a redirect.
    "favicon.ico": [Check("GET", "/favicon.ico", _all(302))],
    "healthz": [Check("GET", "/healthz", PUBLIC)],
    "readyz": [Check("GET", "/readyz", PUBLIC)],
    "metrics": [Check("GET", "/metrics", METRICS)],
    "accounts/login/": [Check("GET", "/accounts/login/", PUBLIC)],
    # Django 5: logout is POST only; GET is 405 for everybody.
    "accounts/logout/": [
        Check("GET", "/accounts/logout/", _all(405)),
        Check("POST", "/accounts/logout/", _all(302)),
    ],
    # Break-glass login links (manage.py login_link): a token that is not one is refused.
    "accounts/login-link/<str:token>/": [
        Check("GET", "/accounts/login-link/not-a-token/", _all(403)),
        Check("POST", "/accounts/login-link/not-a-token/", _all(403)),
    ],
    # Single sign-on (config/oidc.py): absent while OIDC_ISSUER is unset, as here
    # (tests/e2e/test_oidc.py signs in through a real provider).
    "oidc/authenticate/": [Check("GET", "/oidc/authenticate/", _all(404))],
    "oidc/callback/": [Check("GET", "/oidc/callback/?code=x&state=y", _all(404))],
    "admin/": [
        Check("GET", "/admin/", ADMIN_SITE),
        Check("GET", "/admin/fleet/node/", ADMIN_SITE),
        Check("GET", "/admin/auth/user/", ADMIN_SITE),
    ],
    "api/v1/schema": [Check("GET", "/api/v1/schema", ANY_ROLE)],
    "api/v1/docs": [Check("GET", "/api/v1/docs", ANY_ROLE)],
    "api/v1/ingest": [
        Check("POST", "/api/v1/ingest", INGEST_POST, _ingest_body),
        Check("GET", "/api/v1/ingest", INGEST_GET),
    ],
    "api/v1/queue": [
        Check("POST", "/api/v1/queue", INGEST_POST, _queue_body),
        # The queue figures: any role (money only for finance and admin); a node token is
        # no user.
        Check("GET", "/api/v1/queue", ANY_ROLE),
        Check("GET", "/api/v1/queue?group_by=user&format=csv", ANY_ROLE),
    ],
    "api/v1/costs": [
        Check("GET", "/api/v1/costs", COSTS),
        Check("GET", "/api/v1/costs?format=csv", COSTS),
    ],
    "api/v1/focus": [
        Check("GET", "/api/v1/focus", COSTS),
        Check("GET", "/api/v1/focus?version=1.0", COSTS),
    ],
    "api/v1/breakeven": [
        Check(
            "GET",
            "/api/v1/breakeven?pool=matrix-pool&tokens_per_s=2000&api_price_per_mtok=0.6",
            COSTS,
        )
    ],
    "api/v1/workloads": [
        Check("GET", "/api/v1/workloads", COSTS),
        Check("GET", "/api/v1/workloads?group_by=account&format=csv", COSTS),
    ],
    # Any role: viewers get the rows without money (test_efficiency_api).
    "api/v1/efficiency": [
        Check("GET", "/api/v1/efficiency", ANY_ROLE),
        Check("GET", "/api/v1/efficiency?group_by=team&format=csv", ANY_ROLE),
    ],
    "": [Check("GET", "/", PAGE)],
    "fleet/": [Check("GET", "/fleet/", PAGE)],
    "fleet/heatmap/": [Check("GET", "/fleet/heatmap/", PAGE)],
    "gpus/<str:uuid>/": [Check("GET", lambda w: f"/gpus/{w['gpus'].uuid}/", PAGE)],
    "chargeback/": [Check("GET", "/chargeback/", PAGE)],
    "breakeven/": [Check("GET", "/breakeven/", PAGE_COSTS)],
    # FOCUS files of whole months (billing/focus_exports.py): finance and admin. The matrix
    # posts no month, which is answered 400 naming it (tests/billing/test_focus_exports.py
    # builds one); it has no file to download.
    "chargeback/teams/<str:name>/": [Check("GET", "/chargeback/teams/matrix-team/", PAGE_COSTS)],
    "chargeback/focus/": [
        Check("POST", "/chargeback/focus/", {**PAGE_COSTS, "finance": 400, "admin": 400})
    ],
    "chargeback/focus/<int:pk>/": [
        Check("GET", "/chargeback/focus/999999/", {**PAGE_COSTS, "finance": 404, "admin": 404})
    ],
    # Workloads: every role; money left out for viewers (tests/billing/test_workload_pages.py).
    "workloads/": [Check("GET", "/workloads/", PAGE)],
    "queue/": [Check("GET", "/queue/", PAGE), Check("GET", "/queue/?group_by=user", PAGE)],
    "overview/workloads/": [Check("GET", "/overview/workloads/", PAGE)],
    "workloads/<int:pk>/": [Check("GET", lambda w: f"/workloads/{w['workload'].pk}/", PAGE)],
    # Weekly report pages (billing/report_urls.py): the preview shows every team's money
    # (admin); the subscription form is for whoever may receive the report (finance, admin).
    "reports/weekly/preview/": [Check("GET", "/reports/weekly/preview/", PAGE_ADMIN_ONLY)],
    "reports/weekly/subscription/": [
        Check("GET", "/reports/weekly/subscription/", PAGE_COSTS),
        Check(
            "POST", "/reports/weekly/subscription/", {**PAGE_COSTS, "finance": 302, "admin": 302}
        ),
    ],
    # Alerts (alerts/): every role sees them; money values are left out for viewers, which
    # tests/alerts/test_pages.py checks, since the status is the same.
    "alerts/": [Check("GET", "/alerts/", PAGE), Check("GET", "/alerts/?state=resolved", PAGE)],
    "api/v1/alerts": [
        Check("GET", "/api/v1/alerts", ANY_ROLE),
        Check("GET", "/api/v1/alerts?state=firing", ANY_ROLE),
    ],
}
for _kind, _create, _patch in (
    ("sites", _named("site", pue="1.3", price_per_kwh="0.25"), {"pue": "1.4"}),
    ("teams", _named("team", cost_center="CC-9"), {"cost_center": "CC-10"}),
    ("pools", _named("pool"), {"team": None}),
    ("nodes", lambda w, c: {"hostname": f"node-{c}"}, {"pool": None}),
    (
        "gpus",
        lambda w, c: {"uuid": f"GPU-new-{c}", "node": "matrix-node", "index": 7},
        {"index": 3},
    ),
    (
        "cost-profiles",
        lambda w, c: {
            "scope_kind": "gpu",
            "scope_name": f"GPU-priced-{c}",
            "kind": "rented",
            "rental_rate_per_hour": "2.35",
        },
        {"rental_rate_per_hour": "2.50"},
    ),
):
    _list_key, _detail_key, _list_checks, _detail_checks = _inventory(_kind, _create, _patch)
    TABLE[_list_key] = _list_checks
    TABLE[_detail_key] = _detail_checks

# Entries allowed to be absent from the resolver (a URL a pending change mounts); none now.
OPTIONAL: set[str] = set()


def url_patterns() -> list[str]:
    """Every pattern of config.urls as one string; the admin site's collapse to ``admin/``."""

    def walk(patterns: list[Any], prefix: str) -> list[str]:
        out: list[str] = []
        for p in patterns:
            if isinstance(p, URLResolver):
                out += walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                out.append(prefix + str(p.pattern))
        return out

    found = walk(get_resolver().url_patterns, "")
    return sorted({"admin/" if p.startswith("admin/") else p for p in found})


def test_every_url_pattern_is_in_the_table() -> None:
    patterns = set(url_patterns())
    missing = patterns - set(TABLE)
    assert not missing, f"URL patterns without an entry in TABLE (who may call them?): {missing}"
    stale = set(TABLE) - patterns - OPTIONAL
    assert not stale, f"TABLE entries for URLs that no longer exist: {stale}"


@pytest.fixture
def world(db: Any) -> dict[str, Any]:
    from billing.models import CostProfile
    from fleet.models import Gpu, Pool, Site, Team
    from fleet.roles import role_assign
    from fleet.services import api_token_issue, node_token_issue

    site = Site.objects.create(name="matrix-site")
    team = Team.objects.create(name="matrix-team")
    pool = Pool.objects.create(name="matrix-pool", site=site, team=team)
    node, node_token = node_token_issue(hostname="matrix-node")
    node.pool = pool
    node.save()
    gpu = Gpu.objects.create(uuid="GPU-matrix", node=node, index=0)
    profile = CostProfile.objects.create(
        scope_kind="pool", scope_name="matrix-pool", kind="rented", rental_rate_per_hour="2.00"
    )
    from django.contrib.auth import get_user_model

    users = {}
    for role in ("viewer", "finance", "admin"):
        user = get_user_model().objects.create_user(username=f"session-{role}")
        role_assign(user=user, role=role)
        users[role] = user
    tokens = {
        f"{role}-token": api_token_issue(username=f"api-{role}", role=role)[1]
        for role in ("viewer", "finance", "admin")
    }
    tokens["node"] = node_token
    from django.utils import timezone

    from telemetry.models import Workload

    workload = Workload.objects.create(
        site=site, kind="slurm", key="4242", user_name="alice", created_at=timezone.now()
    )
    return {
        "workload": workload,
        "sites": site,
        "teams": team,
        "pools": pool,
        "nodes": node,
        "gpus": gpu,
        "cost-profiles": profile,
        "users": users,
        "tokens": tokens,
    }


def _client(world: dict[str, Any], caller: str) -> tuple[Client, dict[str, str]]:
    client = Client()
    headers: dict[str, str] = {}
    if caller in world["users"]:
        client.force_login(world["users"][caller])
    elif caller in world["tokens"]:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {world['tokens'][caller]}"
    return client, headers


def test_every_url_by_every_caller(world: dict[str, Any]) -> None:
    """One test for the whole table (one fixture world: the table is ~400 requests)."""
    mounted = set(url_patterns())
    wrong: list[str] = []
    for pattern in sorted(TABLE):
        if pattern in OPTIONAL and pattern not in mounted:
            continue
        for check in TABLE[pattern]:
            wrong += _run(check, world)
    assert not wrong, "\n".join(wrong)


def _run(check: Check, world: dict[str, Any]) -> list[str]:
    wrong: list[str] = []
    url = check.url(world)
    for caller in CALLERS:
        client, headers = _client(world, caller)
        kwargs: dict[str, Any] = dict(headers)
        if check.data is not None:
            kwargs["data"] = json.dumps(check.data(world, caller))
            kwargs["content_type"] = "application/json"
        response = client.generic(check.method, url, **kwargs)
        if hasattr(response, "streaming_content"):
            b"".join(response.streaming_content)
        want = check.expected[caller]
        if response.status_code != want:
            wrong.append(f"{check.method} {url} as {caller}: {response.status_code}, want {want}")
    return wrong
