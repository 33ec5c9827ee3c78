"""Login with a brake on password guessing, kept by django-axes.

Failed logins are counted per client address and username, and per client address alone (a
higher limit, against one address trying many usernames). Once a count reaches its limit,
every login for that key is refused with 429 until the window has passed since its last
counted failure, even with the right password: otherwise a guesser would learn when a guess
was right. Refused tries do not count (they do not extend the lock). A successful login
clears its address-and-username count.

django-axes keeps the counts in the database (``axes.AccessAttempt``), so the brake does not
depend on the cache: with Redis down, logins work and are still counted. Operators see the
counts in the admin (Axes → Access attempts) and unlock with ``manage.py axes_reset_username``
and friends (docs/deploy.md §7). What axes does not do by itself is here: the two limits
(``LoginLockoutHandler``), the client address behind ``NUM_PROXIES`` trusted proxies
(``client_ip``), and the login page that says why (the form and ``lockout_response``).

Settings (defaults here; production reads them from the environment):
``LOGIN_FAILURE_LIMIT`` (5), ``LOGIN_FAILURE_WINDOW_S`` (900) and ``NUM_PROXIES`` (0, the
number of reverse proxies in front whose ``X-Forwarded-For`` entries may be trusted). The
``AXES_*`` settings that point here are in config/settings.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.contrib import admin
from django.contrib import auth as django_auth
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core import signing
from django.core.exceptions import ValidationError
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache

logger = logging.getLogger(__name__)

# One address trying many usernames (password spraying) gets this many times the limit.
IP_LIMIT_FACTOR = 5
# What axes counts failures by (AXES_LOCKOUT_PARAMETERS), each with its limit as a multiple of
# LOGIN_FAILURE_LIMIT, in the same order: the address and username together, then the address.
LOCKOUT_PARAMETERS: list[str | list[str]] = [["ip_address", "username"], "ip_address"]
LIMIT_FACTORS = (1, IP_LIMIT_FACTOR)
PAIR = 0  # the index of the address-and-username count in both
LOCKED_OUT_CODE = "locked_out"
LOCKED_OUT_MESSAGE = "Too many failed logins from this address. Try again later."


def login_failure_limit() -> int:
    return int(getattr(settings, "LOGIN_FAILURE_LIMIT", 5))


def login_failure_window_s() -> int:
    return int(getattr(settings, "LOGIN_FAILURE_WINDOW_S", 900))


def _ip(value: str) -> str | None:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


def client_ip(request: HttpRequest) -> str | None:
    """The client's address (``AXES_CLIENT_IP_CALLABLE``): ``REMOTE_ADDR``, or the entry
    ``NUM_PROXIES`` hops back in ``X-Forwarded-For`` when that many trusted proxies stand in
    front (entries further left are written by the client and prove nothing).

    Only a well-formed address is returned (axes stores it in an address column); an entry
    that is not one falls back to ``REMOTE_ADDR``, and None is the unknown client.
    """
    remote = _ip(str(request.META.get("REMOTE_ADDR", "") or ""))
    num_proxies = int(getattr(settings, "NUM_PROXIES", 0))
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if num_proxies > 0 and forwarded:
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if hops:
            return _ip(hops[-min(num_proxies, len(hops))]) or remote
    return remote


def lockout_parameters(request: Any, credentials: dict[str, Any] | None = None) -> list[Any]:
    """``AXES_LOCKOUT_PARAMETERS``: what failures are counted by (see LIMIT_FACTORS)."""
    return LOCKOUT_PARAMETERS


def lockout_failure_limit(request: Any, credentials: dict[str, Any] | None = None) -> int:
    """``AXES_FAILURE_LIMIT``: read per request, so the setting can change at run time."""
    return login_failure_limit()


def lockout_window(request: Any = None) -> dt.timedelta:
    """``AXES_COOLOFF_TIME``: how long a counted failure is remembered."""
    return dt.timedelta(seconds=login_failure_window_s())


class LoginLockoutHandler(AxesDatabaseHandler):  # type: ignore[misc]  # axes is untyped
    """django-axes's database handler with a limit per count and a narrower reset.

    Axes compares one number with one limit; this handler gives it each count divided by its
    factor, so the address alone is refused at ``IP_LIMIT_FACTOR`` times the limit.
    """

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        counts = [
            attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
            for attempts in self.get_user_attempts(request, credentials)
        ]
        # Floor division: count // f >= limit exactly when count >= f × limit.
        return max(count // factor for count, factor in zip(counts, LIMIT_FACTORS, strict=True))

    def reset_user_attempts(
        self, request: HttpRequest, credentials: dict[str, Any] | None = None
    ) -> int:
        # A success clears its own address-and-username count only: logging in to one account
        # must not wipe what the address did to the others.
        count, _ = self.filter_user_attempts(request, credentials)[PAIR].delete()
        return int(count)


class LoginLockoutBackend(AxesStandaloneBackend):  # type: ignore[misc]
    """Axes's backend (refuses a locked-out login before any password is checked), passing
    over calls without a request: a shell or a management command has no client to lock
    out, and axes would raise there."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        if request is None:
            return None
        super().authenticate(request, username, password, **kwargs)
        return None


