"""PostgreSQL array literals for the selectors' statements, cast there (``%s::bigint[]``):
the driver's adaptation of 10,000-element lists costs more than the statement."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence


def array_literal(values: Sequence[int | None]) -> str:
    """Integers (or None) as a PostgreSQL array literal."""
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def dates_literal(days: Sequence[dt.date]) -> str:
    """Dates as a PostgreSQL array literal."""
    return "{" + ",".join(day.isoformat() for day in days) + "}"
