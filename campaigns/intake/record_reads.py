"""Reading one record unit's text at the place its import recorded
(campaigns/intake/records.py), for `inputs.read_bytes`.

Every read goes through the descriptor `input_fd` opened and checked (inside
the corpus, a regular file), never the path again. JSONL and CSV: one `pread`
of the line. A .gz file has no random access: its `GzipIndex`
(intake/gzip_index.py) starts a read from the nearest cursor or seek point
before it, so rows read in file order cost one pass and any other order a
bounded stretch each. Parquet: the row group's text column, decoded once
(one thread decodes a group, the others wanting it wait) and kept while
reads hit it; a group of more than SLICE_ROWS rows (or GROUP_WHOLE_BYTES of
text) in slices of SLICE_ROWS rows, read forward through the group. Arrow:
the file memory-mapped, a record batch read when a row of it is wanted (a
compressed one decompressed then, alone). Decoded groups and batches share
RECORD_CACHE_BYTES; at most DECODES_AT_ONCE are decoded at once. Caches are
per process, keyed by the file's device, inode, size and mtime, so a changed
file is read anew.

A record no longer where the import found it (the file was rewritten) fails
`input_changed`; its text differing is found by the sha256 check every
reader of an input makes.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from campaigns.intake.gzip_index import GzipError, GzipIndex
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
    BATCH_ROWS,
    HEADER_MAX,
    SNIFF_BYTES,
    HeaderTooLong,
    Located,
    csv_header,
    parse_csv_record,
    parse_json_line,
    record_input,
    record_uid,
    sniff_dialect,
)
from campaigns.models import ErrorClass

#: Decoded Parquet text columns and Arrow record batches a process keeps, over
#: all its files (at least one).
RECORD_CACHE_BYTES = 256 << 20
#: Parquet row groups or Arrow batches a process decodes at once: memory in
#: use is the cache and these (the same one is never decoded twice at once).
DECODES_AT_ONCE = 2
#: A Parquet row group is decoded whole (its text column, for every read that
#: wants a row of it) up to these rows and this size of its text column as the
#: file's footer gives it (uncompressed); a larger one is read in slices of
#: SLICE_ROWS rows, so the memory a read holds does not grow with the group
#: (writers' defaults reach a million rows a group). A slice holds as many rows
#: as the import reads at a time (records.BATCH_ROWS).
SLICE_ROWS = BATCH_ROWS
GROUP_WHOLE_BYTES = 32 << 20
#: Passes over large groups a process keeps going at once, over all its files:
#: a pass holds about one slice's decoded text besides the cache (pyarrow's
#: reader keeps its buffers for the next batch), so they are few. Two serve
#: planning's two weighing threads, or a worker and its prefetch. That many a
#: column read at once: rows carrying parameters read their columns beside
#: the text's (`_record_at`), each pass going forward with the others.
STREAMS_KEPT = 2
#: Record files a process keeps open (Arrow maps, CSV headers, gz indexes), and
#: as many again for each further column a record's input is read from.
FILES_KEPT = 16

_lock = threading.Lock()
_decoded: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
_decoding: dict[tuple, threading.Event] = {}
_decodes = threading.BoundedSemaphore(DECODES_AT_ONCE)
# The kept passes over large groups, least recently used first (id → its cursor
# and pass). Taken while a cursor's own lock is held; other cursors' locks are
# only tried under it, never waited for.
_streams_lock = threading.Lock()
_streams: OrderedDict[int, tuple[_GroupCursor, _Stream]] = OrderedDict()
_files: OrderedDict[tuple, object] = OrderedDict()


class RecordMoved(Exception):
    """The record is not where its import found it."""


@dataclasses.dataclass(frozen=True)
class _Opened:
    """A records file as `input_fd` opened and checked it: every read of the
    record goes through this descriptor (or a duplicate of it), never the path
    again. `key` tells the very file (device, inode, size, mtime): what a
    process keeps of a file is kept under it, so a replaced file is read anew."""

    fd: int
    name: str
    key: tuple


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
            opened = _opened(fd, file)
            for index in sorted(indexes, key=lambda i: (places[i].a, places[i].b)):
                located = places[index]
                try:
                    results[index] = _as_input(_record_at(opened, located), located, limits)
                except InputError as exc:
                    results[index] = exc
        except OSError as exc:  # fstat of the file just opened
            for index in indexes:
                results[index] = InputError(
                    ErrorClass.INPUT_UNREADABLE, f"cannot read input: {exc}"
                )
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


def _opened(fd: int, file: str) -> _Opened:
    st = os.fstat(fd)
    return _Opened(fd, file, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


def _value(root: Path, located: Located, column: str | None = None):
    """The value of the record's text column (or of `column`) at its place."""
    # Opened by the rules every input is (inside the corpus, a regular file,
    # never waited on): a FIFO in the records file's place is refused, not read.
    fd = input_fd(root, located.file)
    try:
        try:
            opened = _opened(fd, located.file)
        except OSError as exc:
            raise InputError(ErrorClass.INPUT_UNREADABLE, f"cannot read input: {exc}") from None
        if column is None:
            return _record_at(opened, located)
        return _text_at(opened, dataclasses.replace(located, column=column, params=()))
    finally:
        os.close(fd)


