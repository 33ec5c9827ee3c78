"""Late data for a closed month, found only where something moved (issue 19).

A page that books a closed month's late data (docs/finance.md, "Late data") used to compute
the whole month again per GPU and net it against the frozen rows, to find that for almost
every GPU nothing came late. ``closing._unmoved_gpus`` now tells those GPUs from the rest in
one statement (the monthly rows against the month rows, per GPU and attribution), with the
offline hours and terms checked beside it, and only the others are computed.

The fleet is test_perf_paths.py's awkward one, March closed on 3 April. Of its six GPUs
three are in service all March with no depreciation ending in it ("steady", "mover",
"bare"; the day of overlapping samples made whole first): only those can be found unmoved.
Each case changes one thing after the close and names, worked out from what it touched, the
GPUs whose late data is then nil; the adjustments booked must be those of the exact path
(every GPU computed and netted), to the cent per group.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from billing import selectors
from billing.selectors import closing
from billing.selectors.loading import _load
from billing.selectors.types import Filters
from tests.billing.conftest import at
from tests.billing.test_perf_paths import (  # noqa: F401 (fixtures)
    _daily_state_present,
    awkward,
    needs_postgres,
)

MARCH_1 = dt.date(2026, 3, 1)
APRIL_1 = dt.date(2026, 4, 1)
NOW = at("2026-04-03T00")


def _late_rows(gpus: dict[str, Any]) -> None:
    """A late hour for "steady": more in the air and more energy on 5 March, 10:00."""
    from telemetry.models import HourlyUsage

    late = HourlyUsage.objects.filter(hour=at("2026-03-05T10"), gpu=gpus["steady"])
    assert late.update(energy_j=2_000_000.0, air_s=3600.0) == 1


def _iad_tariff(gpus: dict[str, Any]) -> None:
    """iad1's tariff raised: "mover" was in serve (iad1) until 5 March, 11:00, and
    "retired" in it all along (not in service all month: computed day by day anyway)."""
    from fleet.models import Site

    assert Site.objects.filter(name="iad1").update(price_per_kwh=Decimal("0.15")) == 1


def _train_rate(gpus: dict[str, Any]) -> None:
    """pool:train's purchase price raised: the rate of "steady" and "mover" (both in train
    now); "old" has a profile of its own, "bare" none."""
    from billing.models import CostProfile

    profile = CostProfile.objects.get(scope_kind="pool", scope_name="train")
    profile.purchase_price = Decimal("36000.00")
    profile.save()


def _mover_moved(gpus: dict[str, Any]) -> None:
    """ "mover" moved to a new node n4 of its pool (train): the same rate and terms, but its
    offline hours go to n4 now, not to n1 where the close put them."""
    from fleet.models import Node, Pool

    mover = gpus["mover"]
    mover.node = Node.objects.create(hostname="n4", pool=Pool.objects.get(name="train"))
    mover.save()


def _nothing(gpus: dict[str, Any]) -> None:
    """Nothing after the close."""


CASES: list[tuple[Callable[[dict[str, Any]], None], set[str]]] = [
    (_nothing, {"steady", "mover", "bare"}),
    (_late_rows, {"mover", "bare"}),
    (_iad_tariff, {"steady", "bare"}),
    (_train_rate, {"bare"}),
    (_mover_moved, {"steady", "bare"}),
]


@needs_postgres
@pytest.mark.parametrize(("change", "unmoved"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_only_the_gpus_that_moved_are_computed_and_their_late_data_is_exact(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    change: Callable[[dict[str, Any]], None],
    unmoved: set[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from billing.month_close import month_close
    from telemetry.models import HourlyUsage

    overlap = HourlyUsage.objects.filter(gpu=awkward["steady"], observed_s__gt=3600)
    assert overlap.update(observed_s=3600.0) > 0
    names = {gpu.pk: name for name, gpu in awkward.items()}
    found: list[set[str]] = []
    checked = closing._unmoved_gpus

    def recorded(month: dt.date, loaded: Any, whole_gpus: set[int]) -> set[int]:
        result = checked(month, loaded, whole_gpus)
        found.append({names[i] for i in result})
        return result

    query: dict[str, Any] = {"start": MARCH_1, "end": dt.date(2026, 5, 1), "now": NOW}
    with time_machine.travel(NOW, tick=False):
        month_close(month=MARCH_1, by="test")
        change(awkward)
        monkeypatch.setattr(closing, "_unmoved_gpus", recorded)
        booked = {
            group_by: selectors.cost_rows(**query, group_by=group_by, period="month")
            for group_by in ("gpu", "fleet", "pool")
        }
        monkeypatch.setattr(closing, "_unmoved_gpus", lambda *args: set())
        exact = {
            group_by: selectors.cost_rows(**query, group_by=group_by, period="month")
            for group_by in booked
        }
    assert found and all(f == unmoved for f in found), found
    for group_by, rows in booked.items():
        got = {r.key: r for r in rows if r.adjustment_for}
        want = {r.key: r for r in exact[group_by] if r.adjustment_for}
        assert set(got) == set(want), group_by
        if change is _nothing:
            assert not want
        for key, row in want.items():
            for name in ("fixed_cost", "energy_cost", "idle_cost", "total_cost"):
                assert abs(getattr(got[key], name) - getattr(row, name)) <= Decimal("0.01")
            assert got[key].offline_hours == pytest.approx(row.offline_hours, abs=1e-9)
            assert got[key].air_hours == pytest.approx(row.air_hours, abs=1e-9)
    if change is _late_rows:  # the late hour itself: 1 h more in the air on "steady"
        (steady,) = [r for r in booked["gpu"] if r.adjustment_for and r.key == "GPU-steady"]
        assert steady.air_hours == pytest.approx(3600.0 / 3600 - _air_before(awkward), abs=1e-9)


def _air_before(gpus: dict[str, Any]) -> float:
    """The air hours of "steady"'s late hour as the fixture wrote it: GPU 0 (its first),
    hour 4 × 24 + 10 = 106 of the window, observed whole (106 is not a multiple of 5),
    in the air ``_wave(0, 106)`` of it."""
    from tests.billing.test_perf_paths import _wave

    hour = (at("2026-03-05T10") - at("2026-03-01T00")) // dt.timedelta(hours=1)
    observed = 3600.0 if hour % 5 else 1800.0
    return observed * _wave(0, hour) / 3600


@needs_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("few", [True, False], ids=["their-rows", "every-row"])
@pytest.mark.parametrize(("change", "unmoved"), CASES, ids=[c.__name__ for c, _ in CASES])
@pytest.mark.parametrize("kept", ["state", "snapshot"])
def test_a_close_s_snapshot_spares_comparing_what_nothing_wrote_since(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    change: Callable[[dict[str, Any]], None],
    unmoved: set[str],
    few: bool,
    kept: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same cases, each step committed (as a close, a rollup and a page are in
    production). The close keeps its snapshot and the fleet's state (``kept="state"``):
    the late-data check spares every GPU whose monthly rows nothing wrote since, whose own
    state (attribution, service dates, rates) is the close's and whose sites' terms are
    too, without comparing anything; those are exactly the unmoved GPUs of each case (a
    late hour touches "steady"; iad1's tariff "mover", whose month rows lie partly there;
    pool:train's rate "steady" and "mover"; the move "mover"), and only the others are
    compared. A close that kept its snapshot alone (made before closes kept the state,
    ``kept="snapshot"``) compares the sums of the GPUs whose monthly rows were written
    since, only those of "steady" after its late hour, and the others' offline hours and
    terms alone. The GPUs found unmoved and the adjustments are those of the test above:
    the exact path's. The statements read the rows of the GPUs checked (a few), or every
    GPU's (as beyond ``_FEW_MOVED``)."""
    from billing import month_close

    if not few:
        monkeypatch.setattr(closing, "_FEW_MOVED", 0)
    if kept == "snapshot":
        monkeypatch.setattr(month_close, "close_state", lambda loaded: (b"", {}))
    touched: list[set[str]] = []
    spared: list[set[str] | None] = []
    names = {gpu.pk: name for name, gpu in awkward.items()}
    untouched, spare = closing._untouched, closing._spared

    def recorded(month: dt.date, *args: Any) -> Any:
        found = untouched(month, *args)
        assert found is not None  # the close's snapshot is this cluster's
        touched.append({names[i] for i in found[1]})
        return found

    def recorded_spared(month: dt.date, *args: Any) -> Any:
        found = spare(month, *args)
        spared.append(None if found is None else {names[i] for i in found})
        return found

    monkeypatch.setattr(closing, "_untouched", recorded)
    monkeypatch.setattr(closing, "_spared", recorded_spared)
    test_only_the_gpus_that_moved_are_computed_and_their_late_data_is_exact(
        awkward, change, unmoved, monkeypatch
    )
    from billing.models import MonthClose

    close = MonthClose.objects.get(month=MARCH_1)
    assert close.snapshot_xmin and close.snapshot_system
    assert spared
    if kept == "state":
        assert bytes(close.gpu_states) and close.site_terms
        assert all(s == unmoved for s in spared), spared
        assert not touched  # the statement of closes without a state never ran
    else:
        assert all(s is None for s in spared)
        assert touched and all(
            t == ({"steady"} if change is _late_rows else set()) for t in touched
        )


