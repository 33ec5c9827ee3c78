"""A list of numbers in one column: ``int8[]`` / ``float8[]`` on PostgreSQL, JSON text on SQLite.

The workloads of a sample travel with it as three parallel arrays (workload ids, shares, air
seconds): the sample's key makes a replay change nothing, its partition's retention drops them
with it, and the rollup unnests them in the same scan of the day's samples.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models


class NumberArrayField(models.Field):  # type: ignore[type-arg]
    """``base`` is ``"int8"`` or ``"float8"``; values are lists (or None)."""

    description = "A list of numbers"

    def __init__(self, *args: Any, base: str = "float8", **kwargs: Any) -> None:
        if base not in ("int8", "float8"):
            raise ValueError("base must be int8 or float8")
        self.base = base
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["base"] = self.base
        return name, path, args, kwargs

    def db_type(self, connection: Any) -> str:
        return f"{self.base}[]" if connection.vendor == "postgresql" else "text"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> list[Any] | None:
        if value is None or isinstance(value, list):
            return value
        return list(json.loads(value))

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if value is None or connection.vendor == "postgresql":
            return value
        return json.dumps(list(value))
