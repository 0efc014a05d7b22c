"""Open review items counted by the database, as units are (0009).

The campaign page showed how many review items are open by counting them:
an index-only scan that cost PostgreSQL 4-6 ms a page view at 30,000 open
items (bench/RESULTS.md). Triggers on campaigns_reviewitem now keep
campaigns_reviewcount in the transaction of every change, whatever wrote it.

PostgreSQL: statement-level triggers append one delta row per campaign a
statement changed, never updating a row in place, so two workers flagging
outputs of one campaign never wait on each other; readers SUM the deltas and
campaigns_reviewcount_compact(campaign) folds them under an advisory lock that
others skip. SQLite (one writer at a time): row triggers keep one row per campaign.

Caution, as in 0009: on SQLite a migration that alters a campaigns_reviewitem
column rebuilds the table and drops these triggers; it must install them again
(tests/campaigns/test_review_counts.py fails if it did not).
"""

import django.db.models.deletion
from django.db import NotSupportedError, migrations, models

# This feature's advisory locks (pg_locks.classid): "revw" in ASCII.
ADVISORY_LOCK_CLASS = 0x72657677
OPEN = "open"

POSTGRESQL_INSTALL = [
    f"""
    CREATE OR REPLACE FUNCTION campaigns_reviewcount_compact(cid bigint) RETURNS void
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT pg_try_advisory_xact_lock({ADVISORY_LOCK_CLASS}, (cid & 2147483647)::integer) THEN
            RETURN;
        END IF;
        WITH gone AS (
            DELETE FROM campaigns_reviewcount WHERE campaign_id = cid RETURNING n
        )
        INSERT INTO campaigns_reviewcount (campaign_id, n)
        SELECT cid, sum(n) FROM gone HAVING sum(n) <> 0;
    END $$
    """,
    f"""
    CREATE OR REPLACE FUNCTION campaigns_reviewcount_delta() RETURNS trigger
    LANGUAGE plpgsql AS $$
    DECLARE
        cid bigint;
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO campaigns_reviewcount (campaign_id, n)
            SELECT campaign_id, count(*) FROM new_items WHERE state = '{OPEN}'
            GROUP BY campaign_id;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO campaigns_reviewcount (campaign_id, n)
            SELECT campaign_id, -count(*) FROM old_items WHERE state = '{OPEN}'
            GROUP BY campaign_id;
        ELSE
            -- Decisions close items; an edit of an open item's note appends nothing.
            INSERT INTO campaigns_reviewcount (campaign_id, n)
            SELECT campaign_id, sum(d) FROM (
                SELECT campaign_id, 1 AS d FROM new_items WHERE state = '{OPEN}'
                UNION ALL
                SELECT campaign_id, -1 AS d FROM old_items WHERE state = '{OPEN}'
            ) AS moved
            GROUP BY campaign_id
            HAVING sum(d) <> 0;
        END IF;
        -- A decision is a statement of its own: fold more often than units do.
        IF random() < 1.0 / 64 THEN
            IF TG_OP = 'INSERT' THEN
                FOR cid IN SELECT DISTINCT campaign_id FROM new_items LOOP
                    PERFORM campaigns_reviewcount_compact(cid);
                END LOOP;
            ELSE
                FOR cid IN SELECT DISTINCT campaign_id FROM old_items LOOP
                    PERFORM campaigns_reviewcount_compact(cid);
                END LOOP;
            END IF;
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE OR REPLACE FUNCTION campaigns_reviewcount_forget() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'TRUNCATE' THEN
            DELETE FROM campaigns_reviewcount;
        ELSE
            DELETE FROM campaigns_reviewcount
            WHERE campaign_id IN (SELECT id FROM old_campaigns);
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER reviewcount_insert AFTER INSERT ON campaigns_reviewitem
    REFERENCING NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_reviewcount_delta()
    """,
    """
    CREATE TRIGGER reviewcount_update AFTER UPDATE ON campaigns_reviewitem
    REFERENCING OLD TABLE AS old_items NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_reviewcount_delta()
    """,
    """
    CREATE TRIGGER reviewcount_delete AFTER DELETE ON campaigns_reviewitem
    REFERENCING OLD TABLE AS old_items
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_reviewcount_delta()
    """,
    """
    CREATE TRIGGER reviewcount_truncate AFTER TRUNCATE ON campaigns_reviewitem
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_reviewcount_forget()
    """,
    """
    CREATE TRIGGER reviewcount_campaign_delete AFTER DELETE ON campaigns_campaign
    REFERENCING OLD TABLE AS old_campaigns
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_reviewcount_forget()
    """,
]

