"""Settings for the embedded default and the base of production.

Everything comes from the environment (documented in docker/.env.example). With no
``DATABASE_URL`` the product runs on an embedded SQLite file; with no ``REDIS_URL`` /
``CELERY_BROKER_URL`` Celery tasks run in-process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import django_stubs_ext
import environ
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_list, env_str
from config.site_url import served_url_read

# Lets admin classes and querysets be subscripted at run time (ModelAdmin[Site]).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env_str("GPUFLEET_VAR_DIR", str(BASE_DIR / "var")))

SECRET_KEY = env_str("SECRET_KEY", "insecure-embedded-default-change-me")
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")
# Unset: the URL a demo serving from this var dir wrote (config/site_url.py), so commands run
# beside it link to it; else the runserver default.
SITE_URL = (
    env_str("SITE_URL", "").rstrip("/") or served_url_read(VAR_DIR) or "http://localhost:8000"
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "fleet",
    "telemetry",
    "billing",
    "alerts",
    # The project's own start-up checks (config/apps.py): the single sign-on settings.
    "config.apps.ProjectConfig",
]

MIDDLEWARE = [
    # First: the whole request, every middleware's work included (config/middleware.py).
    "config.middleware.GcPauseMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "config.middleware.RequestIdMiddleware",
    "config.middleware.ContentSecurityPolicyMiddleware",
    # Before sessions and auth: their reads follow the request's choice of database too.
    "config.replica.ReplicaRoutingMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the 429 (config/auth.py).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # The navigation's count of firing alerts (templates/nav/entries.html).
                "alerts.context.firing",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": environ.Env.db_url_config(DATABASE_URL)}
    DATABASES["default"].setdefault("CONN_MAX_AGE", 60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Ingest must answer 503 fast when PostgreSQL is away, not hang for the OS timeout.
        DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = env_int(
            "DATABASE_CONNECT_TIMEOUT", 3
        )
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(VAR_DIR / "gpufleet.sqlite3")),
            # Two writers at once (ingest and a rollup) fail with "database is locked" unless
            # each write transaction takes the lock up front and waits for it (Django's SQLite
            # "transaction_mode": "IMMEDIATE", new in 5.1).
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": env_str("SQLITE_TEST_PATH", "") or None},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
IS_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"

# The memory each sort or hash of one of the app's queries may use before it spills to disk
# (PostgreSQL's work_mem, for every connection the app opens): the pages' per-GPU sums over a
# year of 1,000 GPUs hash in ~3 MB but are planned for ~7 MB, and with PostgreSQL's 4 MB
# default are sorted instead, 1.8x slower (docs/benchmarks.md). The rollup and the Workloads
# page set more for their own transactions.
DATABASE_WORK_MEM = env_str("DATABASE_WORK_MEM", "32MB")
if not re.fullmatch(r"[1-9][0-9]*(kB|MB|GB)", DATABASE_WORK_MEM):
    raise ImproperlyConfigured("DATABASE_WORK_MEM: a size such as 32MB (kB, MB or GB)")

# Parallel workers per query (PostgreSQL's max_parallel_workers_per_gather, for every
# connection the app opens): 0 by default. A float sum split across workers is added in an
# order that changes from run to run, so a page's figures could differ in their last digits
# on each refresh (a close and the exports compare figures); and on a small server the
# workers take the CPU the web processes need: the pages' per-GPU sums at 10,000 GPUs took
# 145 ms with 2 workers against 81 ms without (docs/benchmarks.md).
DATABASE_PARALLEL_WORKERS = env_str("DATABASE_PARALLEL_WORKERS", "0").strip() or "0"
if not re.fullmatch(r"[0-9]|[1-5][0-9]|6[0-4]", DATABASE_PARALLEL_WORKERS):
    raise ImproperlyConfigured("DATABASE_PARALLEL_WORKERS: a number of workers from 0 to 64")
_SERVER_SETTINGS = (
    f"work_mem={DATABASE_WORK_MEM}",
    f"max_parallel_workers_per_gather={DATABASE_PARALLEL_WORKERS}",
)


def _postgres_options(database: dict[str, Any], *server_settings: str) -> None:
    """Add ``-c name=value`` server settings to a PostgreSQL connection's ``options``."""
    options = database.setdefault("OPTIONS", {})
    options["options"] = " ".join(
        [*filter(None, [options.get("options", "")]), *(f"-c {s}" for s in server_settings)]
    )


if IS_POSTGRES:
    _postgres_options(DATABASES["default"], *_SERVER_SETTINGS)

