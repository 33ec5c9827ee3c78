"""OpenAPI descriptions of the bearer-token schemes (drf-spectacular extensions).

Imported by ``fleet.api.urls`` so they are registered whenever the URLconf is loaded.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "fleet.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A person's API token (`manage.py issue_api_token USER --role "
            "finance`): `Authorization: Bearer gfa_…`",
        }


class NodeTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "fleet.authentication.NodeTokenAuthentication"
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A node agent's token (`manage.py issue_node_token HOST`): "
            "`Authorization: Bearer gfn_…`",
        }


_ERROR_STATUSES = {
    "400": "Bad input: the body names each offending field or parameter.",
    "401": "No credentials, or a wrong, revoked or expired token.",
    "403": "Authenticated, but the role may not do this.",
    "404": "No such object.",
}


def error_responses_document(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation documents the error answers that
    the permission classes and validation can give, with a JSON object body (``detail`` or
    one entry per field), so clients and schema-driven tests know to expect them."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault(
        "Error",
        {
            "type": "object",
            "description": "`detail` for request-level errors, else one entry per field.",
            "additionalProperties": True,
        },
    )
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status, description in _ERROR_STATUSES.items():
                if status == "404" and "{" not in path:
                    continue
                responses.setdefault(status, {"description": description, "content": ref})
            if method == "delete":
                responses.setdefault(
                    "409", {"description": "Still in use by other objects.", "content": ref}
                )
    return result
