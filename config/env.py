"""Typed environment helpers for settings (healthchecks style).

Every value can also come from a file: ``NAME_FILE=/run/secrets/name`` wins over ``NAME``, so
secrets need not sit in the environment of every process.
"""

from __future__ import annotations

import os
from pathlib import Path


def env_str(name: str, default: str = "") -> str:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        return Path(file_path).read_text().strip()
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = env_str(name, "")
    if raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = env_str(name, "")
    return int(raw) if raw.strip() else default


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


def env_float(name: str, default: float) -> float:
    raw = env_str(name, "")
    return float(raw) if raw.strip() else default
