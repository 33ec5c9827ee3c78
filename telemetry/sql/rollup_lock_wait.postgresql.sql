-- rollup_lock_wait (PostgreSQL): take the rollup's advisory lock for this transaction, waiting
-- for a rollup that holds it. `manage.py rollup` and rollup_hours() use this: they promise the
-- rollups are up to date when they return. Two rollups never compute batches at the same time.
-- Parameters: key (a constant bigint naming "the rollup").
SELECT pg_advisory_xact_lock(%(key)s)
