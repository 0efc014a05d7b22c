"""Turning a folder or a manifest (CSV/JSONL) into units (docs/importing.md).

A unit's id is the manifest's id column or the normalised relative path.
Re-importing the same corpus creates nothing new. A row that cannot become a
working unit (missing file, path leaving the corpus folder, blank id, a bad
size or sha256) still becomes a unit, failed with a readable reason, so it is
easy to find.

A manifest row that carries `size` and `sha256` is *trusted*: both are
recorded without opening the file, which is what lets a million rows import
in seconds. The worker hashes the bytes it reads anyway and fails the unit
`input_changed` when they differ from the recorded sha256, so a wrong checksum
costs that unit, never a mixed result. Any other row (and every file of a
folder import) is stat-ed and hashed here: correct, but bound by the disk.

Rows stream through the database in chunks (campaigns/db/import_staging.py): memory stays
flat whatever the size of the corpus.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import queue
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from django.db import connection, transaction
from django.db.models import Count, Sum

from campaigns.db.import_staging import Staging
from campaigns.intake.manifests import FIELD_MAX, ManifestError, manifest_rows
from campaigns.intake.rows import (
    CATEGORY_MAX,
    PATH_MAX,
    UID_MAX,
    NotARegularFile,
    Row,
    file_identity,
    walk_folder,
)
from campaigns.models import Campaign, ErrorClass, Unit, UnitState
from campaigns.review.holdout import is_holdout
from campaigns.storage.paths import InputLocator, escape_path, resolve_input, storable

if TYPE_CHECKING:
    from campaigns.intake.inputs import ReadLimits
    from campaigns.intake.records import RecordColumns

#: Rows per staging round (one transaction each). PostgreSQL streams them
#: through COPY, so a chunk costs no Python memory; SQLite's chunk is a list
#: built before its write transaction opens, so the write lock is held for
#: the inserts only, not while files are hashed.
CHUNK_ROWS = {"postgresql": 50_000}
CHUNK_ROWS_DEFAULT = 10_000
#: (rows, batches) the manifest reader may run ahead of the database: one
#: PostgreSQL chunk, some 25 MB of row tuples.
READ_AHEAD = (1000, 50)
#: Problem lines an ImportReport keeps; the rest are counted. Failed units
#: keep their reason in the database, where the failures list finds them all.
PROBLEMS_KEPT = 1000
#: How often (rows) the progress callback hears from a running import.
PROGRESS_EVERY = 1000
#: Groups of identical inputs an ImportReport names, and ids named a group.
IDENTICAL_GROUPS_SHOWN = 5
IDENTICAL_IDS_SHOWN = 3
#: A row's text columns and their sizes, for the guard at the database's door.
_TEXT_COLUMNS = (("uid", UID_MAX), ("source_path", PATH_MAX), ("category", CATEGORY_MAX))
# A NUL in JSON text is the escape \u0000 after an even run of backslashes (or
# none): after an odd one it is the text "\u0000" (a Windows path, say), which
# PostgreSQL's jsonb takes.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

Progress = Callable[[int], object]
# For callers that reach the importer through services (the CLI's progress
# bar): services keep their signatures, the callback rides along here.
_progress: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "import_progress", default=None
)


@dataclass
class ImportReport:
    created: int = 0
    existing: int = 0
    failed: int = 0
    changed: int = 0
    duplicates: int = 0
    # A re-import: units whose row (records) or file (folder, manifest) is gone.
    removed: int = 0
    # The first PROBLEMS_KEPT lines, then (after close) one "… and N more".
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    # Identical inputs (the same sha256 under several ids) in the campaign
    # after the import: groups, the units in them, and a few groups' ids.
    identical_groups: int = 0
    identical_units: int = 0
    identical_examples: list[list[str]] = field(default_factory=list)
    # Sub-folders a folder import did not read, each with the reason (the
    # first PROBLEMS_KEPT; `skipped_count` counts them all). They are no units.
    skipped: list[str] = field(default_factory=list)
    skipped_count: int = 0

    def skip(self, line: str) -> None:
        if len(self.skipped) < PROBLEMS_KEPT:
            self.skipped.append(line)
        self.skipped_count += 1

    def room(self) -> int:
        return max(0, PROBLEMS_KEPT - len(self.problems))

    def note(self, lines: list[str], total: int | None = None) -> None:
        """Keep what fits of `lines`; `total` also counts lines not even fetched."""
        self.problems.extend(lines[: self.room()])
        self.problem_count += len(lines) if total is None else total

    def close(self) -> None:
        left_out = self.problem_count - len(self.problems)
        if left_out > 0:
            self.problems.append(
                f"… and {left_out} more (every failed unit keeps its reason: "
                "see the campaign's failures)"
            )

    def as_dict(self) -> dict:
        return {
            "created": self.created,
            "existing": self.existing,
            "failed": self.failed,
            "changed": self.changed,
            "duplicates": self.duplicates,
            "removed": self.removed,
            "problem_count": self.problem_count,
            "problems": self.problems,
            "identical_groups": self.identical_groups,
            "identical_units": self.identical_units,
            "identical_examples": self.identical_examples,
            "skipped_count": self.skipped_count,
            "skipped": self.skipped,
        }

    def skipped_lines(self, shown: int = 20) -> list[str]:
        """The sub-folders not read, for the command line and the page: a
        heading, up to `shown` lines, and how many more; [] when none."""
        if not self.skipped_count:
            return []
        n = self.skipped_count
        lines = [f"{n} sub-folder{'s' if n != 1 else ''} not read (no unit made from them):"]
        lines += self.skipped[:shown]
        if n > shown:
            lines.append(f"… and {n - shown} more")
        return lines

    def identical_summary(self) -> str:
        """The identical inputs in a sentence, for the command line and the page;
        "" when there are none."""
        if not self.identical_groups:
            return ""
        shown = "; ".join(
            " = ".join(ids) + (" = …" if len(ids) == IDENTICAL_IDS_SHOWN else "")
            for ids in self.identical_examples
        )
        if self.identical_groups > len(self.identical_examples):
            shown += "; …"
        groups = f"{self.identical_groups} group{'s' if self.identical_groups != 1 else ''}"
        return (
            f"{self.identical_units} units are identical inputs (the same sha256) in "
            f"{groups}: {shown}. Each is processed; the checkpoint's spot check shows "
            "one of each group."
        )


@contextmanager
def reporting_progress(callback: Progress):
    """Imports started inside this block call `callback(rows)` as rows go by."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)


