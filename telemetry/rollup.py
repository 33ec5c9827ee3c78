"""Hourly per-GPU rollups of raw samples (docs/metrics.md), computed in the database.

Ingest marks the hours it touched (``telemetry.pending.hours_mark``); :func:`rollup_run`
recomputes the marked hours in batches, each batch one set-based statement
(``telemetry/sql/rollup_upsert.*.sql``), and clears the marks it read in the same transaction:
that is the watermark. A worker killed halfway leaves the marks of its open batch, and the next
run redoes them; two runs at once are serialised by a lock, so either way the rows end the same
as after one clean run.

A batch whose statement fails for a reason that is not transient (bad data, not a lost
connection or a lock timeout) is recomputed hour by hour, so the bad hour fails alone; it counts
a failure on its mark, and after ``ROLLUP_MAX_FAILURES`` the mark is set aside (logged, shown in
``/metrics`` and the admin, where it is put back in the queue) and no longer holds up the hours
after it.

Hours older than the raw-retention horizon are never recomputed: retention may have dropped
their samples, and a rollup of no samples would delete history that only the rollups keep.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.models import FleetSettings, zone_or_utc
from telemetry.models import HOURLY_STATS, USAGE_SUMS, RollupColumn
from telemetry.pending import hours_mark
from telemetry.selectors import rollup_lag_seconds
from telemetry.tasks import TRANSIENT_ERRORS

logger = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parent / "sql"
HOUR = dt.timedelta(hours=1)
# 24 hours per statement: a day of a large fleet is one statement (docs/benchmarks.md), while a
# backfill of months still commits, and shows progress, a day at a time.
BATCH_HOURS = 24
# A batch never spans more than this from its first hour: the statement scans the batch's
# span of the start index, so a late sample of last week and this hour go in separate batches.
BATCH_SPAN = dt.timedelta(hours=48)
# The advisory lock that names "the rollup" on PostgreSQL (any constant bigint will do; this is
# b"gpuroll" read as an integer, so it is unlikely to collide with another application's key).
ROLLUP_LOCK_KEY = 0x677075726F6C6C
# SQLite: the hour key of a sample or row, as Django stores datetimes there (naive UTC text).
SQLITE_HOUR_FMT = "%Y-%m-%d %H:00:00"
# What a failed hour's mark keeps of the error (the admin shows it; the log has it whole).
ERROR_TEXT_MAX = 2000


def open_hour_every_s() -> int:
    """Seconds between two recomputes of the hour in progress (``ROLLUP_OPEN_HOUR_EVERY_S``,
    default 60: every run, as the beat runs it every minute). Each recompute rewrites every
    GPU's hour, day and month rows, so a longer spacing divides the rollup's writes (WAL) by
    it, while today's figures trail the samples by up to that long (docs/deploy.md, "Sizing").
    Closed hours are recomputed at the first run that finds them marked, whatever this is."""
    return max(0, int(getattr(settings, "ROLLUP_OPEN_HOUR_EVERY_S", 60)))


def _open_hour_recent(hour: dt.datetime, *, now: dt.datetime, every_s: int) -> bool:
    """Whether the hour in progress was recomputed less than ``every_s`` seconds ago (its
    rows' latest ``computed_at``: one read of the hour index), so that this run leaves it."""
    if every_s <= 60 or hour != _hour_floor(now):
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(computed_at) FROM telemetry_hourlyusage WHERE hour = %s",
            [_db_datetime(hour)],
        )
        row = cursor.fetchone()
    last = row[0] if row else None
    if last is None:
        return False
    # Less a few seconds: a run of the beat's minute that comes a little early is not put off
    # by a whole period.
    return (now - _as_utc(last)).total_seconds() < every_s - 5


