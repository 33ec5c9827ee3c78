"""DRF content negotiation that says what is wrong with ``?format=``.

Its own module: ``rest_framework.views`` reads this setting when it is imported, so the class
must not live in a module that imports ``rest_framework.views`` (config.api does).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request


class StrictFormatNegotiation(DefaultContentNegotiation):
    """``?format=`` naming a format the endpoint does not serve answers 400 naming the
    parameter (DRF answers 404, as if the URL did not exist)."""

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        format_query = request.query_params.get(self.settings.URL_FORMAT_OVERRIDE or "format")
        if format_query and not format_suffix:
            known = [r.format for r in renderers]
            if format_query not in known:
                raise ValidationError(
                    {"format": [f"must be one of {', '.join(known)}, not {format_query!r}"]}
                )
        return super().select_renderer(request, renderers, format_suffix)