def _hash_input(root: Path, row: Row) -> int | None:
    """Size and sha256 measured on the file (its mtime is returned), or the row failed."""
    try:
        path = resolve_input(root, row.source_path)
        row.size, mtime_ns, row.sha256 = file_identity(path)
        return mtime_ns
    except ValueError as exc:
        row.fail(str(exc))
    except FileNotFoundError:
        row.fail(f"input file not found: {row.source_path}", ErrorClass.INPUT_MISSING)
    except IsADirectoryError:
        row.fail(f"input is a folder, not a file: {row.source_path}")
    except NotARegularFile as exc:
        row.fail(f"input is not a regular file but {exc}: {row.source_path}")
    except OSError as exc:
        row.fail(f"cannot read input: {exc.strerror or exc}", ErrorClass.INPUT_UNREADABLE)
    return None


def _refuse_locator_name(row: Row) -> None:
    """Fail a file whose path reads as a row of a record file (`data.jsonl#17@…`,
    intake/records.py): every reader of inputs would read that row in its place."""
    from campaigns.intake.records import parse_locator

    if parse_locator(row.source_path) is not None:
        row.fail(
            f"{row.source_path}: its name reads as a row of a record file "
            "(FILE#ROW@PLACE:COLUMN); rename the file"
        )


def _staged_rows(campaign: Campaign, rows: Iterable[Row]) -> Iterator[tuple]:
    """Each row as the staging table's tuple, in import_staging.STAGED's order."""
    root = Path(campaign.input_root)
    # Lexical, no syscall: a trusted row's file is not touched at import. The
    # worker reads through the strict resolve_input, which also refuses a
    # symlink that leads out of the corpus.
    locate = InputLocator(root)
    share = campaign.holdout_share
    pending, failed = UnitState.PENDING.value, UnitState.FAILED.value
    files = not getattr(campaign, "records", None)  # a stand-in campaign may have none
    for row in rows:
        mtime_ns = None
        if files and "#" in row.source_path and not row.error_class:
            _refuse_locator_name(row)
        if not row.error_class:
            if row.sha256:
                # A relative path without ".." cannot leave the folder: the
                # full check (a few µs a row) only where it could.
                path = row.source_path
                if ".." in path or path.startswith("/"):
                    try:
                        locate(path)
                    except ValueError as exc:
                        row.fail(str(exc))
            else:
                mtime_ns = _hash_input(root, row)
        try:
            metadata = (
                json.dumps(row.metadata, ensure_ascii=False, allow_nan=False)
                if row.metadata
                else "{}"
            )
        except ValueError:  # 1e400 reads as infinity, which PostgreSQL's jsonb refuses
            row.fail(f"line {row.line}: a metadata value is not a finite number")
            metadata = "{}"
        if "\\u0000" in metadata and _JSON_NUL.search(metadata):
            # PostgreSQL's jsonb cannot hold a NUL character.
            row.fail(f"line {row.line}: a metadata value holds a NUL character")
            metadata = "{}"
        elif not storable(metadata):
            row.fail(f"line {row.line}: a metadata value holds a lone surrogate, not text")
            metadata = "{}"
        elif len(metadata) > FIELD_MAX:
            row.fail(
                f"line {row.line}: its metadata is {len(metadata):,} characters as JSON, "
                f"over the {FIELD_MAX:,} a row's metadata may hold"
            )
            metadata = "{}"
        _keep_storable(row)
        if row.error_class:
            size, sha256, mtime_ns, state = None, "", None, failed
        else:
            size, sha256, state = row.size, row.sha256, pending
        yield (
            row.line,
            row.uid,
            row.source_path,
            size,
            sha256,
            mtime_ns,
            row.category,
            metadata,
            is_holdout(row.uid, share),
            state,
            row.error_class,
            row.error_message,
        )


