"""``python manage.py rollup [--all] [--max-hours N]``: bring the hourly rollups up to date."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from tqdm import tqdm

from telemetry.models import RollupPending
from telemetry.rollup import daily_usage_rebuild, rollup_backfill_mark, rollup_run


class Command(BaseCommand):
    help = (
        "Recompute every hour marked out of date (what the periodic task does, late data "
        "included), synchronously; waits for a rollup that is running. --all first re-marks "
        "every hour that has samples (a backfill). Prints the result on its last line."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--all",
            action="store_true",
            help="Re-mark and recompute every hour with samples or rollups (since the "
            "raw-retention horizon), e.g. after the active threshold changed.",
        )
        parser.add_argument("--max-hours", type=int, default=None, help="Stop after N hours.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["all"]:
            marked = rollup_backfill_mark()
            self.stderr.write(f"marked {marked} hours")
            total = RollupPending.objects.count()
            if options["max_hours"] is not None:
                total = min(total, options["max_hours"])
            # tqdm draws on the real stderr: it rewrites its line with \r, which the
            # command's line-ending OutputWrapper would break.
            with tqdm(total=total, unit="h", desc="rollup", file=sys.stderr) as bar:
                result = rollup_run(max_hours=options["max_hours"], wait=True, on_batch=bar.update)
            # --all also rebuilds the daily pre-aggregate wholesale, in the report time zone.
            daily = daily_usage_rebuild()
            self.stderr.write(f"daily usage rebuilt: {daily} rows")
        else:
            result = rollup_run(max_hours=options["max_hours"], wait=True)
        self.stdout.write(str(result))
