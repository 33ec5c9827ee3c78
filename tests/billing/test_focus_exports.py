"""Month FOCUS files built by a Celery task and downloaded from the Teams and pools page."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import pytest
import time_machine

from tests.billing.conftest import at


@pytest.fixture
def eager() -> Iterator[None]:
    """Celery tasks run in this process (the embedded default), whatever REDIS_URL says."""
    from config.celery import app

    before = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = before


@pytest.fixture
def april() -> Iterator[None]:
    with time_machine.travel(at("2026-04-05T12"), tick=False):
        yield


def test_a_month_file_is_built_and_equals_the_api(
    worked_example: Any,
    role_client: Any,
    april: None,
    eager: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from billing.models import FocusExport

    finance = role_client("finance")
    with django_capture_on_commit_callbacks(execute=True):
        response = finance.post("/chargeback/focus/", {"month": "2026-03", "version": "1.0"})
    assert response.status_code == 302 and response["Location"].endswith("#focus-files")
    export = FocusExport.objects.get()
    assert (export.state, export.version, export.requested_by) == ("done", "1.0", "finance1")
    # 2 rows on 2 March (fixed, energy), then a fixed charge a day to 31 March: 31.
    assert export.rows == 31
    download = finance.get(f"/chargeback/focus/{export.pk}/")
    assert download.status_code == 200 and download["Content-Type"] == "application/gzip"
    assert 'filename="focus-1.0_2026-03.csv.gz"' in download["Content-Disposition"]
    api = finance.get(
        "/api/v1/focus", {"start": "2026-03-01", "end": "2026-04-01", "version": "1.0"}
    )
    assert gzip.decompress(download.content) == b"".join(api.streaming_content)
    page = finance.get("/chargeback/").content.decode()
    assert 'id="focus-files"' in page and f"/chargeback/focus/{export.pk}/" in page


def test_focus_files_are_for_finance_only(
    worked_example: Any, role_client: Any, april: None
) -> None:
    viewer = role_client("viewer")
    assert 'id="focus-files"' not in viewer.get("/chargeback/").content.decode()
    assert viewer.post("/chargeback/focus/", {"month": "2026-03"}).status_code == 403


@pytest.mark.parametrize(
    ("data", "field"),
    [({"month": "2026-3x"}, "month"), ({"month": "2026-03", "version": "0.5"}, "version")],
)
def test_a_bad_request_names_the_field(
    db: Any, role_client: Any, data: dict[str, str], field: str
) -> None:
    response = role_client("finance").post("/chargeback/focus/", data)
    assert response.status_code == 400 and response.content.decode().startswith(f"{field}:")


def _options(page: str) -> list[tuple[str, str, bool]]:
    """The month picker's options: (value, label, selected)."""
    import re

    form = page[page.index('id="focus-form"') :]
    form = form[: form.index("</select>")]
    return [
        (value, label, bool(selected))
        for value, selected, label in re.findall(
            r'<option value="([^"]+)"( selected)?>([^<]+)</option>', form
        )
    ]


def test_the_picker_defaults_to_the_last_complete_month(
    worked_example: Any, role_client: Any, april: None
) -> None:
    options = _options(role_client("finance").get("/chargeback/").content.decode())
    assert len(options) == 13
    assert options[0] == ("2026-04", "2026-04 (in progress: partial)", False)
    assert options[1] == ("2026-03", "2026-03", True)
    assert options[-1] == ("2025-04", "2025-04", False)
    assert [o for o in options if o[2]] == [options[1]]


def test_the_months_are_the_report_time_zones(
    worked_example: Any, fleet: Any, role_client: Any
) -> None:
    """31 March 12:00 UTC is 1 April 01:00 in Auckland (NZDT, +13): there March is complete,
    though in UTC it is not."""
    fleet.settings(report_time_zone="Pacific/Auckland")
    with time_machine.travel(at("2026-03-31T12"), tick=False):
        options = _options(role_client("finance").get("/chargeback/").content.decode())
    assert options[0][:2] == ("2026-04", "2026-04 (in progress: partial)")
    assert options[1] == ("2026-03", "2026-03", True)


def test_the_month_in_progress_is_built_partial(
    worked_example: Any,
    role_client: Any,
    april: None,
    eager: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from billing.models import FocusExport

    finance = role_client("finance")
    with django_capture_on_commit_callbacks(execute=True):
        finance.post("/chargeback/focus/", {"month": "2026-04", "version": "1.2"})
    export = FocusExport.objects.get()
    assert (export.state, export.partial) == ("done", True)
    # 1-4 April whole and 5 April to 12:00: a fixed charge a day, no energy (no samples).
    assert export.rows == 5
    download = finance.get(f"/chargeback/focus/{export.pk}/")
    assert 'filename="focus-1.2_2026-04-partial.csv.gz"' in download["Content-Disposition"]
    api = finance.get("/api/v1/focus", {"start": "2026-04-01", "end": "2026-05-01"})
    assert gzip.decompress(download.content) == b"".join(api.streaming_content)
    page = finance.get("/chargeback/").content.decode()
    table = page[page.index('id="focus-table"') :]
    assert '2026-04 <strong class="partial">partial</strong>' in table

    # Built again once April has ended, the file is the whole month and not partial.
    with time_machine.travel(at("2026-05-02T08"), tick=False):
        finance = role_client("finance")  # a new session: the first has expired by May
        with django_capture_on_commit_callbacks(execute=True):
            finance.post("/chargeback/focus/", {"month": "2026-04", "version": "1.2"})
        download = finance.get(f"/chargeback/focus/{export.pk}/")
    export.refresh_from_db()
    assert (export.state, export.partial, export.rows) == ("done", False, 30)
    assert 'filename="focus-1.2_2026-04.csv.gz"' in download["Content-Disposition"]


def test_a_month_not_begun_is_refused(worked_example: Any, role_client: Any, april: None) -> None:
    from billing.models import FocusExport

    response = role_client("finance").post("/chargeback/focus/", {"month": "2026-05"})
    assert response.status_code == 400
    assert response.content.decode() == "month: 2026-05 has not begun in the report time zone"
    assert not FocusExport.objects.exists()


def test_build_returns_to_the_page_with_its_filters(
    worked_example: Any,
    role_client: Any,
    april: None,
    eager: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    finance = role_client("finance")
    query = "from=2026-03-01&to=2026-03-31&team=research"
    page = finance.get(f"/chargeback/?{query}").content.decode()
    form = page[page.index('<form method="post" action="/chargeback/focus/') :]
    assert form.startswith(
        f'<form method="post" action="/chargeback/focus/?{query.replace("&", "&amp;")}"'
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = finance.post(f"/chargeback/focus/?{query}", {"month": "2026-03"})
    assert response.status_code == 302
    assert response["Location"] == f"/chargeback/?{query}#focus-files"
    # Without a query string, the page without one.
    with django_capture_on_commit_callbacks(execute=True):
        plain = finance.post("/chargeback/focus/", {"month": "2026-03"})
    assert plain["Location"] == "/chargeback/#focus-files"
