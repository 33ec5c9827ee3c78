"""Single sign-on without a provider: the role map, the start-up checks, LOCAL_LOGIN=0 and the
break-glass login link (the sign-ins themselves: tests/e2e/test_oidc.py)."""

from __future__ import annotations

import datetime as dt
import re
import socket
import sys
from html import unescape
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError

from config.oidc import (
    Refusal,
    role_for_claim,
    role_map_parse,
    sso_check,
    sso_deploy_check,
    sso_user_sync,
)
from tests.deploy.test_settings import production_env, run

DEFAULT_MAP = "gpu-admins:admin,finops:finance,*:viewer"


# --- The role map -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "role"),
    [
        (["finops"], "finance"),
        (["finops", "gpu-admins"], "admin"),  # the highest role wins, whatever the order
        (["gpu-admins", "finops"], "admin"),
        (["contractors"], "viewer"),  # `*`
        ([], "viewer"),
        (None, "viewer"),  # no claim at all
    ],
)
def test_the_highest_role_any_entry_gives_wins(claim: Any, role: str) -> None:
    assert role_for_claim(claim, role_map_parse(DEFAULT_MAP)) == role


def test_without_a_wildcard_an_unmapped_claim_gets_no_role() -> None:
    role_map = role_map_parse("gpu-admins:admin, finops:finance")
    assert role_for_claim(["contractors"], role_map) is None
    assert role_for_claim(None, role_map) is None
    # A one-string claim (an address, Google's `hd` domain) is one value.
    assert role_for_claim("finops", role_map) == "finance"


def test_a_claim_value_may_hold_colons() -> None:
    role_map = role_map_parse("urn:example:group:finops:finance")
    assert role_map == [("urn:example:group:finops", "finance")]


