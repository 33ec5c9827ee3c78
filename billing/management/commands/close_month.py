"""``manage.py close_month YYYY-MM [--by NAME]`` (docs/finance.md): freeze a month's figures."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.month_close import month_close, month_parse


class Command(BaseCommand):
    help = (
        "Close a month: from now on its figures (API, dashboard, email, FOCUS) are those of "
        "this close, whatever data arrives late; late data shows as an adjustment in the first "
        "open month. Closing a closed month changes nothing; a month that has not ended in the "
        "report time zone is refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("month", metavar="YYYY-MM")
        parser.add_argument("--by", metavar="NAME", help="Who closes it (default: the OS user)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = month_close(
                month=month_parse(options["month"]), by=options.get("by") or getpass.getuser()
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(result.message)
