-- rollup_workloads (PostgreSQL): recompute the hourly per-workload per-GPU rollup rows of the
-- (GPU, hour)s that rollup_upsert could not sum from its own scan (their samples name different
-- workloads, or more than two), from the workloads of the raw samples, in one statement, right
-- after rollup_upsert in the same transaction (its hourly rows give the attribution).
--
--   per      the batch's counting samples that name workloads (the same window, in-service
--            and energy rules as rollup_upsert: a sample counts wholly in its start's hour);
--   w        one row per (sample, workload): its share of the seconds, of the air time and of
--            the energy (the sample's energy × share_s / seconds), from the sample's arrays;
--   wl_sums  the sums of each (workload, GPU, hour), and its first start and last end;
--   stale    deletes rows of these hours that no sample counts for any more;
--   written  the upsert: attribution (node, pool, team, site) from the GPU's hourly row of
--            that hour, as rollup_upsert stored it; only changed rows are rewritten
--            (_workload_upsert_conflict, shared with rollup_upsert);
--   seen     moves each workload's first and last seen (_workload_seen, shared too).
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
wl_sums AS MATERIALIZED (
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
          SELECT 1 FROM wl_sums AS f
          WHERE f.workload_id = wu.workload_id AND f.gpu_id = wu.gpu_id AND f.hour = wu.hour
      )
    RETURNING 1
),
written AS (
    INSERT INTO telemetry_workloadhourlyusage (
        workload_id, gpu_id, hour, node_id, pool_id, team_id, site_id,
        samples, gpu_s, air_s, energy_j, computed_at
    )
    SELECT f.workload_id, f.gpu_id, f.hour, hu.node_id, hu.pool_id, hu.team_id, hu.site_id,
           f.samples, f.gpu_s, f.air_s, f.energy_j, %(now)s
    FROM wl_sums AS f
    LEFT JOIN telemetry_hourlyusage AS hu
        ON hu.gpu_id = f.gpu_id AND hu.hour = f.hour AND hu.hour >= %(lo)s AND hu.hour < %(hi)s
    {workload_upsert_conflict}
    RETURNING 1
),
seen AS (
    {workload_seen}
)
SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM stale)
