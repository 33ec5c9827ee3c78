"""Writes of alerts: the evaluation (``alerts_evaluate``) and the delivery of its notices
(``delivery_attempt``), both settled in the database so that a restart, a retried task or two
evaluations at once never notify twice (the healthchecks pattern).

Evaluation: every rule is measured first (``alerts.rules``; reads only), then all are settled
in one transaction
- a subject past the threshold with no open alert: insert one. A partial unique index allows
  one open alert per (rule, subject); the evaluator whose insert loses the race gets an
  IntegrityError in a savepoint and sends nothing;
- an open alert whose last notice is ``repeat_hours`` old, or whose subject is back within the
  threshold (resolved): ``UPDATE … WHERE notices = <as read>`` — only the evaluator that
  changed exactly one row creates the notice's deliveries;
- the deliveries are rows of the same transaction (an outbox): committed with the state change
  or not at all. A unique index on (alert, notice number, target) stands behind the CAS.

Delivery: each delivery is its own Celery task. A sender claims it with a lease (``UPDATE …
WHERE status = pending AND next_attempt_at <= now AND lease expired``), sends once, records the
attempt, and either marks it sent, schedules the next attempt with backoff (for up to an hour
after the notice), or gives up. A task lost with its worker is found again by the next
evaluation's sweep. A receiver may see a notice twice only if a sender dies after sending and
before recording it: the ``delivery`` id in every notice lets it drop the repeat.
"""

from __future__ import annotations

import datetime as dt
import http.client
import logging
import smtplib
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from alerts import figures
from alerts.egress import AddressRefused, webhook_opener
from alerts.messages import (
    SIGNATURE_HEADER,
    email_render,
    notice_build,
    webhook_body,
    webhook_signature,
)
from alerts.models import (
    EVENT_FIRING,
    EVENT_REPEAT,
    EVENT_RESOLVED,
    FAILED,
    PENDING,
    SENT,
    Alert,
    Delivery,
    DeliveryAttempt,
    Rule,
)
from alerts.rules import RULE_KINDS, Measurement, RuleConfig, RuleKind, Scope, Window
from alerts.targets import EMAIL, target_channel, targets_for
from fleet.emails import recipient_error

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0  # connect and each read (docs/alerts.md)
RETRY_FOR = dt.timedelta(hours=1)  # a notice is retried this long after it was decided
RETRY_FIRST = dt.timedelta(seconds=30)  # then doubled per attempt: 30 s, 1 min, 2 min …
RETRY_MAX = dt.timedelta(minutes=15)
# A sender's lease on a delivery: longer than any one attempt (SMTP's timeout is 30 s per
# operation); a sender that died is replaced once it runs out.
CLAIM_FOR = dt.timedelta(minutes=5)
# With a broker, a pending delivery this overdue lost its task: the sweep sends it again.
SWEEP_AFTER = dt.timedelta(minutes=10)
SWEEP_BATCH = 500


def rule_config(rule: Rule) -> RuleConfig:
    return RuleConfig(
        name=rule.name,
        kind=rule.kind,
        scope=Scope.parse(rule.scope),
        threshold=rule.threshold,
        window_hours=rule.window_hours,
        notify=tuple(rule.notify),
        repeat_hours=rule.repeat_hours,
    )


# --- evaluation ----------------------------------------------------------------------------
@dataclass
class EvaluationResult:
    rules: int = 0
    firing: int = 0  # open alerts after this evaluation, as this evaluator saw them
    started: int = 0
    repeated: int = 0
    resolved: int = 0
    deliveries: int = 0  # created by this evaluation
    resent: int = 0  # overdue deliveries the sweep dispatched again
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = (
            f"evaluated {self.rules} rule{'s' if self.rules != 1 else ''}: "
            f"{self.firing} firing ({self.started} new, {self.repeated} repeated), "
            f"{self.resolved} resolved; {self.deliveries} deliveries queued"
        )
        if self.resent:
            text += f", {self.resent} resent"
        if self.errors:
            text += f"; {len(self.errors)} rule(s) failed: {'; '.join(self.errors)}"
        return text


def _worse(kind: RuleKind, a: Decimal | None, b: Decimal) -> Decimal:
    if a is None:
        return b
    return max(a, b) if kind.above else min(a, b)


def _deliveries(
    alert: Alert,
    config: RuleConfig,
    *,
    event: str,
    sequence: int,
    measurement: Measurement,
    window: Window,
    now: dt.datetime,
) -> list[Delivery]:
    return [
        Delivery(
            alert=alert,
            event=event,
            sequence=sequence,
            channel=target_channel(target),
            target=target,
            value=measurement.value,
            threshold=config.threshold,
            window_start=window.start,
            window_end=window.end,
            created_at=now,
            next_attempt_at=now,
        )
        for target in targets_for(config, measurement)
    ]