LOCAL_LOGIN_OFF_CODE = "local_login_off"


def local_login_off_message() -> str:
    return f"Password login is switched off here: sign in with {settings.OIDC_PROVIDER_NAME}."


class LockoutAuthenticationForm(AuthenticationForm):
    """Django's login form, saying why when the brake refused the login (the page would
    otherwise say the password was wrong, even when it was right), and refusing every
    password while ``LOCAL_LOGIN`` is off (the admin site's login form too)."""

    def clean(self) -> dict[str, Any]:
        if not settings.LOCAL_LOGIN:
            # Before any password is checked: with local login off, a right password must not
            # sign in, nor a wrong one count towards a lockout.
            raise ValidationError(local_login_off_message(), code=LOCAL_LOGIN_OFF_CODE)
        try:
            return super().clean()
        except ValidationError:
            if getattr(self.request, "axes_locked_out", False):
                raise ValidationError(LOCKED_OUT_MESSAGE, code=LOCKED_OUT_CODE) from None
            raise


class LockoutAdminAuthenticationForm(LockoutAuthenticationForm, AdminAuthenticationForm):
    """The admin's login form (staff only), saying the same."""


def lockout_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the login page as its view rendered it (its form says why),
    answered 429 with ``Retry-After``; a plain 429 where no page was rendered."""
    logger.warning("login locked out", extra={"client_ip": getattr(request, "axes_ip_address", "")})
    response = original_response
    if response is None:
        response = HttpResponse(LOCKED_OUT_MESSAGE + "\n", content_type="text/plain")
    response.status_code = 429
    # The longest wait: the window counts from the last counted failure.
    response["Retry-After"] = str(login_failure_window_s())
    return response


class LoginPageView(LoginView):
    """The login page: the password form unless ``LOCAL_LOGIN`` is off, and "Sign in with
    <OIDC_PROVIDER_NAME>" when single sign-on is configured (config/oidc.py)."""

    authentication_form = LockoutAuthenticationForm

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["local_login"] = settings.LOCAL_LOGIN
        context["sso_name"] = settings.OIDC_PROVIDER_NAME if settings.OIDC_ISSUER else ""
        return context


# --- Break-glass login links (manage.py login_link) --------------------------------------
# A signed link that signs one user in once, within LOGIN_LINK_MAX_AGE_S, whatever LOCAL_LOGIN
# says and while the identity provider is down: for admins locked out of single sign-on. Only
# someone with a shell on the server (SECRET_KEY) can make one.
LOGIN_LINK_SALT = "gpufleet.config.auth.login_link"
LOGIN_LINK_MAX_AGE_S = 15 * 60


def _last_login_stamp(user: Any) -> str:
    return user.last_login.isoformat() if user.last_login else ""


def login_link_token(*, user: Any) -> str:
    """A token for ``user``'s login link. It names the user's last login, which the link's use
    moves: that makes it good for one sign-in."""
    return signing.dumps({"u": user.pk, "l": _last_login_stamp(user)}, salt=LOGIN_LINK_SALT)


def login_link_url(*, user: Any) -> str:
    return settings.SITE_URL + reverse("login-link", args=[login_link_token(user=user)])


def login_link_user(token: str) -> Any:
    """The active user a valid, unused, unexpired token names; None otherwise."""
    from django.contrib.auth import get_user_model

    try:
        data = signing.loads(token, salt=LOGIN_LINK_SALT, max_age=LOGIN_LINK_MAX_AGE_S)
    except signing.BadSignature:  # SignatureExpired too
        return None
    user = get_user_model().objects.filter(pk=data.get("u"), is_active=True).first()
    if user is None or _last_login_stamp(user) != data.get("l"):
        return None
    return user


def _login_link_refused(request: HttpRequest) -> HttpResponse:
    return render(request, "registration/login_link.html", {"user_to_sign_in": None}, status=403)


@never_cache
def login_link(request: HttpRequest, token: str) -> HttpResponse:
    """``/accounts/login-link/<token>/``: GET shows whom the link signs in (a link preview or
    a mail scanner that fetches it uses nothing up); POST signs in."""
    user = login_link_user(token)
    if user is None:
        return _login_link_refused(request)
    if request.method != "POST":
        return render(request, "registration/login_link.html", {"user_to_sign_in": user})
    from django.contrib.auth import get_user_model

    # One use, settled by the database: of two posts at once only one moves last_login from
    # the value the token names (compare-and-swap).
    used = (
        get_user_model()
        .objects.filter(pk=user.pk, last_login=user.last_login)
        .update(last_login=timezone.now())
    )
    if used != 1:
        return _login_link_refused(request)
    django_auth.login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    logger.warning("break-glass login link used for %s", user.username)
    return HttpResponseRedirect(settings.LOGIN_REDIRECT_URL)


# The admin has its own login page at /admin/login/; axes guards it like every login, and this
# makes it say why.
admin.site.login_form = LockoutAdminAuthenticationForm
