-- workload_node_daily_refresh (PostgreSQL): the WorkloadNodeDailyUsage rows of one local day
-- made equal to the sums of that day's WorkloadDailyUsage rows per workload, node and
-- attribution, with the GPUs they cover, in place as workload_daily_refresh.postgresql does
-- (a row updated where a figure or its GPUs changed, deleted where no sum stands for it, a new
-- one inserted). Called right after it, in the same transaction
-- (telemetry.rollup._workload_day_write). Parameters: day.
WITH fresh AS MATERIALIZED (
    SELECT workload_id, node_id, pool_id, team_id, site_id,
           array_agg(DISTINCT gpu_id ORDER BY gpu_id) AS gpu_ids,
           sum(gpu_s) AS gpu_s, sum(air_s) AS air_s, sum(energy_j) AS energy_j,
           sum(held_energy_j) AS held_energy_j
    FROM telemetry_workloaddailyusage
    WHERE day = %(day)s
    GROUP BY workload_id, day, node_id, pool_id, team_id, site_id
), updated AS (
    UPDATE telemetry_workloadnodedailyusage n
    SET gpu_ids = f.gpu_ids, gpu_s = f.gpu_s, air_s = f.air_s, energy_j = f.energy_j,
        held_energy_j = f.held_energy_j
    FROM fresh f
    WHERE n.day = %(day)s AND n.workload_id = f.workload_id
      AND n.node_id IS NOT DISTINCT FROM f.node_id
      AND n.pool_id IS NOT DISTINCT FROM f.pool_id
      AND n.team_id IS NOT DISTINCT FROM f.team_id
      AND n.site_id IS NOT DISTINCT FROM f.site_id
      AND (n.gpu_ids, n.gpu_s, n.air_s, n.energy_j, n.held_energy_j)
          IS DISTINCT FROM (f.gpu_ids, f.gpu_s, f.air_s, f.energy_j, f.held_energy_j)
), gone AS (
    DELETE FROM telemetry_workloadnodedailyusage n
    WHERE n.day = %(day)s
      AND NOT EXISTS (
          SELECT 1 FROM fresh f
          WHERE f.workload_id = n.workload_id
            AND f.node_id IS NOT DISTINCT FROM n.node_id
            AND f.pool_id IS NOT DISTINCT FROM n.pool_id
            AND f.team_id IS NOT DISTINCT FROM n.team_id
            AND f.site_id IS NOT DISTINCT FROM n.site_id)
)
INSERT INTO telemetry_workloadnodedailyusage (
    workload_id, day, node_id, pool_id, team_id, site_id, gpu_ids,
    gpu_s, air_s, energy_j, held_energy_j
)
SELECT f.workload_id, %(day)s, f.node_id, f.pool_id, f.team_id, f.site_id, f.gpu_ids,
       f.gpu_s, f.air_s, f.energy_j, f.held_energy_j
FROM fresh f
WHERE NOT EXISTS (
    SELECT 1 FROM telemetry_workloadnodedailyusage n
    WHERE n.day = %(day)s AND n.workload_id = f.workload_id
      AND n.node_id IS NOT DISTINCT FROM f.node_id
      AND n.pool_id IS NOT DISTINCT FROM f.pool_id
      AND n.team_id IS NOT DISTINCT FROM f.team_id
      AND n.site_id IS NOT DISTINCT FROM f.site_id)
