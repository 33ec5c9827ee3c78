"""Single sign-on with OpenID Connect (DESIGN.md §9.6; docs/deploy.md "Single sign-on (OIDC)").

mozilla-django-oidc runs the authorization code flow (with PKCE and a nonce); this module adds
what it leaves to the site:

- Endpoints from the provider's discovery document (``<OIDC_ISSUER>/.well-known/openid-
  configuration``), read at the first sign-in and again after ``DISCOVERY_TTL_S``, never at
  start-up: a process starts (and migrates) while the provider is away, and a provider that
  moves its endpoints or keys is followed without a restart.
- The ID token's checks mozilla-django-oidc skips: RS256 only, signed by a key of the
  provider's JWKS, ``aud`` our client id, ``iss`` the issuer, ``exp`` in the future. A token
  that fails one is refused with a page, never a server error.
- Users by their ``preferred_username`` (else ``email``, else ``sub``), created at their first
  sign-in; their role from ``OIDC_ROLE_CLAIM`` through ``OIDC_ROLE_MAP`` at every sign-in, the
  highest role any entry gives. A claim that maps to no role signs nobody in and says why.
- Sign-out at the provider (its ``end_session_endpoint``) when it has one.

Settings (config/settings, from the environment): ``OIDC_ISSUER`` (unset: no single sign-on),
``OIDC_CLIENT_ID``, ``OIDC_CLIENT_SECRET`` (or ``OIDC_CLIENT_SECRET_FILE``), ``OIDC_SCOPES``,
``OIDC_ROLE_CLAIM``, ``OIDC_ROLE_MAP``, ``OIDC_PROVIDER_NAME`` and ``LOCAL_LOGIN``
(config/auth.py). Misconfiguration is a system check error naming the setting (``sso_check``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.generic import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from fleet.models import SsoIdentity
from fleet.roles import ROLES, role_assign, role_clear

logger = logging.getLogger(__name__)

# The four providers docs/deploy.md covers sign ID tokens with RS256 by default; HS256 would
# make the client secret a signing key that anyone holding it could forge tokens with.
SIGN_ALGO = "RS256"
# Clocks of the provider and this server may differ by this much when exp and iat are checked.
CLOCK_SKEW_S = 60
# How long one reading of the discovery document is used before it is read again.
DISCOVERY_TTL_S = 3600
# Each call to the provider (discovery, token, JWKS, userinfo) gives up after this long.
PROVIDER_TIMEOUT_S = 10
# Claims tried in turn for a user's name: the provider's login name, else the address, else
# the provider's opaque subject id (Google sends no preferred_username).
USERNAME_CLAIMS = ("preferred_username", "email", "sub")
USERNAME_MAX_LENGTH = 150  # django.contrib.auth's User.username
# The user's fields kept in step with the provider at every sign-in, from these claims; cut to
# the shortest of those fields (first_name, 150).
NAME_CLAIMS = {"email": "email", "first_name": "given_name", "last_name": "family_name"}
USER_FIELD_MAX_LENGTH = 150
# ROLES run from the least to the most permitted (each role has every permission of the one
# before it), so "the highest role wins" is the one latest in ROLES.
ROLE_RANK = {role: rank for rank, role in enumerate(ROLES)}
WILDCARD = "*"
REQUIRED_METADATA = ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri")


def sso_enabled() -> bool:
    return bool(getattr(settings, "OIDC_ISSUER", ""))


# --- Role map ---------------------------------------------------------------------------------


def role_map_parse(text: str) -> list[tuple[str, str]]:
    """``OIDC_ROLE_MAP`` (``value:role,value:role,*:role``) as (claim value, role) pairs.

    The role follows the last colon, so a claim value may hold colons (a URN). Raises
    ValueError naming the bad entry."""
    pairs = []
    for entry in (item.strip() for item in text.split(",")):
        if not entry:
            continue
        value, sep, role = (part.strip() for part in entry.rpartition(":"))
        if not sep or not value:
            raise ValueError(f"{entry!r} is not claim-value:role")
        if role not in ROLE_RANK:
            raise ValueError(f"{entry!r} names the role {role!r}; roles: {', '.join(ROLES)}")
        pairs.append((value, role))
    return pairs


def claim_values(claim: Any) -> list[str]:
    """A claim as a list of strings: providers send groups as a list, an e-mail or a domain
    (the role claim for Google) as one string, and nothing when the user has none."""
    if claim is None:
        return []
    if isinstance(claim, (list, tuple, set)):
        return [str(item) for item in claim]
    return [str(claim)]


def role_for_claim(claim: Any, role_map: list[tuple[str, str]]) -> str | None:
    """The highest role any entry of ``role_map`` gives for the claim's values (``*`` gives
    its role to everyone who signs in); None when no entry matches."""
    values = set(claim_values(claim))
    matched = [role for value, role in role_map if value == WILDCARD or value in values]
    return max(matched, key=ROLE_RANK.__getitem__, default=None)


# --- Discovery --------------------------------------------------------------------------------


class ProviderUnavailable(Exception):
    """The discovery document could not be read, or does not describe ``OIDC_ISSUER``."""


_metadata: dict[str, tuple[float, dict[str, Any]]] = {}
_metadata_lock = threading.Lock()


def provider_metadata() -> dict[str, Any]:
    """The provider's discovery document (cached per process for ``DISCOVERY_TTL_S``)."""
    issuer = settings.OIDC_ISSUER.rstrip("/")
    with _metadata_lock:
        cached = _metadata.get(issuer)
    if cached and time.monotonic() - cached[0] < DISCOVERY_TTL_S:
        return cached[1]
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=PROVIDER_TIMEOUT_S)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"OIDC_ISSUER: could not read {url} ({exc})") from exc
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"OIDC_ISSUER: {url} is no discovery document")
    missing = [name for name in REQUIRED_METADATA if not document.get(name)]
    if missing:
        raise ProviderUnavailable(f"OIDC_ISSUER: {url} lacks {', '.join(missing)}")
    # OpenID Connect Discovery §4.3: the document must name the issuer it was asked for, or
    # tokens another issuer signed could pass for this one's.
    if str(document["issuer"]).rstrip("/") != issuer:
        raise ProviderUnavailable(
            f"OIDC_ISSUER: {url} names the issuer {document['issuer']!r}, not {issuer!r}"
        )
    with _metadata_lock:
        _metadata[issuer] = (time.monotonic(), document)
    return document


