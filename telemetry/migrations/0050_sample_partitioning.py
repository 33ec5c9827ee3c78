"""PostgreSQL only: ``telemetry_sample`` becomes a table range-partitioned by ``start``.

Daily partitions (see ``telemetry.partitions`` for why daily), primary key ``(gpu_id, start)``,
a BRIN index on ``start`` (samples arrive roughly in time order, so BRIN finds a time range at a
fraction of a B-tree's size and insert cost), no separate ``gpu_id`` index (the primary key
leads with it) and a default partition so that a sample whose day has no partition yet is kept.
Rows already stored move over. Django's model state is unchanged: the index keeps its name
``telemetry_sample_start``, only its method differs. On SQLite nothing happens.
"""

from django.db import migrations

COLUMNS = (
    "gpu_id, start, seconds, util_pct, mem_util_pct, mem_used_bytes, procs, power_w, energy_j, "
    "temp_c, sm_clock_mhz, throttle_power_cap_s, throttle_thermal_s, throttle_hw_slowdown_s, "
    "throttle_other_s, throttle_any_s, active_s, sm_active, received_at"
)

FORWARD = [
    "ALTER TABLE telemetry_sample RENAME TO telemetry_sample_unpartitioned",
    "ALTER TABLE telemetry_sample_unpartitioned "
    "RENAME CONSTRAINT telemetry_sample_pkey TO telemetry_sample_unpartitioned_pkey",
    "ALTER INDEX telemetry_sample_start RENAME TO telemetry_sample_unpartitioned_start",
    "CREATE TABLE telemetry_sample (LIKE telemetry_sample_unpartitioned "
    "INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (start)",
    "ALTER TABLE telemetry_sample ADD CONSTRAINT telemetry_sample_pkey PRIMARY KEY (gpu_id, start)",
    "CREATE INDEX telemetry_sample_start ON telemetry_sample USING brin (start)",
    "CREATE TABLE telemetry_sample_default PARTITION OF telemetry_sample DEFAULT",
]

BACKWARD = [
    "ALTER TABLE telemetry_sample RENAME TO telemetry_sample_partitioned",
    "ALTER TABLE telemetry_sample_partitioned "
    "RENAME CONSTRAINT telemetry_sample_pkey TO telemetry_sample_partitioned_pkey",
    "ALTER INDEX telemetry_sample_start RENAME TO telemetry_sample_partitioned_start",
    "CREATE TABLE telemetry_sample (LIKE telemetry_sample_partitioned "
    "INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
    "ALTER TABLE telemetry_sample ADD CONSTRAINT telemetry_sample_pkey PRIMARY KEY (gpu_id, start)",
    "CREATE INDEX telemetry_sample_start ON telemetry_sample (start)",
    "CREATE INDEX telemetry_sample_gpu_id_07403c85 ON telemetry_sample (gpu_id)",
    f"INSERT INTO telemetry_sample ({COLUMNS}) "  # noqa: S608 - constants
    f"SELECT {COLUMNS} FROM telemetry_sample_partitioned",
    "DROP TABLE telemetry_sample_partitioned",
]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    from telemetry.partitions import partitions_maintain

    for sql in FORWARD:
        schema_editor.execute(sql)
    # Partitions for the retention window and a week ahead before the rows move in, so that
    # old rows land in their days rather than in the default partition.
    partitions_maintain()
    schema_editor.execute(
        f"INSERT INTO telemetry_sample ({COLUMNS}) "  # noqa: S608 - constants
        f"SELECT {COLUMNS} FROM telemetry_sample_unpartitioned"
    )
    schema_editor.execute("DROP TABLE telemetry_sample_unpartitioned")


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in BACKWARD:
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0001_initial")]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