def _keep_storable(row: Row) -> None:
    """Every text of the row as a database column takes it: one with a NUL or
    a lone surrogate is written escaped (storage/paths.py), and fails its row.

    The readers refuse such text row by row already; this is the guard at the
    database's door, where one row's NUL would refuse a whole chunk on PostgreSQL.
    """
    if storable(f"{row.uid}{row.source_path}{row.category}{row.error_message}"):
        return  # every row but a broken one: one look at its text
    for name, limit in _TEXT_COLUMNS:
        text = getattr(row, name)
        if not storable(text):
            setattr(row, name, escape_path(text)[:limit])
            if not row.error_class:
                row.fail(
                    f"line {row.line}: the {name.replace('_', ' ')} holds a NUL character "
                    "or a lone surrogate, which no database column holds"
                )
    if not storable(row.error_message):
        row.error_message = escape_path(row.error_message)


def _counted(rows: Iterator[tuple], progress: Progress | None) -> Iterator[tuple]:
    if progress is None:
        yield from rows
        return
    seen = 0
    for row in rows:
        yield row
        seen += 1
        if seen == PROGRESS_EVERY:
            progress(seen)
            seen = 0
    if seen:
        progress(seen)


def _read_ahead(rows: Iterator[tuple], *, batch: int, batches: int) -> Iterator[tuple]:
    """`rows`, produced by a thread up to batch × batches rows ahead.

    Parsing (and hashing) runs while this thread waits on the database's
    INSERT of the previous chunk: on two cores the two overlap instead of
    taking turns. The lead is bounded, so memory stays flat. An exception in
    the reader (a manifest that is not UTF-8) is raised here, where it would
    have been without the thread.
    """
    ahead: queue.Queue = queue.Queue(maxsize=batches)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            while group := list(itertools.islice(rows, batch)):
                if not put(group):
                    return
            put(None)
        except BaseException as exc:  # handed over, raised by the consumer
            put(exc)

    reader = threading.Thread(target=read, name="import-reader", daemon=True)
    reader.start()
    try:
        while (group := ahead.get()) is not None:
            if isinstance(group, BaseException):
                raise group
            yield from group
    finally:
        stop.set()
        reader.join()


