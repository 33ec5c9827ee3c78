"""``fleet_apply FILE``: lives in billing because a fleet file also sets cost profiles, and
billing may depend on fleet but not the other way round."""

import tomllib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from billing.services import cost_profiles_apply
from fleet.services import FleetFileError, fleet_file_apply


class Command(BaseCommand):
    help = "Apply a fleet file (TOML): sites, teams, pools, nodes, GPUs and cost profiles."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, file: Path, **options: Any) -> None:
        try:
            document = tomllib.loads(file.read_text())
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise CommandError(f"{file}: not valid TOML: {exc}") from exc
        try:
            with transaction.atomic():
                result = fleet_file_apply(document=document)
                cost_profiles_apply(rows=document.get("cost_profiles", []), result=result)
                if result.gpus_window_changed:
                    from telemetry.services import gpu_hours_invalidate

                    gpu_hours_invalidate(gpu_ids=result.gpus_window_changed)
                # The daily pre-aggregate holds local days of the report time zone: a new
                # zone rebuilds it, in this transaction, so no page sees the old days.
                from telemetry.rollup import daily_usage_ensure

                daily_usage_ensure()
        except FleetFileError as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"applied {file}: {result.summary()}")
