"""GET /api/v1/costs against docs/metrics.md's worked example, computed by hand; CSV export."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.http import StreamingHttpResponse
from django.test.utils import CaptureQueriesContext

from billing import selectors
from billing.api.csv import csv_cell, csv_escape_text
from billing.api.views import cost_rows_chunked, period_chunks
from billing.cost_model import money_round
from billing.selectors import costs as costs_selectors
from fleet.models import FleetSettings
from tests.billing.conftest import at, day_query

COSTS = "/api/v1/costs"


@pytest.mark.smoke
def test_costs_json_equals_the_worked_example(worked_example: Any, finance: Any) -> None:
    response = finance.get(COSTS, day_query())
    assert response.status_code == 200, response.content
    body = response.json()
    # A cursor page (the default): no count, no previous; the last page has no next.
    assert body.keys() == {"next", "results"} and body["next"] is None
    (row,) = body["results"]
    # docs/metrics.md, by hand: 9 h in the air, 6 held, 5 parked, 4 offline of 24.
    assert row["key"] == "GPU-example" and row["name"] == "gpu-07#0"
    assert row["period_start"] == "2026-03-02T00:00:00+00:00"
    assert row["period_end"] == "2026-03-03T00:00:00+00:00"
    assert row["capacity_hours"] == 24.0 and row["observed_hours"] == 20.0
    assert (row["air_hours"], row["held_hours"], row["parked_hours"], row["offline_hours"]) == (
        9.0,
        6.0,
        5.0,
        4.0,
    )
    assert row["utilization"] == 0.375 and row["hours_in_air_per_day"] == 9.0
    assert row["energy_kwh"] == 4.95 and row["idle_energy_kwh"] == 0.95
    assert row["co2e_kg"] == 2.97
    assert row["currency"] == "USD"
    # 0.784463 × 24 = 18.827105; 4.95 × 1.5 × 0.20 = 1.485 → 1.49 (half-up, not 1.48).
    assert row["fixed_cost"] == "18.83"
    assert row["energy_cost"] == "1.49"
    assert row["total_cost"] == "20.31"
    assert row["idle_cost"] == "12.05"
    assert row["cost_per_air_hour"] == "2.26"
    assert row["priced"] is True
    assert row["throttled_hours"] == 0.0 and row["work_utilization"] is None
    assert row["gpu_count"] == 1


def test_costs_money_equals_the_dashboards_to_the_cent(
    worked_example: Any,
    fleet: Any,
    finance: Any,
) -> None:
    """The dashboard shows ``money_round`` of the selectors' Decimals; the API must too."""
    node = worked_example.node
    other = fleet.gpu("GPU-other", node=node, index=1, in_service_at=at("2026-03-01T07"))
    fleet.save(
        [
            fleet.usage(
                other,
                at(f"2026-03-0{d}T{h:02d}"),
                observed_s=3600,
                air_s=1234.5,
                held_s=2365.5,
                energy_j=987_654.3,
                idle_energy_j=12_345.6,
                idle_s=77,
                throttle_thermal_s=30,
                throttle_any_s=30,
            )
            for d in (1, 2, 3)
            for h in range(8, 20)
        ]
    )
    for group_by in ("gpu", "node", "pool", "team", "site", "model", "fleet"):
        for period in ("day", "week", "all"):
            query = {
                "start": "2026-02-27",
                "end": "2026-03-06",
                "group_by": group_by,
                "period": period,
                "limit": "1000",
            }
            api_rows = finance.get(COSTS, query).json()["results"]
            rows = selectors.cost_rows(
                start=dt.date(2026, 2, 27),
                end=dt.date(2026, 3, 6),
                group_by=group_by,
                period=period,
            )
            assert len(api_rows) == len(rows) > 0
            for api_row, row in zip(api_rows, rows, strict=True):
                assert api_row["key"] == row.key
                for name in ("fixed_cost", "energy_cost", "total_cost", "idle_cost"):
                    assert api_row[name] == str(money_round(getattr(row, name))), name
                assert api_row["cost_per_air_hour"] == (
                    str(money_round(row.cost_per_air_hour)) if row.cost_per_air_hour else None
                )
                assert api_row["air_hours"] == round(row.air_hours, 6)


