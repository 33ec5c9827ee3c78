"""How figures are shown to people, on the dashboard and in the weekly email alike.

Money is rounded half-up to cents only when shown (DESIGN.md §3); the API gives exact strings
instead (``billing.api.serializers.money_str``).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

MISSING = "–"  # a figure that does not exist (no capacity, no previous week)


def money(value: Decimal | None, currency: str = "", places: int = 2) -> str:
    if value is None:
        return MISSING
    quant = Decimal(1).scaleb(-places)
    text = f"{value.quantize(quant, rounding=ROUND_HALF_UP):,}"
    return f"{text} {currency}".strip()


def money_short(value: Decimal | None, currency: str = "") -> str:
    """Big figures for cards: 12.3k, 1.25M (cents where the figure is small)."""
    if value is None:
        return MISSING
    number = float(value)
    for bound, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(number) >= bound * 10:
            return f"{number / bound:,.1f}{suffix} {currency}".strip()
    return money(value, currency, 0 if abs(number) >= 1000 else 2)


def pct(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{value * 100:.{digits}f} %"


def num(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{value:,.{digits}f}"
