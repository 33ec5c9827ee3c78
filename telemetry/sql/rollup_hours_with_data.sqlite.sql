-- rollup_hours_with_data (SQLite): every UTC hour since a horizon that has raw samples or a
-- rollup row, for `manage.py rollup --all` (see the PostgreSQL file for why).
-- Parameters: since (naive UTC text), hour_fmt.
SELECT strftime(%(hour_fmt)s, start) AS hour FROM telemetry_sample WHERE start >= %(since)s
UNION
SELECT strftime(%(hour_fmt)s, hour) FROM telemetry_hourlyusage WHERE hour >= %(since)s
ORDER BY hour