@dataclass(frozen=True)
class RollupResult:
    """What one run did: hours recomputed, rows written (upserted) and deleted (no longer
    counted), hours skipped as older than the retention horizon, and the lag left behind."""

    hours: int = 0
    rows: int = 0
    deleted: int = 0
    skipped_hours: int = 0
    lag_s: float = 0.0
    busy: bool = False
    failed_hours: int = 0
    set_aside_hours: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        text = (
            f"rollup: {self.hours} hours rolled, {self.rows} rows written, "
            f"{self.deleted} rows deleted, {self.skipped_hours} hours skipped, "
            f"lag {self.lag_s:.0f} s"
        )
        if self.failed_hours:
            text += f", {self.failed_hours} hours failed ({self.set_aside_hours} set aside)"
        return text + (" (stopped: another rollup holds the lock)" if self.busy else "")


@dataclass(frozen=True)
class _Mark:
    hour: dt.datetime  # aware UTC hour start
    raw_hour: Any  # the value as the database returned it, to clear exactly that row
    version: int


@cache
def _sql(name: str) -> str:
    """The statement in ``telemetry/sql/<name>.sql`` (comments and all: they cost nothing), its
    column lists filled in (see :func:`_column_lists`)."""
    return _PLACEHOLDER.sub(_column_list_fill, (SQL_DIR / f"{name}.sql").read_text())


# A column list in a statement's template: ``{name}`` (the SQL files hold no other braces).
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# Where generated lists wrap, like the hand-written SQL around them.
_SQL_WIDTH = 100


@cache
def _column_lists() -> dict[str, tuple[list[str], str]]:
    """The column lists the SQL templates name, made from ``USAGE_SUMS`` and ``HOURLY_STATS``
    (telemetry.models), and two shared fragments: name → (items, separator). Names and
    constant SQL from code only, never values, so filling them in is not building SQL from
    input."""
    sums = [c.name for c in USAGE_SUMS]
    hourly: list[RollupColumn] = [*USAGE_SUMS, *HOURLY_STATS]
    names = [c.name for c in hourly]
    return {
        # The rollup: per-sample values (each with its leading comma), the hour's values, and
        # the upsert's lists.
        "sample_values": ([f", {c.sample} AS {c.name}" for c in USAGE_SUMS if c.sample], "\n"),
        "hourly_values": ([f"{c.hourly} AS {c.name}" for c in hourly], ",\n"),
        "hourly_columns": (names, ", "),
        "agg_columns": ([f"agg.{n}" for n in names], ", "),
        "updates": ([f"{n} = excluded.{n}" for n in names], ",\n"),
        "stored_values": ([f"telemetry_hourlyusage.{n}" for n in names], ", "),
        "excluded_values": ([f"excluded.{n}" for n in names], ", "),
        # The daily table: the sums of its hourly rows.
        "sum_columns": (sums, ", "),
        "sums": ([f"sum({n})" for n in sums], ", "),
        # Its refresh in place (daily_refresh): the fresh sums, stored and fresh values
        # compared, and the update's list.
        "sums_as": ([f"sum({n}) AS {n}" for n in sums], ",\n"),
        "fresh_sums": ([f"f.{n}" for n in sums], ", "),
        "stored_sums_d": ([f"d.{n}" for n in sums], ", "),
        "stored_sums_m": ([f"m.{n}" for n in sums], ", "),
        "fresh_updates": ([f"{n} = f.{n}" for n in sums], ",\n"),
        # Statement fragments both workload statements use (sql/_<name>.postgresql.sql), a
        # line each: the upsert's rewrite of changed rows only, and the move of first and
        # last seen.
        **{
            name: (_fragment_lines(name), "\n")
            for name in ("workload_upsert_conflict", "workload_seen")
        },
    }


def _fragment_lines(name: str) -> list[str]:
    """A fragment's lines, less its leading comment (the placeholder's column indents them)."""
    text = (SQL_DIR / f"_{name}.postgresql.sql").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("--")]


