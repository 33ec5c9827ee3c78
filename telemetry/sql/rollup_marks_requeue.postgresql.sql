-- rollup_marks_requeue (PostgreSQL): put these marks back in the queue with no failures
-- counted (an operator's action once the cause of their failures is fixed); the next rollup
-- recomputes them.
-- Parameters: hours (timestamptz[]). Returns nothing; rowcount is the marks put back.
UPDATE telemetry_rolluppending
SET failures = 0, last_error = '', failed_at = NULL, set_aside_at = NULL
WHERE hour = ANY(%(hours)s::timestamptz[])
