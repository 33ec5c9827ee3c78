"""Production settings, in subprocesses (they refuse to load without a real SECRET_KEY)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Variables that would change what production settings decide; the subprocess must see the
# defaults, not whatever this shell happens to export.
_SCRUB = (
    "DJANGO_ALLOW_ASYNC_UNSAFE",  # set by the browser tests for their session; never in production
    "DEBUG",
    "SECRET_KEY",
    "SECRET_KEY_FILE",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "ALLOWED_HOSTS",
    "LOG_JSON",
    "NUM_PROXIES",
)


def production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.production"
    env["SECRET_KEY"] = secrets.token_urlsafe(48)  # 64 characters
    env.update(extra)
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_check_deploy_is_clean_at_warning_level() -> None:
    result = run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        production_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_catches_a_weakened_setting() -> None:
    # The same check must fail when HSTS is off: proof that it runs the deploy checks at all.
    result = run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        production_env(SECURE_HSTS_SECONDS="0"),
    )
    assert result.returncode != 0
    assert "security.W004" in result.stderr + result.stdout


def test_production_refuses_a_weak_secret_key_and_debug() -> None:
    code = "import django; django.setup()"
    weak = run([sys.executable, "-c", code], production_env(SECRET_KEY="short-and-weak"))
    assert weak.returncode != 0 and "SECRET_KEY" in weak.stderr
    default = run([sys.executable, "-c", code], production_env(SECRET_KEY=""))
    assert default.returncode != 0 and "SECRET_KEY" in default.stderr
    debug = run([sys.executable, "-c", code], production_env(DEBUG="true"))
    assert debug.returncode != 0 and "DEBUG" in debug.stderr


def test_production_cookies_tls_and_logs() -> None:
    code = """
import json
import django
django.setup()
from django.conf import settings as s
print(json.dumps({name: getattr(s, name) for name in [
    "DEBUG", "SESSION_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY", "SESSION_COOKIE_SAMESITE",
    "SESSION_COOKIE_NAME", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS",
    "SECURE_PROXY_SSL_HEADER", "SECURE_CONTENT_TYPE_NOSNIFF", "X_FRAME_OPTIONS",
    "SECURE_REDIRECT_EXEMPT", "CELERY_WORKER_HIJACK_ROOT_LOGGER", "LOGIN_FAILURE_LIMIT",
]} | {"formatter": s.LOGGING["handlers"]["console"]["formatter"],
       "csp": "config.middleware.ContentSecurityPolicyMiddleware" in s.MIDDLEWARE}))
"""
    result = run([sys.executable, "-c", code], production_env())
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values["DEBUG"] is False
    assert values["SESSION_COOKIE_SECURE"] is True
    assert values["SESSION_COOKIE_HTTPONLY"] is True
    assert values["SESSION_COOKIE_SAMESITE"] == "Lax"
    assert values["SESSION_COOKIE_NAME"].startswith("__Host-")
    assert values["CSRF_COOKIE_SECURE"] is True
    assert values["SECURE_SSL_REDIRECT"] is True
    assert values["SECURE_HSTS_SECONDS"] >= 31_536_000
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert values["X_FRAME_OPTIONS"] == "DENY"
    assert values["formatter"] == "json"
    assert values["csp"] is True
    assert values["CELERY_WORKER_HIJACK_ROOT_LOGGER"] is False
    assert values["LOGIN_FAILURE_LIMIT"] == 5
    # Plain-HTTP paths are exactly the probes, the scrape and agents' ingest.
    assert set(values["SECURE_REDIRECT_EXEMPT"]) == {
        r"^healthz$",
        r"^readyz$",
        r"^metrics$",
        r"^api/v1/ingest$",
    }


def test_production_serves_pages_over_https_with_secure_cookies() -> None:
    """A login through the proxy (X-Forwarded-Proto: https) sets only Secure cookies."""
    code = """
import django
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
c = Client()
plain = c.get("/accounts/login/")
print("plain", plain.status_code, plain.get("Location", ""))
ok = c.get("/healthz")
print("healthz", ok.status_code)
tls = c.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
print("tls", tls.status_code, "Strict-Transport-Security" in tls.headers)
print("csp", "script-src 'self'" in tls.headers.get("Content-Security-Policy", ""))
for name, morsel in tls.cookies.items():
    print("cookie", name, bool(morsel["secure"]))