# Optional PostgreSQL streaming replica for the pages', the finance API's and the weekly
# report's reads (config/replica.py, docs/deploy.md "Read replica").
DATABASE_REPLICA_URL = env_str("DATABASE_REPLICA_URL", "")
# Reads fall back to the primary while the replica is further behind than this.
REPLICA_MAX_LAG_S = env_float("REPLICA_MAX_LAG_S", 10.0)
# How often each process asks the replica how far behind it is.
REPLICA_CHECK_INTERVAL_S = env_float("REPLICA_CHECK_INTERVAL_S", 5.0)
# Whoever wrote reads the primary this long after. The default is the longest a replica the
# router still reads can be behind (the limit, plus the age of the check that allowed it).
REPLICA_STICKY_S = env_int(
    "REPLICA_STICKY_S", int(REPLICA_MAX_LAG_S + REPLICA_CHECK_INTERVAL_S) + 1
)
if DATABASE_REPLICA_URL:
    _replica = environ.Env.db_url_config(DATABASE_REPLICA_URL)
    if not IS_POSTGRES or _replica["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_REPLICA_URL needs PostgreSQL for it and DATABASE_URL")
    _replica.setdefault("CONN_MAX_AGE", DATABASES["default"]["CONN_MAX_AGE"])
    _replica["CONN_HEALTH_CHECKS"] = True
    _options = _replica.setdefault("OPTIONS", {})
    # A replica that is away costs the request that checks it this long (libpq's minimum is 2).
    _options["connect_timeout"] = env_int("REPLICA_CONNECT_TIMEOUT", 2)
    # A write sent there by mistake fails loudly, also on a server that is no standby.
    _postgres_options(_replica, "default_transaction_read_only=on", *_SERVER_SETTINGS)
    # Test runs have no replica of their test database: the alias reads the same one.
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
# Without a replica, no router: Django's own choice (the default database) costs nothing.
DATABASE_ROUTERS = ["config.replica.ReplicaRouter"] if DATABASE_REPLICA_URL else []

# --- Cache, broker, Celery ------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            # Redis down must not take ingest down: short timeouts, callers catch errors.
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
            "KEY_PREFIX": "gpufleet",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "") or REDIS_URL
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TIMEZONE = "UTC"
# A worker whose queues hold tasks it has not received for this long exits for its supervisor
# to restart (config/watchdog.py: a known kombu fault after a broker blip); 0: never.
WORKER_STUCK_AFTER_S = env_int("WORKER_STUCK_AFTER_S", 120)
WORKER_WATCHDOG_INTERVAL_S = env_int("WORKER_WATCHDOG_INTERVAL_S", 15)

# --- Auth, sessions, security ---------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Optional extra secret mixed into token hashes, so a stolen database alone cannot be used
# to test token guesses offline.
TOKEN_PEPPER = env_str("TOKEN_PEPPER", "")
# Login lockout (config/auth.py, kept by django-axes): failures per IP + username within the
# window, and 5x that per IP alone.
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
LOGIN_FAILURE_WINDOW_S = env_int("LOGIN_FAILURE_WINDOW_S", 900)
# How many reverse proxies in front of us append to X-Forwarded-For (0: use REMOTE_ADDR).
NUM_PROXIES = env_int("NUM_PROXIES", 0)
# Axes's backend first: it refuses a locked-out client before a password is checked.
AUTHENTICATION_BACKENDS = [
    "config.auth.LoginLockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
    # Single sign-on's callback only (config/oidc.py); idle while OIDC_ISSUER is unset.
    "config.oidc.SsoBackend",
]
# The counts live in the database (not the cache): the brake holds while Redis is down.
AXES_HANDLER = "config.auth.LoginLockoutHandler"
AXES_LOCKOUT_PARAMETERS = "config.auth.lockout_parameters"
AXES_FAILURE_LIMIT = "config.auth.lockout_failure_limit"
AXES_COOLOFF_TIME = "config.auth.lockout_window"
AXES_CLIENT_IP_CALLABLE = "config.auth.client_ip"
AXES_LOCKOUT_CALLABLE = "config.auth.lockout_response"
AXES_RESET_ON_SUCCESS = True
# A refused try does not extend the lock: the window runs from the last counted failure.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
# Lockouts only: no row per successful login (the access log lines record requests).
AXES_DISABLE_ACCESS_LOG = True
# No version banner on every process start; failures and lockouts are still logged.
AXES_VERBOSE = False

# Single sign-on with OpenID Connect (config/oidc.py, docs/deploy.md "Single sign-on (OIDC)").
# Unset OIDC_ISSUER: none. Endpoints and keys come from <issuer>/.well-known/openid-configuration,
# read at the first sign-in, not at start-up (a start never waits for the provider).
OIDC_ISSUER = env_str("OIDC_ISSUER", "").strip()
OIDC_CLIENT_ID = env_str("OIDC_CLIENT_ID", "").strip()
try:
    OIDC_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "").strip()
except OSError as exc:  # OIDC_CLIENT_SECRET_FILE names a file that cannot be read
    raise ImproperlyConfigured(f"OIDC_CLIENT_SECRET_FILE: cannot read it ({exc})") from exc
