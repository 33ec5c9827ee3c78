"""A close's days stored by price class (``ClosedClassDay``; issue 19, docs/finance.md).

A page that reads closed days by price class (the overview's trend, a team's or a pool's
days) summed the close's row per GPU and day in SQL on every read: 610,000 rows for two
closed months of 10,000 GPUs. A close now also stores its day rows summed per day, class
(the GPUs' model and nominal power), attribution and terms, and such a page reads those few
rows, where they stand for what it would sum: every GPU of a row in its computation, of the
same class now.

The fleet is test_perf_paths.py's awkward one (two models: four H100s, two A100s; three
pools, two sites, a rented pool, a GPU without a profile, one whose depreciation ends in
March, one that moves pool), March closed on 3 April.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from billing import selectors
from billing.selectors import closing
from telemetry.models import USAGE_SUM_COLUMNS
from tests.billing.conftest import at, migrated_back
from tests.billing.test_perf_paths import (  # noqa: F401 (fixtures)
    _daily_state_present,
    awkward,
    needs_postgres,
)

MARCH_1 = dt.date(2026, 3, 1)
NOW = at("2026-04-03T00")
KEYS = (
    "day",
    "adjusts",
    "pool_id_at",
    "team_id_at",
    "site_id_at",
    "rate",
    "kind",
    "site_name",
    "pue",
    "price_per_kwh",
    "grid_g_per_kwh",
)


def _close_march() -> Any:
    from billing.month_close import month_close

    with time_machine.travel(NOW, tick=False):
        return month_close(month=MARCH_1, by="test").close


@needs_postgres
def test_a_close_stores_its_days_summed_per_class(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    fleet: Any,
) -> None:
    """Every class row is the close's day rows of its day, attribution, terms and model
    summed (added up here, in Python, from the rows per GPU); no row more or less. On 4
    March "steady" and "late" (H100s of pool train, at train's rate) share one. An hourly
    row of "retired" on 8 March, after it left service, observed nothing: it is in its
    class row's GPUs, not among those with capacity."""
    from billing.models import ClosedClassDay, ClosedSegment

    fleet.save([fleet.usage(awkward["retired"], at("2026-03-08T10"), samples=1)])
    close = _close_march()
    assert close.by_class
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in ClosedSegment.objects.filter(close=close, whole_month=False).select_related(
        "gpu__model"
    ):
        key = tuple(getattr(row, k) for k in KEYS) + (row.gpu.model.key,)
        group = groups.setdefault(
            key, defaultdict(float, ids=set(), counted=set(), offline_h=Decimal(0))
        )
        for name in USAGE_SUM_COLUMNS:
            group[name] += getattr(row, name)
        group["offline_h"] += row.offline_h
        group["ids"].add(row.gpu_id)
        if row.observed_s > 0 or row.offline_h > 0:
            group["counted"].add(row.gpu_id)
    stored = {
        tuple(getattr(r, k) for k in KEYS) + (r.model_key,): r
        for r in ClosedClassDay.objects.filter(close=close)
    }
    assert len(stored) == ClosedClassDay.objects.filter(close=close).count()
    assert set(stored) == set(groups)
    for key, group in groups.items():
        row = stored[key]
        assert set(row.gpu_ids) == group["ids"]
        # Kept only where some GPU of it has no capacity in it: else None, all of them.
        if group["counted"] == group["ids"]:
            assert row.counted_ids is None
        else:
            assert set(row.counted_ids) == group["counted"]
        assert row.offline_h == group["offline_h"]
        for name in USAGE_SUM_COLUMNS:
            assert getattr(row, name) == pytest.approx(group[name], rel=1e-12, abs=1e-9), name
        model = awkward["steady" if row.model_key == "H100-SXM" else "old"].model
        assert (row.max_power_w, row.idle_power_w) == (model.max_power_w, model.idle_power_w)
    train = awkward["steady"].node.pool
    shared = [
        r
        for r in stored.values()
        if r.day == dt.date(2026, 3, 4) and r.pool_id_at == train.pk and r.model_key == "H100-SXM"
    ]
    assert any({awkward["steady"].pk, awkward["late"].pk} <= set(r.gpu_ids) for r in shared)
    (after,) = [r for r in stored.values() if r.counted_ids is not None]
    assert after.day == dt.date(2026, 3, 8) and awkward["retired"].pk in after.gpu_ids
    assert awkward["retired"].pk not in after.counted_ids


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each read of closed days by class found stored rows to stand for it."""
    used: list[bool] = []
    read = closing._class_day_rows

    def spy(*args: Any) -> Any:
        found = read(*args)
        used.append(found is not None)
        return found

    monkeypatch.setattr(closing, "_class_day_rows", spy)
    return used


def _by_class_rows() -> dict[tuple[str, str], list[Any]]:
    query: dict[str, Any] = {"start": MARCH_1, "end": dt.date(2026, 5, 1), "now": NOW}
    out = {
        (group_by, period): selectors.cost_rows(**query, group_by=group_by, period=period)
        for group_by in ("fleet", "team", "pool", "site", "model")
        for period in ("day", "week")
    }
    out[("trend", "day")] = selectors.fleet_trend(**query)
    out[("overview", "day")] = selectors.fleet_overview(**query)[1]
    return out


def _assert_to_the_cent(got: list[Any], want: list[Any]) -> None:
    assert [(r.period_start, r.key, r.adjustment_for) for r in got] == [
        (r.period_start, r.key, r.adjustment_for) for r in want
    ]
    for g, w in zip(got, want, strict=True):
        for name, value in dataclasses.asdict(w).items():
            found = getattr(g, name)
            if isinstance(value, Decimal):
                assert abs(found - value) <= Decimal("0.01"), (w.key, w.period_start, name)
            elif isinstance(value, float):
                assert found == pytest.approx(value, rel=1e-9, abs=1e-9), (w.key, name)
            else:
                assert found == value, (w.key, w.period_start, name)


@needs_postgres
def test_closed_days_read_by_class_from_the_stored_rows_give_the_summed_figures(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every grouping by class, by day and by week (a week across the close), the fleet
    trend and the overview's: from the stored rows, the figures of the day rows summed at
    the read (the stored rows forced away), to the cent, GPU counts exact."""
    _close_march()
    used = _spied(monkeypatch)
    with time_machine.travel(NOW, tick=False):
        stored = _by_class_rows()
        assert used and all(used)
        monkeypatch.setattr(closing, "_class_day_rows", lambda *args: None)
        summed = _by_class_rows()
    for key, rows in summed.items():
        assert rows, key
        _assert_to_the_cent(stored[key], rows)


@needs_postgres
@pytest.mark.parametrize("change", ["power", "model"])
def test_a_class_changed_after_the_close_reads_the_day_rows(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    """After the close the A100's nominal power changed ("power": no GPU is of the class
    its rows were stored in any more), or "bare" became an H100 ("model": a row of the
    A100 class holds a GPU of another class now). The page sums the day rows again, as it
    did before there were class rows, and its figures are theirs. Before the change a
    window from 8 March, which does not load "retired" (out of service on 6 March, so in
    no row of those days), reads the stored rows."""
    from fleet.models import Gpu, GpuModel

    _close_march()
    used = _spied(monkeypatch)
    query: dict[str, Any] = {"end": dt.date(2026, 4, 1), "period": "day", "now": NOW}
    with time_machine.travel(NOW, tick=False):
        selectors.cost_rows(**query, start=dt.date(2026, 3, 8), group_by="fleet")
        assert used == [True]
        if change == "power":
            GpuModel.objects.filter(key="A100").update(max_power_w=450)
        else:
            h100 = GpuModel.objects.get(key="H100-SXM")
            assert Gpu.objects.filter(pk=awkward["bare"].pk).update(model=h100) == 1
        rows = selectors.cost_rows(**query, start=MARCH_1, group_by="model")
        assert used == [True, False]
        monkeypatch.setattr(closing, "_class_day_rows", lambda *args: None)
        summed = selectors.cost_rows(**query, start=MARCH_1, group_by="model")
    _assert_to_the_cent(rows, summed)
    assert {r.key for r in rows} == {"A100", "H100-SXM"}


@needs_postgres
def test_reopen_drops_the_class_rows_and_a_new_close_stores_them_again(
    awkward: dict[str, Any],  # noqa: F811 (the fixture)
) -> None:
    from billing.models import ClosedClassDay
    from billing.month_close import month_reopen

    close = _close_march()
    count = ClosedClassDay.objects.filter(close=close).count()
    assert count > 0
    with time_machine.travel(NOW, tick=False):
        reopened = month_reopen(month=MARCH_1, by="test", reason="late rows").close
    assert not reopened.by_class and not ClosedClassDay.objects.exists()
    again = _close_march()
    assert again.by_class and ClosedClassDay.objects.filter(close=again).count() == count


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_the_migration_stores_the_class_rows_of_closes_made_before_them(fleet: Any) -> None:
    """A close stored before ``ClosedClassDay`` (billing 0005) gets its class rows from
    ``migrate``, the rows its close would have stored (``class_days_store`` run again gives
    the same), and is read by class from then on."""
    from billing.models import ClosedClassDay, MonthClose

    site = fleet.site("fra1")
    pool = fleet.pool("inference", site=site)
    node = fleet.node("gpu-07", pool=pool)
    h100 = fleet.model("H100-SXM")
    gpus = [
        fleet.gpu(f"GPU-{i}", node=node, index=i, in_service_at=at("2026-03-01T00"), model=h100)
        for i in range(3)
    ]
    with migrated_back("billing", "0005_closed_segment_columns") as old:
        close = old.get_model("billing", "MonthClose").objects.create(
            month=MARCH_1, closed_at=at("2026-04-02T00"), closed_by="alice", zone="UTC"
        )
        segment = old.get_model("billing", "ClosedSegment").objects
        for i, gpu in enumerate(gpus):
            for day, observed in ((1, 86_400.0), (2, 72_000.0 - i * 3600)):
                segment.create(
                    close=close,
                    day=dt.date(2026, 3, day),
                    gpu_id=gpu.pk,
                    node_id_at=node.pk,
                    pool_id_at=pool.pk,
                    site_id_at=site.pk,
                    observed_s=observed,
                    energy_j=observed * 100,
                    offline_h=Decimal(24) - Decimal(observed) / 3600,
                    rate="0.78",
                    kind="owned",
                    site_name="fra1",
                )
    stored = MonthClose.objects.get(month=MARCH_1)
    assert stored.by_class

    def rows() -> list[tuple[Any, ...]]:
        found = ClosedClassDay.objects.filter(close=stored).order_by("day")
        return [
            (r.day, r.observed_s, r.energy_j, r.offline_h, sorted(r.gpu_ids), r.model_key)
            for r in found
        ]

    migrated = rows()
    ids = sorted(g.pk for g in gpus)
    assert migrated == [
        (dt.date(2026, 3, 1), 3 * 86_400.0, 3 * 8_640_000.0, Decimal(0), ids, "H100-SXM"),
        # 72,000 + 68,400 + 64,800 s observed; 4 + 5 + 6 offline hours.
        (dt.date(2026, 3, 2), 205_200.0, 20_520_000.0, Decimal(15), ids, "H100-SXM"),
    ]
    assert closing.class_days_store(stored)
    assert rows() == migrated
