"""The evaluation's state machine with frozen time (firing → quiet → repeat → resolved), its
notices, its safety against restarts and concurrent evaluators, and the demo's rules."""

from __future__ import annotations

import datetime as dt
import io
import threading
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.core.management import call_command
from django.db import connection

from alerts.models import EVENT_FIRING, EVENT_REPEAT, EVENT_RESOLVED, Alert, Delivery
from alerts.rules import RULE_KINDS
from alerts.services import alerts_evaluate
from tests.alerts.conftest import at, rules_apply


def evaluate(now: dt.datetime, capture: Any) -> Any:
    """One evaluation at ``now`` (time frozen there), its notices sent on commit."""
    with time_machine.travel(now, tick=False), capture(execute=True):
        return alerts_evaluate()


@pytest.mark.smoke
def test_an_alert_walks_from_firing_through_repeat_to_resolved(
    worked_example: Any,
    eager: None,
    receiver: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The worked example's GPU held 6 h on 2 March (0.1 h in each of hours 00–09, the whole
    of hours 10–14). A 24-hour window sees all 6 h until it starts past 10:00 the next day;
    from 11:00 it sees 4 h (not above 4), from 12:00 3 h."""
    hook = receiver("verify")
    rules_apply(
        {
            "name": "held-idle",
            "rule": "gpu_held_hours",
            "scope": "pool:inference",
            "threshold": 4,
            "window_hours": 24,
            "notify": ["mailto:ops@example.com", hook.url],
            "repeat_hours": 2,
        }
    )

    first = evaluate(
        at("2026-03-02T20") + dt.timedelta(minutes=5), django_capture_on_commit_callbacks
    )
    assert (first.started, first.firing, first.deliveries) == (1, 1, 2)
    alert = Alert.objects.get()
    assert (alert.subject, alert.subject_label, alert.value, alert.notices) == (
        "gpu:GPU-example",
        "gpu-07#0",
        Decimal(6),
        1,
    )
    assert alert.firing_since == at("2026-03-02T20") + dt.timedelta(minutes=5)
    assert len(mail.outbox) == 1 and len(hook.received) == 1
    assert all(got.signature_ok for got in hook.received)

    # A restart, or the next beat within the hour: same state, nothing sent again.
    again = evaluate(
        at("2026-03-02T20") + dt.timedelta(minutes=5), django_capture_on_commit_callbacks
    )
    quiet = evaluate(
        at("2026-03-02T21") + dt.timedelta(minutes=5), django_capture_on_commit_callbacks
    )
    assert (again.deliveries, quiet.deliveries, quiet.firing) == (0, 0, 1)
    assert len(mail.outbox) == 1 and len(hook.received) == 1

    repeat = evaluate(
        at("2026-03-02T22") + dt.timedelta(minutes=5), django_capture_on_commit_callbacks
    )
    assert (repeat.repeated, repeat.deliveries) == (1, 2)
    alert.refresh_from_db()
    assert (alert.notices, alert.last_notified_at) == (
        2,
        at("2026-03-02T22") + dt.timedelta(minutes=5),
    )

    still = evaluate(
        at("2026-03-03T10") + dt.timedelta(minutes=5), django_capture_on_commit_callbacks
    )
    assert (still.repeated, still.resolved, still.firing) == (1, 0, 1)  # 2 h since 22:05

    resolved = evaluate(
        at("2026-03-03T11") + dt.timedelta(minutes=5), django_capture_on_commit_callbacks
    )
    assert (resolved.resolved, resolved.firing, resolved.deliveries) == (1, 0, 2)
    alert.refresh_from_db()
    assert alert.resolved_at == at("2026-03-03T11") + dt.timedelta(minutes=5)
    assert (alert.value, alert.peak_value, alert.notices) == (Decimal(4), Decimal(6), 4)

    after = evaluate(
        at("2026-03-03T12") + dt.timedelta(minutes=5), django_capture_on_commit_callbacks
    )
    assert (after.started, after.deliveries, Alert.objects.count()) == (0, 0, 1)

    bodies = [got.json() for got in hook.received]
    assert [(b["state"], b["event"], b["value"]) for b in bodies] == [
        ("firing", EVENT_FIRING, 6.0),
        ("firing", EVENT_REPEAT, 6.0),
        ("firing", EVENT_REPEAT, 5.0),
        ("resolved", EVENT_RESOLVED, 4.0),
    ]
    assert {b["alert"] for b in bodies} == {alert.pk}
    assert [m.subject for m in mail.outbox] == [
        "[gpufleet] firing held-idle: gpu-07#0 at 6.0 h, above 4.0 h",
        "[gpufleet] still firing held-idle: gpu-07#0 at 6.0 h, above 4.0 h",
        "[gpufleet] still firing held-idle: gpu-07#0 at 5.0 h, above 4.0 h",
        "[gpufleet] resolved held-idle: gpu-07#0 is at 4.0 h (threshold 4.0 h)",
    ]
    assert sorted(set(Delivery.objects.values_list("sequence", "event", "status"))) == [
        (1, EVENT_FIRING, "sent"),
        (2, EVENT_REPEAT, "sent"),
        (3, EVENT_REPEAT, "sent"),
        (4, EVENT_RESOLVED, "sent"),
    ]


def test_a_below_rule_fires_below_and_a_rule_without_targets_only_records(
    worked_example: Any, django_capture_on_commit_callbacks: Any
) -> None:
    rules_apply(
        {"name": "busy", "rule": "utilization_below", "scope": "fleet", "threshold": 0.4},
        {"name": "very-busy", "rule": "utilization_below", "scope": "fleet", "threshold": 0.3},
    )
    result = evaluate(at("2026-03-03T00"), django_capture_on_commit_callbacks)  # 37.5 %
    assert (result.started, result.deliveries) == (1, 0)
    assert Alert.objects.get().rule.name == "busy"


def test_a_broken_rule_does_not_silence_the_others(
    worked_example: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    import dataclasses

    def broken(*args: Any) -> Any:
        raise ZeroDivisionError("a bug")

    kind = RULE_KINDS["utilization_below"]
    monkeypatch.setitem(RULE_KINDS, kind.name, dataclasses.replace(kind, measure=broken))
    rules_apply(
        {"name": "util", "rule": "utilization_below", "scope": "fleet", "threshold": 0.5},
        {"name": "held", "rule": "gpu_held_hours", "scope": "fleet", "threshold": 1},
    )
    result = evaluate(at("2026-03-03T00"), django_capture_on_commit_callbacks)
    assert result.errors == ["util: ZeroDivisionError"]
    assert (result.rules, result.started) == (1, 1)
    assert "1 rule(s) failed: util: ZeroDivisionError" in result.summary()


def test_alerts_evaluate_prints_its_result_on_the_last_line(worked_example: Any) -> None:
    rules_apply({"name": "held", "rule": "gpu_held_hours", "scope": "fleet", "threshold": 1})
    out = io.StringIO()
    with time_machine.travel(at("2026-03-02T20"), tick=False):
        call_command("alerts_evaluate", stdout=out)
    assert out.getvalue().strip().splitlines()[-1] == (
        "evaluated 1 rule: 1 firing (1 new, 0 repeated), 0 resolved; 0 deliveries queued"
    )


# --- two evaluators at once ----------------------------------------------------------------
def _meet_before(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Two evaluators meet before their first write: the first call of each named step of
    ``alerts.services`` in each thread waits for the other thread's, so both have read the
    open alerts before either inserts or compares-and-swaps (without this the faster one is
    often done before the other reads, and no write ever races)."""
    from alerts import services

    for name in names:
        barrier = threading.Barrier(2, timeout=30)
        met = threading.local()
        original = getattr(services, name)

        def meeting(*args: Any, _o: Any = original, _b: Any = barrier, _m: Any = met) -> Any:
            if not getattr(_m, "done", False):
                _m.done = True
                _b.wait()
            return _o(*args)

        monkeypatch.setattr(services, name, meeting)


