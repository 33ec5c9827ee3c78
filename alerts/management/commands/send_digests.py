"""``manage.py send_digests [--week YYYY-Www]``: each workload user's weekly digest, once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from alerts.digest import digests_send
from billing.report import week_ended, week_label


class Command(BaseCommand):
    help = (
        "Send each workload user the digest of their workloads (default: the last complete ISO "
        "week in the report time zone) where the fleet file's [[people]] turns it on. Each "
        "(week, user) goes out once, however often it is asked for."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--week", metavar="YYYY-Www", help="ISO week, e.g. 2026-W45")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            week_start = week_ended(options.get("week"))
        except ValueError as exc:
            raise CommandError(f"--{exc}") from exc
        counts = digests_send(week_start=week_start)
        done = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        self.stdout.write(f"digests {week_label(week_start)}: {done or 'nobody due'}")
