from typing import Any

from django.core.management.base import BaseCommand, CommandError

from fleet.services import token_revoke


class Command(BaseCommand):
    help = "Revoke a node or API token by its visible prefix (gfn_xxxxxxxx or gfa_xxxxxxxx)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("prefix")

    def handle(self, *args: Any, prefix: str, **options: Any) -> None:
        try:
            self.stdout.write(token_revoke(prefix=prefix))
        except LookupError as exc:
            raise CommandError(str(exc)) from exc
