"""What GPUs cost: cost profiles set per GPU, node, pool or site."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from billing import cost_model as cm
from telemetry.models import UsageSums


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

    def cost_terms(self) -> cm.CostTerms:
        """The profile as the cost model's plain data."""
        return cm.CostTerms(
            kind=self.kind,
            purchase_price=self.purchase_price,
            depreciation_years=self.depreciation_years,
            opex_per_hour=self.opex_per_hour,
            rental_rate_per_hour=self.rental_rate_per_hour,
        )


class WeeklyReport(models.Model):
    """One delivery of the weekly report: one ISO week to one audience.

    ``audience`` is ``""`` for the regular list (opted-in users plus
    ``WEEKLY_REPORT_RECIPIENTS``) or the one address given to ``send_weekly_report --to``.
    The row is claimed with a compare-and-swap on ``claimed_at``/``sent_at`` (healthchecks'
    pattern), so two beat processes, a retried task and a second command send it once.
    """

    week = models.CharField(max_length=8, help_text="ISO week, e.g. 2026-W48")
    audience = models.CharField(max_length=254, blank=True, default="")
    week_start = models.DateField(help_text="Monday of the week, in the report time zone")
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    recipients_count = models.PositiveIntegerField(default=0)
    subject = models.CharField(max_length=255, blank=True)
    with_chart = models.BooleanField(default=False)

    class Meta:
        ordering = ["-week_start", "audience"]
        constraints = [
            models.UniqueConstraint(
                fields=["week", "audience"], name="billing_report_week_audience"
            )
        ]

    def __str__(self) -> str:
        return f"{self.week} → {self.audience or 'list'}"


class ReportSubscription(models.Model):
    """A person's choice to receive the weekly report (by email, at their account address)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="report_subscription"
    )
    opted_in = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user} ({'in' if self.opted_in else 'out'})"


class WorkloadTeamRule(models.Model):
    """One ``[[workload_teams]]`` rule of the fleet file: workloads that ``match`` belong to
    ``team`` (docs/metrics.md, "Workloads"). ``position`` is the rule's place in the file: the
    first rule that matches wins; a workload no rule matches stays with its pool's team."""

    MATCH_FIELDS = ("account", "user", "kind", "id")

    position = models.PositiveIntegerField(unique=True)
    match_field = models.CharField(max_length=8, choices=[(f, f) for f in MATCH_FIELDS])
    pattern = models.CharField(
        max_length=200, help_text="The value to match; a trailing * matches any ending"
    )
    team = models.ForeignKey("fleet.Team", on_delete=models.PROTECT, related_name="+")

    class Meta:
        ordering = ["position"]

    def __str__(self) -> str:
        return f"{self.match_field}:{self.pattern} → team {self.team_id}"

    @property
    def match(self) -> str:
        return f"{self.match_field}:{self.pattern}"


class MonthClose(models.Model):
    """One month's close (docs/finance.md): while ``closed``, every figure of the month comes
    from its ``ClosedSegment`` rows, whatever data arrives late; the difference late data
    makes is booked when it is written (``billing.adjustments``) as adjustment rows of this
    close in the first open month after it.

    ``month`` is the first day of the month in the report time zone. Who closed it last and
    when is kept here; every close and reopen (admins, with a reason) is recorded as a
    ``MonthCloseEvent``. A close is never deleted (its events protect it), only reopened.
    """

    month = models.DateField(unique=True)
    closed = models.BooleanField(default=True)
    closed_at = models.DateTimeField()
    closed_by = models.CharField(max_length=150)
    zone = models.CharField(max_length=64, help_text="The report time zone at the close")
    segments_count = models.PositiveIntegerField(default=0)
    # Whether the close stored its day rows by price class too (``ClosedClassDay``; on
    # PostgreSQL, where pages read by class): readers sum its day rows themselves otherwise.
    by_class = models.BooleanField(default=False)

    class Meta:
        ordering = ["-month"]

    def __str__(self) -> str:
        state = "closed" if self.closed else "reopened"
        return f"{self.month:%Y-%m} ({state})"


