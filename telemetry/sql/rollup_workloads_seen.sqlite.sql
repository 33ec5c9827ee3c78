-- rollup_workloads_seen (SQLite): move the first and last seen of the workloads of a batch's
-- samples (never back): the `seen` CTE of rollup_workloads.postgresql.sql.
-- Parameters: as rollup_workloads.sqlite.
UPDATE telemetry_workload
SET first_seen_at = CASE WHEN first_seen_at IS NULL OR x.first_start < first_seen_at
                         THEN x.first_start ELSE first_seen_at END,
    last_seen_at = CASE WHEN last_seen_at IS NULL OR x.last_end > last_seen_at
                        THEN x.last_end ELSE last_seen_at END
FROM (
    SELECT CAST(i.value AS INTEGER) AS workload_id, min(s.start) AS first_start,
           max(datetime(s.start, '+' || s.seconds || ' seconds')) AS last_end
    FROM telemetry_sample AS s
    JOIN fleet_gpu AS g ON g.id = s.gpu_id, json_each(s.workload_ids) AS i
    WHERE s.start >= %(lo)s AND s.start < %(hi)s
      AND (%(contiguous)s
           OR strftime(%(hour_fmt)s, s.start) IN (SELECT value FROM json_each(%(hours)s)))
      AND (g.in_service_at IS NULL OR s.start >= g.in_service_at)
      AND (g.retired_at IS NULL OR s.start < g.retired_at)
      AND s.workload_ids IS NOT NULL
    GROUP BY 1
) AS x
WHERE telemetry_workload.id = x.workload_id
