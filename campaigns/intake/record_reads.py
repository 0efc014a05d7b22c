"""Reading one record unit's text at the place its import recorded
(campaigns/intake/records.py), for `inputs.read_bytes`.

JSONL and CSV: one `pread` of the line. A .gz file has no random access: a
few decompressing cursors a file go forward from where the last read stopped
(a read behind every cursor starts one again from the file's start), so read
in import order a file costs one pass. Parquet: the row group's text column,
decoded once and kept while reads hit it (RECORD_CACHE_BYTES over all kept
groups). Arrow: the file memory-mapped, its record batches read without
copying. Caches are per process, keyed by the file's path, size and mtime,
so a changed file is read anew.

A record no longer where the import found it (the file was rewritten) fails
`input_changed`; its text differing is found by the sha256 check every
reader of an input makes.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

from campaigns.intake.inputs import (
    InputBytes,
    InputError,
    ReadLimits,
    _input_bytes,
    _refuse_over,
    input_fd,
)
from campaigns.intake.manifests import BadLine
from campaigns.intake.records import (
    SNIFF_BYTES,
    Located,
    open_arrow,
    open_lines,
    parse_csv_record,
    parse_json_line,
    record_uid,
    sniff_dialect,
)
from campaigns.models import ErrorClass
from campaigns.storage.paths import resolve_input

#: Decoded Parquet text columns a process keeps, over all its files (at least one group).
RECORD_CACHE_BYTES = 256 << 20
#: Decompressing cursors a process keeps on one .gz file.
GZIP_CURSORS = 4
#: Record files a process keeps open (Arrow maps, CSV headers, gz cursors).
FILES_KEPT = 16

_lock = threading.Lock()
_groups: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
_files: OrderedDict[tuple, object] = OrderedDict()


class RecordMoved(Exception):
    """The record is not where its import found it."""


def read_record(root: Path, located: Located, limits: ReadLimits) -> InputBytes:
    """The record's text in UTF-8, as `read_bytes` reads a file: only as far as
    `limits` keep, the whole text's sha256 taken where they ask for a digest."""
    return _as_input(_value(root, located), located, limits)


def read_records(
    root: Path, places: list[Located], limits: ReadLimits, real_root: str | None = None
) -> list[InputBytes | InputError]:
    """Many records' texts (a batch's), each as `read_record` reads it, or the
    InputError that read would raise.

    Each record file is opened and checked once for all its rows, and its
    rows read through that one descriptor in file order: opening and checking
    the file again for every row was most of a record unit's read
    (bench/RESULTS.md, "Host work a unit (2026-12-03)")."""
    results: list[InputBytes | InputError | None] = [None] * len(places)
    by_file: dict[str, list[int]] = {}
    for index, located in enumerate(places):
        by_file.setdefault(located.file, []).append(index)
    for file, indexes in by_file.items():
        try:
            fd = input_fd(root, file, real_root)
        except InputError as exc:
            for index in indexes:
                results[index] = exc
            continue
        try:
            path, key = _identity(root, file, fd)
            for index in sorted(indexes, key=lambda i: (places[i].a, places[i].b)):
                located = places[index]
                try:
                    results[index] = _as_input(_text_at(path, key, located, fd), located, limits)
                except InputError as exc:
                    results[index] = exc
        finally:
            os.close(fd)
    return results  # type: ignore[return-value]


def _as_input(text: object, located: Located, limits: ReadLimits) -> InputBytes:
    if text is None:
        raise InputError(ErrorClass.INPUT_INVALID, f"row {located.row} has no text")
    if not isinstance(text, str):
        raise InputError(ErrorClass.INPUT_INVALID, f"row {located.row} holds no text")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(ErrorClass.INPUT_INVALID, "the text holds a lone surrogate") from None
    _refuse_over(len(data), limits)
    if limits.keep is None or len(data) <= limits.keep:
        return _input_bytes(data, len(data))
    digest = hashlib.sha256(data).hexdigest() if limits.digest else None
    return _input_bytes(data[: limits.keep], len(data), digest)


