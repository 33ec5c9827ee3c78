-- Fragment (workload_seen in rollup_upsert and rollup_workloads): each workload's first and
-- last seen moved to take in its rows in wl_sums, never back (an hour re-rolled after raw
-- retention dropped its samples keeps what it had).
UPDATE telemetry_workload AS wl
SET first_seen_at = LEAST(wl.first_seen_at, x.first_start),
    last_seen_at = GREATEST(wl.last_seen_at, x.last_end)
FROM (
    SELECT workload_id, min(first_start) AS first_start, max(last_end) AS last_end
    FROM wl_sums GROUP BY workload_id
) AS x
WHERE wl.id = x.workload_id
  AND (wl.first_seen_at IS NULL OR x.first_start < wl.first_seen_at
       OR wl.last_seen_at IS NULL OR x.last_end > wl.last_seen_at)
