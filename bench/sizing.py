"""Sizing from measurements (docs/deploy.md "## 8. Sizing"): what a GPU costs PostgreSQL.

    DATABASE_URL=postgres://… python bench/sizing.py [--gpus 128] [--minutes 1440]
        [--push-ms 3.67] [--json sizing.json]
    python bench/sizing.py --from-json sizing.json [--push-ms …]   # the table again, no run

Plays ``--gpus`` GPUs (nodes of 8) through one simulated day of 60 s pushes on a database of
its own (``<name>_sizing``, created, migrated and dropped here), through the product's code:
every node's push of the minute goes through ``telemetry.ingest.sample_batch_ingest`` (the
ingest service the API view calls: decoding, checks, the GPUs block, workloads, the one
prepared statement of ``telemetry.ingest_store``), then ``telemetry.rollup.rollup_run()``
runs, as the beat runs it every minute. Each sample carries what an NVML agent with GPM and
workload discovery sends (docs/ingest.md): the NVML fields, four profiling means and one
workload (a Slurm job of the GPU that changes every 4 hours). A second day, pushes only,
carries NVML fields alone (``--basic-minutes``).

Measured, each in its own phase:

* bytes per raw sample row: ``pg_total_relation_size`` (heap, indexes, TOAST) of the day's
  partition over its rows; bytes per hourly, daily and workload rollup row: each table's
  total size over its rows, after a plain VACUUM (as autovacuum leaves it) and after VACUUM
  FULL (packed: the floor);
* WAL: ``pg_current_wal_lsn()`` around every phase (the whole cluster's WAL), and the part of
  it that belongs to this database, read back with the ``pg_walinspect`` extension (records
  whose blocks are this database's, and the commit records of their transactions), split into
  records and full-page images; one ``CHECKPOINT`` at ``--checkpoint-at`` measures the
  full-page images of the checkpoint interval after it (5 simulated minutes, the default
  ``checkpoint_timeout``);
* CPU: the PostgreSQL backend's own CPU time (utime + stime from ``/proc/<pid>/stat``, so
  PostgreSQL must run on this machine) and this process's, per push and per rollup run; the
  rollup's cost per run is fitted as ``fixed + GPUs × (a + b × k)`` where k is the
  minute of the hour (the run at minute k re-reads k samples per GPU), with the fixed part
  measured on its own (a run over a marked hour without samples).

Needs PostgreSQL on this machine (``/proc``), a superuser role (``CHECKPOINT``, and
``pg_walinspect``, which the script creates in its database) and PostgreSQL's contrib modules.

CPU times are totals over the run divided by the count (the kernel counts them in 10 ms ticks,
so single pushes cannot be timed); wall times are medians per simulated minute. Bytes and WAL
count what was written, so load does not move them (the fleet's size and the run's length
do, a little); CPU times move with load, wall times much more.

The derived table (printed last; docs/deploy.md "Sizing") takes the web process's time per
8-GPU push from bench/ingest.py (``--push-ms``: gunicorn, NVML fields only) because it holds the
HTTP and DRF part that this in-process run leaves out, and adds what profiling and a workload
per sample cost the service and PostgreSQL here. ``--from-json`` derives it again from saved
figures (another ``--push-ms``, say) without measuring.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

GPUS_PER_NODE = 8
INTERVAL_S = 60
CHECKPOINT_INTERVAL_MIN = 5  # PostgreSQL's default checkpoint_timeout (--checkpoint-minutes)
RETENTION_DAYS = 35  # RAW_RETENTION_DAYS' default
# Web processes and PostgreSQL cores are sized to be at most half busy: agents push on the
# minute, a fleet catching up after an outage pushes its spool at once, and dashboards, vacuum
# and checkpoints need the rest.
HEADROOM = 0.5
FLEETS = (1_000, 10_000, 100_000)
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


@dataclass
class Wal:
    """WAL of one phase: the cluster's (LSN difference) and this database's (pg_walinspect),
    the latter in bytes of records (8-byte aligned, as WAL stores them) and of page images."""

    cluster: int = 0
    records: int = 0
    fpi: int = 0

    def add(self, other: Wal) -> None:
        self.cluster += other.cluster
        self.records += other.records
        self.fpi += other.fpi


@dataclass
class Cpu:
    """Seconds of CPU of the PostgreSQL backend and of this process, and wall seconds."""

    server: float = 0.0
    client: float = 0.0
    wall: float = 0.0

    def add(self, other: Cpu) -> None:
        self.server += other.server
        self.client += other.client
        self.wall += other.wall


@dataclass
class Figures:
    """Everything measured (saved by --json; the table is derived from these alone)."""

    gpus: int = 0
    minutes: int = 0
    pg_version: str = ""
    # The run's settings: simulated minutes between rollup runs (ROLLUP_OPEN_HOUR_EVERY_S / 60),
    # the checkpoint interval whose full-page images are measured, the session's
    # wal_compression.
    rollup_every_min: int = 1
    checkpoint_minutes: int = CHECKPOINT_INTERVAL_MIN
    wal_compression: str = "off"
    load_avg: list[float] = field(default_factory=list)
    raw_bytes_per_sample: float = 0.0
    raw_bytes_per_sample_basic: float = 0.0
    samples: int = 0
    hourly_rows: int = 0
    daily_rows: int = 0
    workload_rows: int = 0
    hourly_bytes_per_row: float = 0.0
    daily_bytes_per_row: float = 0.0
    workload_bytes_per_row: float = 0.0
    hourly_bytes_per_row_packed: float = 0.0
    daily_bytes_per_row_packed: float = 0.0
    workload_bytes_per_row_packed: float = 0.0
    wal_ingest_per_sample: float = 0.0
    wal_ingest_per_sample_basic: float = 0.0
    wal_ingest_cluster_per_sample: float = 0.0
    wal_rollup_per_gpu_hour: float = 0.0
    wal_rollup_cluster_per_gpu_hour: float = 0.0
    fpi_per_checkpoint_per_gpu: float = 0.0
    fpi_whole_run: int = 0
    push_server_cpu_ms: float = 0.0
    push_client_cpu_ms: float = 0.0
    push_wall_ms_median: float = 0.0
    push_server_cpu_ms_basic: float = 0.0
    push_client_cpu_ms_basic: float = 0.0
    rollup_fixed_server_ms: float = 0.0
    rollup_fixed_client_ms: float = 0.0
    rollup_fixed_wal: float = 0.0
    rollup_server_ms_per_gpu: float = 0.0
    rollup_server_ms_per_gpu_sample: float = 0.0
    rollup_client_ms_per_run: float = 0.0
    rollup_server_ms_per_1000_gpu_hours: float = 0.0
    rollup_wall_ms_median_by_k: dict[str, float] = field(default_factory=dict)
    # Mean server CPU of a run per hour of the day: flat if a run reads its hour only.
    rollup_server_ms_by_hour: list[float] = field(default_factory=list)
    # The rollup's WAL records (full-page images apart) per GPU and day, by the relation the
    # record's first block belongs to (a table, one of its indexes), and by kind of record.
    rollup_wal_by_relation: dict[str, float] = field(default_factory=dict)
    rollup_wal_by_kind: dict[str, float] = field(default_factory=dict)
    # Rows inserted, updated (of which HOT: no index entry written), deleted by the day's
    # rollups, per rollup table (pg_stat_user_tables).
    rollup_tuples: dict[str, dict[str, int]] = field(default_factory=dict)
    # The full-page images of the checkpoint interval (ingest and rollup) per GPU, by relation.
    fpi_by_relation: dict[str, float] = field(default_factory=dict)


# --- measuring ------------------------------------------------------------------------------
def backend_cpu_s(pid: int) -> float:
    """CPU seconds the PostgreSQL backend ``pid`` has used (it runs on this machine)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) * TICK_S


