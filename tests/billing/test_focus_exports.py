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
