"""Browser tests: Playwright driving Debian's Chromium (never ``playwright install``).

Every test here gets a page that fails the test on a console error, an uncaught page error,
or any request that would leave the machine (anything not to 127.0.0.1/localhost).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import IN_CI

CHROMIUM = os.environ.get("GPUFLEET_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
ROOT = Path(__file__).resolve().parent.parent.parent
# Screenshots go to var/screenshots/ (ignored by git), so a test run leaves the tree clean.
# The README's own screenshots (docs/screenshots/) are rewritten only when asked:
# ``python3 dev.py test --screenshots`` sets this variable.
UPDATE_README_SCREENSHOTS = "GPUFLEET_UPDATE_SCREENSHOTS"
README_SCREENSHOTS = ROOT / "docs" / "screenshots"
TEST_BUDGET_S = 180  # a hard bound on each browser test
PLOTLY_FINDER = "billing.staticfiles.PlotlyJsFinder"


def screenshot_path(name: str, *, readme: bool = False) -> Path:
    """Where the screenshot ``name`` goes: ``var/screenshots/`` (or ``$GPUFLEET_VAR_DIR``'s),
    except a README screenshot (``readme``) when ``GPUFLEET_UPDATE_SCREENSHOTS=1``, which
    goes to ``docs/screenshots/``."""
    if readme and os.environ.get(UPDATE_README_SCREENSHOTS) == "1":
        folder = README_SCREENSHOTS
    else:
        folder = Path(os.environ.get("GPUFLEET_VAR_DIR", str(ROOT / "var"))) / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.png"


def _chromium_present() -> bool:
    return os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM) is not None


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """pytest-playwright's launch arguments, pointed at Debian's Chromium."""
    if not _chromium_present():
        message = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # Playwright's sync API runs an event loop in the main thread from here until the session
    # ends; Django's ORM (the test database teardown included) refuses to run under one unless
    # told it is safe, which it is: the loop only waits on the browser. Only a session that
    # starts the browser gets this.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    return {
        **browser_context_args,
        "viewport": {"width": 1440, "height": 900},
        "device_scale_factor": 1,
    }


@pytest.fixture(autouse=True)
def _e2e_environment(settings: Any) -> Iterator[None]:
    finders = list(
        getattr(
            settings,
            "STATICFILES_FINDERS",
            [
                "django.contrib.staticfiles.finders.FileSystemFinder",
                "django.contrib.staticfiles.finders.AppDirectoriesFinder",
            ],
        )
    )
    if PLOTLY_FINDER not in finders:  # until config/settings lists it
        settings.STATICFILES_FINDERS = finders + [PLOTLY_FINDER]

    def too_long(signum: int, frame: Any) -> None:
        raise TimeoutError(f"browser test ran past {TEST_BUDGET_S} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(TEST_BUDGET_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class PageProblems:
    """What went wrong in the browser during one test."""

    def __init__(self) -> None:
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.foreign_requests: list[str] = []

    def assert_clean(self) -> None:
        assert not self.foreign_requests, f"requests left localhost: {self.foreign_requests}"
        assert not self.console_errors, f"console errors: {self.console_errors}"
        assert not self.page_errors, f"page errors: {self.page_errors}"


@pytest.fixture
def problems() -> PageProblems:
    return PageProblems()


def watch(page: Any, problems: PageProblems) -> Any:
    """Record on ``problems`` what goes wrong on ``page``; refuse requests that leave
    localhost."""
    page.set_default_timeout(20_000)
    page.set_default_navigation_timeout(30_000)

    def route(route: Any) -> None:
        parts = urlsplit(route.request.url)
        if parts.scheme in ("data", "blob", "about") or parts.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            problems.foreign_requests.append(route.request.url)
            route.abort()

    page.route("**/*", route)
    page.on(
        "console", lambda m: problems.console_errors.append(m.text) if m.type == "error" else None
    )
    page.on("pageerror", lambda e: problems.page_errors.append(str(e)))
    return page


@pytest.fixture
def page(page: Any, problems: PageProblems) -> Iterator[Any]:
    """pytest-playwright's page, watched: console errors, page errors, foreign requests."""
    yield watch(page, problems)
    problems.assert_clean()


@pytest.fixture
def open_page(browser: Any, problems: PageProblems) -> Iterator[Any]:
    """``open_page(width, scheme)``: a new watched page in its own browser context, that
    wide (900 px high) and with ``prefers-color-scheme`` set to ``"light"`` or ``"dark"``."""
    contexts: list[Any] = []

    def make(width: int, scheme: str) -> Any:
        context = browser.new_context(
            viewport={"width": width, "height": 900}, device_scale_factor=1, color_scheme=scheme
        )
        contexts.append(context)
        return watch(context.new_page(), problems)

    yield make
    for context in contexts:
        context.close()
    problems.assert_clean()