def _identity(root: Path, file: str, fd: int) -> tuple[Path, tuple]:
    """The opened record file's path and its cache key (path, size, mtime)."""
    st = os.fstat(fd)
    path = resolve_input(root, file)
    return path, (str(path), st.st_size, st.st_mtime_ns)


def _value(root: Path, located: Located, column: str | None = None):
    """The value of the record's text column (or of `column`) at its place."""
    # Opened by the rules every input is (inside the corpus, a regular file,
    # never waited on): a FIFO in the records file's place is refused, not read.
    fd = input_fd(root, located.file)
    try:
        path, key = _identity(root, located.file, fd)
        at = located if column is None else dataclasses.replace(located, column=column)
        return _text_at(path, key, at, fd)
    finally:
        os.close(fd)


def _text_at(path: Path, key: tuple, located: Located, fd: int | None = None):
    """The value at the record's place; `fd`: the file opened and checked."""
    try:
        if located.kind == "line" and fd is not None:
            return _line_value(path, key, located, fd)
        return _READERS[located.kind](path, key, located)
    except RecordMoved as exc:
        raise InputError(
            ErrorClass.INPUT_CHANGED,
            f"{located.file} changed since import: row {located.row} is not at its "
            f"recorded place ({exc}); `campaign import` finds each row again",
        ) from None
    except OSError as exc:
        raise InputError(ErrorClass.INPUT_UNREADABLE, f"cannot read input: {exc}") from None


def _kept(key: tuple, make):
    """The process's object for a file (an Arrow reader, a CSV header), made once."""
    with _lock:
        if key in _files:
            _files.move_to_end(key)
            return _files[key]
    made = make()
    with _lock:
        _files[key] = made
        while len(_files) > FILES_KEPT:
            _files.popitem(last=False)
    return made


def _line(path: Path, key: tuple, located: Located, fd: int | None = None) -> bytes:
    if located.b == 0:
        raise RecordMoved("a line too long to read")
    if path.name.lower().endswith(".gz"):
        data = _gzip_read(path, key, located.a, located.b)
    elif fd is not None:
        data = os.pread(fd, located.b, located.a)
    else:
        with open(path, "rb") as fh:
            data = os.pread(fh.fileno(), located.b, located.a)
    if len(data) != located.b:
        raise RecordMoved("the file ends before it")
    return data


def _jsonl_text(path: Path, key: tuple, located: Located, fd: int | None = None):
    record = parse_json_line(_line(path, key, located, fd))
    if isinstance(record, BadLine):
        raise RecordMoved(record.reason)
    if located.column not in record:
        raise RecordMoved(f"no column {located.column!r} there")
    return record[located.column]


def _csv_text(path: Path, key: tuple, located: Located, fd: int | None = None):
    def header():
        with open_lines(path) as fh:
            dialect = sniff_dialect(fh.read(SNIFF_BYTES))
        with open_lines(path) as fh:
            first = fh.readline().removeprefix(b"\xef\xbb\xbf")
        try:
            return dialect, parse_csv_record(first, dialect)
        except (csv.Error, UnicodeDecodeError):
            return dialect, []

    dialect, names = _kept(("csv", *key), header)
    if located.column not in names:
        raise RecordMoved(f"no column {located.column!r} in the header")
    try:
        fields = parse_csv_record(_line(path, key, located, fd), dialect)
    except (csv.Error, UnicodeDecodeError) as exc:
        raise RecordMoved(f"not a CSV record there: {exc}") from None
    if len(fields) != len(names):
        raise RecordMoved("not a record of the header's fields there")
    return fields[names.index(located.column)]


def _parquet_text(path: Path, key: tuple, located: Located):
    import pyarrow.parquet as pq

    group_key = (*key, located.a, located.column)
    with _lock:
        kept = _groups.get(group_key)
        if kept is not None:
            _groups.move_to_end(group_key)
    if kept is None:
        try:
            with pq.ParquetFile(path) as parquet:
                table = parquet.read_row_group(located.a, columns=[located.column])
        except (IndexError, KeyError) as exc:
            raise RecordMoved(f"no row group {located.a}: {exc}") from None
        except Exception as exc:  # ArrowInvalid and kin: not Parquet any more
            raise RecordMoved(str(exc)) from None
        column = table.column(0).combine_chunks()
        kept = (column, column.nbytes)
        with _lock:
            _groups[group_key] = kept
            held = sum(size for _, size in _groups.values())
            while len(_groups) > 1 and held > RECORD_CACHE_BYTES:
                _, (_, size) = _groups.popitem(last=False)
                held -= size
    column = kept[0]
    if located.b >= len(column):  # type: ignore[arg-type]
        raise RecordMoved(f"row group {located.a} has no row {located.b}")
    return column[located.b].as_py()  # type: ignore[index]