class Meter:
    """CPU and WAL of the phases of the run, read around each of them."""

    # This database's WAL between two LSNs: records that touch its relations, and the commit
    # (or abort) records of the transactions that wrote them.
    OWN_WAL = """
    WITH r AS (
        SELECT xid, resource_manager, record_length, fpi_length, block_ref
        FROM pg_get_wal_records_info(%(lo)s, %(hi)s)
    ), own AS (
        SELECT DISTINCT xid FROM r WHERE xid <> 0 AND block_ref LIKE %(pattern)s
    )
    SELECT COALESCE(sum((record_length + 7) / 8 * 8), 0), COALESCE(sum(fpi_length), 0)
    FROM r
    WHERE block_ref LIKE %(pattern)s
       OR (resource_manager = 'Transaction' AND xid IN (SELECT xid FROM own))
    """

    # The same records by the relation of their first block (its name now: no relation of the
    # measured tables is rewritten during the day) and by kind (resource manager and record
    # type: a heap INSERT, a HOT_UPDATE, a btree INSERT_LEAF, ...), full-page images apart.
    OWN_WAL_SPLIT = """
    SELECT COALESCE(
               pg_filenode_relation(0, substring(block_ref FROM 'rel \\d+/\\d+/(\\d+)')::oid)::text,
               'other'),
           resource_manager || ' ' || split_part(record_type, ' ', 1),
           sum((record_length + 7) / 8 * 8) - sum(fpi_length), sum(fpi_length)
    FROM pg_get_wal_records_info(%(lo)s, %(hi)s)
    WHERE block_ref LIKE %(pattern)s
    GROUP BY 1, 2
    """

    def __init__(self) -> None:
        from django.db import connection

        self.by_relation: dict[str, int] = {}
        self.by_kind: dict[str, int] = {}
        self.fpi_by_relation: dict[str, int] = {}
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_backend_pid(), oid FROM pg_database WHERE datname = current_database()"
            )
            self.pid, oid = cursor.fetchone()
        self.pattern = f"%/{oid}/%"

    def lsn(self) -> str:
        from django.db import connection

        with connection.cursor() as cursor:
            # Flushed WAL only (what pg_walinspect reads): every phase here ends with a
            # synchronous commit, so its records are all flushed by then.
            cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
            return str(cursor.fetchone()[0])

    def wal(self, lo: str, hi: str) -> Wal:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::pg_lsn - %s::pg_lsn", [hi, lo])
            cluster = int(cursor.fetchone()[0])
            cursor.execute(self.OWN_WAL, {"lo": lo, "hi": hi, "pattern": self.pattern})
            records, fpi = cursor.fetchone()
        return Wal(cluster=cluster, records=int(records) - int(fpi), fpi=int(fpi))

    def split(self, lo: str, hi: str, *, records: bool = True, fpi: bool = False) -> None:
        """Add the records between two LSNs to the split by relation and by kind, and (with
        ``fpi``) their full-page images to the split of those by relation."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(self.OWN_WAL_SPLIT, {"lo": lo, "hi": hi, "pattern": self.pattern})
            for relation, kind, size, images in cursor.fetchall():
                if records:
                    self.by_relation[relation] = self.by_relation.get(relation, 0) + int(size)
                    self.by_kind[kind] = self.by_kind.get(kind, 0) + int(size)
                if fpi:
                    total = self.fpi_by_relation.get(relation, 0) + int(images)
                    self.fpi_by_relation[relation] = total

    def cpu(self) -> tuple[float, float, float]:
        return backend_cpu_s(self.pid), time.process_time(), time.perf_counter()

    @staticmethod
    def since(before: tuple[float, float, float], after: tuple[float, float, float]) -> Cpu:
        return Cpu(*(b - a for a, b in zip(before, after, strict=True)))


class Fleet:
    """The simulated fleet: nodes of 8 GPUs in one pool, each with its own node token."""

    def __init__(self, gpus: int, seed: int) -> None:
        from fleet.models import NodeToken, Pool, Site, Team
        from fleet.services import node_token_issue

        site = Site.objects.create(name="sizing-site")
        team = Team.objects.create(name="sizing-team")
        pool = Pool.objects.create(name="sizing-pool", site=site, team=team)
        self.nodes: list[tuple[int, int, list[str]]] = []  # node id, token id, GPU uuids
        for n in range(math.ceil(gpus / GPUS_PER_NODE)):
            node, _ = node_token_issue(hostname=f"sizing-{n:05d}")
            node.pool = pool
            node.save(update_fields=["pool"])
            token_id = NodeToken.objects.get(node=node).pk
            uuids = [f"GPU-sizing-{n:05d}-{i}" for i in range(GPUS_PER_NODE)]
            self.nodes.append((node.pk, token_id, uuids))
        self.rng = random.Random(seed)
        self.busy = {u: self.rng.random() for _, _, uuids in self.nodes for u in uuids}

    def body(self, uuids: list[str], start: dt.datetime, full: bool) -> bytes:
        """One node's push for the minute at ``start``, as the agent sends it."""
        rng = self.rng
        samples = []
        for i, uuid in enumerate(uuids):
            util = round(rng.uniform(60, 100) if rng.random() < self.busy[uuid] else 0.0, 1)
            power = round(70 + util * 5.6 + rng.uniform(0, 5), 1)
            sample: dict[str, Any] = {
                "gpu": uuid,
                "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "seconds": INTERVAL_S,
                "util_pct": util,
                "mem_util_pct": round(util * 0.6, 1),
                "mem_used_bytes": 61_000_000_000 if util else 500_000_000,
                "procs": 1 if util else 0,
                "power_w": power,
                "energy_j": round(power * INTERVAL_S, 1),
                "temp_c": round(35 + util / 3, 1),
                "sm_clock_mhz": 1980 if util else 345,
                "throttle_s": {"power_cap": 0, "thermal": 0, "hw_slowdown": 0, "other": 0,
                               "any": 0},
            }  # fmt: skip
            if full:
                sample.update(
                    sm_active=round(util / 110, 3),
                    sm_occupancy=round(util / 200, 3),
                    tensor_active=round(util / 300, 3),
                    dram_active=round(util / 250, 3),
                )
                job = 480_000 + zlib.crc32(f"{uuid}/{start.hour // 4}".encode()) % 100_000
                sample["workloads"] = [
                    {"kind": "slurm", "id": str(job), "user": f"user{i}", "account": "research",
                     "share_s": INTERVAL_S, "air_s": round(util * INTERVAL_S / 100, 2)}
                ]  # fmt: skip
            samples.append(sample)
        gpus = [
            {"uuid": u, "index": i, "name": "NVIDIA H100 80GB HBM3",
             "memory_total_bytes": 85_899_345_920, "power_limit_w": 700.0}
            for i, u in enumerate(uuids)
        ]  # fmt: skip
        node = {"hostname": "sizing", "agent_version": "sizing", "driver_version": "550.54"}
        return json.dumps({"node": node, "gpus": gpus, "samples": samples}).encode()


