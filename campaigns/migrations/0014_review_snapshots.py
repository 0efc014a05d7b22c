"""Review items name the attempt they judge; checkpoints keep holdout snapshots.

Two columns on tables other than campaigns_unit: nothing here rebuilds the
unit table (and so nothing drops the counter triggers of 0009).
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0013_unit_campaign_statement_check"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="holdout_snapshots",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="attempt",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="campaigns.attempt",
            ),
        ),
    ]
