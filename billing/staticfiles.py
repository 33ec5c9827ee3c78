"""Serves plotly.js from the installed plotly package as ``js/plotly.min.js``.

The file is never committed and never fetched from a CDN: the browser always gets exactly the
plotly.js that the installed Python ``plotly`` bundles (``plotly/package_data/plotly.min.js``),
so the figures built in ``billing.charts`` and the library that draws them cannot drift apart.
Works with ``findstatic``, ``collectstatic`` (whitenoise then compresses it) and whitenoise's
``WHITENOISE_USE_FINDERS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import CheckMessage, Error
from django.core.files.storage import FileSystemStorage

PLOTLY_STATIC_PATH = "js/plotly.min.js"


def plotly_js_path() -> Path:
    """The plotly.min.js bundled with the installed plotly package."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


class _PrefixedStorage(FileSystemStorage):
    """plotly's package_data folder seen as ``js/``: collectstatic and whitenoise honour
    ``prefix``, so ``js/plotly.min.js`` maps to ``package_data/plotly.min.js``."""

    prefix = "js"


class PlotlyJsFinder(BaseFinder):
    """A staticfiles finder with exactly one file: ``js/plotly.min.js``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.source = plotly_js_path()
        self.storage = _PrefixedStorage(location=str(self.source.parent))

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        if not self.source.is_file():
            return [Error(f"plotly.js not found at {self.source}", id="billing.E001")]
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        # Django 5.2 renamed ``all`` to ``find_all``; accept both.
        find_all = find_all or bool(kwargs.get("all", False))
        if path == PLOTLY_STATIC_PATH and self.source.is_file():
            return [str(self.source)] if find_all else str(self.source)
        return [] if find_all else None

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        if self.source.is_file():
            yield self.source.name, self.storage
