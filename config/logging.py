"""Structured logging: request and node ids on every line, JSON when ``LOG_JSON`` is on.

Fields of a JSON line (one object per line, for Loki, Elasticsearch, CloudWatch…):

- ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``;
- ``request_id``: the id of the HTTP request being served (``X-Request-ID`` kept from the
  proxy when it sent a sane one, else a new one; echoed in the response). ``-`` outside a
  request (Celery tasks, management commands);
- ``node``: the hostname of the node whose agent is being served: the ingest view sets
  ``node_var`` once the token has named the node. ``-`` elsewhere;
- ``exc``: the traceback, when there is one;
- any ``extra={...}`` fields the call passed, e.g. the access line of
  ``config.middleware.RequestIdMiddleware`` (``method``, ``path``, ``status``, ``duration_ms``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from contextvars import ContextVar
from typing import Any

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")
node_var: ContextVar[str] = ContextVar("node", default="-")

# Attributes every LogRecord has; anything else on a record came in through ``extra``.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
_OWN_FIELDS = ("request_id", "node")


class RequestIdFilter(logging.Filter):
    """Copies the ids of the request being served onto every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.node = node_var.get()
        return True


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            # Records that missed the filter (a handler configured elsewhere) still carry the
            # current ids, read straight from the context.
            "request_id": getattr(record, "request_id", None) or request_id_var.get(),
            "node": getattr(record, "node", None) or node_var.get(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in _OWN_FIELDS and not key.startswith("_"):
                payload.setdefault(key, _jsonable(value))
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            payload["exc"] = record.exc_text
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        return json.dumps(payload, ensure_ascii=False)