"""
    env = production_env()
    env.pop("DATABASE_URL", None)  # the login page needs no database; SQLite is enough
    env.pop("REDIS_URL", None)
    env["GPUFLEET_VAR_DIR"] = env.get("GPUFLEET_VAR_DIR", "/tmp/gpufleet-deploy-test")
    env["ALLOWED_HOSTS"] = "testserver"
    result = run([sys.executable, "-c", code], env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "plain 301 https://testserver/accounts/login/" in lines
    assert "healthz 200" in lines  # exempt from the redirect
    assert "tls 200 True" in lines
    assert "csp True" in lines
    cookies = [line for line in lines if line.startswith("cookie ")]
    assert cookies and all(line.endswith(" True") for line in cookies)


def _settings_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUB and not k.startswith(("DATABASE_", "REPLICA_"))
    }
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env["GPUFLEET_VAR_DIR"] = env.get("GPUFLEET_VAR_DIR", "/tmp/gpufleet-deploy-test")
    env.update(extra)
    return env


def test_a_replica_url_adds_a_read_only_replica_that_tests_mirror() -> None:
    code = (
        "import json; from django.conf import settings as s; r = s.DATABASES['replica'];"
        "print(json.dumps([r['HOST'], r['PORT'], r['NAME'], r['OPTIONS'], r['TEST'],"
        " r['CONN_HEALTH_CHECKS'], s.DATABASE_ROUTERS, s.REPLICA_STICKY_S]))"
    )
    result = run(
        [sys.executable, "-c", code],
        _settings_env(
            DATABASE_URL="postgres://app@primary:5432/gpufleet",
            DATABASE_REPLICA_URL="postgres://app@standby:5433/gpufleet",
            REPLICA_MAX_LAG_S="3",
            REPLICA_CHECK_INTERVAL_S="2",
        ),
    )
    assert result.returncode == 0, result.stderr
    host, port, name, options, test, health, routers, sticky = json.loads(result.stdout)
    assert (host, int(port), name) == ("standby", 5433, "gpufleet")
    assert options == {
        "connect_timeout": 2,
        "options": "-c default_transaction_read_only=on -c work_mem=32MB"
        " -c max_parallel_workers_per_gather=0",
    }
    assert test == {"MIRROR": "default"} and health is True
    assert routers == ["config.replica.ReplicaRouter"]
    assert sticky == 3 + 2 + 1  # the lag limit plus the check interval, plus a second


def test_without_a_replica_there_is_no_router() -> None:
    code = (
        "import json; from django.conf import settings as s; print(json.dumps(s.DATABASE_ROUTERS))"
    )
    result = run([sys.executable, "-c", code], _settings_env())
    assert (result.returncode, json.loads(result.stdout)) == (0, []), result.stderr


def test_a_replica_needs_postgresql() -> None:
    result = run(
        [sys.executable, "-c", "import django; django.setup()"],
        _settings_env(DATABASE_REPLICA_URL="postgres://app@standby:5433/gpufleet"),
    )
    assert result.returncode != 0
    assert "DATABASE_REPLICA_URL needs PostgreSQL" in result.stderr


def test_every_postgresql_connection_gets_the_work_mem_setting(db: Any) -> None:
    """DATABASE_WORK_MEM (default 32MB) reaches the server with each connection: the pages'
    per-GPU sums hash rather than sort (docs/benchmarks.md, issue 19)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL server setting")
    with connection.cursor() as cursor:
        cursor.execute("SHOW work_mem")
        assert cursor.fetchone()[0] == "32MB"


def _primary_settings(code: str, **env: str) -> Any:
    """``code`` run with the settings of a PostgreSQL primary and ``env``."""
    return run(
        [sys.executable, "-c", f"from django.conf import settings as s; {code}"],
        _settings_env(DATABASE_URL="postgres://app@primary:5432/gpufleet", **env),
    )


_OPTIONS = "print(s.DATABASES['default']['OPTIONS']['options'])"


def test_a_work_mem_that_is_no_size_is_refused() -> None:
    result = _primary_settings("s.DATABASES", DATABASE_WORK_MEM="1")
    assert result.returncode != 0 and "DATABASE_WORK_MEM" in result.stderr
    result = _primary_settings(_OPTIONS, DATABASE_WORK_MEM="256MB")
    assert result.returncode == 0
    assert result.stdout.strip() == "-c work_mem=256MB -c max_parallel_workers_per_gather=0"


def test_every_postgresql_connection_runs_its_queries_without_parallel_workers(db: Any) -> None:
    """DATABASE_PARALLEL_WORKERS (default 0) reaches the server with each connection: a sum
    of floats split across parallel workers is added in an order that changes between runs
    (a page's figures would move in their last digits on a refresh)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL server setting")
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_parallel_workers_per_gather")
        assert cursor.fetchone()[0] == "0"


@pytest.mark.parametrize("value", ["-1", "65", "two", "1.5"])
def test_a_parallel_worker_count_out_of_range_is_refused(value: str) -> None:
    result = _primary_settings("s.DATABASES", DATABASE_PARALLEL_WORKERS=value)
    assert result.returncode != 0 and "DATABASE_PARALLEL_WORKERS" in result.stderr


def test_parallel_workers_can_be_allowed_again() -> None:
    result = _primary_settings(_OPTIONS, DATABASE_PARALLEL_WORKERS="2")
    assert result.returncode == 0
    assert result.stdout.strip() == "-c work_mem=32MB -c max_parallel_workers_per_gather=2"
