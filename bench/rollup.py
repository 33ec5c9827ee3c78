"""Benchmark: the hourly rollup against a hand-written single SQL statement (docs/benchmarks.md).

One day of 1-minute samples for 1,000 GPUs (1.44 M rows, loaded with COPY) on PostgreSQL:

* reference: one hand-written ``INSERT … SELECT … GROUP BY … ON CONFLICT DO UPDATE`` over the
  day, same per-sample rules, into a copy of the rollup table (same columns and indexes);
* rollup: ``telemetry.rollup.rollup_run()`` over the same 24 marked hours (lock, marks,
  stale-row delete, upsert, watermark — everything a production run does);
* re-run: the same 24 hours marked again and rolled again (every row an update);
* checksum: both result sets, every column as exact text, hashed in (gpu, hour) order, must be
  equal (the data lie on a binary grid, so every sum is exact whatever the order of addition).
  Ids and dates are written as what does not change from run to run (the GPU's uuid, the
  node's hostname, hours and days counted from the bench day), so the checksum of one version
  of the code can be compared with another's on the same ``--seed``; the ``DailyUsage`` rows
  the triggers keep are hashed too.

* with and without profiling: the first run of the production rollup against the same rollup
  with the profiling figures of the four new sample fields (sm_occupancy, tensor_active,
  dram_active, prof_s; docs/metrics.md, "Work") left out (``without_profiling``), alternating.

Goals: rollup ≥ 0.7 × the reference's speed; re-run ≤ 1.5 × the first run; with the profiling
figures ≤ 1.15 × without. Ratios print last.

``--workloads``: instead, the same day with two workloads per sample (two Slurm jobs sharing each
GPU, ``share_s`` 30 each, ``air_s`` half the sample's air time each) against the day without,
``rollup_run`` of each in alternating rounds (the arrays are set or cleared by one UPDATE and a
VACUUM before each): issue 14's goal is ≤ 1.3× the rollup without. Then the floor any design
that sums each workload from every sample pays (the GPUs' statement reading the arrays, its six
position sums, writing the workload rows), each part into empty rollup tables, all parts in
the same rounds on the same rows. Wall time and the PostgreSQL backend's CPU time, both.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/DB .venv/bin/python bench/rollup.py

The database must be migrated. The script adds a node ``bench-rollup`` and GPUs
``BENCH-ROLLUP-*`` with a day of samples two days ago, and removes them, their samples and
their rollups at the end (``--keep`` leaves them). Do not point it at production.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from fleet.models import FleetSettings, Gpu, Node  # noqa: E402
from telemetry.models import RollupColumn, Workload  # noqa: E402
from telemetry.pending import hours_mark  # noqa: E402
from telemetry.rollup import rollup_run  # noqa: E402

NODE = "bench-rollup"
REF_TABLE = "bench_rollup_reference"
COLUMNS = (
    "gpu_id, start, seconds, util_pct, mem_util_pct, mem_used_bytes, procs, power_w, energy_j, "
    "temp_c, throttle_power_cap_s, throttle_thermal_s, throttle_any_s, sm_active, sm_occupancy, "
    "tensor_active, dram_active, prof_s, received_at"
)
MEMORY_TOTAL = 80 * 1024**3
WORKLOAD_PREFIX = "bench-rollup-"

# The reference: the rollup as one would write it by hand for one known day, in one statement,
# with the same per-sample rules (docs/metrics.md) and attribution, into a copy of the table.
REFERENCE_SQL = f"""
INSERT INTO {REF_TABLE} (
    gpu_id, hour, node_id, pool_id, team_id, site_id, samples, observed_s, air_s, held_s,
    parked_s, energy_j, idle_energy_j, idle_s, power_w_mean, power_w_max, temp_c_max,
    util_pct_mean, mem_util_pct_mean, throttle_power_cap_s, throttle_thermal_s,
    throttle_hw_slowdown_s, throttle_other_s, throttle_any_s, sm_active_s, sm_observed_s,
    sm_air_s, tensor_active_s, tensor_observed_s, sm_hours, sm_hours_energy_j,
    sm_occupancy_mean, dram_active_mean, computed_at)