def _column_list_fill(match: re.Match[str]) -> str:
    """One ``{name}`` of a template: its list, lined up under the placeholder's column (a
    ", " list wrapped at the width of the SQL around it, others one item per line)."""
    items, separator = _column_lists()[match.group(1)]
    line_start = match.string.rfind("\n", 0, match.start()) + 1
    indent = " " * (match.start() - line_start)
    if separator != ", ":
        return (separator + indent).join(items)
    wrapped = textwrap.fill(
        ", ".join(items),
        width=_SQL_WIDTH,
        initial_indent=indent,
        subsequent_indent=indent,
        break_on_hyphens=False,
    )
    return wrapped[len(indent) :]


def _is_postgres() -> bool:
    return connection.vendor == "postgresql"


def _dialect_sql(name: str) -> str:
    return _sql(f"{name}.{'postgresql' if _is_postgres() else 'sqlite'}")


def _as_utc(value: Any) -> dt.datetime:
    """A datetime as the database returned it (SQLite may return text) → aware UTC."""
    parsed = value if isinstance(value, dt.datetime) else parse_datetime(str(value))
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    if timezone.is_naive(parsed):  # SQLite stores naive UTC
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def _hour_floor(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def _sqlite_text(value: dt.datetime) -> str:
    # The text Django's SQLite backend writes for an aware datetime with USE_TZ (naive UTC).
    return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat(" ")


def _db_datetime(value: dt.datetime) -> dt.datetime | str:
    """A datetime parameter of a hand-written statement, stored as the ORM stores it."""
    return value if _is_postgres() else _sqlite_text(value)


def retention_horizon(*, now: dt.datetime | None = None) -> dt.datetime:
    """The first hour whose raw samples retention has certainly left whole.

    Retention drops samples older than ``RAW_RETENTION_DAYS``; the hour that holds that cutoff
    may be cut in two, so the horizon is the next whole hour. Older hours are never recomputed.
    """
    cutoff = (now or timezone.now()) - dt.timedelta(days=settings.RAW_RETENTION_DAYS)
    return _hour_floor(cutoff) + HOUR


def _batches(hours: Sequence[dt.datetime]) -> Iterator[list[dt.datetime]]:
    """Sorted hours → batches of at most BATCH_HOURS hours spanning at most BATCH_SPAN."""
    batch: list[dt.datetime] = []
    for hour in sorted(set(hours)):
        if batch and (len(batch) >= BATCH_HOURS or hour - batch[0] >= BATCH_SPAN):
            yield batch
            batch = []
        batch.append(hour)
    if batch:
        yield batch


def _lock(*, wait: bool) -> bool:
    """Take the rollup lock for the current transaction; False when busy and not waiting.

    PostgreSQL: an advisory transaction lock, released by commit, rollback or a dead
    connection. SQLite: the settings open every transaction with BEGIN IMMEDIATE, which already
    holds the database's write lock, so rollups (and ingest) are serialised by then.
    """
    if not _is_postgres():
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            _sql(f"rollup_lock_{'wait' if wait else 'try'}.postgresql"), {"key": ROLLUP_LOCK_KEY}
        )
        row = cursor.fetchone()
    return wait or bool(row and row[0])


