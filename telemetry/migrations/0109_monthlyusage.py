"""MonthlyUsage: the per-GPU monthly pre-aggregate (issue 19), kept like DailyUsage.

``telemetry_dailyusage_refresh`` (what the triggers of 0101 call) now also recomputes the
months of the days it refreshed, from their daily rows; the truncate trigger empties both
tables; the months are built once from the daily rows already there. The texts are frozen
here, as 0103 and 0105 freeze theirs: replaying the migrations installs what they installed
then. On SQLite nothing happens to the database (no triggers there).
"""

from importlib import import_module

import django.db.models.deletion
from django.db import migrations, models

REFRESH_SQL = """
-- telemetry_dailyusage_refresh (PostgreSQL): recompute the DailyUsage rows of these GPU-days
-- from their hourly rows, then the MonthlyUsage rows of their months from the daily rows.
-- Called by the statement triggers on telemetry_hourlyusage (created in migration
-- 0101_dailyusage), so whatever writes hourly rows, the days and months it touched follow in
-- the same transaction.
--
-- A template: the lists in braces are telemetry.models.USAGE_SUMS and their sums over the
-- hours (telemetry.rollup.daily_refresh_function_sql()). The function is installed by migrations
-- only, each with its text frozen (0103_usage_sums, then one per change of USAGE_SUMS), so that
-- replaying the migrations on a fresh database always installs what they installed then;
-- tests/telemetry/test_usage_sums.py checks that the installed text is this one.
--
-- The keys are a rollup batch's GPU-days (a few thousand at most), each a short index range:
-- without these settings the planner, which cannot see how few keys an array holds, scans
-- the whole hourly table (a second per batch at 2 M rows instead of a few milliseconds).
CREATE OR REPLACE FUNCTION telemetry_dailyusage_refresh(p_gpu bigint[], p_day date[])
RETURNS void LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
DECLARE
    z text;
BEGIN
    SELECT zone INTO z FROM telemetry_dailyusagestate ORDER BY id LIMIT 1;
    IF z IS NULL THEN
        RETURN;  -- not in use (no state row): the selectors read hourly rows
    END IF;
    -- Delete, then insert: a day whose attribution changed loses its old rows; a day that
    -- lost all its hourly rows ends with none.
    DELETE FROM telemetry_dailyusage d
    USING unnest(p_gpu, p_day) AS k(gpu_id, day)
    WHERE d.gpu_id = k.gpu_id AND d.day = k.day;
    INSERT INTO telemetry_dailyusage (
        gpu_id, day, node_id, pool_id, team_id, site_id, hours,
        samples, observed_s, air_s, held_s, parked_s, energy_j, idle_energy_j, idle_s,
        throttle_power_cap_s, throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s,
        throttle_any_s, sm_active_s, sm_observed_s, sm_air_s, tensor_active_s, tensor_observed_s,
        sm_hours, sm_hours_energy_j)
    SELECT h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id, count(*),
           sum(samples), sum(observed_s), sum(air_s), sum(held_s), sum(parked_s), sum(energy_j),
           sum(idle_energy_j), sum(idle_s), sum(throttle_power_cap_s), sum(throttle_thermal_s),
           sum(throttle_hw_slowdown_s), sum(throttle_other_s), sum(throttle_any_s),
           sum(sm_active_s), sum(sm_observed_s), sum(sm_air_s), sum(tensor_active_s),
           sum(tensor_observed_s), sum(sm_hours), sum(sm_hours_energy_j)
    FROM (SELECT DISTINCT u.gpu_id, u.day FROM unnest(p_gpu, p_day) AS u(gpu_id, day)) k
    JOIN telemetry_hourlyusage h
      ON h.gpu_id = k.gpu_id
     -- The local day's hours by the index (an hour's margin where a midnight falls in a
     -- DST gap), then exactly the hours whose local date is that day.
     AND h.hour >= (k.day::timestamp AT TIME ZONE z) - interval '1 hour'
     AND h.hour < ((k.day + 1)::timestamp AT TIME ZONE z) + interval '1 hour'
     AND (h.hour AT TIME ZONE z)::date = k.day
    GROUP BY h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id;
    -- The months of those days, the same way from their daily rows (0109_monthlyusage).
    DELETE FROM telemetry_monthlyusage m
    USING (SELECT DISTINCT u.gpu_id, date_trunc('month', u.day)::date AS month
           FROM unnest(p_gpu, p_day) AS u(gpu_id, day)) k
    WHERE m.gpu_id = k.gpu_id AND m.month = k.month;
    INSERT INTO telemetry_monthlyusage (
        gpu_id, month, node_id, pool_id, team_id, site_id, hours,
        samples, observed_s, air_s, held_s, parked_s, energy_j, idle_energy_j, idle_s,
        throttle_power_cap_s, throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s,
        throttle_any_s, sm_active_s, sm_observed_s, sm_air_s, tensor_active_s, tensor_observed_s,
        sm_hours, sm_hours_energy_j)
    SELECT d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id, sum(d.hours),
           sum(samples), sum(observed_s), sum(air_s), sum(held_s), sum(parked_s), sum(energy_j),
           sum(idle_energy_j), sum(idle_s), sum(throttle_power_cap_s), sum(throttle_thermal_s),
           sum(throttle_hw_slowdown_s), sum(throttle_other_s), sum(throttle_any_s),
           sum(sm_active_s), sum(sm_observed_s), sum(sm_air_s), sum(tensor_active_s),
           sum(tensor_observed_s), sum(sm_hours), sum(sm_hours_energy_j)
    FROM (SELECT DISTINCT u.gpu_id, date_trunc('month', u.day)::date AS month
          FROM unnest(p_gpu, p_day) AS u(gpu_id, day)) k
    JOIN telemetry_dailyusage d
      ON d.gpu_id = k.gpu_id AND d.day >= k.month
     AND d.day < (k.month + interval '1 month')::date
    GROUP BY d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id;
END
$fn$;
"""

