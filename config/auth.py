"""Login with a brake on password guessing.

Failed logins are counted in the shared cache per client IP and username, and per client IP
alone (a higher limit, against one address trying many usernames). Once a count reaches its
limit, every login for that key is refused with 429 until the window (counted from the first
failure) has passed, even with the right password: otherwise a guesser would learn when a
guess was right. A successful login clears its IP-and-username count.

When the cache is down, logins work unthrottled (and a warning is logged): locking every user
out because Redis is away would turn a cache outage into a full outage.

Settings (defaults here; production reads them from the environment):
``LOGIN_FAILURE_LIMIT`` (5), ``LOGIN_FAILURE_WINDOW_S`` (900) and ``NUM_PROXIES`` (0, the
number of reverse proxies in front whose ``X-Forwarded-For`` entries may be trusted).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

KEY_PREFIX = "login-failures:"
# One address trying many usernames (password spraying) gets this many times the limit.
IP_LIMIT_FACTOR = 5
THROTTLED_CODE = "throttled"
THROTTLED_MESSAGE = "Too many failed logins from this address. Try again later."


def login_failure_limit() -> int:
    return int(getattr(settings, "LOGIN_FAILURE_LIMIT", 5))


def login_failure_window_s() -> int:
    return int(getattr(settings, "LOGIN_FAILURE_WINDOW_S", 900))


def client_ip(request: HttpRequest) -> str:
    """The client's address: ``REMOTE_ADDR``, or the entry ``NUM_PROXIES`` hops back in
    ``X-Forwarded-For`` when that many trusted proxies stand in front (entries further left
    are written by the client and prove nothing)."""
    remote = str(request.META.get("REMOTE_ADDR", "") or "-")
    num_proxies = int(getattr(settings, "NUM_PROXIES", 0))
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if num_proxies > 0 and forwarded:
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if hops:
            return str(hops[-min(num_proxies, len(hops))])
    return remote


def _keys(request: HttpRequest, username: str) -> dict[str, str]:
    ip = client_ip(request)
    # Hashed: usernames are arbitrary user input and cache keys have a restricted alphabet.
    pair = hashlib.sha256(f"{ip}\0{username.strip().lower()}".encode()).hexdigest()
    return {
        "pair": f"{KEY_PREFIX}pair:{pair}",
        "ip": f"{KEY_PREFIX}ip:{hashlib.sha256(ip.encode()).hexdigest()}",
    }


def _limits() -> dict[str, int]:
    limit = login_failure_limit()
    return {"pair": limit, "ip": limit * IP_LIMIT_FACTOR}


def login_blocked(request: HttpRequest, username: str) -> bool:
    """Whether this client may not try this username now; False when the cache is down."""
    keys, limits = _keys(request, username), _limits()
    try:
        counts = cache.get_many(list(keys.values()))
    except Exception:  # noqa: BLE001 - a cache outage must not lock everyone out
        logger.warning("login throttling off: cache unavailable")
        return False
    return any(int(counts.get(keys[kind]) or 0) >= limits[kind] for kind in keys)


def login_failure_record(request: HttpRequest, username: str) -> None:
    window = login_failure_window_s()
    try:
        for key in _keys(request, username).values():
            # add() starts the window at the first failure; incr() keeps its expiry.
            if not cache.add(key, 1, timeout=window):
                try:
                    cache.incr(key)
                except ValueError:  # expired between add and incr
                    cache.add(key, 1, timeout=window)
    except Exception:  # noqa: BLE001
        logger.warning("login failure not counted: cache unavailable")


def login_failures_clear(request: HttpRequest, username: str) -> None:
    try:
        cache.delete(_keys(request, username)["pair"])
    except Exception:  # noqa: BLE001
        logger.warning("login failures not cleared: cache unavailable")


class ThrottledAuthenticationForm(AuthenticationForm):
    """Django's login form, refusing a throttled client before it checks the password."""

    def clean(self) -> dict[str, Any]:
        username = str(self.cleaned_data.get("username") or "")
        request = self.request
        if request is not None and login_blocked(request, username):
            logger.warning("login throttled", extra={"client_ip": client_ip(request)})
            raise ValidationError(THROTTLED_MESSAGE, code=THROTTLED_CODE)
        try:
            cleaned = super().clean()
        except ValidationError:
            if request is not None:
                login_failure_record(request, username)
            raise
        if request is not None:
            login_failures_clear(request, username)
        return cleaned


class ThrottledAdminAuthenticationForm(ThrottledAuthenticationForm, AdminAuthenticationForm):
    """The admin's login form (staff only), throttled the same way."""


class RateLimitedLoginView(auth_views.LoginView):
    """Django's login view, answering 429 (with the form and its message) while throttled."""

    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        if any(e.code == THROTTLED_CODE for e in form.errors.as_data().get(NON_FIELD_ERRORS, [])):
            response.status_code = 429
            response["Retry-After"] = str(login_failure_window_s())
        return response


# The admin has its own login page at /admin/login/; without this it would be a way around
# the brake. Set here, where the login route comes from, so both are throttled or neither.
admin.site.login_form = ThrottledAdminAuthenticationForm
