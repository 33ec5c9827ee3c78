-- rollup_upsert (PostgreSQL): recompute the hourly per-GPU rollup rows of one batch of UTC hours
-- from raw samples, in one set-based statement.
--
-- Why one statement: DESIGN.md §6 — INSERT … SELECT … GROUP BY … ON CONFLICT DO UPDATE runs
-- several times faster than any loop, and rewriting an hour from all of its samples makes the
-- rollup idempotent: a re-run, a duplicate or a late sample ends in the same row.
--
--   per      one row per counting sample with the per-sample rules of DESIGN.md §3 applied:
--            air (active_s if sent, else u × d), held vs parked (procs > 0, or procs unknown and
--            memory used ≥ 5 pct of the GPU's total; both unknown → parked), energy fallback
--            (energy_j, else power_w × d, else 0), idle (util below the active threshold),
--            throttle "any" (sent, else the largest reason). Samples outside the GPU's
--            in-service window are stored but excluded here. A sample counts wholly in the hour
--            of its start.
--   agg      sums per (gpu, hour): never an average of averages.
--   stale    deletes rows of these hours that no sample counts for any more (in_service moved),
--            so a re-roll leaves no orphan row. It sees the statement's snapshot, and never
--            touches a row that `written` writes (those are in agg).
--   written  the upsert. Attribution (node, pool, team, site) is set only when the row is
--            created; on conflict it keeps what is stored, so chargeback history does not move
--            when a GPU moves to another node, pool or team.
--
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
            GREATEST(COALESCE(s.throttle_power_cap_s, 0), COALESCE(s.throttle_thermal_s, 0),
                     COALESCE(s.throttle_hw_slowdown_s, 0), COALESCE(s.throttle_other_s, 0))
        ) AS thr_any
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
        count(*) AS samples,
        sum(d) AS observed_s,
        sum(air) AS air_s,
        -- The rest of the interval is d − air (= (1 − u) × d when active_s is not sent), so
        -- air + held + parked is exactly the observed time.
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
    ON CONFLICT (gpu_id, hour) DO UPDATE SET
        samples = EXCLUDED.samples,
        observed_s = EXCLUDED.observed_s,
        air_s = EXCLUDED.air_s,
        held_s = EXCLUDED.held_s,
        parked_s = EXCLUDED.parked_s,
        energy_j = EXCLUDED.energy_j,
        idle_energy_j = EXCLUDED.idle_energy_j,
        idle_s = EXCLUDED.idle_s,
        power_w_mean = EXCLUDED.power_w_mean,
        power_w_max = EXCLUDED.power_w_max,
        temp_c_max = EXCLUDED.temp_c_max,
        util_pct_mean = EXCLUDED.util_pct_mean,
        mem_util_pct_mean = EXCLUDED.mem_util_pct_mean,
        throttle_power_cap_s = EXCLUDED.throttle_power_cap_s,
        throttle_thermal_s = EXCLUDED.throttle_thermal_s,
        throttle_hw_slowdown_s = EXCLUDED.throttle_hw_slowdown_s,
        throttle_other_s = EXCLUDED.throttle_other_s,
        throttle_any_s = EXCLUDED.throttle_any_s,
        sm_active_s = EXCLUDED.sm_active_s,
        sm_observed_s = EXCLUDED.sm_observed_s,
        computed_at = EXCLUDED.computed_at
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
            telemetry_hourlyusage.mem_util_pct_mean,
            telemetry_hourlyusage.throttle_power_cap_s,
            telemetry_hourlyusage.throttle_thermal_s,
            telemetry_hourlyusage.throttle_hw_slowdown_s,
            telemetry_hourlyusage.throttle_other_s, telemetry_hourlyusage.throttle_any_s,
            telemetry_hourlyusage.sm_active_s, telemetry_hourlyusage.sm_observed_s
        ) IS DISTINCT FROM (
            EXCLUDED.samples, EXCLUDED.observed_s, EXCLUDED.air_s, EXCLUDED.held_s,
            EXCLUDED.parked_s, EXCLUDED.energy_j, EXCLUDED.idle_energy_j, EXCLUDED.idle_s,
            EXCLUDED.power_w_mean, EXCLUDED.power_w_max, EXCLUDED.temp_c_max,
            EXCLUDED.util_pct_mean, EXCLUDED.mem_util_pct_mean, EXCLUDED.throttle_power_cap_s,
            EXCLUDED.throttle_thermal_s, EXCLUDED.throttle_hw_slowdown_s,
            EXCLUDED.throttle_other_s, EXCLUDED.throttle_any_s, EXCLUDED.sm_active_s,
            EXCLUDED.sm_observed_s
        )
    RETURNING 1
)
SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM stale)