SELECT
    s.gpu_id, date_trunc('hour', s.start, 'UTC'), g.node_id, n.pool_id,
    COALESCE(g.team_id, p.team_id), COALESCE(n.site_id, p.site_id),
    count(*), sum(s.seconds),
    sum(COALESCE(s.active_s, s.util_pct / 100.0 * s.seconds)),
    sum(CASE WHEN s.procs > 0 OR (s.procs IS NULL AND g.memory_total_bytes > 0
                 AND s.mem_used_bytes >= 0.05 * g.memory_total_bytes)
        THEN s.seconds - COALESCE(s.active_s, s.util_pct / 100.0 * s.seconds) ELSE 0 END),
    sum(CASE WHEN s.procs > 0 OR (s.procs IS NULL AND g.memory_total_bytes > 0
                 AND s.mem_used_bytes >= 0.05 * g.memory_total_bytes)
        THEN 0 ELSE s.seconds - COALESCE(s.active_s, s.util_pct / 100.0 * s.seconds) END),
    sum(COALESCE(s.energy_j, s.power_w * s.seconds, 0)),
    sum(CASE WHEN s.util_pct < %(active)s
        THEN COALESCE(s.energy_j, s.power_w * s.seconds, 0) ELSE 0 END),
    sum(CASE WHEN s.util_pct < %(active)s THEN s.seconds ELSE 0 END),
    sum(COALESCE(s.energy_j, s.power_w * s.seconds, 0))
        / NULLIF(sum(CASE WHEN s.energy_j IS NOT NULL OR s.power_w IS NOT NULL
                     THEN s.seconds ELSE 0 END), 0),
    max(s.power_w), max(s.temp_c),
    sum(s.util_pct * s.seconds) / sum(s.seconds),
    sum(s.mem_util_pct * s.seconds)
        / NULLIF(sum(CASE WHEN s.mem_util_pct IS NOT NULL THEN s.seconds ELSE 0 END), 0),
    sum(COALESCE(s.throttle_power_cap_s, 0)), sum(COALESCE(s.throttle_thermal_s, 0)),
    sum(COALESCE(s.throttle_hw_slowdown_s, 0)), sum(COALESCE(s.throttle_other_s, 0)),
    sum(COALESCE(s.throttle_any_s, GREATEST(COALESCE(s.throttle_power_cap_s, 0),
        COALESCE(s.throttle_thermal_s, 0), COALESCE(s.throttle_hw_slowdown_s, 0),
        COALESCE(s.throttle_other_s, 0)))),
    -- profiling (docs/metrics.md, "Work"): means over prof_s, else the interval
    COALESCE(sum(s.sm_active * COALESCE(s.prof_s, s.seconds)), 0),
    sum(CASE WHEN s.sm_active IS NOT NULL THEN COALESCE(s.prof_s, s.seconds) ELSE 0 END),
    sum(CASE WHEN s.sm_active IS NOT NULL
        THEN COALESCE(s.active_s, s.util_pct / 100.0 * s.seconds) ELSE 0 END),
    COALESCE(sum(s.tensor_active * COALESCE(s.prof_s, s.seconds)), 0),
    sum(CASE WHEN s.tensor_active IS NOT NULL THEN COALESCE(s.prof_s, s.seconds) ELSE 0 END),
    CASE WHEN count(s.sm_active) > 0 THEN 1 ELSE 0 END,
    CASE WHEN count(s.sm_active) > 0
        THEN sum(COALESCE(s.energy_j, s.power_w * s.seconds, 0)) ELSE 0 END,
    sum(s.sm_occupancy * COALESCE(s.prof_s, s.seconds)) / NULLIF(sum(CASE WHEN
        s.sm_occupancy IS NOT NULL THEN COALESCE(s.prof_s, s.seconds) ELSE 0 END), 0),
    sum(s.dram_active * COALESCE(s.prof_s, s.seconds)) / NULLIF(sum(CASE WHEN
        s.dram_active IS NOT NULL THEN COALESCE(s.prof_s, s.seconds) ELSE 0 END), 0),
    now()
FROM telemetry_sample s
JOIN fleet_gpu g ON g.id = s.gpu_id
JOIN fleet_node n ON n.id = g.node_id
LEFT JOIN fleet_pool p ON p.id = n.pool_id
WHERE s.start >= %(lo)s AND s.start < %(hi)s
  AND (g.in_service_at IS NULL OR s.start >= g.in_service_at)
  AND (g.retired_at IS NULL OR s.start < g.retired_at)
GROUP BY s.gpu_id, date_trunc('hour', s.start, 'UTC'), g.node_id, n.pool_id,
    COALESCE(g.team_id, p.team_id), COALESCE(n.site_id, p.site_id)
