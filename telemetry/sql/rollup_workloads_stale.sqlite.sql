-- rollup_workloads_stale (SQLite): before a batch's workload rows are upserted, delete every
-- workload row of its hours (the upsert writes back those that samples still count for): the
-- `stale` CTE of rollup_workloads.postgresql.sql, the simple way, for the embedded default's
-- small volumes.
-- Parameters: hours (JSON array of 'YYYY-MM-DD HH:00:00' texts).
DELETE FROM telemetry_workloadhourlyusage
WHERE hour IN (SELECT value FROM json_each(%(hours)s))
