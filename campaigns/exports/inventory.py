"""The campaign's dossier as files: manifest, results, errors, batches,
parameter versions, the review's correction effort and decisions.

Written by `campaign export NAME --to DIR` and served from the campaign page;
both read rows in keyset-paginated chunks, so a million units stream in
constant memory.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from django.utils import timezone
from numpy.lib import format as npy_format

from campaigns.exports import completions, tables
from campaigns.exports.csv_stream import stream_csv
from campaigns.exports.matrices import RowReader, chunks, dimension_of
from campaigns.exports.predictions import export_classifications, predictions_csv
from campaigns.exports.review_effort import review_decisions_csv, review_effort_json
from campaigns.models import Batch, Campaign, Unit, UnitState
from campaigns.runs.batch_stats import MEASURED, SPLITS
from campaigns.runs.memory_errors import splits_text
from campaigns.runs.versions import outputs_count, outputs_of
from campaigns.specs.processors import cost_unit, get_spec
from campaigns.storage.outputs import write_atomic

_CHUNK = 5000
CLASSIFICATION = "image-classification"

CONTENT_TYPES = {".csv": "text/csv", ".json": "application/json"}


def _units(campaign: Campaign, fields: tuple[str, ...], **filters) -> Iterator[tuple]:
    last = 0
    while True:
        rows = list(
            Unit.objects.filter(campaign=campaign, pk__gt=last, **filters)
            .order_by("pk")
            .values_list("pk", *fields)[:_CHUNK]
        )
        if not rows:
            return
        last = rows[-1][0]
        for row in rows:
            yield row[1:]


def manifest_csv(campaign: Campaign) -> Iterator[str]:
    fields = ("uid", "source_path", "size", "sha256", "category")
    return stream_csv(["id", "source_path", "size", "sha256", "category"], _units(campaign, fields))


def results_csv(campaign: Campaign) -> Iterator[str]:
    fields = (
        "uid",
        "source_path",
        "output_path",
        "state",
        "error_class",
        "output_size",
        "output_sha256",
    )
    return stream_csv(
        [
            "id",
            "source_path",
            "output_path",
            "state",
            "error_class",
            "output_size",
            "output_sha256",
        ],
        _units(campaign, fields),
    )


def errors_csv(campaign: Campaign) -> Iterator[str]:
    fields = ("uid", "source_path", "error_class", "error_message")
    return stream_csv(
        ["id", "source_path", "error_class", "message"],
        _units(campaign, fields, state=UnitState.FAILED),
    )


_BATCH_FIELDS = (
    "version__number",
    "version__fingerprint",
    *("policy", "state", "worker", "deliveries", "started_at", "finished_at"),
    *MEASURED,
    *SPLITS,
    "error",
)


def _batches(campaign: Campaign) -> Iterator[tuple]:
    last = 0
    while True:
        rows = list(
            Batch.objects.filter(campaign=campaign, pk__gt=last)
            .order_by("pk")
            .values_list("pk", *_BATCH_FIELDS)[:_CHUNK]
        )
        if not rows:
            return
        last = rows[-1][0]
        for pk, number, fingerprint, *rest, oom_splits, oom_alone, error in rows:
            splits = splits_text(oom_splits, oom_alone, sep=">")
            yield (pk, f"v{number}-{fingerprint[:10]}", *rest, splits, error)


def batches_csv(campaign: Campaign) -> Iterator[str]:
    """Every batch with what it measured: sizes, time, memory (bytes after the
    batch; allocated and reserved on CUDA, RSS on a CPU), and the batch sizes
    it ran at after running out of memory (`splits`: 64>32>16, "(n failed
    alone)" when units did not fit even at batch 1; empty if it never split)."""
    unit = cost_unit(campaign.processor)
    return stream_csv(
        [
            *("batch", "version", "policy", "state", "worker", "deliveries"),
            *("started_at", "finished_at", "items", f"real_{unit}", f"padded_{unit}"),
            *("model_seconds", "batch_seconds", "allocated_bytes", "reserved_bytes"),
            *("peak_allocated_bytes", "peak_reserved_bytes", "rss_bytes", "splits", "error"),
        ],
        _batches(campaign),
    )


def versions_json(campaign: Campaign) -> Iterator[str]:
    versions = []
    for version in campaign.versions.order_by("number"):
        # Where the outputs were really made: device, CUDA, driver, per batch.
        runtimes = {
            json.dumps(m.get("runtime", {}), sort_keys=True)
            for m in Batch.objects.filter(version=version)
            .exclude(metrics={})
            .values_list("metrics", flat=True)
            .iterator(chunk_size=1000)
            if isinstance(m, dict)
        }
        versions.append(
            {
                "label": version.label,
                "number": version.number,
                "fingerprint": version.fingerprint,
                "created_at": version.created_at.isoformat(),
                "processor": campaign.processor,
                "params": version.params,
                "software": version.software,
                "runtimes": [json.loads(r) for r in sorted(runtimes)],
            }
        )
    yield json.dumps({"campaign": campaign.name, "versions": versions}, indent=2)


