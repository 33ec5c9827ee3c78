-- rollup_stale_delete (SQLite): before a batch is upserted, delete its rows that no sample
-- counts for any more (e.g. the GPU's in_service moved later, or it was retired back-dated),
-- so a re-roll leaves no orphan row. On PostgreSQL this is the `stale` CTE of the upsert.
-- A sample counts for (gpu, hour) when it starts in that hour inside the in-service window:
-- the same test as the upsert's WHERE clause.
-- Parameters: hours (JSON array of 'YYYY-MM-DD HH:00:00' texts).
DELETE FROM telemetry_hourlyusage
WHERE hour IN (SELECT value FROM json_each(%(hours)s))
  AND NOT EXISTS (
      SELECT 1
      FROM telemetry_sample AS s
      JOIN fleet_gpu AS g ON g.id = s.gpu_id
      WHERE s.gpu_id = telemetry_hourlyusage.gpu_id
        AND s.start >= telemetry_hourlyusage.hour
        AND s.start < datetime(telemetry_hourlyusage.hour, '+1 hour')
        AND (g.in_service_at IS NULL OR s.start >= g.in_service_at)
        AND (g.retired_at IS NULL OR s.start < g.retired_at)
  )