def test_costs_group_by_period_and_filters(worked_example: Any, fleet: Any, finance: Any) -> None:
    other_team = fleet.team("=cmd|' /C calc'!A0")
    pool = fleet.pool("batch", site=worked_example.node.pool.site, team=other_team)
    gpu = fleet.gpu(
        "GPU-batch",
        node=fleet.node("gpu-08", pool=pool),
        in_service_at=at("2026-03-02T00"),
        retired_at=at("2026-03-03T00"),
    )
    fleet.owned("gpu:GPU-batch", purchase_price="0", opex_per_hour="1.00")
    fleet.save([fleet.usage(gpu, at("2026-03-02T05"), observed_s=3600, air_s=3600)])

    teams = finance.get(COSTS, day_query(group_by="team")).json()["results"]
    assert [(r["key"], r["total_cost"]) for r in teams] == [
        ("=cmd|' /C calc'!A0", "24.00"),
        ("research", "20.31"),
    ]
    only = finance.get(COSTS, day_query(group_by="pool", pool="inference")).json()["results"]
    assert [r["key"] for r in only] == ["inference"]
    both = finance.get(COSTS, day_query(group_by="pool", pool="inference,batch")).json()
    assert [r["key"] for r in both["results"]] == ["batch", "inference"]
    repeated = finance.get(
        COSTS + "?pool=inference&pool=batch&" + "start=2026-03-02&end=2026-03-03"
    )
    assert len(repeated.json()["results"]) == 2
    by_day = finance.get(
        COSTS, {"start": "2026-03-01", "end": "2026-03-04", "period": "day", "team": "research"}
    ).json()["results"]
    assert [(r["period_start"][:10], r["total_cost"]) for r in by_day] == [
        ("2026-03-02", "20.31"),
        ("2026-03-03", "18.83"),  # in service all day, no samples: 24 h offline at 0.784463
    ]


def test_costs_cursor_pages_are_stable(worked_example: Any, finance: Any) -> None:
    query = {"start": "2026-03-02", "end": "2026-03-09", "period": "day"}
    full = finance.get(COSTS, query).json()
    assert len(full["results"]) == 7 and full["next"] is None
    first = finance.get(COSTS, {**query, "limit": 3}).json()
    assert "cursor=" in first["next"] and "limit=3" in first["next"]
    second = finance.get(first["next"]).json()
    third = finance.get(second["next"]).json()
    assert third["next"] is None
    pages = first["results"] + second["results"] + third["results"]
    assert pages == full["results"]
    assert [r["period_start"][:10] for r in pages] == [f"2026-03-0{d}" for d in range(2, 9)]


def test_costs_offset_pages_count_every_row(worked_example: Any, finance: Any) -> None:
    query = {"start": "2026-03-02", "end": "2026-03-09", "period": "day"}
    full = finance.get(COSTS, query).json()
    first = finance.get(COSTS, {**query, "limit": 3, "offset": 0}).json()
    assert first["count"] == 7 and first["previous"] is None
    assert "offset=3" in first["next"] and "limit=3" in first["next"]
    second = finance.get(first["next"]).json()
    third = finance.get(second["next"]).json()
    assert third["next"] is None and third["count"] == 7 and "offset=3" in third["previous"]
    assert first["results"] + second["results"] + third["results"] == full["results"]
    beyond = finance.get(COSTS, {**query, "offset": 7}).json()
    assert (beyond["count"], beyond["results"]) == (7, [])


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"cursor": "not-a-cursor"}, "not a cursor"),
        ({"cursor": "WyIyMDI2LTAzLTAyIiwxLCIiXQ"}, "not a cursor"),  # ["2026-03-02",1,""]
        ({"cursor": "WyIyMDI2LTAzLTAyIiwiYSIsIiJd", "offset": "0"}, "not both"),
        ({"limit": "0"}, "whole number"),
        ({"offset": "-1"}, "whole number"),
    ],
)
def test_costs_bad_pages_are_400_naming_the_parameter(
    worked_example: Any, finance: Any, query: Any, message: str
) -> None:
    response = finance.get(COSTS, {"start": "2026-03-02", "end": "2026-03-09", **query})
    assert response.status_code == 400
    ((field, (text,)),) = response.json().items()
    assert field in query and message in text


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"start": "2026-13-01"}, "start"),
        ({"end": "yesterday"}, "end"),
        ({"start": "2026-03-05", "end": "2026-03-02"}, "end"),
        ({"start": "2026-03-02", "end": "2026-03-02"}, "end"),
        ({"start": "2020-01-01", "end": "2026-03-02"}, "start"),
        ({"group_by": "rack"}, "group_by"),
        ({"period": "year"}, "period"),
        ({"team": "nobody"}, "team"),
        ({"site": "fra1,mars"}, "site"),
        ({"model": "H900"}, "model"),
        ({"pool": "nope", "format": "csv"}, "pool"),
    ],
)
def test_costs_bad_parameters_are_400_naming_the_field(
    worked_example: Any,
    finance: Any,
    query: Any,
    field: Any,
) -> None:
    response = finance.get(COSTS, query)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert field in response.json()


