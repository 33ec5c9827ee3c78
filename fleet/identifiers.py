"""One allowed form for every identifier and free text that comes from outside.

Identifiers (GPU uuids, hostnames, the names of sites, teams, pools, the workload ids of
docs/ingest.md) end up in URLs, page titles, CSV cells and SQL parameters. One of them holding
``/`` made every page that links to it fail (``reverse`` cannot build the URL), a lone UTF-16
surrogate made the database driver raise while encoding it. So every way in (ingest, the fleet
file, the inventory API, the admin, the management commands) checks the same rules here:

- an **identifier** is 1 to ``max_length`` printable characters (``str.isprintable``: no
  control, format, surrogate, private-use or unassigned code points, no line or paragraph
  separators; a plain space is printable), with no ``/`` or ``\\``, no leading or trailing
  whitespace, and neither ``.`` nor ``..`` (a path segment that browsers resolve away);
- a **text** (a GPU's product name, a driver version, a cost centre) is the same without the
  ``/`` rule and may be empty.

The functions return the reason a value is refused (for a 4xx naming the field) or None.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.utils.deconstruct import deconstructible

# Characters that would change the meaning of a URL path built from the identifier.
_PATH_CHARACTERS = ("/", "\\")
_DOT_SEGMENTS = (".", "..")


def text_error(value: Any, *, max_length: int) -> str | None:
    """Why ``value`` is not an acceptable free text of at most ``max_length`` characters."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > max_length:
        return f"must be at most {max_length} characters"
    if not value.isprintable():
        return "must contain only printable characters (no control characters or surrogates)"
    return None


def identifier_error(value: Any, *, max_length: int) -> str | None:
    """Why ``value`` is not an acceptable identifier of at most ``max_length`` characters."""
    error = text_error(value, max_length=max_length)
    if error is not None:
        return error
    if not value:
        return "must not be empty"
    if value != value.strip():
        return "must not begin or end with whitespace"
    if any(c in value for c in _PATH_CHARACTERS):
        return "must not contain '/' or '\\'"
    if value in _DOT_SEGMENTS:
        return "must not be '.' or '..'"
    return None


@deconstructible
class IdentifierValidator:
    """The identifier rule (or, with ``text=True``, the text rule) as a Django field validator,
    so the admin and the inventory API's model serializers refuse what ingest refuses."""

    def __init__(self, max_length: int, *, text: bool = False) -> None:
        self.max_length = max_length
        self.text = text

    def __call__(self, value: Any) -> None:
        rule = text_error if self.text else identifier_error
        error = rule(value, max_length=self.max_length)
        if error is not None:
            raise ValidationError(f"Not valid: {error}.", code="invalid")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdentifierValidator) and (other.max_length, other.text) == (
            self.max_length,
            self.text,
        )

    def __hash__(self) -> int:
        return hash((self.max_length, self.text))
