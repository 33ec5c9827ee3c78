"""The weekly email's trend chart: a Plotly figure rendered to PNG by kaleido and Chromium.

The chart is a nice-to-have: without a browser, or when rendering fails or hangs, the email
goes out without it (``trend_png`` returns ``None`` and logs why).

A render starts a headless Chromium (3–4 s), so each PNG is kept in the cache under a hash of
its figure: the same week with the same figures is drawn once, however often it is previewed
or sent, and new figures (late data) make a new key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.cache import cache

from billing.charts import round_axis
from billing.selectors import CostRow

logger = logging.getLogger(__name__)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WIDTH_PX, HEIGHT_PX = 640, 260
RENDER_TIMEOUT_S = 60
CACHE_TTL_S = 8 * 24 * 3600  # a week's chart outlives its week's sending and previews
# kaleido's sync entry points share one browser session per process and are not thread-safe
# (kaleido drives one Chromium): one render at a time.
_RENDER_LOCK = threading.Lock()
# The renderer's own loggers: every step of a render at INFO (two dozen lines per PNG).
RENDERER_LOGGERS = ("kaleido", "choreographer", "logistro")
# choreographer's pipe logs a browser message it cannot decode as an ERROR with a traceback,
# then ignores it and the render goes on (seen on a first render).
UNDECODED_MESSAGE = "JSONError decoding message"
_quiet_done = False


class _IgnoredMessageFilter(logging.Filter):
    """choreographer's "JSONError decoding message. Ignoring": one DEBUG line without the
    traceback, since choreographer drops that message and the render does not depend on it.
    A render that does fail is logged by ``trend_png``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(UNDECODED_MESSAGE):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info, record.exc_text = None, None
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def renderer_logs_quiet() -> None:
    """Warnings and errors only from kaleido and choreographer, and their ignored-message
    error as one debug line (once per process; a LOGGING setting for these loggers wins)."""
    global _quiet_done
    if _quiet_done:
        return
    for name in RENDERER_LOGGERS:
        named = logging.getLogger(name)
        if named.level == logging.NOTSET:
            named.setLevel(logging.WARNING)
    logging.getLogger("choreographer.channels.pipe").addFilter(_IgnoredMessageFilter())
    _quiet_done = True


def chromium_path() -> str | None:
    """The browser kaleido drives: ``settings.KALEIDO_BROWSER_PATH`` or ``$BROWSER_PATH`` if
    set, else Debian's ``/usr/bin/chromium`` or a chromium/chrome on ``PATH``."""
    configured = getattr(settings, "KALEIDO_BROWSER_PATH", "") or os.environ.get("BROWSER_PATH", "")
    candidates = (
        [configured]
        if configured
        else [
            "/usr/bin/chromium",
            shutil.which("chromium") or "",
            shutil.which("chromium-browser") or "",
            shutil.which("google-chrome") or "",
        ]
    )
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def trend_figure(rows: Sequence[CostRow], *, currency: str) -> Any:
    """Daily fleet utilisation (line) and idle cost (bars) over the rows' days."""
    import plotly.graph_objects as go

    days = [r.period_start.date().isoformat() for r in rows]
    idle = [float(r.idle_cost) for r in rows]
    fig = go.Figure()
    fig.add_bar(
        x=days,
        y=idle,
        name=f"Idle cost ({currency})",
        marker_color="#e8a33d",
        yaxis="y2",
    )
    fig.add_scatter(
        x=days,
        y=[(r.utilization or 0.0) * 100 for r in rows],
        name="Utilisation (%)",
        mode="lines+markers",
        line={"color": "#2b6cb0", "width": 3},
    )
    fig.update_layout(
        width=WIDTH_PX,
        height=HEIGHT_PX,
        margin={"l": 50, "r": 60, "t": 20, "b": 40},
        paper_bgcolor="#ffffff",
        plot_bgcolor="#ffffff",
        font={"family": "Arial, Helvetica, sans-serif", "size": 12, "color": "#1a202c"},
        legend={"orientation": "h", "y": 1.12, "x": 0},
        yaxis={"title": "Utilisation %", "rangemode": "tozero", "gridcolor": "#e2e8f0"},
        yaxis2={
            "title": f"Idle cost {currency}",
            "overlaying": "y",
            "side": "right",
            "showgrid": False,
            "tickformat": ",.0f",
            **round_axis(idle),  # round ticks (Plotly's follow the left axis: 239, 477, 716)
        },
        xaxis={"type": "date", "tickformat": "%d %b"},
        bargap=0.3,
    )
    return fig


def render_png(fig: Any, *, browser: str) -> bytes:
    """One PNG through kaleido. MathJax is switched off in kaleido itself: otherwise it
    fetches MathJax from a CDN, which an offline server cannot reach."""
    import kaleido

    renderer_logs_quiet()
    with _RENDER_LOCK:
        png = kaleido.calc_fig_sync(
            fig,
            opts={"format": "png", "width": WIDTH_PX, "height": HEIGHT_PX},
            kopts={"mathjax": False, "path": browser, "timeout": RENDER_TIMEOUT_S},
        )
    return bytes(png)


def _cache_key(fig: Any) -> str:
    """The figure's hash: its data, layout and size, so equal figures share one PNG."""
    spec = json.dumps(fig.to_plotly_json(), sort_keys=True, default=str)
    return "report-chart:" + hashlib.sha256(spec.encode()).hexdigest()


def _cached(key: str) -> bytes | None:
    try:
        png = cache.get(key)
    except Exception:  # the cache is an optimisation: Redis away means one more render
        logger.warning("weekly report: chart cache unavailable", exc_info=True)
        return None
    return png if isinstance(png, bytes) and png.startswith(PNG_MAGIC) else None


def trend_png(rows: Sequence[CostRow], *, currency: str) -> bytes | None:
    """The chart as PNG bytes, from the cache or rendered once; ``None`` when it cannot be
    made here."""
    if not rows:
        return None
    browser = chromium_path()
    if browser is None:
        logger.info("weekly report: no Chromium found; sending without the chart")
        return None
    fig = trend_figure(rows, currency=currency)
    key = _cache_key(fig)
    png = _cached(key)
    if png is not None:
        return png
    try:
        png = render_png(fig, browser=browser)
    except Exception:  # a chart must never stop the report: log it and send without
        logger.warning("weekly report: chart rendering failed; sending without it", exc_info=True)
        return None
    if not png.startswith(PNG_MAGIC):
        logger.warning("weekly report: kaleido returned something that is not a PNG")
        return None
    try:
        cache.set(key, png, CACHE_TTL_S)
    except Exception:
        logger.warning("weekly report: chart cache unavailable", exc_info=True)
    return png