class MonthCloseEvent(models.Model):
    """One close or reopen of a month (docs/finance.md): who, when and, for a reopen, why.
    Written by ``billing.month_close`` only, never changed; the record a reopen leaves
    survives whatever happens to the close afterwards (closed again, reopened again)."""

    CLOSED, REOPENED = "closed", "reopened"
    ACTIONS = [(CLOSED, "closed"), (REOPENED, "reopened")]

    # PROTECT: a close with a history cannot be deleted, even outside the admin.
    close = models.ForeignKey(MonthClose, on_delete=models.PROTECT, related_name="events")
    action = models.CharField(max_length=8, choices=ACTIONS)
    at = models.DateTimeField()
    by = models.CharField(max_length=150)
    reason = models.TextField(blank=True, help_text="Why (required for a reopen)")

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.close.month:%Y-%m} {self.action} {self.at:%Y-%m-%d %H:%M} by {self.by}"


class ClosedFigures(UsageSums):
    """What a closed month keeps of a group of its figures: the rollups' sums (the
    ``USAGE_SUMS`` columns), the offline hours, the terms they were priced at (fixed rate,
    kind, the site's PUE, tariff and grid intensity), so the cost model gives the same money
    from them whatever changes afterwards, and the stored attribution.

    Columns, not a document, so a page sums a closed month in SQL (issue 19). The terms are
    decimal strings, exact on every database and grouped by as they are; the offline hours a
    decimal to 30 places (summed).
    """

    day = models.DateField()
    # Attribution as stored with the rollups (ids, not keys: a pool, team or site deleted
    # later must not delete a closed month's figures).
    pool_id_at = models.BigIntegerField(null=True)
    team_id_at = models.BigIntegerField(null=True)
    site_id_at = models.BigIntegerField(null=True)
    offline_h = models.DecimalField(max_digits=60, decimal_places=30, default=Decimal(0))
    rate = models.CharField(
        max_length=80, default="0", help_text="The fixed rate per GPU-hour, a decimal"
    )
    kind = models.CharField(max_length=8, blank=True, help_text="owned, rented, or none")
    site_name = models.CharField(max_length=255, null=True, blank=True)
    pue = models.CharField(max_length=80, default="1")
    price_per_kwh = models.CharField(max_length=80, default="0")
    grid_g_per_kwh = models.CharField(max_length=80, default="0")
    # Set on an adjustment (late data booked for a closed month): the day it corrects; its
    # ``day`` is then the first day of the month it is booked in.
    adjusts = models.DateField(null=True, blank=True)

    class Meta:
        abstract = True


class ClosedSegment(ClosedFigures):
    """One GPU's figures for one local day, attribution and rate of a closed month, as the
    close computed them (``ClosedFigures``), with the node it was on; and the same summed
    per GPU, attribution and terms over the month (``whole_month``), from which a page
    reading whole closed months sums them per GPU or price class.
    """

    close = models.ForeignKey(MonthClose, on_delete=models.CASCADE, related_name="segments")
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.CASCADE, related_name="+")
    node_id_at = models.BigIntegerField(null=True)
    # The month's own rows summed per GPU, attribution and terms over its days (``day`` its
    # first day): what a read of whole closed months, or of a month's late data, sums
    # instead of a row per GPU and day (never set on an adjustment).
    whole_month = models.BooleanField(default=False)
    # A month row's days: bit d - 1 set where its GPU had a day row on day d at the row's
    # attribution and terms. A count of a closed week's or day's rows (``counting``) reads
    # the month rows with these, not every day row (issue 19). Null on day rows and
    # adjustments, and on month rows of closes made before it was kept outside PostgreSQL.
    days = models.IntegerField(null=True, blank=True)
    # When an adjustment was booked (``billing.adjustments``); null on the close's own rows.
    booked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["day"], name="billing_closedseg_day"),
            models.Index(fields=["adjusts"], name="billing_closedseg_adjusts"),
            # The day rows' keys alone (issue 19): a count of a closed month's rows per day
            # and group (``counting._closed_keys``) reads this, not the rows' sums.
            models.Index(
                fields=["day"],
                include=["gpu", "close", "node_id_at", "pool_id_at", "team_id_at", "site_id_at"],
                condition=models.Q(adjusts__isnull=True, whole_month=False),
                name="billing_closedseg_day_keys",
            ),
            # The rows a read of whole closed months takes (``closing._closed_run``), and the
            # adjustments booked in a range: 1 in 30 of the rows at most, without scanning
            # the day rows beside them.
            models.Index(
                fields=["day"],
                condition=models.Q(whole_month=True) | models.Q(adjusts__isnull=False),
                name="billing_closedseg_month_rows",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} {self.day}"