def _recompute(batch: list[dt.datetime], *, active_util_pct: float) -> tuple[int, int]:
    """Recompute one batch of hours in the current transaction → (rows written, rows deleted)."""
    now = timezone.now()
    lo, hi = batch[0], batch[-1] + HOUR
    contiguous = len(batch) == (hi - lo) // HOUR
    with connection.cursor() as cursor:
        if _is_postgres():
            # The batch's sums group a sample per row into a row per (GPU, hour); with the
            # default 4 MB of work_mem the planner sorts the samples on disk first (a day of
            # 1,000 GPUs: 365 MB), with this it hashes them in ~40 MB. This transaction only.
            cursor.execute("SELECT set_config('work_mem', '128MB', true)")
            cursor.execute(
                _sql("rollup_upsert.postgresql"),
                {
                    "hours": batch,
                    "lo": lo,
                    "hi": hi,
                    "contiguous": contiguous,
                    "active_util_pct": active_util_pct,
                    "now": now,
                },
            )
            row = cursor.fetchone()
            assert row is not None
            written, deleted, pair_gpus, pair_hours = int(row[0]), int(row[1]), row[2], row[3]
            if pair_gpus:
                # The workloads' rows of the (GPU, hour)s the upsert could not sum from its
                # own scan, after the GPUs' rows: they take the GPU-hour's attribution.
                cursor.execute(
                    _sql("rollup_workloads.postgresql"),
                    {
                        "lo": lo,
                        "hi": hi,
                        "contiguous": contiguous,
                        "hours": batch,
                        "now": now,
                        "pair_gpus": pair_gpus,
                        "pair_hours": pair_hours,
                    },
                )
            workload_daily_refresh(batch)
            return written, deleted
        hours_json = json.dumps([_sqlite_text(h) for h in batch])
        cursor.execute(_sql("rollup_stale_delete.sqlite"), {"hours": hours_json})
        deleted = _sqlite_changes(cursor)
        params: dict[str, Any] = {
            "hours": hours_json,
            "lo": _sqlite_text(lo),
            "hi": _sqlite_text(hi),
            "contiguous": contiguous,
            "hour_fmt": SQLITE_HOUR_FMT,
            "active_util_pct": active_util_pct,
            "now": _sqlite_text(now),
        }
        cursor.execute(_sql("rollup_upsert.sqlite"), params)
        written = _sqlite_changes(cursor)
        cursor.execute(_sql("rollup_workloads_stale.sqlite"), {"hours": hours_json})
        cursor.execute(_sql("rollup_workloads.sqlite"), params)
        cursor.execute(_sql("rollup_workloads_seen.sqlite"), params)
    workload_daily_refresh(batch)
    return written, deleted


def _sqlite_changes(cursor: Any) -> int:
    # sqlite3's rowcount is -1 for a statement that starts with WITH; changes() is exact
    # (rows inserted or updated by the upsert, or deleted).
    cursor.execute("SELECT changes()")
    return int(cursor.fetchone()[0])


def _marks_read(*, after: Any, limit: int) -> list[_Mark]:
    with connection.cursor() as cursor:
        cursor.execute(_sql("rollup_marks_read"), {"after": after, "limit": limit})
        rows = cursor.fetchall()
    return [_Mark(hour=_as_utc(raw), raw_hour=raw, version=int(v)) for raw, v in rows]


def _marks_clear(marks: Sequence[_Mark]) -> None:
    """Delete these marks at the version read (the watermark; see rollup_marks_clear.*.sql)."""
    if not marks:
        return
    with connection.cursor() as cursor:
        if _is_postgres():
            cursor.execute(
                _sql("rollup_marks_clear.postgresql"),
                {"hours": [m.raw_hour for m in marks], "versions": [m.version for m in marks]},
            )
        else:
            cursor.executemany(
                _sql("rollup_marks_clear.sqlite"),
                [{"hour": m.raw_hour, "version": m.version} for m in marks],
            )


def _attempt(
    hours: list[dt.datetime], *, active_util_pct: float
) -> tuple[int, int] | DatabaseError:
    """One recompute in a savepoint → (rows written, rows deleted), or the error that failed
    it for a reason that is not transient.

    The savepoint: a failed statement (which on PostgreSQL aborts the whole transaction) rolls
    back to it, and the batch's transaction, its lock and the marks it read go on. A transient
    error (the database went away, a lock or statement timeout) is raised as before: it says
    nothing about the hours, and the task retries it.
    """
    try:
        with transaction.atomic():
            return _recompute(hours, active_util_pct=active_util_pct)
    except TRANSIENT_ERRORS:
        raise
    except DatabaseError as exc:
        return exc


