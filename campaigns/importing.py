"""Turning a folder or a manifest (CSV/JSONL) into units.

A unit's id is the manifest's id column or the normalised relative path.
Re-importing the same corpus creates nothing new. A row that cannot become a
working unit (missing file, path leaving the corpus folder, blank id) still
becomes a unit, failed with a readable reason, so it is easy to find.
"""

from __future__ import annotations

import csv
import json
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .holdout import is_holdout
from .models import IN_FLIGHT, Campaign, ErrorClass, Unit, UnitState
from .outputs import file_sha256
from .paths import normalise_uid, resolve_input

_BULK = 1000


class ManifestError(Exception):
    """The manifest as a whole cannot be read."""


@dataclass
class ImportReport:
    created: int = 0
    existing: int = 0
    failed: int = 0
    changed: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)


def file_identity(path: Path) -> tuple[int, int, str]:
    """Size, mtime (ns) and sha256 of an input file."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(str(path))
    return st.st_size, st.st_mtime_ns, file_sha256(path)


@dataclass
class _Row:
    uid: str
    source_path: str
    category: str = ""
    metadata: dict = field(default_factory=dict)
    error_class: str = ""
    error_message: str = ""


def _walk_folder(root: Path) -> Iterator[_Row]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        # Hidden files and folders (.git, .DS_Store) are not part of a corpus.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            uid = normalise_uid(rel)
            yield _Row(uid=uid, source_path=uid)


def _manifest_records(manifest: Path) -> Iterator[tuple[int, dict]]:
    suffix = manifest.suffix.lower()
    try:
        if suffix == ".csv":
            with manifest.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                if not reader.fieldnames or "path" not in reader.fieldnames:
                    raise ManifestError(f"{manifest.name}: a CSV manifest needs a 'path' column")
                for lineno, record in enumerate(reader, start=2):
                    yield lineno, record
        elif suffix in (".jsonl", ".ndjson"):
            with manifest.open(encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, start=1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        yield lineno, {"__error__": f"line {lineno} is not JSON: {exc.msg}"}
                        continue
                    if not isinstance(record, dict):
                        yield lineno, {"__error__": f"line {lineno} is not a JSON object"}
                        continue
                    yield lineno, record
        else:
            raise ManifestError(f"{manifest.name}: a manifest is .csv or .jsonl")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{manifest.name} is not UTF-8 text: {exc}") from exc


def _manifest_rows(manifest: Path) -> Iterator[_Row]:
    for lineno, record in _manifest_records(manifest):
        if "__error__" in record:
            uid = f"manifest-line-{lineno}"
            yield _Row(
                uid, "", error_class=ErrorClass.INPUT_INVALID, error_message=record["__error__"]
            )
            continue
        path = str(record.get("path") or "").strip()
        uid = str(record.get("id") or "").strip() or (normalise_uid(path) if path else "")
        if not uid:
            uid = f"manifest-line-{lineno}"
            yield _Row(
                uid,
                "",
                error_class=ErrorClass.INPUT_INVALID,
                error_message=f"line {lineno} has neither id nor path",
            )
            continue
        extra = {k: v for k, v in record.items() if k not in ("id", "path", "category")}
        row = _Row(uid, path, category=str(record.get("category") or ""), metadata=extra)
        if not path:
            row.error_class = ErrorClass.INPUT_INVALID
            row.error_message = f"line {lineno} has no path"
        yield row


def _describe(root: Path, row: _Row) -> Unit:
    unit = Unit(
        uid=row.uid,
        source_path=row.source_path,
        category=row.category,
        metadata=row.metadata,
        error_class=row.error_class,
        error_message=row.error_message,
    )
    if not row.error_class:
        try:
            path = resolve_input(root, row.source_path)
            unit.size, unit.mtime_ns, unit.sha256 = file_identity(path)
        except ValueError as exc:
            unit.error_class, unit.error_message = ErrorClass.INPUT_INVALID, str(exc)
        except FileNotFoundError:
            unit.error_class = ErrorClass.INPUT_MISSING
            unit.error_message = f"input file not found: {row.source_path}"
        except IsADirectoryError:
            unit.error_class = ErrorClass.INPUT_INVALID
            unit.error_message = f"input is a folder, not a file: {row.source_path}"
        except OSError as exc:
            unit.error_class = ErrorClass.INPUT_UNREADABLE
            unit.error_message = f"cannot read input: {exc.strerror or exc}"
    unit.state = UnitState.FAILED if unit.error_class else UnitState.PENDING
    return unit


def _store(campaign: Campaign, units: list[Unit], report: ImportReport, seen: set[str]) -> None:
    known = {
        u.uid: u
        for u in Unit.objects.filter(campaign=campaign, uid__in=[u.uid for u in units]).only(
            "uid", "sha256", "state"
        )
    }
    fresh = []
    for unit in units:
        if unit.uid in seen:
            report.duplicates += 1
            report.problems.append(
                f"{unit.uid}: duplicate id in this import ({unit.source_path}); kept the first"
            )
            continue
        seen.add(unit.uid)
        if unit.uid in known:
            report.existing += 1
            _compare(known[unit.uid], unit, report)
            continue
        unit.campaign = campaign
        unit.holdout = is_holdout(unit.uid, campaign.holdout_share)
        fresh.append(unit)
        if unit.state == UnitState.FAILED:
            report.failed += 1
            report.problems.append(f"{unit.uid}: {unit.error_message}")
    Unit.objects.bulk_create(fresh, ignore_conflicts=True)
    report.created += len(fresh)


def _compare(existing: Unit, fresh: Unit, report: ImportReport) -> None:
    """Same id, other bytes: shown and kept apart, never mixed with the old results."""
    if not fresh.sha256 or not existing.sha256 or fresh.sha256 == existing.sha256:
        return
    report.changed += 1
    if existing.state == UnitState.PENDING:
        # Nothing was made from the old bytes yet: just record the new ones.
        Unit.objects.filter(pk=existing.pk).update(
            size=fresh.size, mtime_ns=fresh.mtime_ns, sha256=fresh.sha256
        )
        report.problems.append(f"{fresh.uid}: input changed before processing; recorded anew")
        return
    message = (
        f"input changed since import: sha256 {existing.sha256[:12]}… is now "
        f"{fresh.sha256[:12]}… (resume --retry-failed processes the new content)"
    )
    Unit.objects.filter(pk=existing.pk).exclude(state__in=IN_FLIGHT).update(
        state=UnitState.FAILED, error_class=ErrorClass.INPUT_CHANGED, error_message=message
    )
    report.problems.append(f"{fresh.uid}: {message}")


def _import_rows(campaign: Campaign, rows: Iterable[_Row]) -> ImportReport:
    root = Path(campaign.input_root)
    report = ImportReport()
    seen: set[str] = set()
    pending: list[Unit] = []
    for row in rows:
        pending.append(_describe(root, row))
        if len(pending) >= _BULK:
            _store(campaign, pending, report, seen)
            pending = []
    if pending:
        _store(campaign, pending, report, seen)
    return report


def import_folder(campaign: Campaign) -> ImportReport:
    root = Path(campaign.input_root)
    if not root.is_dir():
        raise ManifestError(f"input folder not found: {root}")
    return _import_rows(campaign, _walk_folder(root))


def import_manifest(campaign: Campaign, manifest: Path) -> ImportReport:
    if not manifest.is_file():
        raise ManifestError(f"manifest not found: {manifest}")
    return _import_rows(campaign, _manifest_rows(manifest))


@dataclass
class Preview:
    total: int = 0
    first: list[dict] = field(default_factory=list)
    failing: list[dict] = field(default_factory=list)
    checked: int = 0


def preview(
    *,
    root: Path,
    manifest: Path | None,
    check_input,
    params: dict,
    show: int = 20,
    check: int = 200,
) -> Preview:
    """What an import would make, without writing anything: the first units, and
    which of the first `check` inputs would fail and why."""
    from .inputs import InputError, read_bytes

    result = Preview()
    rows = _manifest_rows(manifest) if manifest is not None else _walk_folder(root)
    for row in rows:
        result.total += 1
        if len(result.first) < show:
            result.first.append({"id": row.uid, "source_path": row.source_path})
        if result.checked >= check:
            continue
        result.checked += 1
        reason = row.error_message
        if not reason:
            try:
                data = read_bytes(root, row.source_path)
                if check_input is not None:
                    check_input(data, params)
            except InputError as exc:
                reason = exc.message
        if reason:
            result.failing.append({"id": row.uid, "reason": reason})
    return result
