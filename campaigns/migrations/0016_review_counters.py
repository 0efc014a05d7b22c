"""Open review items counted by the database, as units are (0009).

The campaign page shows how many review items are open from
campaigns_reviewcount: counting the open items themselves is an index scan as
long as the review queue (bench/RESULTS.md, "The campaign page's header in one
query (2026-11-30)"). Triggers on campaigns_reviewitem keep it in the
transaction of every change, whatever wrote it (campaigns/db/counters.py
generates them and says how they work): one delta row per campaign a statement
changed on PostgreSQL, folded by campaigns_reviewcount_compact(campaign) for
about one statement in 64, since a decision is a statement of its own; one row
per campaign on SQLite.

Caution, as in 0009: on SQLite a migration that alters a campaigns_reviewitem
column rebuilds the table and drops these triggers; it must install them again
(tests/campaigns/test_review_counts.py fails if it did not).
"""

import django.db.models.deletion
from django.db import migrations, models

from campaigns.db.counters import CounterTriggers

# Its advisory locks' pg_locks.classid is "revw" in ASCII.
OPEN_REVIEW_ITEMS = CounterTriggers(
    label="review counters", source_table="campaigns_reviewitem",
    counter_table="campaigns_reviewcount", trigger_prefix="reviewcount", transition_name="items",
    only_when=("state", "open"), advisory_lock_class=0x72657677, fold_one_in=64,
)


def install_triggers(apps, schema_editor):
    """Triggers, then the backfill, in one transaction (see 0009)."""
    for sql in OPEN_REVIEW_ITEMS.install_statements(schema_editor.connection.vendor):
        schema_editor.execute(sql)
    schema_editor.execute(OPEN_REVIEW_ITEMS.backfill)


def remove_triggers(apps, schema_editor):
    for sql in OPEN_REVIEW_ITEMS.remove_statements(schema_editor.connection.vendor):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0015_attempt_vector_hash_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReviewCount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("n", models.BigIntegerField()),
                (
                    "campaign",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="campaigns.campaign",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["campaign"], name="reviewcount_campaign")],
            },
        ),
        migrations.RunPython(install_triggers, remove_triggers),
    ]
