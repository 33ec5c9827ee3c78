"""Who may call what: the finance API and the inventory endpoints, by session and API token."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from fleet.models import ApiToken, Gpu, Node, Site
from fleet.services import api_token_issue, token_revoke

READS = [
    "/api/v1/costs",
    "/api/v1/costs?format=csv",
    "/api/v1/focus",
    "/api/v1/breakeven?pool=inference&tokens_per_s=2000&api_price_per_mtok=0.6"
    "&start=2026-03-02&end=2026-03-03",
    "/api/v1/workloads",
    "/api/v1/workloads?group_by=team&format=csv",
    "/api/v1/sites",
    "/api/v1/teams",
    "/api/v1/pools",
    "/api/v1/nodes",
    "/api/v1/gpus",
    "/api/v1/cost-profiles",
]
WRITES = [
    ("/api/v1/sites", {"name": "ams1", "pue": "1.3", "price_per_kwh": "0.25"}),
    ("/api/v1/teams", {"name": "vision", "cost_center": "CC-1"}),
    ("/api/v1/pools", {"name": "eval", "site": "fra1", "team": "research"}),
    ("/api/v1/nodes", {"hostname": "gpu-99", "pool": "inference"}),
    ("/api/v1/gpus", {"uuid": "GPU-new", "node": "gpu-07", "index": 3}),
    (
        "/api/v1/cost-profiles",
        {
            "scope_kind": "site",
            "scope_name": "fra1",
            "kind": "rented",
            "rental_rate_per_hour": "2.35",
        },
    ),
]


def status_of(client: Client, url: str, **headers: Any) -> int:
    response = client.get(url, **headers)
    if hasattr(response, "streaming_content"):
        b"".join(response.streaming_content)
    return response.status_code


@pytest.mark.parametrize("url", READS)
def test_read_matrix_by_session(worked_example: Any, make_user: Any, url: Any) -> None:
    assert status_of(Client(), url) == 401  # anonymous: no session, no token
    for role, expected in [(None, 403), ("viewer", 403), ("finance", 200), ("admin", 200)]:
        client = Client()
        client.force_login(make_user(role))
        assert status_of(client, url) == expected, (role, url)


@pytest.mark.parametrize(("url", "payload"), WRITES)
def test_write_matrix(worked_example: Any, role_client: Any, url: Any, payload: Any) -> None:
    for role in ("viewer", "finance"):
        client = role_client(role)
        assert client.post(url, payload, content_type="application/json").status_code == 403
    admin = role_client("admin")
    response = admin.post(url, payload, content_type="application/json")
    assert response.status_code == 201, response.content
    created = response.json()
    detail = f"{url}/{created['id']}"
    assert admin.get(detail).status_code == 200
    assert admin.patch(detail, {}, content_type="application/json").status_code == 200
    assert Client().post(url, payload, content_type="application/json").status_code == 401


@pytest.mark.parametrize("role", ["viewer", "finance", "admin"])
def test_api_token_authentication(worked_example: Any, db: Any, role: Any) -> None:
    _, token = api_token_issue(username=f"tok-{role}", role=role)
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    expected = 403 if role == "viewer" else 200
    assert status_of(client, "/api/v1/costs", **auth) == expected
    assert status_of(client, "/api/v1/gpus", **auth) == expected
    write = client.post(
        "/api/v1/teams",
        {"name": f"t-{role}"},
        content_type="application/json",
        HTTP_AUTHORIZATION=auth["HTTP_AUTHORIZATION"],
    )
    assert write.status_code == (201 if role == "admin" else 403)
    # A token sends no CSRF token and needs none; a wrong or revoked one is 401.
    wrong = "Bearer " + token[:-2] + ("xx" if not token.endswith("xx") else "yy")
    assert status_of(client, "/api/v1/costs", HTTP_AUTHORIZATION=wrong) == 401
    token_revoke(prefix=ApiToken.objects.get(user__username=f"tok-{role}").prefix)
    assert status_of(client, "/api/v1/costs", **auth) == 401


def test_session_writes_need_csrf(worked_example: Any, make_user: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("admin"))
    response = client.post("/api/v1/teams", {"name": "x"}, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]


def test_inventory_never_shows_tokens(worked_example: Any, role_client: Any) -> None:
    from fleet.services import node_token_issue

    node_token_issue(hostname="gpu-07")
    admin = role_client("admin")
    body = json.dumps([admin.get(u).json() for u in ("/api/v1/nodes", "/api/v1/gpus")])
    assert "token" not in body and "hash" not in body
    (node,) = admin.get("/api/v1/nodes").json()["results"]
    assert node["hostname"] == "gpu-07" and node["pool"] == "inference"
    assert node["effective_site"] == "fra1"
    (gpu,) = admin.get("/api/v1/gpus?pool=inference").json()["results"]
    assert (gpu["uuid"], gpu["node"], gpu["pool"], gpu["site"]) == (
        "GPU-example",
        "gpu-07",
        "inference",
        "fra1",
    )


def test_inventory_filters(worked_example: Any, fleet: Any, role_client: Any) -> None:
    other = fleet.node("gpu-08", site=fleet.site("ams1"))
    fleet.gpu("GPU-b", node=other, team=fleet.team("vision"))
    finance = role_client("finance")

    def uuids(query: str) -> list[str]:
        return [g["uuid"] for g in finance.get("/api/v1/gpus" + query).json()["results"]]

    assert uuids("") == ["GPU-example", "GPU-b"]
    assert uuids("?site=ams1") == ["GPU-b"]
    assert uuids("?site=fra1") == ["GPU-example"]
    assert uuids("?team=research") == ["GPU-example"]
    assert uuids("?team=vision") == ["GPU-b"]
    assert uuids("?node=gpu-08") == ["GPU-b"]
    assert uuids("?retired=false") == ["GPU-example", "GPU-b"]
    sites = finance.get("/api/v1/sites?name__icontains=AMS").json()["results"]
    assert [s["name"] for s in sites] == ["ams1"]


def test_inventory_deletes(worked_example: Any, role_client: Any) -> None:
    admin = role_client("admin")
    site = Site.objects.get(name="fra1")
    response = admin.delete(f"/api/v1/sites/{site.pk}")
    assert response.status_code == 409  # the pool still uses it: said, not a 500
    assert "inference" in response.json()["detail"]
    assert admin.delete(f"/api/v1/gpus/{Gpu.objects.get().pk}").status_code == 405
    assert admin.delete(f"/api/v1/nodes/{Node.objects.get().pk}").status_code == 405
    retired = admin.patch(
        f"/api/v1/gpus/{Gpu.objects.get().pk}",
        {"retired_at": "2026-03-01T00:00:00Z"},
        content_type="application/json",
    )
    assert retired.status_code == 400 and "retired_at" in retired.json()
    renamed = admin.patch(
        f"/api/v1/gpus/{Gpu.objects.get().pk}",
        {"uuid": "GPU-other"},
        content_type="application/json",
    )
    assert renamed.status_code == 400 and "uuid" in renamed.json()


def test_cost_profile_validation(worked_example: Any, role_client: Any) -> None:
    admin = role_client("admin")
    bad = admin.post(
        "/api/v1/cost-profiles",
        {"scope_kind": "pool", "scope_name": "nope", "kind": "owned", "purchase_price": "1"},
        content_type="application/json",
    )
    assert bad.status_code == 400 and "scope_name" in bad.json()
    dup = admin.post(
        "/api/v1/cost-profiles",
        {"scope_kind": "pool", "scope_name": "inference", "kind": "owned"},
        content_type="application/json",
    )
    assert dup.status_code == 400  # one profile per scope
    (profile,) = admin.get("/api/v1/cost-profiles?kind=owned").json()["results"]
    assert profile["scope"] == "pool:inference" and profile["purchase_price"] == "30000.00"


def test_list_query_counts_do_not_grow(
    worked_example: Any,
    fleet: Any,
    role_client: Any,
    django_assert_max_num_queries: Any,
) -> None:
    finance = role_client("finance")
    finance.get("/api/v1/gpus")  # warm the session and permission caches
    for i in range(5):
        fleet.gpu(f"GPU-x{i}", node=fleet.node(f"n{i}", pool=worked_example.node.pool))
    for url in ("/api/v1/gpus", "/api/v1/nodes", "/api/v1/pools"):
        with django_assert_max_num_queries(8):
            assert finance.get(url).status_code == 200
