-- rollup_upsert (SQLite, the embedded default): recompute the hourly per-GPU rollup rows of one
-- batch of UTC hours from raw samples, in one set-based statement. Same rules and columns as
-- rollup_upsert.postgresql.sql (read its header for the why); only the dialect differs:
--   * the hour is strftime(hour_fmt, start) — Django stores datetimes on SQLite as naive UTC
--     text 'YYYY-MM-DD HH:MM:SS', and strftime also normalises text that carries an offset;
--   * the batch's hours come as a JSON array of such texts (json_each), not an SQL array;
--   * max(a, b, …) is SQLite's multi-argument scalar max (GREATEST);
--   * the stale-row delete is its own statement (rollup_stale_delete.sqlite.sql): SQLite has
--     no data-modifying CTEs. Both run in the same IMMEDIATE transaction.
-- The SELECT carries a WHERE clause because SQLite's upsert grammar needs one after a join to
-- tell the upsert's ON from a join's ON.
-- A template, filled in from telemetry.models like the PostgreSQL one.
-- Parameters: hours (JSON text), lo/hi (span texts, for the start index), contiguous,
-- hour_fmt, active_util_pct, now.
WITH per AS (
    SELECT
        s.gpu_id,
        strftime(%(hour_fmt)s, s.start) AS hour,
        CAST(s.seconds AS REAL) AS d,
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
        COALESCE(s.prof_s, CAST(s.seconds AS REAL)) AS p,
        -- Σ share_s of the workloads that held the GPU; NULL when the sample names none (then
        -- held and parked follow procs and memory), 0 for an empty list.
        CASE WHEN s.workload_share_s IS NOT NULL THEN COALESCE((SELECT sum(value) FROM json_each(s.workload_share_s)), 0) END AS share,
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
            max(COALESCE(s.throttle_power_cap_s, 0), COALESCE(s.throttle_thermal_s, 0),
                COALESCE(s.throttle_hw_slowdown_s, 0), COALESCE(s.throttle_other_s, 0))
        ) AS thr_any
        -- The per-sample values that USAGE_SUMS entries name, each with a leading comma.
        {sample_values}
    FROM telemetry_sample AS s
    JOIN fleet_gpu AS g ON g.id = s.gpu_id
    WHERE s.start >= %(lo)s AND s.start < %(hi)s
      -- contiguous: the batch is every hour of [lo, hi), so the range alone selects it.
      AND (%(contiguous)s
           OR strftime(%(hour_fmt)s, s.start) IN (SELECT value FROM json_each(%(hours)s)))
      AND (g.in_service_at IS NULL OR s.start >= g.in_service_at)
      AND (g.retired_at IS NULL OR s.start < g.retired_at)
),
agg AS (
    SELECT
        gpu_id,
        hour,
        -- USAGE_SUMS' sums, then HOURLY_STATS' means and maxima: never an average of averages.
        {hourly_values}
    FROM per
    GROUP BY gpu_id, hour
)
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
WHERE true
ON CONFLICT (gpu_id, hour) DO UPDATE SET
    {updates},
    computed_at = excluded.computed_at
    -- Only rows whose numbers changed are rewritten: re-rolling an unchanged hour (a
    -- re-mark, a replayed batch, a backfill) writes no tuple, and computed_at tells
    -- when the numbers last changed.
    WHERE (
        {stored_values}
    ) IS NOT (
        {excluded_values}
    )