def test_costs_default_is_month_to_date(worked_example: Any, finance: Any) -> None:
    body = finance.get(COSTS).json()  # now is 2026-03-10 12:00 UTC
    (row,) = body["results"]
    assert row["period_start"] == "2026-03-01T00:00:00+00:00"
    assert row["period_end"] == "2026-03-11T00:00:00+00:00"
    # Capacity stops at now: from 03-02 00:00 to 03-10 12:00.
    assert row["capacity_hours"] == 8 * 24 + 12


def test_costs_times_carry_the_report_time_zone_offset(
    worked_example: Any,
    fleet: Any,
    finance: Any,
) -> None:
    fleet.settings(report_time_zone="Europe/Berlin")
    (row,) = finance.get(COSTS, day_query()).json()["results"]
    assert row["period_start"] == "2026-03-02T00:00:00+01:00"
    assert row["period_end"] == "2026-03-03T00:00:00+01:00"


# --- CSV --------------------------------------------------------------------------------------


def read_csv(response: Any) -> list[dict[str, str]]:
    assert isinstance(response, StreamingHttpResponse)
    text = b"".join(response.streaming_content).decode()  # type: ignore[arg-type]
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.smoke
def test_csv_escapes_formula_injection() -> None:
    for prefix in ("=", "+", "-", "@", "\t", "\r"):
        assert csv_escape_text(prefix + "SUM(A1)") == "'" + prefix + "SUM(A1)"
    assert csv_escape_text("research") == "research"
    assert csv_cell("-1.50") == "-1.50"  # a plain decimal stays a number
    assert csv_cell("-2+3") == "'-2+3"  # anything else starting with - is text
    assert csv_cell(None) == "" and csv_cell(True) == "true"


