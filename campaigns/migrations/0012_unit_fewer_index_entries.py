"""Fewer index entries per imported unit, for imports at scale.

- The batch foreign key's index becomes partial (batch set): imported units
  have none, so they add no entries.
- The category index becomes partial (category not empty), for the same reason.
- On PostgreSQL the unique (campaign, uid) index takes varchar_pattern_ops and
  so also serves the id prefix search; the separate prefix index of 0009 goes.

Every step is a plain CREATE/DROP INDEX (or constraint on PostgreSQL), never
AlterField: on SQLite AlterField rebuilds the table, and a rebuilt table loses
the counter triggers of 0009.
"""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Q

OLD_UNIQUE = models.UniqueConstraint(fields=["campaign", "uid"], name="unit_uid_unique")
NEW_UNIQUE = models.UniqueConstraint(
    fields=["campaign", "uid"],
    name="unit_uid_unique",
    opclasses=["int8_ops", "varchar_pattern_ops"],
)
OLD_CATEGORY = models.Index(fields=["campaign", "category", "id"], name="unit_campaign_category_id")
NEW_CATEGORY = models.Index(
    fields=["campaign", "category", "id"],
    name="unit_campaign_category_id",
    condition=~Q(category=""),
)
BATCH = models.Index(fields=["batch"], name="unit_batch_assigned", condition=Q(batch__isnull=False))
PREFIX_0009 = (
    "CREATE INDEX unit_campaign_uid_prefix ON campaigns_unit (campaign_id, uid varchar_pattern_ops)"
)


def _drop_batch_fk_index(schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "campaigns_unit")
    for name, info in constraints.items():
        if info["index"] and not info["unique"] and info["columns"] == ["batch_id"]:
            schema_editor.execute(f"DROP INDEX {connection.ops.quote_name(name)}")


def forwards(apps, schema_editor):
    unit = apps.get_model("campaigns", "Unit")
    _drop_batch_fk_index(schema_editor)
    schema_editor.add_index(unit, BATCH)
    schema_editor.remove_index(unit, OLD_CATEGORY)
    schema_editor.add_index(unit, NEW_CATEGORY)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS unit_campaign_uid_prefix")
        schema_editor.remove_constraint(unit, OLD_UNIQUE)
        schema_editor.add_constraint(unit, NEW_UNIQUE)


def backwards(apps, schema_editor):
    unit = apps.get_model("campaigns", "Unit")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_constraint(unit, NEW_UNIQUE)
        schema_editor.add_constraint(unit, OLD_UNIQUE)
        schema_editor.execute(PREFIX_0009)
    schema_editor.remove_index(unit, NEW_CATEGORY)
    schema_editor.add_index(unit, OLD_CATEGORY)
    schema_editor.remove_index(unit, BATCH)
    schema_editor.execute("CREATE INDEX campaigns_unit_batch_id_back ON campaigns_unit (batch_id)")


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0011_unit_campaign_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="unit", name="unit_uid_unique"),
                migrations.RemoveIndex(model_name="unit", name="unit_campaign_category_id"),
                migrations.AlterField(
                    model_name="unit",
                    name="batch",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to="campaigns.batch",
                    ),
                ),
                migrations.AddIndex(model_name="unit", index=NEW_CATEGORY),
                migrations.AddIndex(model_name="unit", index=BATCH),
                migrations.AddConstraint(model_name="unit", constraint=NEW_UNIQUE),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
