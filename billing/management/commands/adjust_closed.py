"""``manage.py adjust_closed [--all]`` (docs/finance.md): book late data for closed months now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from billing.month_close import adjust_closed


class Command(BaseCommand):
    help = (
        "Book the late data of the closed months marked stale as adjustment rows in the first "
        "open month (what the task does every 5 minutes). --all: check every closed month, "
        "marked or not (after a change made with SQL, which nothing marks)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--all", action="store_true", help="every closed month, not only those marked stale"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(adjust_closed(every=options["all"]).message)