POSTGRESQL_REMOVE = [
    "DROP TRIGGER IF EXISTS reviewcount_campaign_delete ON campaigns_campaign",
    "DROP TRIGGER IF EXISTS reviewcount_truncate ON campaigns_reviewitem",
    "DROP TRIGGER IF EXISTS reviewcount_delete ON campaigns_reviewitem",
    "DROP TRIGGER IF EXISTS reviewcount_update ON campaigns_reviewitem",
    "DROP TRIGGER IF EXISTS reviewcount_insert ON campaigns_reviewitem",
    "DROP FUNCTION IF EXISTS campaigns_reviewcount_forget()",
    "DROP FUNCTION IF EXISTS campaigns_reviewcount_delta()",
    "DROP FUNCTION IF EXISTS campaigns_reviewcount_compact(bigint)",
]


def _sqlite_add(row: str, n: str) -> str:
    """Statements that add n to the open count of the campaign of item OLD or NEW,
    when that item is open."""
    key = f"campaign_id = {row}.campaign_id"
    return f"""
        INSERT INTO campaigns_reviewcount (campaign_id, n)
        SELECT {row}.campaign_id, 0
        WHERE {row}.state = '{OPEN}'
            AND NOT EXISTS (SELECT 1 FROM campaigns_reviewcount WHERE {key});
        UPDATE campaigns_reviewcount SET n = n + ({n}) WHERE {key} AND {row}.state = '{OPEN}';
    """


SQLITE_INSTALL = [
    f"""
    CREATE TRIGGER reviewcount_insert AFTER INSERT ON campaigns_reviewitem
    BEGIN {_sqlite_add("NEW", "1")} END
    """,
    f"""
    CREATE TRIGGER reviewcount_update AFTER UPDATE OF campaign_id, state ON campaigns_reviewitem
    WHEN OLD.campaign_id IS NOT NEW.campaign_id OR OLD.state IS NOT NEW.state
    BEGIN {_sqlite_add("OLD", "-1")} {_sqlite_add("NEW", "1")} END
    """,
    f"""
    CREATE TRIGGER reviewcount_delete AFTER DELETE ON campaigns_reviewitem
    BEGIN {_sqlite_add("OLD", "-1")} END
    """,
    """
    CREATE TRIGGER reviewcount_campaign_delete AFTER DELETE ON campaigns_campaign
    BEGIN DELETE FROM campaigns_reviewcount WHERE campaign_id = OLD.id; END
    """,
]

SQLITE_REMOVE = [
    "DROP TRIGGER IF EXISTS reviewcount_campaign_delete",
    "DROP TRIGGER IF EXISTS reviewcount_delete",
    "DROP TRIGGER IF EXISTS reviewcount_update",
    "DROP TRIGGER IF EXISTS reviewcount_insert",
]

BACKFILL = f"""
    INSERT INTO campaigns_reviewcount (campaign_id, n)
    SELECT campaign_id, count(*) FROM campaigns_reviewitem WHERE state = '{OPEN}'
    GROUP BY campaign_id
"""


def _statements(schema_editor, *, postgresql, sqlite):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        return postgresql
    if vendor == "sqlite":
        return sqlite
    raise NotSupportedError(
        f"the review counters have triggers for PostgreSQL and SQLite only, not {vendor}"
    )


def install_triggers(apps, schema_editor):
    """Triggers, then the backfill, in one transaction (see 0009)."""
    for sql in _statements(schema_editor, postgresql=POSTGRESQL_INSTALL, sqlite=SQLITE_INSTALL):
        schema_editor.execute(sql)
    schema_editor.execute(BACKFILL)


def remove_triggers(apps, schema_editor):
    for sql in _statements(schema_editor, postgresql=POSTGRESQL_REMOVE, sqlite=SQLITE_REMOVE):
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