ON CONFLICT (gpu_id, hour) DO UPDATE SET
    samples = EXCLUDED.samples, observed_s = EXCLUDED.observed_s, air_s = EXCLUDED.air_s,
    held_s = EXCLUDED.held_s, parked_s = EXCLUDED.parked_s, energy_j = EXCLUDED.energy_j,
    idle_energy_j = EXCLUDED.idle_energy_j, idle_s = EXCLUDED.idle_s,
    power_w_mean = EXCLUDED.power_w_mean, power_w_max = EXCLUDED.power_w_max,
    temp_c_max = EXCLUDED.temp_c_max, util_pct_mean = EXCLUDED.util_pct_mean,
    mem_util_pct_mean = EXCLUDED.mem_util_pct_mean,
    throttle_power_cap_s = EXCLUDED.throttle_power_cap_s,
    throttle_thermal_s = EXCLUDED.throttle_thermal_s,
    throttle_hw_slowdown_s = EXCLUDED.throttle_hw_slowdown_s,
    throttle_other_s = EXCLUDED.throttle_other_s, throttle_any_s = EXCLUDED.throttle_any_s,
    sm_active_s = EXCLUDED.sm_active_s, sm_observed_s = EXCLUDED.sm_observed_s,
    sm_air_s = EXCLUDED.sm_air_s, tensor_active_s = EXCLUDED.tensor_active_s,
    tensor_observed_s = EXCLUDED.tensor_observed_s, sm_hours = EXCLUDED.sm_hours,
    sm_hours_energy_j = EXCLUDED.sm_hours_energy_j,
    sm_occupancy_mean = EXCLUDED.sm_occupancy_mean, dram_active_mean = EXCLUDED.dram_active_mean,
    computed_at = EXCLUDED.computed_at
"""

# Every column, as exact text, hashed in key order: equal checksums ⇔ bit-identical rows. The
# columns are read from the catalogue, so a column added later is hashed without a change here;
# ids that a run creates are replaced by names, hours and days by offsets from the bench day.
CHECKSUM_SQL = """
SELECT count(*), md5(string_agg(concat_ws(',', {columns}), ';' ORDER BY {order}))
FROM {table} AS t
JOIN fleet_gpu AS g ON g.id = t.gpu_id
JOIN fleet_node AS n ON n.id = t.node_id
WHERE t.gpu_id = ANY(%(gpus)s)
"""
CHECKSUM_KEYS = {
    "gpu_id": "g.uuid",
    "node_id": "n.hostname",
    "hour": "extract(epoch FROM t.hour - %(lo)s)::bigint",
    "day": "t.day - %(lo)s::date",
}


def checksum(cursor: Any, table: str, like: str, params: dict[str, Any]) -> tuple[int, str]:
    """(rows, md5) of ``table``'s bench rows over every column of ``like`` but id and
    computed_at, in the catalogue's column order."""
    cursor.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND column_name NOT IN ('id', 'computed_at') ORDER BY ordinal_position",
        [like],
    )
    names = [name for (name,) in cursor.fetchall()]
    columns = ", ".join(CHECKSUM_KEYS.get(name, f"t.{name}") for name in names)
    order = "g.uuid, " + ("t.hour" if "hour" in names else "t.day, n.hostname")
    cursor.execute(CHECKSUM_SQL.format(columns=columns, order=order, table=table), params)
    rows, digest = cursor.fetchone()
    return int(rows), str(digest)


