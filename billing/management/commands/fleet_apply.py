"""``fleet_apply FILE``: lives in billing because a fleet file also sets cost profiles, and
billing may depend on fleet but not the other way round."""

import tomllib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from billing.services import fleet_document_apply
from fleet.services import FleetFileError


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
            result = fleet_document_apply(document=document)
        except FleetFileError as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"applied {file}: {result.summary()}")
