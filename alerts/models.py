"""Alert rules as the fleet file set them, the alerts they raise, and every notification.

State lives in the database and every change of it that notifies somebody is a
compare-and-swap (healthchecks style), so a restarted worker or two evaluations at once never
notify twice: see ``alerts.services``.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

FIRING = "firing"
RESOLVED = "resolved"

# What a notification says (Delivery.event).
EVENT_FIRING = "firing"  # the alert started firing
EVENT_REPEAT = "repeat"  # still firing, repeat_hours after the last notice
EVENT_RESOLVED = "resolved"
EVENTS = (EVENT_FIRING, EVENT_REPEAT, EVENT_RESOLVED)

PENDING = "pending"
SENT = "sent"
FAILED = "failed"


class Rule(models.Model):
    """One ``[[alerts]]`` table of the fleet file, as last applied (docs/alerts.md).

    Identified by its ``name``. A rule left out of the file is kept, inactive, so the history
    of its alerts stays readable; applying it again brings it back. The values are checked
    when the file is applied (``alerts.fleetfile``), never at evaluation time.
    """

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=40, help_text="The rule: gpu_held_hours, budget_month, …")
    scope = models.CharField(max_length=150, help_text="fleet | site:NAME | pool:NAME | …")
    threshold = models.DecimalField(max_digits=24, decimal_places=6)
    window_hours = models.PositiveIntegerField(
        null=True, blank=True, help_text="Look-back of the rule; none for rules without one"
    )
    notify = models.JSONField(default=list, blank=True, help_text="mailto: and http(s) targets")
    repeat_hours = models.PositiveIntegerField(
        default=24, help_text="Notify again after this long while firing; 0: never"
    )
    position = models.PositiveIntegerField(default=0, help_text="Its index in the file")
    active = models.BooleanField(default=True)
    applied_at = models.DateTimeField(help_text="When the fleet file last changed this rule")

    class Meta:
        ordering = ["position", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind} {self.scope})"


class Alert(models.Model):
    """One firing episode of one rule for one subject (a GPU, or the rule's scope), from the
    evaluation that first saw the subject past the threshold to the one that no longer did.

    At most one alert per (rule, subject) is open (``resolved_at`` null): a partial unique
    index holds that line when two evaluators race to open it. ``notices`` counts the
    notices sent for it (the start, each repeat, the resolution) and is the version every
    notifying change compares and swaps. Values are in the rule's unit (hours, minutes, a
    share 0–1, or money in the fleet's currency); ``value`` is the last evaluated one,
    ``peak_value`` the worst while firing.
    """

    rule = models.ForeignKey(Rule, on_delete=models.PROTECT, related_name="alerts")
    subject = models.CharField(max_length=200, help_text="gpu:UUID, pool:NAME, fleet, …")
    subject_label = models.CharField(max_length=300, blank=True)
    value = models.DecimalField(max_digits=24, decimal_places=6, null=True)
    peak_value = models.DecimalField(max_digits=24, decimal_places=6, null=True)
    threshold = models.DecimalField(
        max_digits=24, decimal_places=6, help_text="The rule's threshold when last evaluated"
    )
    window_start = models.DateTimeField(null=True, help_text="The last evaluation's window")
    window_end = models.DateTimeField(null=True)
    firing_since = models.DateTimeField()
    last_notified_at = models.DateTimeField()
    notices = models.PositiveIntegerField(default=1)
    evaluated_at = models.DateTimeField(help_text="When its figures last changed")
    resolved_at = models.DateTimeField(null=True, blank=True)
    note = models.CharField(
        max_length=200, blank=True, help_text="Why it closed without a resolving evaluation"
    )

    class Meta:
        ordering = ["-firing_since", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "subject"],
                condition=Q(resolved_at__isnull=True),
                name="alerts_one_open_alert_per_rule_subject",
            )
        ]
        indexes = [
            models.Index(fields=["resolved_at", "firing_since"], name="alerts_alert_state"),
        ]

    def __str__(self) -> str:
        return f"{self.rule.name} {self.subject} since {self.firing_since:%Y-%m-%d %H:%M}"

    @property
    def state(self) -> str:
        return FIRING if self.resolved_at is None else RESOLVED


class Delivery(models.Model):
    """One notice about one alert to one target of its rule: an email to one address or a
    POST to one webhook. Created in the same transaction as the alert change it reports (an
    outbox), then sent by its own Celery task; ``attempts`` counts the tries, each recorded
    as a ``DeliveryAttempt``. The notice's figures are copied here when it is created, so a
    retry an hour later says what was true when it was decided.
    """

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=10, choices=[(e, e) for e in EVENTS])
    sequence = models.PositiveIntegerField(help_text="The alert's notice number it belongs to")
    channel = models.CharField(max_length=10, help_text="email | webhook")
    target = models.CharField(max_length=2000, help_text="The rule's target, exactly")
    value = models.DecimalField(max_digits=24, decimal_places=6, null=True)
    threshold = models.DecimalField(max_digits=24, decimal_places=6)
    window_start = models.DateTimeField(null=True)
    window_end = models.DateTimeField(null=True)
    status = models.CharField(max_length=10, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField()
    # A sender's lease: while it lies in the future, nobody else tries this delivery.
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["created_at", "pk"]
        constraints = [
            # The compare-and-swap on Alert.notices already lets one evaluator create a
            # notice's deliveries; this is the database's own line behind it.
            models.UniqueConstraint(
                fields=["alert", "sequence", "target"], name="alerts_one_delivery_per_notice"
            )
        ]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="alerts_delivery_due"),
        ]

    def __str__(self) -> str:
        return f"{self.event} of alert {self.alert_id} to {self.channel} ({self.status})"


class DeliveryAttempt(models.Model):
    """One try at sending a ``Delivery``: when, how long it took, and what came back (the
    HTTP status, or the SMTP or network error)."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    ok = models.BooleanField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["started_at", "pk"]

    def __str__(self) -> str:
        return f"try {self.number} of delivery {self.delivery_id}: {'ok' if self.ok else 'failed'}"


class Person(models.Model):
    """One ``[[people]]`` table of the fleet file (docs/alerts.md, "Owners"): where the
    workloads of one user (``user`` and ``email``) or of every user not listed
    (``email_domain``: ``USER@DOMAIN``) are told about, and whether they get the weekly
    digest. Replaced as a whole each time the fleet file is applied."""

    position = models.PositiveIntegerField(help_text="Its index in the file")
    user = models.CharField(max_length=200, blank=True, help_text="Blank for a domain rule")
    email = models.EmailField(max_length=254, blank=True)
    email_domain = models.CharField(max_length=253, blank=True)
    digest = models.BooleanField(help_text="Sent the weekly digest of their workloads")

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(
                fields=["user"], condition=~Q(user=""), name="alerts_person_one_per_user"
            )
        ]

    def __str__(self) -> str:
        return self.user or f"*@{self.email_domain}"


class Digest(models.Model):
    """One weekly digest to one workload user: claimed with a compare-and-swap on
    ``claimed_at``/``sent_at`` as the weekly report is, so a retried task, two beat processes
    and a second command send it once."""

    week = models.CharField(max_length=8, help_text="ISO week, e.g. 2026-W48")
    user = models.CharField(max_length=200)
    week_start = models.DateField()
    email = models.EmailField(max_length=254, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-week_start", "user"]
        constraints = [
            models.UniqueConstraint(fields=["week", "user"], name="alerts_digest_week_user")
        ]

    def __str__(self) -> str:
        return f"{self.week} → {self.user}"
