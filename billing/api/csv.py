"""CSV for everything the product exports: one writer, one neutraliser against formula injection.

A spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@`` (and, in some, a tab
or carriage return) as a formula, so a team named ``=HYPERLINK(…)`` or a GPU UUID an agent
reported as ``=7*7`` could run on a finance laptop. Every cell of every CSV goes through
``csv_cell``; the rule (OWASP's, docs/finance.md "CSV cells") is decided by the value, not by
a list of columns, so a new column is safe without anyone remembering it:

- ``None`` is an empty cell, a boolean ``true``/``false``, an ``int``/``float``/``Decimal``
  its digits: numbers are never altered;
- anything else is text (a string, or what ``str`` makes of it): text that starts with a
  trigger character gets a leading ``'``, which spreadsheets show but do not evaluate. The
  one exception is text that is exactly a decimal number (``-3.20``, what ``money_str`` and
  the FOCUS formatter write for an adjustment): a spreadsheet reads it as that number,
  never as a formula, so a negative amount stays a number.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer

FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
# A plain decimal number, maybe negative: what the number formatters write. No sign but
# the leading minus, no exponent, no spaces: "-2+3" or "-1E+2" are text.
_DECIMAL_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
CSV_MEDIA_TYPE = "text/csv"


def csv_escape_text(value: str) -> str:
    """The neutraliser: a text cell that no spreadsheet will evaluate (module docstring)."""
    if value.startswith(FORMULA_PREFIXES) and not _DECIMAL_NUMBER.fullmatch(value):
        return "'" + value
    return value


def csv_cell(value: Any) -> str:
    """One cell: ``None`` empty, booleans ``true``/``false``, numbers as they are, anything
    else as text through ``csv_escape_text``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    return csv_escape_text(str(value))


class _Echo:
    """A file-like object whose ``write`` returns the line, so csv.writer can feed a generator
    without a buffer holding the whole export (Django's streaming CSV recipe)."""

    def write(self, value: str) -> str:
        return value


def csv_stream(rows: Iterable[Mapping[str, Any]], *, columns: Sequence[str]) -> Iterator[str]:
    """The header line, then one line per row, produced as the rows are produced."""
    writer = csv.writer(_Echo(), lineterminator="\r\n")
    yield writer.writerow([csv_cell(c) for c in columns])
    for row in rows:
        yield writer.writerow([csv_cell(row.get(c)) for c in columns])


def csv_response(
    rows: Iterable[Mapping[str, Any]], *, columns: Sequence[str], filename: str
) -> StreamingHttpResponse:
    """An export streamed as it is produced, offered for download as ``filename``."""
    response = StreamingHttpResponse(
        csv_stream(rows, columns=columns), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class CsvRenderer(BaseRenderer):
    """Lets content negotiation pick CSV (``?format=csv`` or ``Accept: text/csv``).

    The views stream CSV themselves; this renderer only renders what reaches it as a
    ``Response`` (a list of flat dicts, or an error body), which keeps DRF from answering
    404/406 to a CSV request and gives one code path for small answers.
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
        return "".join(csv_stream(rows, columns=columns)).encode()
