"""Unit counts kept by the database; indexes for the keyset-paginated unit table
and the campaign page's memory chart.

Pages read how many units of a campaign are in each state from
campaigns_unitcount instead of counting a million units per poll. Triggers on
campaigns_unit keep it in the same transaction as every change, whatever
wrote it (campaigns/db/counters.py generates them and says how they work):
one delta row per (campaign, state, error class) a statement changed on
PostgreSQL, folded by campaigns_unitcount_compact(campaign) for about one
statement in 256 and by readers that summed many rows; one row per key on SQLite.

Caution for later migrations: on SQLite, altering a campaigns_unit column makes
Django rebuild the table, which drops these triggers. Such a migration must run
install_triggers again (tests/campaigns/test_counters.py fails if it did not).
"""

from django.db import migrations, models

from campaigns.db.counters import CounterTriggers

# Its advisory locks' pg_locks.classid is "unit" in ASCII.
UNIT_COUNTS = CounterTriggers(
    label="unit counters", source_table="campaigns_unit", counter_table="campaigns_unitcount",
    trigger_prefix="unitcount", transition_name="units", keys=("state", "error_class"),
    advisory_lock_class=0x756E6974, fold_one_in=256,
)

# The id prefix search (uid LIKE 'abc%'): a btree under a non-C collation
# cannot serve LIKE, varchar_pattern_ops can. SQLite is the small embedded case.
POSTGRESQL_UID_PREFIX = [
    "CREATE INDEX unit_campaign_uid_prefix "
    "ON campaigns_unit (campaign_id, uid varchar_pattern_ops)",
]


def install_triggers(apps, schema_editor):
    """Triggers first, then the backfill, in one transaction: on PostgreSQL
    CREATE TRIGGER holds a lock that keeps writers out until commit, so no unit
    changes between the count and the first trigger."""
    vendor = schema_editor.connection.vendor
    statements = UNIT_COUNTS.install_statements(vendor)
    if vendor == "postgresql":
        statements = statements + POSTGRESQL_UID_PREFIX
    for sql in statements:
        schema_editor.execute(sql)
    schema_editor.execute(UNIT_COUNTS.backfill)


def remove_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    statements = UNIT_COUNTS.remove_statements(vendor)
    if vendor == "postgresql":
        statements = ["DROP INDEX IF EXISTS unit_campaign_uid_prefix", *statements]
    for sql in statements:
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0008_output_write_error"),
    ]

    operations = [
        migrations.CreateModel(
            name="UnitCount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("state", models.CharField(max_length=20)),
                ("error_class", models.CharField(blank=True, max_length=30)),
                ("n", models.BigIntegerField()),
                (
                    "campaign",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.DO_NOTHING,
                        related_name="+",
                        to="campaigns.campaign",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["campaign", "state", "error_class"], name="unitcount_key")
                ],
            },
        ),
        # New indexes before the old ones go, so "pending units" always has one.
        migrations.AddIndex(
            model_name="unit",
            index=models.Index(fields=["campaign", "id"], name="unit_campaign_id"),
        ),
        migrations.AddIndex(
            model_name="unit",
            index=models.Index(fields=["campaign", "state", "id"], name="unit_campaign_state_id"),
        ),
        migrations.AddIndex(
            model_name="unit",
            index=models.Index(
                condition=models.Q(("state", "failed")),
                fields=["campaign", "error_class", "id"],
                name="unit_campaign_error_id",
            ),
        ),
        migrations.AddIndex(
            model_name="unit",
            index=models.Index(
                fields=["campaign", "category", "id"], name="unit_campaign_category_id"
            ),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(
                condition=models.Q(("state", "done")),
                fields=["campaign", "finished_at"],
                name="batch_done_finished",
            ),
        ),
        migrations.RemoveIndex(model_name="unit", name="unit_campaign_state"),
        migrations.RemoveIndex(model_name="unit", name="unit_campaign_error"),
        migrations.RunPython(install_triggers, remove_triggers),
    ]
