"""Workloads' hourly rollups (telemetry.WorkloadHourlyUsage), and the profiling sums of
docs/metrics.md ("Work"): work, tensor and busy-but-not-working seconds over prof_s, the hours
with profiling data and their energy, and the hour's SM occupancy and DRAM means.

``telemetry_dailyusage_refresh`` is re-installed from the new USAGE_SUMS, its text frozen here
(0103_usage_sums says why); the reverse installs 0103's.
"""

from importlib import import_module

import django.db.models.deletion
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
END
$fn$;
"""


def _refresh_install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REFRESH_SQL)


def _refresh_restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(import_module("telemetry.migrations.0103_usage_sums").REFRESH_SQL)


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0005_identifiers'),
        ('telemetry', '0104_rollup_failures'),
    ]

    operations = [
        migrations.AddField(
            model_name='dailyusage',
            name='sm_air_s',
            field=models.FloatField(default=0, help_text='Σ air seconds of samples with sm_active (busy but not working = this − work)'),
        ),
        migrations.AddField(
            model_name='dailyusage',
            name='sm_hours',
            field=models.IntegerField(default=0, help_text='Hours with sm_active data (1 per hourly row that has any)'),
        ),
        migrations.AddField(
            model_name='dailyusage',
            name='sm_hours_energy_j',
            field=models.FloatField(default=0, help_text='Energy of the hours with sm_active data (cost per work hour)'),
        ),
        migrations.AddField(
            model_name='dailyusage',
            name='tensor_active_s',
            field=models.FloatField(default=0, help_text='Σ tensor_active × prof_s'),
        ),
        migrations.AddField(
            model_name='dailyusage',
            name='tensor_observed_s',
            field=models.FloatField(default=0, help_text='Σ prof_s of samples with tensor_active'),
        ),
        migrations.AddField(
            model_name='hourlyusage',
            name='dram_active_mean',
            field=models.FloatField(help_text='Mean over prof_s, 0–1', null=True),
        ),
        migrations.AddField(
            model_name='hourlyusage',
            name='sm_air_s',
            field=models.FloatField(default=0, help_text='Σ air seconds of samples with sm_active (busy but not working = this − work)'),
        ),
        migrations.AddField(
            model_name='hourlyusage',
            name='sm_hours',
            field=models.IntegerField(default=0, help_text='Hours with sm_active data (1 per hourly row that has any)'),
        ),
        migrations.AddField(
            model_name='hourlyusage',
            name='sm_hours_energy_j',
            field=models.FloatField(default=0, help_text='Energy of the hours with sm_active data (cost per work hour)'),
        ),
        migrations.AddField(
            model_name='hourlyusage',
            name='sm_occupancy_mean',
            field=models.FloatField(help_text='Mean over prof_s, 0–1', null=True),
        ),
        migrations.AddField(
            model_name='hourlyusage',
            name='tensor_active_s',
            field=models.FloatField(default=0, help_text='Σ tensor_active × prof_s'),
        ),
        migrations.AddField(
            model_name='hourlyusage',
            name='tensor_observed_s',
            field=models.FloatField(default=0, help_text='Σ prof_s of samples with tensor_active'),
        ),
        migrations.AlterField(
            model_name='dailyusage',
            name='sm_active_s',
            field=models.FloatField(default=0, help_text='Σ sm_active × prof_s: work seconds'),
        ),
        migrations.AlterField(
            model_name='dailyusage',
            name='sm_observed_s',
            field=models.FloatField(default=0, help_text='Σ prof_s of samples with sm_active'),
        ),
        migrations.AlterField(
            model_name='hourlyusage',
            name='sm_active_s',
            field=models.FloatField(default=0, help_text='Σ sm_active × prof_s: work seconds'),
        ),
        migrations.AlterField(
            model_name='hourlyusage',
            name='sm_observed_s',
            field=models.FloatField(default=0, help_text='Σ prof_s of samples with sm_active'),
        ),
        migrations.CreateModel(
            name='WorkloadHourlyUsage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField()),
                ('samples', models.IntegerField(default=0)),
                ('gpu_s', models.FloatField(default=0, help_text="Σ share_s: the workload's GPU seconds")),
                ('air_s', models.FloatField(default=0, help_text='Σ air_s')),
                ('energy_j', models.FloatField(default=0, help_text='Σ energy × share_s / seconds')),
                ('computed_at', models.DateTimeField()),
                ('gpu', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, to='fleet.gpu')),
                ('node', models.ForeignKey(db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='fleet.node')),
                ('pool', models.ForeignKey(db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='fleet.pool')),
                ('site', models.ForeignKey(db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='fleet.site')),
                ('team', models.ForeignKey(db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='fleet.team')),
                ('workload', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, to='telemetry.workload')),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='telemetry_workload_hour')],
                'constraints': [models.UniqueConstraint(fields=('workload', 'gpu', 'hour'), name='telemetry_workload_gpu_hour')],
            },
        ),
        migrations.RunPython(_refresh_install, _refresh_restore, elidable=False),
    ]
