"""Unit counts kept by the database; indexes for the keyset-paginated unit table
and the campaign page's memory chart.

Pages read how many units of a campaign are in each state from
campaigns_unitcount instead of counting a million units per poll. Triggers on
campaigns_unit keep it in the same transaction as every change, whatever
wrote it: ORM updates, bulk_create, raw INSERT ... SELECT, COPY.

PostgreSQL: statement-level triggers with transition tables append one delta
row per (campaign, state, error class) a statement changed. Nothing is ever
updated in place, so two workers finishing batches of the same campaign never
wait on (or deadlock over) the same counter row. Readers SUM the deltas;
campaigns_unitcount_compact(campaign) folds them into one row per key, in one
statement (DELETE ... RETURNING feeding an INSERT), under a transaction-level
advisory lock that others try and skip rather than wait for. The trigger calls
it for about one statement in 256; readers call it when they summed many rows.

SQLite (one writer at a time): row-level triggers keep one row per key.

Caution for later migrations: on SQLite, altering a campaigns_unit column makes
Django rebuild the table, which drops these triggers. Such a migration must run
install_triggers again (tests/campaigns/test_counters.py fails if it did not).
"""

from django.db import NotSupportedError, migrations, models

# Identifies this feature's advisory locks (pg_locks.classid): "unit" in ASCII.
ADVISORY_LOCK_CLASS = 0x756E6974

POSTGRESQL_INSTALL = [
    f"""
    CREATE OR REPLACE FUNCTION campaigns_unitcount_compact(cid bigint) RETURNS void
    LANGUAGE plpgsql AS $$
    BEGIN
        -- One compactor per campaign at a time; another one skips, never waits.
        IF NOT pg_try_advisory_xact_lock({ADVISORY_LOCK_CLASS}, (cid & 2147483647)::integer) THEN
            RETURN;
        END IF;
        WITH gone AS (
            DELETE FROM campaigns_unitcount WHERE campaign_id = cid
            RETURNING state, error_class, n
        )
        INSERT INTO campaigns_unitcount (campaign_id, state, error_class, n)
        SELECT cid, state, error_class, sum(n) FROM gone
        GROUP BY state, error_class
        HAVING sum(n) <> 0;
    END $$
    """,
    """
    CREATE OR REPLACE FUNCTION campaigns_unitcount_delta() RETURNS trigger
    LANGUAGE plpgsql AS $$
    DECLARE
        cid bigint;
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO campaigns_unitcount (campaign_id, state, error_class, n)
            SELECT campaign_id, state, error_class, count(*) FROM new_units
            GROUP BY campaign_id, state, error_class;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO campaigns_unitcount (campaign_id, state, error_class, n)
            SELECT campaign_id, state, error_class, -count(*) FROM old_units
            GROUP BY campaign_id, state, error_class;
        ELSE
            -- Rows whose state did not change cancel out and append nothing.
            INSERT INTO campaigns_unitcount (campaign_id, state, error_class, n)
            SELECT campaign_id, state, error_class, sum(d) FROM (
                SELECT campaign_id, state, error_class, 1 AS d FROM new_units
                UNION ALL
                SELECT campaign_id, state, error_class, -1 AS d FROM old_units
            ) AS moved
            GROUP BY campaign_id, state, error_class
            HAVING sum(d) <> 0;
        END IF;
        -- Opportunistic compaction keeps the deltas short without a scheduler.
        IF random() < 1.0 / 256 THEN
            IF TG_OP = 'INSERT' THEN
                FOR cid IN SELECT DISTINCT campaign_id FROM new_units LOOP
                    PERFORM campaigns_unitcount_compact(cid);
                END LOOP;
            ELSE
                FOR cid IN SELECT DISTINCT campaign_id FROM old_units LOOP
                    PERFORM campaigns_unitcount_compact(cid);
                END LOOP;
            END IF;
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE OR REPLACE FUNCTION campaigns_unitcount_forget() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        -- Runs after Django deleted the campaign's units (their deltas included).
        IF TG_OP = 'TRUNCATE' THEN
            DELETE FROM campaigns_unitcount;
        ELSE
            DELETE FROM campaigns_unitcount
            WHERE campaign_id IN (SELECT id FROM old_campaigns);
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER unitcount_insert AFTER INSERT ON campaigns_unit
    REFERENCING NEW TABLE AS new_units
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_unitcount_delta()
    """,
    """
    CREATE TRIGGER unitcount_update AFTER UPDATE ON campaigns_unit
    REFERENCING OLD TABLE AS old_units NEW TABLE AS new_units
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_unitcount_delta()
    """,
    """
    CREATE TRIGGER unitcount_delete AFTER DELETE ON campaigns_unit
    REFERENCING OLD TABLE AS old_units
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_unitcount_delta()
    """,
    """
    CREATE TRIGGER unitcount_truncate AFTER TRUNCATE ON campaigns_unit
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_unitcount_forget()
    """,
    """
    CREATE TRIGGER unitcount_campaign_delete AFTER DELETE ON campaigns_campaign
    REFERENCING OLD TABLE AS old_campaigns
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_unitcount_forget()
    """,
]

