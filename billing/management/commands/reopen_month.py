"""``manage.py reopen_month YYYY-MM --reason TEXT [--by NAME]`` (docs/finance.md)."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.month_close import month_parse, month_reopen


class Command(BaseCommand):
    help = (
        "Reopen a closed month (admins): its figures are computed from the rollups again "
        "until the next close. The reason is required and recorded with who and when."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("month", metavar="YYYY-MM")
        parser.add_argument("--reason", required=True, help="Why (recorded)")
        parser.add_argument("--by", metavar="NAME", help="Who reopens it (default: the OS user)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = month_reopen(
                month=month_parse(options["month"]),
                by=options.get("by") or getpass.getuser(),
                reason=options["reason"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(result.message)
