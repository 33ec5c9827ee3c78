-- rollup_marks_clear (SQLite): the watermark, one mark per execution (executemany). Deletes a
-- mark only at the version that was read, in the same transaction as the upsert (see the
-- PostgreSQL file for why). `hour` is passed back exactly as the database returned it, so the
-- text comparison matches however the mark's datetime was written.
-- Parameters: hour, version.
DELETE FROM telemetry_rolluppending
WHERE hour = %(hour)s AND version = %(version)s