def _record_at(opened: _Opened, located: Located):
    """The record's input: its text, or where the row carries parameters
    (records.RecordColumns.params) `record_input`'s object of the text and
    their values, read at the same place."""
    text = _text_at(opened, located)
    if not located.params or not isinstance(text, str):
        return text
    values = {
        name: _text_at(
            opened, dataclasses.replace(located, column=column, params=(), optional=True)
        )
        for name, column in located.params
    }
    try:
        return record_input(text, values)
    except ValueError as exc:  # refused at import alike: this row was never queued
        raise InputError(ErrorClass.INPUT_INVALID, str(exc)) from None


def _text_at(opened: _Opened, located: Located):
    """The value at the record's place, read through the opened file."""
    try:
        return _READERS[located.kind](opened, located)
    except RecordMoved as exc:
        error = InputError(
            ErrorClass.INPUT_CHANGED,
            f"{located.file} changed since import: row {located.row} is not at its "
            f"recorded place ({exc}); `campaign import` finds each row again",
        )
    except OSError as exc:
        error = InputError(ErrorClass.INPUT_UNREADABLE, f"cannot read input: {exc}")
    # Raised outside the handler: no exception context, so a batch's kept
    # errors hold no reader's frames (nor the cursors and files in them).
    raise error


def _kept(key: tuple, make):
    """The process's object for a file (an Arrow reader, a CSV header), made once."""
    with _lock:
        if key in _files:
            _files.move_to_end(key)
            return _files[key]
    made = make()
    with _lock:
        made = _files.setdefault(key, made)
        _files.move_to_end(key)
        while len(_files) > FILES_KEPT * _columns_kept(_files.values()):
            _files.popitem(last=False)
    return made


def _decoded_once(key: tuple, decode):
    """What `decode()` makes (a Parquet group's column, an Arrow batch), kept
    while RECORD_CACHE_BYTES allow: decoded by one thread at a time, the others
    wanting it wait for it, and at most DECODES_AT_ONCE decodes run at once."""
    while True:
        with _lock:
            kept = _decoded.get(key)
            if kept is not None:
                _decoded.move_to_end(key)
                return kept[0]
            waiting = _decoding.get(key)
            if waiting is None:
                _decoding[key] = threading.Event()
        if waiting is None:
            break
        waiting.wait()
    try:
        with _decodes:
            value, size = decode()
        with _lock:
            _decoded[key] = (value, size)
            held = sum(size for _, size in _decoded.values())
            while len(_decoded) > 1 and held > RECORD_CACHE_BYTES:
                _, (_, dropped) = _decoded.popitem(last=False)
                held -= dropped
        return value
    finally:
        with _lock:
            _decoding.pop(key).set()


def _columns_kept(kept) -> int:
    """How many columns the kept passes over large groups read (a row carrying
    parameters reads its columns beside its text's): the bounds on what a
    process keeps grow with them, so that each column's pass goes on."""
    return max(1, len({k._column for k in kept if isinstance(k, _GroupCursor)}))


def _gzip(opened: _Opened) -> GzipIndex:
    return _kept(("gz", *opened.key), lambda: GzipIndex(os.dup(opened.fd), opened.key[2]))


def _pread(opened: _Opened, offset: int, length: int) -> bytes:
    if opened.name.lower().endswith(".gz"):
        try:
            return _gzip(opened).read(offset, length)
        except GzipError as exc:
            raise RecordMoved(str(exc)) from None
    return os.pread(opened.fd, length, offset)