# mozilla-django-oidc reads its configuration by these names; here they come from discovery,
# from our own settings, or are fixed.
_FROM_METADATA = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
_FROM_SETTINGS = {
    "OIDC_RP_CLIENT_ID": "OIDC_CLIENT_ID",
    "OIDC_RP_CLIENT_SECRET": "OIDC_CLIENT_SECRET",
    "OIDC_RP_SCOPES": "OIDC_SCOPES",
}
_FIXED: dict[str, Any] = {
    "OIDC_RP_SIGN_ALGO": SIGN_ALGO,
    "OIDC_RP_IDP_SIGN_KEY": None,  # keys come from the provider's JWKS
    "OIDC_ALLOW_UNSECURED_JWT": False,
    "OIDC_USE_NONCE": True,
    "OIDC_USE_PKCE": True,
    "OIDC_STORE_ID_TOKEN": True,  # the id_token_hint of the sign-out at the provider
    "OIDC_STORE_ACCESS_TOKEN": False,
    "OIDC_CREATE_USER": True,
    "OIDC_TIMEOUT": PROVIDER_TIMEOUT_S,
    "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_authentication_callback",
}


def oidc_setting(name: str, *default: Any) -> Any:
    """mozilla-django-oidc's ``get_settings``, answered from this module's sources."""
    if name in _FIXED:
        return _FIXED[name]
    if name in _FROM_SETTINGS:
        return getattr(settings, _FROM_SETTINGS[name])
    if name in _FROM_METADATA:
        return provider_metadata().get(_FROM_METADATA[name])
    return import_from_settings(name, *default)


