-- rollup_workloads (SQLite, the embedded default): the statement of rollup_workloads.postgresql.sql
-- (read its header) without data-modifying CTEs: rollup_workloads_stale.sqlite.sql deletes the
-- stale rows first, and rollup_workloads_seen.sqlite.sql moves first and last seen after, all in
-- the same IMMEDIATE transaction. A sample's arrays are JSON texts, walked with json_each by
-- their positions (key).
-- Parameters: as rollup_upsert.sqlite.
WITH per AS (
    SELECT
        s.gpu_id,
        strftime(%(hour_fmt)s, s.start) AS hour,
        CAST(s.seconds AS REAL) AS d,
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
      AND (%(contiguous)s
           OR strftime(%(hour_fmt)s, s.start) IN (SELECT value FROM json_each(%(hours)s)))
      AND (g.in_service_at IS NULL OR s.start >= g.in_service_at)
      AND (g.retired_at IS NULL OR s.start < g.retired_at)
      AND s.workload_ids IS NOT NULL
),
w AS (
    SELECT per.gpu_id, per.hour, CAST(i.value AS INTEGER) AS workload_id,
           sh.value AS share, ai.value AS air, per.energy * sh.value / per.d AS energy
    FROM per, json_each(per.workload_ids) AS i, json_each(per.workload_share_s) AS sh,
         json_each(per.workload_air_s) AS ai
    WHERE sh.key = i.key AND ai.key = i.key
),
agg AS (
    SELECT workload_id, gpu_id, hour, count(*) AS samples, sum(share) AS gpu_s,
           sum(air) AS air_s, sum(energy) AS energy_j
    FROM w
    GROUP BY workload_id, gpu_id, hour
)
INSERT INTO telemetry_workloadhourlyusage (
    workload_id, gpu_id, hour, node_id, pool_id, team_id, site_id,
    samples, gpu_s, air_s, energy_j, computed_at
)
SELECT agg.workload_id, agg.gpu_id, agg.hour, hu.node_id, hu.pool_id, hu.team_id, hu.site_id,
       agg.samples, agg.gpu_s, agg.air_s, agg.energy_j, %(now)s
FROM agg
LEFT JOIN telemetry_hourlyusage AS hu ON hu.gpu_id = agg.gpu_id AND hu.hour = agg.hour
WHERE true
ON CONFLICT (workload_id, gpu_id, hour) DO UPDATE SET
    samples = excluded.samples,
    gpu_s = excluded.gpu_s,
    air_s = excluded.air_s,
    energy_j = excluded.energy_j,
    computed_at = excluded.computed_at
    WHERE (
        telemetry_workloadhourlyusage.samples, telemetry_workloadhourlyusage.gpu_s,
        telemetry_workloadhourlyusage.air_s, telemetry_workloadhourlyusage.energy_j
    ) IS NOT (excluded.samples, excluded.gpu_s, excluded.air_s, excluded.energy_j)
