"""The pure parts of the Plan (DESIGN.md §9.3; issue 42): how a forecast is scored, when demand
runs out of capacity, and what consolidating two pools would overflow. No Django, no
database: lists of numbers in, numbers and dates out.

- **sMAPE** of a forecast against what happened: mean of 2·|F − A| / (|A| + |F|) over the
  points (a point where both are 0 counts 0), as a fraction 0–2.
- **Seasonal naive**: each forecast day is the same weekday of the last observed week; the
  baseline every other model is chosen against.
- **Rolling-origin backtest**: cut the history at several origins, forecast the next
  ``horizon`` days from what came before each, score each cut by sMAPE; the mean of the cuts.
- **Run-out date**: the first forecast day whose demand is above capacity × the target
  utilisation (None: not within the forecast).
- **Consolidation replay**: pools A and B as one with B's capacity, hour by hour over a
  window: the GPUs A and B used together beyond B's capacity overflow; their GPU hours, and
  the 95th percentile of the overflowing GPUs (over every hour of the window).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from telemetry.queue_figures import percentile

SEASON = 7  # days: demand follows the working week

Model = Callable[[Sequence[float], int], list[float]]


def smape(actual: Sequence[float], forecast: Sequence[float]) -> float:
    """Symmetric mean absolute percentage error, a fraction from 0 (exact) to 2."""
    if len(actual) != len(forecast) or not actual:
        raise ValueError("actual and forecast: the same number of points, at least one")
    total = 0.0
    for a, f in zip(actual, forecast, strict=True):
        scale = abs(a) + abs(f)
        total += 2 * abs(f - a) / scale if scale else 0.0
    return total / len(actual)


def seasonal_naive(history: Sequence[float], horizon: int, season: int = SEASON) -> list[float]:
    """The next ``horizon`` values: each the value one season before it (the last observed
    season repeated)."""
    if len(history) < season:
        raise ValueError(f"history: at least one season ({season} values)")
    last = list(history[-season:])
    return [last[i % season] for i in range(horizon)]


def backtest(
    history: Sequence[float], model: Model, *, horizon: int = 7, origins: int = 4
) -> float:
    """Mean sMAPE of ``model`` over ``origins`` rolling origins: the last ``origins`` ×
    ``horizon`` days cut into consecutive blocks of ``horizon``, each forecast from all the
    days before it."""
    if len(history) < (origins + 1) * horizon:
        raise ValueError(f"history: at least {(origins + 1) * horizon} values")
    scores = []
    for k in range(origins, 0, -1):
        cut = len(history) - k * horizon
        scores.append(smape(history[cut : cut + horizon], model(history[:cut], horizon)))
    return sum(scores) / len(scores)


def runout_date(
    first_day: dt.date, demand: Sequence[float], *, capacity: float, target: float
) -> dt.date | None:
    """The first day (``demand[0]`` is ``first_day``'s) whose demand exceeds ``capacity`` ×
    ``target``, in the forecast's units (GPU hours a day); None within the forecast."""
    limit = capacity * target
    for i, value in enumerate(demand):
        if value > limit:
            return first_day + dt.timedelta(days=i)
    return None


@dataclass(frozen=True)
class Replay:
    """Consolidating pool A into pool B over a window of hours."""

    overflow_gpu_hours: float  # Σ over the hours of max(0, A + B − B's capacity)
    overflow_p95_gpus: float  # the 95th percentile of that excess over every hour
    hours_over: int  # hours with any overflow


def consolidation_replay(
    used_a: Sequence[float], used_b: Sequence[float], *, capacity_b: float
) -> Replay:
    """``used_a`` and ``used_b``: the GPUs each pool had in use (air + held, the demand that
    needs a GPU) in each hour of the window, the same hours in both."""
    if len(used_a) != len(used_b):
        raise ValueError("used_a and used_b: one value per hour of the same window")
    excess = [max(0.0, a + b - capacity_b) for a, b in zip(used_a, used_b, strict=True)]
    return Replay(
        overflow_gpu_hours=sum(excess),
        overflow_p95_gpus=percentile(excess, 0.95) or 0.0,
        hours_over=sum(1 for e in excess if e > 0),
    )