class _Setting:
    """An attribute mozilla-django-oidc reads from ``self``, looked up when read: its classes
    copy settings in ``__init__``, which here would read the discovery document whenever
    Django makes a backend (to load the user of every request with a session)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return oidc_setting(self.name)


# --- Refusals ---------------------------------------------------------------------------------


@dataclass
class Refusal:
    """Why a sign-in was refused, as the page tells it."""

    title: str
    why: str
    status: int = 403
    facts: dict[str, str] = field(default_factory=dict)


def refuse(request: HttpRequest, refusal: Refusal) -> None:
    """Note on the request why the backend signs nobody in (the callback view shows it)."""
    request.sso_refusal = refusal  # type: ignore[attr-defined]


def refusal_page(request: HttpRequest, refusal: Refusal) -> HttpResponse:
    logger.warning("single sign-on refused: %s (%s)", refusal.title, refusal.why)
    return render(
        request,
        "registration/sso_refused.html",
        {"refusal": refusal, "provider_name": settings.OIDC_PROVIDER_NAME},
        status=refusal.status,
    )


# --- The backend ------------------------------------------------------------------------------


class SsoBackend(OIDCAuthenticationBackend):  # type: ignore[misc]  # mozilla-django-oidc is untyped
    """mozilla-django-oidc's backend with discovery, full ID token checks and roles."""

    OIDC_OP_TOKEN_ENDPOINT = _Setting("OIDC_OP_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = _Setting("OIDC_OP_USER_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = _Setting("OIDC_OP_JWKS_ENDPOINT")
    OIDC_RP_CLIENT_ID = _Setting("OIDC_RP_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = _Setting("OIDC_RP_CLIENT_SECRET")
    OIDC_RP_SIGN_ALGO = _Setting("OIDC_RP_SIGN_ALGO")
    OIDC_RP_IDP_SIGN_KEY = _Setting("OIDC_RP_IDP_SIGN_KEY")
    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the parent's, which reads the endpoints (see _Setting).
        self.UserModel = get_user_model()

    # Django's, not the parent's: the parent loads a session's user even when the account has
    # been switched off since, so its open sessions would go on working.
    get_user = ModelBackend.get_user

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        # Only the callback view passes a nonce. A password login reaches this backend too
        # (the parent accepts any keyword) and must not start a code exchange.
        if request is None or "nonce" not in kwargs or not sso_enabled():
            return None
        return super().authenticate(request, **kwargs)

    def retrieve_matching_jwk(self, token: str) -> Any:
        try:
            return super().retrieve_matching_jwk(token)
        except (KeyError, TypeError, jwt.InvalidTokenError) as exc:  # a token without a kid
            raise SuspiciousOperation(
                f"no key of the provider's JWKS fits the token ({exc})"
            ) from exc

    def _verify_jws(self, payload: str, key: Any) -> dict[str, Any]:
        """The parent checks the signature only (``verify_aud`` off, no issuer): a token the
        provider issued to another client, or another issuer's, would pass."""
        try:
            alg = jwt.get_unverified_header(payload).get("alg")
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"the ID token is unreadable ({exc})") from exc
        if alg != SIGN_ALGO:
            raise SuspiciousOperation(f"the ID token is signed with {alg!r}, not {SIGN_ALGO}")
        try:
            claims: dict[str, Any] = jwt.decode(
                payload,
                key,
                algorithms=[SIGN_ALGO],
                audience=settings.OIDC_CLIENT_ID,
                issuer=provider_metadata()["issuer"],
                leeway=CLOCK_SKEW_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"the ID token fails a check: {exc}") from exc
        return claims

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        """The ID token's claims, with the userinfo endpoint's over them where the provider
        has one: Entra ID puts groups in the ID token only, others in userinfo only."""
        claims = dict(payload)
        if provider_metadata().get("userinfo_endpoint"):
            info = super().get_userinfo(access_token, id_token, payload)
            if not isinstance(info, dict) or str(info.get("sub")) != str(payload.get("sub")):
                # OpenID Connect Core §5.3.2: userinfo about another subject must be ignored
                # and the answer refused.
                raise SuspiciousOperation("userinfo names another subject than the ID token")
            claims.update(info)
        return claims

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        result = sso_user_sync(claims=self.get_userinfo(access_token, id_token, payload))
        if isinstance(result, Refusal):
            refuse(self.request, result)
            return None
        return result


def sso_user_sync(*, claims: dict[str, Any]) -> Any:
    """The user the provider's ``claims`` sign in, created at the first sign-in, with names
    and role brought in step; or the Refusal that says why nobody is signed in.

    A returning person is found by the provider's ``sub`` (``SsoIdentity``), never by name:
    a name the provider lets people change would otherwise reach another person's account.
    A first sign-in takes a name nobody here has, or an account without a password that no
    other person at the provider holds (one an admin made for them)."""
    user_model = get_user_model()
    username = next((str(claims[c]) for c in USERNAME_CLAIMS if claims.get(c)), "")
    subject = str(claims.get("sub") or "")
    if not subject or not username or len(username) > USERNAME_MAX_LENGTH:
        return Refusal("No usable name", SSO_NO_NAME_WHY, status=400)
    role_claim = claims.get(settings.OIDC_ROLE_CLAIM)
    role = role_for_claim(role_claim, role_map_parse(settings.OIDC_ROLE_MAP))
    facts = {"Signed in at the provider as": username}
    with transaction.atomic():
        identity = (
            SsoIdentity.objects.select_related("user")
            .filter(issuer=settings.OIDC_ISSUER, subject=subject)
            .first()
        )
        user = identity.user if identity else user_model.objects.filter(username=username).first()
        if identity is None and user is not None:
            if user.has_usable_password():
                return Refusal("A local account has this name", LOCAL_WHY, facts=facts)
            if SsoIdentity.objects.filter(user=user).exists():
                logger.warning("single sign-on: %s is another person's name here", username)
                return Refusal("Another person has this name here", TAKEN_WHY, facts=facts)
        if user is not None and not user.is_active:
            return Refusal("Account switched off", INACTIVE_WHY, facts=facts)
        if role is None:
            # Roles follow the provider: one that now gives none takes the old one away.
            if user is not None:
                role_clear(user=user)
            facts[f"Claim {settings.OIDC_ROLE_CLAIM}"] = ", ".join(claim_values(role_claim))
            logger.warning("single sign-on: %s has no role (%s)", username, facts)
            return Refusal("No role for you here", NO_ROLE_WHY, facts=facts)
        if user is None:
            # No password: this account signs in through the provider only.
            user = user_model.objects.create_user(username, email=claims.get("email", ""))
        if identity is None:
            SsoIdentity.objects.create(user=user, issuer=settings.OIDC_ISSUER, subject=subject)
        _names_update(user, claims)
        role_assign(user=user, role=role)
    logger.info("single sign-on: %s signed in as %s", user.get_username(), role)
    return user


def _names_update(user: Any, claims: dict[str, Any]) -> None:
    changed = []
    for attr, claim in NAME_CLAIMS.items():
        value = str(claims.get(claim) or "")[:USER_FIELD_MAX_LENGTH]
        if value and getattr(user, attr) != value:
            setattr(user, attr, value)
            changed.append(attr)
    if changed:
        user.save(update_fields=changed)


SSO_NO_NAME_WHY = (
    "The identity provider sent no preferred_username, email or sub claim of at most "
    f"{USERNAME_MAX_LENGTH} characters to name your account by."
)
LOCAL_WHY = (
    "An account with this name signs in here with a password, so single sign-on does not take "
    "it over. An admin can hand it to the identity provider by switching its password off "
    "(admin site: the user → Reset password → Password-based authentication: Disabled)."
)
TAKEN_WHY = (
    "Another person at the identity provider signed in here under this name before you, so "
    "single sign-on does not give you their account. An admin can rename one of the two "
    "accounts (admin site: Users), or remove the other person's single sign-on link "
    "(admin site: Sso identities)."
)
INACTIVE_WHY = "Your account here is switched off (not active). An admin can switch it on."
NO_ROLE_WHY = (
    "You signed in at the identity provider, but none of your groups gives a role here "
    "(viewer, finance or admin). Ask whoever runs gpufleet to add you to one of its groups."
)


# --- Views ------------------------------------------------------------------------------------


def _provider_down(exc: Exception) -> Refusal:
    return Refusal(
        "The identity provider did not answer",
        "Single sign-on could not reach the identity provider. Try again in a minute; an "
        "admin sees the details in the server log.",
        status=502,
        facts={"Error": str(exc)[:300]},
    )


class SsoLoginView(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """``/oidc/authenticate/``: to the provider's sign-in page, ``next`` kept."""

    OIDC_OP_AUTH_ENDPOINT = _Setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
    OIDC_RP_CLIENT_ID = _Setting("OIDC_RP_CLIENT_ID")
    get_settings = staticmethod(oidc_setting)

    def __init__(self, **kwargs: Any) -> None:
        # Not the parent's, which reads the endpoints (see _Setting).
        View.__init__(self, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            return super().get(request)  # type: ignore[no-any-return]
        except ProviderUnavailable as exc:
            return refusal_page(request, _provider_down(exc))


class SsoCallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """``/oidc/callback/``: where the provider sends the browser back with a code. Every
    failure is a page saying why (mozilla-django-oidc would redirect to ``/``, which sends an
    anonymous browser back to the login page without a word, or raise a server error)."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            return super().get(request)  # type: ignore[no-any-return]
        except SuspiciousOperation as exc:
            # A state this browser did not start (replayed, or forged), or a token that fails
            # a check: tell the person, keep the detail for the log.
            logger.warning("single sign-on callback refused: %s", exc)
            return refusal_page(
                request,
                Refusal(
                    "Sign-in refused",
                    "The answer from the identity provider failed a check (an old or "
                    "replayed sign-in link, or a token not meant for this site). Start again "
                    "from the login page.",
                    status=400,
                    facts={"Check": str(exc)[:300]},
                ),
            )
        except (ProviderUnavailable, requests.RequestException) as exc:
            logger.warning("single sign-on callback: provider unavailable: %s", exc)
            return refusal_page(request, _provider_down(exc))

    def login_failure(self) -> HttpResponse:
        refusal = getattr(self.request, "sso_refusal", None)
        if refusal is None:
            error = self.request.GET.get("error", "")
            facts = {"Provider says": error} if error else {}
            if self.request.GET.get("error_description"):
                facts["Description"] = self.request.GET["error_description"][:300]
            refusal = Refusal(
                "Sign-in did not complete",
                "The identity provider did not sign you in, or this sign-in was not started "
                "in this browser. Start again from the login page.",
                facts=facts,
            )
        return refusal_page(self.request, refusal)


def provider_logout_url(request: HttpRequest) -> str | None:
    """The provider's sign-out (RP-initiated logout) for a session single sign-on opened, back
    to our login page afterwards; None for a local session or a provider without one."""
    id_token = request.session.get("oidc_id_token")
    if not id_token or not sso_enabled():
        return None
    try:
        endpoint = provider_metadata().get("end_session_endpoint")
    except ProviderUnavailable:
        return None  # signed out here; the provider's own session ends in its own time
    if not endpoint:
        return None
    params = {
        "id_token_hint": id_token,
        "client_id": settings.OIDC_CLIENT_ID,
        "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
    }
    return f"{endpoint}{'&' if urlsplit(endpoint).query else '?'}{urlencode(params)}"


class LogoutView(auth_views.LogoutView):
    """Django's logout; after a single sign-on session, on to the provider's sign-out.

    That hop is a page that moves on by itself, not a redirect: the sign-out is a form post,
    and the Content-Security-Policy's ``form-action 'self'`` stops a form's redirect to
    another origin (config/middleware.py)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # Read before the session is flushed: it holds the ID token.
        provider_url = provider_logout_url(request)
        response = super().post(request, *args, **kwargs)
        if provider_url is None:
            return response
        return render(
            request,
            "registration/sso_logged_out.html",
            {"provider_url": provider_url, "provider_name": settings.OIDC_PROVIDER_NAME},
        )


# --- Checks -----------------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


@register(Tags.security)
def sso_check(**kwargs: Any) -> list[CheckMessage]:
    """The single sign-on settings, each error naming its setting (runs at every start that
    checks: runserver, migrate, ``check --deploy``). The provider is not asked: a wrong issuer
    shows at the first sign-in, on a page naming ``OIDC_ISSUER`` and the URL it read."""
    errors: list[CheckMessage] = []
    issuer = getattr(settings, "OIDC_ISSUER", "")
    if not getattr(settings, "LOCAL_LOGIN", True) and not issuer:
        errors.append(
            Error(
                "LOCAL_LOGIN=0 switches password logins off, but OIDC_ISSUER is unset: nobody "
                "could sign in.",
                hint="Set OIDC_ISSUER (and OIDC_CLIENT_ID, OIDC_CLIENT_SECRET), or LOCAL_LOGIN=1.",
                id="sso.E001",
            )
        )
    if not issuer:
        if getattr(settings, "OIDC_CLIENT_ID", ""):
            errors.append(Error("OIDC_CLIENT_ID is set but OIDC_ISSUER is not.", id="sso.E002"))
        return errors
    parts = urlsplit(issuer)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        errors.append(
            Error(
                f"OIDC_ISSUER {issuer!r} is not an http(s) URL without a query.",
                hint="e.g. https://login.example.com/realms/main (docs/deploy.md)",
                id="sso.E003",
            )
        )
    if not settings.OIDC_CLIENT_ID:
        errors.append(Error("OIDC_CLIENT_ID is unset (OIDC_ISSUER is set).", id="sso.E004"))
    if not settings.OIDC_CLIENT_SECRET:
        errors.append(
            Error(
                "OIDC_CLIENT_SECRET_FILE (or OIDC_CLIENT_SECRET) is unset or empty "
                "(OIDC_ISSUER is set).",
                id="sso.E005",
            )
        )
    if "openid" not in settings.OIDC_SCOPES.split():
        errors.append(Error("OIDC_SCOPES must include openid.", id="sso.E006"))
    if not settings.OIDC_ROLE_CLAIM:
        errors.append(Error("OIDC_ROLE_CLAIM is empty.", hint="e.g. groups", id="sso.E007"))
    try:
        role_map = role_map_parse(settings.OIDC_ROLE_MAP)
    except ValueError as exc:
        errors.append(Error(f"OIDC_ROLE_MAP: {exc}.", id="sso.E008"))
    else:
        if not role_map:
            errors.append(
                Error(
                    "OIDC_ROLE_MAP is empty: nobody would get a role.",
                    hint="e.g. gpu-admins:admin,finops:finance,*:viewer",
                    id="sso.E008",
                )
            )
    return errors


@register(Tags.security, deploy=True)
def sso_deploy_check(**kwargs: Any) -> list[CheckMessage]:
    issuer = getattr(settings, "OIDC_ISSUER", "")
    parts = urlsplit(issuer)
    if issuer and parts.scheme == "http" and not _is_loopback(parts.hostname or ""):
        return [
            Warning(
                f"OIDC_ISSUER {issuer!r} is plain http: tokens and the client secret would "
                "cross the network unencrypted.",
                id="sso.W001",
            )
        ]
    return []