def _import_rows(
    campaign: Campaign,
    rows: Iterable[Row],
    progress: Progress | None,
    report: ImportReport | None = None,
    *,
    source: str,
) -> ImportReport:
    """`source`: "records", "folder" or "manifest", what the rows come from;
    a re-import reports the units whose input is gone (and a record
    campaign's units follow their rows' places)."""
    report = report or ImportReport()
    staged = _read_ahead(_staged_rows(campaign, rows), batch=READ_AHEAD[0], batches=READ_AHEAD[1])
    counted = _counted(staged, progress or _progress.get())
    streams = connection.vendor == "postgresql"
    size = CHUNK_ROWS.get(connection.vendor, CHUNK_ROWS_DEFAULT)
    with closing(staged), Staging(campaign=campaign, source=source) as staging:
        while True:
            chunk = itertools.islice(counted, size)
            if not streams:
                chunk = list(chunk)
                if not chunk:
                    break
            # One transaction per chunk: progress is durable and visible, and
            # none holds a million rows of locks and WAL.
            with transaction.atomic():
                if not staging.add(chunk, report):
                    break
        staging.finish(report)
    report.close()
    _note_identical(campaign, report)
    return report


def _note_identical(campaign: Campaign, report: ImportReport) -> None:
    """Count the campaign's identical inputs into the report, with a few examples.

    One GROUP BY over the campaign's checksums (the database sorts or hashes
    it, no Python memory), then a few ids of the largest groups.
    """
    units = Unit.objects.filter(campaign=campaign).exclude(sha256="")
    groups = units.values("sha256").annotate(n=Count("pk")).filter(n__gt=1).order_by()
    totals = groups.aggregate(groups=Count("sha256"), units=Sum("n"))
    report.identical_groups = totals["groups"] or 0
    report.identical_units = totals["units"] or 0
    if not report.identical_groups:
        return
    largest = list(
        groups.order_by("-n", "sha256").values_list("sha256", flat=True)[:IDENTICAL_GROUPS_SHOWN]
    )
    examples: dict[str, list[str]] = {sha256: [] for sha256 in largest}
    # One pass over the members of these groups, left as soon as each has its
    # ids: a group of a hundred thousand empty files is never read whole.
    members = units.filter(sha256__in=largest).order_by("pk").values_list("sha256", "uid")
    wanted = len(largest) * IDENTICAL_IDS_SHOWN
    for sha256, uid in members.iterator(chunk_size=1000):
        if len(examples[sha256]) < IDENTICAL_IDS_SHOWN:
            examples[sha256].append(uid)
            wanted -= 1
            if not wanted:
                break
    report.identical_examples = [examples[sha256] for sha256 in largest]


def import_folder(
    campaign: Campaign, *, progress: Progress | None = None, folder_categories: bool = True
) -> ImportReport:
    """Import the files under the campaign's input root. `folder_categories`:
    each unit's category is its top folder (files at the top level have none)."""
    root = Path(campaign.input_root)
    if not root.is_dir():
        raise ManifestError(f"input folder not found: {root}")
    report = ImportReport()
    rows = walk_folder(root, folder_categories=folder_categories, skipped=report.skip)
    return _import_rows(campaign, rows, progress, report, source="folder")


