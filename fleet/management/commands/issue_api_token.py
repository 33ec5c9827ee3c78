from typing import Any

from django.core.management.base import BaseCommand, CommandError

from fleet.roles import ROLES
from fleet.services import api_token_issue


class Command(BaseCommand):
    help = "Create the user if needed, put it in a role and print a new API token (shown once)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--name", default="", help="A label for the token")

    def handle(self, *args: Any, username: str, role: str, name: str, **options: Any) -> None:
        try:
            user, token = api_token_issue(username=username, role=role, name=name)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(f"API token for {user.username} ({role}); store it now, it is not kept:")
        self.stdout.write(token)