OIDC_SCOPES = env_str("OIDC_SCOPES", "openid email profile")
# The claim holding the user's groups, and which of its values give which role (the highest
# role any entry gives wins; "*" gives its role to everyone the provider signs in).
OIDC_ROLE_CLAIM = env_str("OIDC_ROLE_CLAIM", "groups").strip()
OIDC_ROLE_MAP = env_str("OIDC_ROLE_MAP", "gpu-admins:admin,finops:finance,*:viewer")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "SSO").strip() or "SSO"
# 0: no password form, every password login refused (break-glass: manage.py login_link).
LOCAL_LOGIN = env_bool("LOCAL_LOGIN", True)

# --- Internationalisation -------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- Static files ---------------------------------------------------------------------------
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "staticfiles")))
# Whitenoise warns at every start when the folder is missing (before collectstatic has run);
# with WHITENOISE_USE_FINDERS it serves from the finders anyway.
try:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
except OSError:  # a read-only image: collectstatic made it at build time
    pass
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.js straight from the installed plotly package: always the same version, no CDN.
    "billing.staticfiles.PlotlyJsFinder",
]

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Every endpoint must state its permission; forgetting it denies everyone.
    "DEFAULT_PERMISSION_CLASSES": ["fleet.permissions.DenyAll"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "config.api.Pagination",
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "config.negotiation.StrictFormatNegotiation",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "config.api.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"ingest": env_str("INGEST_THROTTLE_RATE", "600/min")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU fleet economics API",
    "DESCRIPTION": "Ingest for node agents; costs, break-even and inventory for finance.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "fleet.api.schema.error_responses_document",
    ],
}

# --- Product settings -----------------------------------------------------------------------
RAW_RETENTION_DAYS = env_int("RAW_RETENTION_DAYS", 35)
# Failed recomputes (not counting transient database errors) after which the rollup sets an
# hour aside, so that it no longer holds up the hours after it (telemetry.rollup).
ROLLUP_MAX_FAILURES = max(1, env_int("ROLLUP_MAX_FAILURES", 5))
# Seconds between two recomputes of the hour in progress (docs/deploy.md §8: 300 cuts the
# rollup's WAL by half again; the dashboard's "now" then lags by up to five minutes).
ROLLUP_OPEN_HOUR_EVERY_S = max(0, env_int("ROLLUP_OPEN_HOUR_EVERY_S", 60))
INGEST_MAX_SAMPLES = env_int("INGEST_MAX_SAMPLES", 10_000)
INGEST_MAX_BODY_BYTES = env_int("INGEST_MAX_BODY_BYTES", 8 * 1024 * 1024)
# Entries of a push's ``gpus`` block (413 beyond), and GPUs one node may own (not retired): a
# node with more is misconfigured or hostile, and every page lists a node's GPUs.
INGEST_MAX_GPUS = env_int("INGEST_MAX_GPUS", 64)
NODE_MAX_GPUS = env_int("NODE_MAX_GPUS", 64)
# New workloads one node may register per UTC hour (docs/ingest.md); a push past it gets 429
# and its agent resends it later. 1,000 is twice what an 8-GPU node makes starting a new job
# on every GPU every minute. At least 32 (a sample's most), so one sample always fits.
INGEST_MAX_NEW_WORKLOADS_PER_HOUR = max(32, env_int("INGEST_MAX_NEW_WORKLOADS_PER_HOUR", 1000))
# Django's own limit must not cut in before ours: the ingest view answers 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = INGEST_MAX_BODY_BYTES + 1024 * 1024
WEEKLY_REPORT_RECIPIENTS = env_list("WEEKLY_REPORT_RECIPIENTS", "")
WEEKLY_REPORT_WEEKDAY = env_int("WEEKLY_REPORT_WEEKDAY", 0)  # 0 = Monday
WEEKLY_REPORT_HOUR = env_int("WEEKLY_REPORT_HOUR", 7)
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# Key of the HMAC-SHA256 signature on every alert webhook (X-Gpufleet-Signature); unset, no
# webhook is sent (a receiver cannot tell an unsigned one from a forged one).
ALERT_WEBHOOK_SECRET = env_str("ALERT_WEBHOOK_SECRET", "")
# Webhooks to loopback and private addresses (127/8, ::1, 10/8, 172.16/12, 192.168/16,
# fc00::/7): refused unless set, so a rule cannot aim the server at its own network.
# Link-local and cloud metadata addresses are refused whatever this says (docs/alerts.md).
ALERT_WEBHOOK_ALLOW_PRIVATE = env_bool("ALERT_WEBHOOK_ALLOW_PRIVATE", False)

# --- Email ----------------------------------------------------------------------------------
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = 30
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpufleet@localhost")
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)

# --- Logging --------------------------------------------------------------------------------
LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "config.logging.RequestIdFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "config.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["request_id"],
            "formatter": "json" if env_bool("LOG_JSON", False) else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
