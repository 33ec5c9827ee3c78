"""Segments priced per price class (``billing.selectors.costs._accumulated``): the GPUs that
share kind, rate, profile presence, site terms and nominal power are summed first and priced
once. The figures must be the segment-by-segment ones to the cent, worked out here by hand."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from billing import cost_model as cm
from billing.selectors.costs import _accumulate, _accumulated
from billing.selectors.types import (
    _Acc,
    _Bucket,
    _GpuInfo,
    _NamesAndSiteTerms,
    _Segment,
    _SiteTerms,
)
from telemetry.models import USAGE_SUM_COLUMNS

START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
BUCKET = _Bucket(
    key=START.date(),
    start=START,
    end=START + dt.timedelta(days=30),
    local_start=START,
    local_end=START + dt.timedelta(days=30),
)
NORTH = _SiteTerms(
    name="north", pue=Decimal("1.2"), price_per_kwh=Decimal("0.10"), grid_g_per_kwh=Decimal(400)
)
SOUTH = _SiteTerms(
    name="south", pue=Decimal("1.5"), price_per_kwh=Decimal("0.30"), grid_g_per_kwh=Decimal(100)
)
NAMES = _NamesAndSiteTerms(nodes={}, pools={}, teams={}, sites={1: NORTH, 2: SOUTH})


def _gpu(gpu_id: int, *, kind: str | None, rate: str, max_w: float = 700.0) -> _GpuInfo:
    terms = cm.CostTerms(kind=kind) if kind else None
    return _GpuInfo(
        id=gpu_id,
        uuid=f"GPU-{gpu_id}",
        label=f"n#{gpu_id}",
        model_key="H100",
        model_name="H100",
        max_power_w=max_w,
        idle_power_w=70.0,
        node_id=None,
        pool_id=None,
        team_id=None,
        site_id=1,
        service_start=START,
        retired_at=None,
        last_seen_at=None,
        terms=terms,
        rates=(Decimal(rate), Decimal(rate), Decimal(rate)),
    )


def _segment(
    gpu: _GpuInfo,
    *,
    site_id: int,
    observed_h: float,
    air_h: float,
    energy_kwh: float,
    idle_kwh: float,
    offline_h: str = "0",
    adjusts: dt.date | None = None,
) -> _Segment:
    sums = dict.fromkeys(USAGE_SUM_COLUMNS, 0.0)
    sums.update(
        observed_s=observed_h * 3600,
        air_s=air_h * 3600,
        energy_j=energy_kwh * 3_600_000,
        idle_energy_j=idle_kwh * 3_600_000,
    )
    return _Segment(
        gpu=gpu,
        bucket=BUCKET,
        phase=0,
        node_id=None,
        pool_id=None,
        team_id=None,
        site_id=site_id,
        sums=sums,
        offline_h=Decimal(offline_h),
        adjusts=adjusts,
    )


def _one_by_one(segments: list[_Segment]) -> _Acc:
    acc = _Acc()
    for segment in segments:
        _accumulate(acc, segment, NAMES)
    return acc


def _cents(value: Decimal) -> Decimal:
    return cm.money_round(value)


def test_price_classes_give_the_segment_by_segment_figures() -> None:
    a = _gpu(1, kind=cm.OWNED, rate="2.00")
    b = _gpu(2, kind=cm.OWNED, rate="2.00")  # a's class at north; its own at south
    c = _gpu(3, kind=cm.RENTED, rate="3.10")  # another class: rented, energy not paid
    d = _gpu(4, kind=cm.OWNED, rate="2.00", max_w=1000.0)  # a's rate, other nominal power
    e = _gpu(5, kind=None, rate="0")  # no profile: not priced
    idle_gpu = _gpu(6, kind=cm.OWNED, rate="2.00")  # nothing observed, nothing offline
    segments = [
        _segment(a, site_id=1, observed_h=100, air_h=40, energy_kwh=50, idle_kwh=10),
        _segment(b, site_id=1, observed_h=80, air_h=20, energy_kwh=30, idle_kwh=12),
        _segment(b, site_id=2, observed_h=20, air_h=5, energy_kwh=8, idle_kwh=3, offline_h="4"),
        _segment(c, site_id=1, observed_h=60, air_h=60, energy_kwh=40, idle_kwh=0),
        _segment(d, site_id=1, observed_h=10, air_h=1, energy_kwh=5, idle_kwh=2),
        _segment(e, site_id=1, observed_h=0, air_h=0, energy_kwh=0, idle_kwh=0, offline_h="24"),
        _segment(idle_gpu, site_id=1, observed_h=0, air_h=0, energy_kwh=0, idle_kwh=0),
    ]
    acc = _accumulated(segments, NAMES)

    # By hand. Capacity: 100 + 80 + 24 + 60 + 10 + 24 = 298 h; GPU 6 has none.
    assert acc.capacity_h == Decimal(298)
    assert acc.gpu_ids == {1, 2, 3, 4, 5}
    # Fixed: 2.00 × (100 + 80 + 24 + 10) + 3.10 × 60 = 428 + 186 = 614.
    assert _cents(acc.fixed_cost) == Decimal("614.00")
    # Energy (owned and unprofiled only): north 1.2 × 0.10 × (50 + 30 + 5) = 10.20, south
    # 1.5 × 0.30 × 8 = 3.60; the rented GPU's 40 kWh are in its rate.
    assert _cents(acc.energy_cost) == Decimal("13.80")
    # Idle: 2.00 × ((100−40) + (80−20) + (24−5) + (10−1)) + 3.10 × 0 + the no-profile GPU's
    # 0 × 24, plus idle energy north 1.2 × 0.10 × (10 + 12 + 2) = 2.88, south 1.5 × 0.30 × 3
    # = 1.35: 296 + 4.23.
    assert _cents(acc.idle_cost) == Decimal("300.23")
    # CO2e of all energy, rented included: (50 + 30 + 40 + 5) × 1.2 × 400 g + 8 × 1.5 × 100 g.
    assert round(acc.co2e_kg, 9) == round((125 * 1.2 * 400 + 8 * 1.5 * 100) / 1000, 9)
    assert acc.priced is False  # GPU 5 has no profile
    # Nominal power × capacity hours: 700 W over 288 h, 1,000 W over 10 h.
    assert round(acc.nominal_max_w_h, 6) == 700 * 288 + 1000 * 10
    assert acc.offline_h == Decimal(28)
    assert acc.owned_capacity_h == Decimal(238)  # all but the rented GPU's 60 h

    # And the segment-by-segment accumulation gives the same figures to the cent.
    single = _one_by_one(segments)
    for name in ("fixed_cost", "energy_cost", "idle_cost", "profiled_cost"):
        assert _cents(getattr(acc, name)) == _cents(getattr(single, name)), name
    assert acc.gpu_ids == single.gpu_ids
    assert acc.priced == single.priced
    for name in USAGE_SUM_COLUMNS:
        assert abs(acc.sums[name] - single.sums[name]) <= 1e-9 * max(1.0, abs(single.sums[name]))


def test_an_adjustment_is_priced_segment_by_segment() -> None:
    """Late data for a closed month carries negated frozen figures: a GPU whose adjustment
    removes capacity is not a GPU of the row, even where another segment of its class adds
    some."""
    a = _gpu(1, kind=cm.OWNED, rate="2.00")
    b = _gpu(2, kind=cm.OWNED, rate="2.00")
    closed_day = dt.date(2026, 10, 3)
    segments = [
        _segment(
            a, site_id=1, observed_h=-5, air_h=-5, energy_kwh=-1, idle_kwh=0, adjusts=closed_day
        ),
        _segment(b, site_id=1, observed_h=7, air_h=2, energy_kwh=3, idle_kwh=1, adjusts=closed_day),
    ]
    acc = _accumulated(segments, NAMES)
    assert acc.gpu_ids == {2}
    assert acc.capacity_h == Decimal(2)
    # Fixed 2.00 × 2 h; idle 2.00 × ((−5 + 5) + (7 − 2)) + 1.2 × 0.10 × 1 kWh.
    assert _cents(acc.fixed_cost) == Decimal("4.00")
    assert _cents(acc.idle_cost) == Decimal("10.12")