def _line(opened: _Opened, located: Located) -> bytes:
    if located.b == 0:
        raise RecordMoved("a line too long to read")
    data = _pread(opened, located.a, located.b)
    if len(data) != located.b:
        raise RecordMoved("the file ends before it")
    return data


def _jsonl_text(opened: _Opened, located: Located):
    record = parse_json_line(_line(opened, located))
    if isinstance(record, BadLine):
        raise RecordMoved(record.reason)
    if located.column not in record:
        if located.optional:  # a JSONL record without a parameter's key: none given
            return None
        raise RecordMoved(f"no column {located.column!r} there")
    return record[located.column]


def _csv_text(opened: _Opened, located: Located):
    def header():
        head = _pread(opened, 0, max(SNIFF_BYTES, HEADER_MAX + 1))
        try:
            first = csv_header(io.BytesIO(head))
        except HeaderTooLong as exc:
            return RecordMoved(str(exc))
        try:
            dialect = sniff_dialect(head[:SNIFF_BYTES])
            return dialect, parse_csv_record(first, dialect)
        except (csv.Error, UnicodeDecodeError):
            return dialect, []

    kept = _kept(("csv", *opened.key), header)
    if isinstance(kept, RecordMoved):
        # A new one: an exception raised again keeps every earlier raise's frames.
        raise RecordMoved(str(kept))
    dialect, names = kept
    if located.column not in names:
        raise RecordMoved(f"no column {located.column!r} in the header")
    try:
        fields = parse_csv_record(_line(opened, located), dialect)
    except (csv.Error, UnicodeDecodeError) as exc:
        raise RecordMoved(f"not a CSV record there: {exc}") from None
    if len(fields) != len(names):
        raise RecordMoved("not a record of the header's fields there")
    return fields[names.index(located.column)]


def _parquet_text(opened: _Opened, located: Located):
    import pyarrow.parquet as pq

    shape = _group_shape(opened, located)
    if shape is not None and _sliced(*shape):
        return _parquet_slice_text(opened, located, rows=shape[0])

    def decode():
        try:
            with os.fdopen(os.dup(opened.fd), "rb") as fh, pq.ParquetFile(fh) as parquet:
                table = parquet.read_row_group(located.a, columns=[located.column])
        except (IndexError, KeyError) as exc:
            raise RecordMoved(f"no row group {located.a}: {exc}") from None
        except (OSError, MemoryError):  # the disk or the memory, not the file's rows
            raise
        except Exception as exc:  # ArrowInvalid and kin: not Parquet any more
            raise RecordMoved(str(exc)) from None
        if located.column not in table.column_names:  # pyarrow reads no column then
            raise RecordMoved(f"no column {located.column!r} in row group {located.a}")
        column = table.column(located.column).combine_chunks()
        return column, column.nbytes

    column = _decoded_once(("group", *opened.key, located.a, located.column), decode)
    if located.b >= len(column):
        raise RecordMoved(f"row group {located.a} has no row {located.b}")
    return column[located.b].as_py()


def _sliced(rows: int, column_bytes: int) -> bool:
    """Whether a row group is read in slices of SLICE_ROWS rows rather than whole."""
    return rows > SLICE_ROWS or column_bytes > GROUP_WHOLE_BYTES


def _group_shape(opened: _Opened, located: Located) -> tuple[int, int] | None:
    """(rows, the text column's uncompressed bytes) of the record's row group, from
    the file's footer (read once a file, each group's shape looked up once: every
    row read asks); None where the footer does not say, and the group is read
    whole, which finds what is wrong."""
    import pyarrow.parquet as pq

    def footer():
        try:
            with os.fdopen(os.dup(opened.fd), "rb") as fh:
                return pq.ParquetFile(fh).metadata, {}
        except OSError:
            raise
        except Exception as exc:  # ArrowInvalid and kin: not Parquet any more
            return RecordMoved(str(exc))

    kept = _kept(("parquet", *opened.key), footer)
    if isinstance(kept, RecordMoved):
        return None
    metadata, shapes = kept
    key = (located.a, located.column)
    if key not in shapes:
        shapes[key] = _shape_in(metadata, *key)
    return shapes[key]