def relation_bytes(names: list[str]) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c "
            "WHERE c.relname = ANY(%s)",
            [names],
        )
        return int(cursor.fetchone()[0])


def count(table: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - constant names
        return int(cursor.fetchone()[0])


def ingest_minute(
    fleet: Fleet, meter: Meter, start: dt.datetime, full: bool, *, fpi_split: bool = False
) -> tuple[Cpu, Wal, int]:
    """Every node pushes the minute at ``start`` (bodies built before the clock starts)."""
    from telemetry.ingest import sample_batch_ingest

    bodies = [(node, token, fleet.body(uuids, start, full)) for node, token, uuids in fleet.nodes]
    now = start + dt.timedelta(seconds=INTERVAL_S + 2)
    lo = meter.lsn()
    before = meter.cpu()
    accepted = 0
    for node_id, token_id, body in bodies:
        result = sample_batch_ingest(
            node_id=node_id, payload_bytes=body, now=now, token_id=token_id, counters={}
        )
        assert not result.rejected, result.rejected[:3]
        accepted += result.accepted
    cpu = meter.since(before, meter.cpu())
    hi = meter.lsn()
    if fpi_split:
        meter.split(lo, hi, records=False, fpi=True)
    return cpu, meter.wal(lo, hi), accepted


def rollup_once(
    meter: Meter, *, split: bool = False, fpi_split: bool = False
) -> tuple[Cpu, Wal, int]:
    from telemetry.rollup import rollup_run

    lo = meter.lsn()
    before = meter.cpu()
    result = rollup_run()
    cpu = meter.since(before, meter.cpu())
    hi = meter.lsn()
    if split or fpi_split:
        meter.split(lo, hi, records=split, fpi=fpi_split)
    return cpu, meter.wal(lo, hi), result.hours


ROLLUP_TABLES = (
    "telemetry_hourlyusage",
    "telemetry_dailyusage",
    "telemetry_monthlyusage",
    "telemetry_workloadhourlyusage",
    "telemetry_workloaddailyusage",
    "telemetry_workloadnodedailyusage",
)


def tuple_counts() -> dict[str, dict[str, int]]:
    """Rows inserted, updated, HOT-updated and deleted so far, per rollup table."""
    from django.db import connection

    # The statistics of this backend's transactions reach pg_stat_user_tables once it has
    # been idle for a second (PostgreSQL 15 flushes them at most once a second).
    time.sleep(1.2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(ROLLUP_TABLES)],
        )
        return {
            name: {"ins": int(i), "upd": int(u), "hot_upd": int(h), "del": int(d)}
            for name, i, u, h, d in cursor.fetchall()
        }


