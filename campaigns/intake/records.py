"""A corpus as records: each row of a JSONL, CSV, Parquet or Arrow file is a
unit (docs/importing.md, "Records").

A record unit's source path names its row where it lies, so that every
reader of an input (`inputs.read_bytes`: the worker, costs, previews, the
profiler) reads it without scanning the file:

    corpus.jsonl#17@5120+311:text    line 17, 311 bytes at byte 5120 (JSONL, CSV;
                                     of a .gz file, in its uncompressed stream)
    part-0.parquet#40961@g1:8193:text    row 40961, row group 1, index 8193 in it
    data-00000-of-00002.arrow#9@b0:9:text    row 9, record batch 0, index 9 in it

After the last `:` comes the text column, percent-quoted, so that the last
`#` of a source path always opens the position. A unit's size and sha256 are
those of its text in UTF-8; the worker checks them like a file's.

A row may carry parameters of its own for a processor that takes them
(ProcessorSpec.row_params, such as text-generation's system prompt):
`--param-column NAME=COLUMN`. Its columns follow the text column's name,
`,NAME=COLUMN` each, percent-quoted (`...:prompt,system_prompt=sys`), and the
unit's input is then one JSON object, `record_input`'s: the text and the
values given (a null or empty value is left out: the version's stands). Its
size and sha256 are those of that object, so a changed value is a changed
input.

Files are read streamed: lines one at a time, Parquet a row group's record
batches at a time, Arrow a record batch at a time; never a whole file.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import io
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote, unquote

from campaigns.intake.inputs import InputError, decode_text
from campaigns.intake.manifests import LINE_MAX as HEADER_MAX
from campaigns.intake.manifests import BadLine, ManifestError, _json_record
from campaigns.intake.rows import CATEGORY_MAX, PATH_MAX, UID_MAX, Row
from campaigns.storage.paths import escape_path, resolve_input, storable, unescape_path

#: File names that hold records, and the format each is read as.
FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".jsonl.gz": "jsonl",
    ".ndjson.gz": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
#: The longest line (or CSV record) a row may be: a longer one fails alone,
#: and is never held whole.
LINE_MAX = 64 << 20
#: Rows a Parquet or Arrow reader hands over at a time.
BATCH_ROWS = 4096
#: What csv.Sniffer reads to tell a CSV file's dialect (the worker the same).
SNIFF_BYTES = 64 << 10
_BOM = b"\xef\xbb\xbf"
# A CSV record's text may be as long as its record (csv's own bound is 131,072
# characters, process-wide: a CSV manifest checks its fields' length itself).
csv.field_size_limit(max(csv.field_size_limit(), LINE_MAX))
_LOCATOR = re.compile(r"#(\d+)@(?:(\d+)\+(\d+)|([gb])(\d+):(\d+)):([^#:]*)\Z")


@dataclass(frozen=True)
class RecordColumns:
    """Which columns of a record file are the unit's id, text and category.
    No id column: a unit's id is `file:N` (N the line, or the row index of a
    Parquet or Arrow file)."""

    text: str
    id: str | None = None
    category: str | None = None
    #: (parameter, column) pairs: the row's own values of the processor's
    #: parameters (ProcessorSpec.row_params), carried in the unit's input.
    params: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict:
        made: dict = {"text": self.text, "id": self.id, "category": self.category}
        if self.params:
            made["params"] = [list(pair) for pair in self.params]
        return made

    @classmethod
    def from_dict(cls, value: dict) -> RecordColumns:
        return cls(
            text=value["text"],
            id=value.get("id"),
            category=value.get("category"),
            params=tuple((str(p), str(c)) for p, c in value.get("params") or ()),
        )

    def needed(self) -> list[str]:
        named = [c for c in (self.id, self.text, self.category) if c]
        return named + [c for _, c in self.params if c not in named]

    def tail(self) -> str:
        """How a unit's source path ends: the columns its input is read from."""
        return ":" + _column_part(self.text, self.params)


