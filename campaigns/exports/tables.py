"""One version's outputs as a Parquet table, for pandas, polars or `datasets`:
`vectors-<version>.parquet` beside an embedding campaign's matrix,
`predictions-<version>.parquet` beside a classifier's.

The rows are the matrix's rows, in the same order: one per unit with a valid
output under the version (campaigns/runs/versions.py), in unit (import)
order; `row` is the row's index in the `.npy` matrix and in the CSV tables.
An output that cannot be read (deleted or damaged since) keeps its row with a
null vector (the matrix's NaN row) and the reason in `error`.

Rows are written a row group at a time (ROW_GROUP_BYTES of list values), each
group handed on as soon as it is written, so a table of any size is written
in constant memory: `campaign export` fills it in the same pass as the matrix
and its CSV, the versions section's download streams it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from campaigns.models import Campaign, ParameterVersion
from campaigns.runs.versions import outputs_count, outputs_of
from campaigns.specs import model_files

#: Bytes of list values (vectors, features, probabilities) a row group holds.
ROW_GROUP_BYTES = 4 << 20

#: Columns whose values repeat from row to row.
_REPEATING = ("version", "label", "error")

#: What the rows are in, said in each table's metadata.
ORDER = "unit import order: row i is row i of the version's .npy matrix"


class TableWriter:
    """Rows added one at a time, written as Parquet a row group at a time.

    Fixed-size list columns (float32) are buffered in a numpy block a group
    long: a None value is a null list (an output that could not be read), a
    NaN inside one a null element (a class outside a classifier's top k)."""

    def __init__(
        self, sink: Any, schema: pa.Schema, rows: int | None = None, group_rows: int | None = None
    ):
        """`rows`: how many rows are coming, if known (a smaller table's
        buffers are that long); `group_rows`: rows a group, for a table
        whose cells are texts (the list columns' bytes set it otherwise)."""
        self.schema = schema
        # Dictionary encoding only where values repeat: on the floats it
        # costs time and saves no space (bench/RESULTS.md).
        repeating = [f.name for f in schema if f.name in _REPEATING]
        self._writer = pq.ParquetWriter(sink, schema, use_dictionary=repeating)
        self._lists = {
            f.name: f.type.list_size for f in schema if isinstance(f.type, pa.FixedSizeListType)
        }
        width = sum(self._lists.values()) or 1
        self.group_rows = group_rows or max(16, ROW_GROUP_BYTES // (4 * width))
        if rows is not None:
            self.group_rows = max(1, min(self.group_rows, rows))
        self._blocks = {
            name: np.empty((self.group_rows, size), dtype=np.float32)
            for name, size in self._lists.items()
        }
        self._present = {name: np.zeros(self.group_rows, dtype=bool) for name in self._lists}
        self._columns: dict[str, list] = {f.name: [] for f in schema if f.name not in self._lists}
        self._filled = 0
        self.rows = 0

    def add(self, **values: Any) -> None:
        i = self._filled
        for name, cells in self._columns.items():
            cells.append(values.get(name))
        for name, block in self._blocks.items():
            value = values.get(name)
            self._present[name][i] = value is not None
            block[i] = np.nan if value is None else value
        self._filled += 1
        self.rows += 1
        if self._filled == self.group_rows:
            self.flush()

    def flush(self) -> None:
        """The rows added since the last group, as a row group."""
        n = self._filled
        if not n:
            return
        arrays = []
        for field in self.schema:
            if field.name in self._lists:
                values = self._blocks[field.name][:n]
                flat = values.ravel()
                nan = np.isnan(flat)
                child = pa.array(flat, type=pa.float32(), mask=nan if nan.any() else None)
                arrays.append(
                    pa.FixedSizeListArray.from_arrays(
                        child,
                        self._lists[field.name],
                        mask=pa.array(~self._present[field.name][:n]),
                    )
                )
            else:
                arrays.append(pa.array(self._columns[field.name], type=field.type))
                self._columns[field.name].clear()
        self._writer.write_batch(pa.record_batch(arrays, schema=self.schema))
        self._filled = 0

    def close(self) -> None:
        self.flush()
        self._writer.close()


def vector_schema(
    *, campaign: Campaign, version: ParameterVersion, dimension: int, kind: str = "vectors"
) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("row", pa.int64()),
            ("version", pa.int32()),
            ("vector", pa.list_(pa.float32(), dimension)),
            ("error", pa.string()),
        ],
        metadata=_metadata(campaign, version, kind=kind, dimension=dimension),
    )


