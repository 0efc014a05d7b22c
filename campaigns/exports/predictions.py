"""An image-classification campaign's outputs gathered: one predictions table
and one feature matrix per parameter version, rows in unit order.

Each unit's `.npz` (top-k labels and probabilities, margin, features) is read
once, a chunk of units at a time: a million images export in constant memory.
Only valid outputs count (an output waiting in review is not accepted yet;
an older version's read from its attempts: campaigns/runs/versions.py);
an output that cannot be read (deleted since, damaged) keeps its row, with
empty predictions, the reason in the `error` column and NaN features, and the
rest goes on: `campaign verify` then says which outputs to make again.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from django.conf import settings
from numpy.lib import format as npy_format

from campaigns.exports import tables
from campaigns.exports.csv_stream import stream_csv
from campaigns.models import Campaign, ParameterVersion
from campaigns.runs.versions import outputs_count, outputs_of
from campaigns.storage.outputs import InvalidOutput, load_npz, write_atomic

_ARRAYS = ("top_indices", "top_labels", "top_probs", "margin", "features")


def prediction_outputs(campaign: Campaign, version: ParameterVersion) -> Iterator[tuple]:
    """(uid, source path, category, output path, arrays or the reason they
    could not be read) of each unit with a valid output under the version, in
    id order (campaigns/runs/versions.py says which)."""
    root = Path(settings.OUTPUT_ROOT)
    for out in outputs_of(campaign=campaign, version=version):
        arrays: dict[str, np.ndarray] | str
        try:
            data = load_npz(root / out.output_path)
            arrays = {name: data[name] for name in _ARRAYS}
        except (OSError, KeyError, InvalidOutput) as exc:
            arrays = f"output unreadable: {exc}"
        yield out.uid, out.source_path, out.category, out.output_path, arrays


def predictions_csv(campaign: Campaign, version: ParameterVersion | None = None) -> Iterator[str]:
    """row, id, source, category (the manifest's, if any), output, then label
    and probability of each of the top k, then the top-2 margin; the current
    version's unless told."""
    version = version or campaign.current_version
    if version is None:
        return stream_csv(_header(1), ())
    return stream_csv(
        _header(_k(version)), _rows(prediction_outputs(campaign, version), _k(version))
    )


def _k(version: ParameterVersion) -> int:
    return int(version.params.get("top_k", 1))


def _header(k: int) -> list[str]:
    header = ["row", "id", "source_path", "category", "output_path"]
    for rank in range(1, k + 1):
        header += [f"label_{rank}", f"probability_{rank}"]
    return [*header, "margin", "error"]


def _rows(outputs, k: int, features=None) -> Iterator[list]:
    """The table's rows; `features(row, vector)` also receives each feature
    vector (None for an output that could not be read)."""
    for row, (uid, source, category, rel, arrays) in enumerate(outputs):
        if isinstance(arrays, str):
            if features is not None:
                features(row, None)
            yield [row, uid, source, category, rel, *[""] * (2 * k), "", arrays]
            continue
        if features is not None:
            features(row, arrays["features"])
        ranked = []
        for rank in range(k):
            if rank < len(arrays["top_labels"]):
                label, probability = arrays["top_labels"][rank], arrays["top_probs"][rank]
                ranked += [str(label), f"{float(probability):.6f}"]
            else:  # fewer categories than k
                ranked += ["", ""]
        yield [row, uid, source, category, rel, *ranked, f"{float(arrays['margin']):.6f}", ""]


def export_classifications(campaign: Campaign, folder: Path) -> list[Path]:
    """predictions-<version>.csv, features-<version>.npy (n, d) float32 and
    predictions-<version>.parquet for each version with done units, in one
    pass: row i of the matrix is row i of each table."""
    written = []
    for version in campaign.versions.order_by("number"):
        count = outputs_count(campaign=campaign, version=version)
        if not count:
            continue
        table = folder / f"predictions-{version.label}.csv"
        matrix_path = folder / f"features-{version.label}.npy"
        tmp = folder / f".{matrix_path.name}.tmp"
        # made on the first readable row, when the feature length is known
        matrix: list[np.memmap] = []
        unreadable: list[int] = []  # rows before it whose output could not be read

        def keep(row, vector, tmp=tmp, count=count, matrix=matrix, unreadable=unreadable):
            if vector is None:
                if matrix:
                    matrix[0][row] = np.nan
                else:
                    unreadable.append(row)
                return
            if not matrix:
                shape = (count, vector.shape[0])
                matrix.append(npy_format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape))
                matrix[0][unreadable] = np.nan
            matrix[0][row] = vector

        with contextlib.ExitStack() as stack:
            parquet = tables.PredictionTable(
                folder / f"predictions-{version.label}.parquet",
                stack,
                campaign=campaign,
                version=version,
                classes=tables.classes_of(version, prediction_outputs(campaign, version)),
                rows=count,
            )
            # Units done after the count was taken wait for the next export.
            outputs = _also(itertools.islice(prediction_outputs(campaign, version), count), parquet)
            rows = _rows(outputs, _k(version), features=keep)
            write_atomic(
                table, (chunk.encode() for chunk in stream_csv(_header(_k(version)), rows))
            )
            written.append(table)
            if parquet.close():
                written.append(parquet.path)
        if matrix:  # no readable output: no features to gather
            matrix[0].flush()
            del matrix[0]
            os.replace(tmp, matrix_path)
            written.append(matrix_path)
    return written


def _also(outputs: Iterator[tuple], parquet: tables.PredictionTable) -> Iterator[tuple]:
    """`outputs`, each added to the Parquet table as it goes by."""
    for output in outputs:
        parquet.add(output[0], output[-1])
        yield output