TRUNCATE_SQL = """
CREATE OR REPLACE FUNCTION telemetry_hourlyusage_daily_truncate()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM telemetry_dailyusage;
    DELETE FROM telemetry_monthlyusage;
    RETURN NULL;
END
$fn$;
"""

BUILD_SQL = """
-- Every monthly row again from the daily rows (after daily_rebuild, in the same transaction):
-- one scan, one GROUP BY. The month is the daily rows' local month (their zone's days).
-- A template: the lists in braces are telemetry.models.USAGE_SUMS and their sums, filled in
-- by telemetry.rollup.
INSERT INTO telemetry_monthlyusage (
    gpu_id, month, node_id, pool_id, team_id, site_id, hours,
    samples, observed_s, air_s, held_s, parked_s, energy_j, idle_energy_j, idle_s,
    throttle_power_cap_s, throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s,
    throttle_any_s, sm_active_s, sm_observed_s, sm_air_s, tensor_active_s, tensor_observed_s,
    sm_hours, sm_hours_energy_j)
SELECT gpu_id, date_trunc('month', day)::date, node_id, pool_id, team_id, site_id, sum(hours),
       sum(samples), sum(observed_s), sum(air_s), sum(held_s), sum(parked_s), sum(energy_j),
       sum(idle_energy_j), sum(idle_s), sum(throttle_power_cap_s), sum(throttle_thermal_s),
       sum(throttle_hw_slowdown_s), sum(throttle_other_s), sum(throttle_any_s), sum(sm_active_s),
       sum(sm_observed_s), sum(sm_air_s), sum(tensor_active_s), sum(tensor_observed_s),
       sum(sm_hours), sum(sm_hours_energy_j)
FROM telemetry_dailyusage
GROUP BY 1, 2, 3, 4, 5, 6
"""