def param_columns(given: list[str] | str | None) -> tuple[tuple[str, str], ...]:
    """`--param-column` values, one NAME=COLUMN each (a column's name may hold
    a comma), or the setup page's field, comma-separated; NAME alone for a
    column named as its parameter. ValueError says what is wrong with one."""
    pieces = given.split(",") if isinstance(given, str) else list(given or [])
    pairs: list[tuple[str, str]] = []
    for piece in pieces:
        if not piece.strip():
            continue
        name, equals, column = piece.partition("=")
        name = name.strip()
        column = column.strip() if equals else name
        if not name or not column:
            raise ValueError(f"{piece.strip()!r}: a parameter column is NAME=COLUMN (or NAME)")
        if name in (p for p, _ in pairs):
            raise ValueError(f"parameter {name!r} is given a column twice")
        pairs.append((name, column))
    return tuple(pairs)


def record_input(text: str, values: dict) -> str:
    """A row's input when it carries parameters: one JSON object, its text
    under "text" and the values under "params" (those null or "" left out,
    keys in the columns' order). The import hashes it and every read makes
    the same, so a value that changes is a changed input. A value no
    parameter can be (a date, a struct, NaN, bytes that are not UTF-8) is
    ValueError, naming it: that row fails alone."""
    given = {k: _plain(k, v) for k, v in values.items() if v is not None and v != ""}
    return json.dumps(
        {"text": text, "params": given}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )


