"""FOCUS files of whole months, built by a Celery task (docs/finance.md).

Finance asks for a month on the Teams and pools page; a worker writes the file (gzip CSV,
the same rows as ``GET /api/v1/focus`` for that month) into ``FocusExport`` so any web
process can serve it. A request for a month and version already built rebuilds it. The
claim from pending to running is a compare-and-swap, so a redelivered task builds once.

A month that has not ended (report time zone) when its file is built gives the month so far:
the file is marked ``partial``, on the page and in its name, and a month not begun yet is
refused.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from billing import focus
from billing.api.csv import csv_stream
from billing.models import FocusExport
from billing.month_close import month_has_ended
from billing.selectors.calendar import month_after
from fleet.models import FleetSettings

logger = logging.getLogger(__name__)


def focus_export_request(*, month: dt.date, version: str, by: str) -> FocusExport:
    """Queue (or re-queue) the file of ``month`` (its first day) in ``version``. Raises
    ValueError naming ``version``, or ``month`` for a month that has not begun."""
    if version not in focus.VERSIONS:
        raise ValueError(f"version: must be one of {', '.join(focus.VERSIONS)}")
    month = month.replace(day=1)
    zone = FleetSettings.load().report_zone
    if month > timezone.now().astimezone(zone).date():
        raise ValueError(f"month: {month:%Y-%m} has not begun in the report time zone")
    export, _ = FocusExport.objects.update_or_create(
        month=month,
        version=version,
        defaults={
            "state": FocusExport.PENDING,
            "requested_by": by,
            "requested_at": timezone.now(),
            "finished_at": None,
            "rows": 0,
            "partial": False,
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
    # The rows run to now: before the month ends they are the month so far.
    now = timezone.now()
    partial = not month_has_ended(
        month=export.month, zone=FleetSettings.load().report_zone, now=now
    )
    try:
        charges = focus.focus_charges(start=export.month, end=month_after(export.month), now=now)
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as out:
            for line in csv_stream(
                (focus.focus_row(c, version=export.version) for c in charges),
                columns=focus.COLUMNS[export.version],
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
        partial=partial,
        finished_at=timezone.now(),
    )
    return f"export {export_id}: {count - 1} rows{' (partial month)' if partial else ''}"


@dataclass(frozen=True)
class FocusMonth:
    """A month the page offers to build."""

    value: str  # "2026-03"
    label: str  # the value, and for the month in progress that its file will be partial
    selected: bool  # the default: the last complete month


def focus_export_months(*, count: int = 13, now: dt.datetime | None = None) -> list[FocusMonth]:
    """The ``count`` months the page offers, newest first: the month in progress (report time
    zone), labelled partial, then those before it; the last complete month is the default,
    so a file for the month in progress is built only when asked for."""
    today = (now or timezone.now()).astimezone(FleetSettings.load().report_zone).date()
    months = [today.replace(day=1)]
    while len(months) < count:
        months.append((months[-1] - dt.timedelta(days=1)).replace(day=1))
    return [
        FocusMonth(
            value=f"{month:%Y-%m}",
            label=f"{month:%Y-%m} (in progress: partial)" if i == 0 else f"{month:%Y-%m}",
            selected=i == 1,
        )
        for i, month in enumerate(months)
    ]


def focus_export_filename(export: FocusExport) -> str:
    """``focus-1.2_2026-03.csv.gz``; a month built before it ended
    ``focus-1.2_2026-04-partial.csv.gz``, so the file says so wherever it is saved."""
    partial = "-partial" if export.partial else ""
    return f"focus-{export.version}_{export.month:%Y-%m}{partial}.csv.gz"