@dataclass(frozen=True)
class _Measured:
    """One rule of an evaluation with what it measured."""

    rule: Rule
    kind: RuleKind
    config: RuleConfig
    window: Window
    measurements: list[Measurement]


def _open(
    starting: list[tuple[_Measured, Measurement]], now: dt.datetime
) -> list[tuple[Alert, _Measured, Measurement]]:
    """Insert the open alerts; those whose insert another evaluator won are left out.

    One INSERT for all of them; should any (rule, subject) be open already (a race), each is
    inserted alone in its own savepoint, and a lost race rolls back that insert only."""
    rows = [
        Alert(
            rule=r.rule,
            subject=m.subject,
            subject_label=m.label,
            value=m.value,
            peak_value=m.value,
            threshold=r.config.threshold,
            window_start=r.window.start,
            window_end=r.window.end,
            firing_since=min(m.since or now, now),
            last_notified_at=now,
            notices=1,
            evaluated_at=now,
        )
        for r, m in starting
    ]
    try:
        with transaction.atomic():
            created = Alert.objects.bulk_create(rows)
        return [(a, r, m) for a, (r, m) in zip(created, starting, strict=True)]
    except IntegrityError:
        pass
    won = []
    for row, (r, m) in zip(rows, starting, strict=True):
        try:
            with transaction.atomic():
                row.pk = None
                row.save(force_insert=True)
            won.append((row, r, m))
        except IntegrityError:
            continue
    return won


def _settle(measured: list[_Measured], now: dt.datetime, result: EvaluationResult) -> list[int]:
    """Bring every rule's alerts in line with its measurements, in one transaction; the ids
    of the deliveries created. New alerts first, then the open ones; rules and subjects in
    one order, so that two evaluators take row locks alike and never deadlock."""
    created: list[Delivery] = []
    quiet: list[Alert] = []
    with transaction.atomic():
        open_by_rule: dict[int, dict[str, Alert]] = {r.rule.pk: {} for r in measured}
        for alert in Alert.objects.filter(
            rule_id__in=list(open_by_rule), resolved_at__isnull=True
        ).order_by():
            open_by_rule[alert.rule_id][alert.subject] = alert
        values: dict[int, dict[str, Measurement]] = {}
        breaching: dict[int, set[str]] = {}
        starting: list[tuple[_Measured, Measurement]] = []
        for r in measured:
            values[r.rule.pk] = {m.subject: m for m in r.measurements}
            breaching[r.rule.pk] = {
                s
                for s, m in values[r.rule.pk].items()
                if r.kind.breaches(m.value, r.config.threshold)
            }
            starting += [
                (r, values[r.rule.pk][s])
                for s in sorted(breaching[r.rule.pk] - open_by_rule[r.rule.pk].keys())
            ]
        for alert, r, m in _open(starting, now) if starting else []:
            result.started += 1
            result.firing += 1
            created += _deliveries(
                alert,
                r.config,
                event=EVENT_FIRING,
                sequence=1,
                measurement=m,
                window=r.window,
                now=now,
            )
        for r in measured:
            rule_values, rule_breaching = values[r.rule.pk], breaching[r.rule.pk]
            for subject, alert in sorted(open_by_rule[r.rule.pk].items()):
                created += _advance(
                    r,
                    alert,
                    rule_values.get(subject),
                    subject in rule_breaching,
                    now,
                    result,
                    quiet,
                )
        if quiet:
            # Figures only, no notice: a race with a resolving evaluator changes nothing that
            # matters (the row keeps its resolution and gets the same numbers).
            Alert.objects.bulk_update(
                quiet,
                ["value", "peak_value", "threshold", "window_start", "window_end", "evaluated_at"],
                batch_size=500,
            )
        Delivery.objects.bulk_create(created)
    result.deliveries += len(created)
    return [d.pk for d in created]