@needs_postgres
def test_a_close_without_a_snapshot_of_this_cluster_compares_every_gpu(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
) -> None:
    """A close kept on another cluster (a restored dump: its transaction ids are not this
    one's), or made before closes kept a snapshot: no GPU is spared the comparison."""
    from billing.models import MonthClose
    from billing.month_close import month_close

    with time_machine.travel(NOW, tick=False):
        month_close(month=MARCH_1, by="test")
        loaded = _load(start=MARCH_1, end=APRIL_1, filters=Filters(), now=NOW)
    gpus = {awkward[name].pk for name in ("steady", "mover", "bare")}
    assert closing._untouched(MARCH_1, loaded, gpus, 31 * 24.0) is not None
    MonthClose.objects.filter(month=MARCH_1).update(snapshot_system=1)
    assert closing._untouched(MARCH_1, loaded, gpus, 31 * 24.0) is None
    MonthClose.objects.filter(month=MARCH_1).update(snapshot_xmin=None, snapshot_system=None)
    assert closing._untouched(MARCH_1, loaded, gpus, 31 * 24.0) is None


@needs_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kept", ["state", "snapshot"])
def test_adjustments_a_later_close_carried_are_compared(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    kept: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """iad1's tariff raised after March closed, April closed (carrying March's adjustment
    for "mover", in iad1 until 5 March), then the tariff put back: nothing wrote a monthly
    row since March closed, and iad1's terms are those March's close kept, yet March is due
    the carried adjustment's reverse. "mover" is touched (a carried adjustment), so it is
    not spared and its sums are compared, whether the closes kept the fleet's state or
    their snapshot alone; the adjustments booked in May are the exact path's."""
    from billing import month_close as closes
    from billing.month_close import month_close
    from fleet.models import Site

    if kept == "snapshot":
        monkeypatch.setattr(closes, "close_state", lambda loaded: (b"", {}))
    iad = Site.objects.filter(name="iad1")
    with time_machine.travel(NOW, tick=False):
        month_close(month=MARCH_1, by="test")
    iad.update(price_per_kwh=Decimal("0.15"))
    may_2 = at("2026-05-02T00")
    with time_machine.travel(may_2, tick=False):
        month_close(month=dt.date(2026, 4, 1), by="test")
    iad.update(price_per_kwh=Decimal("0.09"))
    touched: list[set[int]] = []
    untouched, spare = closing._untouched, closing._spared

    def recorded(month: dt.date, *args: Any) -> Any:
        found = untouched(month, *args)
        assert found is not None
        if month == MARCH_1:  # (April's is checked too: nothing carried for it)
            touched.append(found[1])
        return found

    def recorded_spared(month: dt.date, loaded: Any, whole_gpus: set[int]) -> Any:
        found = spare(month, loaded, whole_gpus)
        assert (found is None) == (kept == "snapshot")
        if found is not None and month == MARCH_1:
            touched.append(whole_gpus - found)
        return found

    query: dict[str, Any] = {"start": MARCH_1, "end": dt.date(2026, 6, 1), "now": may_2}
    with time_machine.travel(may_2, tick=False):
        monkeypatch.setattr(closing, "_untouched", recorded)
        monkeypatch.setattr(closing, "_spared", recorded_spared)
        booked = selectors.cost_rows(**query, group_by="gpu", period="month")
        monkeypatch.setattr(closing, "_unmoved_gpus", lambda *args: set())
        exact = selectors.cost_rows(**query, group_by="gpu", period="month")
    assert touched and all(awkward["mover"].pk in t for t in touched)
    got = {(r.key, r.adjustment_for): r for r in booked if r.adjustment_for}
    want = {(r.key, r.adjustment_for): r for r in exact if r.adjustment_for}
    assert ("GPU-mover", "2026-03") in want
    assert set(got) == set(want)
    for key, row in want.items():
        assert abs(got[key].energy_cost - row.energy_cost) <= Decimal("0.01")
        assert abs(got[key].total_cost - row.total_cost) <= Decimal("0.01")
