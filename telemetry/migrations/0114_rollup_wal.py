"""The rollup's write cost (issue 46): fewer indexes, room for HOT updates, days in place.

* The index of ``gpu`` alone on the hourly, daily and monthly tables goes (each table's
  (gpu, period) index starts with it and serves the same lookups), and so does the daily
  table's partial index of the days that observed more than their hours: no query matched its
  condition, and an index naming ``observed_s`` and ``hours`` made every rewrite of a day's
  row a non-HOT one. The attribution indexes (node, pool, team, site) stay: filtered pages
  read by them, and with HOT updates they are written once per row, not once per rewrite.
* ``fillfactor = 50`` on the hourly, daily and monthly tables: the rollup rewrites the open
  hour's, day's and month's rows every minute without changing an indexed column, and such an
  update is HOT (a new row version on the same page, no index entry) only where the page has
  room for it. Applies to pages written from now on; older pages keep theirs.
* ``telemetry_dailyusage_refresh`` updates a day's and a month's rows in place where their
  attribution did not change, only where a figure changed, instead of deleting and
  inserting them (its text frozen here, as 0103, 0105 and 0109 freeze theirs).

On SQLite only the index changes apply (no triggers, no storage parameters there).
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
    -- The days' rows as their hourly rows make them now (fresh), then: a stored row of the
    -- same GPU, day and attribution is updated in place, and only where a figure changed; a
    -- stored row whose attribution no longer appears (the GPU moved, the hours went) is
    -- deleted; a new attribution is inserted. In place, not deleted and inserted again: the
    -- rollup rewrites the open day every minute, and an update that changes no indexed
    -- column is a HOT update, with no index entry written (issue 46). All three statements
    -- of a CTE see the rows as they were before it.
    WITH k AS (
        SELECT DISTINCT u.gpu_id, u.day FROM unnest(p_gpu, p_day) AS u(gpu_id, day)
    ), fresh AS MATERIALIZED (
        SELECT h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id, count(*) AS hours,
               sum(samples) AS samples,
               sum(observed_s) AS observed_s,
               sum(air_s) AS air_s,
               sum(held_s) AS held_s,
               sum(parked_s) AS parked_s,
               sum(energy_j) AS energy_j,
               sum(idle_energy_j) AS idle_energy_j,
               sum(idle_s) AS idle_s,
               sum(throttle_power_cap_s) AS throttle_power_cap_s,
               sum(throttle_thermal_s) AS throttle_thermal_s,
               sum(throttle_hw_slowdown_s) AS throttle_hw_slowdown_s,
               sum(throttle_other_s) AS throttle_other_s,
               sum(throttle_any_s) AS throttle_any_s,
               sum(sm_active_s) AS sm_active_s,
               sum(sm_observed_s) AS sm_observed_s,
               sum(sm_air_s) AS sm_air_s,
               sum(tensor_active_s) AS tensor_active_s,
               sum(tensor_observed_s) AS tensor_observed_s,
               sum(sm_hours) AS sm_hours,
               sum(sm_hours_energy_j) AS sm_hours_energy_j
        FROM k
        JOIN telemetry_hourlyusage h
          ON h.gpu_id = k.gpu_id
         -- The local day's hours by the index (an hour's margin where a midnight falls in a
         -- DST gap), then exactly the hours whose local date is that day.
         AND h.hour >= (k.day::timestamp AT TIME ZONE z) - interval '1 hour'
         AND h.hour < ((k.day + 1)::timestamp AT TIME ZONE z) + interval '1 hour'
         AND (h.hour AT TIME ZONE z)::date = k.day
        GROUP BY h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id
    ), updated AS (
        UPDATE telemetry_dailyusage d
        SET hours = f.hours,
            samples = f.samples,
            observed_s = f.observed_s,
            air_s = f.air_s,
            held_s = f.held_s,
            parked_s = f.parked_s,
            energy_j = f.energy_j,
            idle_energy_j = f.idle_energy_j,
            idle_s = f.idle_s,
            throttle_power_cap_s = f.throttle_power_cap_s,
            throttle_thermal_s = f.throttle_thermal_s,
            throttle_hw_slowdown_s = f.throttle_hw_slowdown_s,
            throttle_other_s = f.throttle_other_s,
            throttle_any_s = f.throttle_any_s,
            sm_active_s = f.sm_active_s,
            sm_observed_s = f.sm_observed_s,
            sm_air_s = f.sm_air_s,
            tensor_active_s = f.tensor_active_s,
            tensor_observed_s = f.tensor_observed_s,
            sm_hours = f.sm_hours,
            sm_hours_energy_j = f.sm_hours_energy_j
        FROM fresh f
        WHERE d.gpu_id = f.gpu_id AND d.day = f.day
          AND d.node_id IS NOT DISTINCT FROM f.node_id
          AND d.pool_id IS NOT DISTINCT FROM f.pool_id
          AND d.team_id IS NOT DISTINCT FROM f.team_id
          AND d.site_id IS NOT DISTINCT FROM f.site_id
          AND (d.hours,
               d.samples, d.observed_s, d.air_s, d.held_s, d.parked_s, d.energy_j, d.idle_energy_j,
               d.idle_s, d.throttle_power_cap_s, d.throttle_thermal_s, d.throttle_hw_slowdown_s,
               d.throttle_other_s, d.throttle_any_s, d.sm_active_s, d.sm_observed_s, d.sm_air_s,
               d.tensor_active_s, d.tensor_observed_s, d.sm_hours, d.sm_hours_energy_j)
              IS DISTINCT FROM
              (f.hours,
               f.samples, f.observed_s, f.air_s, f.held_s, f.parked_s, f.energy_j, f.idle_energy_j,
               f.idle_s, f.throttle_power_cap_s, f.throttle_thermal_s, f.throttle_hw_slowdown_s,
               f.throttle_other_s, f.throttle_any_s, f.sm_active_s, f.sm_observed_s, f.sm_air_s,
               f.tensor_active_s, f.tensor_observed_s, f.sm_hours, f.sm_hours_energy_j)
    ), gone AS (
        -- No hourly row of the day under the row's attribution any more (the rows fresh is
        -- made of, by the hourly index: fresh itself has none, and this function plans
        -- without hash joins).
        DELETE FROM telemetry_dailyusage d
        USING k
        WHERE d.gpu_id = k.gpu_id AND d.day = k.day
          AND NOT EXISTS (
              SELECT 1 FROM telemetry_hourlyusage h
              WHERE h.gpu_id = d.gpu_id
                AND h.hour >= (d.day::timestamp AT TIME ZONE z) - interval '1 hour'
                AND h.hour < ((d.day + 1)::timestamp AT TIME ZONE z) + interval '1 hour'
                AND (h.hour AT TIME ZONE z)::date = d.day
                AND h.node_id IS NOT DISTINCT FROM d.node_id
                AND h.pool_id IS NOT DISTINCT FROM d.pool_id
                AND h.team_id IS NOT DISTINCT FROM d.team_id
                AND h.site_id IS NOT DISTINCT FROM d.site_id)
    )
    INSERT INTO telemetry_dailyusage (
        gpu_id, day, node_id, pool_id, team_id, site_id, hours,
        samples, observed_s, air_s, held_s, parked_s, energy_j, idle_energy_j, idle_s,
        throttle_power_cap_s, throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s,
        throttle_any_s, sm_active_s, sm_observed_s, sm_air_s, tensor_active_s, tensor_observed_s,
        sm_hours, sm_hours_energy_j)
    SELECT f.gpu_id, f.day, f.node_id, f.pool_id, f.team_id, f.site_id, f.hours,
           f.samples, f.observed_s, f.air_s, f.held_s, f.parked_s, f.energy_j, f.idle_energy_j,
           f.idle_s, f.throttle_power_cap_s, f.throttle_thermal_s, f.throttle_hw_slowdown_s,
           f.throttle_other_s, f.throttle_any_s, f.sm_active_s, f.sm_observed_s, f.sm_air_s,
           f.tensor_active_s, f.tensor_observed_s, f.sm_hours, f.sm_hours_energy_j
    FROM fresh f
    WHERE NOT EXISTS (
        SELECT 1 FROM telemetry_dailyusage d
        WHERE d.gpu_id = f.gpu_id AND d.day = f.day
          AND d.node_id IS NOT DISTINCT FROM f.node_id
          AND d.pool_id IS NOT DISTINCT FROM f.pool_id
          AND d.team_id IS NOT DISTINCT FROM f.team_id
          AND d.site_id IS NOT DISTINCT FROM f.site_id);
    -- The months of those days, the same way from their daily rows (0109_monthlyusage), once
    -- the statement above has written them.
    WITH k AS (
        SELECT DISTINCT u.gpu_id, date_trunc('month', u.day)::date AS month
        FROM unnest(p_gpu, p_day) AS u(gpu_id, day)
    ), fresh AS MATERIALIZED (
        SELECT d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id,
               sum(d.hours) AS hours,
               sum(samples) AS samples,
               sum(observed_s) AS observed_s,
               sum(air_s) AS air_s,
               sum(held_s) AS held_s,
               sum(parked_s) AS parked_s,
               sum(energy_j) AS energy_j,
               sum(idle_energy_j) AS idle_energy_j,
               sum(idle_s) AS idle_s,
               sum(throttle_power_cap_s) AS throttle_power_cap_s,
               sum(throttle_thermal_s) AS throttle_thermal_s,
               sum(throttle_hw_slowdown_s) AS throttle_hw_slowdown_s,
               sum(throttle_other_s) AS throttle_other_s,
               sum(throttle_any_s) AS throttle_any_s,
               sum(sm_active_s) AS sm_active_s,
               sum(sm_observed_s) AS sm_observed_s,
               sum(sm_air_s) AS sm_air_s,
               sum(tensor_active_s) AS tensor_active_s,
               sum(tensor_observed_s) AS tensor_observed_s,
               sum(sm_hours) AS sm_hours,
               sum(sm_hours_energy_j) AS sm_hours_energy_j
        FROM k
        JOIN telemetry_dailyusage d
          ON d.gpu_id = k.gpu_id AND d.day >= k.month
         AND d.day < (k.month + interval '1 month')::date
        GROUP BY d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id
    ), updated AS (
        UPDATE telemetry_monthlyusage m
        SET hours = f.hours,
            samples = f.samples,
            observed_s = f.observed_s,
            air_s = f.air_s,
            held_s = f.held_s,
            parked_s = f.parked_s,
            energy_j = f.energy_j,
            idle_energy_j = f.idle_energy_j,
            idle_s = f.idle_s,
            throttle_power_cap_s = f.throttle_power_cap_s,
            throttle_thermal_s = f.throttle_thermal_s,
            throttle_hw_slowdown_s = f.throttle_hw_slowdown_s,
            throttle_other_s = f.throttle_other_s,
            throttle_any_s = f.throttle_any_s,
            sm_active_s = f.sm_active_s,
            sm_observed_s = f.sm_observed_s,
            sm_air_s = f.sm_air_s,
            tensor_active_s = f.tensor_active_s,
            tensor_observed_s = f.tensor_observed_s,
            sm_hours = f.sm_hours,
            sm_hours_energy_j = f.sm_hours_energy_j
        FROM fresh f
        WHERE m.gpu_id = f.gpu_id AND m.month = f.month
          AND m.node_id IS NOT DISTINCT FROM f.node_id
          AND m.pool_id IS NOT DISTINCT FROM f.pool_id
          AND m.team_id IS NOT DISTINCT FROM f.team_id
          AND m.site_id IS NOT DISTINCT FROM f.site_id
          AND (m.hours,
               m.samples, m.observed_s, m.air_s, m.held_s, m.parked_s, m.energy_j, m.idle_energy_j,
               m.idle_s, m.throttle_power_cap_s, m.throttle_thermal_s, m.throttle_hw_slowdown_s,
               m.throttle_other_s, m.throttle_any_s, m.sm_active_s, m.sm_observed_s, m.sm_air_s,
               m.tensor_active_s, m.tensor_observed_s, m.sm_hours, m.sm_hours_energy_j)
              IS DISTINCT FROM
              (f.hours,
               f.samples, f.observed_s, f.air_s, f.held_s, f.parked_s, f.energy_j, f.idle_energy_j,
               f.idle_s, f.throttle_power_cap_s, f.throttle_thermal_s, f.throttle_hw_slowdown_s,
               f.throttle_other_s, f.throttle_any_s, f.sm_active_s, f.sm_observed_s, f.sm_air_s,
               f.tensor_active_s, f.tensor_observed_s, f.sm_hours, f.sm_hours_energy_j)
    ), gone AS (
        -- No daily row of the month under the row's attribution any more (by the daily
        -- index, as above).
        DELETE FROM telemetry_monthlyusage m
        USING k
        WHERE m.gpu_id = k.gpu_id AND m.month = k.month
          AND NOT EXISTS (
              SELECT 1 FROM telemetry_dailyusage d
              WHERE d.gpu_id = m.gpu_id AND d.day >= m.month
                AND d.day < (m.month + interval '1 month')::date
                AND d.node_id IS NOT DISTINCT FROM m.node_id
                AND d.pool_id IS NOT DISTINCT FROM m.pool_id
                AND d.team_id IS NOT DISTINCT FROM m.team_id
                AND d.site_id IS NOT DISTINCT FROM m.site_id)
    )
    INSERT INTO telemetry_monthlyusage (
        gpu_id, month, node_id, pool_id, team_id, site_id, hours,
        samples, observed_s, air_s, held_s, parked_s, energy_j, idle_energy_j, idle_s,
        throttle_power_cap_s, throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s,
        throttle_any_s, sm_active_s, sm_observed_s, sm_air_s, tensor_active_s, tensor_observed_s,
        sm_hours, sm_hours_energy_j)
    SELECT f.gpu_id, f.month, f.node_id, f.pool_id, f.team_id, f.site_id, f.hours,
           f.samples, f.observed_s, f.air_s, f.held_s, f.parked_s, f.energy_j, f.idle_energy_j,
           f.idle_s, f.throttle_power_cap_s, f.throttle_thermal_s, f.throttle_hw_slowdown_s,
           f.throttle_other_s, f.throttle_any_s, f.sm_active_s, f.sm_observed_s, f.sm_air_s,
           f.tensor_active_s, f.tensor_observed_s, f.sm_hours, f.sm_hours_energy_j
    FROM fresh f
    WHERE NOT EXISTS (
        SELECT 1 FROM telemetry_monthlyusage m
        WHERE m.gpu_id = f.gpu_id AND m.month = f.month
          AND m.node_id IS NOT DISTINCT FROM f.node_id
          AND m.pool_id IS NOT DISTINCT FROM f.pool_id
          AND m.team_id IS NOT DISTINCT FROM f.team_id
          AND m.site_id IS NOT DISTINCT FROM f.site_id);
END
$fn$;
"""

FILLFACTOR_TABLES = ("telemetry_hourlyusage", "telemetry_dailyusage", "telemetry_monthlyusage")


def _install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in FILLFACTOR_TABLES:
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = 50)")
    schema_editor.execute(REFRESH_SQL)


def _restore(apps, schema_editor):
    """0109's function again, and the default fillfactor."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in FILLFACTOR_TABLES:
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    schema_editor.execute(import_module("telemetry.migrations.0109_monthlyusage").REFRESH_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0006_sso_identity"),
        ("telemetry", "0113_queue"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="dailyusage", name="telemetry_daily_over"),
        migrations.AlterField(
            model_name="hourlyusage",
            name="gpu",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                to="fleet.gpu",
            ),
        ),
        migrations.AlterField(
            model_name="dailyusage",
            name="gpu",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                to="fleet.gpu",
            ),
        ),
        migrations.AlterField(
            model_name="monthlyusage",
            name="gpu",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                to="fleet.gpu",
            ),
        ),
        migrations.RunPython(_install, _restore),
    ]
