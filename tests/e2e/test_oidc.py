"""Single sign-on against a real OpenID Connect provider (DESIGN.md §9.6).

django-oauth-toolkit runs in its own process on loopback (tests/oidc_provider/): its own SQLite
database, an RSA key made for this run, a confidential client, a ``groups`` claim. The product
signs people in through it: over HTTP with Django's test client (the provider's side with
requests), and once in Chromium through the provider's form.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model

from tests.e2e.conftest import screenshot_path
from tests.oidc_provider.people import PASSWORD
from tests.oidc_provider.process import REQUEST_TIMEOUT_S, Provider, provider_running

pytestmark = pytest.mark.e2e

TEST_SERVER = "http://testserver"
CALLBACK = "/oidc/callback/"
PROVIDER_NAME = "Test IdP"


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    with provider_running(
        tmp_path_factory.mktemp("oidc-provider"),
        redirect_uris=[f"{TEST_SERVER}{CALLBACK}"],
        post_logout_uris=[f"{TEST_SERVER}/accounts/login/"],
    ) as running:
        yield running


@pytest.fixture
def sso(settings: Any, provider: Provider) -> Iterator[Provider]:
    """The product configured for the provider, with the default role map."""
    settings.OIDC_ISSUER = provider.issuer
    settings.OIDC_CLIENT_ID = provider.client_id
    settings.OIDC_CLIENT_SECRET = provider.client_secret
    settings.OIDC_ROLE_CLAIM = "groups"
    settings.OIDC_ROLE_MAP = "gpu-admins:admin,finops:finance,*:viewer"
    settings.OIDC_PROVIDER_NAME = PROVIDER_NAME
    settings.LOCAL_LOGIN = True
    yield provider
    provider.tamper("")


def provider_sign_in(client: Any, username: str) -> str:
    """Start single sign-on at the product (test client), sign in at the provider (requests),
    and return the product URL (path and query) the provider sends the browser back to."""
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302, start.content[:500]
    idp = requests.Session()
    form = idp.get(start["Location"], timeout=REQUEST_TIMEOUT_S)  # → its login form
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert token, form.text[:500]
    answer = idp.post(
        form.url,
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token[1]},
        allow_redirects=False,
        timeout=REQUEST_TIMEOUT_S,
    )
    while answer.is_redirect:
        location = urljoin(answer.url, answer.headers["Location"])
        if location.startswith(TEST_SERVER):
            return location[len(TEST_SERVER) :]
        answer = idp.get(location, allow_redirects=False, timeout=REQUEST_TIMEOUT_S)
    raise AssertionError(f"the provider did not send the browser back: {answer.text[:500]}")


def signed_in_user(client: Any) -> Any:
    """The user the client's session belongs to (None when anonymous)."""
    user_id = client.session.get("_auth_user_id")
    return get_user_model().objects.filter(pk=user_id).first() if user_id else None


def role_of(user: Any) -> list[str]:
    return sorted(user.groups.values_list("name", flat=True))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("username", "role", "superuser"),
    [("alice", "admin", True), ("frank", "finance", False), ("vera", "viewer", False)],
)
def test_first_sign_in_creates_the_user_with_the_role_its_groups_give(
    client: Any, sso: Provider, username: str, role: str, superuser: bool
) -> None:
    assert not get_user_model().objects.filter(username=username).exists()
    response = client.get(provider_sign_in(client, username))
    assert response.status_code == 302 and response["Location"] == "/"
    user = signed_in_user(client)
    assert user.username == username and user.email == f"{username}@example.com"
    assert role_of(user) == [role] and user.is_superuser is superuser
    # Created for the provider: no password to guess here.
    assert not user.has_usable_password()
    assert client.get("/").status_code == 200


@pytest.mark.django_db
def test_a_switched_off_account_loses_its_open_session(client: Any, sso: Provider) -> None:
    client.get(provider_sign_in(client, "vera"))
    vera = signed_in_user(client)
    assert client.get("/").status_code == 200
    vera.is_active = False
    vera.save(update_fields=["is_active"])
    assert client.get("/").status_code == 302  # to the login page
    # Nor can it sign in again.
    response = client.get(provider_sign_in(client, "vera"))
    assert response.status_code == 403
    assert "Account switched off" in unescape(response.content.decode())
    assert client.get("/").status_code == 302


@pytest.mark.django_db
def test_roles_follow_the_provider_at_the_next_sign_in(client: Any, sso: Provider) -> None:
    client.get(provider_sign_in(client, "frank"))
    frank = signed_in_user(client)
    assert role_of(frank) == ["finance"]
    assert client.get("/breakeven/").status_code == 200
    try:
        sso.groups_set("frank", [])  # removed from finops at the provider
        client.logout()
        client.get(provider_sign_in(client, "frank"))
        assert role_of(signed_in_user(client)) == ["viewer"]  # `*:viewer`
        assert client.get("/breakeven/").status_code == 403
    finally:
        sso.groups_set("frank", ["finops"])


