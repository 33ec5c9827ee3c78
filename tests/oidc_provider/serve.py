"""``python -m tests.oidc_provider.serve``: migrate the provider's database, seed its client and
people, and serve it with runserver on 127.0.0.1:$OIDC_PROVIDER_PORT (process.py runs this)."""

import os


def seed() -> None:
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    from tests.oidc_provider.people import CLIENT_ID, CLIENT_SECRET, PASSWORD, PEOPLE

    for username, groups in PEOPLE.items():
        user = User.objects.create_user(
            username,
            email=f"{username}@example.com",
            password=PASSWORD,
            first_name=username.title(),
        )
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in groups])
    Application.objects.create(
        name="gpufleet",
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,  # hashed on save
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=os.environ["OIDC_PROVIDER_REDIRECT_URIS"],
        post_logout_redirect_uris=os.environ["OIDC_PROVIDER_POST_LOGOUT_URIS"],
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.oidc_provider.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    seed()
    call_command(
        "runserver",
        f"127.0.0.1:{os.environ['OIDC_PROVIDER_PORT']}",
        use_reloader=False,
        skip_checks=True,
    )


if __name__ == "__main__":
    main()