def _recompute_isolating(
    marks: Sequence[_Mark], *, active_util_pct: float
) -> tuple[int, int, list[tuple[_Mark, DatabaseError]]]:
    """Recompute these marks' hours in one statement; where it fails, recompute them one by
    one, so a bad hour fails alone and the others are done → (rows written, rows deleted, the
    marks whose hour failed, each with its error)."""
    outcome = _attempt([m.hour for m in marks], active_util_pct=active_util_pct)
    if not isinstance(outcome, DatabaseError):
        return outcome[0], outcome[1], []
    if len(marks) == 1:
        return 0, 0, [(marks[0], outcome)]
    logger.warning(
        "rollup: the batch of %d hours from %s failed (%s); recomputing them one by one",
        len(marks),
        marks[0].hour.isoformat(),
        outcome,
    )
    written = deleted = 0
    failed: list[tuple[_Mark, DatabaseError]] = []
    for mark in marks:
        outcome = _attempt([mark.hour], active_util_pct=active_util_pct)
        if isinstance(outcome, DatabaseError):
            failed.append((mark, outcome))
        else:
            written += outcome[0]
            deleted += outcome[1]
    return written, deleted, failed


def _marks_fail(failed: Sequence[tuple[_Mark, DatabaseError]]) -> int:
    """Count a failure on each of these marks and set aside those that reached
    ``ROLLUP_MAX_FAILURES``, logging each with its error → how many were set aside."""
    max_failures = settings.ROLLUP_MAX_FAILURES
    now = _db_datetime(timezone.now())
    set_aside = 0
    with connection.cursor() as cursor:
        for mark, error in failed:
            text = f"{type(error).__name__}: {error}".strip()
            cursor.execute(
                _sql("rollup_marks_fail"),
                {
                    "hour": mark.raw_hour,
                    "error": text[:ERROR_TEXT_MAX],
                    "now": now,
                    "max_failures": max_failures,
                },
            )
            row = cursor.fetchone()
            failures, aside = (int(row[0]), row[1] is not None) if row else (0, False)
            if aside:
                set_aside += 1
                logger.error(
                    "rollup: hour %s set aside after %d failures; the hours after it go on. "
                    "Fix the cause, then put it back in the queue (admin: rollup marks). "
                    "Last error: %s",
                    mark.hour.isoformat(),
                    failures,
                    text,
                )
            else:
                logger.warning(
                    "rollup: hour %s failed (%d of %d before it is set aside): %s",
                    mark.hour.isoformat(),
                    failures,
                    max_failures,
                    text,
                )
    return set_aside


def rollup_marks_requeue(*, hours: Iterable[dt.datetime]) -> int:
    """Put these hours' marks back in the queue with no failures counted → marks put back.

    For an operator, once the cause of a set-aside hour's failures is fixed (the admin's
    action); the next rollup recomputes them.
    """
    wanted = sorted({_hour_floor(_as_utc(h)) for h in hours})
    if not wanted:
        return 0
    with connection.cursor() as cursor:
        if _is_postgres():
            cursor.execute(_sql("rollup_marks_requeue.postgresql"), {"hours": wanted})
            return int(cursor.rowcount)
        cursor.execute(
            _sql("rollup_marks_requeue.sqlite"),
            {
                "hours": json.dumps([h.strftime(SQLITE_HOUR_FMT) for h in wanted]),
                "hour_fmt": SQLITE_HOUR_FMT,
            },
        )
        return _sqlite_changes(cursor)