def _race(now: dt.datetime, evaluators: int = 2) -> list[Any]:
    """``evaluators`` threads, each with its own connection, start ``alerts_evaluate`` at the
    same instant (a barrier) with the same ``now``."""
    barrier = threading.Barrier(evaluators)
    results: list[Any] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            barrier.wait(timeout=30)
            results.append(alerts_evaluate(now=now))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(evaluators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(results) == evaluators
    return results


@pytest.mark.django_db(transaction=True)
def test_two_evaluators_at_once_notify_once(
    postgres: None, eager: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.models import FleetSettings
    from tests.billing.conftest import FleetBuilder

    FleetSettings.load()
    fleet = FleetBuilder()
    pool = fleet.pool("training")
    node = fleet.node("gpu-01", pool=pool)
    start = at("2026-03-01T00")
    gpus = [
        fleet.gpu(f"GPU-{i}", node=node, index=i, in_service_at=start, last_seen_at=start)
        for i in range(4)
    ]
    fleet.save(
        [
            fleet.usage(g, at(f"2026-03-02T{h:02d}"), observed_s=3600, held_s=3600)
            for g in gpus
            for h in range(8)
        ]
    )
    rules_apply(
        {
            "name": "held",
            "rule": "gpu_held_hours",
            "scope": "pool:training",
            "threshold": 4,
            "notify": ["mailto:ops@example.com", "mailto:lead@example.com"],
            "repeat_hours": 1,
        },
        {
            "name": "silent",
            "rule": "gpu_offline_minutes",
            "threshold": 60,
            "notify": ["mailto:ops@example.com"],
            "repeat_hours": 1,
        },
        {
            "name": "idle-money",
            "rule": "utilization_below",
            "threshold": 0.5,
            "notify": ["mailto:finance@example.com"],
            "repeat_hours": 0,
        },
    )
    # 4 GPUs × 2 targets + 4 GPUs × 1 target + the fleet × 1 target, per notice round.
    per_round = 4 * 2 + 4 + 1

    _meet_before(monkeypatch, "_open", "_advance")
    opened = _race(at("2026-03-02T12"))
    assert sum(r.started for r in opened) == 9
    assert Alert.objects.filter(resolved_at__isnull=True).count() == 9
    assert Delivery.objects.count() == per_round == sum(r.deliveries for r in opened)
    assert len(mail.outbox) == per_round

    repeated = _race(at("2026-03-02T13"))
    assert sum(r.repeated for r in repeated) == 8  # the two rules that repeat hourly
    assert Delivery.objects.count() == per_round + 8 * 1 + 4 and len(mail.outbox) == 25

    for gpu in gpus:  # back: the GPUs report again and their hours leave the window
        gpu.last_seen_at = at("2026-03-03T20")
        gpu.save()
    resolved = _race(at("2026-03-03T20"))
    assert sum(r.resolved for r in resolved) == 8  # the fleet's utilisation stays low
    assert Alert.objects.filter(resolved_at__isnull=True).count() == 1
    assert Delivery.objects.count() == 25 + 4 * 2 + 4 == len(mail.outbox)
    # Each notice of each alert went to each of its targets exactly once.
    told = list(Delivery.objects.values_list("alert_id", "sequence", "target"))
    assert len(told) == len(set(told))
    assert sorted({m.to[0] for m in mail.outbox}) == [
        "finance@example.com",
        "lead@example.com",
        "ops@example.com",
    ]


def test_an_offline_gpus_alert_fires_since_its_last_sample_not_the_evaluation(
    fleet: Any, eager: None, receiver: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """A GPU whose last sample ended 20 days before the first evaluation: its alert fires
    since that moment (the silence began then), in the row, the webhook and the email."""
    hook = receiver("verify")
    node = fleet.node("gpu-01", pool=fleet.pool("training"))
    last = at("2026-02-10T06") + dt.timedelta(minutes=45)
    fleet.gpu("GPU-gone", node=node, index=0, in_service_at=at("2026-01-01T00"), last_seen_at=last)
    never = at("2026-03-02T09")  # in service since, never reported: silent since then
    fleet.gpu("GPU-never", node=node, index=1, in_service_at=never)
    rules_apply(
        {
            "name": "offline",
            "rule": "gpu_offline_minutes",
            "threshold": 30,
            "notify": ["mailto:ops@example.com", hook.url],
        }
    )
    now = at("2026-03-02T12") + dt.timedelta(minutes=5)
    evaluate(now, django_capture_on_commit_callbacks)
    since = dict(Alert.objects.values_list("subject", "firing_since"))
    assert since == {"gpu:GPU-gone": last, "gpu:GPU-never": never}
    gone = Alert.objects.get(subject="gpu:GPU-gone")
    # 20 days 5 h 20 min of silence, in minutes.
    assert gone.value == Decimal(20 * 1440 + 5 * 60 + 20)
    bodies = {got.json()["subject"]: got.json() for got in hook.received}
    assert bodies["gpu:GPU-gone"]["since"] == "2026-02-10T06:45:00Z"
    assert any("since 2026-02-10 06:45 UTC" in m.body for m in mail.outbox)
    # A later evaluation keeps it: the alert is the same episode.
    evaluate(now + dt.timedelta(hours=1), django_capture_on_commit_callbacks)
    assert Alert.objects.get(subject="gpu:GPU-gone").firing_since == last


# --- the demo ----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_demo_fleets_rules_fire_within_one_evaluation(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    """Eleven days of the demo fleet (one GPU per group): the shared-dev GPU falls off the bus
    on day 10 and the notebooks GPU is held by an idle kernel all day."""
    call_command("demo", no_serve=True, gpus=6, days=11, stdout=io.StringIO(), stderr=io.StringIO())
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("alerts_evaluate", stdout=out)
    firing = {
        (a.rule.name, a.subject_label) for a in Alert.objects.filter(resolved_at__isnull=True)
    }
    assert ("gpu-offline", "gpu-ams1-02#0") in firing
    assert ("notebooks-held-idle", "gpu-iad1-02#0") in firing
    offline = [label for rule, label in firing if rule == "gpu-offline"]
    assert offline == ["gpu-ams1-02#0"]  # the others reported within the last half hour
    # The notebook's user held that GPU without computing (a user workload): the owner rule
    # tells them at their address from the people's domain rule, and the HPC team.
    held = [a for a in Alert.objects.filter(resolved_at__isnull=True, rule__name="jobs-held-idle")]
    assert any(a.subject_label.startswith("user ") for a in held), firing
    told = set(Delivery.objects.filter(alert__in=held).values_list("target", flat=True))
    assert "mailto:hpc-team@example.com" in told
    owners = {t for t in told if t != "mailto:hpc-team@example.com"}
    assert owners and all(t.endswith("@example.com") for t in owners), told
    assert "firing" in out.getvalue().strip().splitlines()[-1]
    # Every notice of the demo goes by email (the console backend here): none failed.
    assert Delivery.objects.exists()
    assert not Delivery.objects.exclude(status="sent").exists()