def _advance(
    r: _Measured,
    alert: Alert,
    m: Measurement | None,
    breaching: bool,
    now: dt.datetime,
    result: EvaluationResult,
    quiet: list[Alert],
) -> list[Delivery]:
    """One open alert: new figures (``quiet``), a repeat or a resolution; the deliveries of
    the notice if this evaluator won it."""
    changes: dict[str, Any] = {
        "threshold": r.config.threshold,
        "window_start": r.window.start,
        "window_end": r.window.end,
        "evaluated_at": now,
    }
    if m is not None:
        changes["value"] = m.value
    else:  # the subject left the scope or has no data: its last value stands
        m = Measurement(alert.subject, alert.subject_label, alert.value or Decimal(0))
    if breaching:
        result.firing += 1
        changes["peak_value"] = _worse(r.kind, alert.peak_value, m.value)
        repeat = r.config.repeat_hours
        if not repeat or now < alert.last_notified_at + dt.timedelta(hours=repeat):
            # Figures only; an alert whose figures did not move is not written.
            moved = [k for k, v in changes.items() if getattr(alert, k) != v]
            if set(moved) - {"evaluated_at"}:
                for name in moved:
                    setattr(alert, name, changes[name])
                quiet.append(alert)
            return []
        event = EVENT_REPEAT
        changes["last_notified_at"] = now
    else:
        event = EVENT_RESOLVED
        changes["resolved_at"] = now
    # The compare-and-swap: of all evaluators that got here, one changes the row.
    won = Alert.objects.filter(pk=alert.pk, resolved_at__isnull=True, notices=alert.notices).update(
        notices=alert.notices + 1, **changes
    )
    if won != 1:
        return []
    if event == EVENT_REPEAT:
        result.repeated += 1
    else:
        result.resolved += 1
    return _deliveries(
        alert,
        r.config,
        event=event,
        sequence=alert.notices + 1,
        measurement=m,
        window=r.window,
        now=now,
    )


def alerts_evaluate(*, now: dt.datetime | None = None) -> EvaluationResult:
    """Evaluate every active rule once (docs/alerts.md), then hand the new deliveries and the
    overdue ones to their tasks. Safe to run twice at once, or again after a crash.

    Every rule is planned, then measured (reads only), then all are settled in one short
    transaction, so no lock is held while figures are read."""
    now = now or timezone.now()
    result = EvaluationResult()
    measured: list[_Measured] = []
    with figures.memo():
        planned = []
        for rule in Rule.objects.filter(active=True).order_by("position", "name"):
            kind = RULE_KINDS.get(rule.kind)
            if kind is None:  # applied by a version that knew this kind
                result.errors.append(f"{rule.name}: unknown rule {rule.kind!r}")
                continue
            config = rule_config(rule)
            window = kind.window_of(config, now)
            if kind.plan is not None:
                kind.plan(config, window)
            planned.append((rule, kind, config, window))
        for rule, kind, config, window in planned:
            try:
                measurements = kind.measure(config, window, now)
            except DatabaseError:
                raise  # the database is away: the task retries the whole evaluation
            except Exception as exc:  # one broken rule must not silence the others
                logger.exception("alert rule %s failed", rule.name)
                result.errors.append(f"{rule.name}: {type(exc).__name__}")
                continue
            measured.append(_Measured(rule, kind, config, window, measurements))
    result.rules = len(measured)
    created = _settle(measured, now, result)
    # After commit: a worker must find the rows it is handed (a caller's transaction, a test's).
    transaction.on_commit(lambda: deliveries_dispatch(created))
    result.resent = deliveries_sweep(now=now, exclude=created)
    return result


# --- dispatch --------------------------------------------------------------------------------
def _eager() -> bool:
    from alerts.tasks import delivery_task

    return bool(delivery_task.app.conf.task_always_eager)


def deliveries_dispatch(ids: Iterable[int]) -> None:
    """One Celery task per delivery. Without a broker (the embedded default) each runs here,
    one attempt, after the evaluation's state is committed; its retries are left to the
    sweep of the next evaluations. A broker that is away loses nothing: the rows wait."""
    from alerts.tasks import delivery_task

    for pk in ids:
        try:
            delivery_task.apply_async(args=[pk])
        except Exception:  # the broker, or an eager task's database error: the sweep resends
            logger.warning("alert delivery %s not dispatched; a later sweep sends it", pk)