def rollup_run(
    *,
    max_hours: int | None = None,
    wait: bool = True,
    on_batch: Callable[[int], None] | None = None,
) -> RollupResult:
    """Bring the marked hours up to date, oldest first; at most ``max_hours`` of them.

    Each batch is one transaction: take the lock, read the next marks with their versions
    (not those set aside), recompute those hours in one statement, clear the marks at the
    versions read, commit. Hours that fail keep their marks with a failure counted (see
    :func:`_recompute_isolating`); the run goes on with the hours after them. A transient
    database error is raised (the task retries it) and counts against no hour.
    ``wait=False`` (the periodic task) stops at once when another rollup holds the lock: that
    one is already draining the queue. ``on_batch(n)`` is called after each committed batch of
    n hours (the backfill's progress bar).
    """
    active_util_pct = FleetSettings.load().active_util_pct
    # The daily pre-aggregate follows the report time zone however it was changed (admin,
    # fleet file): rebuilt here when it holds another zone's days.
    daily_usage_ensure()
    workload_daily_ensure()
    horizon = retention_horizon()
    every_s = open_hour_every_s()
    taken = hours_done = rows = deleted = skipped = failed_hours = set_aside = 0
    busy = False
    after: Any = None
    while max_hours is None or taken < max_hours:
        limit = BATCH_HOURS if max_hours is None else min(BATCH_HOURS, max_hours - taken)
        with transaction.atomic():
            # The lock is taken before the marks are read, so two runs never take the same
            # marks: the second reads them only after the first has committed and cleared them.
            if not _lock(wait=wait):
                busy = True
                break
            marks = _marks_read(after=after, limit=limit)
            if not marks:
                break
            # The batch is cut where its span grows too long; the rest is read next time.
            batch = next(_batches([m.hour for m in marks]))
            marks = [m for m in marks if m.hour <= batch[-1]]
            after = marks[-1].raw_hour
            # The hour in progress, recomputed less than ROLLUP_OPEN_HOUR_EVERY_S ago, keeps
            # its mark for a later run (off by default: every run recomputes it).
            now = timezone.now()
            marks = [m for m in marks if not _open_hour_recent(m.hour, now=now, every_s=every_s)]
            if not marks:
                continue
            old = [m for m in marks if m.hour < horizon]
            live = [m for m in marks if m.hour >= horizon]
            if old:
                logger.warning(
                    "rollup: %d marked hours before the retention horizon %s left as they are",
                    len(old),
                    horizon.isoformat(),
                )
            failed: list[tuple[_Mark, DatabaseError]] = []
            if live:
                written, gone, failed = _recompute_isolating(live, active_util_pct=active_util_pct)
                rows += written
                deleted += gone
            # A failed hour keeps its mark, with one more failure counted on it; the cursor
            # moves past it all the same, so this run goes on with the hours after it.
            failed_marks = {m for m, _ in failed}
            _marks_clear([m for m in marks if m not in failed_marks])
            set_aside += _marks_fail(failed)
        taken += len(marks)
        hours_done += len(live) - len(failed)
        failed_hours += len(failed)
        skipped += len(old)
        if on_batch is not None:
            on_batch(len(marks))
    result = RollupResult(
        hours=hours_done,
        rows=rows,
        deleted=deleted,
        skipped_hours=skipped,
        lag_s=rollup_lag_seconds(),
        busy=busy,
        failed_hours=failed_hours,
        set_aside_hours=set_aside,
    )
    # Quiet when there was nothing to do: the periodic task runs every minute.
    level = logging.INFO if (hours_done or skipped or busy or failed_hours) else logging.DEBUG
    logger.log(level, "%s", result)
    return result


def rollup_hours(hours: list[dt.datetime]) -> int:
    """Recompute exactly these hours now (marks untouched) → rows written.

    Hours are floored to the hour; hours before the retention horizon are left as they are.
    Waits for a running rollup, then computes batch by batch under the same lock.
    """
    active_util_pct = FleetSettings.load().active_util_pct
    horizon = retention_horizon()
    wanted = [h for h in {_hour_floor(h) for h in hours} if h >= horizon]
    rows = 0
    for batch in _batches(wanted):
        with transaction.atomic():
            _lock(wait=True)
            rows += _recompute(batch, active_util_pct=active_util_pct)[0]
    return rows


