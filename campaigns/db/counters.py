"""Counter tables kept by database triggers: the SQL that installs, removes and
backfills them, generated from one description per counter.

A counter table holds, per campaign and key, how many rows of a source table
there are (optionally only rows with one column at one value), so that pages
read a few dozen rows instead of counting millions. The triggers keep it in the
transaction of every change to the source table, whatever wrote it: ORM
updates, bulk_create, raw INSERT ... SELECT, COPY.

PostgreSQL: statement-level triggers with transition tables append one delta
row per key a statement changed. Nothing is updated in place, so two workers
writing rows of the same campaign never wait on (or deadlock over) one counter
row. Readers SUM the deltas; <counter table>_compact(campaign) folds them into
one row per key, in one statement (DELETE ... RETURNING feeding an INSERT),
under a transaction-level advisory lock that others try and skip rather than
wait for. The delta trigger calls it for about one statement in `fold_one_in`.

SQLite (one writer at a time): row-level triggers keep one row per key.

Migrations import this module (0009 unit counts, 0016 open review items, 0023
review items by state and reason), so the SQL it generates for a given
CounterTriggers must stay what those migrations installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import NotSupportedError


@dataclass(frozen=True)
class CounterTriggers:
    """One counter table and the triggers that keep it."""

    label: str  # what the error for an unsupported database calls them
    source_table: str  # the counted rows, e.g. campaigns_unit
    counter_table: str  # (campaign_id, *keys, n); also its functions' name prefix
    trigger_prefix: str  # <prefix>_insert, _update, _delete, _truncate, _campaign_delete
    transition_name: str  # PostgreSQL transition tables new_<name> / old_<name>
    advisory_lock_class: int  # pg_locks.classid of this counter's compaction locks
    fold_one_in: int  # the delta trigger compacts for about one statement in this many
    keys: tuple[str, ...] = ()  # counted per campaign and these columns
    only_when: tuple[str, str] | None = None  # (column, value): count only those rows
    campaign_table: str = "campaigns_campaign"

    # --- names and fragments ---------------------------------------------------

    def _function(self, role: str) -> str:
        return f"{self.counter_table}_{role}"

    def _trigger(self, role: str) -> str:
        return f"{self.trigger_prefix}_{role}"

    def _filter(self, row: str = "") -> str:
        """The row filter on `row` (e.g. "NEW."), or "" when every row counts."""
        if self.only_when is None:
            return ""
        column, value = self.only_when
        literal = value.replace("'", "''")
        return f"{row}{column} = '{literal}'"

    def _where(self) -> str:
        condition = self._filter()
        return f" WHERE {condition}" if condition else ""

    @property
    def _columns(self) -> str:
        """The counter's key columns, campaign first."""
        return ", ".join(("campaign_id", *self.keys))

    # --- PostgreSQL --------------------------------------------------------------

    @property
    def postgresql_install(self) -> list[str]:
        new, old = f"new_{self.transition_name}", f"old_{self.transition_name}"
        keys = "".join(f"{key}, " for key in self.keys)
        group_keys = f"\n        GROUP BY {', '.join(self.keys)}" if self.keys else ""
        where = self._where()
        lock = self.advisory_lock_class
        compact = f"""
    CREATE OR REPLACE FUNCTION {self._function("compact")}(cid bigint) RETURNS void
    LANGUAGE plpgsql AS $$
    BEGIN
        -- One compactor per campaign at a time; another one skips, never waits.
        IF NOT pg_try_advisory_xact_lock({lock}, (cid & 2147483647)::integer) THEN
            RETURN;
        END IF;
        WITH gone AS (
            DELETE FROM {self.counter_table} WHERE campaign_id = cid
            RETURNING {keys}n
        )
        INSERT INTO {self.counter_table} ({self._columns}, n)
        SELECT cid, {keys}sum(n) FROM gone{group_keys}
        HAVING sum(n) <> 0;
    END $$
    """
        delta_function = f"""
    CREATE OR REPLACE FUNCTION {self._function("delta")}() RETURNS trigger
    LANGUAGE plpgsql AS $$
    DECLARE
        cid bigint;
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO {self.counter_table} ({self._columns}, n)
            SELECT {self._columns}, count(*) FROM {new}{where}
            GROUP BY {self._columns};
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO {self.counter_table} ({self._columns}, n)
            SELECT {self._columns}, -count(*) FROM {old}{where}
            GROUP BY {self._columns};
        ELSE
            -- Rows counted under the same key before and after cancel out, appending nothing.
            INSERT INTO {self.counter_table} ({self._columns}, n)
            SELECT {self._columns}, sum(d) FROM (
                SELECT {self._columns}, 1 AS d FROM {new}{where}
                UNION ALL
                SELECT {self._columns}, -1 AS d FROM {old}{where}
            ) AS moved
            GROUP BY {self._columns}
            HAVING sum(d) <> 0;
        END IF;
        -- Opportunistic compaction keeps the deltas short without a scheduler.
        IF random() < 1.0 / {self.fold_one_in} THEN
            IF TG_OP = 'INSERT' THEN
                FOR cid IN SELECT DISTINCT campaign_id FROM {new} LOOP
                    PERFORM {self._function("compact")}(cid);
                END LOOP;
            ELSE
                FOR cid IN SELECT DISTINCT campaign_id FROM {old} LOOP
                    PERFORM {self._function("compact")}(cid);
                END LOOP;
            END IF;
        END IF;
        RETURN NULL;
    END $$
    """
        forget = f"""
    CREATE OR REPLACE FUNCTION {self._function("forget")}() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        -- Runs after Django deleted the campaign's rows (their deltas included).
        IF TG_OP = 'TRUNCATE' THEN
            DELETE FROM {self.counter_table};
        ELSE
            DELETE FROM {self.counter_table}
            WHERE campaign_id IN (SELECT id FROM old_campaigns);
        END IF;
        RETURN NULL;
    END $$
    """
        source = self.source_table
        delta, forget_rows = self._function("delta"), self._function("forget")
        # (trigger, event, table, its transition tables, the function it runs)
        triggers = [
            ("insert", "INSERT", source, f"NEW TABLE AS {new}", delta),
            ("update", "UPDATE", source, f"OLD TABLE AS {old} NEW TABLE AS {new}", delta),
            ("delete", "DELETE", source, f"OLD TABLE AS {old}", delta),
            ("truncate", "TRUNCATE", source, None, forget_rows),
            (
                "campaign_delete",
                "DELETE",
                self.campaign_table,
                "OLD TABLE AS old_campaigns",
                forget_rows,
            ),
        ]
        return [
            compact,
            delta_function,
            forget,
            *(
                f"CREATE TRIGGER {self._trigger(role)} AFTER {event} ON {table}"
                + (f" REFERENCING {tables}" if tables else "")
                + f" FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
                for role, event, table, tables, function in triggers
            ),
        ]

    @property
    def postgresql_remove(self) -> list[str]:
        return [
            f"DROP TRIGGER IF EXISTS {self._trigger('campaign_delete')} ON {self.campaign_table}",
            *(
                f"DROP TRIGGER IF EXISTS {self._trigger(role)} ON {self.source_table}"
                for role in ("truncate", "delete", "update", "insert")
            ),
            f"DROP FUNCTION IF EXISTS {self._function('forget')}()",
            f"DROP FUNCTION IF EXISTS {self._function('delta')}()",
            f"DROP FUNCTION IF EXISTS {self._function('compact')}(bigint)",
        ]

    # --- SQLite ------------------------------------------------------------------

    def _sqlite_add(self, row: str, n: str) -> str:
        """Statements that add n to the count of the source row OLD or NEW
        (when that row counts)."""
        key = " AND ".join(f"{column} = {row}.{column}" for column in ("campaign_id", *self.keys))
        values = ", ".join(f"{row}.{column}" for column in ("campaign_id", *self.keys))
        condition = self._filter(f"{row}.")
        when_counted = f"{condition} AND " if condition else ""
        and_counted = f" AND {condition}" if condition else ""
        return f"""
        INSERT INTO {self.counter_table} ({self._columns}, n)
        SELECT {values}, 0
        WHERE {when_counted}NOT EXISTS (SELECT 1 FROM {self.counter_table} WHERE {key});
        UPDATE {self.counter_table} SET n = n + ({n}) WHERE {key}{and_counted};
    """

    @property
    def sqlite_install(self) -> list[str]:
        watched = ["campaign_id", *self.keys]
        if self.only_when is not None and self.only_when[0] not in watched:
            watched.append(self.only_when[0])
        changed = " OR ".join(f"OLD.{column} IS NOT NEW.{column}" for column in watched)
        source = self.source_table
        return [
            f"""
    CREATE TRIGGER {self._trigger("insert")} AFTER INSERT ON {source}
    BEGIN {self._sqlite_add("NEW", "1")} END
    """,
            f"""
    CREATE TRIGGER {self._trigger("update")} AFTER UPDATE OF {", ".join(watched)} ON {source}
    WHEN {changed}
    BEGIN {self._sqlite_add("OLD", "-1")} {self._sqlite_add("NEW", "1")} END
    """,
            f"""
    CREATE TRIGGER {self._trigger("delete")} AFTER DELETE ON {source}
    BEGIN {self._sqlite_add("OLD", "-1")} END
    """,
            f"""
    CREATE TRIGGER {self._trigger("campaign_delete")} AFTER DELETE ON {self.campaign_table}
    BEGIN DELETE FROM {self.counter_table} WHERE campaign_id = OLD.id; END
    """,
        ]

    @property
    def sqlite_remove(self) -> list[str]:
        return [
            f"DROP TRIGGER IF EXISTS {self._trigger(role)}"
            for role in ("campaign_delete", "delete", "update", "insert")
        ]

    # --- both --------------------------------------------------------------------

    @property
    def backfill(self) -> str:
        """Counts the source table's existing rows into the (empty) counter table."""
        return f"""
    INSERT INTO {self.counter_table} ({self._columns}, n)
    SELECT {self._columns}, count(*) FROM {self.source_table}{self._where()}
    GROUP BY {self._columns}
"""

    def install_statements(self, vendor: str) -> list[str]:
        """The trigger statements for this database (the backfill not included)."""
        return self._for_vendor(vendor, self.postgresql_install, self.sqlite_install)

    def remove_statements(self, vendor: str) -> list[str]:
        return self._for_vendor(vendor, self.postgresql_remove, self.sqlite_remove)

    def _for_vendor(self, vendor: str, postgresql: list[str], sqlite: list[str]) -> list[str]:
        if vendor == "postgresql":
            return postgresql
        if vendor == "sqlite":
            return sqlite
        # Pages read counts from the counter table: a database without its
        # triggers would show wrong counts, so refuse it rather than go on.
        raise NotSupportedError(
            f"the {self.label} have triggers for PostgreSQL and SQLite only, not {vendor}"
        )
