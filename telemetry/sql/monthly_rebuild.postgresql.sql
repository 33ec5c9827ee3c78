-- Every monthly row again from the daily rows (after daily_rebuild, in the same transaction):
-- one scan, one GROUP BY. The month is the daily rows' local month (their zone's days).
-- A template: the lists in braces are telemetry.models.USAGE_SUMS and their sums, filled in
-- by telemetry.rollup.
INSERT INTO telemetry_monthlyusage (
    gpu_id, month, node_id, pool_id, team_id, site_id, hours,
    {sum_columns})
SELECT gpu_id, date_trunc('month', day)::date, node_id, pool_id, team_id, site_id, sum(hours),
       {sums}
FROM telemetry_dailyusage
GROUP BY 1, 2, 3, 4, 5, 6