def prediction_schema(
    *, campaign: Campaign, version: ParameterVersion, classes: list[str], dimension: int
) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("row", pa.int64()),
            ("version", pa.int32()),
            ("label", pa.string()),
            ("probability", pa.float32()),
            ("margin", pa.float32()),
            ("probabilities", pa.list_(pa.float32(), len(classes))),
            ("features", pa.list_(pa.float32(), dimension)),
            ("error", pa.string()),
        ],
        metadata=_metadata(
            campaign, version, kind="predictions", dimension=dimension, classes=classes
        ),
    )


def _metadata(campaign: Campaign, version: ParameterVersion, **more: Any) -> dict[str, str]:
    facts = {
        "campaign": campaign.name,
        "processor": campaign.processor,
        "version": version.label,
        "order": ORDER,
        **more,
    }
    return {key: json.dumps(value) for key, value in facts.items()}


# --- a classifier's classes ----------------------------------------------------


def classes_of(version: ParameterVersion, outputs: Iterator[tuple] | None = None) -> list[str]:
    """The classifier's classes in the order of its outputs' probabilities:
    its labels file, read as the worker reads it, while it holds what the
    version recorded; otherwise what the outputs name (`outputs`: the
    predictions' rows, read once more), a class no output ranked named ""."""
    record = (version.software or {}).get("files", {}).get("labels")
    path = Path(record["path"] if record else str(version.params.get("labels", "")))
    try:
        if record is None or model_files.digest(path) == record["sha256"]:
            lines = path.read_text(encoding="utf-8").splitlines()
            return [line.strip() for line in lines if line.strip()]
    except (OSError, UnicodeDecodeError):
        pass
    named: dict[int, str] = {}
    for *_, arrays in outputs or ():
        if not isinstance(arrays, str):
            named.update(
                zip(arrays["top_indices"].tolist(), map(str, arrays["top_labels"]), strict=True)
            )
    return [named.get(i, "") for i in range(max(named, default=-1) + 1)]


def prediction_row(
    arrays: dict[str, np.ndarray] | str, classes: int, dimension: int
) -> dict[str, Any]:
    """A classifier's output as the table's cells; an unreadable one (`arrays`
    its reason) as nulls and the reason."""
    if isinstance(arrays, str):
        return {"error": arrays}
    features = np.asarray(arrays["features"], dtype=np.float32).ravel()
    if features.shape != (dimension,):
        return {"error": f"features of {len(features)} values, expected {dimension}"}
    probabilities = np.full(classes, np.nan, dtype=np.float32)
    indices = arrays["top_indices"].astype(np.int64)
    inside = indices < classes
    probabilities[indices[inside]] = arrays["top_probs"][inside]
    labels, probs = arrays["top_labels"], arrays["top_probs"]
    return {
        "label": str(labels[0]) if len(labels) else None,
        "probability": float(probs[0]) if len(probs) else None,
        "margin": float(arrays["margin"]),
        "probabilities": probabilities,
        "features": features,
        "error": "",
    }


