"""The array literals the selectors' statements cast (``%s::bigint[]``), read back by
PostgreSQL: the values as given, in order, None as NULL (with and without one)."""

from __future__ import annotations

import pytest
from django.db import connection

from billing.selectors.literals import array_literal
from tests.billing.test_perf_paths import needs_postgres


@needs_postgres
@pytest.mark.django_db
@pytest.mark.parametrize(
    "values",
    [[], [7], [3, 0, -1, 2**40], [5, None, 6], [None], [True, 2]],
    ids=["empty", "one", "ints", "a-null", "only-null", "a-bool"],
)
def test_postgres_reads_the_values_back(values: list[int | None]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::bigint[]", [array_literal(values)])
        (found,) = cursor.fetchone()
    assert found == [None if v is None else int(v) for v in values]
