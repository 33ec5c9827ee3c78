"""The usage sums become one list (telemetry.models.USAGE_SUMS): the help texts of the sums
are the same on both usage tables now, and ``telemetry_dailyusage_refresh`` (what the triggers
of 0101 call to keep DailyUsage equal to the hourly rows) is the one generated from that list.

Its text is frozen here, as every later migration that changes the list freezes its own:
replaying the migrations on a fresh database installs what they installed then, whatever the
live tree says. tests/telemetry/test_usage_sums.py checks that the function installed by the
last migration is the one ``telemetry.rollup.daily_refresh_function_sql()`` generates now.
On SQLite nothing happens to the database (no triggers there).
"""

from importlib import import_module

from django.db import migrations, models

REFRESH_SQL = """
-- telemetry_dailyusage_refresh (PostgreSQL): recompute the DailyUsage rows of these GPU-days
-- from their hourly rows. Called by the statement triggers on telemetry_hourlyusage (created
-- in migration 0101_dailyusage), so whatever writes hourly rows, the days it touched follow in
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
        throttle_any_s, sm_active_s, sm_observed_s)
    SELECT h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id, count(*),
           sum(samples), sum(observed_s), sum(air_s), sum(held_s), sum(parked_s), sum(energy_j),
           sum(idle_energy_j), sum(idle_s), sum(throttle_power_cap_s), sum(throttle_thermal_s),
           sum(throttle_hw_slowdown_s), sum(throttle_other_s), sum(throttle_any_s),
           sum(sm_active_s), sum(sm_observed_s)
    FROM (SELECT DISTINCT u.gpu_id, u.day FROM unnest(p_gpu, p_day) AS u(gpu_id, day)) k
    JOIN telemetry_hourlyusage h
      ON h.gpu_id = k.gpu_id
     -- The local day's hours by the index (an hour's margin where a midnight falls in a
     -- DST gap), then exactly the hours whose local date is that day.
     AND h.hour >= (k.day::timestamp AT TIME ZONE z) - interval '1 hour'
     AND h.hour < ((k.day + 1)::timestamp AT TIME ZONE z) + interval '1 hour'
     AND (h.hour AT TIME ZONE z)::date = k.day
    GROUP BY h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id;
END
$fn$;
"""


def _refresh_install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REFRESH_SQL)


def _refresh_restore(apps, schema_editor):
    """Back to 0101's function (its DDL is idempotent: CREATE OR REPLACE, triggers re-made).
    A later migration's reverse installs this one's REFRESH_SQL the same way."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(import_module("telemetry.migrations.0101_dailyusage").TRIGGERS_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("telemetry", "0102_workloads_profiling"),
    ]

    operations = [
        migrations.AlterField(
            model_name="dailyusage",
            name="idle_energy_j",
            field=models.FloatField(
                default=0, help_text="Energy of samples below the active threshold"
            ),
        ),
        migrations.AlterField(
            model_name="dailyusage",
            name="idle_s",
            field=models.FloatField(
                default=0, help_text="Seconds of samples below the active threshold"
            ),
        ),
        migrations.AlterField(
            model_name="dailyusage",
            name="sm_active_s",
            field=models.FloatField(default=0, help_text="Σ sm_active × seconds"),
        ),
        migrations.AlterField(
            model_name="dailyusage",
            name="sm_observed_s",
            field=models.FloatField(default=0, help_text="Σ seconds of samples with sm_active"),
        ),
        migrations.RunPython(_refresh_install, _refresh_restore, elidable=False),
    ]
