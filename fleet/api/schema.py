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
