"""One chunk of an import, set-based: staging table, classification, INSERT.

A chunk's rows go into a temporary table (COPY on PostgreSQL, executemany on
SQLite). A few statements then sort them, the first line of an id winning:
duplicates, ids the campaign already has (and among them changed inputs), and
new units, which one INSERT … SELECT … ON CONFLICT DO NOTHING adds in manifest
order (unit ids are the "original" batch order). These are ordinary INSERTs and
UPDATEs on campaigns_unit, so its constraints and triggers see every row. No
set of ids lives in Python: the unique index on (campaign, uid) is the memory.

One module over 400 lines: its statements share one temporary table's name
and shape and one savepoint protocol, and read best side by side.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterable
from contextlib import contextmanager
from datetime import datetime

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import NOT_PROVIDED, Max
from django.utils import timezone

from campaigns.db.import_tracking import ImportTracking
from campaigns.models import IN_FLIGHT, Campaign, ErrorClass, Unit, UnitState

#: The staging columns, in the order of the importer's row tuples. All but
#: `line` (the manifest line, which decides which duplicate wins) are Unit
#: fields of the same name.
STAGED = (
    "line",
    "uid",
    "source_path",
    "size",
    "sha256",
    "mtime_ns",
    "category",
    "metadata",
    "holdout",
    "state",
    "error_class",
    "error_message",
)
# Rows changed since campaigns_unit's last ANALYZE above which an import's
# lookups analyze it first (and above a tenth of the table).
STALE_STATISTICS_ROWS = 10_000

# Filled from the unit with the same id, if the campaign has one.
_MATCHED = ("unit_id", "unit_state", "unit_sha256")

# "input changed since import: sha256 <old 12>… is now <new 12>… (resume …)",
# written by Python for the report and by SQL on the unit, from these parts.
_CHANGED = (
    "input changed since import: sha256 ",
    "… is now ",
    "… (resume --retry-failed processes the new content)",
)


#: A unit whose input was good and fails at a re-import: its reason follows.
NOW_FAILS = "input changed since import and now fails: "


def changed_message(old_sha256: str, new_sha256: str) -> str:
    return f"{_CHANGED[0]}{old_sha256[:12]}{_CHANGED[1]}{new_sha256[:12]}{_CHANGED[2]}"


def _differs(alias: str) -> str:
    """Same id, other bytes. A row without a checksum (failed at import) never differs."""
    return (
        f"{alias}.unit_id IS NOT NULL AND {alias}.sha256 <> '' AND {alias}.unit_sha256 <> '' "
        f"AND {alias}.sha256 <> {alias}.unit_sha256"
    )


def _unit_columns(campaign: Campaign, now) -> list[tuple[str, str, object]]:
    """The campaigns_unit columns an import writes: (quoted column, the staged
    field it comes from, or "" and the value every row gets)."""
    columns = []
    for f in Unit._meta.concrete_fields:
        if f.primary_key or f.generated or f.db_default is not NOT_PROVIDED:
            continue  # the database fills these
        column = connection.ops.quote_name(f.column)
        if f.name in STAGED:
            columns.append((column, f.name, None))
        elif f.name == "campaign":
            columns.append((column, "", campaign.pk))
        elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            columns.append((column, "", now))
        else:
            columns.append((column, "", f.get_db_prep_save(f.get_default(), connection)))
    return columns


def analyze_if_stale(cursor) -> None:
    """ANALYZE campaigns_unit (PostgreSQL) if many rows changed since its
    statistics were taken. ANALYZE samples 30,000 rows and waits only for
    another ANALYZE."""
    cursor.execute(
        "SELECT n_mod_since_analyze, GREATEST(c.reltuples, 0) FROM pg_stat_user_tables s "
        "JOIN pg_class c ON c.oid = s.relid WHERE s.relid = %s::regclass",
        [Unit._meta.db_table],
    )
    row = cursor.fetchone()
    if row is not None and row[0] > max(STALE_STATISTICS_ROWS, row[1] / 10):
        cursor.execute(f"ANALYZE {connection.ops.quote_name(Unit._meta.db_table)}")


def _column(name: str) -> str:
    return connection.ops.quote_name(Unit._meta.get_field(name).column)


class Staging:
    """The staging table of one import; `with Staging(...) as s:` creates and drops it."""

    def __init__(self, *, campaign: Campaign, source: str | None = None):
        """`source`: what the import reads ("records", "folder" or "manifest"),
        for a re-import's gone units (db/import_tracking.py); None: not tracked."""
        self.campaign = campaign
        self.source = source
        self.tracking: ImportTracking | None = None
        self.postgres = connection.vendor == "postgresql"
        self.name = f"unit_import_{uuid.uuid4().hex[:16]}"
        self.table = connection.ops.quote_name(self.name)
        self.units = connection.ops.quote_name(Unit._meta.db_table)
        self.loaded = 0
        self.mark = 0
        # Until a chunk meets an id the campaign has, chunks skip the lookup.
        self.expect_new = True
        self.statistics_checked = False

    def __enter__(self) -> Staging:
        pg = self.postgres
        types = {
            "int": "bigint" if pg else "integer",
            "json": "jsonb" if pg else "text",
            "bool": "boolean" if pg else "integer",
        }
        columns = (
            f"line {types['int']} NOT NULL, uid text NOT NULL, source_path text NOT NULL, "
            f"size {types['int']}, sha256 text NOT NULL, mtime_ns {types['int']}, "
            f"category text NOT NULL, metadata {types['json']} NOT NULL, "
            f"holdout {types['bool']} NOT NULL, state text NOT NULL, error_class text NOT NULL, "
            f"error_message text NOT NULL, unit_id {types['int']}, unit_state text, "
            "unit_sha256 text"
        )
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TEMPORARY TABLE {self.table} ({columns})")
            if not pg:
                # SQLite answers the duplicate self-join with this; PostgreSQL hashes.
                index = connection.ops.quote_name(f"{self.name}_uid")
                cursor.execute(f"CREATE INDEX {index} ON {self.table} (uid, line)")
        # Units of this campaign above this id were made by this import: an id
        # met again in a later chunk is a duplicate, not an existing unit.
        self.mark = Unit.objects.aggregate(top=Max("pk"))["top"] or 0
        if self.source is not None and Unit.objects.filter(campaign=self.campaign).exists():
            self.tracking = ImportTracking(self.campaign, self.mark, self.source)
            self.tracking.create()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if connection.needs_rollback:
            return  # the enclosing transaction's rollback takes the table with it
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE IF EXISTS {self.table}")
            if self.tracking is not None:
                self.tracking.drop()
        except DatabaseError:
            # An aborted transaction refuses even this; the table goes with the
            # session. Never hide the error that brought us here.
            if exc_type is None:
                raise

    def load(self, rows: Iterable[tuple]) -> int:
        """Replace the staging rows with `rows` (tuples in STAGED order)."""
        names = ", ".join(STAGED)
        with connection.cursor() as cursor:
            if self.postgres:
                # The INSERT sorts a chunk by line (some 10 MB): in memory, not
                # in a temp file. LOCAL: for this chunk's transaction only.
                cursor.execute("SET LOCAL work_mem = '64MB'")
                cursor.execute(f"TRUNCATE {self.table}")
                loaded = 0
                with cursor.cursor.copy(f"COPY {self.table} ({names}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                        loaded += 1
            else:
                cursor.execute(f"DELETE FROM {self.table}")
                marks = ", ".join(["%s"] * len(STAGED))
                cursor.executemany(f"INSERT INTO {self.table} ({names}) VALUES ({marks})", rows)
                loaded = cursor.rowcount
        self.loaded = max(loaded, 0)
        return self.loaded

    def add(self, rows: Iterable[tuple], report) -> int:
        """Import one chunk of rows (tuples in STAGED order); returns how many were read.

        On PostgreSQL, while every id so far was new, the chunk is first COPYed
        straight into campaigns_unit, which costs the database much less than
        staging it and then INSERT … SELECT (bench/RESULTS.md, "Fewer index entries, a
        statement-level campaign check, COPY into the units (2026-11-30)"). The
        unique index refuses a chunk with an id that is not new; its savepoint
        is undone and the chunk goes the staged way, which sorts it out.
        """
        if self.postgres:
            # A chunk's commit does not wait for its WAL to reach the disk: a
            # crash may lose the last fraction of a second of chunks, which the
            # same import, run again, adds (an import is idempotent). LOCAL:
            # this chunk's transaction only.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = off")
        if self.tracking is None:
            return self._add(rows, report)
        rows = list(rows)
        read = self._add(rows, report)
        # After the chunk: its settle looks for the ids of earlier chunks only.
        uid = STAGED.index("uid")
        self.tracking.seen([row[uid] for row in rows])
        return read

    def _add(self, rows: Iterable[tuple], report) -> int:
        if self.postgres and self.expect_new:
            rows = list(rows)  # kept for the staged way, should COPY refuse them
            if not rows:
                return 0
            try:
                with transaction.atomic():
                    self._copy_units(rows)
            except IntegrityError:
                self.expect_new = False
            else:
                self._note_failed_rows(rows, report)
                report.created += len(rows)
                return len(rows)
        if not self.load(rows):
            return 0
        self.settle(report)
        return self.loaded

    def _copy_units(self, rows: list[tuple]) -> None:
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        columns, picks, constants = [], [], []
        for column, staged, value in _unit_columns(self.campaign, now):
            columns.append(column)
            if staged:
                picks.append(STAGED.index(staged))
            else:
                picks.append(len(STAGED) + len(constants))
                constants.append(value)
        # One C-level itemgetter per row over the row and the constants. A
        # time goes as its text, read by the column's type: psycopg's dumper of
        # an aware datetime costs more than the rest of a unit's row.
        constants = [v.isoformat() if isinstance(v, datetime) else v for v in constants]
        unit_row, constants = operator.itemgetter(*picks), tuple(constants)
        sql = f"COPY {self.units} ({', '.join(columns)}) FROM STDIN"
        # The raw cursor's COPY, with Django's error translation: a refused id
        # must surface as IntegrityError.
        with (
            connection.cursor() as cursor,
            connection.wrap_database_errors,
            cursor.cursor.copy(sql) as copy,
        ):
            for row in rows:
                copy.write_row(unit_row(row + constants))

    @staticmethod
    def _note_failed_rows(rows: list[tuple], report) -> None:
        """_note_failed for rows that were never staged."""
        state, uid, message = (
            STAGED.index("state"),
            STAGED.index("uid"),
            STAGED.index("error_message"),
        )
        failed = [row for row in rows if row[state] == UnitState.FAILED]
        if not failed:
            return
        report.failed += len(failed)
        report.note(
            [f"{row[uid]}: {row[message]}" for row in failed[: report.room()]], total=len(failed)
        )

    def settle(self, report) -> None:
        """Classify the staged rows into the report and add the new units."""
        with connection.cursor() as cursor:
            # The same id twice in this chunk: the first line wins.
            cursor.execute(
                f"DELETE FROM {self.table} WHERE EXISTS (SELECT 1 FROM {self.table} t "
                f"WHERE t.uid = {self.table}.uid AND t.line < {self.table}.line) "
                "RETURNING line, uid, source_path"
            )
            duplicates = cursor.fetchall()
            if self.tracking is not None:
                # An id an earlier chunk of this re-import met: its first copy
                # is the unit's row, as on a first import.
                duplicates += self.tracking.met_before(cursor, self.table)
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            if self.expect_new:
                # A fresh campaign's chunks are all new ids: no lookup, one plain
                # INSERT, which the unique index refuses if one id is not new.
                try:
                    with transaction.atomic():  # a savepoint: a refusal undoes it alone
                        created = self._insert(cursor, now)
                except IntegrityError:
                    self.expect_new = False
                else:
                    self._note_duplicates(report, duplicates)
                    self._note_failed(cursor, report)
                    report.created += created
                    return
            matched, earlier = self._match(cursor)
            duplicates += earlier
            self._note_duplicates(report, duplicates)
            existing = 0
            if matched > len(earlier):
                self._changed(cursor, report, now)
                self._now_failing(cursor, report, now)
                if self.tracking is not None and self.source == "records":
                    self.tracking.relocate(cursor, self.table)
                cursor.execute(f"DELETE FROM {self.table} WHERE unit_id IS NOT NULL")
                existing = max(cursor.rowcount, 0)
                report.existing += existing
            self._note_failed(cursor, report)
            try:
                with transaction.atomic():
                    created = self._insert(cursor, now)
            except IntegrityError:
                # Another import added some of these ids since the lookup.
                created = self._insert(cursor, now, on_conflict=True)
            report.created += created
            # Fewer than staged: those ids were another import's, meanwhile.
            report.existing += self.loaded - len(duplicates) - existing - created
            # Back to the plain INSERT once a chunk finds nothing it had.
            self.expect_new = matched == 0

    @contextmanager
    def _probing(self, cursor):
        """PostgreSQL joins a chunk to campaigns_unit by index probes in here.

        The table's statistics lag a bulk import (a fresh campaign's million
        units look like a thousand), and even when right the planner would
        rather hash the whole campaign than probe 50,000 ids, which is slower
        by far at a million units (bench/RESULTS.md, "Import at scale
        — `bench/import_scale.py`"). LOCAL: the transaction's rollback undoes it too.
        """
        if self.postgres:
            cursor.execute("SET LOCAL enable_hashjoin = off")
            cursor.execute("SET LOCAL enable_mergejoin = off")
        yield
        if self.postgres:
            cursor.execute("SET LOCAL enable_hashjoin TO DEFAULT")
            cursor.execute("SET LOCAL enable_mergejoin TO DEFAULT")

    def _fresh_statistics(self, cursor) -> None:
        """analyze_if_stale before the first lookup of this import.

        Right after a bulk import the statistics still say the campaign has a
        handful of units; the planner then reads the campaign's units through
        (campaign, id) and filters on uid, once per staged row, and a re-import
        of a million rows takes minutes (bench/RESULTS.md, "Fewer index entries,
        a statement-level campaign check, COPY into the units (2026-11-30)").
        With fresh statistics it probes the unique (campaign, uid) index.
        """
        if self.statistics_checked:
            return
        self.statistics_checked = True
        analyze_if_stale(cursor)

    def finish(self, report=None) -> None:
        """After the last chunk (PostgreSQL): analyze_if_stale, so that what
        comes next — a run picking its first group and weighing it by id, the
        pages — is planned for the campaign's real size, not for the handful
        of units the statistics knew before the import."""
        if self.tracking is not None and report is not None:
            self.tracking.look()
            with transaction.atomic():
                self.tracking.gone(report)
        if self.postgres:
            with connection.cursor() as cursor:
                analyze_if_stale(cursor)

    def _match(self, cursor) -> tuple[int, list[tuple]]:
        """Mark staged rows whose id the campaign has; drop (and return) those this
        import made in an earlier chunk. Returns (matched, earlier duplicates)."""
        s, pk = self.table, connection.ops.quote_name(Unit._meta.pk.column)
        unit = f"u.{_column('campaign')} = %s AND u.{_column('uid')} = {s}.uid"
        found = f"u.{pk}, u.{_column('state')}, u.{_column('sha256')}"
        if self.postgres:
            self._fresh_statistics(cursor)
            with self._probing(cursor):
                cursor.execute(
                    f"UPDATE {s} SET (unit_id, unit_state, unit_sha256) = ({found}) "
                    f"FROM {self.units} u WHERE {unit}",
                    [self.campaign.pk],
                )
                matched = max(cursor.rowcount, 0)  # before _probing's SETs reset it
        else:
            # SQLite would drive UPDATE … FROM from the campaign's units (a
            # million rows a chunk); correlated subqueries probe the index.
            cursor.execute(
                f"UPDATE {s} SET (unit_id, unit_state, unit_sha256) = "
                f"(SELECT {found} FROM {self.units} u WHERE {unit}) "
                f"WHERE EXISTS (SELECT 1 FROM {self.units} u WHERE {unit})",
                [self.campaign.pk, self.campaign.pk],
            )
            matched = max(cursor.rowcount, 0)
        if not matched:
            return 0, []
        cursor.execute(
            f"DELETE FROM {s} WHERE unit_id > %s RETURNING line, uid, source_path", [self.mark]
        )
        return matched, cursor.fetchall()

    @staticmethod
    def _note_duplicates(report, duplicates: list[tuple]) -> None:
        if not duplicates:
            return
        duplicates.sort()
        report.duplicates += len(duplicates)
        report.note(
            [
                f"{uid}: duplicate id in this import ({path}); kept the first"
                for _, uid, path in duplicates[: report.room()]
            ],
            total=len(duplicates),
        )

    def _note_failed(self, cursor, report) -> None:
        """Count the staged rows that become failed units, and keep what fits of their reasons."""
        cursor.execute(f"SELECT count(*) FROM {self.table} WHERE state = %s", [UnitState.FAILED])
        failed = cursor.fetchone()[0]
        if not failed:
            return
        report.failed += failed
        cursor.execute(
            f"SELECT uid, error_message FROM {self.table} WHERE state = %s ORDER BY line LIMIT %s",
            [UnitState.FAILED, report.room()],
        )
        report.note([f"{uid}: {message}" for uid, message in cursor.fetchall()], total=failed)

    def _changed(self, cursor, report, now) -> None:
        """Same id, other bytes: shown and kept apart, never mixed with the old results."""
        s, u = self.table, self.units
        cursor.execute(f"SELECT count(*) FROM {s} s WHERE {_differs('s')}")
        changed = cursor.fetchone()[0]
        if not changed:
            return
        report.changed += changed
        cursor.execute(
            f"SELECT uid, unit_state, unit_sha256, sha256 FROM {s} s WHERE {_differs('s')} "
            "ORDER BY line LIMIT %s",
            [report.room()],
        )
        report.note(
            [
                f"{uid}: input changed before processing; recorded anew"
                if state == UnitState.PENDING
                else f"{uid}: {changed_message(old, new)}"
                for uid, state, old, new in cursor.fetchall()
            ],
            total=changed,
        )
        pk, sha256, state = (
            connection.ops.quote_name(Unit._meta.pk.column),
            _column("sha256"),
            _column("state"),
        )
        # `u.sha256 = s.unit_sha256`: the unit as matched, not as changed since.
        same_unit = f"u.{pk} = s.unit_id AND u.{sha256} = s.unit_sha256 AND {_differs('s')}"
        untouchable = [UnitState.PENDING, *IN_FLIGHT]
        with self._probing(cursor):
            # Nothing was made from the old bytes yet: just record the new ones.
            cursor.execute(
                f"UPDATE {u} AS u SET {_column('size')} = s.size, "
                f"{_column('mtime_ns')} = s.mtime_ns, {sha256} = s.sha256, "
                f"{_column('updated_at')} = %s FROM {s} s "
                f"WHERE {same_unit} AND u.{state} = %s",
                [now, UnitState.PENDING],
            )
            # Results exist from the old bytes: the unit fails until resume
            # --retry-failed. Units a worker holds are left to the worker's own
            # check of the bytes it reads.
            cursor.execute(
                f"UPDATE {u} AS u SET {state} = %s, {_column('error_class')} = %s, "
                f"{_column('error_message')} = %s || substr(u.{sha256}, 1, 12) || %s "
                f"|| substr(s.sha256, 1, 12) || %s, {_column('updated_at')} = %s "
                f"FROM {s} s WHERE {same_unit} AND u.{state} NOT IN (%s, %s, %s)",
                [UnitState.FAILED, ErrorClass.INPUT_CHANGED, *_CHANGED, now, *untouchable],
            )

    def _now_failing(self, cursor, report, now) -> None:
        """Same id, an input that was good and now fails (a row's text emptied,
        a file made unreadable): reported as changed with the reason, and the
        unit fails with it, so that no stale output stands for what the input
        is now. Units a worker holds are left to its own check."""
        s, u = self.table, self.units
        now_failing = (
            "s.unit_id IS NOT NULL AND s.state = %s AND s.sha256 = '' AND s.unit_sha256 <> ''"
        )
        cursor.execute(f"SELECT count(*) FROM {s} s WHERE {now_failing}", [UnitState.FAILED])
        count = cursor.fetchone()[0]
        if not count:
            return
        report.changed += count
        cursor.execute(
            f"SELECT uid, error_message FROM {s} s WHERE {now_failing} ORDER BY line LIMIT %s",
            [UnitState.FAILED, report.room()],
        )
        report.note(
            [f"{uid}: {NOW_FAILS}{message}" for uid, message in cursor.fetchall()], total=count
        )
        pk, sha256, state = (
            connection.ops.quote_name(Unit._meta.pk.column),
            _column("sha256"),
            _column("state"),
        )
        marks = ", ".join(["%s"] * len(IN_FLIGHT))
        with self._probing(cursor):
            # The unit keeps its sha256: the input it was made from.
            cursor.execute(
                f"UPDATE {u} AS u SET {state} = %s, {_column('error_class')} = s.error_class, "
                f"{_column('error_message')} = %s || s.error_message, "
                f"{_column('updated_at')} = %s FROM {s} s "
                f"WHERE u.{pk} = s.unit_id AND u.{sha256} = s.unit_sha256 AND {now_failing} "
                f"AND u.{state} NOT IN ({marks})",
                [UnitState.FAILED, NOW_FAILS, now, UnitState.FAILED, *IN_FLIGHT],
            )

    def _insert(self, cursor, now, *, on_conflict: bool = False) -> int:
        """INSERT … SELECT of the staged rows in manifest order; returns how many.

        Plain unless on_conflict: every staged id was looked up (or the chunk
        is expected new), and ON CONFLICT's speculative insertion costs a third
        more on a table with this many indexes. A refused plain INSERT is
        undone by the caller's savepoint and the chunk looked at again.
        """
        columns, values, params = [], [], []
        for column, staged, value in _unit_columns(self.campaign, now):
            columns.append(column)
            if staged:
                values.append(f"s.{staged}")
            else:
                values.append("%s")
                params.append(value)
        # WHERE true: SQLite's parser needs it before an upsert's ON CONFLICT.
        sql = (
            f"INSERT INTO {self.units} ({', '.join(columns)}) "
            f"SELECT {', '.join(values)} FROM {self.table} s WHERE true ORDER BY s.line"
        )
        if on_conflict:
            sql += f" ON CONFLICT ({_column('campaign')}, {_column('uid')}) DO NOTHING"
        cursor.execute(sql, params)
        return max(cursor.rowcount, 0)