def import_manifest(
    campaign: Campaign,
    manifest: Path,
    *,
    progress: Progress | None = None,
    folder_categories: bool = True,
) -> ImportReport:
    """Import the rows of a CSV or JSONL manifest. `folder_categories`: a row
    without a category takes its path's top folder."""
    if not manifest.is_file():
        raise ManifestError(f"manifest not found: {manifest}")
    rows = manifest_rows(manifest, folder_categories=folder_categories)
    return _import_rows(campaign, rows, progress, source="manifest")


def import_records(campaign: Campaign, *, progress: Progress | None = None) -> ImportReport:
    """Import the rows of the campaign's record files (intake/records.py): new
    ids added, a changed row's text recorded anew or failed `input_changed` as
    a file's, every row's place brought up to date, and the units whose row
    is gone reported (docs/importing.md, "Records")."""
    from campaigns.intake.records import RecordColumns, record_files, record_rows

    root = Path(campaign.input_root)
    config = campaign.records or {}
    files = record_files(root, config.get("source", "."))
    columns = RecordColumns.from_dict(config["columns"])
    report = ImportReport()
    rows = record_rows(root, files, columns)
    report = _import_rows(campaign, rows, progress, report, source="records")
    if columns.id is None and report.changed:
        # Each changed row was found by its sha256 and fails until retried;
        # said first, because a whole run of them has one cause.
        report.problems.insert(0, SHIFTED_ROWS.format(changed=report.changed))
        report.problem_count += 1
    return report


#: The first line of a no-id-column record re-import's report with changed rows.
SHIFTED_ROWS = (
    "{changed} rows changed: without an id column a row's id is its place (FILE:LINE), "
    "so rows inserted or removed give every later place another row; each is failed "
    "input_changed, never given the output of the row that was there (create the "
    "campaign with --id-column to keep ids with their rows)"
)


@dataclass
class Preview:
    total: int = 0
    first: list[dict] = field(default_factory=list)
    failing: list[dict] = field(default_factory=list)
    checked: int = 0
    # Sub-folders the import would not read, with the reason (the first `show`).
    skipped: list[str] = field(default_factory=list)
    # False when counting stopped at `count` rows (records): `total` is a floor.
    counted_all: bool = True


def preview(
    *,
    root: Path,
    manifest: Path | None,
    check_input,
    params: dict,
    show: int = 20,
    check: int = 200,
    folder_categories: bool = True,
    limits: ReadLimits | None = None,
    records: tuple[list[str], RecordColumns] | None = None,
    count: int | None = None,
) -> Preview:
    """What an import would make, without writing anything: the first units, and
    which of the first `check` inputs would fail and why (each read under
    `limits`, its processor's `ProcessorSpec.input_limits`).

    records: the record files under `root` and their columns, for a record
    campaign (intake/records.py). count: rows counted at most, so that the
    preview of a file of millions of rows reads only its start."""
    from campaigns.intake.inputs import WHOLE, InputError, read_bytes
    from campaigns.intake.records import record_rows

    result = Preview()

    def skip(line: str) -> None:
        if len(result.skipped) < show:
            result.skipped.append(line)

    rows = (
        record_rows(root, *records)
        if records is not None
        else manifest_rows(manifest, folder_categories=folder_categories)
        if manifest is not None
        else walk_folder(
            root,
            folder_categories=folder_categories,
            skipped=skip,
        )
    )
    for row in rows:
        if count is not None and result.total >= count:
            result.counted_all = False
            break
        result.total += 1
        if len(result.first) < show:
            result.first.append(
                {"id": row.uid, "source_path": row.source_path, "category": row.category}
            )
        if result.checked >= check:
            continue
        result.checked += 1
        reason = row.error_message
        if not reason:
            try:
                data = read_bytes(root, row.source_path, limits=limits or WHOLE)
                if check_input is not None:
                    check_input(data, params)
            except InputError as exc:
                reason = exc.message
        if reason:
            result.failing.append({"id": row.uid, "reason": reason})
    return result