POSTGRESQL_REMOVE = [
    "DROP TRIGGER IF EXISTS unitcount_campaign_delete ON campaigns_campaign",
    "DROP TRIGGER IF EXISTS unitcount_truncate ON campaigns_unit",
    "DROP TRIGGER IF EXISTS unitcount_delete ON campaigns_unit",
    "DROP TRIGGER IF EXISTS unitcount_update ON campaigns_unit",
    "DROP TRIGGER IF EXISTS unitcount_insert ON campaigns_unit",
    "DROP FUNCTION IF EXISTS campaigns_unitcount_forget()",
    "DROP FUNCTION IF EXISTS campaigns_unitcount_delta()",
    "DROP FUNCTION IF EXISTS campaigns_unitcount_compact(bigint)",
]


def _sqlite_add(row: str, n: str) -> str:
    """Statements that add n to the count of the unit row OLD or NEW."""
    key = (
        f"campaign_id = {row}.campaign_id AND state = {row}.state "
        f"AND error_class = {row}.error_class"
    )
    return f"""
        INSERT INTO campaigns_unitcount (campaign_id, state, error_class, n)
        SELECT {row}.campaign_id, {row}.state, {row}.error_class, 0
        WHERE NOT EXISTS (SELECT 1 FROM campaigns_unitcount WHERE {key});
        UPDATE campaigns_unitcount SET n = n + ({n}) WHERE {key};
    """


SQLITE_INSTALL = [
    f"""
    CREATE TRIGGER unitcount_insert AFTER INSERT ON campaigns_unit
    BEGIN {_sqlite_add("NEW", "1")} END
    """,
    f"""
    CREATE TRIGGER unitcount_update AFTER UPDATE OF campaign_id, state, error_class
    ON campaigns_unit
    WHEN OLD.campaign_id IS NOT NEW.campaign_id OR OLD.state IS NOT NEW.state
        OR OLD.error_class IS NOT NEW.error_class
    BEGIN {_sqlite_add("OLD", "-1")} {_sqlite_add("NEW", "1")} END
    """,
    f"""
    CREATE TRIGGER unitcount_delete AFTER DELETE ON campaigns_unit
    BEGIN {_sqlite_add("OLD", "-1")} END
    """,
    """
    CREATE TRIGGER unitcount_campaign_delete AFTER DELETE ON campaigns_campaign
    BEGIN DELETE FROM campaigns_unitcount WHERE campaign_id = OLD.id; END
    """,
]

SQLITE_REMOVE = [
    "DROP TRIGGER IF EXISTS unitcount_campaign_delete",
    "DROP TRIGGER IF EXISTS unitcount_delete",
    "DROP TRIGGER IF EXISTS unitcount_update",
    "DROP TRIGGER IF EXISTS unitcount_insert",
]

# The id prefix search (uid LIKE 'abc%'): a btree under a non-C collation
# cannot serve LIKE, varchar_pattern_ops can. SQLite is the small embedded case.
POSTGRESQL_UID_PREFIX = [
    "CREATE INDEX unit_campaign_uid_prefix "
    "ON campaigns_unit (campaign_id, uid varchar_pattern_ops)",
]

BACKFILL = """
    INSERT INTO campaigns_unitcount (campaign_id, state, error_class, n)
    SELECT campaign_id, state, error_class, count(*) FROM campaigns_unit
    GROUP BY campaign_id, state, error_class
"""


def _statements(schema_editor, *, postgresql, sqlite):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        return postgresql
    if vendor == "sqlite":
        return sqlite
    # Counts are read from these triggers' table: a database without them would
    # show wrong counts, so the migration refuses it rather than go on.
    raise NotSupportedError(
        f"the unit counters have triggers for PostgreSQL and SQLite only, not {vendor}"
    )


def install_triggers(apps, schema_editor):
    """Triggers first, then the backfill, in one transaction: on PostgreSQL
    CREATE TRIGGER holds a lock that keeps writers out until commit, so no unit
    changes between the count and the first trigger."""
    statements = _statements(
        schema_editor,
        postgresql=POSTGRESQL_INSTALL + POSTGRESQL_UID_PREFIX,
        sqlite=SQLITE_INSTALL,
    )
    for sql in statements:
        schema_editor.execute(sql)
    schema_editor.execute(BACKFILL)


def remove_triggers(apps, schema_editor):
    statements = _statements(
        schema_editor,
        postgresql=["DROP INDEX IF EXISTS unit_campaign_uid_prefix", *POSTGRESQL_REMOVE],
        sqlite=SQLITE_REMOVE,
    )
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
