"""Where the browser tests put their screenshots: a plain test run leaves the committed
README screenshots alone (issue 18, item 15). No browser needed."""

from __future__ import annotations

from typing import Any

import dev
from tests.e2e.conftest import README_SCREENSHOTS, UPDATE_README_SCREENSHOTS, screenshot_path


def test_screenshots_go_to_var_unless_asked(monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("GPUFLEET_VAR_DIR", str(tmp_path))
    monkeypatch.delenv(UPDATE_README_SCREENSHOTS, raising=False)
    assert screenshot_path("overview", readme=True) == tmp_path / "screenshots" / "overview.png"
    assert (tmp_path / "screenshots").is_dir()
    monkeypatch.setenv(UPDATE_README_SCREENSHOTS, "1")
    assert screenshot_path("overview", readme=True) == README_SCREENSHOTS / "overview.png"
    # Only the README's own set goes there: the 390 px and dark ones never do.
    assert screenshot_path("overview-390-dark") == tmp_path / "screenshots" / (
        "overview-390-dark.png"
    )


def test_dev_py_test_screenshots_flag() -> None:
    assert dev.screenshots_flag(["tests/e2e", "-q"]) == (["tests/e2e", "-q"], {})
    args, env = dev.screenshots_flag(["--screenshots", "tests/e2e", "-q"])
    assert args == ["tests/e2e", "-q"]
    assert env == {UPDATE_README_SCREENSHOTS: "1"}
