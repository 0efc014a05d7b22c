"""Review items counted per campaign, state and reason by the database, and the
queue's indexes in id order.

The review queue shows how many items of its filter there are per reason. A
COUNT ... GROUP BY reason over the items grows with the queue (300,000 open
items take longer than the rest of the page); campaigns_reviewreasoncount,
kept by triggers on campaigns_reviewitem in the transaction of every change
(campaigns/db/counters.py generates them, as for 0009 and 0016), makes it a
read of a few rows. Its list of 100 items is an index range in id order
(review_queue_order; review_queue_reason with a reason filter) instead of a
sort of every item of the filter.

Caution, as in 0009 and 0016: on SQLite a migration that alters a
campaigns_reviewitem column rebuilds the table and drops these triggers; it
must install them again (tests/campaigns/test_review_reason_counts.py fails if
it did not). Adding or removing an index does not rebuild it.
"""

import django.db.models.deletion
from django.db import migrations, models

from campaigns.db.counters import CounterTriggers

# Its advisory locks' pg_locks.classid is "rvrs" in ASCII.
REVIEW_ITEMS_BY_REASON = CounterTriggers(
    label="review reason counters", source_table="campaigns_reviewitem",
    counter_table="campaigns_reviewreasoncount", trigger_prefix="reviewreasoncount",
    transition_name="items", keys=("state", "reason"), advisory_lock_class=0x72767273,
    fold_one_in=64,
)


def install_triggers(apps, schema_editor):
    """Triggers, then the backfill, in one transaction (see 0009)."""
    for sql in REVIEW_ITEMS_BY_REASON.install_statements(schema_editor.connection.vendor):
        schema_editor.execute(sql)
    schema_editor.execute(REVIEW_ITEMS_BY_REASON.backfill)


def remove_triggers(apps, schema_editor):
    for sql in REVIEW_ITEMS_BY_REASON.remove_statements(schema_editor.connection.vendor):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0022_campaign_records"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReviewReasonCount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("state", models.CharField(max_length=10)),
                ("reason", models.CharField(max_length=50)),
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
                "indexes": [
                    models.Index(fields=["campaign", "state"], name="reviewreasoncount_campaign")
                ],
            },
        ),
        migrations.RemoveIndex(model_name="reviewitem", name="review_queue"),
        migrations.AddIndex(
            model_name="reviewitem",
            index=models.Index(fields=["campaign", "state", "id"], name="review_queue_order"),
        ),
        migrations.AddIndex(
            model_name="reviewitem",
            index=models.Index(
                fields=["campaign", "state", "reason", "id"], name="review_queue_reason"
            ),
        ),
        migrations.RunPython(install_triggers, remove_triggers),
    ]
