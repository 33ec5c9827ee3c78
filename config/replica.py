"""Reads from a PostgreSQL streaming replica, writes to the primary (docs/deploy.md, "Read
replica").

With ``DATABASE_REPLICA_URL`` set, the settings add a ``replica`` database and this module
decides, query by query, where a read goes:

- Only inside a *read scope* may reads go to the replica: a GET, HEAD or OPTIONS request
  (``ReplicaRoutingMiddleware``) outside the admin, the login pages and the probes, or a
  function under ``@replica_reads`` (the weekly report's figures). Everything else reads the
  primary: ingest, rollups, alert evaluation, Celery tasks, management commands, fleet_apply,
  the admin, every POST. Code that writes reads what it writes from the same server.
- Writes always go to the primary.
- Whoever writes reads the primary for a while: a request that writes (an unsafe method, or a
  GET whose code wrote, seen by the statement it ran) reads the primary for the rest of itself,
  and its client for ``REPLICA_STICKY_S`` seconds after it: a cookie for a browser, a cache entry
  keyed by the credential for an API token. So a page right after an admin change shows it.
- Inside a transaction on the primary, reads stay there (they must see its uncommitted writes).
- The replica is used while a check, at most every ``REPLICA_CHECK_INTERVAL_S`` per process,
  finds it answering, in recovery (a standby) and no more than ``REPLICA_MAX_LAG_S`` behind.
  Otherwise reads go to the primary and ``/readyz`` says why. A request whose replica reads
  fail anyway (the replica went away between two checks, a query cancelled by a conflict with
  recovery) is answered again from the primary, and the replica counts as down until the next
  check: a GET is safe to repeat, and nobody gets a 500 for a replica.
- One decision per scope: a page reads everything from the replica or everything from the
  primary, so its figures come from one point in time.

Raw SQL that only reads for a page takes its cursor from ``read_cursor()``, which follows the
same decision as the ORM. Raw SQL in ingest, rollups and partition maintenance keeps Django's
default connection, the primary, on purpose: those paths write and must read the primary.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from django.conf import settings
from django.core.cache import cache
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)
from django.db.backends.utils import CursorWrapper
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase

logger = logging.getLogger(__name__)

PRIMARY = DEFAULT_DB_ALIAS
REPLICA = "replica"
STICKY_COOKIE = "gpufleet_primary"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Read from the primary even on GET: the admin (whoever edits sees what is stored), the login
# pages (lockout counts), the probes and /metrics (they report the primary's state).
PRIMARY_PATHS = ("/admin/", "/accounts/", "/metrics", "/readyz", "/healthz")
PIN_KEY_PREFIX = "replica-pin:"
# Writes that pin nobody: agents push samples and never read pages or the finance API, and a
# cache write per push would cost ingest for nothing.
UNPINNED_URL_NAMES = frozenset({"ingest"})

P = ParamSpec("P")
T = TypeVar("T")


def replica_configured() -> bool:
    return REPLICA in connections.settings


# --- the scope: where this request's (or this block's) reads may go -----------------------


@dataclass
class _Scope:
    replica_allowed: bool
    alias: str | None = None  # decided at the first read, then kept
    used_replica: bool = False
    wrote: bool = False
    retried: bool = False  # answered again from the primary already


_scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "replica_scope", default=None
)


def read_alias() -> str:
    """The database the next read goes to (see the module's docstring)."""
    scope = _scope.get()
    if scope is None or not scope.replica_allowed or not replica_configured():
        return PRIMARY
    if connections[PRIMARY].in_atomic_block:
        return PRIMARY
    if scope.alias is None:
        scope.alias = REPLICA if replica_state().usable else PRIMARY
    if scope.alias == REPLICA:
        scope.used_replica = True
    return scope.alias


@contextmanager
def read_cursor(
    *, atomic: bool = False, binary: bool = False, large: bool = False
) -> Iterator[CursorWrapper]:
    """A cursor for raw SQL that only reads, on the database the ORM reads from now.
    ``atomic``: inside a transaction of its own there (for ``SET LOCAL``). ``binary``: the
    results in PostgreSQL's binary format (``binary_cursor``). ``large`` (PostgreSQL): a
    statement that hashes or sorts a row per GPU and day of a large fleet, in a transaction
    of its own with ``LARGE_READ_SETTINGS``."""
    alias = read_alias()
    connection = connections[alias]
    opened = binary_cursor(connection) if binary else connection.cursor()
    if atomic or large:
        with transaction.atomic(using=alias), opened as cursor:
            if large:
                cursor.execute(LARGE_READ_SQL)
            yield cursor
    else:
        with opened as cursor:
            yield cursor


# For the transaction of one large read (``read_cursor(large=True)``): its hashes and sorts of
# a row per GPU (and day) outgrow the default 4 MB at 1,000-10,000 GPUs and spill to disk;
# and the planner, which cannot know that an array of GPU ids joins one row each, takes such
# a statement for millions of rows and JIT-compiles it (~0.45 s of compiling for a 40 ms
# query at 10,000 GPUs).
LARGE_READ_SETTINGS = {"work_mem": "64MB", "jit": "off"}
LARGE_READ_SQL = "SELECT " + ", ".join(
    f"set_config('{name}', '{value}', true)" for name, value in LARGE_READ_SETTINGS.items()
)


def binary_cursor(connection: Any) -> CursorWrapper:
    """A cursor of ``connection`` (PostgreSQL) whose results come in the binary format: a
    float8 arrives as its 8 bytes and a timestamptz as an integer, read in C, where Django's
    cursors read text (tens of thousands of rows of 25 sums: ~0.1 s of parsing saved). The
    values are the same (PostgreSQL writes a float8 as text in its shortest exact form).
    Parameters are bound on the server, so the statement must name its GROUP BY columns by
    position (Django's statements on PostgreSQL do). Wrapped as Django wraps its own cursors:
    queries logged and counted, database errors Django's."""
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = psycopg.Cursor(connection.connection)
    raw.format = psycopg.pq.Format.BINARY
    if connection.queries_logged:
        return cast(CursorWrapper, connection.make_debug_cursor(raw))
    return cast(CursorWrapper, connection.make_cursor(raw))


# --- reads beside: a second connection working while this thread computes ----------------
_beside_lock = threading.Lock()
_beside: ThreadPoolExecutor | None = None  # made on first use, in each (forked) process


def _beside_pool() -> ThreadPoolExecutor:
    global _beside
    with _beside_lock:
        if _beside is None:
            _beside = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpufleet-reads")
        return _beside


def read_beside(fn: Callable[[], T]) -> Callable[[], T]:
    """Starts ``fn``, which only reads, on a connection of its own in another thread, and
    returns a function that waits for its result (or raises its error): a page's statements
    run on one core of the database server while its Python works on another. ``fn`` runs
    in a copy of this context, so its reads go where this scope's go (one decision per
    scope, as above); the thread's connections are closed when it is done.

    Run at once, in this thread, where a second connection would not read what this one
    does: inside a transaction (its own uncommitted writes, a test's data) or on SQLite."""
    if (
        any(connections[alias].in_atomic_block for alias in connections.settings)
        or connections[read_alias()].vendor != "postgresql"
    ):
        result = fn()
        return lambda: result
    context = contextvars.copy_context()

    def run() -> T:
        try:
            return context.run(fn)
        finally:
            connections.close_all()  # this thread's: a request's are closed by Django

    return _beside_pool().submit(run).result


def replica_reads(fn: Callable[P, T]) -> Callable[P, T]:
    """Runs ``fn``, a function that only reads, in a read scope (outside a request: the weekly
    report). If reading the replica fails, the replica counts as down and ``fn`` runs again on
    the primary. Inside an existing scope that scope's decision stands (a POST stays on the
    primary)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        if _scope.get() is not None or not replica_configured():
            return fn(*args, **kwargs)
        scope = _Scope(replica_allowed=True)
        token = _scope.set(scope)
        try:
            try:
                return fn(*args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                if not scope.used_replica:
                    raise
                replica_failed(exc, where=getattr(fn, "__qualname__", "a read"))
            _scope.set(_Scope(replica_allowed=False))
            return fn(*args, **kwargs)
        finally:
            _scope.reset(token)

    return wrapper


class ReplicaRouter:
    """Django's database router: reads where ``read_alias`` says, writes to the primary, no
    migrations on the replica (it replays the primary's)."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return read_alias() if replica_configured() else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        # Always the primary, also for an object read from the replica (its hint says replica).
        return PRIMARY if replica_configured() else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        # Both hold the same rows: an object read from the replica may point to one read from
        # the primary.
        both = {PRIMARY, REPLICA}
        return True if obj1._state.db in both and obj2._state.db in both else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == REPLICA else None


# --- the replica's health ------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaState:
    """What the last check found. ``state``: ``ok`` (reads go there), ``lagging`` (more than
    ``REPLICA_MAX_LAG_S`` behind, or how far is unknown), ``down`` (no answer, or its reads
    failed), ``not_standby`` (it answers but is not in recovery: a promoted or wrong server)."""

    state: str
    lag_s: float | None
    checked_at: float  # time.monotonic()
    detail: str = ""

    @property
    def usable(self) -> bool:
        return self.state == "ok"


# The replica's replay position against the primary's WAL position read just before: caught
# up means no lag, whatever the time since the last commit (an idle primary sends nothing).
# Otherwise the lag is the time since the last transaction it replayed committed.
_LAG_SQL = (
    "SELECT pg_is_in_recovery(),"
    " COALESCE(pg_last_wal_replay_lsn() >= %s::pg_lsn, false),"
    " EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())"
)

_last: ReplicaState | None = None


def _error(exc: BaseException) -> str:
    # The class name only: the message may name a host, and /readyz is public.
    return f"error: {type(exc).__name__}"


def _replica_close() -> None:
    try:
        connections[REPLICA].close()
    except DatabaseError:  # already broken: nothing to close cleanly
        pass


def replica_check() -> ReplicaState:
    """Asks the replica now (and the primary for its WAL position); remembers the answer."""
    global _last
    primary_lsn = None
    try:
        with connections[PRIMARY].cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_lsn()")
            primary_lsn = cursor.fetchone()[0]
    except DatabaseError:
        pass  # the primary's own trouble is /readyz's "database"; judge the replica by time
    try:
        with connections[REPLICA].cursor() as cursor:
            cursor.execute(_LAG_SQL, [primary_lsn])
            in_recovery, caught_up, behind_s = cursor.fetchone()
    except Exception as exc:  # noqa: BLE001 - whatever the failure, reads must not go there
        _replica_close()
        state = ReplicaState("down", None, time.monotonic(), _error(exc))
    else:
        if not in_recovery:
            state = ReplicaState("not_standby", None, time.monotonic())
        else:
            lag = 0.0 if caught_up else None if behind_s is None else max(0.0, float(behind_s))
            ok = lag is not None and lag <= settings.REPLICA_MAX_LAG_S
            state = ReplicaState("ok" if ok else "lagging", lag, time.monotonic())
    _last = state
    return state


def replica_state() -> ReplicaState:
    """The last check's answer while it is younger than ``REPLICA_CHECK_INTERVAL_S``, else a
    new check (one request per process and interval pays for it)."""
    last = _last
    if last is not None and time.monotonic() - last.checked_at < settings.REPLICA_CHECK_INTERVAL_S:
        return last
    return replica_check()


def replica_failed(exc: BaseException | str, *, where: str) -> None:
    """Reads on the replica failed: it counts as down until the next check."""
    global _last
    detail = exc if isinstance(exc, str) else _error(exc)
    logger.warning("replica reads failed (%s) in %s: read again from the primary", detail, where)
    _replica_close()
    _last = ReplicaState("down", None, time.monotonic(), detail)


def replica_forget() -> None:
    """Forget the last check (tests; the next read checks again)."""
    global _last
    _last = None


def replica_report() -> dict[str, Any]:
    """For ``/readyz``: the replica's state from a new check, its lag in seconds and where
    reads go now."""
    state = replica_check()
    report: dict[str, Any] = {
        "replica": state.detail if state.state == "down" else state.state,
        "replica_lag_s": None if state.lag_s is None else round(state.lag_s, 3),
        "reads": "replica" if state.usable else "primary",
    }
    return report


# --- requests -------------------------------------------------------------------------------

# A statement that changes data. Transaction control, SET and plain SELECTs do not pin.
_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|MERGE|COPY|TRUNCATE)\b", re.IGNORECASE)
_WITH_WRITE = re.compile(r"^\s*WITH\b.*\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE | re.DOTALL)


def _pin_key(request: HttpRequest) -> str | None:
    auth = request.headers.get("Authorization", "")
    if not auth:
        return None
    # A digest: the credential itself never reaches the cache.
    return PIN_KEY_PREFIX + hashlib.sha256(auth.encode()).hexdigest()[:32]


def _pinned(request: HttpRequest) -> bool:
    """Whether this client wrote within ``REPLICA_STICKY_S`` seconds."""
    if STICKY_COOKIE in request.COOKIES:
        return True
    key = _pin_key(request)
    if key is None:
        return False
    try:
        return cache.get(key) is not None
    except Exception:  # noqa: BLE001 - the cache is down: we cannot tell, so the primary
        return True


def _in_scope(content: Iterable[T], scope: _Scope) -> Iterator[T]:
    """``content``, each item pulled within ``scope`` (and the scope left after each)."""
    items = iter(content)
    while True:
        token = _scope.set(scope)
        try:
            item = next(items)
        except StopIteration:
            return
        finally:
            _scope.reset(token)
        yield item


class ReplicaRoutingMiddleware:
    """Opens each request's read scope (see the module's docstring), watches the primary for
    writes, answers again from the primary when the replica failed, and pins whoever wrote."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not replica_configured():
            return self.get_response(request)
        safe = request.method in SAFE_METHODS
        allowed = safe and not request.path.startswith(PRIMARY_PATHS) and not _pinned(request)
        scope = _Scope(replica_allowed=allowed)
        token = _scope.set(scope)
        try:
            replica = connections[REPLICA] if allowed else None
            if replica is not None and replica.errors_occurred:  # an earlier request's
                if replica.connection is None:
                    replica.errors_occurred = False  # closed since: the next connect is new
                else:
                    replica.close_if_unusable_or_obsolete()
            response = self._respond(request, scope)
            failed = scope.used_replica and connections[REPLICA].errors_occurred
            if failed and not scope.retried:
                # An error the view turned into a response itself (the API answers 503 when
                # the database is away), or one it swallowed: answer again from the primary.
                replica_failed("error: reads failed", where=f"{request.method} {request.path}")
                scope = _Scope(replica_allowed=False, retried=True)
                _scope.set(scope)
                response = self._respond(request, scope)
        finally:
            _scope.reset(token)
        url_name = getattr(request.resolver_match, "url_name", None)
        if scope.wrote or (not safe and url_name not in UNPINNED_URL_NAMES):
            self._pin(request, response)
        if (
            isinstance(response, StreamingHttpResponse)
            and not response.is_async
            and scope.replica_allowed
        ):
            # A streamed CSV computes its rows while the server sends it, after this method
            # has returned: each row is read within the request's choice too.
            content = cast(Iterator[bytes], response.streaming_content)  # not async: above
            response.streaming_content = _in_scope(content, scope)
        return response

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        """A view raised on reading the replica: run it again on the primary, before Django
        turns the error into a 500."""
        scope = _scope.get()
        if scope is None or not scope.used_replica or scope.retried:
            return None
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        replica_failed(exception, where=f"{request.method} {request.path}")
        scope.replica_allowed = False
        scope.retried = True
        match = request.resolver_match
        if match is None:
            return None
        response: HttpResponseBase = match.func(request, *match.args, **match.kwargs)
        render = getattr(response, "render", None)
        if callable(render):  # a TemplateResponse: Django renders it only before this hook
            response = render()
        return response

    def _respond(self, request: HttpRequest, scope: _Scope) -> HttpResponseBase:
        if not scope.replica_allowed:
            return self.get_response(request)

        def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if not scope.wrote and (_WRITE.match(sql) or _WITH_WRITE.match(sql)):
                # From here on this request reads what it wrote.
                scope.wrote = True
                scope.replica_allowed = False
            return execute(sql, params, many, context)

        with connections[PRIMARY].execute_wrapper(watch):
            return self.get_response(request)

    def _pin(self, request: HttpRequest, response: HttpResponseBase) -> None:
        sticky_s = settings.REPLICA_STICKY_S
        key = _pin_key(request)
        if key is None:  # a browser
            response.set_cookie(
                STICKY_COOKIE,
                "1",
                max_age=sticky_s,
                httponly=True,
                samesite="Lax",
                secure=settings.SESSION_COOKIE_SECURE,
            )
        else:  # a token client keeps no cookie
            try:
                cache.set(key, 1, timeout=sticky_s)
            except Exception:  # noqa: BLE001 - the cache is down: the next read may be stale
                logger.warning("replica: could not pin a token client to the primary")
