-- workload_daily_refresh (SQLite): the WorkloadDailyUsage rows of one local day, summed
-- from the day's hourly workload rows, after the caller deleted that day's rows (a day whose
-- attribution changed loses its old rows; a day that lost all its hourly rows ends with none).
-- Called by the rollup for each local day its batch touched, in the batch's transaction, and
-- by the rebuild for every day (telemetry.rollup.workload_daily_refresh).
-- held_energy_j sums each hourly row's energy × held / GPU seconds, as idle money is priced
-- per hour's held share (docs/metrics.md, "Workloads"). PostgreSQL sums the same in place:
-- workload_daily_refresh.postgresql.sql.
-- Parameters: day (the local day), lo, hi (its first moment and the next day's, UTC).
INSERT INTO telemetry_workloaddailyusage (
    workload_id, gpu_id, day, node_id, pool_id, team_id, site_id,
    hours, gpu_s, air_s, energy_j, held_energy_j
)
SELECT workload_id, gpu_id, %(day)s, node_id, pool_id, team_id, site_id,
       count(*), sum(gpu_s), sum(air_s), sum(energy_j),
       sum(CASE WHEN gpu_s > 0 THEN energy_j * (gpu_s - air_s) / gpu_s ELSE 0 END)
FROM telemetry_workloadhourlyusage
WHERE hour >= %(lo)s AND hour < %(hi)s
GROUP BY workload_id, gpu_id, node_id, pool_id, team_id, site_id
