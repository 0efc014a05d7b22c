"""What a re-import meets, set-based: the units whose input is gone.

The ids an import meets go into a temporary table, so that after its last
chunk the campaign's earlier units it did not meet are found in one
statement. Those whose input is gone are reported, and those not yet run
failed `input_missing` instead of read where their input was. A unit that
ran keeps its state and outputs. Nothing of this runs on a campaign's first
import (no unit can be gone).

What "gone" means depends on what the import reads. A record campaign's
files are its whole list: a unit whose id the import did not meet has lost
its row. A folder or a manifest import is not the whole list — a manifest
adds rows, and a campaign may hold units of a manifest and of its folder,
under ids of either — so a unit it did not meet is gone only when its file
is definitely not there any more (stat says "no such file"); one that
cannot be told (no permission, a path that leaves the corpus) is kept.

A record unit's source path also holds its row's place in the file
(campaigns/intake/records.py), which a rewritten file moves: every id met
again takes the place it has now (`relocate`). A file's path is its own,
never moved by an import.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from django.db import connection, models
from django.utils import timezone

from campaigns.models import ErrorClass, Unit, UnitState
from campaigns.storage.paths import InputLocator

#: Ids of gone units the report names; the count is exact.
GONE_SHOWN = 1000
#: Candidates a query reads (and stats) at a time, where gone means a file gone.
CANDIDATES_READ = 2000
#: What is gone, by the kind of import: a record's row, or a unit's file.
GONE_WHAT = {
    "records": "its row is no longer in the records",
    "folder": "its file is gone",
    "manifest": "its file is gone",
}


def gone_message(source: str) -> str:
    """A gone unit's reason (a pending one fails with it)."""
    return f"{GONE_WHAT[source]} (re-import); it was not run"


def _kept_message(source: str, state: str) -> str:
    return f"{GONE_WHAT[source]} (re-import); the unit is kept as it was ({state})"


def file_gone(locate: InputLocator, source_path: str) -> bool:
    """Whether a unit's input file is definitely not there: the path the
    worker opens, stat'ed as it opens it (following links). Anything but "no
    such file" (no permission, a path that leaves the corpus) is not known."""
    try:
        os.stat(locate(source_path))
    except (FileNotFoundError, NotADirectoryError):
        return True
    except (OSError, ValueError):
        return False
    return False


def _unlooked(root: Path) -> str:
    """Why a folder or manifest re-import looks at no file, or "": a campaign
    folder that is not there, or holds nothing, is far more often a disk not
    mounted or a folder renamed than every input deleted, and every pending
    unit would fail for it."""
    try:
        with os.scandir(root) as entries:
            if next(entries, None) is not None:
                return ""
        what = "is empty"
    except OSError as exc:
        what = f"cannot be read ({exc.strerror or type(exc).__name__})"
    return (
        f"{root}: the campaign's folder {what}, so no unit was taken as gone "
        "(a disk not mounted? a folder renamed?); import again once its files are there"
    )


def _column(name: str) -> str:
    field = Unit._meta.get_field(name)
    assert isinstance(field, models.Field) and field.column, name
    return connection.ops.quote_name(field.column)


class ImportTracking:
    """The ids one re-import meets, and what follows from them. `source`: a
    key of GONE_WHAT, the kind of import."""

    def __init__(self, campaign, units_before: int, source: str):
        self.campaign = campaign
        self.source = source
        self.message = gone_message(source)
        self.postgres = connection.vendor == "postgresql"
        self.name = f"unit_seen_{uuid.uuid4().hex[:16]}"
        self.table = connection.ops.quote_name(self.name)
        # The units found gone, where that takes a look at the disk.
        self.gone_table = connection.ops.quote_name(f"unit_gone_{uuid.uuid4().hex[:16]}")
        self.units = connection.ops.quote_name(Unit._meta.db_table)
        # Units up to this id were there before the import.
        self.before = units_before
        # Why no file was looked at (the campaign's folder missing or empty).
        self.unlooked = ""

    def create(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TEMPORARY TABLE {self.table} (uid text NOT NULL)")
            index = connection.ops.quote_name(f"{self.name}_uid")
            cursor.execute(f"CREATE INDEX {index} ON {self.table} (uid)")

    def drop(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {self.table}")
            cursor.execute(f"DROP TABLE IF EXISTS {self.gone_table}")

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

    def _not_met(self) -> str:
        """The earlier units this import did not meet (params: campaign, before)."""
        pk = connection.ops.quote_name(Unit._meta.pk.column)
        return (
            f"{_column('campaign')} = %s AND {pk} <= %s AND NOT EXISTS "
            f"(SELECT 1 FROM {self.table} t WHERE t.uid = {self.units}.{_column('uid')})"
        )

    def look(self) -> None:
        """Where gone means a file gone: look at the file of each unit not
        met, a chunk of them at a time, and keep those whose file is gone in
        a temporary table for `gone`. Outside a transaction: on SQLite one
        holds the write lock from its start, and a look at many files takes
        a while."""
        if not self.before or self.source == "records":
            return
        pk = connection.ops.quote_name(Unit._meta.pk.column)
        root = Path(self.campaign.input_root)
        locate = InputLocator(root)
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TEMPORARY TABLE {self.gone_table} (unit_id bigint PRIMARY KEY)")
            self.unlooked = _unlooked(root)
            if self.unlooked:
                return
            after = 0
            while True:
                cursor.execute(
                    f"SELECT {pk}, {_column('source_path')} FROM {self.units} "
                    f"WHERE {self._not_met()} AND {pk} > %s ORDER BY {pk} LIMIT %s",
                    [self.campaign.pk, self.before, after, CANDIDATES_READ],
                )
                candidates = cursor.fetchall()
                if not candidates:
                    break
                after = candidates[-1][0]
                gone = [(unit,) for unit, path in candidates if file_gone(locate, path)]
                if gone:
                    cursor.executemany(f"INSERT INTO {self.gone_table} (unit_id) VALUES (%s)", gone)

    def gone(self, report) -> None:
        """Units there before whose input is gone (see the module's words;
        after `look`): counted and named in the report; those pending fail
        `input_missing`."""
        if not self.before:
            return
        if self.unlooked:
            # First: it explains the rows the import could not read as well.
            report.problems.insert(0, self.unlooked)
            report.problem_count += 1
            return
        u, pk = self.units, connection.ops.quote_name(Unit._meta.pk.column)
        where = (
            self._not_met()
            if self.source == "records"
            else f"{_column('campaign')} = %s AND {pk} <= %s AND "
            f"{pk} IN (SELECT unit_id FROM {self.gone_table})"
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