def rollup_backfill_mark() -> int:
    """Mark every hour since the retention horizon that has samples or rollup rows → count.

    ``manage.py rollup --all`` then recomputes them all (after a rule or threshold changed).
    """
    horizon = retention_horizon()
    with connection.cursor() as cursor:
        if _is_postgres():
            cursor.execute(_sql("rollup_hours_with_data.postgresql"), {"since": horizon})
        else:
            cursor.execute(
                _sql("rollup_hours_with_data.sqlite"),
                {"since": _sqlite_text(horizon), "hour_fmt": SQLITE_HOUR_FMT},
            )
        hours = [_as_utc(row[0]) for row in cursor.fetchall()]
    # Marked in chunks: hours_mark builds one statement per call.
    for start in range(0, len(hours), 1000):
        with transaction.atomic():
            hours_mark(hours[start : start + 1000])
    return len(hours)


# --- the daily pre-aggregate (telemetry.DailyUsage) ------------------------------------------
def daily_zone_name(zone_name: str) -> str:
    """The zone whose local days ``DailyUsage`` holds for this report zone: the zone itself,
    or UTC for a name that is no zone (the selectors read such a setting as UTC too)."""
    return zone_or_utc(zone_name).key


def daily_usage_rebuild(*, zone_name: str | None = None) -> int:
    """Rebuild every ``DailyUsage`` row from the hourly rows, in ``zone_name`` (default: the
    report time zone), then every ``MonthlyUsage`` row from those → daily rows written.
    PostgreSQL only (SQLite reads hourly rows: 0).

    Under the rollup lock and in one transaction, so no rollup writes hourly rows between the
    state row naming the new zone and the table holding its days; readers see the old table
    or the new one, never half of each.
    """
    if not _is_postgres():
        return 0
    from telemetry.models import DailyUsageState

    zone = daily_zone_name(zone_name or FleetSettings.load().report_time_zone)
    with transaction.atomic():
        _lock(wait=True)
        with connection.cursor() as cursor:
            # TRUNCATE would wait for every reader's lock; DELETE lets readers go on.
            cursor.execute("DELETE FROM telemetry_dailyusage")
            cursor.execute("DELETE FROM telemetry_monthlyusage")
            DailyUsageState.objects.all().delete()
            DailyUsageState.objects.create(zone=zone, built_at=timezone.now())
            cursor.execute(_sql("daily_rebuild.postgresql"), {"zone": zone})
            written = int(cursor.rowcount)
            cursor.execute(_sql("monthly_rebuild.postgresql"))
            return written


def daily_refresh_function_sql() -> str:
    """``CREATE OR REPLACE FUNCTION telemetry_dailyusage_refresh …`` for today's ``USAGE_SUMS``:
    the text a migration installs, frozen in it, when the list changes (the triggers call it)."""
    return _sql("daily_refresh.postgresql")


def daily_usage_ensure() -> bool:
    """Rebuild ``DailyUsage`` when it holds another zone's days than the report time zone's
    (or is not set up) → whether it rebuilt. Cheap when nothing changed: two small reads."""
    if not _is_postgres():
        return False
    from telemetry.models import DailyUsageState

    wanted = daily_zone_name(FleetSettings.load().report_time_zone)
    state = DailyUsageState.objects.order_by("id").first()
    if state is not None and state.zone == wanted:
        return False
    daily_usage_rebuild(zone_name=wanted)
    return True


# --- the workloads' daily pre-aggregate (telemetry.WorkloadDailyUsage) -------------------------
def _local_day_span(day: dt.date, zone: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """A local day's first moment and the next day's, in UTC."""
    lo = dt.datetime.combine(day, dt.time(), tzinfo=zone).astimezone(dt.UTC)
    hi = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=zone)
    return lo, hi.astimezone(dt.UTC)


