"""What GPUs cost: cost profiles set per GPU, node, pool or site."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models


class CostProfile(models.Model):
    """How one scope (a GPU, node, pool or site) is paid for; the most specific scope wins.

    Owned: purchase price depreciated linearly over ``depreciation_years`` (× 8,766 h) plus
    opex per hour; after depreciation only opex. Rented: a rate per GPU-hour, energy included.
    """

    SCOPE_KINDS = [("gpu", "GPU"), ("node", "Node"), ("pool", "Pool"), ("site", "Site")]
    KINDS = [("owned", "Owned"), ("rented", "Rented")]

    scope_kind = models.CharField(max_length=8, choices=SCOPE_KINDS)
    scope_name = models.CharField(max_length=255, help_text="GPU UUID, hostname, pool or site")
    kind = models.CharField(max_length=8, choices=KINDS)
    purchase_price = models.DecimalField(
        max_digits=14, decimal_places=2, default=Decimal("0"), validators=[MinValueValidator(0)]
    )
    depreciation_years = models.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal("5"), validators=[MinValueValidator(0)]
    )
    opex_per_hour = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)]
    )
    rental_rate_per_hour = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)]
    )

    class Meta:
        ordering = ["scope_kind", "scope_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["scope_kind", "scope_name"], name="billing_profile_scope"
            )
        ]

    def __str__(self) -> str:
        return f"{self.scope_kind}:{self.scope_name} ({self.kind})"

    @property
    def scope(self) -> str:
        return f"{self.scope_kind}:{self.scope_name}"
