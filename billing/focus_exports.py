"""FOCUS files of whole months, built by a Celery task (docs/finance.md).

Finance asks for a month on the Teams and pools page; a worker writes the file (gzip CSV,
the same rows as ``GET /api/v1/focus`` for that month) into ``FocusExport`` so any web
process can serve it. A request for a month and version already built rebuilds it. The
claim from pending to running is a compare-and-swap, so a redelivered task builds once.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import logging

from django.db import transaction
from django.utils import timezone

from billing import focus
from billing.api.csv import csv_stream
from billing.models import FocusExport
from billing.selectors.calendar import month_after

logger = logging.getLogger(__name__)


def focus_export_request(*, month: dt.date, version: str, by: str) -> FocusExport:
    """Queue (or re-queue) the file of ``month`` (its first day) in ``version``."""
    if version not in focus.VERSIONS:
        raise ValueError(f"version: must be one of {', '.join(focus.VERSIONS)}")
    export, _ = FocusExport.objects.update_or_create(
        month=month.replace(day=1),
        version=version,
        defaults={
            "state": FocusExport.PENDING,
            "requested_by": by,
            "requested_at": timezone.now(),
            "finished_at": None,
            "rows": 0,
            "content": b"",
            "error": "",
        },
    )
    from billing.tasks import focus_export_task

    pk = export.pk

    def dispatch() -> None:
        try:
            focus_export_task.delay(pk)
        except Exception:  # the broker away: the row stays pending; asking again re-sends
            logger.warning("FOCUS export %s not dispatched; it stays pending", pk)

    # After the commit, so the worker finds the row; without a broker it runs here.
    transaction.on_commit(dispatch)
    return export


def focus_export_build(*, export_id: int) -> str:
    """Build one requested file; returns what happened (the task's result)."""
    claimed = FocusExport.objects.filter(pk=export_id, state=FocusExport.PENDING).update(
        state=FocusExport.RUNNING
    )
    if not claimed:
        return f"export {export_id}: not pending (built or building elsewhere)"
    export = FocusExport.objects.get(pk=export_id)
    buffer = io.BytesIO()
    count = 0
    try:
        charges = focus.focus_charges(start=export.month, end=month_after(export.month))
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as out:
            for line in csv_stream(
                (focus.focus_row(c, version=export.version) for c in charges),
                columns=focus.COLUMNS[export.version],
                text_columns=focus.TEXT_COLUMNS,
            ):
                out.write(line.encode())
                count += 1
    except Exception as exc:  # recorded for the page; the task does not retry a bad month
        logger.exception("FOCUS export %s failed", export_id)
        FocusExport.objects.filter(pk=export_id).update(
            state=FocusExport.FAILED, error=str(exc)[:2000], finished_at=timezone.now()
        )
        return f"export {export_id}: failed: {exc}"
    FocusExport.objects.filter(pk=export_id).update(
        state=FocusExport.DONE,
        content=buffer.getvalue(),
        rows=count - 1,  # less the header
        finished_at=timezone.now(),
    )
    return f"export {export_id}: {count - 1} rows"


def focus_export_filename(export: FocusExport) -> str:
    return f"focus-{export.version}_{export.month:%Y-%m}.csv.gz"
