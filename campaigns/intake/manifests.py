"""Reading a CSV or JSONL manifest into import rows (docs/importing.md).

A manifest that cannot be read as a whole (not UTF-8, no `path` column, a CSV
field past csv's limit) is refused with ManifestError; anything wrong with
one row fails that row only, with its reason, so the rest imports. A JSONL
line over LINE_MAX characters is such a row, and is never held whole.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from campaigns.intake.rows import CATEGORY_MAX, PATH_MAX, UID_MAX, Row, top_folder
from campaigns.storage.paths import escape_path, normalise_uid, storable

# Manifest columns with a meaning; any other column is kept as metadata.
_COLUMNS = frozenset({"id", "path", "category", "size", "sha256"})
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_BIGINT_MAX = 2**63 - 1

#: The most characters a CSV field holds (csv.field_size_limit()'s default,
#: which a CSV manifest checks itself), and so the most a row's metadata may hold as
#: JSON in either format (campaigns/intake/importing.py checks it).
FIELD_MAX = 131_072
#: The most characters a JSONL line holds: metadata at FIELD_MAX with room for
#: id, path and category beside it. A longer line is read in pieces of
#: _SKIP_CHUNK and dropped, never held whole; its row fails alone.
LINE_MAX = 2 * FIELD_MAX
_SKIP_CHUNK = 1 << 16


class ManifestError(Exception):
    """The manifest as a whole cannot be read."""


@dataclass(frozen=True, slots=True)
class BadLine:
    """A manifest line that is no usable record, and why: a type of its own,
    so that no key or value a row may hold reads as the mark of a bad line."""

    reason: str


def _manifest_records(manifest: Path) -> Iterator[tuple[int, dict | BadLine]]:
    suffix = manifest.suffix.lower()
    # utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark,
    # which plain utf-8 would make part of the first column's name.
    try:
        if suffix == ".csv":
            with manifest.open(newline="", encoding="utf-8-sig") as fh:
                reader = csv.DictReader(fh)
                try:
                    if not reader.fieldnames or "path" not in reader.fieldnames:
                        raise ManifestError(
                            f"{manifest.name}: a CSV manifest needs a 'path' column"
                        )
                    for number, record in enumerate(reader, start=2):
                        _refuse_long_fields(record)
                        yield number, record
                except csv.Error as exc:
                    # A field over csv's size limit: what follows it on the
                    # line cannot be told apart from rows, so the whole is refused.
                    raise ManifestError(
                        f"{manifest.name}: line {reader.line_num} cannot be read as CSV: {exc}"
                    ) from exc
        elif suffix in (".jsonl", ".ndjson"):
            with manifest.open(encoding="utf-8-sig") as fh:
                yield from _jsonl_records(fh)
        else:
            raise ManifestError(f"{manifest.name}: a manifest is .csv or .jsonl")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{manifest.name} is not UTF-8 text: {exc}") from exc


def _refuse_long_fields(record: dict) -> None:
    """csv.Error for a field over FIELD_MAX: the bound is the manifest's own, not
    csv.field_size_limit(), which record files raise for the whole process."""
    for value in record.values():
        for field in value if isinstance(value, list) else (value,):
            if isinstance(field, str) and len(field) > FIELD_MAX:
                raise csv.Error(f"field larger than field limit ({FIELD_MAX})")


def _jsonl_records(fh: TextIO) -> Iterator[tuple[int, dict | BadLine]]:
    """Each non-blank line's record, read with a bounded readline: a line over
    LINE_MAX is a BadLine, and only LINE_MAX + 1 of its characters are held."""
    lineno = 0
    while line := fh.readline(LINE_MAX + 1):
        lineno += 1
        if len(line) > LINE_MAX and not line.endswith("\n"):
            length = len(line)
            while (rest := fh.readline(_SKIP_CHUNK)) and not rest.endswith("\n"):
                length += len(rest)
            length += len(rest.rstrip("\n"))
            yield (
                lineno,
                BadLine(
                    f"line {lineno} is {length:,} characters long, over the {LINE_MAX:,} "
                    "a manifest line may hold"
                ),
            )
        elif line.strip():
            yield lineno, _json_record(lineno, line)


def _json_record(lineno: int, line: str) -> dict | BadLine:
    """One JSONL line's object, or the BadLine of a row that fails alone."""
    try:
        record = _loads(line)
    except json.JSONDecodeError as exc:
        return BadLine(f"line {lineno} is not JSON: {exc.msg}")
    except (ValueError, RecursionError) as exc:
        # NaN or Infinity (which PostgreSQL's jsonb refuses), an integer of
        # thousands of digits, arrays nested past Python's recursion limit.
        return BadLine(f"line {lineno} is not JSON: {str(exc)[:120]}")
    if not isinstance(record, dict):
        return BadLine(f"line {lineno} is not a JSON object")
    if ("\\ud" in line or "\\uD" in line) and not _encodes(record):
        # A "\ud800" escape alone is no character: no database stores it.
        return BadLine(f"line {lineno} holds a lone surrogate escape (\\udXXX), not text")
    return record


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON value")


