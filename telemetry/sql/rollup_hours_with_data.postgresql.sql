-- rollup_hours_with_data (PostgreSQL): every UTC hour since a horizon that has raw samples or
-- a rollup row, for `manage.py rollup --all` (a backfill re-marks them all). Hours that only
-- have a rollup row are included so that rows no sample supports any more are deleted.
-- A full scan of the range: a backfill is rare and operator-driven.
-- Parameters: since (the first hour whose raw samples retention has left whole).
SELECT date_trunc('hour', start, 'UTC') AS hour FROM telemetry_sample WHERE start >= %(since)s
UNION
SELECT hour FROM telemetry_hourlyusage WHERE hour >= %(since)s
ORDER BY hour