@pytest.mark.parametrize(
    ("text", "named"),
    [("finops:money", "'money'"), ("finops", "'finops'"), (":viewer", "':viewer'")],
)
def test_a_bad_role_map_entry_is_named(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        role_map_parse(text)


# --- Accounts from claims (the sign-ins themselves: tests/e2e/test_oidc.py) ----------------


@pytest.mark.django_db
def test_without_preferred_username_the_account_is_named_by_its_address(settings: Any) -> None:
    # Google's claims: no preferred_username, no groups; roles by address.
    settings.OIDC_ROLE_CLAIM = "email"
    settings.OIDC_ROLE_MAP = "cfo@example.com:finance,*:viewer"
    claims = {"sub": "10769150350006150715113082367", "email": "cfo@example.com"}
    user = sso_user_sync(claims={**claims, "given_name": "Carla", "family_name": "Fo"})
    assert user.username == "cfo@example.com" and (user.first_name, user.last_name) == (
        "Carla",
        "Fo",
    )
    assert list(user.groups.values_list("name", flat=True)) == ["finance"]
    other = sso_user_sync(claims={"sub": "2", "email": "dev@example.com"})
    assert list(other.groups.values_list("name", flat=True)) == ["viewer"]


@pytest.mark.django_db
def test_a_name_longer_than_django_keeps_is_refused(settings: Any) -> None:
    settings.OIDC_ROLE_MAP = DEFAULT_MAP
    refusal = sso_user_sync(claims={"sub": "1", "preferred_username": "x" * 151})
    assert isinstance(refusal, Refusal) and refusal.status == 400


@pytest.mark.django_db
def test_a_returning_person_is_found_by_sub_not_by_a_name_they_can_change(settings: Any) -> None:
    settings.OIDC_ROLE_MAP = DEFAULT_MAP
    settings.OIDC_ISSUER = "https://idp.example.com/realms/acme"
    alice = sso_user_sync(
        claims={"sub": "a-1", "preferred_username": "alice", "groups": ["finops"]}
    )
    mallory = sso_user_sync(claims={"sub": "m-2", "preferred_username": "mallory"})
    assert list(alice.groups.values_list("name", flat=True)) == ["finance"]

    # Mallory renames herself "alice" at the provider: alice's account (and her finance role)
    # stays alice's; mallory signs in as herself, and nobody new may take the name either.
    again = sso_user_sync(claims={"sub": "m-2", "preferred_username": "alice"})
    assert again.pk == mallory.pk
    taken = sso_user_sync(claims={"sub": "x-3", "preferred_username": "alice"})
    assert isinstance(taken, Refusal) and taken.title == "Another person has this name here"
    # Alice renamed at the provider keeps her account; the same sub at another issuer is
    # another person.
    assert sso_user_sync(claims={"sub": "a-1", "preferred_username": "alice.b"}).pk == alice.pk
    settings.OIDC_ISSUER = "https://other-idp.example.com"
    other = sso_user_sync(claims={"sub": "a-1", "preferred_username": "alice"})
    assert isinstance(other, Refusal)


# --- Start-up checks --------------------------------------------------------------------------


@pytest.fixture
def sso_settings(settings: Any) -> Any:
    settings.OIDC_ISSUER = "https://login.example.com/realms/main"
    settings.OIDC_CLIENT_ID = "gpufleet"
    settings.OIDC_CLIENT_SECRET = "s3cret"
    settings.OIDC_SCOPES = "openid email profile"
    settings.OIDC_ROLE_CLAIM = "groups"
    settings.OIDC_ROLE_MAP = DEFAULT_MAP
    settings.LOCAL_LOGIN = True
    return settings


def test_a_complete_configuration_passes(sso_settings: Any) -> None:
    assert sso_check() == [] and sso_deploy_check() == []


@pytest.mark.parametrize(
    ("setting", "value", "check_id", "named"),
    [
        ("OIDC_CLIENT_ID", "", "sso.E004", "OIDC_CLIENT_ID"),
        ("OIDC_CLIENT_SECRET", "", "sso.E005", "OIDC_CLIENT_SECRET_FILE"),
        ("OIDC_ISSUER", "login.example.com", "sso.E003", "OIDC_ISSUER"),
        ("OIDC_SCOPES", "email profile", "sso.E006", "OIDC_SCOPES"),
        ("OIDC_ROLE_CLAIM", "", "sso.E007", "OIDC_ROLE_CLAIM"),
        ("OIDC_ROLE_MAP", "finops:cfo", "sso.E008", "OIDC_ROLE_MAP"),
        ("OIDC_ROLE_MAP", " , ", "sso.E008", "OIDC_ROLE_MAP"),
    ],
)
def test_each_misconfiguration_names_its_setting(
    sso_settings: Any, setting: str, value: str, check_id: str, named: str
) -> None:
    setattr(sso_settings, setting, value)
    messages = sso_check()
    assert [m.id for m in messages] == [check_id]
    assert named in messages[0].msg


def test_local_login_off_needs_single_sign_on(settings: Any) -> None:
    settings.OIDC_ISSUER = ""
    settings.OIDC_CLIENT_ID = ""
    settings.LOCAL_LOGIN = False
    messages = sso_check()
    assert [m.id for m in messages] == ["sso.E001"] and "LOCAL_LOGIN" in messages[0].msg


def test_a_plain_http_issuer_is_a_deploy_warning_except_on_loopback(sso_settings: Any) -> None:
    sso_settings.OIDC_ISSUER = "http://login.example.com/realms/main"
    assert [m.id for m in sso_deploy_check()] == ["sso.W001"]
    sso_settings.OIDC_ISSUER = "http://127.0.0.1:8080/o"
    assert sso_deploy_check() == []


def test_check_deploy_names_the_missing_secret_at_start_up() -> None:
    # The real start-up path: production settings from the environment, in a subprocess.
    result = run(
        [sys.executable, "manage.py", "check", "--deploy"],
        production_env(
            OIDC_ISSUER="https://login.example.com/realms/main", OIDC_CLIENT_ID="gpufleet"
        ),
    )
    assert result.returncode != 0
    assert "sso.E005" in result.stderr and "OIDC_CLIENT_SECRET_FILE" in result.stderr


def test_an_unreadable_secret_file_is_named_at_start_up(tmp_path: Any) -> None:
    result = run(
        [sys.executable, "manage.py", "check"],
        production_env(
            OIDC_ISSUER="https://login.example.com/realms/main",
            OIDC_CLIENT_ID="gpufleet",
            OIDC_CLIENT_SECRET_FILE=str(tmp_path / "missing"),
        ),
    )
    assert result.returncode != 0
    assert "OIDC_CLIENT_SECRET_FILE: cannot read it" in result.stderr


# --- Pages without a provider -----------------------------------------------------------------


@pytest.mark.django_db
def test_single_sign_on_pages_are_absent_while_unconfigured(client: Any, settings: Any) -> None:
    settings.OIDC_ISSUER = ""
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page


@pytest.mark.django_db
def test_a_provider_that_does_not_answer_gets_a_page_naming_the_issuer(
    client: Any, sso_settings: Any
) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sso_settings.OIDC_ISSUER = f"http://127.0.0.1:{port}/o"
    response = client.get("/oidc/authenticate/")
    assert response.status_code == 502
    page = unescape(response.content.decode())
    assert "OIDC_ISSUER" in page and f"127.0.0.1:{port}/o/.well-known/openid-configuration" in page


@pytest.mark.django_db
def test_local_login_off_hides_the_form_and_refuses_passwords(
    client: Any, sso_settings: Any, make_user: Any
) -> None:
    sso_settings.LOCAL_LOGIN = False
    sso_settings.OIDC_PROVIDER_NAME = "Okta"
    make_user("admin", username="root", password="pw-Secret-123")
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Okta" in page and 'name="password"' not in page
    for url in ("/accounts/login/", "/admin/login/"):
        response = client.post(url, {"username": "root", "password": "pw-Secret-123"})
        assert response.status_code == 200  # the form again, with the reason
        assert "Password login is switched off here" in unescape(response.content.decode())
        assert "_auth_user_id" not in client.session
    # Back on: the same password works.
    sso_settings.LOCAL_LOGIN = True
    response = client.post("/accounts/login/", {"username": "root", "password": "pw-Secret-123"})
    assert response.status_code == 302 and "_auth_user_id" in client.session


# --- Break-glass: manage.py login_link --------------------------------------------------------


def login_link(username: str) -> str:
    out = StringIO()
    call_command("login_link", username, stdout=out, stderr=StringIO())
    return out.getvalue().strip().splitlines()[-1]


@pytest.mark.django_db
def test_a_login_link_signs_in_once_with_local_login_off(
    client: Any, sso_settings: Any, make_user: Any
) -> None:
    sso_settings.LOCAL_LOGIN = False
    sso_settings.SITE_URL = "https://gpufleet.example.com"
    root = make_user("admin", username="root")
    url = login_link("root")
    assert url.startswith("https://gpufleet.example.com/accounts/login-link/")
    path = url.removeprefix("https://gpufleet.example.com")
    # Opening it (a link preview does) signs nobody in and uses nothing up.
    assert "Sign in as root" in client.get(path).content.decode()
    assert client.get(path).status_code == 200 and "_auth_user_id" not in client.session
    response = client.post(path)
    assert response.status_code == 302 and client.session["_auth_user_id"] == str(root.pk)
    client.logout()
    # Once only.
    assert client.post(path).status_code == 403 and "_auth_user_id" not in client.session
    assert client.get(path).status_code == 403


@pytest.mark.django_db
def test_a_login_link_expires_after_15_minutes(client: Any, make_user: Any) -> None:
    make_user("admin", username="root")
    start = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)
    with time_machine.travel(start, tick=False):
        path = "/" + login_link("root").split("/", 3)[3]
    with time_machine.travel(start + dt.timedelta(minutes=14), tick=False):
        assert client.get(path).status_code == 200
    with time_machine.travel(start + dt.timedelta(minutes=16), tick=False):
        assert client.post(path).status_code == 403 and "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_a_tampered_login_link_or_unknown_user_is_refused(client: Any, make_user: Any) -> None:
    make_user("viewer", username="vera")
    path = "/" + login_link("vera").split("/", 3)[3]
    spoiled = path.replace("/accounts/login-link/", "/accounts/login-link/x")
    assert client.post(spoiled).status_code == 403
    with pytest.raises(CommandError, match="no user 'nobody'"):
        login_link("nobody")
