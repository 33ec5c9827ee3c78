-- workload_daily_refresh (PostgreSQL): the WorkloadDailyUsage rows of one local day made equal
-- to the sums of the day's hourly workload rows, in place: a stored row of the same workload,
-- GPU and attribution is updated where a figure changed, a row no sum stands for any more is
-- deleted (its attribution changed, its hours went), a new one inserted. The rollup sums the
-- day again at every run; deleting and inserting every row of the day each time wrote the whole
-- day's rows and their index entries every minute (issue 46). SQLite: workload_daily_refresh.sql
-- after the caller's delete. The sums are that statement's, so the figures are the same.
-- held_energy_j sums each hourly row's energy × held / GPU seconds, as idle money is priced
-- per hour's held share (docs/metrics.md, "Workloads").
-- Parameters: day (the local day), lo, hi (its first moment and the next day's, UTC).
WITH fresh AS MATERIALIZED (
    SELECT workload_id, gpu_id, node_id, pool_id, team_id, site_id,
           count(*) AS hours, sum(gpu_s) AS gpu_s, sum(air_s) AS air_s,
           sum(energy_j) AS energy_j,
           sum(CASE WHEN gpu_s > 0 THEN energy_j * (gpu_s - air_s) / gpu_s ELSE 0 END)
               AS held_energy_j
    FROM telemetry_workloadhourlyusage
    WHERE hour >= %(lo)s AND hour < %(hi)s
    GROUP BY workload_id, gpu_id, node_id, pool_id, team_id, site_id
), updated AS (
    UPDATE telemetry_workloaddailyusage d
    SET hours = f.hours, gpu_s = f.gpu_s, air_s = f.air_s, energy_j = f.energy_j,
        held_energy_j = f.held_energy_j
    FROM fresh f
    WHERE d.day = %(day)s AND d.workload_id = f.workload_id AND d.gpu_id = f.gpu_id
      AND d.node_id IS NOT DISTINCT FROM f.node_id
      AND d.pool_id IS NOT DISTINCT FROM f.pool_id
      AND d.team_id IS NOT DISTINCT FROM f.team_id
      AND d.site_id IS NOT DISTINCT FROM f.site_id
      AND (d.hours, d.gpu_s, d.air_s, d.energy_j, d.held_energy_j)
          IS DISTINCT FROM (f.hours, f.gpu_s, f.air_s, f.energy_j, f.held_energy_j)
), gone AS (
    DELETE FROM telemetry_workloaddailyusage d
    WHERE d.day = %(day)s
      AND NOT EXISTS (
          SELECT 1 FROM fresh f
          WHERE f.workload_id = d.workload_id AND f.gpu_id = d.gpu_id
            AND f.node_id IS NOT DISTINCT FROM d.node_id
            AND f.pool_id IS NOT DISTINCT FROM d.pool_id
            AND f.team_id IS NOT DISTINCT FROM d.team_id
            AND f.site_id IS NOT DISTINCT FROM d.site_id)
)
INSERT INTO telemetry_workloaddailyusage (
    workload_id, gpu_id, day, node_id, pool_id, team_id, site_id,
    hours, gpu_s, air_s, energy_j, held_energy_j
)
SELECT f.workload_id, f.gpu_id, %(day)s, f.node_id, f.pool_id, f.team_id, f.site_id,
       f.hours, f.gpu_s, f.air_s, f.energy_j, f.held_energy_j
FROM fresh f
WHERE NOT EXISTS (
    SELECT 1 FROM telemetry_workloaddailyusage d
    WHERE d.day = %(day)s AND d.workload_id = f.workload_id AND d.gpu_id = f.gpu_id
      AND d.node_id IS NOT DISTINCT FROM f.node_id
      AND d.pool_id IS NOT DISTINCT FROM f.pool_id
      AND d.team_id IS NOT DISTINCT FROM f.team_id
      AND d.site_id IS NOT DISTINCT FROM f.site_id)