def workload_daily_refresh(hours: Iterable[dt.datetime]) -> set[dt.date]:
    """Sum again the ``WorkloadDailyUsage`` rows of the local days that hold ``hours`` (UTC
    hours whose hourly workload rows just changed), in the current transaction → those days.
    Nothing when the table is not in use (no ``WorkloadDailyState`` row)."""
    from telemetry.models import WorkloadDailyState

    state = WorkloadDailyState.objects.order_by("id").first()
    if state is None:
        return set()
    zone = zone_or_utc(state.zone)
    days = {_as_utc(h).astimezone(zone).date() for h in hours}
    with connection.cursor() as cursor:
        for day in sorted(days):
            _workload_day_write(cursor, day, zone)
    return days


def _workload_day_write(cursor: Any, day: dt.date, zone: dt.tzinfo) -> None:
    """A local day's ``WorkloadDailyUsage`` rows summed again, then (PostgreSQL) its
    ``WorkloadNodeDailyUsage`` rows from those."""
    lo, hi = _local_day_span(day, zone)
    if _is_postgres():
        # In place: only the rows whose figures changed are written (the rollup sums the
        # open day again every minute; issue 46).
        cursor.execute(_sql("workload_daily_refresh.postgresql"), {"day": day, "lo": lo, "hi": hi})
        cursor.execute(_sql("workload_node_daily_refresh.postgresql"), {"day": day})
        return
    day_param = day.isoformat()
    cursor.execute("DELETE FROM telemetry_workloaddailyusage WHERE day = %s", [day_param])
    cursor.execute(
        _sql("workload_daily_refresh"),
        {"day": day_param, "lo": _db_datetime(lo), "hi": _db_datetime(hi)},
    )


def workload_daily_rebuild(*, zone_name: str | None = None) -> int:
    """Rebuild every ``WorkloadDailyUsage`` row from the hourly workload rows, in the local
    days of ``zone_name`` (default: the report time zone) → days written. Both dialects.

    Under the rollup lock and in one transaction, as :func:`daily_usage_rebuild`: readers see
    the old table or the new one, never half of each."""
    from telemetry.models import WorkloadDailyState, WorkloadHourlyUsage

    zone_key = daily_zone_name(zone_name or FleetSettings.load().report_time_zone)
    zone = zone_or_utc(zone_key)
    with transaction.atomic():
        _lock(wait=True)
        WorkloadDailyState.objects.all().delete()
        WorkloadDailyState.objects.create(zone=zone_key, built_at=timezone.now())
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM telemetry_workloaddailyusage")
            cursor.execute("DELETE FROM telemetry_workloadnodedailyusage")
            first = WorkloadHourlyUsage.objects.order_by("hour").values_list("hour").first()
            last = WorkloadHourlyUsage.objects.order_by("-hour").values_list("hour").first()
            if first is None or last is None:
                return 0
            day = _as_utc(first[0]).astimezone(zone).date()
            end = _as_utc(last[0]).astimezone(zone).date()
            days = 0
            while day <= end:
                _workload_day_write(cursor, day, zone)
                day += dt.timedelta(days=1)
                days += 1
            if _is_postgres():
                # Every row is new: the planner's statistics of the old ones would mislead it
                # (a page's read planned for 4,500 rows when there are 448,000).
                cursor.execute("ANALYZE telemetry_workloaddailyusage")
                cursor.execute("ANALYZE telemetry_workloadnodedailyusage")
            return days


def workload_daily_ensure() -> bool:
    """Rebuild ``WorkloadDailyUsage`` when it holds another zone's days than the report time
    zone's (or is not set up yet) → whether it rebuilt. Cheap when nothing changed."""
    from telemetry.models import WorkloadDailyState

    wanted = daily_zone_name(FleetSettings.load().report_time_zone)
    state = WorkloadDailyState.objects.order_by("id").first()
    if state is not None and state.zone == wanted:
        return False
    workload_daily_rebuild(zone_name=wanted)
    return True
