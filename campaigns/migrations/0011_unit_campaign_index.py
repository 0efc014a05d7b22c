import django.db.models.deletion
from django.db import migrations, models


def drop_campaign_only_index(apps, schema_editor):
    """Drop the FK's own index by name, not by AlterField: on SQLite AlterField
    rebuilds the table, and a rebuilt table loses the counter triggers (0009)."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "campaigns_unit")
        for name, info in constraints.items():
            if info["index"] and not info["unique"] and info["columns"] == ["campaign_id"]:
                cursor.execute(f"DROP INDEX {connection.ops.quote_name(name)}")


def recreate_campaign_only_index(apps, schema_editor):
    schema_editor.execute(
        "CREATE INDEX campaigns_unit_campaign_id_back ON campaigns_unit (campaign_id)"
    )


class Migration(migrations.Migration):

    dependencies = [
        ("campaigns", "0010_adaptation"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="unit",
                    name="campaign",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="units",
                        to="campaigns.campaign",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(drop_campaign_only_index, recreate_campaign_only_index),
            ],
        ),
    ]
