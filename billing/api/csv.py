"""CSV for the finance API: one writer for every export, safe against formula injection.

A spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@`` (and, in some, a tab
or carriage return) as a formula, so a team named ``=HYPERLINK(…)`` could run code on a finance
laptop. Text cells that start with one of those get a leading ``'`` (OWASP's advice), which
spreadsheets show but do not evaluate. Numbers we format ourselves are never escaped, so a
negative amount stays a number.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer

FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
CSV_MEDIA_TYPE = "text/csv"


def csv_escape_text(value: str) -> str:
    """A text cell that no spreadsheet will evaluate."""
    if value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def csv_cell(value: Any, *, text: bool) -> str:
    """One cell: ``None`` empty, booleans ``true``/``false``, text columns escaped."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if text:
        return csv_escape_text(str(value))
    return str(value)


class _Echo:
    """A file-like object whose ``write`` returns the line, so csv.writer can feed a generator
    without a buffer holding the whole export (Django's streaming CSV recipe)."""

    def write(self, value: str) -> str:
        return value


def csv_stream(
    rows: Iterable[Mapping[str, Any]], *, columns: Sequence[str], text_columns: frozenset[str]
) -> Iterator[str]:
    """The header line, then one line per row, produced as the rows are produced."""
    writer = csv.writer(_Echo(), lineterminator="\r\n")
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow([csv_cell(row.get(c), text=c in text_columns) for c in columns])


def csv_response(
    rows: Iterable[Mapping[str, Any]],
    *,
    columns: Sequence[str],
    text_columns: frozenset[str],
    filename: str,
) -> StreamingHttpResponse:
    """An export streamed as it is produced, offered for download as ``filename``."""
    lines = csv_stream(rows, columns=columns, text_columns=text_columns)
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class CsvRenderer(BaseRenderer):
    """Lets content negotiation pick CSV (``?format=csv`` or ``Accept: text/csv``).

    The views stream CSV themselves; this renderer only renders what reaches it as a
    ``Response`` (a list of flat dicts), which keeps DRF from answering 404/406 to a CSV
    request and gives one code path for small answers.
    """

    media_type = CSV_MEDIA_TYPE
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        rows = data if isinstance(data, list) else [data]
        columns: list[str] = []
        for row in rows:
            for key in row:
                if key not in columns:
                    columns.append(key)
        text = frozenset(c for c in columns if any(isinstance(r.get(c), str) for r in rows))
        return "".join(csv_stream(rows, columns=columns, text_columns=text)).encode()
