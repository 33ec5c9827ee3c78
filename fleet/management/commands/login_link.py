from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from config.auth import LOGIN_LINK_MAX_AGE_S, login_link_url


class Command(BaseCommand):
    help = (
        "Break-glass: print a link that signs USERNAME in once, within "
        f"{LOGIN_LINK_MAX_AGE_S // 60} minutes, whatever LOCAL_LOGIN says and while the "
        "identity provider is down (docs/deploy.md, 'Single sign-on (OIDC)')."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(
                f"no user {username!r} (create one: manage.py createsuperuser, or sign in once "
                "with single sign-on)"
            )
        if not user.is_active:
            raise CommandError(f"user {username!r} is not active")
        self.stderr.write(
            f"One-time login link for {username}, valid {LOGIN_LINK_MAX_AGE_S // 60} minutes "
            "(open it in a browser; it is not kept):"
        )
        self.stdout.write(login_link_url(user=user))
