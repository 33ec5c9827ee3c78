-- rollup_upsert (PostgreSQL): recompute the hourly per-GPU rollup rows of one batch of UTC hours
-- from raw samples, in one set-based statement.
--
-- Why one statement: docs/benchmarks.md — INSERT … SELECT … GROUP BY … ON CONFLICT DO UPDATE runs
-- several times faster than any loop, and rewriting an hour from all of its samples makes the
-- rollup idempotent: a re-run, a duplicate or a late sample ends in the same row.
--
--   per      one row per counting sample with the per-sample rules of docs/metrics.md applied:
--            air (active_s if sent, else u × d), held vs parked (with workloads: their shares
--            beyond the air time, clamped to the non-air time; without: procs > 0, or procs
--            unknown and memory used ≥ 5 pct of the GPU's total; both unknown → parked), energy fallback
--            (energy_j, else power_w × d, else 0), idle (util below the active threshold),
--            throttle "any" (sent, else the largest reason). Samples outside the GPU's
--            in-service window are stored but excluded here. A sample counts wholly in the hour
--            of its start.
--   agg      the values of each (gpu, hour): the usage sums, then the hour's means and maxima.
--   stale    deletes rows of these hours that no sample counts for any more (in_service moved),
--            so a re-roll leaves no orphan row. It sees the statement's snapshot, and never
--            touches a row that `written` writes (those are in agg).
--   written  the upsert. Attribution (node, pool, team, site) is set only when the row is
--            created; on conflict it keeps what is stored, so chargeback history does not move
--            when a GPU moves to another node, pool or team.
--
-- A template: the column lists in braces are filled in by telemetry.rollup from one list,
-- telemetry.models.USAGE_SUMS and HOURLY_STATS (each column's per-sample value and aggregate),
-- so a new column is added there, never here. Column names only, never values.
-- Parameters: hours (UTC hour starts of the batch), lo/hi (the batch's span: lets the planner
-- prune partitions and use the start index), contiguous (hours is every hour of [lo, hi)),
-- active_util_pct, now. Returns (rows written, rows deleted).
WITH per AS (
    SELECT
        s.gpu_id,
        date_trunc('hour', s.start, 'UTC') AS hour,
        s.seconds::float8 AS d,
        -- Values below 1e-300 count as 0. PostgreSQL raises "underflow" when a product or
        -- quotient of non-zero floats rounds to 0, so one subnormal value (valid JSON inside
        -- the ranges ingest checks) would fail its batch on every run and wedge the queue.
        -- Both dialects clamp, so they agree to the last bit.
        CASE WHEN s.util_pct < 1e-300 THEN 0 ELSE s.util_pct END AS util_pct,
        CASE WHEN s.mem_util_pct < 1e-300 THEN 0 ELSE s.mem_util_pct END AS mem_util_pct,
        s.power_w,
        s.temp_c,
        s.sm_active,
        s.sm_occupancy,
        s.tensor_active,
        s.dram_active,
        -- The seconds the profiling means cover: prof_s where sent, else the whole interval.
        COALESCE(s.prof_s, CAST(s.seconds AS float8)) AS p,
        -- Σ share_s of the workloads that held the GPU; NULL when the sample names none (then
        -- held and parked follow procs and memory), 0 for an empty list.
        CASE WHEN s.workload_share_s IS NOT NULL THEN COALESCE((SELECT sum(x) FROM unnest(s.workload_share_s) AS x), 0) END AS share,
        COALESCE(
            s.active_s,
            CASE WHEN s.util_pct < 1e-300 THEN 0 ELSE s.util_pct / 100.0 * s.seconds END
        ) AS air,
        COALESCE(
            CASE WHEN s.energy_j < 1e-300 THEN 0 ELSE s.energy_j END,
            CASE WHEN s.power_w < 1e-300 THEN 0 ELSE s.power_w * s.seconds END,
            0
        ) AS energy,
        (s.energy_j IS NOT NULL OR s.power_w IS NOT NULL) AS has_power,
        -- IS TRUE: an unknown procs with unknown memory (or unknown total) is parked, not held.
        (s.procs > 0 OR (s.procs IS NULL AND g.memory_total_bytes > 0
                         AND s.mem_used_bytes >= 0.05 * g.memory_total_bytes)) IS TRUE AS held,
        s.util_pct < %(active_util_pct)s AS idle,
        COALESCE(
            s.throttle_any_s,
            GREATEST(COALESCE(s.throttle_power_cap_s, 0), COALESCE(s.throttle_thermal_s, 0),
                     COALESCE(s.throttle_hw_slowdown_s, 0), COALESCE(s.throttle_other_s, 0))
        ) AS thr_any
        -- The per-sample values that USAGE_SUMS entries name, each with a leading comma.
        {sample_values}
    FROM telemetry_sample AS s
    JOIN fleet_gpu AS g ON g.id = s.gpu_id
    WHERE s.start >= %(lo)s AND s.start < %(hi)s
      -- contiguous: the batch is every hour of [lo, hi), so the range alone selects it; the
      -- planner folds `true OR …` away, and with it a per-row test that also spoils its row
      -- estimate. A sparse batch (late samples of scattered hours) keeps the test.
      AND (%(contiguous)s OR date_trunc('hour', s.start, 'UTC') = ANY(%(hours)s::timestamptz[]))
      AND (g.in_service_at IS NULL OR s.start >= g.in_service_at)
      AND (g.retired_at IS NULL OR s.start < g.retired_at)
),
agg AS MATERIALIZED (
    SELECT
        gpu_id,
        hour,
        -- USAGE_SUMS' sums, then HOURLY_STATS' means and maxima: never an average of averages.
        {hourly_values}
    FROM per
    GROUP BY gpu_id, hour
),
stale AS (
    DELETE FROM telemetry_hourlyusage AS hu
    WHERE hu.hour = ANY(%(hours)s::timestamptz[])
      AND NOT EXISTS (SELECT 1 FROM agg WHERE agg.gpu_id = hu.gpu_id AND agg.hour = hu.hour)
    RETURNING 1
),
written AS (
    INSERT INTO telemetry_hourlyusage (
        gpu_id, hour, node_id, pool_id, team_id, site_id,
        {hourly_columns}, computed_at
    )
    SELECT
        agg.gpu_id, agg.hour, g.node_id, n.pool_id,
        COALESCE(g.team_id, p.team_id), COALESCE(n.site_id, p.site_id),
        {agg_columns}, %(now)s
    FROM agg
    JOIN fleet_gpu AS g ON g.id = agg.gpu_id
    JOIN fleet_node AS n ON n.id = g.node_id
    LEFT JOIN fleet_pool AS p ON p.id = n.pool_id
    ON CONFLICT (gpu_id, hour) DO UPDATE SET
        {updates},
        computed_at = excluded.computed_at
        -- Only rows whose numbers changed are rewritten: re-rolling an unchanged hour (a
        -- re-mark, a replayed batch, a backfill) writes no tuple, and computed_at tells
        -- when the numbers last changed.
        WHERE (
            {stored_values}
        ) IS DISTINCT FROM (
            {excluded_values}
        )
    RETURNING 1
)
SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM stale)
