-- rollup_marks_clear (PostgreSQL): the watermark. Deletes the marks of a batch only at the
-- version that was read, in the same transaction as the upsert: a worker killed before the
-- commit leaves every mark (the next run redoes the batch), and a mark bumped by ingest since
-- it was read survives (its new samples are rolled next time). Under READ COMMITTED a bump
-- that commits while this runs is re-checked against the new row version, so it also survives.
-- Parameters: hours (timestamptz[]), versions (bigint[]), pairwise.
DELETE FROM telemetry_rolluppending AS p
USING unnest(%(hours)s::timestamptz[], %(versions)s::bigint[]) AS m(hour, version)
WHERE p.hour = m.hour AND p.version = m.version