@pytest.mark.django_db
def test_a_claim_that_maps_to_no_role_gives_no_access_and_a_clear_page(
    client: Any, settings: Any, sso: Provider
) -> None:
    settings.OIDC_ROLE_MAP = "gpu-admins:admin,finops:finance"  # no `*`
    response = client.get(provider_sign_in(client, "carl"))
    assert response.status_code == 403
    page = unescape(response.content.decode())
    assert "No role for you here" in page and "contractors" in page
    assert signed_in_user(client) is None
    assert not get_user_model().objects.filter(username="carl").exists()
    # Someone who had a role loses it when the provider's groups no longer give one.
    client.get(provider_sign_in(client, "frank"))
    frank = signed_in_user(client)
    assert role_of(frank) == ["finance"]
    client.logout()
    try:
        sso.groups_set("frank", ["contractors"])
        assert client.get(provider_sign_in(client, "frank")).status_code == 403
        frank.refresh_from_db()
        assert role_of(frank) == [] and signed_in_user(client) is None
    finally:
        sso.groups_set("frank", ["finops"])


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("audience", "Audience doesn't match"),
        ("expired", "Signature has expired"),
        ("signature", "Signature verification failed"),
        ("issuer", "Invalid issuer"),
    ],
)
def test_a_spoiled_id_token_is_refused(client: Any, sso: Provider, mode: str, reason: str) -> None:
    sso.tamper(mode)
    response = client.get(provider_sign_in(client, "alice"))
    assert response.status_code == 400
    page = unescape(response.content.decode())
    assert "Sign-in refused" in page and reason in page
    assert signed_in_user(client) is None
    assert not get_user_model().objects.filter(username="alice").exists()


@pytest.mark.django_db
def test_a_replayed_state_is_refused(client: Any, sso: Provider) -> None:
    callback = provider_sign_in(client, "vera")
    assert client.get(callback).status_code == 302
    assert signed_in_user(client).username == "vera"
    # The same answer again, in the browser that used it: its state is spent.
    replay = client.get(callback)
    assert replay.status_code == 400
    assert "Sign-in refused" in unescape(replay.content.decode())
    # And in another browser, which never started a sign-in: nobody is signed in.
    client.logout()
    other = client.get(callback)
    assert other.status_code == 403 and signed_in_user(client) is None


@pytest.mark.django_db
def test_a_local_account_with_a_password_is_not_taken_over(
    client: Any, sso: Provider, make_user: Any
) -> None:
    local = make_user("viewer", username="alice")
    response = client.get(provider_sign_in(client, "alice"))
    assert response.status_code == 403
    assert "A local account has this name" in unescape(response.content.decode())
    local.refresh_from_db()
    assert role_of(local) == ["viewer"] and not local.is_superuser  # not made admin


@pytest.mark.django_db
def test_logout_signs_out_at_the_provider_too(client: Any, sso: Provider) -> None:
    client.get(provider_sign_in(client, "vera"))
    id_token = client.session["oidc_id_token"]
    response = client.post("/accounts/logout/")
    assert response.status_code == 200 and signed_in_user(client) is None
    target = re.search(r'http-equiv="refresh" content="0;url=([^"]+)"', response.content.decode())
    assert target
    url = unescape(target[1])
    assert url.startswith(f"{sso.issuer}/logout/")
    query = parse_qs(urlsplit(url).query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == [f"{TEST_SERVER}/accounts/login/"]
    # The provider accepts it and sends the browser back to our login page.
    back = requests.get(url, allow_redirects=False, timeout=REQUEST_TIMEOUT_S)
    assert back.status_code == 302
    assert back.headers["Location"] == f"{TEST_SERVER}/accounts/login/"


@pytest.mark.django_db
def test_api_tokens_are_unchanged(client: Any, sso: Provider) -> None:
    from fleet.services import api_token_issue

    _user, token = api_token_issue(username="ci-bot", role="finance", name="ci")
    response = client.get("/api/v1/costs", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200


# --- In the browser ---------------------------------------------------------------------------


@pytest.fixture
def sso_live(sso: Provider, live_server: Any) -> Provider:
    sso.client_set(
        redirect_uris=[f"{TEST_SERVER}{CALLBACK}", f"{live_server.url}{CALLBACK}"],
        post_logout_uris=[f"{TEST_SERVER}/accounts/login/", f"{live_server.url}/accounts/login/"],
    )
    return sso


def browser_sign_in(page: Any, base: str, username: str, *, start: str) -> None:
    """From ``start`` (a page that needs a login) through our login page and the provider's
    form back to ``start``."""
    page.goto(f"{base}{start}")
    page.click("#sso-login")
    page.wait_for_url(re.compile(r"http://127\.0\.0\.1:\d+/accounts/login/"))
    page.fill("#idp-username", username)
    page.fill("#idp-password", PASSWORD)
    page.click("#idp-submit")
    page.wait_for_url(f"{base}{start}")


def test_browser_signs_in_per_role_and_follows_a_role_change(
    page: Any, problems: Any, live_server: Any, sso_live: Provider, transactional_db: Any
) -> None:
    base = live_server.url
    try:
        page.goto(f"{base}/accounts/login/")
        page.screenshot(path=str(screenshot_path("login-sso")))
        # A viewer: the fleet pages, but no money page.
        browser_sign_in(page, base, "vera", start="/")
        assert page.locator(".usermenu .who").inner_text() == "vera"
        response = page.goto(f"{base}/breakeven/")
        assert response.status == 403
        assert page.locator("#forbidden").is_visible()
        # The browser logs the expected 403 as a failed resource load: that one is wanted.
        problems.console_errors = [e for e in problems.console_errors if "403" not in e]

        # Log out: here, then at the provider, then back on our login page.
        page.locator(".usermenu summary").click()
        page.locator("form.logout button").click()
        page.wait_for_url(f"{base}/accounts/login/")

        # Moved to finops at the provider: finance at the next sign-in. The provider asks for
        # the password again, which proves the logout reached it.
        sso_live.groups_set("vera", ["finops"])
        browser_sign_in(page, base, "vera", start="/breakeven/")
        # The break-even page (money): "Own or API?" or "Rent or API?".
        assert page.locator("h1", has_text=re.compile(r"or API\?")).is_visible()
        assert role_of(get_user_model().objects.get(username="vera")) == ["finance"]
        assert page.goto(f"{base}/breakeven/").status == 200
    finally:
        sso_live.groups_set("vera", [])