def cleanup(lo: dt.datetime, hi: dt.datetime) -> None:
    gpu_ids = list(Gpu.objects.filter(node__hostname=NODE).values_list("id", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {REF_TABLE}")
        if gpu_ids:
            cursor.execute(
                "DELETE FROM telemetry_sample WHERE gpu_id = ANY(%s) AND start >= %s "
                "AND start < %s",
                [gpu_ids, lo, hi],
            )
            cursor.execute("DELETE FROM telemetry_hourlyusage WHERE gpu_id = ANY(%s)", [gpu_ids])
            cursor.execute(
                "DELETE FROM telemetry_workloadhourlyusage WHERE gpu_id = ANY(%s)", [gpu_ids]
            )
    Workload.objects.filter(key__startswith=WORKLOAD_PREFIX).delete()
    Gpu.objects.filter(node__hostname=NODE).delete()
    Node.objects.filter(hostname=NODE).delete()


def load(gpus: list[int], lo: dt.datetime, minutes: int, seed: int) -> int:
    """COPY one sample per GPU per minute, with a realistic mix of fields present and absent.

    Values lie on a binary grid (utilisation in steps of 6.25 %, power in 0.5 W, throttle in
    0.25 s, sm_active in 1/16) so that every sum is exact in floating point: the checksum can
    then be bit-exact whatever order each statement happens to add in.
    """
    rng = random.Random(seed)
    received = timezone.now().isoformat()
    # 16 GPU profiles of one day each, shared round-robin: generating 1.44 M rows one by one
    # in Python would take longer than everything measured here.
    profiles: list[list[str]] = []
    for p in range(16):
        busy = rng.random()  # this profile's share of busy minutes
        has_energy = p % 4 != 0  # a quarter send only power (no energy counter)
        has_procs = p % 5 != 0  # some cannot see processes (the memory rule applies)
        has_sm = p % 3 == 0  # some run DCGM or GPM
        lines = []
        for m in range(minutes):
            start = (lo + dt.timedelta(minutes=m)).isoformat()
            util = 6.25 * (rng.randint(5, 16) if rng.random() < busy else rng.randint(0, 1))
            power = 70 + util * 6
            held = util > 5 or rng.random() < 0.5
            thermal = 0.25 * rng.randint(0, 80) if util > 90 else 0.0
            cap = 0.25 * rng.randint(0, 120) if util > 80 else 0.0
            # Profiling: SM active k/16, occupancy and tensor halves and quarters of it, DRAM
            # in eighths, over 56 of the 60 s in every eighth minute (a GPM pair missed).
            sm = util / 100 if has_sm else None
            prof = (
                (sm, sm / 2, sm / 4, 0.125 * rng.randint(0, 8), 56.0 if m % 8 == 0 else 60.0)
                if sm is not None
                else (None, None, None, None, None)
            )
            values = (
                start, 60, util, util / 2, int(MEMORY_TOTAL * (0.5 if held else 0.01)),
                (1 if held else 0) if has_procs else None,
                power, power * 60 if has_energy else None, 40 + util / 4,
                cap, thermal, max(cap, thermal) if p % 2 else None,
                *prof, received,
            )  # fmt: skip
            lines.append("\t".join("\\N" if v is None else str(v) for v in values) + "\n")
        profiles.append(lines)
    n = 0
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY telemetry_sample ({COLUMNS}) FROM STDIN") as copy:
            for i, gpu_id in enumerate(gpus):
                prefix = f"{gpu_id}\t"
                copy.write(prefix + prefix.join(profiles[i % 16]))
                n += minutes
    return n


# The second wave's profiling figures (docs/metrics.md, "Work"): what the rollup computes from
# the four new sample fields (sm_occupancy, tensor_active, dram_active, prof_s) beside sm_active.
PROFILING_SUMS = (
    "sm_air_s",
    "tensor_active_s",
    "tensor_observed_s",
    "sm_hours",
    "sm_hours_energy_j",
)
PROFILING_STATS = ("sm_occupancy_mean", "dram_active_mean")


@contextlib.contextmanager
def without_profiling() -> Iterator[None]:
    """The rollup as it was before the four new fields: sm_active over the whole interval, and
    none of the profiling figures computed. Their columns are written as constants (0, NULL):
    the table still has them (NOT NULL without a database default), and a constant costs the
    statement next to nothing, so the difference measured is the figures' computation."""
    import telemetry.rollup

    # The statements' column lists are filled in from these two module names (and cached).
    rollup: Any = telemetry.rollup
    saved = rollup.USAGE_SUMS, rollup.HOURLY_STATS
    sums = []
    for c in saved[0]:
        if c.name in PROFILING_SUMS:
            c = RollupColumn(c.name, "0", integer=c.integer)
        elif c.name == "sm_active_s":
            c = RollupColumn(c.name, "COALESCE(sum(sm_active * d), 0)")
        elif c.name == "sm_observed_s":
            c = RollupColumn(c.name, "sum(CASE WHEN sm_active IS NOT NULL THEN d ELSE 0 END)")
        sums.append(c)
    stats = tuple(
        RollupColumn(c.name, "CAST(NULL AS float8)") if c.name in PROFILING_STATS else c
        for c in saved[1]
    )
    rollup.USAGE_SUMS, rollup.HOURLY_STATS = tuple(sums), stats
    rollup._column_lists.cache_clear()
    rollup._sql.cache_clear()
    try:
        yield
    finally:
        rollup.USAGE_SUMS, rollup.HOURLY_STATS = saved
        rollup._column_lists.cache_clear()
        rollup._sql.cache_clear()


def workloads_compare(
    gpu_ids: list[int],
    lo: dt.datetime,
    hi: dt.datetime,
    rollup: Any,
    empty_targets: Any,
    rounds: int,
) -> None:
    """``rollup_run`` of the day with two workloads per sample against the same day without,
    in alternating rounds; prints the ratio of the best times."""
    made = Workload.objects.bulk_create(
        Workload(kind="slurm", key=f"{WORKLOAD_PREFIX}{i}", created_at=timezone.now())
        for i in range(2 * len(gpu_ids))
    )
    pairs: dict[str, Any] = {
        "gpus": gpu_ids,
        "one": [made[2 * i].pk for i in range(len(gpu_ids))],
        "two": [made[2 * i + 1].pk for i in range(len(gpu_ids))],
        "lo": lo,
        "hi": hi,
    }

    def arrays(on: bool) -> None:
        with connection.cursor() as cursor:
            if on:
                cursor.execute(
                    """
                    UPDATE telemetry_sample AS s
                    SET workload_ids = ARRAY[m.one, m.two],
                        workload_share_s = ARRAY[s.seconds / 2.0, s.seconds / 2.0],
                        workload_air_s = ARRAY[s.util_pct / 100 * s.seconds / 2,
                                               s.util_pct / 100 * s.seconds / 2]
                    FROM unnest(%(gpus)s::bigint[], %(one)s::bigint[], %(two)s::bigint[])
                        AS m(gpu_id, one, two)
                    WHERE s.gpu_id = m.gpu_id AND s.start >= %(lo)s AND s.start < %(hi)s
                    """,
                    pairs,
                )
            else:
                cursor.execute(
                    "UPDATE telemetry_sample SET workload_ids = NULL, workload_share_s = NULL,"
                    " workload_air_s = NULL WHERE gpu_id = ANY(%s) AND start >= %s"
                    " AND start < %s",
                    [gpu_ids, lo, hi],
                )
            cursor.execute(
                "DELETE FROM telemetry_workloadhourlyusage WHERE gpu_id = ANY(%s)", [gpu_ids]
            )
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE telemetry_sample")
            # The workload rows just deleted, as empty_targets does for the GPUs' rows: neither
            # side pays for dead rows of the round before.
            cursor.execute("VACUUM telemetry_workloadhourlyusage")

    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for round_no in range(rounds):
        for on in (False, True) if round_no % 2 == 0 else (True, False):
            arrays(on)
            empty_targets()
            wall, cpu_s = backend_cpu_timed(rollup)
            times[on].append(wall)
            cpu[on].append(cpu_s)
    without, with_ = min(times[False]), min(times[True])
    # Each round's own ratio (its two runs back to back), and their median: on a machine
    # whose speed drifts by tens of percent between runs, the best of each side may come
    # from different moments, a round's pair from the same one.
    paired = sorted(w / wo for w, wo in zip(times[True], times[False], strict=True))
    cpu_paired = sorted(w / wo for w, wo in zip(cpu[True], cpu[False], strict=True))
    rows = connection.cursor()
    rows.execute(
        "SELECT count(*) FROM telemetry_workloadhourlyusage WHERE gpu_id = ANY(%s)", [gpu_ids]
    )
    print(f"rollup_run without workloads:           {without:6.2f} s (best of {rounds})")
    print(
        f"rollup_run, two workloads per sample:   {with_:6.2f} s, {rows.fetchone()[0]:,} "
        "workload rows"
    )
    print(f"ratio with / without workloads: {with_ / without:.2f} (goal <= 1.30)")
    print(
        f"ratio of each round's pair: median {statistics.median(paired):.2f}, "
        f"from {paired[0]:.2f} to {paired[-1]:.2f} ({len(paired)} rounds)"
    )
    print(
        f"PostgreSQL backend CPU: without {statistics.median(cpu[False]):.2f} s, with "
        f"{statistics.median(cpu[True]):.2f} s (medians); ratio of each round's pair: median "
        f"{statistics.median(cpu_paired):.2f}, from {cpu_paired[0]:.2f} to {cpu_paired[-1]:.2f}"
    )
    workloads_floor(gpu_ids, lo, hi, arrays, empty_targets, rounds)


def _gpu_statement(*, position_sums: bool) -> str:
    """The rollup's statement with its workload parts cut out: the GPUs' rows alone, from the
    same scan (``position_sums``: plus the six sums two workloads need, share, air and
    energy per position, and nothing else). Cut at its own lines, so a change to the
    statement fails here rather than measuring something else."""
    from telemetry.rollup import _sql

    sql = _sql("rollup_upsert.postgresql")

    def cut(text: str, first: str, last: str, keep: str = "") -> str:
        i, j = text.index(first), text.index(last) + len(last)
        return text[:i] + keep + text[j:]

    sums = (
        "        , s.workload_share_s[1] AS wl_s1, s.workload_share_s[2] AS wl_s2,\n"
        "        s.workload_air_s[1] AS wl_a1, s.workload_air_s[2] AS wl_a2\n"
    )
    sql = cut(sql, "        s.start,\n        -- The workloads by position", "AS wl_a2\n",
              sums if position_sums else "")  # fmt: skip
    sql = sql.replace(") AS thr_any,\n", ") AS thr_any\n", 1)
    agg = (
        "        , sum(wl_s1), sum(wl_s2), sum(wl_a1), sum(wl_a2),\n"
        "        sum(energy * wl_s1 / d), sum(energy * wl_s2 / d)\n"
    )
    sql = cut(sql, ",\n        -- The workloads (wl_sums)", "AS wl_last\n",
              "\n" + agg if position_sums else "\n")  # fmt: skip
    rest = sql.index("wl_sums AS MATERIALIZED (")
    sql = sql[:rest] + "SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM stale)"
    return sql.replace("    RETURNING 1\n),\nSELECT (SELECT", "    RETURNING 1\n)\nSELECT (SELECT")


def workloads_floor(
    gpu_ids: list[int],
    lo: dt.datetime,
    hi: dt.datetime,
    arrays: Any,
    empty_targets: Any,
    rounds: int,
) -> None:
    """What any design that keeps a row per workload, GPU and hour must spend: the GPUs'
    statement alone on the samples without and with the workloads' arrays (wider rows), that
    statement plus the six sums two workloads need, and writing the 48,000 workload rows
    alone (precomputed). Each in a transaction rolled back, into empty rollup tables (a
    statement that found the rows of the one before would update or skip them instead): the
    best wall time of ``rounds``, and the median of the PostgreSQL backend's CPU time."""
    from fleet.models import FleetSettings

    params = {
        "hours": [
            lo + dt.timedelta(hours=h) for h in range(int((hi - lo) / dt.timedelta(hours=1)))
        ],
        "lo": lo,
        "hi": hi,
        "contiguous": True,
        "active_util_pct": FleetSettings.load().active_util_pct,
        "now": timezone.now(),
    }

    from telemetry.rollup import _sql

    gpu_only, six_sums = _gpu_statement(position_sums=False), _gpu_statement(position_sums=True)
    whole = _sql("rollup_upsert.postgresql")
    arrays(True)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TEMPORARY TABLE bench_workload_rows AS
            SELECT x.workload_id, s.gpu_id, date_trunc('hour', s.start, 'UTC') AS hour,
                   count(*)::int AS samples, sum(x.share) AS gpu_s, sum(x.air) AS air_s
            FROM telemetry_sample AS s
            CROSS JOIN LATERAL unnest(s.workload_ids, s.workload_share_s, s.workload_air_s)
                AS x(workload_id, share, air)
            WHERE s.start >= %s AND s.start < %s
            GROUP BY 1, 2, 3
            """,
            [lo, hi],
        )
    parts: dict[str, tuple[str, Any]] = {
        # The same samples read as if they named no workloads (the arrays taken as NULL where
        # the statement reads them), so all of them run in the same rounds, on the same rows.
        "bare": (_without_arrays(gpu_only), params),
        "wide": (gpu_only, params),
        "summed": (six_sums, params),
        "write": (
            """
            INSERT INTO telemetry_workloadhourlyusage (workload_id, gpu_id, hour, samples,
                                                       gpu_s, air_s, energy_j, computed_at)
            SELECT workload_id, gpu_id, hour, samples, gpu_s, air_s, gpu_s, now()
            FROM bench_workload_rows
            ON CONFLICT (workload_id, gpu_id, hour) DO NOTHING
            """,
            None,
        ),
        # The rollup's whole statement, on the same rows read without and with workloads.
        "whole_bare": (_without_arrays(whole), params),
        "whole": (whole, params),
    }
    walls: dict[str, list[float]] = {name: [] for name in parts}
    cpus: dict[str, list[float]] = {name: [] for name in parts}
    for round_no in range(rounds):
        order = list(parts) if round_no % 2 == 0 else list(reversed(parts))
        for name in order:
            sql, args = parts[name]
            empty_targets()
            with connection.cursor() as cursor:
                cursor.execute(
                    "DELETE FROM telemetry_workloadhourlyusage WHERE gpu_id = ANY(%s)", [gpu_ids]
                )
                cursor.execute("VACUUM telemetry_workloadhourlyusage")
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT set_config('work_mem', '128MB', true)")
                wall, cpu_s = backend_cpu_timed(lambda: cursor.execute(sql, args))  # noqa: B023
                walls[name].append(wall)
                cpus[name].append(cpu_s)
                transaction.set_rollback(True)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_workload_rows")
    for label, figures, pick in (
        ("wall, best", walls, min),
        ("PostgreSQL backend CPU, median", cpus, statistics.median),
    ):
        bare, wide, summed, write, whole_bare, whole_s = (pick(figures[name]) for name in parts)
        print(f"floor ({label} of {rounds}):")
        print(f"  the GPUs' statement alone, no workloads {bare:6.2f} s")
        print(f"    the same samples with two workloads {wide:6.2f} s ({wide / bare:.2f}x)")
        print(f"    plus the six sums of two workloads {summed:6.2f} s ({summed / bare:.2f}x)")
        print(f"    writing the workload rows alone {write:6.2f} s ({write / bare:.2f}x)")
        print(f"  floor with no other work: {(summed + write) / bare:.2f}x (the goal: <= 1.30)")
        print(
            f"  the rollup's whole statement: {whole_bare:.2f} s without, {whole_s:.2f} s with "
            f"workloads ({whole_s / whole_bare:.2f}x)"
        )


def _without_arrays(sql: str) -> str:
    """The statement with the samples' workload arrays read as NULL (samples without
    workloads), in its per-sample part only."""
    i, j = sql.index("WITH per AS"), sql.index("FROM telemetry_sample AS s")
    per = sql[i:j]
    for column, kind in (
        ("workload_ids", "bigint[]"),
        ("workload_share_s", "float8[]"),
        ("workload_air_s", "float8[]"),
    ):
        per = per.replace(f"s.{column}", f"(NULL::{kind})")
    return sql[:i] + per + sql[j:]


def timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value


def backend_cpu_timed(fn: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this connection's PostgreSQL backend) of ``fn()``.

    The backend's CPU time (utime + stime, 10 ms ticks) leaves out the waits that other jobs
    on a shared machine add to the wall time; a drift of the machine's speed moves both."""
    from bench.sizing import backend_cpu_s

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    cpu = backend_cpu_s(pid)
    wall, _ = timed(fn)
    return wall, backend_cpu_s(pid) - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=1440)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the bench data in place")
    parser.add_argument(
        "--workloads", action="store_true", help="also: two workloads per sample against none"
    )
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/rollup.py needs PostgreSQL: set DATABASE_URL")

    today = timezone.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    lo = today - dt.timedelta(days=2)
    hi = lo + dt.timedelta(minutes=args.minutes)
    hours = [lo + dt.timedelta(hours=h) for h in range((args.minutes + 59) // 60)]
    try:
        from telemetry.partitions import partitions_maintain

        partitions_maintain()  # the bench day's partition, if the table is partitioned
    except ImportError:
        pass
    cleanup(lo, hi)
    node = Node.objects.create(hostname=NODE)
    gpus = Gpu.objects.bulk_create(
        Gpu(uuid=f"BENCH-ROLLUP-{i:05d}", node=node, index=i % 8, memory_total_bytes=MEMORY_TOTAL)
        for i in range(args.gpus)
    )
    gpu_ids = [g.pk for g in gpus]
    try:
        with transaction.atomic():
            load_s, n = timed(lambda: load(gpu_ids, lo, args.minutes, args.seed))
        print(f"loaded {n:,} samples with COPY in {load_s:.1f} s ({n / load_s:,.0f} rows/s)")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE telemetry_sample")
            # Warm-up: one scan sets hint bits and fills the cache, so neither contender pays
            # for the load.
            cursor.execute(
                "SELECT count(*), sum(util_pct) FROM telemetry_sample "
                "WHERE start >= %s AND start < %s",
                [lo, hi],
            )
            cursor.execute(f"CREATE TABLE {REF_TABLE} (LIKE telemetry_hourlyusage INCLUDING ALL)")
        active = FleetSettings.load().active_util_pct
        params: dict[str, Any] = {"lo": lo, "hi": hi, "active": active}

        def reference() -> None:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(REFERENCE_SQL, params)

        def rollup() -> Any:
            hours_mark(hours)
            return rollup_run()

        def empty_targets() -> None:
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {REF_TABLE}")
                cursor.execute(
                    "DELETE FROM telemetry_hourlyusage WHERE gpu_id = ANY(%s)", [gpu_ids]
                )
                cursor.execute("VACUUM telemetry_hourlyusage")

        if args.workloads:  # this comparison alone: the reference is not part of it
            workloads_compare(gpu_ids, lo, hi, rollup, empty_targets, args.rounds)
            return
        # Rounds in alternating order (who goes first must not matter); the best of each is
        # kept, the usual estimate of a cost on a machine that others share.
        ref_times, first_times, rerun_times, ref_rerun_times = [], [], [], []
        for round_no in range(args.rounds):
            empty_targets()
            if round_no % 2 == 0:
                ref_times.append(timed(reference)[0])
                first_s, result = timed(rollup)
            else:
                first_s, result = timed(rollup)
                ref_times.append(timed(reference)[0])
            assert result.hours == len(hours), result
            first_times.append(first_s)
            rerun_times.append(timed(rollup)[0])
            ref_rerun_times.append(timed(reference)[0])
        # The profiling figures' share: the first run with and without them, alternating
        # (the same samples, the four new fields present on a third of the GPUs).
        with_times, without_times = [], []
        for round_no in range(args.rounds):
            for variant in ("with", "without") if round_no % 2 == 0 else ("without", "with"):
                empty_targets()
                if variant == "with":
                    with_times.append(timed(rollup)[0])
                else:
                    with without_profiling():
                        without_times.append(timed(rollup)[0])
        # The checksums below are of the production rollup: roll the day once more with it.
        empty_targets()
        rollup()
        reference()
        ref_s, first_s = min(ref_times), min(first_times)
        rerun_s, ref_rerun_s = min(rerun_times), min(ref_rerun_times)
        sums = {}
        with connection.cursor() as cursor:
            for table in (REF_TABLE, "telemetry_hourlyusage"):
                sums[table] = checksum(
                    cursor, table, "telemetry_hourlyusage", {**params, "gpus": gpu_ids}
                )
            daily = checksum(
                cursor, "telemetry_dailyusage", "telemetry_dailyusage", {**params, "gpus": gpu_ids}
            )
    finally:
        if not args.keep:
            cleanup(lo, hi)

    rows = sums["telemetry_hourlyusage"][0]
    print(f"rollup rows: {rows:,} ({args.gpus} GPUs × {len(hours)} hours)")
    print(f"best of {args.rounds} rounds, alternating which contender goes first")
    print(f"reference statement (first):  {ref_s:6.2f} s  {n / ref_s:>10,.0f} samples/s")
    print(f"rollup_run (first):           {first_s:6.2f} s  {n / first_s:>10,.0f} samples/s")
    print(f"rollup_run (re-run):          {rerun_s:6.2f} s  {n / rerun_s:>10,.0f} samples/s")
    print(f"reference statement (re-run): {ref_rerun_s:6.2f} s")
    same = sums[REF_TABLE] == sums["telemetry_hourlyusage"]
    print(f"checksum reference {sums[REF_TABLE][1]}  rollup {sums['telemetry_hourlyusage'][1]}")
    print(f"checksum equal: {same}")
    print(f"daily rows: {daily[0]:,}, checksum {daily[1]}")
    with_s, without_s = min(with_times), min(without_times)
    print(f"rollup_run with the profiling figures:    {with_s:6.2f} s")
    print(f"rollup_run without the profiling figures: {without_s:6.2f} s")
    speed = ref_s / first_s
    rerun_ratio = rerun_s / first_s
    profiling_ratio = with_s / without_s
    print(f"ratio rollup speed / reference: {speed:.2f} (goal >= 0.70)")
    print(f"ratio re-run / first run:       {rerun_ratio:.2f} (goal <= 1.50)")
    print(f"ratio with / without profiling: {profiling_ratio:.2f} (goal <= 1.15)")
    if not same or speed < 0.7 or rerun_ratio > 1.5 or profiling_ratio > 1.15:
        sys.exit(1)


if __name__ == "__main__":
    main()
