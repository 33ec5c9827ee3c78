-- rollup_workloads (PostgreSQL): recompute the hourly per-workload per-GPU rollup rows of the
-- (GPU, hour)s that rollup_upsert could not sum from its own scan (their samples name different
-- workloads, or more than two), from the workloads of the raw samples, in one statement, right
-- after rollup_upsert in the same transaction (its hourly rows give the attribution).
--
--   per      the batch's counting samples that name workloads (the same window, in-service
--            and energy rules as rollup_upsert: a sample counts wholly in its start's hour);
--   w        one row per (sample, workload): its share of the seconds, of the air time and of
--            the energy (the sample's energy × share_s / seconds), from the sample's arrays;
--   agg      the sums of each (workload, GPU, hour), and its first start and last end;
--   stale    deletes rows of these hours that no sample counts for any more;
--   written  the upsert: attribution (node, pool, team, site) from the GPU's hourly row of
--            that hour, as rollup_upsert stored it; only changed rows are rewritten;
--   seen     moves each workload's first and last seen (never back: an hour re-rolled after
--            raw retention dropped its samples keeps what it had).
-- Parameters: as rollup_upsert, and pair_gpus / pair_hours: the (GPU, hour)s to sum, as
-- rollup_upsert returned them. Returns (rows written, rows deleted).
WITH per AS (
    SELECT
        s.gpu_id,
        date_trunc('hour', s.start, 'UTC') AS hour,
        s.start,
        s.seconds::float8 AS d,
        COALESCE(
            CASE WHEN s.energy_j < 1e-300 THEN 0 ELSE s.energy_j END,
            CASE WHEN s.power_w < 1e-300 THEN 0 ELSE s.power_w * s.seconds END,
            0
        ) AS energy,
        s.workload_ids,
        s.workload_share_s,
        s.workload_air_s
    FROM telemetry_sample AS s
    JOIN fleet_gpu AS g ON g.id = s.gpu_id
    WHERE s.start >= %(lo)s AND s.start < %(hi)s
      AND (%(contiguous)s OR date_trunc('hour', s.start, 'UTC') = ANY(%(hours)s::timestamptz[]))
      AND (g.in_service_at IS NULL OR s.start >= g.in_service_at)
      AND (g.retired_at IS NULL OR s.start < g.retired_at)
      AND s.workload_ids IS NOT NULL
      AND s.gpu_id = ANY(%(pair_gpus)s::bigint[])
      AND (s.gpu_id, date_trunc('hour', s.start, 'UTC')) IN (
          SELECT * FROM unnest(%(pair_gpus)s::bigint[], %(pair_hours)s::timestamptz[])
      )
),
w AS (
    SELECT per.gpu_id, per.hour, per.start, per.d, x.workload_id, x.share, x.air,
           per.energy * x.share / per.d AS energy
    FROM per
    CROSS JOIN LATERAL unnest(per.workload_ids, per.workload_share_s, per.workload_air_s)
        AS x(workload_id, share, air)
),
agg AS MATERIALIZED (
    SELECT workload_id, gpu_id, hour, count(*) AS samples, sum(share) AS gpu_s,
           sum(air) AS air_s, sum(energy) AS energy_j, min(start) AS first_start,
           max(start + d * interval '1 second') AS last_end
    FROM w
    GROUP BY workload_id, gpu_id, hour
),
stale AS (
    DELETE FROM telemetry_workloadhourlyusage AS wu
    WHERE (wu.gpu_id, wu.hour) IN (
              SELECT * FROM unnest(%(pair_gpus)s::bigint[], %(pair_hours)s::timestamptz[])
          )
      AND NOT EXISTS (
          SELECT 1 FROM agg
          WHERE agg.workload_id = wu.workload_id AND agg.gpu_id = wu.gpu_id
            AND agg.hour = wu.hour
      )
    RETURNING 1
),
written AS (
    INSERT INTO telemetry_workloadhourlyusage (
        workload_id, gpu_id, hour, node_id, pool_id, team_id, site_id,
        samples, gpu_s, air_s, energy_j, computed_at
    )
    SELECT agg.workload_id, agg.gpu_id, agg.hour, hu.node_id, hu.pool_id, hu.team_id,
           hu.site_id, agg.samples, agg.gpu_s, agg.air_s, agg.energy_j, %(now)s
    FROM agg
    LEFT JOIN telemetry_hourlyusage AS hu
        ON hu.gpu_id = agg.gpu_id AND hu.hour = agg.hour AND hu.hour >= %(lo)s AND hu.hour < %(hi)s
    ON CONFLICT (workload_id, gpu_id, hour) DO UPDATE SET
        samples = excluded.samples,
        gpu_s = excluded.gpu_s,
        air_s = excluded.air_s,
        energy_j = excluded.energy_j,
        computed_at = excluded.computed_at
        WHERE (
            telemetry_workloadhourlyusage.samples, telemetry_workloadhourlyusage.gpu_s,
            telemetry_workloadhourlyusage.air_s, telemetry_workloadhourlyusage.energy_j
        ) IS DISTINCT FROM (excluded.samples, excluded.gpu_s, excluded.air_s, excluded.energy_j)
    RETURNING 1
),
seen AS (
    UPDATE telemetry_workload AS wl
    SET first_seen_at = LEAST(wl.first_seen_at, x.first_start),
        last_seen_at = GREATEST(wl.last_seen_at, x.last_end)
    FROM (
        SELECT workload_id, min(first_start) AS first_start, max(last_end) AS last_end
        FROM agg GROUP BY workload_id
    ) AS x
    WHERE wl.id = x.workload_id
      AND (wl.first_seen_at IS NULL OR x.first_start < wl.first_seen_at
           OR wl.last_seen_at IS NULL OR x.last_end > wl.last_seen_at)
)
SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM stale)