def _arrow_text(path: Path, key: tuple, located: Located):
    def batches():
        try:
            reader = open_arrow(path)
            if hasattr(reader, "get_batch"):
                return [reader.get_batch(i) for i in range(reader.num_record_batches)]
            return list(reader)  # zero-copy slices of the map
        except Exception as exc:  # ArrowInvalid and kin
            return RecordMoved(str(exc))

    kept = _kept(("arrow", *key), batches)
    if isinstance(kept, RecordMoved):
        raise kept
    if located.a >= len(kept):
        raise RecordMoved(f"no record batch {located.a}")
    batch = kept[located.a]
    if located.column not in batch.schema.names or located.b >= batch.num_rows:
        raise RecordMoved(f"no row {located.b} of column {located.column!r} in batch {located.a}")
    return batch.column(located.column)[located.b].as_py()


def _gzip_read(path: Path, key: tuple, offset: int, length: int) -> bytes:
    cursors: list = _kept(("gz", *key), list)
    with _lock:
        ahead = [c for c in cursors if c.tell() <= offset]
        cursor = max(ahead, key=lambda c: c.tell()) if ahead else None
        if cursor is not None:
            cursors.remove(cursor)
    if cursor is None:
        cursor = open_lines(path)
    try:
        cursor.seek(offset)
        data = cursor.read(length)
    except BaseException:
        cursor.close()
        raise
    with _lock:
        cursors.append(cursor)
        if len(cursors) > GZIP_CURSORS:
            oldest = min(cursors, key=lambda c: c.tell())
            cursors.remove(oldest)
            oldest.close()
    return data


def _line_value(path: Path, key: tuple, located: Located, fd: int):
    """A JSONL or CSV record's value, its line read through `fd`."""
    reader = _csv_text if path.name.lower().endswith(".csv") else _jsonl_text
    return reader(path, key, located, fd)


_READERS = {
    "line": lambda path, key, located: (
        _csv_text if path.name.lower().endswith(".csv") else _jsonl_text
    )(path, key, located),
    "group": _parquet_text,
    "batch": _arrow_text,
}


def record_identity(
    root: Path, located: Located, uid: str | None = None, id_column: str | None = None
) -> tuple[int, str]:
    """The record's text size and sha256 as it reads now (InputError if it cannot):
    what `resume --retry-failed` records before it runs an `input_changed` unit again.

    With `id_column`, the row at the place must hold the unit's id `uid` there
    (a rewritten file puts another row at an old place): else `input_changed`,
    and the other row's text is never taken for this unit's."""
    if id_column:
        found = record_uid(_value(root, located, id_column))
        if found != uid:
            raise InputError(
                ErrorClass.INPUT_CHANGED,
                f"{located.file} changed since import: the row at this unit's recorded "
                f"place (row {located.row}) has the id {found[:80]!r}, not this unit's",
            )
    data = read_record(root, located, ReadLimits())
    return data.size, data.sha256 or ""


def check_record(
    root: Path, real_root: str | None, located: Located, sha256: str, deep: bool
) -> tuple[str, str] | None:
    """verify's look at a record unit's input: None when all is well, or
    (error class, reason). The records file is opened by the rules every input
    is (intake/inputs.py `input_fd`); `deep` reads the row and compares its
    sha256 with the import's."""
    try:
        os.close(input_fd(root, located.file, real_root))
    except InputError as exc:
        return exc.error_class, exc.message
    if not (deep and sha256):
        return None
    try:
        size, now = record_identity(root, located)
    except InputError as exc:
        return exc.error_class, exc.message
    if now != sha256:
        return ErrorClass.INPUT_CHANGED, "the row's text changed since import (sha256 differs)"
    return None
