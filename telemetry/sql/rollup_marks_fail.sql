-- rollup_marks_fail (both dialects): count a failed recompute on one mark, in the batch's
-- transaction, and set the mark aside when it has failed max_failures times, so that the
-- hours after it are no longer held up behind it (as healthchecks' sendalerts moves on from a
-- check it trips on). Whatever its version now: a sample that arrived since does not make the
-- hour's statement succeed. Only errors that are not transient get here (telemetry.rollup).
-- Parameters: hour (as the database returned it), error (text), now, max_failures.
-- Returns (failures, set_aside_at): the latter NULL unless it was set aside. (Not an IS NOT NULL
-- test: SQLite 3.40 answers one wrongly in RETURNING.)
UPDATE telemetry_rolluppending
SET failures = failures + 1,
    last_error = %(error)s,
    failed_at = %(now)s,
    set_aside_at = CASE WHEN failures + 1 >= %(max_failures)s THEN %(now)s ELSE set_aside_at END
WHERE hour = %(hour)s
RETURNING failures, set_aside_at
