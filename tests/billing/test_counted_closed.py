"""Limit/offset pages counted over closed months (``counting.bucket_counts``, issue 19).

A fleet of seven GPUs from 28 December 2025 to 10 March 2026: January and February closed,
December and March open; late data for January booked in February and carried by its close,
late data for February booked in March; a GPU that moves to another pool, team and site in
February; one retired in February; one in service from 2 January; one with no service start
that sent data on two December days. Every page's count and rows must be those of the whole
computed part by part, the count taken without computing every row where no bucket lies
across a close's edge (by day and month) or in pieces, each wholly open or closed, where one
does (by week and over the whole range).
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from django.db import connection

from billing import selectors
from billing.month_close import adjust_closed, month_close
from tests.billing.conftest import FleetBuilder, at
from tests.billing.test_perf_paths import END, NOW, _offset_pages_match

START = dt.date(2025, 12, 28)
H = dt.timedelta(hours=1)
# Hours left out of the steady GPU's data at first, sent late: a January one after January
# closed (booked in February, carried by February's close), a February one after February
# closed (booked in March).
LATE_JANUARY = [at(f"2026-01-10T{h:02d}") for h in range(4)]
LATE_FEBRUARY = [at(f"2026-02-10T{h:02d}") for h in range(4)]

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the daily table is kept on PostgreSQL only"
)


def _row(fleet: FleetBuilder, gpu: Any, hour: dt.datetime, k: int, **attribution: Any) -> Any:
    u = 0.5 + 0.45 * math.sin(k * 1.7 + hour.timestamp() / 18_000)
    return fleet.usage(
        gpu,
        hour,
        samples=60,
        observed_s=3600.0,
        air_s=3600.0 * u,
        held_s=3600.0 * (1 - u) * 0.6,
        parked_s=3600.0 * (1 - u) * 0.4,
        energy_j=3600.0 * (69 + 560 * u),
        **attribution,
    )


@pytest.fixture
def closed_fleet(fleet: FleetBuilder) -> dict[str, Any]:
    fra = fleet.site("fra1", pue="1.4", price_per_kwh="0.21", grid_g_per_kwh=380.0)
    iad = fleet.site("iad1", pue="1.2", price_per_kwh="0.09", grid_g_per_kwh=390.0)
    research, product = fleet.team("research"), fleet.team("product")
    train = fleet.pool("train", site=fra, team=research)
    serve = fleet.pool("serve", site=iad, team=product)
    n1, n2 = fleet.node("n1", pool=train), fleet.node("n2", pool=serve)
    h100, a100 = fleet.model("H100-SXM"), fleet.model("A100", max_power_w=400, idle_power_w=50)
    fleet.owned("pool:train", purchase_price="30000.00", depreciation_years="5")
    fleet.rented("pool:serve", rental_rate_per_hour="2.49")
    early = at("2025-12-01T00")
    gpus = {
        "steady": fleet.gpu("GPU-steady", node=n1, index=0, in_service_at=early, model=h100),
        "second": fleet.gpu("GPU-second", node=n1, index=1, in_service_at=early, model=a100),
        "serve": fleet.gpu("GPU-serve", node=n2, index=0, in_service_at=early, model=h100),
        "mover": fleet.gpu("GPU-mover", node=n2, index=1, in_service_at=early, model=h100),
        "retired": fleet.gpu(
            "GPU-retired",
            node=n2,
            index=2,
            in_service_at=early,
            model=a100,
            retired_at=at("2026-02-20T15:40"),
        ),
        # In service from 2 January, in a closed month: in the week of 29 December only in
        # its closed days (the stored rows).
        "late": fleet.gpu(
            "GPU-late", node=n1, index=2, in_service_at=at("2026-01-02T09"), model=h100
        ),
        # No service start: rows only where it sent data, 30 and 31 December (open days of
        # that week, hours outside its capacity).
        "unlisted": fleet.gpu("GPU-unlisted", node=n2, index=3, model=h100),
    }
    rows, late = [], []
    hour, i = at("2025-12-28T00"), 0
    while hour < at("2026-03-10T14"):
        for k, (name, gpu) in enumerate(gpus.items()):
            if (i + k) % 17 == 0 or (name == "retired" and hour >= at("2026-02-20T16")):
                continue  # an offline hour; the retired GPU's days after it left
            if (name == "late" and hour < at("2026-01-02T09")) or (
                name == "unlisted" and not at("2025-12-30T00") <= hour < at("2026-01-01T00")
            ):
                continue
            moved = {"node": n1, "pool": train, "site": fra, "team": research}
            row = _row(
                fleet,
                gpu,
                hour,
                k,
                **(moved if name == "mover" and hour >= at("2026-02-14T11") else {}),
            )
            if name == "steady" and hour in (*LATE_JANUARY, *LATE_FEBRUARY):
                late.append(row)
            else:
                rows.append(row)
        hour += H
        i += 1
    fleet.save(rows)
    gpus["mover"].node = n1
    gpus["mover"].save()
    month_close(month=dt.date(2026, 1, 1), by="alice", now=at("2026-02-03T00"))
    fleet.save([r for r in late if r.hour in LATE_JANUARY])
    # February's close books January's late data in February first.
    month_close(month=dt.date(2026, 2, 1), by="alice", now=at("2026-03-02T00"))
    fleet.save([r for r in late if r.hour in LATE_FEBRUARY])
    adjust_closed(now=NOW)  # February's, in March
    return gpus


def _whole(group_by: str, period: str, flt: selectors.Filters) -> list[Any]:
    from billing.api.views import period_chunks

    parts = list(period_chunks(START, END, period))
    query = {"start": START, "end": END, "group_by": group_by, "period": period}
    return list(selectors.cost_rows_in_parts(**query, parts=parts, filters=flt, now=NOW))


FILTERS = [
    selectors.Filters(),
    selectors.Filters(teams=("research",)),
    selectors.Filters(sites=("iad1",), models=("H100-SXM",)),
]


@pytest.mark.parametrize("flt", FILTERS)
@pytest.mark.parametrize("group_by", selectors.GROUP_BY)
@pytest.mark.parametrize("period", ["day", "week", "month", "all"])
def test_pages_over_closed_months_are_counted(
    closed_fleet: dict[str, Any], flt: selectors.Filters, group_by: str, period: str
) -> None:
    # By week and over the whole range a bucket lies across a close's edge (the weeks of
    # 29 December and 23 February): counted in pieces, each wholly open or closed.
    assert _offset_pages_match(flt, group_by, period, START) > 0


def test_the_fixture_has_what_the_count_must_handle(closed_fleet: dict[str, Any]) -> None:
    rows = _whole("gpu", "day", selectors.Filters())
    adjusting = {(r.period_start.date(), r.key, r.adjustment_for) for r in rows if r.adjustment_for}
    # January's late data carried by February (its first day), February's booked in March.
    assert adjusting == {
        (dt.date(2026, 2, 1), "GPU-steady", "2026-01"),
        (dt.date(2026, 3, 1), "GPU-steady", "2026-02"),
    }
    # The mover's closed February days are under two pools by node: two rows on 14 February.
    by_node = _whole("node", "day", selectors.Filters())
    feb14 = [r for r in by_node if r.period_start.date() == dt.date(2026, 2, 14)]
    assert {r.key for r in feb14} == {"n1", "n2"} and all(r.closed for r in feb14)
    # December and March open, January and February closed: 73 days; 5 GPUs but the retired
    # one after 20 February (18 days), the rows of the adjustments, the late GPU's days from
    # 2 January (68), the unlisted one's two.
    assert len(rows) == 5 * 73 - 18 + 2 + 68 + 2


def test_the_weeks_across_a_close_edge_are_counted_in_pieces(closed_fleet: dict[str, Any]) -> None:
    from billing.selectors.calendar import _buckets
    from billing.selectors.counting import _pieces

    buckets = _buckets(START, END, "week", dt.UTC)
    closed = {dt.date(2026, 1, 1), dt.date(2026, 2, 1)}
    pieces, owner = _pieces(buckets, closed, dt.UTC)
    # Two weeks lie across a close's edge: 29 December - 4 January (split at 1 January) and
    # 23 February - 1 March (at 1 March).
    split = {
        buckets[j].key: [
            (p.local_start.date(), p.local_end.date())
            for p, o in zip(pieces, owner, strict=True)
            if o == j
        ]
        for j in set(owner)
        if owner.count(j) > 1
    }
    assert split == {
        dt.date(2025, 12, 29): [
            (dt.date(2025, 12, 29), dt.date(2026, 1, 1)),
            (dt.date(2026, 1, 1), dt.date(2026, 1, 5)),
        ],
        dt.date(2026, 2, 23): [
            (dt.date(2026, 2, 23), dt.date(2026, 3, 1)),
            (dt.date(2026, 3, 1), dt.date(2026, 3, 2)),
        ],
    }
    # The other weeks lie in open or in closed months only: not split. By team the week of
    # 23 February holds product (the serving GPU) and research (the training GPUs and the
    # mover, moved there on 14 February), and February's late data, booked on 1 March.
    rows = _whole("team", "week", selectors.Filters())
    week = [
        (r.key, r.adjustment_for) for r in rows if r.period_start.date() == dt.date(2026, 2, 23)
    ]
    assert sorted(week, key=str) == sorted(
        [("product", None), ("research", None), ("research", "2026-02")], key=str
    )


@pytest.mark.parametrize("group_by", ["gpu", "team"])
def test_a_gpu_retired_after_the_close_into_a_closed_month(
    closed_fleet: dict[str, Any], group_by: str
) -> None:
    # Its retirement moved back to 20 January once February is closed: February's part no
    # longer holds it, so its frozen February days are no rows there, as when every part is
    # computed.
    retired = closed_fleet["retired"]
    retired.retired_at = at("2026-01-20T12")
    retired.save()  # marks the closed months stale (billing.signals)
    adjust_closed(now=NOW)
    count = _offset_pages_match(selectors.Filters(), group_by, "day", START)
    if group_by == "gpu":
        # The fixture's count less its 20 February days (its January days stay: January's
        # part holds it), and one row more: January computed now has its capacity end on
        # 20 January, late data for January booked in March.
        assert count == 5 * 73 - 18 + 2 + 68 + 2 - 20 + 1
