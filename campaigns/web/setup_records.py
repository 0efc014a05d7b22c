"""The setup page's records: a JSONL, CSV, Parquet or Arrow source whose rows
are the units (campaigns/intake/records.py), checked before anything is made.

The records lie where the folders of the user's projects allow, by the rule
folder campaigns follow (campaigns/intake/project_folders.py): the folder a
record campaign reads (the file's own folder, or the Arrow folder itself) must
lie inside a folder of the chosen project. Their columns are checked on the
start of each file, so that a misnamed column, a file that cannot be read or
one that holds no records is said on its field, not by an import halfway.
"""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError

from campaigns.intake import project_folders
from campaigns.intake.manifests import ManifestError
from campaigns.intake.records import (
    LINE_MAX,
    RecordColumns,
    open_lines,
    parse_json_line,
    record_files,
    record_format,
    record_rows,
)
from campaigns.models import Project
from campaigns.runs.setup import campaign_root
from campaigns.specs.processors import ProcessorSpec, all_specs

#: Rows of each file read to check it (a JSONL file has no header to check).
PROBE_ROWS = 1
#: Rows the preview counts at most: a file of millions is previewed by its start.
PREVIEW_COUNT = 100_000
#: What the setup page lists as record sources under each offered folder.
OFFERED_MAX = 200
COLUMN_FIELDS = {"id": "id_column", "text": "text_column", "category": "category_column"}


def text_processors() -> list[str]:
    """Titles of the processors a records file is offered to (ProcessorSpec.takes_text)."""
    return [spec.title for _name, spec in sorted(all_specs().items()) if spec.takes_text]


def refused_processor(spec: ProcessorSpec | None) -> str | None:
    """Why this processor takes no records, or None."""
    if spec is None or spec.takes_text:
        return None
    takers = ", ".join(text_processors()) or "none installed"
    return (
        f"{spec.title} reads files, not texts: a records file is for a text processor "
        f"({takers}); choose a folder of files"
    )


def records_path(*, folder: str | None, given: str) -> Path:
    """The records the user names: an absolute path, or one relative to the
    chosen inputs folder."""
    path = Path(given.strip())
    if not path.is_absolute():
        if not folder:
            raise ValidationError({"records": "choose the inputs folder the records lie in"})
        path = Path(folder) / path
    return path


def check_records(
    *, user: Any, project: Project, path: Path, columns: RecordColumns
) -> tuple[Path, list[str]]:
    """The folder a record campaign on `path` reads and its record files,
    checked: inside a folder of the project the user may read (FolderRefused,
    as for a folder campaign), each file a records format that can be read and
    that has the columns. ValidationError keyed by the form field otherwise."""
    try:
        root = campaign_root(input_folder=None, manifest=None, input_root=None, records=path)
        root = project_folders.folder_for_user(user=user, project=project, path=root)
        files = record_files(root, "." if path.resolve() == root else path.resolve().name)
    except ManifestError as exc:
        raise ValidationError({"records": str(exc)}) from None
    except ValidationError as exc:
        raise ValidationError({"records": exc.messages}) from None
    for file in files:
        _probe(root, file, columns)
    return root, files


def _probe(root: Path, file: str, columns: RecordColumns) -> None:
    try:
        if record_format(file) == "jsonl":
            _jsonl_columns(root / file, columns)
        for _row in islice(record_rows(root, [file], columns), PROBE_ROWS):
            pass
    except ManifestError as exc:
        message = str(exc)
        raise ValidationError({_field_for(message, columns): message}) from None
    except Exception as exc:
        # A file the system will not open, a broken .gz, a Parquet page that
        # does not decode: what can be wrong with a file, said on its field.
        if not isinstance(exc, (OSError, EOFError, ValueError, *_arrow_errors())):
            raise
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValidationError({"records": f"{file} cannot be read: {reason}"}) from None


def _arrow_errors() -> tuple[type[Exception], ...]:
    import pyarrow as pa

    return (pa.ArrowException,)


def _jsonl_columns(path: Path, columns: RecordColumns) -> None:
    """A JSONL file's first record must have the named keys: its lines have no
    header, and a misnamed column would fail every row one by one."""
    with open_lines(path) as fh:
        while line := fh.readline(LINE_MAX + 1):
            if line.strip():
                break
        else:
            return
    record = parse_json_line(line.removeprefix(b"\xef\xbb\xbf"))
    if not isinstance(record, dict):
        raise ManifestError(f"{path.name} does not hold JSON records: line 1 is {record.reason}")
    missing = [c for c in columns.needed() if c not in record]
    if missing:
        raise ManifestError(
            f"{path.name}: no column {', '.join(map(repr, missing))} in its first record "
            f"(its keys: {', '.join(list(record)[:20])})"
        )


def _field_for(message: str, columns: RecordColumns) -> str:
    """The form field a refusal is about: a column named in it, else the records."""
    if "no column" in message:
        for key, field in COLUMN_FIELDS.items():
            name = getattr(columns, key)
            if name and repr(name) in message.split("no column", 1)[1].split("(", 1)[0]:
                return field
        for _, name in columns.params:
            if repr(name) in message.split("no column", 1)[1].split("(", 1)[0]:
                return "row_params"
    return "records"


def offered_records(folders: list[Path]) -> list[str]:
    """Record files and Arrow folders directly in the offered folders, for the
    page's suggestions (the user may name any other inside them)."""
    found: list[str] = []
    for folder in folders:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_file() and record_format(entry.name) is not None:
                found.append(entry.path)
            if len(found) >= OFFERED_MAX:
                return found
    return found