GENERATORS = {
    "manifest.csv": manifest_csv,
    "results.csv": results_csv,
    "errors.csv": errors_csv,
    "batches.csv": batches_csv,
    "versions.json": versions_json,
    "review_effort.json": review_effort_json,
    "review_decisions.csv": review_decisions_csv,
}


class ExportError(Exception):
    """The export's folder cannot be made or written; the message names the path and why."""


def export(campaign: Campaign, folder: Path) -> list[Path]:
    """Write the dossier into `folder` (made if need be); files already there
    with the same names are replaced whole. A folder that cannot be made or
    written is an ExportError; the files written before it stay whole."""
    _make_folder(folder)
    try:
        written = _write_all(campaign, folder)
    except OSError as exc:
        # os.replace names its temporary file first and the target second.
        where = exc.filename2 or exc.filename or folder
        raise ExportError(
            f"cannot export to {folder}: cannot write {where} ({exc.strerror or exc})"
        ) from exc
    mark_exported(campaign)
    return written


def mark_exported(campaign: Campaign) -> None:
    """Its outputs left the machine (this export, a matrix, table or
    predictions download): the rental-ending alert asks whether that came
    after the last batch (campaigns/watch/events.py)."""
    Campaign.objects.filter(pk=campaign.pk).update(exported_at=timezone.now())


def _make_folder(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"cannot export to {folder}: it is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # With parents=True the error names the first folder that could not be made.
        where = f"; at {exc.filename}" if exc.filename and str(exc.filename) != str(folder) else ""
        raise ExportError(
            f"cannot export to {folder}: cannot create the folder ({exc.strerror or exc}{where})"
        ) from exc


def _write_all(campaign: Campaign, folder: Path) -> list[Path]:
    written = []
    for name, generate in GENERATORS.items():
        path = folder / name
        write_atomic(path, (chunk.encode("utf-8") for chunk in generate(campaign)))
        written.append(path)
    if get_spec(campaign.processor).output_suffix == ".npy":
        written.extend(consolidate_vectors(campaign, folder))
    if campaign.processor == CLASSIFICATION:
        written.extend(export_classifications(campaign, folder))
    if campaign.processor == completions.GENERATION:
        written.extend(completions.export_completions(campaign, folder))
    return written


# What the campaign page offers besides the inventory, by processor (an image
# classification's predictions: its current version's).
PROCESSOR_FILES = {CLASSIFICATION: {"predictions.csv": predictions_csv}}


def files_for(campaign: Campaign) -> dict:
    """File name -> generator of its text, for the campaign page's downloads."""
    return {**GENERATORS, **PROCESSOR_FILES.get(campaign.processor, {})}


def consolidate_vectors(campaign: Campaign, folder: Path) -> list[Path]:
    """One (n, dim) float32 matrix per parameter version, rows in unit order,
    with a CSV naming each row and the same rows as a Parquet table
    (campaigns/exports/tables.py): versions never share a file. Read a chunk
    of units at a time (campaigns/exports/matrices.py), written to a
    memory-mapped file and a row group at a time: a million rows in constant
    memory."""
    written = []
    for version in campaign.versions.order_by("number"):
        count = outputs_count(campaign=campaign, version=version)
        dimension = dimension_of(campaign=campaign, version=version) if count else None
        if not count:
            continue
        matrix_path = folder / f"vectors-{version.label}.npy"
        ids_path = folder / f"vectors-{version.label}.csv"
        table_path = folder / f"vectors-{version.label}.parquet"
        tmp = folder / f".{matrix_path.name}.tmp"
        shape = (count, dimension or int(version.params.get("dimension", 0)))
        matrix = npy_format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
        matrix[:] = np.nan  # rows gone since the count stay NaN
        header = ["row", "id", "source_path", "output_path", "error"]
        with tables.atomic_file(table_path) as sink:
            schema = tables.vector_schema(campaign=campaign, version=version, dimension=shape[1])
            table = tables.TableWriter(sink, schema, count)
            rows = _matrix_rows(campaign, version, matrix, count, table)
            write_atomic(ids_path, (c.encode() for c in stream_csv(header, rows)))
            table.close()
        matrix.flush()
        del matrix
        os.replace(tmp, matrix_path)
        written += [matrix_path, ids_path, table_path]
    return written


def _matrix_rows(
    campaign: Campaign, version, matrix: np.ndarray, count: int, table: tables.TableWriter
) -> Iterator[list]:
    """Fill `matrix` and `table` with the version's rows, yielding each row's
    name; an output deleted or damaged since is NaN (a null vector in the
    table) with the reason, the rest goes on. Units done after the count was
    taken wait for the next export."""
    reader = RowReader(campaign)
    outputs = itertools.islice(outputs_of(campaign=campaign, version=version), count)
    row = 0
    for chunk in chunks(outputs):
        for out, read in zip(chunk, reader.read_chunk(chunk), strict=True):
            # An unreadable output stays NaN (the matrix starts so), its reason in `error`.
            cells = tables.vector_cells(read.vector, read.error, matrix.shape[1])
            if cells["vector"] is not None:
                matrix[row] = cells["vector"]
            table.add(id=out.uid, row=row, version=version.number, **cells)
            yield [row, out.uid, out.source_path, out.output_path, cells["error"]]
            row += 1