# --- where the table goes ------------------------------------------------------


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Any]:
    """A temporary file beside `path`, in its place once the block ends
    (flushed to disk first); removed if the block fails."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class PredictionTable:
    """A classifier's table in `campaign export`, begun at the first readable
    output (when the feature length is known, as for its matrix): rows
    before it wait, one reason each. No readable output, no table."""

    def __init__(
        self,
        path: Path,
        stack: contextlib.ExitStack,
        *,
        campaign: Campaign,
        version: ParameterVersion,
        classes: list[str],
        rows: int | None = None,
    ):
        self.path, self._stack, self._rows = path, stack, rows
        self._schema = functools.partial(
            prediction_schema, campaign=campaign, version=version, classes=classes
        )
        self._version = version.number
        self._classes = len(classes)
        self._waiting: list[tuple[str, str]] = []
        self._table: TableWriter | None = None

    def add(self, uid: str, arrays: dict[str, np.ndarray] | str) -> None:
        if self._table is None:
            if isinstance(arrays, str):
                self._waiting.append((uid, arrays))
                return
            dimension = int(np.asarray(arrays["features"]).size)
            sink = self._stack.enter_context(atomic_file(self.path))
            self._table = TableWriter(sink, self._schema(dimension=dimension), self._rows)
            self._dimension = dimension
            for waiting, reason in self._waiting:
                self._add(waiting, reason)
            self._waiting.clear()
        self._add(uid, arrays)

    def _add(self, uid: str, arrays: dict[str, np.ndarray] | str) -> None:
        assert self._table is not None
        cells = prediction_row(arrays, self._classes, self._dimension)
        self._table.add(id=uid, row=self._table.rows, version=self._version, **cells)

    def close(self) -> bool:
        """Whether a table was written (once the stack closes)."""
        if self._table is None:
            return False
        self._table.close()
        return True


class Chunks:
    """A write-only sink whose bytes are taken away after each row group."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        self._size += len(data)
        return len(data)

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


# --- the versions section's download ----------------------------------------------


@dataclass
class Download:
    filename: str
    body: Iterator[bytes]


def table_stream(*, campaign: Campaign, version: ParameterVersion) -> Download | None:
    """The version's table as Parquet bytes, a row group at a time; None
    when it has no readable output (as its matrix)."""
    from campaigns.exports import matrices

    kind = matrices.kind_of(campaign)
    count = outputs_count(campaign=campaign, version=version) if kind else 0
    dimension = matrices.dimension_of(campaign=campaign, version=version) if count else None
    if dimension is None:
        return None
    if kind == "features":
        from campaigns.exports.predictions import prediction_outputs

        def outputs() -> Iterator[tuple]:
            return itertools.islice(prediction_outputs(campaign, version), count)

        schema = prediction_schema(
            campaign=campaign,
            version=version,
            classes=classes_of(version, outputs()),
            dimension=dimension,
        )
        classes = schema.field("probabilities").type.list_size
        rows: Iterator[dict] = _prediction_rows(outputs(), classes, dimension)
        stem = "predictions"
    else:
        schema = vector_schema(campaign=campaign, version=version, dimension=dimension)
        rows = _vector_rows(campaign, version, count, dimension)
        stem = "vectors"
    return Download(
        filename=f"{campaign.name}-{stem}-{version.label}.parquet",
        body=_parquet_bytes(schema, version, rows, count),
    )


def _parquet_bytes(
    schema: pa.Schema, version: ParameterVersion, rows: Iterator[dict], count: int
) -> Iterator[bytes]:
    sink = Chunks()
    table = TableWriter(sink, schema, count)
    for row, cells in enumerate(rows):
        table.add(id=cells.pop("id"), row=row, version=version.number, **cells)
        if chunk := sink.take():
            yield chunk
    table.close()
    yield sink.take()


def _vector_rows(
    campaign: Campaign, version: ParameterVersion, count: int, dimension: int
) -> Iterator[dict]:
    from campaigns.exports.matrices import RowReader, chunks

    reader = RowReader(campaign)
    outputs = itertools.islice(outputs_of(campaign=campaign, version=version), count)
    for chunk in chunks(outputs):
        for out, read in zip(chunk, reader.read_chunk(chunk), strict=True):
            yield {"id": out.uid, **vector_cells(read.vector, read.error, dimension)}


def vector_cells(vector: np.ndarray | None, error: str, dimension: int) -> dict[str, Any]:
    """A row's vector and error as the matrix has them: a vector of another
    length is no row of the matrix either."""
    if vector is not None and vector.shape != (dimension,):
        return {"vector": None, "error": f"a vector of {len(vector)} values, expected {dimension}"}
    return {"vector": vector, "error": error}


def _prediction_rows(outputs: Iterator[tuple], classes: int, dimension: int) -> Iterator[dict]:
    for uid, _source, _category, _rel, arrays in outputs:
        yield {"id": uid, **prediction_row(arrays, classes, dimension)}
