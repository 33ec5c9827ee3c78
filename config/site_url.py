"""The URL the demo serves on, for the commands run beside it (docs/weekly-report.md).

The demo picks its port when it starts (``--port``, or the next free one), so a
``manage.py send_weekly_report`` or ``alerts_evaluate`` in a second shell cannot know it from
the environment. While it serves, the demo writes its URL to ``VAR_DIR/site_url`` and removes
it when it stops; settings read it when ``SITE_URL`` is not set in the environment (which always
wins: a proxy in front). Kept free of Django: settings import it.
"""

from __future__ import annotations

from pathlib import Path

FILE_NAME = "site_url"


def served_url_read(var_dir: Path) -> str:
    """The URL in ``var_dir``'s file, or "" (no file, or not an http(s) URL on one line)."""
    try:
        text = (var_dir / FILE_NAME).read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    if "\n" in text or not text.startswith(("http://", "https://")):
        return ""
    return text.rstrip("/")


def served_url_write(var_dir: Path, url: str) -> None:
    var_dir.mkdir(parents=True, exist_ok=True)
    (var_dir / FILE_NAME).write_text(url.rstrip("/") + "\n", encoding="utf-8")


def served_url_clear(var_dir: Path, url: str) -> None:
    """Remove the file if it still names ``url`` (a second demo may have written its own)."""
    if served_url_read(var_dir) == url.rstrip("/"):
        (var_dir / FILE_NAME).unlink(missing_ok=True)