def checkpoint() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")


def measure(args: argparse.Namespace) -> Figures:
    from django.db import connection
    from django.utils import timezone

    from telemetry.partitions import partition_name, partitions_maintain
    from telemetry.pending import hours_mark

    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        # This session's WAL only (a superuser setting): what wal_compression in
        # postgresql.conf would do to the full-page images.
        cursor.execute("SELECT set_config('wal_compression', %s, false)", [args.wal_compression])
        cursor.execute("SHOW server_version")
        pg_version = str(cursor.fetchone()[0]).split()[0]
    partitions_maintain()
    meter = Meter()
    fleet = Fleet(args.gpus, args.seed)
    gpus = len(fleet.nodes) * GPUS_PER_NODE
    today = timezone.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    day = today - dt.timedelta(days=3)  # whole, in the past, well inside raw retention
    basic_day = day - dt.timedelta(days=1)
    figures = Figures(
        gpus=gpus,
        minutes=args.minutes,
        pg_version=pg_version,
        rollup_every_min=args.rollup_every,
        checkpoint_minutes=args.checkpoint_minutes,
        wal_compression=args.wal_compression,
    )

    # The rollup's fixed cost: a run over one marked hour without samples.
    fixed: list[Cpu] = []
    fixed_wal = Wal()
    for _ in range(20):
        hours_mark([day - dt.timedelta(days=2)])
        cpu, wal, _ = rollup_once(meter)
        fixed.append(cpu)
        fixed_wal.add(wal)
    figures.rollup_fixed_server_ms = 1e3 * sum(c.server for c in fixed) / len(fixed)
    figures.rollup_fixed_client_ms = 1e3 * sum(c.client for c in fixed) / len(fixed)
    figures.rollup_fixed_wal = fixed_wal.records / len(fixed)

    # Sizes of the (empty) tables before the day, subtracted from theirs after it: a table's
    # first pages (index metapages, BRIN's summary) are not a cost per row.
    rollups = {
        "hourly": "telemetry_hourlyusage",
        "daily": "telemetry_dailyusage",
        "workload": "telemetry_workloadhourlyusage",
    }
    partitions = {d: partition_name(d.date()) for d in (day, basic_day)}
    empty = {t: relation_bytes([t]) for t in [*rollups.values(), *partitions.values()]}
    tuples_before = tuple_counts()

    # The day: every minute, every node's push, then the rollup.
    ingest_cpu, rollup_cpu = Cpu(), Cpu()
    ingest_wal, rollup_wal = Wal(), Wal()
    after_checkpoint = Wal()
    push_walls: list[float] = []
    runs: list[tuple[int, Cpu]] = []
    samples = 0
    began = time.perf_counter()
    for minute in range(args.minutes):
        start = day + dt.timedelta(minutes=minute)
        if minute == args.checkpoint_at:
            checkpoint()
        window = args.checkpoint_at <= minute < args.checkpoint_at + args.checkpoint_minutes
        cpu, wal, accepted = ingest_minute(fleet, meter, start, full=True, fpi_split=window)
        samples += accepted
        ingest_cpu.add(cpu)
        ingest_wal.add(wal)
        push_walls.append(cpu.wall / len(fleet.nodes))
        if window:
            after_checkpoint.add(wal)
        # The rollup every --rollup-every minutes (ROLLUP_OPEN_HOUR_EVERY_S: the open hour
        # recomputed that often), and at every hour's last minute (a closed hour: at once).
        if (minute + 1) % args.rollup_every and minute % 60 != 59:
            continue
        run_cpu, run_wal, hours = rollup_once(meter, split=True, fpi_split=window)
        assert hours == 1, hours
        rollup_cpu.add(run_cpu)
        rollup_wal.add(run_wal)
        runs.append((minute % 60 + 1, run_cpu))
        if window:
            after_checkpoint.add(run_wal)
        if minute % 60 == 59:
            # What autovacuum does on a server (this measurement's cluster may run without
            # it): the hour's superseded row versions become space for the next hour's rows.
            with connection.cursor() as cursor:
                for table in rollups.values():
                    cursor.execute(f"VACUUM {table}")
            print(
                f"  hour {minute // 60 + 1:>2}: {samples:,} samples, "
                f"{time.perf_counter() - began:.0f} s",
                flush=True,
            )
    pushes = len(fleet.nodes) * args.minutes
    gpu_hours = gpus * args.minutes / 60
    tuples_after = tuple_counts()
    figures.rollup_tuples = {
        name: {k: tuples_after[name][k] - tuples_before[name][k] for k in tuples_after[name]}
        for name in tuples_after
    }
    gpu_days = gpu_hours / 24
    figures.rollup_wal_by_relation = {
        k: round(v / gpu_days) for k, v in sorted(meter.by_relation.items(), key=lambda i: -i[1])
    }
    figures.fpi_by_relation = {
        k: round(v / gpus) for k, v in sorted(meter.fpi_by_relation.items(), key=lambda i: -i[1])
    }
    figures.rollup_wal_by_kind = {
        k: round(v / gpu_days) for k, v in sorted(meter.by_kind.items(), key=lambda i: -i[1])
    }
    figures.samples = samples
    figures.push_server_cpu_ms = 1e3 * ingest_cpu.server / pushes
    figures.push_client_cpu_ms = 1e3 * ingest_cpu.client / pushes
    figures.push_wall_ms_median = 1e3 * statistics.median(push_walls)
    figures.wal_ingest_per_sample = ingest_wal.records / samples
    figures.wal_ingest_cluster_per_sample = ingest_wal.cluster / samples
    # What a run writes whatever the fleet (its marks, the lock's transaction) apart.
    rollup_gpu_wal = rollup_wal.records - len(runs) * figures.rollup_fixed_wal
    figures.wal_rollup_per_gpu_hour = rollup_gpu_wal / gpu_hours
    figures.wal_rollup_cluster_per_gpu_hour = rollup_wal.cluster / gpu_hours
    figures.fpi_per_checkpoint_per_gpu = after_checkpoint.fpi / gpus
    figures.fpi_whole_run = ingest_wal.fpi + rollup_wal.fpi
    figures.rollup_client_ms_per_run = 1e3 * rollup_cpu.client / len(runs)
    # Server CPU of a run at minute k: fixed + GPUs × (per GPU + per GPU-sample × k).
    fit = statistics.linear_regression([k for k, _ in runs], [c.server for _, c in runs])
    figures.rollup_server_ms_per_gpu = (
        1e3 * (fit.intercept - figures.rollup_fixed_server_ms / 1e3) / gpus
    )
    figures.rollup_server_ms_per_gpu_sample = 1e3 * fit.slope / gpus
    figures.rollup_server_ms_per_1000_gpu_hours = 1e3 * rollup_cpu.server / gpu_hours * 1000
    by_k: dict[int, list[float]] = {}
    for k, c in runs:
        by_k.setdefault(k, []).append(c.wall)
    figures.rollup_wall_ms_median_by_k = {
        str(k): 1e3 * statistics.median(by_k[k]) for k in (1, 15, 30, 45, 60) if k in by_k
    }

    # The rollup's cost over the day: flat if a run reads its own hour only.
    hourly_means: dict[int, list[float]] = {}
    for minute, (_, c) in enumerate(runs):
        hourly_means.setdefault(minute // 60, []).append(c.server)
    figures.rollup_server_ms_by_hour = [
        round(1e3 * statistics.mean(v), 1) for _, v in sorted(hourly_means.items())
    ]

    # Storage: the day's partition, then the rollup tables as autovacuum leaves them and packed.
    raw = partitions[day]
    figures.raw_bytes_per_sample = (relation_bytes([raw]) - empty[raw]) / samples
    figures.hourly_rows = count(rollups["hourly"])
    figures.daily_rows = count(rollups["daily"])
    figures.workload_rows = count(rollups["workload"])
    for full_vacuum in (False, True):
        for name, table in rollups.items():
            with connection.cursor() as cursor:
                cursor.execute(f"VACUUM {'FULL ' if full_vacuum else ''}{table}")
            grown = relation_bytes([table]) - empty[table]
            per_row = grown / getattr(figures, f"{name}_rows")
            suffix = "_packed" if full_vacuum else ""
            setattr(figures, f"{name}_bytes_per_row{suffix}", per_row)

    # The second day: pushes of NVML fields alone (no profiling, no workloads), no rollup.
    basic = Cpu()
    basic_wal = Wal()
    basic_samples = 0
    for minute in range(args.basic_minutes):
        cpu, wal, accepted = ingest_minute(
            fleet, meter, basic_day + dt.timedelta(minutes=minute), full=False
        )
        basic.add(cpu)
        basic_wal.add(wal)
        basic_samples += accepted
    if basic_samples:
        basic_pushes = len(fleet.nodes) * args.basic_minutes
        raw = partitions[basic_day]
        figures.raw_bytes_per_sample_basic = (relation_bytes([raw]) - empty[raw]) / basic_samples
        figures.wal_ingest_per_sample_basic = basic_wal.records / basic_samples
        figures.push_server_cpu_ms_basic = 1e3 * basic.server / basic_pushes
        figures.push_client_cpu_ms_basic = 1e3 * basic.client / basic_pushes
    figures.load_avg = [round(x, 1) for x in os.getloadavg()]
    return figures


# --- deriving -------------------------------------------------------------------------------
def gib(n: float) -> str:
    """Bytes in the unit that reads best."""
    if n >= 1024**4:
        return f"{n / 1024**4:.1f} TiB"
    if n >= 10 * 1024**3:
        return f"{n / 1024**3:.0f} GiB"
    if n >= 1024**3:
        return f"{n / 1024**3:.1f} GiB"
    return f"{n / 1024**2:.0f} MiB"


@dataclass
class Derived:
    gpus: int
    pushes_per_s: float
    push_ms: float
    web_busy: float
    web_processes: int
    pg_ingest_cores: float
    pg_rollup_cores: float
    pg_cores: int
    rollup_last_run_s: float
    rollup_every_s: int
    lag_mean_s: float
    lag_max_s: float
    raw_per_day: float
    raw_retention: float
    rollup_per_day: float
    rollup_per_year: float
    rollup_superseded: float
    wal_per_day: float
    wal_per_checkpoint: float


def rollup_run_s(f: Figures, gpus: int, k: int) -> float:
    """Server CPU seconds of the rollup run at minute k of the hour, for ``gpus`` GPUs."""
    return (
        f.rollup_fixed_server_ms
        + gpus * (f.rollup_server_ms_per_gpu + f.rollup_server_ms_per_gpu_sample * k)
    ) / 1e3


def push_ms_full(f: Figures, push_ms: float) -> float:
    """A sync web process's time per push of this run's samples: bench/ingest.py's push (NVML
    fields only, as its agent sends them) plus what profiling and a workload per sample add
    to the service and to PostgreSQL, both measured here."""
    extra = f.push_client_cpu_ms - f.push_client_cpu_ms_basic
    extra += f.push_server_cpu_ms - f.push_server_cpu_ms_basic
    return push_ms + max(extra, 0.0)


def derive(f: Figures, gpus: int, push_ms: float) -> Derived:
    nodes = gpus / GPUS_PER_NODE
    pushes_per_s = nodes / INTERVAL_S
    per_push_ms = push_ms_full(f, push_ms)
    web_busy = pushes_per_s * per_push_ms / 1e3
    client_run_s = f.rollup_client_ms_per_run / 1e3
    # Beat starts a run every minute; one that finds the rollup running stands down. A run
    # longer than the minute therefore spaces the next by whole minutes: fewer runs an hour,
    # each re-reading the hour so far (its cost grows with the minute of the hour).
    longest = rollup_run_s(f, gpus, 60) + client_run_s
    step = max(f.rollup_every_min, math.ceil(longest / INTERVAL_S))
    # Past an hour a run: one a run, covering all of the hour.
    runs = [rollup_run_s(f, gpus, k) for k in range(step, 61, step)] or [longest]
    pg_ingest = pushes_per_s * f.push_server_cpu_ms / 1e3
    pg_rollup = sum(runs) / 3600
    # A sample waits for the next run to start (half the spacing on average, all of it at
    # worst), then for that run to finish.
    mean_run = statistics.mean(runs) + client_run_s
    spacing = step * INTERVAL_S
    # Rollup rows per GPU and day, packed (VACUUM FULL): what a year of closed hours and days
    # holds once vacuum has reclaimed their superseded versions.
    gpu_days = max(f.gpus * f.minutes / 1440, 1)
    rollup_gpu_day = (
        f.hourly_rows * f.hourly_bytes_per_row_packed
        + f.daily_rows * f.daily_bytes_per_row_packed
        + f.workload_rows * f.workload_bytes_per_row_packed
    ) / gpu_days
    # The open hour's and day's superseded row versions (the rollup rewrites them every
    # minute): space vacuum reclaims and the next hour reuses, so a constant, not a rate.
    superseded = sum(
        (getattr(f, f"{name}_bytes_per_row") - getattr(f, f"{name}_bytes_per_row_packed"))
        * getattr(f, f"{name}_rows")
        for name in ("hourly", "daily", "workload")
    ) / max(f.gpus, 1)
    # WAL per interval: the samples, each run's rewrite of the open hour's rows (measured at
    # a run every rollup_every_min minutes: that share of the GPU-hour's figure per run), its
    # fixed part, and the pages' first change after the checkpoint (written whole).
    interval = f.checkpoint_minutes
    runs_per_interval = interval / step
    per_run = gpus * f.wal_rollup_per_gpu_hour * f.rollup_every_min / 60
    per_checkpoint = (
        gpus * interval * f.wal_ingest_per_sample
        + runs_per_interval * (per_run + f.rollup_fixed_wal)
        + gpus * f.fpi_per_checkpoint_per_gpu
    )
    raw_day = gpus * 1440 * f.raw_bytes_per_sample
    return Derived(
        gpus=gpus,
        pushes_per_s=pushes_per_s,
        push_ms=per_push_ms,
        web_busy=web_busy,
        web_processes=max(2, math.ceil(web_busy / HEADROOM)),
        pg_ingest_cores=pg_ingest,
        pg_rollup_cores=pg_rollup,
        pg_cores=max(2, math.ceil((pg_ingest + pg_rollup) / HEADROOM)),
        rollup_last_run_s=longest,
        rollup_every_s=spacing,
        lag_mean_s=spacing / 2 + mean_run,
        lag_max_s=spacing + longest,
        raw_per_day=raw_day,
        raw_retention=raw_day * (RETENTION_DAYS + 1),
        rollup_per_day=gpus * rollup_gpu_day,
        rollup_per_year=gpus * rollup_gpu_day * 365,
        rollup_superseded=gpus * superseded,
        wal_per_day=per_checkpoint * (1440 / interval),
        wal_per_checkpoint=per_checkpoint,
    )


def rollup_limit_gpus(f: Figures, seconds: float) -> int:
    """The fleet whose last rollup run of the hour takes ``seconds`` of server CPU."""
    per_gpu = (f.rollup_server_ms_per_gpu + 60 * f.rollup_server_ms_per_gpu_sample) / 1e3
    return int(
        (seconds - f.rollup_fixed_server_ms / 1e3 - f.rollup_client_ms_per_run / 1e3) / per_gpu
    )


LAG_GOAL_S = 60  # issue 46: a sample in the rollups within a minute on average
LAG_FLEET = 200_000


def lag_limit_gpus(f: Figures, push_ms: float, goal_s: float = LAG_GOAL_S) -> int:
    """The largest fleet one database rolls up with a mean lag under ``goal_s``."""
    lo, hi = 0, 2_000_000
    while hi - lo > 100:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if derive(f, mid, push_ms).lag_mean_s < goal_s else (lo, mid)
    return lo


def databases_for(f: Figures, gpus: int, push_ms: float, goal_s: float = LAG_GOAL_S) -> int:
    """Databases (sites split evenly, each its own PostgreSQL and rollup) that keep the mean
    lag of a fleet of ``gpus`` under ``goal_s``: each rolls up its share in parallel."""
    return max(1, math.ceil(gpus / max(lag_limit_gpus(f, push_ms, goal_s), 1)))


def wal_per_gpu_day(f: Figures) -> dict[str, float]:
    """WAL per GPU and day as the table derives it (a run a minute), in bytes, by source."""
    ingest = 1440 * f.wal_ingest_per_sample
    rollup = 24 * f.wal_rollup_per_gpu_hour
    fpi = 1440 / f.checkpoint_minutes * f.fpi_per_checkpoint_per_gpu
    return {"ingest": ingest, "rollup": rollup, "fpi": fpi, "total": ingest + rollup + fpi}


def hot_ratio(f: Figures, table: str) -> str:
    counts = f.rollup_tuples.get(table)
    if not counts or not counts["upd"]:
        return "no updates"
    return f"{counts['hot_upd'] / counts['upd']:.0%} of {counts['upd']:,} updates"


def compare(before: Figures, after: Figures) -> None:
    """The WAL figures of two runs side by side (``--compare``: the code before, then now)."""
    print("\n| per GPU and day | before | after |\n|---|---:|---:|")
    b, a = wal_per_gpu_day(before), wal_per_gpu_day(after)
    for key in ("ingest", "rollup", "fpi", "total"):
        print(f"| WAL, {key} | {b[key] / 1e6:.2f} MB | {a[key] / 1e6:.2f} MB |")
    for table in ROLLUP_TABLES:
        print(f"| HOT updates, {table} | {hot_ratio(before, table)} | {hot_ratio(after, table)} |")
    for name in ("rollup_server_ms_per_gpu", "rollup_server_ms_per_gpu_sample"):
        print(f"| {name} | {getattr(before, name):.4f} | {getattr(after, name):.4f} |")
    relations = dict.fromkeys([*before.rollup_wal_by_relation, *after.rollup_wal_by_relation])
    for rel in relations:
        was = before.rollup_wal_by_relation.get(rel, 0) / 1e3
        now = after.rollup_wal_by_relation.get(rel, 0) / 1e3
        print(f"| rollup WAL, {rel} | {was:.1f} KB | {now:.1f} KB |")


def report(f: Figures, push_ms: float) -> None:
    print("\nMeasured (bytes and WAL: what was written; CPU times: totals / count, on which load")
    print("weighs; wall times: medians):")
    for name, value in asdict(f).items():
        print(f"  {name}: {value if not isinstance(value, float) else round(value, 4)}")
    rows = [derive(f, n, push_ms) for n in FLEETS]
    print(
        f"\nDerived, at {INTERVAL_S} s pushes, {GPUS_PER_NODE} GPUs per node, {push_ms} ms per "
        f"push in a sync web process, headroom: at most {HEADROOM:.0%} busy:\n"
    )
    header = "| | " + " | ".join(f"{d.gpus:,} GPUs" for d in rows) + " |"
    print(header)
    print("|---|" + "---:|" * len(rows))
    lines = [
        ("pushes / s (8-GPU nodes every 60 s)", lambda d: f"{d.pushes_per_s:,.0f}"),
        ("web: ms per push in a sync process", lambda d: f"{d.push_ms:.2f}"),
        ("web: sync processes busy with ingest", lambda d: f"{d.web_busy:.2f}"),
        ("web processes for ingest (≥ 2)", lambda d: f"{d.web_processes}"),
        ("Celery rollup workers (one runs at a time)", lambda d: "1 (+1 standby)"),
        ("rollup run at the hour's last minute", lambda d: f"{d.rollup_last_run_s:.1f} s"),
        ("rollup runs every", lambda d: f"{d.rollup_every_s} s"),
        ("push to rollups (lag), mean / worst",
         lambda d: f"{d.lag_mean_s:.0f} s / {d.lag_max_s:.0f} s"),
        ("PostgreSQL CPU busy: ingest + rollup",
         lambda d: f"{d.pg_ingest_cores:.2f} + {d.pg_rollup_cores:.2f} cores"),
        ("PostgreSQL cores (ingest + rollup, ≥ 2)", lambda d: f"{d.pg_cores}"),
        ("raw samples per day", lambda d: gib(d.raw_per_day)),
        (f"raw samples, {RETENTION_DAYS} days (+ the day in progress)",
         lambda d: gib(d.raw_retention)),
        ("rollups per day (hourly, daily, workload)", lambda d: gib(d.rollup_per_day)),
        ("rollups per year", lambda d: gib(d.rollup_per_year)),
        ("superseded rollup versions awaiting vacuum (constant)",
         lambda d: gib(d.rollup_superseded)),
        ("WAL per day", lambda d: gib(d.wal_per_day)),
        (f"WAL per {f.checkpoint_minutes}-minute checkpoint interval",
         lambda d: gib(d.wal_per_checkpoint)),
        # Checkpoints stay timed (and full-page images as measured) while each interval's WAL
        # fits in max_wal_size with room to spare (PostgreSQL's default: 1 GB).
        ("max_wal_size (twice the interval's WAL, ≥ 1 GB)",
         lambda d: gib(max(2 * d.wal_per_checkpoint, 1024**3))),
    ]  # fmt: skip
    for label, cell in lines:
        print(f"| {label} | " + " | ".join(cell(d) for d in rows) + " |")
    per_day = wal_per_gpu_day(f)
    print(
        f"\nWAL per GPU and day: {per_day['total'] / 1e6:.2f} MB (ingest "
        f"{per_day['ingest'] / 1e6:.2f}, rollup {per_day['rollup'] / 1e6:.2f}, full-page images "
        f"{per_day['fpi'] / 1e6:.2f}); HOT updates of the hourly rows: "
        f"{hot_ratio(f, 'telemetry_hourlyusage')}."
    )
    one = derive(f, LAG_FLEET, push_ms)
    if lag_limit_gpus(f, push_ms) == 0:
        print(f"\nA mean lag under {LAG_GOAL_S} s: not with runs every {f.rollup_every_min} min.")
        return
    n = databases_for(f, LAG_FLEET, push_ms)
    split = derive(f, math.ceil(LAG_FLEET / n), push_ms)
    print(
        f"\nAt {LAG_FLEET:,} GPUs on one database: the hour's last run "
        f"{one.rollup_last_run_s:.0f} s, runs every {one.rollup_every_s} s, lag mean / worst "
        f"{one.lag_mean_s:.0f} s / {one.lag_max_s:.0f} s. One database keeps the mean lag under "
        f"{LAG_GOAL_S} s up to {lag_limit_gpus(f, push_ms):,} GPUs; split by site onto {n} "
        f"databases of {math.ceil(LAG_FLEET / n):,} GPUs: lag mean / worst "
        f"{split.lag_mean_s:.0f} s / {split.lag_max_s:.0f} s, WAL {gib(split.wal_per_day)} a day "
        f"each."
    )
    print(
        f"\nOne rollup at a time: its last run of the hour reaches 30 s at "
        f"{rollup_limit_gpus(f, 30):,} GPUs and 60 s (from there runs are spaced by more than "
        f"the beat's minute) at {rollup_limit_gpus(f, 60):,} GPUs."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=128)
    parser.add_argument("--minutes", type=int, default=1440, help="simulated minutes, ≥ 60")
    parser.add_argument("--basic-minutes", type=int, default=1440)
    parser.add_argument("--checkpoint-at", type=int, default=720, help="simulated minute")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument(
        "--rollup-every", type=int, default=1, help="simulated minutes between rollup runs"
    )
    parser.add_argument(
        "--checkpoint-minutes",
        type=int,
        default=CHECKPOINT_INTERVAL_MIN,
        help="checkpoint_timeout to model: full-page images measured over that many minutes",
    )
    parser.add_argument("--wal-compression", default="off", help="off, pglz, lz4 or zstd")
    parser.add_argument(
        "--push-ms", type=float, default=3.67, help="ms per 8-GPU push, bench/ingest.py"
    )
    parser.add_argument("--json", type=Path, help="write the measured figures here")
    parser.add_argument("--from-json", type=Path, help="derive from figures saved by --json")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument(
        "--compare", type=Path, help="figures of a run of the code before (--json): side by side"
    )
    args = parser.parse_args()
    if args.from_json:
        figures = Figures(**json.loads(args.from_json.read_text()))
        report(figures, args.push_ms)
        if args.compare:
            compare(Figures(**json.loads(args.compare.read_text())), figures)
        return 0
    if args.minutes < 60:
        parser.error("--minutes: at least one whole hour (60)")

    # The rollup logs a line per run at INFO: 1,440 of them would bury the figures.
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        print("bench/sizing.py needs PostgreSQL: set DATABASE_URL", file=sys.stderr)
        return 2
    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = f"{db['NAME']}_sizing"
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    print(f"database {name}: {args.gpus} GPUs × {args.minutes} minutes", flush=True)
    try:
        figures = measure(args)
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(name, verbosity=0)
    if args.json:
        args.json.write_text(json.dumps(asdict(figures), indent=1) + "\n")
    report(figures, args.push_ms)
    if args.compare:
        compare(Figures(**json.loads(args.compare.read_text())), figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
