"""Production settings: the base plus what ``check --deploy`` asks for.

Refuses to start without a real ``SECRET_KEY`` or with ``DEBUG`` on.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int
from config.settings import *  # noqa: F403
from config.settings import SECRET_KEY

if not SECRET_KEY or SECRET_KEY.startswith("insecure-") or len(SECRET_KEY) < 50:
    raise ImproperlyConfigured("SECRET_KEY must be set to a random string of 50+ characters")
if env_bool("DEBUG", False):
    raise ImproperlyConfigured("DEBUG must be off in production")
DEBUG = False

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
# /healthz and /readyz are probed over plain HTTP inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
