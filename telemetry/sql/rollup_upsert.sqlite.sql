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
        COALESCE(s.throttle_power_cap_s, 0) AS thr_power_cap,
        COALESCE(s.throttle_thermal_s, 0) AS thr_thermal,
        COALESCE(s.throttle_hw_slowdown_s, 0) AS thr_hw_slowdown,
        COALESCE(s.throttle_other_s, 0) AS thr_other,
        COALESCE(
            s.throttle_any_s,
            max(COALESCE(s.throttle_power_cap_s, 0), COALESCE(s.throttle_thermal_s, 0),
                COALESCE(s.throttle_hw_slowdown_s, 0), COALESCE(s.throttle_other_s, 0))
        ) AS thr_any
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
        count(*) AS samples,
        sum(d) AS observed_s,
        sum(air) AS air_s,
        sum(CASE WHEN held THEN d - air ELSE 0 END) AS held_s,
        sum(CASE WHEN held THEN 0 ELSE d - air END) AS parked_s,
        sum(energy) AS energy_j,
        sum(CASE WHEN idle THEN energy ELSE 0 END) AS idle_energy_j,
        sum(CASE WHEN idle THEN d ELSE 0 END) AS idle_s,
        sum(energy) / NULLIF(sum(CASE WHEN has_power THEN d ELSE 0 END), 0) AS power_w_mean,
        max(power_w) AS power_w_max,
        max(temp_c) AS temp_c_max,
        sum(util_pct * d) / sum(d) AS util_pct_mean,
        sum(mem_util_pct * d)
            / NULLIF(sum(CASE WHEN mem_util_pct IS NOT NULL THEN d ELSE 0 END), 0)
            AS mem_util_pct_mean,
        sum(thr_power_cap) AS throttle_power_cap_s,
        sum(thr_thermal) AS throttle_thermal_s,
        sum(thr_hw_slowdown) AS throttle_hw_slowdown_s,
        sum(thr_other) AS throttle_other_s,
        sum(thr_any) AS throttle_any_s,
        COALESCE(sum(sm_active * d), 0) AS sm_active_s,
        sum(CASE WHEN sm_active IS NOT NULL THEN d ELSE 0 END) AS sm_observed_s
    FROM per
    GROUP BY gpu_id, hour
)
INSERT INTO telemetry_hourlyusage (
    gpu_id, hour, node_id, pool_id, team_id, site_id,
    samples, observed_s, air_s, held_s, parked_s, energy_j, idle_energy_j, idle_s,
    power_w_mean, power_w_max, temp_c_max, util_pct_mean, mem_util_pct_mean,
    throttle_power_cap_s, throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s,
    throttle_any_s, sm_active_s, sm_observed_s, computed_at
)
SELECT
    agg.gpu_id, agg.hour, g.node_id, n.pool_id,
    COALESCE(g.team_id, p.team_id), COALESCE(n.site_id, p.site_id),
    agg.samples, agg.observed_s, agg.air_s, agg.held_s, agg.parked_s, agg.energy_j,
    agg.idle_energy_j, agg.idle_s, agg.power_w_mean, agg.power_w_max, agg.temp_c_max,
    agg.util_pct_mean, agg.mem_util_pct_mean, agg.throttle_power_cap_s,
    agg.throttle_thermal_s, agg.throttle_hw_slowdown_s, agg.throttle_other_s,
    agg.throttle_any_s, agg.sm_active_s, agg.sm_observed_s, %(now)s
FROM agg
JOIN fleet_gpu AS g ON g.id = agg.gpu_id
JOIN fleet_node AS n ON n.id = g.node_id
LEFT JOIN fleet_pool AS p ON p.id = n.pool_id
WHERE true
ON CONFLICT (gpu_id, hour) DO UPDATE SET
    samples = excluded.samples,
    observed_s = excluded.observed_s,
    air_s = excluded.air_s,
    held_s = excluded.held_s,
    parked_s = excluded.parked_s,
    energy_j = excluded.energy_j,
    idle_energy_j = excluded.idle_energy_j,
    idle_s = excluded.idle_s,
    power_w_mean = excluded.power_w_mean,
    power_w_max = excluded.power_w_max,
    temp_c_max = excluded.temp_c_max,
    util_pct_mean = excluded.util_pct_mean,
    mem_util_pct_mean = excluded.mem_util_pct_mean,
    throttle_power_cap_s = excluded.throttle_power_cap_s,
    throttle_thermal_s = excluded.throttle_thermal_s,
    throttle_hw_slowdown_s = excluded.throttle_hw_slowdown_s,
    throttle_other_s = excluded.throttle_other_s,
    throttle_any_s = excluded.throttle_any_s,
    sm_active_s = excluded.sm_active_s,
    sm_observed_s = excluded.sm_observed_s,
    computed_at = excluded.computed_at
    -- Only rows whose numbers changed are rewritten: re-rolling an unchanged hour (a
    -- re-mark, a replayed batch, a backfill) writes no tuple, and computed_at tells
    -- when the numbers last changed.
    WHERE (
        telemetry_hourlyusage.samples, telemetry_hourlyusage.observed_s,
        telemetry_hourlyusage.air_s, telemetry_hourlyusage.held_s,
        telemetry_hourlyusage.parked_s, telemetry_hourlyusage.energy_j,
        telemetry_hourlyusage.idle_energy_j, telemetry_hourlyusage.idle_s,
        telemetry_hourlyusage.power_w_mean, telemetry_hourlyusage.power_w_max,
        telemetry_hourlyusage.temp_c_max, telemetry_hourlyusage.util_pct_mean,
        telemetry_hourlyusage.mem_util_pct_mean, telemetry_hourlyusage.throttle_power_cap_s,
        telemetry_hourlyusage.throttle_thermal_s, telemetry_hourlyusage.throttle_hw_slowdown_s,
        telemetry_hourlyusage.throttle_other_s, telemetry_hourlyusage.throttle_any_s,
        telemetry_hourlyusage.sm_active_s, telemetry_hourlyusage.sm_observed_s
    ) IS NOT (
        excluded.samples, excluded.observed_s, excluded.air_s, excluded.held_s,
        excluded.parked_s, excluded.energy_j, excluded.idle_energy_j, excluded.idle_s,
        excluded.power_w_mean, excluded.power_w_max, excluded.temp_c_max,
        excluded.util_pct_mean, excluded.mem_util_pct_mean, excluded.throttle_power_cap_s,
        excluded.throttle_thermal_s, excluded.throttle_hw_slowdown_s,
        excluded.throttle_other_s, excluded.throttle_any_s, excluded.sm_active_s,
        excluded.sm_observed_s
    )
