# Job efficiency (DESIGN.md §9.4): what training loops report through the agent's hook socket,
# summed per GPU, hour, workload and model name at ingest.

import django.db.models.deletion
import django.db.models.functions.comparison
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0005_identifiers'),
        ('telemetry', '0111_workload_identity'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobHour',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField()),
                ('model', models.CharField(max_length=200)),
                ('reports', models.IntegerField(default=0, help_text='Samples whose job was added here')),
                ('steps', models.FloatField(default=0)),
                ('samples', models.FloatField(default=0)),
                ('tokens', models.FloatField(default=0)),
                ('flops', models.FloatField(default=0)),
                ('ckpt_bytes', models.FloatField(default=0)),
                ('wall_s', models.FloatField(default=0)),
                ('data_wait_s', models.FloatField(default=0)),
                ('compute_s', models.FloatField(default=0)),
                ('ckpt_s', models.FloatField(default=0)),
                ('flops_wall_s', models.FloatField(default=0)),
                ('gpu', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, to='fleet.gpu')),
                ('workload', models.ForeignKey(db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, to='telemetry.workload')),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='telemetry_jobhour_hour')],
                'constraints': [models.UniqueConstraint(models.F('gpu'), models.F('hour'), django.db.models.functions.comparison.Coalesce('workload', models.Value(0)), models.F('model'), name='telemetry_jobhour_key')],
            },
        ),
    ]
