"""The on-disk spool: every sample is written here before anything tries to send it.

SQLite in WAL mode, one file. Samples leave the ``samples`` table only when the server has
taken them (accepted or duplicate), when the server refuses them for good (they move to
``quarantine``, with the answer), or when the spool is full and the oldest are dropped
(counted, and reported on the next successful push). The ``gpus`` table keeps the last
inventory entry of every GPU the agent has seen, so a push after a restart can still describe
a GPU whose samples wait in the spool.

The collector thread writes and the sender thread reads and deletes, each on its own
connection: WAL lets one write while the other reads.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    gpu TEXT NOT NULL,
    start TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (gpu, start)
);
CREATE TABLE IF NOT EXISTS emitted (
    gpu TEXT PRIMARY KEY,
    start TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    status INTEGER NOT NULL,
    reason TEXT NOT NULL,
    samples TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS gpus (
    uuid TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS payloads (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (kind, key)
);
"""


@dataclass
class Batch:
    ids: list[int]
    samples: list[dict[str, Any]]


class Spool:
    """One connection to the spool file; open one per thread."""

    def __init__(self, path: str, *, max_samples: int = 200_000) -> None:
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self.path = path
        self.max_samples = max_samples
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a write never upgrades
        # a read lock mid-transaction (which is where SQLite's "database is locked" comes from)
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit survives power loss too, not only a crash of this process; at one
        # commit per interval the cost is nothing.
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA busy_timeout=30000")
        with self._tx() as db:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)

    def close(self) -> None:
        self.db.close()

    class _Tx:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, et: object, ev: object, tb: object) -> None:
            self.db.execute("COMMIT" if et is None else "ROLLBACK")

    def _tx(self) -> Spool._Tx:
        return Spool._Tx(self.db)

    # -- meta counters ----------------------------------------------------------------------

    def _get(self, key: str) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def _add(self, key: str, n: int) -> None:
        self.db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = value + excluded.value",
            (key, n),
        )

    def counter(self, key: str) -> int:
        return self._get(key)

    # -- writing ----------------------------------------------------------------------------

    def add(self, samples: list[dict[str, Any]]) -> int:
        """Store closed samples; returns how many were new.

        A sample whose ``start`` is not after the last one stored for its GPU is skipped:
        an agent restarted inside an interval it already reported must not report it twice.
        When the spool would exceed ``max_samples``, the oldest are dropped and counted.
        """
        if not samples:
            return 0
        added = 0
        with self._tx() as db:
            for s in samples:
                gpu, start = s["gpu"], s["start"]
                row = db.execute("SELECT start FROM emitted WHERE gpu = ?", (gpu,)).fetchone()
                # ISO 8601 UTC strings of one format sort as the times they name
                if row is not None and row[0] >= start:
                    continue
                db.execute(
                    "INSERT INTO emitted (gpu, start) VALUES (?, ?) "
                    "ON CONFLICT (gpu) DO UPDATE SET start = excluded.start",
                    (gpu, start),
                )
                cur = db.execute(
                    "INSERT OR IGNORE INTO samples (gpu, start, body) VALUES (?, ?, ?)",
                    (gpu, start, json.dumps(s, separators=(",", ":"))),
                )
                added += cur.rowcount
            count = int(db.execute("SELECT count(*) FROM samples").fetchone()[0])
            excess = count - self.max_samples
            if excess > 0:
                db.execute(
                    "DELETE FROM samples WHERE id IN (SELECT id FROM samples ORDER BY id LIMIT ?)",
                    (excess,),
                )
                self._add("dropped_pending", excess)
                self._add("dropped_total", excess)
        return added

    # -- reading and acknowledging ----------------------------------------------------------

    def pending(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM samples").fetchone()[0])

    def oldest(self, limit: int) -> Batch | None:
        rows = self.db.execute(
            "SELECT id, body FROM samples ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        if not rows:
            return None
        return Batch([int(r[0]) for r in rows], [json.loads(r[1]) for r in rows])

    def settle(
        self,
        batch: Batch,
        *,
        keep: Collection[int] = (),
        quarantine: Collection[int] = (),
        status: int = 0,
        reason: str = "",
        dropped_reported: int = 0,
    ) -> None:
        """The server answered a push of ``batch``, in one transaction: the samples at the
        positions in ``keep`` stay queued, those in ``quarantine`` move to the quarantine
        table (with ``status`` and ``reason``), and the rest are done; ``dropped_reported``
        drops were reported to the server."""
        with self._tx() as db:
            if quarantine:
                db.execute(
                    "INSERT INTO quarantine (created, status, reason, samples) VALUES (?, ?, ?, ?)",
                    (
                        time.time(),
                        status,
                        reason[:2000],
                        json.dumps([batch.samples[i] for i in sorted(quarantine)]),
                    ),
                )
                self._add("quarantined_batches", 1)
                self._add("quarantined_samples", len(quarantine))
                self._quarantine_trim()
            if keep:
                kept = set(keep)
                gone = [(batch.ids[i],) for i in range(len(batch.ids)) if i not in kept]
                db.executemany("DELETE FROM samples WHERE id = ?", gone)
            else:
                # a batch is a run of consecutive ids (oldest first, ids only grow)
                db.execute(
                    "DELETE FROM samples WHERE id BETWEEN ? AND ?", (batch.ids[0], batch.ids[-1])
                )
            if dropped_reported:
                self._add("dropped_pending", -dropped_reported)

    def _quarantine_trim(self) -> None:
        # The quarantine has the spool's bound too: beyond max_samples the oldest go (counted).
        live = self._get("quarantined_samples") - self._get("quarantine_trimmed")
        while live > self.max_samples:
            row = self.db.execute(
                "SELECT id, samples FROM quarantine ORDER BY id LIMIT 1"
            ).fetchone()
            if row is None:
                break
            n = len(json.loads(row[1]))
            self.db.execute("DELETE FROM quarantine WHERE id = ?", (row[0],))
            self._add("quarantine_trimmed", n)
            live -= n

    # -- the GPU inventory ------------------------------------------------------------------

    def gpus_save(self, inventory: list[dict[str, Any]]) -> None:
        """Remember each GPU's inventory entry (GPUs no longer listed keep their last one)."""
        with self._tx() as db:
            db.executemany(
                "INSERT INTO gpus (uuid, body) VALUES (?, ?) "
                "ON CONFLICT (uuid) DO UPDATE SET body = excluded.body",
                [(g["uuid"], json.dumps(g, separators=(",", ":"))) for g in inventory],
            )

    def gpus_saved(self) -> dict[str, dict[str, Any]]:
        return {str(r[0]): json.loads(r[1]) for r in self.db.execute("SELECT uuid, body FROM gpus")}

    def dropped_pending(self) -> int:
        return self._get("dropped_pending")

    # -- whole payloads (queue snapshots): sent as they are, one per POST ---------------------

    def payload_add(self, kind: str, key: str, body: dict[str, Any], *, max_keep: int) -> bool:
        """Store one payload of ``kind`` under ``key`` (a second one with the same key is
        skipped: False); beyond ``max_keep`` of that kind the oldest are dropped, counted in
        ``dropped_<kind>``."""
        if max_keep < 1:
            raise ValueError("max_keep must be at least 1")
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO payloads (kind, key, body) VALUES (?, ?, ?)",
                (kind, key, json.dumps(body, separators=(",", ":"), allow_nan=False)),
            )
            n = int(
                db.execute("SELECT count(*) FROM payloads WHERE kind = ?", (kind,)).fetchone()[0]
            )
            if n > max_keep:
                db.execute(
                    "DELETE FROM payloads WHERE id IN "
                    "(SELECT id FROM payloads WHERE kind = ? ORDER BY id LIMIT ?)",
                    (kind, n - max_keep),
                )
                self._add(f"dropped_{kind}", n - max_keep)
        return cur.rowcount == 1

    def payload_oldest(self, kind: str) -> tuple[int, dict[str, Any]] | None:
        row = self.db.execute(
            "SELECT id, body FROM payloads WHERE kind = ? ORDER BY id LIMIT 1", (kind,)
        ).fetchone()
        return None if row is None else (int(row[0]), json.loads(row[1]))

    def payloads_pending(self, kind: str) -> int:
        return int(
            self.db.execute("SELECT count(*) FROM payloads WHERE kind = ?", (kind,)).fetchone()[0]
        )

    def payload_settle(self, id_: int, *, refused: bool = False) -> None:
        """Payload ``id_`` is done: the server took it, or (``refused``) refused it for good,
        counted in ``refused_<kind>`` (the agent logs the answer; a snapshot is not kept, so a
        server that refuses every one costs no disk)."""
        with self._tx() as db:
            if refused:
                row = db.execute("SELECT kind FROM payloads WHERE id = ?", (id_,)).fetchone()
                if row is not None:
                    self._add(f"refused_{row[0]}", 1)
            db.execute("DELETE FROM payloads WHERE id = ?", (id_,))

    def quarantined(self) -> list[tuple[int, int, str, int]]:
        """(id, status, reason, number of samples) of each quarantined batch."""
        return [
            (int(r[0]), int(r[1]), str(r[2]), len(json.loads(r[3])))
            for r in self.db.execute("SELECT id, status, reason, samples FROM quarantine")
        ]
