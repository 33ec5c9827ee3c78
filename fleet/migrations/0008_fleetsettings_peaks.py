from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0007_node_alloc_health"),
    ]

    operations = [
        migrations.AddField(
            model_name="fleetsettings",
            name="peaks",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
