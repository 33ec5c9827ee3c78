"""Fleet inventory: where GPUs are, who owns their time, and the tokens that speak for them.

Fleet knows neither samples nor money beyond a site's tariff (docs/deploy.md).
"""

from __future__ import annotations

from decimal import Decimal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from fleet.identifiers import IdentifierValidator


def zone_or_utc(name: str) -> ZoneInfo:
    """The time zone of that name; UTC where this machine's tz database does not know it
    (a fleet file checks names when applied, so this only guards a stale setting)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


class FleetSettings(models.Model):
    """The one row of fleet-wide settings that a fleet file sets (pk is always 1)."""

    currency = models.CharField(max_length=3, default="USD")
    report_time_zone = models.CharField(max_length=64, default="UTC")
    active_util_pct = models.FloatField(
        default=5.0, validators=[MinValueValidator(0), MaxValueValidator(100)]
    )
    target_utilization = models.FloatField(
        default=0.6, validators=[MinValueValidator(0.01), MaxValueValidator(1)]
    )
    # The break-even workload of pools without their own (fleet file `[breakeven]`; keys in
    # billing.forms.BREAKEVEN_KEYS): the break-even page's defaults and the weekly email's.
    breakeven = models.JSONField(default=dict, blank=True)
    # Dense bf16 peaks in TFLOP/s that override telemetry.efficiency's table (fleet file
    # `[[peaks]]`): by catalogue key ("H100-SXM") or, for a model the catalogue does not know,
    # by the NVML device name as the GPUs report it. What MFU divides by (DESIGN.md §9.4).
    peaks = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name_plural = "fleet settings"
        permissions = [
            ("view_dashboard", "Can view the dashboard (utilisation, inventory)"),
            ("view_costs", "Can view money: costs, break-even, finance API"),
            ("manage_fleet", "Can change the fleet and preview reports"),
        ]

    def __str__(self) -> str:
        return f"Fleet settings ({self.currency}, {self.report_time_zone})"

    @property
    def report_zone(self) -> ZoneInfo:
        """The report time zone: days, weeks and months of the API, dashboard and email."""
        return zone_or_utc(self.report_time_zone)

    @classmethod
    def load(cls) -> FleetSettings:
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj


class Site(models.Model):
    """A data centre or cloud region: its power overhead, tariff and grid carbon intensity."""

    name = models.CharField(max_length=100, unique=True, validators=[IdentifierValidator(100)])
    pue = models.DecimalField(
        max_digits=5, decimal_places=3, default=Decimal("1.0"), validators=[MinValueValidator(1)]
    )
    price_per_kwh = models.DecimalField(
        max_digits=10, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)]
    )
    grid_g_per_kwh = models.FloatField(default=0.0, validators=[MinValueValidator(0)])
    time_zone = models.CharField(max_length=64, default="UTC")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(models.Model):
    """A team that GPU time is charged back to."""

    name = models.CharField(max_length=100, unique=True, validators=[IdentifierValidator(100)])
    cost_center = models.CharField(
        max_length=100, blank=True, validators=[IdentifierValidator(100, text=True)]
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Pool(models.Model):
    """A group of nodes used for one purpose (training, inference…), at one site, for a team."""

    name = models.CharField(max_length=100, unique=True, validators=[IdentifierValidator(100)])
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.PROTECT)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL)
    # This pool's break-even workload (fleet file `pools[].breakeven`), over the fleet's.
    breakeven = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class GpuModel(models.Model):
    """A GPU product (H100 SXM, L40S…) with its nominal idle and maximum power."""

    key = models.CharField(max_length=40, unique=True)
    name = models.CharField(max_length=100)
    max_power_w = models.FloatField()
    idle_power_w = models.FloatField()
    memory_gib = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    """A GPU server running one agent; its token decides who it is."""

    hostname = models.CharField(max_length=255, unique=True, validators=[IdentifierValidator(255)])
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.SET_NULL)
    site = models.ForeignKey(
        Site, null=True, blank=True, on_delete=models.PROTECT, help_text="Overrides the pool's"
    )
    reported_hostname = models.CharField(max_length=255, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    driver_version = models.CharField(max_length=50, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    spool_dropped_total = models.BigIntegerField(
        default=0, help_text="Samples the agent's full spool dropped, as it reported them"
    )
    alloc_problem = models.CharField(
        max_length=300,
        blank=True,
        default="",
        db_default="",
        help_text="What hides the scheduler's allocations from the agent, as it last said "
        "(empty: nothing)",
    )
    alloc_skipped_files = models.IntegerField(
        default=0,
        db_default=0,
        help_text="Allocation files the agent skipped at its last look, as it last said",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    @property
    def effective_site(self) -> Site | None:
        if self.site_id:
            return self.site
        return self.pool.site if self.pool_id and self.pool else None


class Gpu(models.Model):
    """One physical GPU (or MIG-less device), identified by its NVML UUID."""

    uuid = models.CharField(max_length=100, unique=True, validators=[IdentifierValidator(100)])
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    index = models.PositiveSmallIntegerField(null=True, blank=True)
    name = models.CharField(max_length=100, blank=True)
    serial = models.CharField(max_length=100, blank=True)
    model = models.ForeignKey(GpuModel, null=True, blank=True, on_delete=models.SET_NULL)
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)
    power_limit_w = models.FloatField(null=True, blank=True)
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.SET_NULL, help_text="Overrides the pool's"
    )
    in_service_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    first_seen_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    lost_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "When the agent first reported it lost (off the bus); cleared when listed present again"
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node__hostname", "index", "uuid"]

    def __str__(self) -> str:
        return f"{self.node.hostname}#{self.index} {self.uuid}"

    @property
    def service_start(self):  # type: ignore[no-untyped-def]
        """Start of capacity and depreciation: in-service date, else the first sample."""
        return self.in_service_at or self.first_seen_at


class _Token(models.Model):
    """A bearer token: only a prefix (to find it) and a hash (to check it) are stored."""

    prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class NodeToken(_Token):
    """A token an agent uses to push samples for one node."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="tokens")

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.node.hostname})"


class ApiToken(_Token):
    """A person's token for the finance API; its rights are the user's role."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class SsoIdentity(models.Model):
    """Which person at the identity provider one user is: the provider's issuer and its
    ``sub`` claim, which never changes and is never reused (OpenID Connect Core §2). Single
    sign-on finds a returning person by it, never by a name the provider lets people change,
    so renaming oneself at the provider cannot reach another person's account here
    (config/oidc.py)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255, help_text="The provider's sub claim")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="fleet_sso_identity")
        ]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.subject} at {self.issuer}"