def _plain(name: str, value: object) -> object:
    """A column's value as a parameter reads it: text, a number or a list of them."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise ValueError(f"{name}: its column holds {value}, not a number a parameter takes")
    if isinstance(value, bytes):  # a Parquet string column written without its UTF8 mark
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name}: its column holds bytes that are not UTF-8 text") from None
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{name}: its column holds {value}, not a number a parameter takes")
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(name, item) for item in value]
    raise ValueError(
        f"{name}: its column holds {type(value).__name__}, not text, a number or a list of them"
    )


def carried(data: bytes) -> tuple[str, dict] | None:
    """(text, the row's parameter values) of an input a record's row carries
    parameters in (`record_input`, its source path naming the columns), or
    None for any other input (a file's, a row's text alone). `data` as
    `read_bytes` reads it, whole."""
    located = parse_locator(getattr(data, "name", "") or "")
    if located is None or not located.params:
        return None
    value = json.loads(bytes(data).decode("utf-8"))
    return value["text"], value["params"]


def _column_part(text: str, params: tuple[tuple[str, str], ...]) -> str:
    return _quoted(text) + "".join(f",{_quoted(p)}={_quoted(c)}" for p, c in params)


@dataclass(frozen=True, slots=True)
class Located:
    """A record's place, as parsed from its unit's source path."""

    file: str
    row: int
    kind: str  # "line", "group" (Parquet) or "batch" (Arrow)
    a: int  # byte offset, row group or batch
    b: int  # length in bytes, or index within the group or batch
    column: str
    #: The row's parameter columns (RecordColumns.params): read with the text.
    params: tuple[tuple[str, str], ...] = ()
    #: A key this read may find absent from a JSONL record (a parameter's): None then.
    optional: bool = False


def record_format(name: str) -> str | None:
    lowered = name.lower()
    for suffix, kind in FORMATS.items():
        if lowered.endswith(suffix):
            return kind
    return None


def locator(
    file: str, row: int, position: str, column: str, params: tuple[tuple[str, str], ...] = ()
) -> str:
    return f"{file}#{row}@{position}:{_column_part(column, params)}"


@functools.lru_cache(maxsize=64)
def _quoted(column: str) -> str:
    """A column's name as a source path ends with it (quoted once, not a row)."""
    return quote(column, safe="")


def parse_locator(source_path: str) -> Located | None:
    """The record a source path names, or None for a file's source path."""
    if "#" not in source_path:
        return None
    match = _LOCATOR.search(source_path)
    if match is None:
        return None
    file = source_path[: match.start()]
    if record_format(file) is None:
        return None  # a file whose own name looks like a record's place
    row, offset, length, kind, a, b, columns = match.groups()
    column, *pieces = columns.split(",")
    params = tuple(
        (unquote(name), unquote(named)) for name, _, named in (p.partition("=") for p in pieces)
    )
    if kind is None:
        return Located(file, int(row), "line", int(offset), int(length), unquote(column), params)
    kind = "group" if kind == "g" else "batch"
    return Located(file, int(row), kind, int(a), int(b), unquote(column), params)


def record_files(root: Path, source: str) -> list[str]:
    """The record files (relative to `root`) a source names: the file itself,
    or every record file under the folder, in sorted order, hidden ones skipped
    (a `datasets.save_to_disk` folder's `data-*.arrow` are in their order)."""
    path = _inside(root, source) if source not in ("", ".") else root.resolve()
    if path.is_file():
        if record_format(path.name) is None:
            raise ManifestError(
                f"{path.name}: records are .jsonl, .jsonl.gz, .csv, .parquet or .arrow files"
            )
        return [escape_path(os.path.relpath(path, root.resolve()))]
    if not path.is_dir():
        raise ManifestError(f"records not found: {path}")
    found = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and record_format(name) is not None:
                relative = escape_path(os.path.relpath(os.path.join(dirpath, name), root))
                _inside(root, relative)  # a link out of the corpus refuses the create
                found.append(relative)
    if not found:
        raise ManifestError(f"{path}: no .jsonl, .jsonl.gz, .csv, .parquet or .arrow file in it")
    return found


def record_rows(root: Path, files: list[str], columns: RecordColumns) -> Iterator[Row]:
    """A row for each record of the files, in order; a record that cannot work
    is a failed row with its reason. A file without the named columns is
    refused as a whole (ManifestError)."""
    number = 0
    for file in files:
        path = _inside(root, file)
        kind = record_format(file)
        if kind in ("parquet", "arrow"):
            read_batches = _parquet if kind == "parquet" else _arrow
            for row, place, index, batch in read_batches(path, columns):
                yield from _batch_rows(number, file, row, place, index, batch, columns)
                number += batch.num_rows
            continue
        read = {"jsonl": _jsonl, "csv": _csv}[kind or ""]
        for row, position, record in read(path, columns):
            number += 1
            yield _record_row(number, file, row, position, record, columns)


def _inside(root: Path, source: str) -> Path:
    """The records file or folder's real path, refused as a whole (ManifestError,
    said once, never a traceback) where a link takes it out of the corpus folder:
    records are read only inside it, as every input is."""
    try:
        return resolve_input(root, source)
    except ValueError as exc:
        raise ManifestError(
            f"{unescape_path(source)}: {exc}; records are read only inside it"
        ) from None


def record_uid(value) -> str:
    """A unit's id as the value of a row's id column gives it ("" for none)."""
    return "" if value is None else (value if isinstance(value, str) else str(value)).strip()


def _plain_text(text: str) -> bool:
    """Whether decode_text takes this text as it is, by a look at its first
    visible character (a letter, a digit or printable ASCII is content): true
    of nearly every record; the rest goes through decode_text itself."""
    if "\x00" in text:
        return False
    head = text.lstrip()
    if not head:
        return False
    first = head[0]
    return first.isalnum() or "!" <= first <= "~"


def _batch_rows(
    number: int, file: str, row: int, place: str, index: int, batch, columns: RecordColumns
) -> Iterator[Row]:
    """_record_row of each row of a Parquet or Arrow record batch (its first row
    the file's `row`, at `index` of row group or batch `place`): the same rows,
    with the common case (an id, a category and a text that need no word of
    refusal) made here, a column at a time, and every other row by _record_row."""
    texts = batch.column(columns.text).to_pylist()
    ids = batch.column(columns.id).to_pylist() if columns.id else None
    categories = batch.column(columns.category).to_pylist() if columns.category else None
    row_params = [(name, batch.column(column).to_pylist()) for name, column in columns.params]
    head, tail = f"{file}#", columns.tail()
    sha256 = hashlib.sha256
    for i, text in enumerate(texts):
        number += 1
        source = f"{head}{row + i}@{place}:{index + i}{tail}"
        if ids is None:
            uid = f"{file}:{row + i}"
        else:
            uid = ids[i]
            uid = uid.strip() if type(uid) is str else str(uid) if type(uid) is int else ""
        category = categories[i] if categories is not None else ""
        category = "" if category is None else category
        if (
            type(text) is str
            and uid
            and len(uid) <= UID_MAX
            and type(category) is str
            and len(category) <= CATEGORY_MAX
            and len(source) <= PATH_MAX
            and storable(uid)
            and storable(category)
            and _plain_text(text)
        ):
            # An Arrow string is UTF-8: it encodes (no lone surrogate).
            made: str | None = text
            if row_params:
                try:
                    made = record_input(text, {name: values[i] for name, values in row_params})
                except ValueError:
                    made = None  # _record_row says why
            if made is not None:
                data = made.encode("utf-8")
                yield Row(number, uid, source, category, None, len(data), sha256(data).hexdigest())
                continue
        record = {columns.text: text}
        for (_, column), (_, values) in zip(columns.params, row_params, strict=True):
            record[column] = values[i]
        if ids is not None:
            record[columns.id] = ids[i]  # type: ignore[index]
        if categories is not None:
            record[columns.category] = categories[i]  # type: ignore[index]
        yield _record_row(number, file, row + i, f"{place}:{index + i}", record, columns)


def _record_row(
    number: int, file: str, row: int, position: str, record: dict | BadLine, columns: RecordColumns
) -> Row:
    where = f"{file}:{row}"
    source = locator(file, row, position, columns.text, columns.params)
    if len(source) > PATH_MAX:
        return Row(number, where[:UID_MAX], source[:PATH_MAX]).fail(
            f"{where}: the file's path is too long ({PATH_MAX} characters at most)"
        )
    if isinstance(record, BadLine):
        # Its id is its place, which the report says before the reason.
        return Row(number, where, source).fail(record.reason)
    uid = where
    if columns.id:
        uid = record_uid(record.get(columns.id))
        if not uid:
            return Row(number, where, source).fail(f"no id in column {columns.id!r}")
        if len(uid) > UID_MAX or not storable(uid):
            return Row(number, where, source).fail(
                f"the id is longer than {UID_MAX} characters or holds a NUL character"
            )
    category = record.get(columns.category) if columns.category else None
    category = "" if category is None else str(category)
    made = Row(number, uid, source)
    if len(category) > CATEGORY_MAX or not storable(category):
        return made.fail(
            f"{where}: the category is longer than {CATEGORY_MAX} characters "
            "or holds a NUL character"
        )
    made.category = category
    text = record.get(columns.text)
    if text is None:
        return made.fail(f"{where}: no text in column {columns.text!r}")
    if not isinstance(text, str):
        return made.fail(f"{where}: column {columns.text!r} holds {type(text).__name__}, not text")
    try:
        data = text.encode("utf-8")
        if not _plain_text(text):
            decode_text(data)
    except UnicodeEncodeError:
        return made.fail(f"{where}: the text holds a lone surrogate, not text")
    except InputError as exc:
        return made.fail(f"{where}: {'empty text' if not data else exc.message}")
    if columns.params:
        given = {name: record.get(column) for name, column in columns.params}
        try:
            data = record_input(text, given).encode("utf-8")
        except ValueError as exc:
            return made.fail(f"{where}: {exc}")
    made.size, made.sha256 = len(data), hashlib.sha256(data).hexdigest()
    return made


# --- JSONL and CSV: a line (or CSV record) at a byte offset ---------------------


def open_lines(path: Path):
    """A JSONL or CSV file as bytes; a .gz file as its uncompressed stream."""
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _lines(fh) -> Iterator[tuple[int, int, bytes | None]]:
    """(line number, offset, line) of each line; line None for one over LINE_MAX,
    which is skipped without being held."""
    offset, lineno = 0, 0
    while line := fh.readline(LINE_MAX + 1):
        lineno += 1
        start = offset
        offset += len(line)
        if len(line) > LINE_MAX and not line.endswith(b"\n"):
            while (rest := fh.readline(LINE_MAX + 1)) and not rest.endswith(b"\n"):
                offset += len(rest)
            offset += len(rest)
            yield lineno, start, None
            continue
        if start == 0 and line.startswith(_BOM):
            start, line = 3, line[3:]
        yield lineno, start, line


def _too_long(start: int, end: int) -> BadLine:
    return BadLine(f"over {LINE_MAX >> 20} MiB ({end - start:,} bytes), not read")


def _jsonl(path: Path, columns: RecordColumns):
    checked = None
    with open_lines(path) as fh:
        refuse_cr_only(path.name, fh.read(SNIFF_BYTES))
        fh.seek(0)
        for lineno, start, line in _lines(fh):
            if line is None:
                yield lineno, f"{start}+0", BadLine(f"line over {LINE_MAX >> 20} MiB, not read")
                continue
            if not line.strip():
                continue
            record = parse_json_line(line)
            if checked is None and isinstance(record, dict):
                checked = _check_keys(path, record, columns)
            yield lineno, f"{start}+{len(line)}", record


def _check_keys(path: Path, record: dict, columns: RecordColumns) -> bool:
    """A JSONL file's first record must have each parameter column's key (its
    value may be null): a misnamed one would leave every row the version's."""
    missing = [c for _, c in columns.params if c not in record]
    if missing:
        raise ManifestError(
            f"{path.name}: no column {', '.join(map(repr, missing))} in its first record "
            f"(its keys: {', '.join(str(k)[:80] for k in list(record)[:20])})"
        )
    return True


def parse_json_line(line: bytes) -> dict | BadLine:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadLine(f"not UTF-8 (byte 0x{line[exc.start]:02x} at {exc.start})")
    record = _json_record(0, text)
    if isinstance(record, BadLine):
        return BadLine(record.reason.replace("line 0 ", "the line ", 1))
    return record


def sniff_dialect(head: bytes) -> type[csv.Dialect] | csv.Dialect:
    """The CSV dialect of a file's first SNIFF_BYTES (the excel one if csv.Sniffer
    cannot tell); the importer and the worker sniff the same bytes. A quote
    inside a quoted field is doubled (RFC 4180) unless an escape character is
    sniffed: the sniffer cannot tell from a sample without one."""
    sample = head.removeprefix(_BOM).decode("utf-8", "ignore")
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        return csv.excel
    if not dialect.escapechar:
        dialect.doublequote = True
    return dialect


def parse_csv_record(data: bytes, dialect) -> list[str]:
    """One CSV record's fields; csv.Error or UnicodeDecodeError if it is none."""
    fields = next(csv.reader(io.StringIO(data.decode("utf-8"), newline=""), dialect), None)
    if fields is None:
        raise csv.Error("an empty record")
    return fields


class _TooLong(Exception):
    """The CSV record being read is over LINE_MAX."""


class _CsvLines:
    """The lines csv.reader reads (it pulls them while a quoted field is open
    and stops at a record's end), with the part of the file the record being
    read takes: its first line, offset and length, and whether all of it is UTF-8."""

    def __init__(self, fh):
        self.lines = _lines(fh)
        self.first: tuple[int, int] | None = None
        self.length = 0
        self.bad: str | None = None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        lineno, start, line = next(self.lines)  # StopIteration: the file's end
        if self.first is None:
            self.first, self.length, self.bad = (lineno, start), 0, None
        if line is None or self.length + len(line) > LINE_MAX:
            raise _TooLong
        self.length += len(line)
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.bad = self.bad or f"not UTF-8 (byte 0x{line[exc.start]:02x})"
            return line.decode("utf-8", "surrogateescape")

    def record(self, value: list[str] | BadLine | None):
        """(first line, offset, length, fields or why not) of the record just read."""
        assert self.first is not None
        (lineno, start), self.first = self.first, None
        if isinstance(value, list) and self.bad:
            value = BadLine(self.bad)
        return lineno, start, self.length, value


def _csv_records(fh, dialect) -> Iterator[tuple[int, int, int, list[str] | BadLine | None]]:
    """(first line, offset, length, fields) of each CSV record, as csv.reader
    reads the file: a quote opens a field only where the dialect says. A record
    that cannot be read (fields None when over LINE_MAX) is said and skipped, and
    reading goes on at the next line."""
    lines = _CsvLines(fh)
    while True:
        try:
            for fields in csv.reader(lines, dialect):
                yield lines.record(fields)
            return
        except _TooLong:
            yield lines.record(None)
        except csv.Error as exc:
            yield lines.record(BadLine(f"not a CSV record: {exc}"))


def refuse_cr_only(name: str, head: bytes) -> None:
    """ManifestError for a file whose lines end in CR alone (classic Mac OS):
    its rows are found by their LF, which it has none of, so it would read as
    one line. Told from its first SNIFF_BYTES: a CR and no LF in them."""
    if b"\r" in head and b"\n" not in head:
        raise ManifestError(
            f"{name}: its lines end in CR alone (classic Mac OS line ends); save it "
            "with LF or CRLF line ends (for example `tr '\\r' '\\n' < old > new`)"
        )


def csv_header(fh) -> bytes:
    """A CSV file's first line, read only as far as HEADER_MAX (a manifest
    line's bound) and refused past it: a file with a huge first line, or none
    at all, is never held whole."""
    first = fh.readline(HEADER_MAX + 1)
    if len(first) > HEADER_MAX:
        raise HeaderTooLong(
            f"its header (first line) is over {HEADER_MAX:,} bytes: "
            "a CSV record file starts with a line of column names"
        )
    return first.removeprefix(_BOM)


class HeaderTooLong(ValueError):
    """A CSV file's first line is over HEADER_MAX."""


def _csv(path: Path, columns: RecordColumns):
    with open_lines(path) as fh:
        head = fh.read(SNIFF_BYTES)
        dialect = sniff_dialect(head)
    refuse_cr_only(path.name, head)
    with open_lines(path) as fh:
        try:
            csv_header(fh)
        except HeaderTooLong as exc:
            raise ManifestError(f"{path.name}: {exc}") from None
        fh.seek(0)
        records = _csv_records(fh, dialect)
        header = next(records, None)
        names = header[3] if header else []
        if (
            isinstance(names, BadLine)
            or names is None
            or (header is not None and header[2] > HEADER_MAX)
        ):
            reason = (
                names.reason
                if isinstance(names, BadLine)
                else f"over {HEADER_MAX:,} bytes (its quoted names run over lines)"
            )
            raise ManifestError(f"{path.name}: its header cannot be read as CSV: {reason}")
        _check_columns(path, names, columns)
        for lineno, start, length, fields in records:
            if fields is None:
                yield lineno, f"{start}+0", BadLine(f"a record over {LINE_MAX >> 20} MiB, not read")
                continue
            if isinstance(fields, list) and (
                not fields or (len(fields) == 1 and not fields[0].strip())
            ):
                continue  # a blank line
            yield lineno, f"{start}+{length}", _csv_fields(names, fields)


def _csv_fields(names: list[str], fields: list[str] | BadLine) -> dict | BadLine:
    if isinstance(fields, BadLine):
        return fields
    if len(fields) != len(names):
        return BadLine(f"{len(fields)} fields where the header has {len(names)}")
    return dict(zip(names, fields, strict=True))


def _check_columns(path: Path, names, columns: RecordColumns) -> None:
    missing = [c for c in columns.needed() if c not in names]
    if missing:
        raise ManifestError(
            f"{path.name}: no column {', '.join(map(repr, missing))} "
            f"(its columns: {', '.join(str(n)[:80] for n in list(names)[:20])})"
        )
    named = list(names)
    twice = [c for c in columns.needed() if named.count(c) > 1]
    if twice:
        # Which of the two a row's value is taken from would be a guess.
        raise ManifestError(f"{path.name}: two columns named {', '.join(map(repr, twice))}")


# --- Parquet and Arrow: a row group's or a record batch's index -----------------


def _parquet(path: Path, columns: RecordColumns):
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's ArrowInvalid and kin: not a Parquet file
        raise ManifestError(f"{path.name} cannot be read as Parquet: {exc}") from None
    with parquet:
        _check_columns(path, parquet.schema_arrow.names, columns)
        row = 0
        for group in range(parquet.num_row_groups):
            index = 0
            batches = parquet.iter_batches(
                batch_size=BATCH_ROWS,
                row_groups=[group],
                columns=columns.needed(),
                use_threads=False,
            )
            for batch in batches:
                yield row, f"g{group}", index, batch
                row += batch.num_rows
                index += batch.num_rows


def open_arrow(path: Path):
    """An Arrow IPC file or stream (what `datasets.save_to_disk` writes), memory-mapped:
    a reader whose record batches are read without copying."""
    import pyarrow as pa

    source = pa.memory_map(str(path))
    if source.read(6) == b"ARROW1":
        return pa.ipc.open_file(source)
    source.seek(0)
    return pa.ipc.open_stream(source)


def _arrow(path: Path, columns: RecordColumns):
    try:
        reader = open_arrow(path)
    except Exception as exc:  # pyarrow's ArrowInvalid and kin
        raise ManifestError(f"{path.name} cannot be read as Arrow: {exc}") from None
    _check_columns(path, reader.schema.names, columns)
    batches = (
        (reader.get_batch(i) for i in range(reader.num_record_batches))
        if hasattr(reader, "get_batch")
        else reader
    )
    row = 0
    for number, batch in enumerate(batches):
        yield row, f"b{number}", 0, batch
        row += batch.num_rows