# json.loads(line, parse_constant=_not_json) without a decoder made a line.
_DECODER = json.JSONDecoder(parse_constant=_not_json)


def _loads(line: str):
    if line.startswith("\ufeff"):  # as json.loads refuses it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", line, 0)
    return _DECODER.decode(line)


def _encodes(record: dict) -> bool:
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _given(value) -> bool:
    return value is not None and value != ""


def _trusted_identity(row: Row, size, sha256) -> None:
    """Record a manifest's size and sha256 on the row, or fail it with the reason."""
    line = row.line
    if not (_given(size) and _given(sha256)):
        missing = "sha256" if _given(size) else "size"
        row.fail(f"line {line}: size and sha256 go together; {missing} is missing")
        return
    # JSON gives an int (type() is exact: True is no size); CSV gives text.
    if type(size) is not int and isinstance(size, str) and size.strip().isdigit():
        size = int(size)
    if type(size) is not int or not 0 <= size <= _BIGINT_MAX:
        row.fail(f"line {line}: size must be a whole number of bytes, 0 or more, not {size!r:.40}")
        return
    if type(sha256) is str:
        sha256 = sha256.strip()
    if type(sha256) is not str or not _SHA256.fullmatch(sha256):
        row.fail(f"line {line}: sha256 must be 64 hexadecimal characters, not {sha256!r:.80}")
        return
    row.size, row.sha256 = size, sha256.lower()


def _text(value) -> str:
    return value if type(value) is str else str(value or "")


def _manifest_row(lineno: int, record: dict | BadLine) -> Row:
    if isinstance(record, BadLine):
        return Row(lineno, f"manifest-line-{lineno}", "").fail(record.reason)
    path = _text(record.get("path")).strip()
    given_id = _text(record.get("id")).strip()
    uid = given_id or (normalise_uid(path) if path else "")
    # A manifest writes paths as the campaign shows them (storage/paths.py:
    # `\xNN` a byte that is not UTF-8, `\\` a backslash where the text would
    # read as an escape). One that no column holds (a NUL) fails its row,
    # shown escaped.
    source_path = path if storable(path) else escape_path(path)
    if not uid:
        return Row(lineno, f"manifest-line-{lineno}", "").fail(
            f"line {lineno} has neither id nor path"
        )
    if len(uid) > UID_MAX or "\x00" in uid:
        what = "id" if given_id else "path (the row's id, as it gives none)"
        return Row(lineno, f"manifest-line-{lineno}", source_path[:PATH_MAX]).fail(
            f"line {lineno}: the {what} is longer than {UID_MAX} characters "
            "or holds a NUL character"
        )
    row = Row(lineno, uid, source_path, _text(record.get("category")))
    if not _COLUMNS.issuperset(record):
        row.metadata = {k: v for k, v in record.items() if k not in _COLUMNS}
    if not path:
        return row.fail(f"line {lineno} has no path")
    # The columns' sizes; PostgreSQL refuses longer text, and NUL in any text.
    if len(source_path) > PATH_MAX or "\x00" in path:
        row.source_path = source_path[:PATH_MAX]
        return row.fail(
            f"line {lineno}: the path is longer than {PATH_MAX} characters or holds a NUL character"
        )
    if len(row.category) > CATEGORY_MAX or "\x00" in row.category:
        row.category = ""
        return row.fail(
            f"line {lineno}: the category is longer than {CATEGORY_MAX} characters "
            "or holds a NUL character"
        )
    size, sha256 = record.get("size"), record.get("sha256")
    if _given(size) or _given(sha256):
        _trusted_identity(row, size, sha256)
    return row


def manifest_rows(manifest: Path, *, folder_categories: bool = True) -> Iterator[Row]:
    for lineno, record in _manifest_records(manifest):
        row = _manifest_row(lineno, record)
        # The manifest's category wins; a row without one takes its top folder.
        if folder_categories and not row.category and not row.error_class:
            row.category = top_folder(row.source_path)
        yield row