class ClosedMonthStale(models.Model):
    """A closed month whose figures something changed since its adjustments were last booked
    (docs/finance.md): late rollup rows of its hours (marked by triggers on the hourly
    table, whatever writes them), a change of cost profile, site terms, attribution or
    service dates (marked by ``billing.signals``). ``billing.adjustments.adjust_closed``
    books the difference and removes the mark, unless it was marked again meanwhile
    (``token`` changed): then the next run books what came since."""

    month = models.DateField(unique=True)
    token = models.CharField(max_length=64)
    marked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} stale since {self.marked_at:%Y-%m-%d %H:%M}"


class ClosedClassDay(ClosedFigures):
    """A closed month's own day rows (``ClosedSegment``, not its month rows nor adjustments)
    summed per day, price class, attribution (no node) and terms, as the close stored them:
    what a page reading closed days by price class (the overview's trend, a team's days)
    sums, a few rows a day instead of one per GPU (issue 19). The class is what prices a
    frozen row beside its stored terms, as the GPUs had it at the close: their model and its
    nominal power. ``gpu_ids``: the GPUs summed in it; ``counted_ids``: those with capacity
    in it (observed or offline hours), which the rows' GPU counts count, where they are not
    all of them (None: the same list, as a rule). A reader uses a row
    only where every GPU of it is in its computation and of the same class now, else it sums
    the close's day rows itself.
    """

    close = models.ForeignKey(MonthClose, on_delete=models.CASCADE, related_name="class_days")
    max_power_w = models.FloatField(null=True)
    idle_power_w = models.FloatField(null=True)
    model_key = models.CharField(max_length=64, blank=True)
    model_name = models.CharField(max_length=255)
    gpu_ids = models.JSONField(default=list)
    counted_ids = models.JSONField(null=True, blank=True, help_text="None: all of gpu_ids")

    class Meta:
        indexes = [models.Index(fields=["close", "day"], name="billing_closedclassday_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.model_key} {self.pool_id_at}"


class FocusExport(models.Model):
    """A FOCUS file of one month, built by a Celery task (docs/finance.md) and downloaded
    from the Teams and pools page; gzip-compressed CSV. One row per month and version:
    asking again rebuilds it. A month still in progress is built only when asked for, and
    its file is marked ``partial``."""

    PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
    STATES = [(s, s) for s in (PENDING, RUNNING, DONE, FAILED)]

    month = models.DateField(help_text="First day of the month, report time zone")
    version = models.CharField(max_length=8)
    state = models.CharField(max_length=8, choices=STATES, default=PENDING)
    requested_by = models.CharField(max_length=150)
    requested_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    rows = models.PositiveIntegerField(default=0)
    # Built before its month ended (report time zone): the month so far, not the month.
    partial = models.BooleanField(default=False)
    content = models.BinaryField(default=b"", help_text="gzip of the CSV")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-month", "version"]
        constraints = [
            models.UniqueConstraint(fields=["month", "version"], name="billing_focus_month")
        ]

    def __str__(self) -> str:
        partial = ", partial" if self.partial else ""
        return f"FOCUS {self.version} {self.month:%Y-%m} ({self.state}{partial})"