def deliveries_sweep(*, now: dt.datetime | None = None, exclude: Iterable[int] = ()) -> int:
    """Dispatch pending deliveries whose next attempt is due and that nobody holds; with a
    broker only those overdue by ``SWEEP_AFTER`` (their task was lost), since the others'
    tasks are still queued. Returns how many were dispatched."""
    now = now or timezone.now()
    due_by = now if _eager() else now - SWEEP_AFTER
    ids = list(
        Delivery.objects.filter(status=PENDING, next_attempt_at__lte=due_by)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .exclude(pk__in=list(exclude))
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    if ids:
        transaction.on_commit(lambda: deliveries_dispatch(ids))
    return len(ids)


# --- delivery ------------------------------------------------------------------------------
class SendFailed(Exception):
    def __init__(self, error: str, *, retryable: bool, status_code: int | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.retryable = retryable
        self.status_code = status_code


def _email_send(delivery: Delivery) -> int | None:
    address = delivery.target[len("mailto:") :]
    # Checked when the rule was applied or the owner resolved; again here for rows written
    # before the recipient rule was as strict.
    error = recipient_error(address)
    if error is not None:
        raise SendFailed(f"refused: {error}", retryable=False)
    notice = notice_build(delivery)
    rendered = email_render(notice)
    message = EmailMultiAlternatives(
        subject=rendered.subject,
        body=rendered.text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[address],
        headers={"X-Gpufleet-Alert": str(notice.alert_id)},
    )
    message.attach_alternative(rendered.html, "text/html")
    try:
        get_connection(fail_silently=False).send_messages([message])
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        raise SendFailed(
            f"recipient refused: {codes}", retryable=any(c < 500 for c in codes)
        ) from None
    except smtplib.SMTPResponseException as exc:
        raise SendFailed(
            f"SMTP {exc.smtp_code}", retryable=exc.smtp_code < 500, status_code=exc.smtp_code
        ) from None
    except (smtplib.SMTPException, OSError) as exc:
        raise SendFailed(f"SMTP: {type(exc).__name__}: {exc}", retryable=True) from None
    return None


_OPENER = webhook_opener()


def _webhook_send(delivery: Delivery) -> int | None:
    secret = settings.ALERT_WEBHOOK_SECRET
    if not secret:
        raise SendFailed(
            "ALERT_WEBHOOK_SECRET is not set: webhooks are not sent unsigned", retryable=False
        )
    notice = notice_build(delivery)
    body = webhook_body(notice)
    request = urllib.request.Request(
        delivery.target,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "gpufleet-alerts",
            # Signed at each attempt: its time is when it was sent, for the receiver's
            # freshness check. A receiver de-duplicates on the body's ``delivery``.
            SIGNATURE_HEADER: webhook_signature(body, secret, timestamp_s=int(time.time())),
            "X-Gpufleet-Event": delivery.event,
        },
    )
    try:
        with _OPENER.open(request, timeout=WEBHOOK_TIMEOUT_S) as response:
            response.read(65536)
            return int(response.status)
    except AddressRefused as exc:  # the fleet file or DNS aims it at the server's own network
        raise SendFailed(f"refused: {exc}", retryable=False) from None
    except urllib.error.HTTPError as exc:
        code = exc.code
        exc.close()
        # The receiver's own trouble is worth another try; a refusal (4xx) or a redirect is not.
        raise SendFailed(
            f"HTTP {code}", retryable=code >= 500 or code in (408, 429), status_code=code
        ) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SendFailed(f"{type(exc).__name__}: {reason}", retryable=True) from None


CHANNELS: dict[str, Callable[[Delivery], int | None]] = {
    EMAIL: _email_send,
    "webhook": _webhook_send,
}


@dataclass(frozen=True)
class AttemptOutcome:
    status: str  # sent | retry | failed | skipped (someone else holds it, or it is done)
    retry_in: float | None = None


def retry_backoff(attempts: int) -> dt.timedelta:
    """Wait after the ``attempts``-th failed attempt: 30 s, 1 min, 2 min … at most 15 min."""
    wait: dt.timedelta = RETRY_FIRST * 2 ** max(0, attempts - 1)
    return min(RETRY_MAX, wait)


def delivery_attempt(*, delivery_id: int) -> AttemptOutcome:
    """One attempt at one delivery, if it is due and nobody else holds it; recorded."""
    now = timezone.now()
    # The lease: of all senders handed this delivery (a retry, a redelivered task, the sweep),
    # one changes the row and sends.
    claimed = (
        Delivery.objects.filter(pk=delivery_id, status=PENDING, next_attempt_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claimed_until=now + CLAIM_FOR, attempts=F("attempts") + 1)
    )
    if claimed != 1:
        return AttemptOutcome("skipped")
    delivery = Delivery.objects.select_related("alert__rule").get(pk=delivery_id)
    started = time.monotonic()
    status_code: int | None = None
    error = ""
    retryable = False
    try:
        status_code = CHANNELS[delivery.channel](delivery)
    except SendFailed as exc:
        error, retryable, status_code = exc.error[:500], exc.retryable, exc.status_code
    finished = timezone.now()
    wait = retry_backoff(delivery.attempts)
    changes: dict[str, Any]
    if not error:
        outcome = AttemptOutcome("sent")
        changes = {"status": SENT, "sent_at": finished, "last_error": ""}
    elif retryable and finished + wait <= delivery.created_at + RETRY_FOR:
        outcome = AttemptOutcome("retry", retry_in=wait.total_seconds())
        changes = {"next_attempt_at": finished + wait, "last_error": error}
    else:
        outcome = AttemptOutcome("failed")
        changes = {"status": FAILED, "failed_at": finished, "last_error": error}
        logger.warning("alert delivery %s failed for good: %s", delivery.pk, error)
    # The attempt and its outcome together: nobody reads one without the other.
    with transaction.atomic():
        DeliveryAttempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            started_at=now,
            duration_ms=int((time.monotonic() - started) * 1000),
            ok=not error,
            status_code=status_code,
            error=error,
        )
        Delivery.objects.filter(pk=delivery.pk).update(claimed_until=None, **changes)
    return outcome
