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
--   wl_*     the workloads' hourly rows (telemetry.WorkloadHourlyUsage) of the usual hour, from the
--            same scan: when every sample of a (gpu, hour) that names workloads names the same
--            ones in the same order (at most two), their sums are summed here position by
--            position (wl_sums), the rows of these hours that no longer count are deleted
--            (wl_stale), the rest upserted with the GPU-hour's attribution (wl_written), and
--            the workloads' first and last seen moved (wl_seen; the upsert's conflict clause
--            and wl_seen are fragments shared with rollup_workloads). The other hours (a job ended
--            and another began, more than two sharing) are returned, and rollup_workloads sums
--            them by unnesting each sample's arrays. One read of the samples, not two
--            (docs/benchmarks.md, "Workloads").
--
-- A template: the column lists in braces are filled in by telemetry.rollup from one list,
-- telemetry.models.USAGE_SUMS and HOURLY_STATS (each column's per-sample value and aggregate),
-- so a new column is added there, never here. Column names only, never values.
-- Parameters: hours (UTC hour starts of the batch), lo/hi (the batch's span: lets the planner
-- prune partitions and use the start index), contiguous (hours is every hour of [lo, hi)),
-- active_util_pct, now. Returns (rows written, rows deleted, then the GPU ids and hours whose
-- workload rows rollup_workloads must sum).
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
        -- held and parked follow procs and memory), 0 for an empty list. Up to four added
        -- by position, left to right as sum() adds them (the same float), since the rules
        -- read `share` several times and a subquery per read costs a second per 1.4 M
        -- samples (docs/benchmarks.md, "Workloads"); more through unnest.
        CASE
            WHEN s.workload_share_s IS NULL THEN NULL
            WHEN cardinality(s.workload_share_s) <= 4
                THEN COALESCE(s.workload_share_s[1], 0) + COALESCE(s.workload_share_s[2], 0)
                     + COALESCE(s.workload_share_s[3], 0) + COALESCE(s.workload_share_s[4], 0)
            ELSE (SELECT sum(x) FROM unnest(s.workload_share_s) AS x)
        END AS share,
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
        ) AS thr_any,
        s.start,
        -- The workloads by position, for wl_sums: the first two (NULL past the end).
        cardinality(s.workload_ids) AS wl_n,
        s.workload_ids[1] AS wl_id1, s.workload_ids[2] AS wl_id2,
        s.workload_share_s[1] AS wl_s1, s.workload_share_s[2] AS wl_s2,
        s.workload_air_s[1] AS wl_a1, s.workload_air_s[2] AS wl_a2
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
    -- Keeps `per` a subquery of its own, so each per-sample value above is computed once per
    -- sample; inlined into agg, each would be computed again for every aggregate that reads
    -- it (`share` six times, `energy` five): 2.8 s instead of 4.1 for the bench day.
    OFFSET 0
),
agg AS MATERIALIZED (
    SELECT
        gpu_id,
        hour,
        -- USAGE_SUMS' sums, then HOURLY_STATS' means and maxima: never an average of averages.
        {hourly_values},
        -- The workloads (wl_sums): an hour is summed here when every sample in it that names
        -- workloads names the same ones in the same order, at most two; their sums per
        -- position. (PostgreSQL computes each aggregate written twice once.)
        count(wl_n) AS wl_samples,
        (min(wl_n) = max(wl_n) AND max(wl_n) <= 2
         AND min(wl_id1) IS NOT DISTINCT FROM max(wl_id1)
         AND min(wl_id2) IS NOT DISTINCT FROM max(wl_id2)) AS wl_same,
        max(wl_n) AS wl_n,
        min(wl_id1) AS wl_id1, min(wl_id2) AS wl_id2,
        sum(wl_s1) AS wl_s1, sum(wl_s2) AS wl_s2, sum(wl_a1) AS wl_a1, sum(wl_a2) AS wl_a2,
        sum(energy * wl_s1 / d) AS wl_e1, sum(energy * wl_s2 / d) AS wl_e2,
        min(start) FILTER (WHERE wl_n IS NOT NULL) AS wl_first,
        max(start + d * interval '1 second') FILTER (WHERE wl_n IS NOT NULL) AS wl_last
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
),
wl_sums AS MATERIALIZED (
    SELECT (ARRAY[agg.wl_id1, agg.wl_id2])[pos.i] AS workload_id, agg.gpu_id, agg.hour,
           agg.wl_samples AS samples,
           (ARRAY[agg.wl_s1, agg.wl_s2])[pos.i] AS gpu_s,
           (ARRAY[agg.wl_a1, agg.wl_a2])[pos.i] AS air_s,
           (ARRAY[agg.wl_e1, agg.wl_e2])[pos.i] AS energy_j,
           agg.wl_first AS first_start, agg.wl_last AS last_end
    FROM agg
    -- Positions 1 and 2 (a VALUES list: the planner counts two rows, not generate_series' 1,000).
    CROSS JOIN (VALUES (1), (2)) AS pos(i)
    WHERE agg.wl_same AND pos.i <= agg.wl_n
),
-- The (gpu, hour)s with workloads that wl_sums cannot sum: rollup_workloads' part.
wl_mixed AS MATERIALIZED (
    SELECT gpu_id, hour
    FROM agg
    WHERE agg.wl_samples > 0 AND NOT agg.wl_same
),
wl_stale AS (
    DELETE FROM telemetry_workloadhourlyusage AS wu
    WHERE wu.hour = ANY(%(hours)s::timestamptz[])
      AND NOT EXISTS (
          SELECT 1 FROM wl_sums AS f
          WHERE f.workload_id = wu.workload_id AND f.gpu_id = wu.gpu_id AND f.hour = wu.hour
      )
      AND NOT EXISTS (SELECT 1 FROM wl_mixed AS m WHERE m.gpu_id = wu.gpu_id AND m.hour = wu.hour)
),
wl_written AS (
    INSERT INTO telemetry_workloadhourlyusage (
        workload_id, gpu_id, hour, node_id, pool_id, team_id, site_id,
        samples, gpu_s, air_s, energy_j, computed_at
    )
    -- The GPU-hour's attribution as `written` leaves it: the stored row's where there is one
    -- (this statement's own writes are not visible here), else the one `written` creates.
    SELECT f.workload_id, f.gpu_id, f.hour,
           CASE WHEN hu.gpu_id IS NULL THEN g.node_id ELSE hu.node_id END,
           CASE WHEN hu.gpu_id IS NULL THEN n.pool_id ELSE hu.pool_id END,
           CASE WHEN hu.gpu_id IS NULL THEN COALESCE(g.team_id, p.team_id) ELSE hu.team_id END,
           CASE WHEN hu.gpu_id IS NULL THEN COALESCE(n.site_id, p.site_id) ELSE hu.site_id END,
           f.samples, f.gpu_s, f.air_s, f.energy_j, %(now)s
    FROM wl_sums AS f
    JOIN fleet_gpu AS g ON g.id = f.gpu_id
    JOIN fleet_node AS n ON n.id = g.node_id
    LEFT JOIN fleet_pool AS p ON p.id = n.pool_id
    -- The stored rows of this batch's span only, by the hour index, whatever the plan.
    LEFT JOIN telemetry_hourlyusage AS hu
        ON hu.gpu_id = f.gpu_id AND hu.hour = f.hour AND hu.hour >= %(lo)s AND hu.hour < %(hi)s
    {workload_upsert_conflict}
),
wl_seen AS (
    {workload_seen}
)
SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM stale),
       (SELECT array_agg(gpu_id) FROM wl_mixed), (SELECT array_agg(hour) FROM wl_mixed)
