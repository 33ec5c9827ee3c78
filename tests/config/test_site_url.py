"""Links in mail sent beside the demo (issue 39.4): the demo serves on a port it picks, and a
``manage.py`` run in a second shell links to that port, not to the default 8000.

The demo writes its URL to ``VAR_DIR/site_url`` while it serves (config/site_url.py); settings
read it when ``SITE_URL`` is not in the environment; an explicit ``SITE_URL`` always wins.
"""

from __future__ import annotations

import io
import os
import runpy
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from config.site_url import FILE_NAME, served_url_clear, served_url_read, served_url_write

SETTINGS_FILE = Path(django_settings.BASE_DIR) / "config" / "settings" / "__init__.py"


def _site_url(monkeypatch: Any, var_dir: Path, site_url: str | None) -> str:
    """SITE_URL as a fresh process's settings work it out from this environment."""
    monkeypatch.setenv("GPUFLEET_VAR_DIR", str(var_dir))
    if site_url is None:
        monkeypatch.delenv("SITE_URL", raising=False)
    else:
        monkeypatch.setenv("SITE_URL", site_url)
    return str(runpy.run_path(str(SETTINGS_FILE))["SITE_URL"])


def test_settings_link_to_the_demo_beside_unless_site_url_is_set(
    monkeypatch: Any, tmp_path: Path
) -> None:
    assert _site_url(monkeypatch, tmp_path, None) == "http://localhost:8000"  # no demo
    served_url_write(tmp_path, "http://localhost:8765/")
    assert (tmp_path / FILE_NAME).read_text() == "http://localhost:8765\n"
    assert _site_url(monkeypatch, tmp_path, None) == "http://localhost:8765"
    # A proxy in front: the environment wins.
    assert _site_url(monkeypatch, tmp_path, "https://fleet.example.com/") == (
        "https://fleet.example.com"
    )


@pytest.mark.parametrize("text", ["", "localhost:8765", "http://a\nhttp://b", "ftp://x"])
def test_a_file_that_is_no_url_is_ignored(tmp_path: Path, text: str) -> None:
    (tmp_path / FILE_NAME).write_text(text)
    assert served_url_read(tmp_path) == ""


def test_clearing_leaves_another_demos_url(tmp_path: Path) -> None:
    served_url_write(tmp_path, "http://localhost:8766")  # a second demo started since
    served_url_clear(tmp_path, "http://localhost:8765/")
    assert served_url_read(tmp_path) == "http://localhost:8766"
    served_url_clear(tmp_path, "http://localhost:8766/")
    assert not (tmp_path / FILE_NAME).exists()


@pytest.mark.django_db(transaction=True)
def test_a_second_shells_weekly_report_links_to_the_demos_port(
    settings: Any, monkeypatch: Any, tmp_path: Path, free_tcp_port: int, postgres: None
) -> None:
    """The demo serves on a port of its own; ``send_weekly_report --to`` in another process
    (same var dir, same database, no SITE_URL, no EMAIL_HOST) prints its email on the console
    with links to that port. When the demo stops, its file goes."""
    from billing.management.commands.demo import Command, _floor
    from telemetry.agent.fake import FakeFleet
    from tests.reliability.conftest import db_url_for_test

    monkeypatch.delenv("SITE_URL", raising=False)
    settings.VAR_DIR = tmp_path
    settings.SITE_URL = "http://localhost:8000"
    said = io.StringIO()
    command = Command(stdout=said, stderr=io.StringIO())
    now = _floor(timezone.now(), 60)
    opts = {"host": "127.0.0.1", "port": free_tcp_port, "verbosity": 0, "live_interval": 60}
    serving = threading.Thread(
        target=command._serve,
        args=(FakeFleet("nodes=1,gpus=1", epoch=now), {}, now, opts, time.monotonic()),
        daemon=True,
    )
    serving.start()
    demo_url = f"http://localhost:{free_tcp_port}"
    try:
        deadline = time.monotonic() + 30
        while "Dashboard:" not in said.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert served_url_read(tmp_path) == demo_url
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SITE_URL", "EMAIL_HOST", "REDIS_URL", "CELERY_BROKER_URL")
        }
        env.update(GPUFLEET_VAR_DIR=str(tmp_path), DATABASE_URL=db_url_for_test())
        shell = subprocess.run(
            [sys.executable, "manage.py", "send_weekly_report", "--to", "finance@example.com"],
            cwd=django_settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        command.stop.set()
        serving.join(timeout=30)
    assert shell.returncode == 0, shell.stderr[-3000:]
    # The console backend: the message on the command's standard output.
    assert "To: finance@example.com" in shell.stdout
    assert f"{demo_url}/" in shell.stdout
    assert "localhost:8000" not in shell.stdout
    assert not (tmp_path / FILE_NAME).exists()  # the demo stopped: commands link as before
