"""Month close: frozen figures, late data as adjustments, reopen and re-close (docs/finance.md).

The worked example's GPU is in service from 2 March 2026; March is closed on 5 April. A late
batch then fills 2 March's four offline hours (20:00-24:00) at 100 % and 400 W: capacity does
not change (offline becomes observed), so the fixed cost does not either; energy grows by
4 × 3,600 s × 400 W = 5,760,000 J = 1.6 kWh, at 0.20 × PUE 1.5 = 0.48; idle cost falls by
the 4 hours now in the air, 4 × 0.78446269678… = 3.1378507871 → −3.14.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command

from billing.cost_model import money_round
from tests.billing.conftest import at

CLOSE_NOW = at("2026-04-05T12")
COSTS = "/api/v1/costs"
FOCUS = "/api/v1/focus"
MARCH = {"start": "2026-03-01", "end": "2026-04-01", "group_by": "gpu", "period": "month"}
MARCH_APRIL = {"start": "2026-03-01", "end": "2026-05-01", "group_by": "gpu", "period": "month"}
# March by hand: 30 days in service (2 March to 1 April) = 720 h at 0.78446269678… =
# 564.8131416838; energy 4.95 kWh × 0.30 = 1.485; total 566.2981416838 → 566.30.
MARCH_TOTAL = "566.30"


@pytest.fixture
def april(role_client: Any) -> Any:
    with time_machine.travel(CLOSE_NOW, tick=False):
        yield role_client("finance")


def late_batch(fleet: Any, gpu: Any) -> None:
    fleet.save(
        [
            fleet.usage(
                gpu,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                air_s=3600,
                energy_j=1_440_000,
            )
            for h in range(20, 24)
        ]
    )


def rows(client: Any, query: dict[str, str]) -> list[dict[str, Any]]:
    response = client.get(COSTS, {**query, "limit": 100})
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


def close(month: str = "2026-03") -> str:
    out = io.StringIO()
    call_command("close_month", month, "--by", "alice", stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def book(*args: str) -> str:
    """What the task does every 5 minutes: book the late data of the stale closed months."""
    out = io.StringIO()
    call_command("adjust_closed", *args, stdout=out)
    return out.getvalue().strip()


def test_close_freezes_the_month_and_books_late_data_in_april(
    worked_example: Any, fleet: Any, april: Any
) -> None:
    from billing.models import MonthClose

    (before,) = rows(april, MARCH)
    assert before["total_cost"] == MARCH_TOTAL and before["closed"] is False
    assert close().startswith("closed 2026-03")
    record = MonthClose.objects.get()
    assert (record.closed_by, record.closed_at, record.closed) == ("alice", CLOSE_NOW, True)

    late_batch(fleet, worked_example)
    (frozen,) = rows(april, MARCH)
    # Not a figure moved, and the row says why.
    assert frozen == {**before, "closed": True}
    # The late rows marked March stale as they were written (the hourly table's trigger);
    # nothing is booked until the task runs: a read never looks for late data.
    from billing.models import ClosedMonthStale

    assert list(ClosedMonthStale.objects.values_list("month", flat=True)) == [dt.date(2026, 3, 1)]
    assert [r["adjustment_for"] for r in rows(april, MARCH_APRIL)] == [None, None]
    # One row: the GPU, 2 March, its attribution and terms. Booked once, however often run.
    assert book() == "booked 1 adjustment rows (2026-03: 1 rows)"
    assert not ClosedMonthStale.objects.exists()
    assert book() == "booked 0 adjustment rows (nothing stale)"
    assert book("--all") == "booked 0 adjustment rows (2026-03: 0 rows)"
    march, april_row, adjustment = rows(april, MARCH_APRIL)
    assert march == frozen
    assert (april_row["adjustment_for"], adjustment["adjustment_for"]) == (None, "2026-03")
    assert adjustment["period_start"] == april_row["period_start"] == "2026-04-01T00:00:00+00:00"
    assert adjustment["key"] == "GPU-example" and adjustment["closed"] is False
    # The late money, by hand (module docstring).
    assert adjustment["fixed_cost"] == "0.00"
    assert adjustment["energy_cost"] == adjustment["total_cost"] == "0.48"
    assert adjustment["idle_cost"] == "-3.14"
    assert adjustment["air_hours"] == 4.0 and adjustment["offline_hours"] == -4.0
    assert adjustment["energy_kwh"] == 1.6 and adjustment["capacity_hours"] == 0.0

    # Cursor pages of one row, over days: the adjustment follows 1 April's own row, on a page
    # of its own, as it does among every row of the range.
    by_day = {**MARCH_APRIL, "period": "day"}
    every = april.get(COSTS, {**by_day, "limit": 1000, "offset": 0}).json()
    assert every["count"] == 30 + 5 + 1 and every["next"] is None  # to 5 April, + adjustment
    paged, page = [], april.get(COSTS, {**by_day, "limit": 1}).json()
    while True:
        paged += page["results"]
        if page["next"] is None:
            break
        page = april.get(page["next"]).json()
    assert paged == every["results"]
    assert [r["adjustment_for"] for r in paged[29:32]] == [None, None, "2026-03"]

    # The difference a recomputation gives: reopen, and March is the frozen figure plus it.
    call_command("reopen_month", "2026-03", "--reason", "late batch from gpu-07", "--by", "bob")
    record.refresh_from_db()
    assert record.closed is False
    # The history: who closed and reopened it, when and why, newest first.
    assert [(e.action, e.at, e.by, e.reason) for e in record.events.all()] == [
        ("reopened", CLOSE_NOW, "bob", "late batch from gpu-07"),
        ("closed", CLOSE_NOW, "alice", ""),
    ]
    (live,) = rows(april, MARCH)
    for field in ("fixed_cost", "energy_cost", "total_cost", "idle_cost"):
        assert Decimal(live[field]) == Decimal(frozen[field]) + Decimal(adjustment[field])
    assert live["total_cost"] == "566.78" and live["closed"] is False
    assert [r["adjustment_for"] for r in rows(april, MARCH_APRIL)] == [None, None]

    # Re-closed, March is the recomputed figure, frozen, and nothing is left to adjust.
    assert close().startswith("closed 2026-03")
    (reclosed,) = rows(april, MARCH)
    assert reclosed == {**live, "closed": True}
    assert [r["adjustment_for"] for r in rows(april, MARCH_APRIL)] == [None, None]


def test_closed_figures_ignore_later_price_changes(
    worked_example: Any, fleet: Any, april: Any
) -> None:
    """Frozen money: a new tariff or cost profile after the close does not reprice March;
    the repricing is booked in the first open month, as a correction."""
    from billing.models import CostProfile
    from fleet.models import Site

    close()
    site = Site.objects.get(name="fra1")
    site.price_per_kwh = Decimal("0.50")
    site.save()  # marks every closed month stale (billing.signals)
    for profile in CostProfile.objects.all():
        profile.opex_per_hour = Decimal("1.00")
        profile.save()
    (march,) = rows(april, MARCH)
    assert march["total_cost"] == MARCH_TOTAL and march["closed"] is True
    # Every frozen day row is repriced: per day, the day at the new terms and the frozen day
    # at the old ones negated (rows are per terms), so two adjustment rows a day.
    from billing.models import ClosedSegment

    days = ClosedSegment.objects.filter(whole_month=False, adjusts__isnull=True).count()
    assert days == 30  # 2 to 31 March
    assert book() == f"booked {2 * days} adjustment rows (2026-03: {2 * days} rows)"
    (march,) = rows(april, MARCH)
    assert march["total_cost"] == MARCH_TOTAL and march["closed"] is True
    # A recomputation of March now prices it anew: the difference is booked in April like
    # late data. Energy 4.95 kWh × 1.5 × (0.50 − 0.20) = 2.2275; opex +0.90/h × 720 h = 648.
    _, _, adjustment = rows(april, MARCH_APRIL)
    assert adjustment["adjustment_for"] == "2026-03"
    assert (adjustment["fixed_cost"], adjustment["energy_cost"]) == ("648.00", "2.23")
    assert adjustment["total_cost"] == "650.23" and adjustment["capacity_hours"] == 0.0


def test_closing_twice_changes_nothing(worked_example: Any, april: Any) -> None:
    from billing.models import ClosedSegment, MonthClose

    close()
    segments = list(ClosedSegment.objects.values_list("pk", flat=True))
    assert close() == "2026-03 was already closed"
    assert list(ClosedSegment.objects.values_list("pk", flat=True)) == segments
    assert MonthClose.objects.get().segments_count == len(segments) > 0


@pytest.mark.parametrize(
    ("month", "message"),
    [
        ("2026-04", "month: 2026-04 has not ended in the report time zone (UTC)"),
        ("2026-13", "month: '2026-13' is not a month (YYYY-MM)"),
        ("March", "month: 'March' is not a month (YYYY-MM)"),
    ],
)
def test_close_refuses_an_incomplete_or_malformed_month(
    worked_example: Any, april: Any, month: str, message: str
) -> None:
    from billing.models import MonthClose

    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        close(month)
    assert not MonthClose.objects.exists()


def test_reopen_needs_a_reason_and_a_closed_month(worked_example: Any, april: Any) -> None:
    with pytest.raises(CommandError, match="never been closed"):
        call_command("reopen_month", "2026-03", "--reason", "x")
    close()
    with pytest.raises(CommandError, match="reason: a reopen needs a reason"):
        call_command("reopen_month", "2026-03", "--reason", "  ")


def test_focus_of_a_closed_month_and_its_correction(
    worked_example: Any, fleet: Any, april: Any
) -> None:
    """FOCUS: March's rows are the frozen ones; April's file carries the late energy as an
    Adjustment / Correction of 2 March, 0.48, and its sums still equal the costs API."""
    from tests.billing.test_focus import focus_spec_problems

    def focus(start: str, end: str) -> tuple[list[str], list[dict[str, str]]]:
        response = april.get(FOCUS, {"start": start, "end": end})
        assert response.status_code == 200
        reader = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
        return list(reader.fieldnames or []), list(reader)

    _, march_before = focus("2026-03-01", "2026-04-01")
    close()
    late_batch(fleet, worked_example)
    book()
    _, march_after = focus("2026-03-01", "2026-04-01")
    assert march_after == march_before
    header, april_rows = focus("2026-04-01", "2026-05-01")
    assert focus_spec_problems(header, april_rows, "1.2") == []
    (correction,) = [r for r in april_rows if r["ChargeCategory"] == "Adjustment"]
    assert correction["ChargeClass"] == "Correction"
    assert correction["BilledCost"] == correction["EffectiveCost"] == "0.4800000000"
    assert correction["ChargePeriodStart"] == "2026-03-02T00:00:00Z"
    assert correction["BillingPeriodStart"] == "2026-04-01T00:00:00Z"
    assert correction["PricingQuantity"] == correction["ConsumedQuantity"] == ""
    api = rows(april, {"start": "2026-04-01", "end": "2026-05-01", "group_by": "gpu"})
    total = sum(Decimal(r["BilledCost"]) for r in april_rows)
    assert str(money_round(total)) == str(
        sum(Decimal(r["total_cost"]) for r in api)
    )  # 5 days of April at 18.8271047228 (94.14) + 0.48


def test_day_rows_of_a_closed_month_carry_closed(worked_example: Any, april: Any) -> None:
    close()
    query = {"start": "2026-03-31", "end": "2026-04-02", "group_by": "fleet", "period": "day"}
    assert [(r["period_start"][:10], r["closed"]) for r in rows(april, query)] == [
        ("2026-03-31", True),
        ("2026-04-01", False),
    ]
    week = {"start": "2026-03-30", "end": "2026-04-06", "group_by": "fleet", "period": "week"}
    (straddling,) = rows(april, week)
    assert straddling["closed"] is False
    # The week's total is the closed days' frozen money plus April's live money: 30 and 31
    # March, then 1 April to now (5 April, 12:00): 156 hours at 0.78446269678….
    assert straddling["total_cost"] == str(
        money_round(Decimal(30000) / Decimal(43830) * 156 + Decimal("0.10") * 156)
    )


def test_admin_closes_a_month_and_refuses_an_incomplete_one(
    worked_example: Any, role_client: Any
) -> None:
    from billing.models import MonthClose

    with time_machine.travel(CLOSE_NOW, tick=False):
        admin = role_client("admin")
        refused = admin.post("/admin/billing/monthclose/add/", {"month": "2026-04-01"})
        assert refused.status_code == 200  # the form again, with the error
        assert "2026-04 has not ended in the report time zone" in refused.content.decode()
        assert not MonthClose.objects.exists()
        done = admin.post("/admin/billing/monthclose/add/", {"month": "2026-03-17"})
        assert done.status_code == 302
    record = MonthClose.objects.get()
    assert (record.month.isoformat(), record.closed, record.closed_by) == (
        "2026-03-01",
        True,
        "admin1",
    )
    assert record.segments_count > 0


def test_dashboard_marks_closed_months(worked_example: Any, april: Any) -> None:
    close()
    page = april.get("/chargeback/", {"from": "2026-03-01", "to": "2026-04-03"}).content.decode()
    assert 'id="closed-note"' in page and "2026-03 (frozen 2026-04-05 by alice)" in page
    april_only = april.get("/", {"from": "2026-04-01", "to": "2026-04-03"}).content.decode()
    assert 'id="closed-note"' not in april_only


def test_an_adjustment_is_frozen_with_the_month_that_carries_it(
    worked_example: Any, fleet: Any, role_client: Any
) -> None:
    """March closed, a late batch booked in April; April closed (carrying it); then a second
    late batch for March: April does not move, May carries only the second batch."""
    with time_machine.travel(CLOSE_NOW, tick=False):
        close("2026-03")
        late_batch(fleet, worked_example)  # +0.48 (module docstring)
    with time_machine.travel(at("2026-05-03T00"), tick=False):
        finance = role_client("finance")
        assert close("2026-04").startswith("closed 2026-04")
        april_query = {"start": "2026-04-01", "end": "2026-05-01", "group_by": "gpu"}
        april_before = rows(finance, april_query)
        assert [(r["adjustment_for"], r["total_cost"]) for r in april_before][1] == (
            "2026-03",
            "0.48",
        )
        # The second batch: 3 March 00:00-02:00 was offline; 2 hours at 500 W, idle: energy
        # 2 × 3,600 × 500 = 3,600,000 J = 1 kWh × 0.30 = 0.30.
        fleet.save(
            [
                fleet.usage(
                    worked_example,
                    at(f"2026-03-03T{h:02d}"),
                    samples=60,
                    observed_s=3600,
                    parked_s=3600,
                    energy_j=1_800_000,
                    idle_energy_j=1_800_000,
                    idle_s=3600,
                )
                for h in (0, 1)
            ]
        )
        assert book() == "booked 1 adjustment rows (2026-03: 1 rows)"  # in May
        assert rows(finance, april_query) == april_before
        # March cannot be reopened under a closed April (April carries its adjustment).
        with pytest.raises(CommandError, match="month: 2026-04 is closed after it"):
            call_command("reopen_month", "2026-03", "--reason", "x")
        may = rows(finance, {"start": "2026-05-01", "end": "2026-06-01", "group_by": "gpu"})
        (adjustment,) = [r for r in may if r["adjustment_for"] == "2026-03"]
        assert (adjustment["energy_cost"], adjustment["total_cost"]) == ("0.30", "0.30")
        assert adjustment["idle_cost"] == "0.30"  # idle energy; the fixed rate paid as before


def test_weekly_report_of_a_closed_week_does_not_move(
    worked_example: Any, fleet: Any, april: Any
) -> None:
    """The email's figures come from the close too: the week of 2 March reads the same
    before and after a late batch for that Monday, but for its break-even section, which
    reads the rollups directly and is not frozen (docs/finance.md)."""
    from billing.report import weekly_report_build, weekly_report_render

    def frozen_part() -> str:
        data = weekly_report_build(week_start=dt.date(2026, 3, 2), now=CLOSE_NOW)
        text = weekly_report_render(data, with_chart=False).text
        return text[: text.index("BREAK-EVEN")] + text[text.index("OFFLINE GPUS") :]

    close()
    before = frozen_part()
    # 2 March (24 h, 20.31) and 3-8 March offline (144 h): 168 h at 0.78446269678… plus
    # 1.485 of energy = 133.27.
    assert "- Total cost: 133.27 USD" in before
    late_batch(fleet, worked_example)
    assert frozen_part() == before
    call_command("reopen_month", "2026-03", "--reason", "check the email moves when open")
    assert "- Total cost: 133.75 USD" in frozen_part()  # + the late 0.48


def test_a_focus_1_0_file_with_corrections_passes_the_focus_validator(
    worked_example: Any, fleet: Any, april: Any, tmp_path: Any
) -> None:
    import json

    from tests.billing.test_focus import KNOWN_VALIDATOR_DEFECTS, focus_validator

    close()
    late_batch(fleet, worked_example)
    book()
    response = april.get(FOCUS, {"start": "2026-04-01", "end": "2026-04-05", "version": "1.0"})
    text = b"".join(response.streaming_content).decode()
    assert ",Adjustment,Correction," in text
    data, overrides = tmp_path / "focus.csv", tmp_path / "overrides.yaml"
    data.write_text(text)
    overrides.write_text(json.dumps({"overrides": list(KNOWN_VALIDATOR_DEFECTS)}))
    output = focus_validator(data, overrides)
    assert "Validation succeeded." in output, output[-4000:]