def test_costs_csv_same_rows_as_json_and_escaped(
    worked_example: Any,
    fleet: Any,
    finance: Any,
) -> None:
    evil = fleet.team("=cmd|' /C calc'!A0")
    worked_example.team = evil
    worked_example.save()
    fleet.save(
        [fleet.usage(worked_example, at("2026-03-02T21"), observed_s=60, air_s=60, team=evil)]
    )
    query = day_query(group_by="team")
    json_rows = finance.get(COSTS, query).json()["results"]
    response = finance.get(COSTS, {**query, "format": "csv"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="costs_2026-03-02_2026-03-03_team_all.csv"'
    )
    rows = read_csv(response)
    assert [r["key"] for r in rows] == ["'=cmd|' /C calc'!A0", "research"]
    assert [r["name"] for r in rows] == ["'=cmd|' /C calc'!A0", "research"]
    for csv_row, json_row in zip(rows, json_rows, strict=True):
        assert list(csv_row) == list(json_row)  # the same columns in the same order
        for name in ("total_cost", "idle_cost", "fixed_cost", "currency", "air_hours"):
            assert csv_row[name] == str(json_row[name])
        assert csv_row["priced"] == "true"
        assert csv_row["work_utilization"] == ""

    accept = finance.get(COSTS, query, HTTP_ACCEPT="text/csv")
    assert accept["Content-Type"] == "text/csv; charset=utf-8"
    assert read_csv(accept) == rows


def test_costs_csv_streams_month_by_month(
    worked_example: Any,
    finance: Any,
    monkeypatch: Any,
) -> None:
    calls: list[tuple[dt.date, dt.date]] = []
    real = costs_selectors._compute

    def spy(**kwargs: Any) -> Any:  # one computation per chunk
        calls.append((kwargs["start"], kwargs["end"]))
        return real(**kwargs)

    monkeypatch.setattr(costs_selectors, "_compute", spy)
    response = finance.get(
        COSTS, {"start": "2026-01-15", "end": "2026-04-10", "period": "day", "format": "csv"}
    )
    assert isinstance(response, StreamingHttpResponse)
    assert calls == []  # nothing computed until the body is read
    lines = iter(response.streaming_content)  # type: ignore[arg-type]
    assert next(lines).startswith(b"key,name,period_start")
    body = b"".join(lines).decode()
    assert calls == [
        (dt.date(2026, 1, 15), dt.date(2026, 2, 1)),
        (dt.date(2026, 2, 1), dt.date(2026, 3, 1)),
        (dt.date(2026, 3, 1), dt.date(2026, 4, 1)),
        (dt.date(2026, 4, 1), dt.date(2026, 4, 10)),
    ]
    assert body.count("\r\n") == 9  # 2026-03-02 … 03-10: 9 days in service (now: 03-10 noon)


def test_period_chunks_never_split_a_bucket() -> None:
    weeks = list(period_chunks(dt.date(2026, 1, 1), dt.date(2026, 3, 20), "week"))
    assert weeks[0] == (dt.date(2026, 1, 1), dt.date(2026, 1, 26))
    assert all(a.weekday() == 0 for a, _ in weeks[1:]) and weeks[-1][1] == dt.date(2026, 3, 20)
    assert list(period_chunks(dt.date(2026, 1, 1), dt.date(2027, 1, 1), "all")) == [
        (dt.date(2026, 1, 1), dt.date(2027, 1, 1))
    ]
    months = list(period_chunks(dt.date(2026, 1, 31), dt.date(2026, 3, 1), "month"))
    assert months == [
        (dt.date(2026, 1, 31), dt.date(2026, 2, 1)),
        (dt.date(2026, 2, 1), dt.date(2026, 3, 1)),
    ]


@pytest.mark.parametrize("period", ["day", "week", "month", "all"])
def test_chunked_rows_equal_one_computation(
    worked_example: Any,
    fleet: Any,
    frozen: Any,
    period: Any,
) -> None:
    gpu = fleet.gpu(
        "GPU-late", node=worked_example.node, index=1, in_service_at=at("2026-01-28T10")
    )
    fleet.save(
        [
            fleet.usage(
                gpu, at(f"2026-02-{d:02d}T03"), observed_s=1800, air_s=900, energy_j=360_000
            )
            for d in range(1, 28, 3)
        ]
    )
    start, end = dt.date(2026, 1, 20), dt.date(2026, 3, 9)
    one = selectors.cost_rows(start=start, end=end, group_by="gpu", period=period)
    chunked = list(
        cost_rows_chunked(
            start=start, end=end, group_by="gpu", period=period, filters=selectors.Filters()
        )
    )
    assert chunked == one
    assert sum((r.total_cost for r in chunked), Decimal(0)) > 0


def _retired_in_february(worked_example: Any, fleet: Any) -> None:
    """A second GPU on the worked example's node, 5 January to 10 February 12:00, with
    samples on 6 and 20 January."""
    gone = fleet.gpu(
        "GPU-gone",
        node=worked_example.node,
        index=2,
        in_service_at=at("2026-01-05T00"),
        retired_at=at("2026-02-10T12"),
    )
    fleet.save(
        [fleet.usage(gone, at(f"2026-01-{d:02d}T05"), observed_s=3600, air_s=1800) for d in (6, 20)]
    )


@pytest.mark.parametrize("group_by", ["gpu", "node", "team"])
def test_parts_read_the_fleet_once_and_equal_each_part_alone(
    worked_example: Any, fleet: Any, frozen: Any, group_by: Any
) -> None:
    # A GPU retired in February: the March part must not see it (its own load excludes it),
    # January and February must.
    _retired_in_february(worked_example, fleet)
    start, end = dt.date(2026, 1, 1), dt.date(2026, 3, 9)
    parts = list(period_chunks(start, end, "day"))
    FleetSettings.load()  # its first load writes the row: not part of what is counted
    with CaptureQueriesContext(connection) as alone_queries:
        alone = [
            row
            for part_start, part_end in parts
            for row in selectors.cost_rows(
                start=part_start, end=part_end, group_by=group_by, period="day"
            )
        ]
    with CaptureQueriesContext(connection) as together_queries:
        together = list(
            selectors.cost_rows_in_parts(
                start=start, end=end, parts=parts, group_by=group_by, period="day"
            )
        )
    assert len(parts) == 3 and together == alone
    keys = {(r.period_start.date(), r.key) for r in together}
    if group_by == "gpu":
        assert (dt.date(2026, 2, 10), "GPU-gone") in keys
        assert not any(key == "GPU-gone" and day >= dt.date(2026, 2, 11) for day, key in keys)
    # The fleet is read once, not once per part: two loads fewer (settings, pools, teams,
    # sites, profiles, GPUs; and on PostgreSQL the zone the daily table holds).
    load = 7 if connection.vendor == "postgresql" else 6
    assert len(alone_queries) - len(together_queries) == 2 * load


@pytest.mark.parametrize(
    ("group_by", "period", "limit"),
    [
        ("gpu", "day", 1),
        ("gpu", "day", 2),
        ("gpu", "day", 5),
        ("team", "day", 3),
        ("gpu", "week", 2),
        ("node", "month", 1),
        ("site", "all", 1),
    ],
)
def test_cursor_pages_are_the_rows_of_the_whole(
    worked_example: Any, fleet: Any, frozen: Any, group_by: str, period: str, limit: int
) -> None:
    # Two GPUs, one retired mid-range, over 68 days from a Thursday (a clipped first week):
    # every page after the place of the one before, joined, is every row of the range, and
    # only the rows returned are priced.
    _retired_in_february(worked_example, fleet)
    start, end = dt.date(2026, 1, 1), dt.date(2026, 3, 9)
    whole = selectors.cost_rows(start=start, end=end, group_by=group_by, period=period)
    pages, after, priced = [], None, []
    real_row = costs_selectors._row

    def counted_row(*args: Any) -> Any:
        priced.append(args[0])
        return real_row(*args)

    with mock.patch.object(costs_selectors, "_row", counted_row):
        while True:
            rows, after = selectors.cost_rows_after(
                start=start, end=end, after=after, limit=limit, group_by=group_by, period=period
            )
            assert len(rows) <= limit
            pages.append(rows)
            if after is None:
                break
    assert [row for page in pages for row in page] == whole
    assert len(priced) == len(whole) and len(pages) == -(-len(whole) // limit)


def test_a_cursor_page_computes_only_the_buckets_it_needs(
    worked_example: Any, fleet: Any, frozen: Any
) -> None:
    # The worked example's GPU has one row a day from 2 March, and the fleet one GPU, so a
    # bucket holds one row at most: the first page of two rows (and one more, to know a next
    # page exists) computes three days at once, never the range.
    parts: list[tuple[dt.date, dt.date]] = []
    real_compute = costs_selectors._compute

    def recorded(**kwargs: Any) -> Any:
        parts.append((kwargs["start"], kwargs["end"]))
        return real_compute(**kwargs)

    start, end = dt.date(2026, 3, 2), dt.date(2026, 3, 9)
    with mock.patch.object(costs_selectors, "_compute", recorded):
        rows, after = selectors.cost_rows_after(
            start=start, end=end, after=None, limit=2, group_by="gpu", period="day"
        )
    assert [r.period_start.date() for r in rows] == [dt.date(2026, 3, 2), dt.date(2026, 3, 3)]
    assert parts == [(start, dt.date(2026, 3, 5))]
    assert after == (dt.date(2026, 3, 3), "GPU-example", "")
    parts.clear()
    with mock.patch.object(costs_selectors, "_compute", recorded):
        rows, after = selectors.cost_rows_after(
            start=start, end=end, after=after, limit=2, group_by="gpu", period="day"
        )
    # From the cursor's own bucket (a row of it may follow the cursor): three days, of which
    # 3 March's row is the cursor's, so two rows, not the three the page needs; then twice
    # as many days (to the range's end).
    assert [r.period_start.date() for r in rows] == [dt.date(2026, 3, 4), dt.date(2026, 3, 5)]
    assert parts == [(dt.date(2026, 3, 3), dt.date(2026, 3, 6)), (dt.date(2026, 3, 6), end)]


def test_a_cursor_page_of_few_groups_is_one_computation(
    worked_example: Any, fleet: Any, frozen: Any
) -> None:
    # Two teams (research and platform) make at most three rows a month with the unassigned
    # row: a page of 100 team rows over three months is computed in one part (101 rows
    # wanted, 3 per month at most: 34 months' worth), not a month and then the rest.
    fleet.team("platform")
    _retired_in_february(worked_example, fleet)
    start, end = dt.date(2026, 1, 1), dt.date(2026, 3, 9)
    parts: list[tuple[dt.date, dt.date]] = []
    real_compute = costs_selectors._compute

    def recorded(**kwargs: Any) -> Any:
        parts.append((kwargs["start"], kwargs["end"]))
        return real_compute(**kwargs)

    with mock.patch.object(costs_selectors, "_compute", recorded):
        rows, after = selectors.cost_rows_after(
            start=start, end=end, after=None, limit=100, group_by="team", period="month"
        )
    assert parts == [(start, end)] and after is None
    assert rows == selectors.cost_rows(start=start, end=end, group_by="team", period="month")
    assert [r.period_start.month for r in rows] == [1, 2, 3]