def _shape_in(metadata, group_index: int, column: str) -> tuple[int, int] | None:
    if not 0 <= group_index < metadata.num_row_groups:
        return None
    group = metadata.row_group(group_index)
    # A nested column (a list of stop strings) is stored as its leaves,
    # `stop.list.element`: their sizes add up to the column's.
    leaves = [
        group.column(i)
        for i in range(group.num_columns)
        if group.column(i).path_in_schema == column
        or group.column(i).path_in_schema.startswith(column + ".")
    ]
    if not leaves:
        return None
    return group.num_rows, sum(chunk.total_uncompressed_size for chunk in leaves)


class _PreadFile(io.RawIOBase):
    """A read-only file over a descriptor with a position of its own (os.pread):
    streams kept across calls share no file offset with any other reader of
    the same open file, as duplicated descriptors would. Closing it leaves the
    descriptor to its owner."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = os.pread(self._fd, len(buffer), self._at)
        buffer[: len(data)] = data
        self._at += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at}.get(whence)
        if base is None:
            base = os.fstat(self._fd).st_size
        self._at = base + offset
        return self._at

    def tell(self) -> int:
        return self._at


@dataclasses.dataclass
class _Stream:
    """A pass over one row group's column: the rows it hands over next."""

    batches: Iterator
    row: int = 0  # the group's row the stream hands over next
    held: Any = None  # a batch's rows not handed over yet (from `row` on): an Arrow array


class _GroupCursor:
    """One row group's text column read forward through buffered streams,
    handed over SLICE_ROWS rows at a time: a group too large to decode whole
    (a million rows, gigabytes of text) is never held whole, only the slices
    asked for. Rows read in file order cost one pass. Readers going forward
    through different parts of the group at once (planning's weighing threads,
    a worker and its prefetch) each keep a stream of their own, STREAMS_KEPT
    in the process at most; a slice before every stream's place starts a new
    pass from the group's start. A slice is cut from the streams' record
    batches by row number: pyarrow hands over smaller batches where a batch's
    text would pass 2 GiB."""

    def __init__(self, fd: int, group: int, column: str):
        self._fd, self._group, self._column = fd, group, column
        self._lock = threading.Lock()
        self._streams: list[_Stream] = []

    def __del__(self) -> None:  # dropped from the files kept: its descriptor goes too
        os.close(self._fd)

    def _stream_for(self, first: int) -> _Stream:
        ahead = [s for s in self._streams if s.row <= first]
        if ahead:
            stream = max(ahead, key=lambda s: s.row)
            with _streams_lock:  # the most recently used now
                _streams.pop(id(stream), None)
                _streams[id(stream)] = (self, stream)
            return stream
        import pyarrow.parquet as pq

        # buffer_size: the column chunk read a piece at a time, not whole.
        parquet = pq.ParquetFile(_PreadFile(self._fd), buffer_size=1 << 16, pre_buffer=False)
        stream = _Stream(
            parquet.iter_batches(
                batch_size=SLICE_ROWS,
                row_groups=[self._group],
                columns=[self._column],
                use_threads=False,
            )
        )
        self._streams.append(stream)
        with _streams_lock:
            _streams[id(stream)] = (self, stream)
            for key, (cursor, kept) in list(_streams.items()):
                if len(_streams) <= STREAMS_KEPT * _columns_kept(c for c, _ in _streams.values()):
                    break
                if cursor is self:
                    if kept is not stream:
                        self._streams.remove(kept)
                        del _streams[key]
                elif cursor._lock.acquire(blocking=False):  # one in use is left to finish
                    try:
                        if kept in cursor._streams:
                            cursor._streams.remove(kept)
                    finally:
                        cursor._lock.release()
                    del _streams[key]
        return stream

    def slice(self, wanted: int):
        """Rows wanted × SLICE_ROWS onwards (SLICE_ROWS of them, fewer at the end)."""
        import pyarrow as pa

        first, end = wanted * SLICE_ROWS, (wanted + 1) * SLICE_ROWS
        with self._lock:
            stream = None
            try:
                stream = self._stream_for(first)
                pieces = []
                while stream.row < end:
                    column, stream.held = stream.held, None
                    if column is None:
                        column = next(stream.batches, None)
                        if column is None:
                            break
                        column = column.column(0)
                    at, after = stream.row, stream.row + len(column)
                    if after > first:
                        pieces.append(
                            column.slice(max(first - at, 0), min(end, after) - max(first, at))
                        )
                    if after > end:
                        stream.held = column.slice(end - at)
                        after = end
                    stream.row = after
            except (OSError, MemoryError):  # the disk or the memory, not the file's rows
                self._drop(stream)
                raise
            except Exception as exc:  # ArrowInvalid and kin: not this Parquet any more
                self._drop(stream)
                raise RecordMoved(str(exc)) from None
            if not pieces:
                raise RecordMoved(f"row group {self._group} ends before row {first}")
            return pa.chunked_array(pieces)

    def _drop(self, stream: _Stream | None) -> None:
        if stream in self._streams:
            self._streams.remove(stream)
        with _streams_lock:
            _streams.pop(id(stream), None)


