"""A record campaign's re-import, set-based (campaigns/intake/records.py).

A record unit's source path holds its row's place in the file, which a
rewritten file moves: every id met again takes the place it has now. The
ids an import meets go into a temporary table, so that after its last chunk
one statement finds the campaign's units whose row is gone: reported, and
those not yet run failed `input_missing` instead of read at a stale place.
Nothing of this runs on a campaign's first import (no unit can be gone).
"""

from __future__ import annotations

import uuid

from django.db import connection, models
from django.utils import timezone

from campaigns.models import ErrorClass, Unit, UnitState

#: Ids of gone rows the report names; the count is exact.
GONE_SHOWN = 1000
GONE_MESSAGE = "its row is no longer in the records (re-import); it was not run"


def _column(name: str) -> str:
    field = Unit._meta.get_field(name)
    assert isinstance(field, models.Field) and field.column, name
    return connection.ops.quote_name(field.column)


class RecordTracking:
    """The ids one record import meets, and what follows from them."""

    def __init__(self, campaign, units_before: int):
        self.campaign = campaign
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

    def gone(self, report) -> None:
        """Units there before whose id this import did not meet: counted and
        named in the report; those pending fail `input_missing`."""
        if not self.before:
            return
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
                    f"{uid}: {GONE_MESSAGE}"
                    if state == UnitState.PENDING
                    else f"{uid}: its row is no longer in the records (re-import); "
                    f"the unit is kept as it was ({state})"
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
                    GONE_MESSAGE,
                    connection.ops.adapt_datetimefield_value(timezone.now()),
                    *params,
                    UnitState.PENDING,
                ],
            )
