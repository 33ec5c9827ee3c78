"""The dates anyone may give the product: one bound for every page, endpoint, command and
fleet file (report ranges, ISO weeks, a GPU's service dates).

Rollups are hourly rows keyed by UTC hours and the calendar arithmetic of the selectors adds
days, weeks, months and depreciation years to what a person typed: ``?from=0001-01-01`` or
``?to=9999-12-31`` overflowed Python's dates (a 500 on every page). No fleet has data before
2000, and no report needs a day after 2100, so dates outside [DATE_MIN, DATE_MAX] are refused
where they come in, with a form error or a 400 naming the parameter.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError

DATE_MIN = dt.date(2000, 1, 1)
DATE_MAX = dt.date(2100, 12, 31)
DATE_RANGE_TEXT = f"{DATE_MIN.isoformat()} to {DATE_MAX.isoformat()}"


def date_error(value: dt.date) -> str | None:
    """Why ``value`` is outside the dates a report may ask about, or None."""
    if not DATE_MIN <= value <= DATE_MAX:
        return f"must be a date from {DATE_RANGE_TEXT}"
    return None


def date_validator(value: Any) -> None:
    """:func:`date_error` as a Django form / DRF field validator."""
    if isinstance(value, dt.date):
        error = date_error(value)
        if error is not None:
            raise ValidationError(error, code="date_range")
