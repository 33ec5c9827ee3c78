"""docker/.env.example documents every environment variable the code reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docker" / ".env.example"

# docs/deploy.md: the binding names.
DESIGN_NAMES = """SECRET_KEY DEBUG ALLOWED_HOSTS CSRF_TRUSTED_ORIGINS SITE_URL DATABASE_URL
REDIS_URL CELERY_BROKER_URL EMAIL_HOST EMAIL_PORT EMAIL_HOST_USER EMAIL_HOST_PASSWORD EMAIL_USE_TLS
DEFAULT_FROM_EMAIL RAW_RETENTION_DAYS INGEST_MAX_SAMPLES INGEST_MAX_BODY_BYTES
WEEKLY_REPORT_RECIPIENTS""".split()

_ENV_CALL = re.compile(r"\benv_(?:str|int|float|bool|list)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']")
_OS_ENV = re.compile(
    r"os\.(?:environ\.get|environ\.setdefault|getenv)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
    r"|os\.environ\[\s*[\"']([A-Z][A-Z0-9_]*)[\"']\s*\]"
)


def names_read(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        text = path.read_text()
        names |= set(_ENV_CALL.findall(text))
        for a, b in _OS_ENV.findall(text):
            names.add(a or b)
    return names


def documented() -> set[str]:
    return set(re.findall(r"^#? ?([A-Z][A-Z0-9_]*)=", EXAMPLE.read_text(), re.M))


def test_every_variable_read_in_config_is_documented() -> None:
    read = names_read(sorted((ROOT / "config").rglob("*.py")))
    # The scan must see the settings (multi-line calls included), or it proves nothing.
    assert {"SECRET_KEY", "DATABASE_URL", "DATABASE_CONNECT_TIMEOUT", "LOG_JSON"} <= read
    assert not read - documented(), f"missing in .env.example: {sorted(read - documented())}"


def test_agent_and_design_variables_are_documented() -> None:
    read = set(DESIGN_NAMES)
    cli = ROOT / "telemetry" / "agent" / "cli.py"
    if cli.exists():
        text = cli.read_text()
        read |= set(re.findall(r"\"(GPUFLEET_[A-Z_]+)\"", text))
    assert not read - documented(), f"missing in .env.example: {sorted(read - documented())}"


def test_the_example_sets_nothing_by_accident() -> None:
    # Copied to docker/.env it is loaded into every container: a live line with an empty value
    # would override a default with "" (ALLOWED_HOSTS= would allow no host at all).
    live = [line for line in EXAMPLE.read_text().splitlines() if re.match(r"^[A-Z]", line)]
    assert live == []
