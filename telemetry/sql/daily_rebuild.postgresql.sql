-- Every daily row again from the hourly rows, in the zone given: one scan, one GROUP BY.
-- Run after the state row names the new zone, in the same transaction.
-- A template: the lists in braces are telemetry.models.USAGE_SUMS and their sums over the
-- hours, filled in by telemetry.rollup.
INSERT INTO telemetry_dailyusage (
    gpu_id, day, node_id, pool_id, team_id, site_id, hours,
    {sum_columns})
SELECT gpu_id, (hour AT TIME ZONE %(zone)s)::date, node_id, pool_id, team_id, site_id, count(*),
       {sums}
FROM telemetry_hourlyusage
GROUP BY 1, 2, 3, 4, 5, 6
