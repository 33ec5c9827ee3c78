-- rollup_lock_try (PostgreSQL): take the rollup's advisory lock for this transaction, or
-- answer false at once when another rollup holds it. The periodic task uses this: a rollup
-- already running drains the queue, so a second worker should not wait in line behind it.
-- Transaction-scoped, so a killed worker's lock ends with its connection.
-- Parameters: key (a constant bigint naming "the rollup").
SELECT pg_try_advisory_xact_lock(%(key)s)
