"""How figures are shown to people, on the dashboard and in the weekly email alike.

Money is rounded half-up to cents only when shown (docs/metrics.md); the API gives exact strings
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


# The one rule for money on the dashboard's cards: whole units from 10,000 up, cents below
# (a price below one unit, such as per million tokens, keeps a tenth of a cent); the exact
# figure, to the cent, on hover (``money_exact``).
WHOLE_UNITS_FROM = Decimal(10_000)


def money_places(value: Decimal) -> int:
    if abs(value) >= WHOLE_UNITS_FROM:
        return 0
    if value and abs(value) < 1:
        return 3
    return 2


def money_shown(value: Decimal | None, currency: str = "") -> str:
    """``12,346 USD``, ``1,234.57 USD``, ``0.314 USD``: the card rule above."""
    if value is None:
        return MISSING
    return money(value, currency, money_places(value))


def money_exact(value: Decimal | None, currency: str = "") -> str:
    """The figure a card shows on hover: to the cent (to 1/10,000 below one unit)."""
    if value is None:
        return MISSING
    return money(value, currency, 4 if value and abs(value) < 1 else 2)


def pct(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{value * 100:.{digits}f} %"


def num(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{value:,.{digits}f}"


def count(n: int, noun: str, plural: str = "") -> str:
    """``1 GPU``, ``2 GPUs``, ``1,024 GPUs``: a whole number and its noun, plural unless
    one (``plural`` where adding an "s" is wrong)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
