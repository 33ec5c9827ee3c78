"""The OpenAPI schema is committed (docs/openapi.yaml) and must match what the code generates;
the docs page works offline (drf-spectacular's sidecar, no CDN)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.core.management import call_command

COMMITTED = Path(settings.BASE_DIR) / "docs" / "openapi.yaml"


def test_committed_schema_is_current(tmp_path: Any, postgres: Any) -> None:
    """The committed schema is PostgreSQL's (integer bounds follow the database's columns)."""
    fresh = tmp_path / "openapi.yaml"
    call_command("spectacular", "--file", str(fresh), "--validate", "--fail-on-warn")
    want, got = COMMITTED.read_text().splitlines(), fresh.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(want, got, "docs/openapi.yaml", "generated", lineterm=""))
    assert not diff, (
        "docs/openapi.yaml is stale; run `python manage.py spectacular --file docs/openapi.yaml`"
        f" and commit it:\n{diff[:4000]}"
    )


def test_schema_documents_the_finance_api() -> None:
    schema = yaml.safe_load(COMMITTED.read_text())
    assert schema["openapi"].startswith("3.")
    costs = schema["paths"]["/api/v1/costs"]["get"]
    names = {p["name"] for p in costs["parameters"]}
    assert {"start", "end", "group_by", "period", "format", "site", "pool", "team"} <= names
    assert set(costs["responses"]["200"]["content"]) == {"application/json", "text/csv"}
    row = schema["components"]["schemas"]["CostRow"]["properties"]
    assert row["total_cost"]["type"] == "string" and row["total_cost"]["format"] == "decimal"
    be = schema["paths"]["/api/v1/breakeven"]["get"]
    assert {"pool", "tokens_per_s", "api_price_per_mtok"} <= {p["name"] for p in be["parameters"]}
    assert "apiToken" in schema["components"]["securitySchemes"]
    for path in ("sites", "teams", "pools", "nodes", "gpus", "cost-profiles"):
        assert f"/api/v1/{path}" in schema["paths"]


def test_cost_row_serializer_documents_what_the_api_sends() -> None:
    from billing.api.serializers import COST_COLUMNS, CostRowSerializer, cost_columns

    assert tuple(CostRowSerializer().fields) == cost_columns("team")
    assert COST_COLUMNS == tuple(c for c in cost_columns("team") if c != "cost_center")
    assert cost_columns("pool") == COST_COLUMNS


def test_schema_and_docs_served_without_cdn(role_client: Any) -> None:
    client = role_client("viewer")
    schema = client.get("/api/v1/schema")
    assert schema.status_code == 200
    assert b"/api/v1/costs" in schema.content
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200
    page = docs.content.decode()
    assert "drf_spectacular_sidecar/swagger-ui-dist" in page
    for cdn in ("cdn.jsdelivr.net", "unpkg.com", "cdnjs"):
        assert cdn not in page
    script = client.get("/api/v1/docs?script=")
    assert script.status_code == 200 and b"SwaggerUIBundle" in script.content
    from django.test import Client

    assert Client().get("/api/v1/schema").status_code in (401, 403)
