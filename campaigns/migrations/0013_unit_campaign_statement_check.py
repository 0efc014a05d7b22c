"""On PostgreSQL, check a unit's campaign once per statement, not once per row.

A foreign key makes PostgreSQL run one `SELECT … FOR KEY SHARE` on
campaigns_campaign per inserted unit, at commit: a large share of an import's
database work (bench/RESULTS.md, "Import at scale — `bench/import_scale.py`"). Here the constraint is replaced by two
triggers that keep the same guarantees with one query per statement:

- after each INSERT on campaigns_unit, the statement's campaigns (DISTINCT
  over its transition table) are locked FOR KEY SHARE, as the foreign key
  would, and a missing one raises foreign_key_violation (an IntegrityError);
- an UPDATE that moves a unit to another campaign is checked the same way, row
  by row; the WHEN clause keeps every other UPDATE (the batch runner's, the
  importer's) from calling anything, as PostgreSQL's own foreign key skips an
  unchanged key;
- before a campaign row is deleted (or its id changed), it must have no units
  left, so a campaign cannot vanish under its units. Django's CASCADE deletes
  the units first, in Python, as before.

Concurrent import and deletion keep the foreign key's behaviour: whichever
locks the campaign row second waits, then sees the other's committed result
and fails.

SQLite keeps its declared foreign key (a SQLite ALTER would rebuild the table
and drop the counter triggers of 0009); only the state says db_constraint=False.
"""

import django.db.models.deletion
from django.db import migrations, models

POSTGRESQL_INSTALL = [
    """
    CREATE OR REPLACE FUNCTION campaigns_unit_campaign_exists() RETURNS trigger
    LANGUAGE plpgsql AS $$
    DECLARE
        missing bigint;
    BEGIN
        PERFORM 1 FROM campaigns_campaign
        WHERE id IN (SELECT DISTINCT campaign_id FROM new_units)
        FOR KEY SHARE;
        SELECT n.campaign_id INTO missing
        FROM (SELECT DISTINCT campaign_id FROM new_units) n
        WHERE NOT EXISTS (SELECT 1 FROM campaigns_campaign c WHERE c.id = n.campaign_id)
        LIMIT 1;
        IF FOUND THEN
            RAISE foreign_key_violation USING
                MESSAGE = 'campaigns_unit: campaign ' || missing || ' does not exist',
                TABLE = 'campaigns_unit';
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER unit_campaign_exists_insert AFTER INSERT ON campaigns_unit
    REFERENCING NEW TABLE AS new_units
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_unit_campaign_exists()
    """,
    """
    CREATE OR REPLACE FUNCTION campaigns_unit_campaign_moved() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM campaigns_campaign WHERE id = NEW.campaign_id FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE foreign_key_violation USING
                MESSAGE = 'campaigns_unit: campaign ' || NEW.campaign_id || ' does not exist',
                TABLE = 'campaigns_unit';
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER unit_campaign_exists_update AFTER UPDATE OF campaign_id ON campaigns_unit
    FOR EACH ROW WHEN (OLD.campaign_id IS DISTINCT FROM NEW.campaign_id)
    EXECUTE FUNCTION campaigns_unit_campaign_moved()
    """,
    """
    CREATE OR REPLACE FUNCTION campaigns_campaign_without_units() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM campaigns_unit WHERE campaign_id = OLD.id) THEN
            RAISE foreign_key_violation USING
                MESSAGE = 'campaign ' || OLD.id || ' still has units',
                TABLE = 'campaigns_campaign';
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END $$
    """,
    """
    CREATE TRIGGER campaign_without_units BEFORE DELETE OR UPDATE OF id
    ON campaigns_campaign
    FOR EACH ROW EXECUTE FUNCTION campaigns_campaign_without_units()
    """,
]

POSTGRESQL_REMOVE = [
    "DROP TRIGGER IF EXISTS campaign_without_units ON campaigns_campaign",
    "DROP FUNCTION IF EXISTS campaigns_campaign_without_units()",
    "DROP TRIGGER IF EXISTS unit_campaign_exists_update ON campaigns_unit",
    "DROP FUNCTION IF EXISTS campaigns_unit_campaign_moved()",
    "DROP TRIGGER IF EXISTS unit_campaign_exists_insert ON campaigns_unit",
    "DROP FUNCTION IF EXISTS campaigns_unit_campaign_exists()",
]


def _campaign_foreign_keys(schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "campaigns_unit")
    return [
        name
        for name, info in constraints.items()
        if info["foreign_key"] == ("campaigns_campaign", "id")
        and info["columns"] == ["campaign_id"]
    ]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in _campaign_foreign_keys(schema_editor):
        schema_editor.execute(
            f"ALTER TABLE campaigns_unit DROP CONSTRAINT {schema_editor.quote_name(name)}"
        )
    for sql in POSTGRESQL_INSTALL:
        schema_editor.execute(sql)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in POSTGRESQL_REMOVE:
        schema_editor.execute(sql)
    schema_editor.execute(
        "ALTER TABLE campaigns_unit ADD CONSTRAINT campaigns_unit_campaign_id_fk_back "
        "FOREIGN KEY (campaign_id) REFERENCES campaigns_campaign (id) "
        "DEFERRABLE INITIALLY DEFERRED"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0012_unit_fewer_index_entries"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="unit",
                    name="campaign",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="units",
                        to="campaigns.campaign",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
