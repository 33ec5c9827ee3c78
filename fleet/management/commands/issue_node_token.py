from typing import Any

from django.core.management.base import BaseCommand, CommandError

from fleet.services import node_token_issue


class Command(BaseCommand):
    help = "Create the node if needed and print a new token for its agent (shown only once)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("hostname")

    def handle(self, *args: Any, hostname: str, **options: Any) -> None:
        try:
            node, token = node_token_issue(hostname=hostname)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(f"Token for node {node.hostname} (store it now; it is not kept):")
        self.stdout.write(token)
