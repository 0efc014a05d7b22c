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
from django.conf import settings
from numpy.lib import format as npy_format

from campaigns.exports.csv_stream import stream_csv
from campaigns.exports.predictions import export_classifications, predictions_csv
from campaigns.exports.review_effort import review_decisions_csv, review_effort_json
from campaigns.models import Batch, Campaign, Unit, UnitState
from campaigns.runs.batch_stats import MEASURED
from campaigns.specs.processors import cost_unit, get_spec
from campaigns.storage.outputs import InvalidOutput, write_atomic
from campaigns.storage.vector_shards import VectorReader

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
        for pk, number, fingerprint, *rest in rows:
            yield (pk, f"v{number}-{fingerprint[:10]}", *rest)


def batches_csv(campaign: Campaign) -> Iterator[str]:
    """Every batch with what it measured: sizes, time, memory (bytes after the
    batch; allocated and reserved on CUDA, RSS on a CPU)."""
    unit = cost_unit(campaign.processor)
    return stream_csv(
        [
            *("batch", "version", "policy", "state", "worker", "deliveries"),
            *("started_at", "finished_at", "items", f"real_{unit}", f"padded_{unit}"),
            *("model_seconds", "batch_seconds", "allocated_bytes", "reserved_bytes"),
            *("peak_allocated_bytes", "peak_reserved_bytes", "rss_bytes", "error"),
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


def export(campaign: Campaign, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, generate in GENERATORS.items():
        path = folder / name
        write_atomic(path, (chunk.encode("utf-8") for chunk in generate(campaign)))
        written.append(path)
    if get_spec(campaign.processor).output_suffix == ".npy":
        written.extend(consolidate_vectors(campaign, folder))
    if campaign.processor == CLASSIFICATION:
        written.extend(export_classifications(campaign, folder))
    return written


# What the campaign page offers besides the inventory, by processor (an image
# classification's predictions: its current version's).
PROCESSOR_FILES = {CLASSIFICATION: {"predictions.csv": predictions_csv}}


def files_for(campaign: Campaign) -> dict:
    """File name -> generator of its text, for the campaign page's downloads."""
    return {**GENERATORS, **PROCESSOR_FILES.get(campaign.processor, {})}


def consolidate_vectors(campaign: Campaign, folder: Path) -> list[Path]:
    """One (n, dim) float32 matrix per parameter version, rows in unit order,
    with a CSV naming each row: versions never share a file."""
    reader = VectorReader(settings.OUTPUT_ROOT)
    written = []
    for version in campaign.versions.order_by("number"):
        prefix = f"{campaign.name}/{version.label}/"
        done = Unit.objects.filter(
            campaign=campaign, state=UnitState.SUCCEEDED, output_path__startswith=prefix
        )
        count = done.count()
        if not count:
            continue
        dimension = int(version.params.get("dimension", 0))
        matrix_path = folder / f"vectors-{version.label}.npy"
        ids_path = folder / f"vectors-{version.label}.csv"
        tmp = folder / f".{matrix_path.name}.tmp"
        matrix = npy_format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(count, dimension))
        units = _units(
            campaign,
            ("uid", "source_path", "output_path"),
            state=UnitState.SUCCEEDED,
            output_path__startswith=prefix,
        )
        rows = [
            [row, uid, source, rel, ""]
            for row, (uid, source, rel) in itertools.islice(enumerate(units), count)
        ]
        # Filled in output-path order: a batch's rows share a shard, read once,
        # though a token budget scatters a batch's units over the id order.
        for entry in sorted(rows, key=lambda r: r[3]):
            try:
                matrix[entry[0]] = reader.vector(entry[3])
            except (OSError, InvalidOutput) as exc:
                # Deleted or damaged since: NaN, the reason in its row, the rest goes on.
                matrix[entry[0]] = np.nan
                entry[4] = f"output unreadable: {exc}"
        matrix.flush()
        del matrix
        os.replace(tmp, matrix_path)
        header = ["row", "id", "source_path", "output_path", "error"]
        write_atomic(ids_path, (c.encode() for c in stream_csv(header, rows)))
        written += [matrix_path, ids_path]
    return written
