"""A close is never deleted, only reopened, with a reason, recorded (docs/finance.md, "Month
close"; DESIGN.md §9.1; issue 47 point 7, issue 39 point 3).

The admin once kept Django's "Delete selected month closes": the month reopened silently, with
no reason, no record and no latest-first check. Now the admin has no delete, and its "Reopen"
action asks for a reason and goes through ``month_reopen``, as ``manage.py reopen_month``.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command

from tests.billing.conftest import at, migrated_back

CHANGELIST = "/admin/billing/monthclose/"
MAY = at("2026-05-03T09")


@pytest.fixture
def may(worked_example: Any, role_client: Any) -> Any:
    """March and April 2026 closed (by alice), an admin's client on 3 May."""
    with time_machine.travel(MAY, tick=False):
        for month in ("2026-03", "2026-04"):
            call_command("close_month", month, "--by", "alice", stdout=io.StringIO())
        yield role_client("admin")


def _close(month: str) -> Any:
    from billing.models import MonthClose

    return MonthClose.objects.get(month=f"{month}-01")


def _reopen(admin: Any, *months: str, **extra: str) -> Any:
    data = {"action": "reopen", "_selected_action": [str(_close(m).pk) for m in months], **extra}
    return admin.post(CHANGELIST, data)


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_the_admin_cannot_delete_a_close(may: Any) -> None:
    from billing.models import MonthClose

    march = _close("2026-03")
    page = may.get(CHANGELIST).content.decode()
    assert 'value="delete_selected"' not in page and 'value="reopen"' in page
    assert may.get(f"{CHANGELIST}{march.pk}/delete/").status_code == 403
    assert may.post(f"{CHANGELIST}{march.pk}/delete/", {"post": "yes"}).status_code == 403
    # The bulk action, posted by hand, is not an action of this page.
    response = may.post(
        CHANGELIST,
        {"action": "delete_selected", "_selected_action": [str(march.pk)], "post": "yes"},
        follow=True,
    )
    assert response.status_code == 200
    assert MonthClose.objects.filter(closed=True).count() == 2
    change = may.get(f"{CHANGELIST}{march.pk}/change/").content.decode()
    assert "deletelink" not in change


def test_a_close_with_a_history_cannot_be_deleted_anywhere(may: Any) -> None:
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        _close("2026-04").delete()


def test_the_reopen_action_asks_for_a_reason_first(may: Any) -> None:
    asked = _reopen(may, "2026-04")
    assert asked.status_code == 200
    page = asked.content.decode()
    assert 'id="reopen-form"' in page and "2026-04 (closed)" in page
    assert _close("2026-04").closed is True
    for blank in ("", "   "):
        refused = _reopen(may, "2026-04", apply="Reopen", reason=blank)
        assert refused.status_code == 200 and "This field is required." in refused.content.decode()
        assert _close("2026-04").closed is True and not _close("2026-04").events.filter(
            action="reopened"
        )


def test_the_reopen_action_records_who_when_and_why(may: Any) -> None:
    with time_machine.travel(at("2026-05-04T10"), tick=False):
        done = _reopen(may, "2026-04", apply="Reopen", reason="  late batch from gpu-07 ")
    assert done.status_code == 302
    april = _close("2026-04")
    assert april.closed is False and april.segments_count == 0
    assert not april.segments.exists() and not april.class_days.exists()
    (event,) = april.events.filter(action="reopened")
    assert (event.at, event.by, event.reason) == (
        at("2026-05-04T10"),
        "admin1",
        "late batch from gpu-07",
    )
    # The close's page shows the history, read-only.
    page = may.get(f"{CHANGELIST}{april.pk}/change/").content.decode()
    assert "late batch from gpu-07" in page and "admin1" in page
    history = may.get("/admin/billing/monthcloseevent/").content.decode()
    assert "late batch from gpu-07" in history
    assert may.get("/admin/billing/monthcloseevent/add/").status_code == 403
    assert may.get(f"/admin/billing/monthcloseevent/{event.pk}/delete/").status_code == 403


def test_the_admin_reopens_the_latest_month_first(may: Any) -> None:
    """March alone under a closed April is refused (April carries March's adjustments);
    March and April selected together reopen April, then March."""
    refused = _reopen(may, "2026-03", apply="Reopen", reason="wrong tariff")
    followed = may.get(refused["Location"])
    assert "month: 2026-04 is closed after it; reopen 2026-04 first" in _messages(followed)
    assert _close("2026-03").closed is True
    assert not _close("2026-03").events.filter(action="reopened").exists()

    both = _reopen(may, "2026-03", "2026-04", apply="Reopen", reason="wrong tariff")
    assert _messages(may.get(both["Location"])) == ["reopened 2026-04", "reopened 2026-03"]
    for month in ("2026-03", "2026-04"):
        close = _close(month)
        assert close.closed is False
        assert [e.reason for e in close.events.filter(action="reopened")] == ["wrong tariff"]


def test_reopen_month_needs_a_reason_and_records_the_os_user(may: Any, monkeypatch: Any) -> None:
    import getpass

    with pytest.raises(CommandError, match="--reason"):
        call_command("reopen_month", "2026-04")
    monkeypatch.setattr(getpass, "getuser", lambda: "ops")
    call_command("reopen_month", "2026-04", "--reason", "audit", stdout=io.StringIO())
    (event,) = _close("2026-04").events.filter(action="reopened")
    assert (event.by, event.reason) == ("ops", "audit")


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_a_reopen_recorded_before_events(fleet: Any) -> None:
    """Closes stored before 0012 kept their latest reopen in columns: it becomes an event, and
    the close's latest close one too."""
    from billing.models import MonthClose

    closed_at, reopened_at = at("2026-04-05T12"), at("2026-04-06T08")
    with migrated_back("billing", "0011_closed_month_days") as old:
        old.get_model("billing", "MonthClose").objects.create(
            month="2026-03-01",
            closed=False,
            closed_at=closed_at,
            closed_by="alice",
            zone="UTC",
            reopened_at=reopened_at,
            reopened_by="bob",
            reopen_reason="late batch",
        )
    close = MonthClose.objects.get()
    assert [(e.action, e.at, e.by, e.reason) for e in close.events.all()] == [
        ("reopened", reopened_at, "bob", "late batch"),
        ("closed", closed_at, "alice", ""),
    ]
