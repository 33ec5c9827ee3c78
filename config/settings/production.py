"""Production settings: the base plus what ``check --deploy`` asks for.

Refuses to start without a real ``SECRET_KEY`` or with ``DEBUG`` on. Assumes TLS ends at a
reverse proxy that sets ``X-Forwarded-Proto`` (docs/deploy.md). ``manage.py check --deploy
--fail-level WARNING`` is clean with these settings (tests/deploy/test_settings.py).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int
from config.settings import *  # noqa: F403
from config.settings import LOGGING, SECRET_KEY

if not SECRET_KEY or SECRET_KEY.startswith("insecure-") or len(SECRET_KEY) < 50:
    raise ImproperlyConfigured("SECRET_KEY must be set to a random string of 50+ characters")
if env_bool("DEBUG", False):
    raise ImproperlyConfigured("DEBUG must be off in production")
DEBUG = False

# --- TLS (ends at the proxy) ----------------------------------------------------------------
# Only trustworthy because the proxy overwrites the header; never expose gunicorn directly.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
# Served over plain HTTP inside the cluster: probes (/healthz, /readyz), the Prometheus
# scraper (/metrics) and agents posting to http://web:8000 on the compose network. For the
# two with a bearer token a redirect would protect nothing: the token has already been sent.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$", r"^api/v1/ingest$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)

# --- Cookies --------------------------------------------------------------------------------
# Secure: never sent over plain HTTP. HttpOnly: no script can read the session. The __Host-
# prefix makes browsers refuse the cookie unless it is Secure, host-only and on path /, so a
# sibling subdomain cannot plant or overwrite a session.
SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_NAME = "__Host-gpufleet_session"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600)
CSRF_COOKIE_SECURE = True
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SAMESITE = "Lax"

# --- Login lockout (config/auth.py) and client addresses ---------------------------------
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
LOGIN_FAILURE_WINDOW_S = env_int("LOGIN_FAILURE_WINDOW_S", 900)
# How many reverse proxies in front append to X-Forwarded-For (1 behind the compose proxy).
# 0 trusts none: every client then looks like the proxy, which is safe but coarse.
NUM_PROXIES = env_int("NUM_PROXIES", 0)

# --- Logging: one JSON object per line unless LOG_JSON=false --------------------------------
_console: dict[str, Any] = LOGGING["handlers"]["console"]  # type: ignore[index]
_console["formatter"] = "json" if env_bool("LOG_JSON", True) else "plain"
# Celery would otherwise replace the root handler with its own plain-text one in workers.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
