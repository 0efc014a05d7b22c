"""What a re-import meets, set-based: the units whose input is gone.

The ids an import meets go into a temporary table, so that after its last
chunk one statement finds the campaign's earlier units it did not meet — a
record's row, a folder's file or a manifest's row that is gone: reported,
and those not yet run failed `input_missing` instead of read where their
input was. A unit that ran keeps its state and outputs. Nothing of this
runs on a campaign's first import (no unit can be gone).

A record unit's source path also holds its row's place in the file
(campaigns/intake/records.py), which a rewritten file moves: every id met
again takes the place it has now (`relocate`). A file's path is its own,
never moved by an import.
"""

from __future__ import annotations

import uuid

from django.db import connection, models
from django.utils import timezone

from campaigns.models import ErrorClass, Unit, UnitState

#: Ids of gone units the report names; the count is exact.
GONE_SHOWN = 1000
#: Where a unit's input was, by the kind of import: what is gone, and from where.
GONE_FROM = {
    "records": ("its row", "the records"),
    "folder": ("its file", "the folder"),
    "manifest": ("its row", "the manifest"),
}


def gone_message(source: str) -> str:
    """A gone unit's reason (a pending one fails with it)."""
    what, where = GONE_FROM[source]
    return f"{what} is no longer in {where} (re-import); it was not run"


def _kept_message(source: str, state: str) -> str:
    what, where = GONE_FROM[source]
    return f"{what} is no longer in {where} (re-import); the unit is kept as it was ({state})"


def _column(name: str) -> str:
    field = Unit._meta.get_field(name)
    assert isinstance(field, models.Field) and field.column, name
    return connection.ops.quote_name(field.column)


class ImportTracking:
    """The ids one re-import meets, and what follows from them. `source`: a
    key of GONE_FROM, the kind of import."""

    def __init__(self, campaign, units_before: int, source: str, unread: list[str] | None = None):
        """`unread`: the sub-folders a folder import did not read (filled as
        it goes): their units are not gone, only not looked at."""
        self.campaign = campaign
        self.source = source
        self.unread = unread if unread is not None else []
        self.message = gone_message(source)
        self.postgres = connection.vendor == "postgresql"
        self.name = f"unit_seen_{uuid.uuid4().hex[:16]}"
        self.table = connection.ops.quote_name(self.name)
        self.units = connection.ops.quote_name(Unit._meta.db_table)
        # Units up to this id were there before the import.
        self.before = units_before

    def create(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TEMPORARY TABLE {self.table} (uid text NOT NULL)")
            index = connection.ops.quote_name(f"{self.name}_uid")
            cursor.execute(f"CREATE INDEX {index} ON {self.table} (uid)")

    def drop(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {self.table}")

    def seen(self, uids: list[str]) -> None:
        with connection.cursor() as cursor:
            if self.postgres:
                with cursor.cursor.copy(f"COPY {self.table} (uid) FROM STDIN") as copy:
                    for uid in uids:
                        copy.write_row((uid,))
            else:
                cursor.executemany(
                    f"INSERT INTO {self.table} (uid) VALUES (%s)", [(uid,) for uid in uids]
                )

    def met_before(self, cursor, staging: str) -> list[tuple]:
        """Drop (and return as (line, uid, source_path)) the staged rows whose
        id an earlier chunk of this import met: the later copies of a repeated id."""
        cursor.execute(
            f"DELETE FROM {staging} WHERE EXISTS (SELECT 1 FROM {self.table} t "
            f"WHERE t.uid = {staging}.uid) RETURNING line, uid, source_path"
        )
        return cursor.fetchall()

    def relocate(self, cursor, staging: str) -> None:
        """Matched units (one staged row each: duplicates are gone by now) take
        their row's place as this import found it."""
        pk, path = connection.ops.quote_name(Unit._meta.pk.column), _column("source_path")
        cursor.execute(
            f"UPDATE {self.units} AS u SET {path} = s.source_path FROM {staging} s "
            f"WHERE u.{pk} = s.unit_id AND u.{path} <> s.source_path"
        )

    def _unread_seen(self) -> None:
        """The units under a sub-folder not read count as met: a folder that
        could not be listed, or became a link, says nothing of its files."""
        path, pk = _column("source_path"), connection.ops.quote_name(Unit._meta.pk.column)
        prefixes = sorted({f"{folder}/" for folder in self.unread})
        # A statement per hundred folders: SQLite bounds an expression's depth.
        for start in range(0, len(prefixes), 100):
            group = prefixes[start : start + 100]
            under = " OR ".join(f"substr({path}, 1, %s) = %s" for _ in group)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {self.table} (uid) SELECT {_column('uid')} FROM {self.units} "
                    f"WHERE {_column('campaign')} = %s AND {pk} <= %s AND ({under})",
                    [
                        self.campaign.pk,
                        self.before,
                        *(v for prefix in group for v in (len(prefix), prefix)),
                    ],
                )

    def gone(self, report) -> None:
        """Units there before whose id this import did not meet: counted and
        named in the report; those pending fail `input_missing`."""
        if not self.before or {".", "?"} & set(self.unread):
            return  # the folder itself (or one os.walk does not name) was not read
        self._unread_seen()
        u, pk = self.units, connection.ops.quote_name(Unit._meta.pk.column)
        where = (
            f"{_column('campaign')} = %s AND {pk} <= %s AND NOT EXISTS "
            f"(SELECT 1 FROM {self.table} t WHERE t.uid = {u}.{_column('uid')})"
        )
        params = [self.campaign.pk, self.before]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {u} WHERE {where}", params)
            report.removed = cursor.fetchone()[0]
            if not report.removed:
                return
            cursor.execute(
                f"SELECT {_column('uid')}, {_column('state')} FROM {u} WHERE {where} "
                f"ORDER BY {pk} LIMIT %s",
                [*params, min(GONE_SHOWN, report.room())],
            )
            report.note(
                [
                    f"{uid}: {self.message}"
                    if state == UnitState.PENDING
                    else f"{uid}: {_kept_message(self.source, state)}"
                    for uid, state in cursor.fetchall()
                ],
                total=report.removed,
            )
            cursor.execute(
                f"UPDATE {u} SET {_column('state')} = %s, {_column('error_class')} = %s, "
                f"{_column('error_message')} = %s, {_column('updated_at')} = %s "
                f"WHERE {where} AND {_column('state')} = %s",
                [
                    UnitState.FAILED,
                    ErrorClass.INPUT_MISSING,
                    self.message,
                    connection.ops.adapt_datetimefield_value(timezone.now()),
                    *params,
                    UnitState.PENDING,
                ],
            )
