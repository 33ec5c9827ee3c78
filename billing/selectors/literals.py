"""PostgreSQL array literals for the selectors' statements, cast there (``%s::bigint[]``):
the driver's adaptation of 10,000-element lists costs more than the statement."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TypeVar, cast

T = TypeVar("T")


def array_literal(values: Sequence[int | None]) -> str:
    """Integers (or None) as a PostgreSQL array literal."""
    if None not in values:  # the rule: converted in C (10,000 GPUs' values in ~1 ms)
        return "{" + ",".join(map(str, map(int, cast("Sequence[int]", values)))) + "}"
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def dates_literal(days: Sequence[dt.date]) -> str:
    """Dates as a PostgreSQL array literal."""
    return "{" + ",".join(day.isoformat() for day in days) + "}"


def by_id(values: Mapping[int, T], fill: T) -> tuple[list[T], int, int]:
    """``values`` (GPU id → value) as a dense list for a PostgreSQL array indexed by GPU id,
    ``fill`` where a GPU has none, with its ``base`` and ``top``: SQL arrays are 1-based, so
    a statement reads a GPU's value at ``array[id - base]``, for ``base < id <= top``."""
    base, top = min(values) - 1, max(values)
    dense = [fill] * (top - base)
    for gpu_id, value in values.items():
        dense[gpu_id - base - 1] = value
    return dense, base, top