def _parquet_slice_text(opened: _Opened, located: Located, rows: int):
    if located.b >= rows:
        raise RecordMoved(f"row group {located.a} has no row {located.b}")
    cursor = _kept(
        ("parquet-cursor", *opened.key, located.a, located.column),
        # A descriptor of its own: it outlives this call's.
        lambda: _GroupCursor(os.dup(opened.fd), located.a, located.column),
    )
    wanted, at = divmod(located.b, SLICE_ROWS)

    def decode():
        piece = cursor.slice(wanted)
        return piece, piece.nbytes

    piece = _decoded_once(("slice", *opened.key, located.a, located.column, wanted), decode)
    if at >= len(piece):
        raise RecordMoved(f"row group {located.a} has no row {located.b}")
    return piece[at].as_py()


def _arrow_text(opened: _Opened, located: Located):
    kept = _kept(("arrow", *opened.key), lambda: _arrow_file(opened))
    if isinstance(kept, RecordMoved):
        # A new one: an exception raised again keeps every earlier raise's frames.
        raise RecordMoved(str(kept))
    if located.a >= len(kept):
        raise RecordMoved(f"no record batch {located.a}")

    def decode():
        try:
            batch = kept[located.a]()
        except MemoryError:  # the memory, not the file's rows
            raise
        except Exception as exc:  # ArrowInvalid and kin
            raise RecordMoved(str(exc)) from None
        return batch, batch.nbytes

    batch = _decoded_once(("batch", *opened.key, located.a), decode)
    if located.column not in batch.schema.names or located.b >= batch.num_rows:
        raise RecordMoved(f"no row {located.b} of column {located.column!r} in batch {located.a}")
    return batch.column(located.column)[located.b].as_py()


def _arrow_file(opened: _Opened) -> list | RecordMoved:
    """How to read each record batch of an Arrow file, one at a time: an IPC
    file's footer gives each batch; an IPC stream's batches are found once by
    their messages' offsets (headers only). A compressed batch is decompressed
    when read, so the whole file is never held decompressed; an uncompressed
    one is a view of the memory map."""
    import pyarrow as pa

    try:
        source = pa.py_buffer(mmap.mmap(opened.fd, 0, access=mmap.ACCESS_READ))
        if source[:6].to_pybytes() == b"ARROW1":
            reader = pa.ipc.open_file(source)
            return [
                functools.partial(reader.get_batch, i) for i in range(reader.num_record_batches)
            ]
        stream = pa.ipc.open_stream(source)
        schema = stream.schema
        if any(pa.types.is_dictionary(field.type) for field in schema):
            # A batch needs the dictionaries before it: read in order, kept whole.
            batches = list(stream)
            return [functools.partial(lambda b: b, b) for b in batches]
        offsets, at = [], pa.BufferReader(source)
        messages = pa.ipc.MessageReader.open_stream(at)
        while True:
            where = at.tell()
            try:
                message = messages.read_next_message()
            except StopIteration:
                break
            if message.type == "record batch":
                offsets.append(where)
        return [functools.partial(_stream_batch, source, where, schema) for where in offsets]
    except (ValueError, OSError) as exc:  # an empty file cannot be mapped
        return RecordMoved(str(exc))
    except Exception as exc:  # ArrowInvalid and kin
        return RecordMoved(str(exc))


def _stream_batch(source, where: int, schema):
    import pyarrow as pa

    reader = pa.BufferReader(source)
    reader.seek(where)
    return pa.ipc.read_record_batch(pa.ipc.read_message(reader), schema)


_READERS = {
    "line": lambda opened, located: (
        _csv_text if opened.name.lower().endswith(".csv") else _jsonl_text
    )(opened, located),
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
