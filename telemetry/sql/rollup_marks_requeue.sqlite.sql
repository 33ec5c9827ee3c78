-- rollup_marks_requeue (SQLite): as the PostgreSQL file. Ingest writes a mark's hour as text
-- with an offset ('… 05:00:00+00:00'), which Django's own lookups (naive UTC text) do not
-- match, so both sides are compared as UTC hour texts here.
-- Parameters: hours (JSON array of hour_fmt texts), hour_fmt.
UPDATE telemetry_rolluppending
SET failures = 0, last_error = '', failed_at = NULL, set_aside_at = NULL
WHERE strftime(%(hour_fmt)s, hour) IN (SELECT value FROM json_each(%(hours)s))
