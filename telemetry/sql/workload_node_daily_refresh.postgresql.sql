-- workload_node_daily_refresh (PostgreSQL): the WorkloadNodeDailyUsage rows of one local day,
-- summed from that day's WorkloadDailyUsage rows per workload, node and attribution, with the
-- GPUs they cover, after the caller deleted the day's rows. Called right after
-- workload_daily_refresh, in the same transaction (telemetry.rollup._workload_day_write).
-- Parameters: day.
INSERT INTO telemetry_workloadnodedailyusage (
    workload_id, day, node_id, pool_id, team_id, site_id, gpu_ids,
    gpu_s, air_s, energy_j, held_energy_j
)
SELECT workload_id, day, node_id, pool_id, team_id, site_id,
       array_agg(DISTINCT gpu_id ORDER BY gpu_id),
       sum(gpu_s), sum(air_s), sum(energy_j), sum(held_energy_j)
FROM telemetry_workloaddailyusage
WHERE day = %(day)s
GROUP BY workload_id, day, node_id, pool_id, team_id, site_id
