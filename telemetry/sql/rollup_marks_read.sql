-- rollup_marks_read (both dialects): the next pending hours after a cursor, oldest first, with
-- the version each had when read. The rollup clears a mark only at that version, so an hour
-- that ingest marks again while it is being computed stays marked and is redone.
-- One pass in hour order (the cursor is the last hour taken): a run never takes an hour twice,
-- so continuous ingest into the current hour cannot keep a run going forever.
-- Marks set aside after too many failures are passed by (rollup_marks_fail.sql): the hours
-- after them go on.
-- Parameters: after (the last hour taken, as the database returned it, or NULL), limit.
SELECT hour, version
FROM telemetry_rolluppending
WHERE (%(after)s IS NULL OR hour > %(after)s) AND set_aside_at IS NULL
ORDER BY hour
LIMIT %(limit)s