def _install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(REFRESH_SQL)
    schema_editor.execute(TRUNCATE_SQL)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM telemetry_dailyusagestate LIMIT 1")
        if cursor.fetchone() is not None:  # the daily table is in use: its months
            cursor.execute(BUILD_SQL)


def _restore(apps, schema_editor):
    """0105's function and 0101's truncate function again (the table goes after)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        import_module("telemetry.migrations.0105_workload_rollups_profiling").REFRESH_SQL
    )
    schema_editor.execute(
        "CREATE OR REPLACE FUNCTION telemetry_hourlyusage_daily_truncate() RETURNS trigger "
        "LANGUAGE plpgsql AS $fn$ BEGIN DELETE FROM telemetry_dailyusage; RETURN NULL; END "
        "$fn$;"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0005_identifiers"),
        ("telemetry", "0108_workload_node_daily"),
    ]

    operations = [
        migrations.CreateModel(
            name="MonthlyUsage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("samples", models.IntegerField(default=0)),
                ("observed_s", models.FloatField(default=0)),
                ("air_s", models.FloatField(default=0)),
                ("held_s", models.FloatField(default=0)),
                ("parked_s", models.FloatField(default=0)),
                ("energy_j", models.FloatField(default=0)),
                (
                    "idle_energy_j",
                    models.FloatField(
                        default=0, help_text="Energy of samples below the active threshold"
                    ),
                ),
                (
                    "idle_s",
                    models.FloatField(
                        default=0, help_text="Seconds of samples below the active threshold"
                    ),
                ),
                ("throttle_power_cap_s", models.FloatField(default=0)),
                ("throttle_thermal_s", models.FloatField(default=0)),
                ("throttle_hw_slowdown_s", models.FloatField(default=0)),
                ("throttle_other_s", models.FloatField(default=0)),
                ("throttle_any_s", models.FloatField(default=0)),
                (
                    "sm_active_s",
                    models.FloatField(default=0, help_text="Σ sm_active × prof_s: work seconds"),
                ),
                (
                    "sm_observed_s",
                    models.FloatField(default=0, help_text="Σ prof_s of samples with sm_active"),
                ),
                (
                    "sm_air_s",
                    models.FloatField(
                        default=0,
                        help_text="Σ air seconds of samples with sm_active (busy but not working = this − work)",
                    ),
                ),
                (
                    "tensor_active_s",
                    models.FloatField(default=0, help_text="Σ tensor_active × prof_s"),
                ),
                (
                    "tensor_observed_s",
                    models.FloatField(
                        default=0, help_text="Σ prof_s of samples with tensor_active"
                    ),
                ),
                (
                    "sm_hours",
                    models.IntegerField(
                        default=0,
                        help_text="Hours with sm_active data (1 per hourly row that has any)",
                    ),
                ),
                (
                    "sm_hours_energy_j",
                    models.FloatField(
                        default=0,
                        help_text="Energy of the hours with sm_active data (cost per work hour)",
                    ),
                ),
                ("month", models.DateField(help_text="The month's first day")),
                ("hours", models.IntegerField(default=0, help_text="HourlyUsage rows summed here")),
                (
                    "gpu",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        to="fleet.gpu",
                    ),
                ),
                (
                    "node",
                    models.ForeignKey(
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="fleet.node",
                    ),
                ),
                (
                    "pool",
                    models.ForeignKey(
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="fleet.pool",
                    ),
                ),
                (
                    "site",
                    models.ForeignKey(
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="fleet.site",
                    ),
                ),
                (
                    "team",
                    models.ForeignKey(
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="fleet.team",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["gpu", "month"], name="telemetry_monthly_gpu_month"),
                    models.Index(fields=["month"], name="telemetry_monthly_month"),
                ],
            },
        ),
        migrations.RunPython(_install, _restore, elidable=False),
    ]
