"""``manage.py send_weekly_report [--to ADDRESS] [--week YYYY-Www]`` (docs/weekly-report.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.report import week_ended, weekly_report_send
from fleet.emails import recipient_error


class Command(BaseCommand):
    help = (
        "Render and send the weekly report (default: the last complete ISO week in the report "
        "time zone) to opted-in users plus WEEKLY_REPORT_RECIPIENTS, or with --to to that one "
        "address instead. Each week goes to each audience once, however often it is asked for."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--to", metavar="ADDRESS", help="Send to this address only")
        parser.add_argument("--week", metavar="YYYY-Www", help="ISO week, e.g. 2026-W45")

    def handle(self, *args: Any, **options: Any) -> None:
        to = options.get("to")
        error = recipient_error(to.strip()) if to else None
        if error is not None:
            raise CommandError(f"--to: {error}")
        try:
            week_start = week_ended(options.get("week"))
        except ValueError as exc:
            raise CommandError(f"--{exc}") from exc
        result = weekly_report_send(week_start=week_start, to=to)
        self.stdout.write(result.message)
