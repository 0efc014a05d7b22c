"""One version's vectors (text embeddings, a `.npy` plugin's outputs) or
image features (image classification) as one matrix, streamed: the campaign
page's download, the cross-version comparison's reading.

Rows are in unit (import) order, one per unit with a valid output under the
version (campaigns/runs/versions.py). Outputs are read a chunk of units at a
time, each chunk in output-path order (a batch's rows share a shard, read
once), so a million rows stream in constant memory. A row whose output cannot
be read (deleted or damaged since) is NaN, and the rest goes on: `campaign
verify` says which outputs to make again.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from django.conf import settings
from numpy.lib import format as npy_format

from campaigns.models import Campaign, ParameterVersion
from campaigns.runs.versions import VersionOutput, outputs_count, outputs_of
from campaigns.specs.processors import get_spec
from campaigns.storage.outputs import InvalidOutput, load_npz
from campaigns.storage.vector_shards import VectorReader

CLASSIFICATION = "image-classification"
_CHUNK = 2000


def kind_of(campaign: Campaign) -> str | None:
    """'vectors' or 'features' where the campaign's outputs form a matrix; None otherwise."""
    if campaign.processor == CLASSIFICATION:
        return "features"
    try:
        return "vectors" if get_spec(campaign.processor).output_suffix == ".npy" else None
    except Exception:  # a plugin no longer installed: nothing to read its outputs with
        return None


class Row(NamedTuple):
    """A unit's row of the matrix (its vector, or its image's features), for a
    classifier its top label; vector None and the reason where the output
    cannot be read."""

    vector: np.ndarray | None
    label: str = ""
    error: str = ""


class RowReader:
    def __init__(self, campaign: Campaign):
        self.kind = kind_of(campaign)
        self.root = Path(settings.OUTPUT_ROOT)
        self._vectors = VectorReader(self.root)

    def read(self, rel: str) -> Row:
        try:
            if self.kind == "features":
                data = load_npz(self.root / rel)
                labels = data["top_labels"]
                label = str(labels[0]) if len(labels) else ""
                return Row(np.asarray(data["features"], dtype=np.float32).ravel(), label)
            return Row(np.asarray(self._vectors.vector(rel), dtype=np.float32).ravel())
        except (OSError, ValueError, KeyError, EOFError, InvalidOutput) as exc:
            return Row(None, error=f"output unreadable: {exc}")

    def read_chunk(self, outputs: list[VersionOutput]) -> list[Row]:
        """Rows of `outputs`, in their order, read in output-path order."""
        rows = [Row(None)] * len(outputs)
        for i in sorted(range(len(outputs)), key=lambda i: outputs[i].output_path):
            rows[i] = self.read(outputs[i].output_path)
        return rows


def dimension_of(*, campaign: Campaign, version: ParameterVersion) -> int | None:
    """The length of the version's rows, from its first readable output (of
    the first 50); None when none can be read."""
    reader = RowReader(campaign)
    for out in itertools.islice(outputs_of(campaign=campaign, version=version), 50):
        vector = reader.read(out.output_path).vector
        if vector is not None:
            return int(vector.shape[0])
    return None


def chunks(outputs: Iterable[VersionOutput]) -> Iterator[list[VersionOutput]]:
    it = iter(outputs)
    while chunk := list(itertools.islice(it, _CHUNK)):
        yield chunk


@dataclass
class Matrix:
    """A download: `rows` × `dimension` float32, as .npy bytes from `chunks`."""

    filename: str
    rows: int
    dimension: int
    body: Iterator[bytes]


def matrix_stream(*, campaign: Campaign, version: ParameterVersion) -> Matrix | None:
    """The version's matrix as .npy bytes; None when it has no readable output
    (or the campaign's outputs are not vectors)."""
    kind = kind_of(campaign)
    if kind is None:
        return None
    count = outputs_count(campaign=campaign, version=version)
    dimension = dimension_of(campaign=campaign, version=version) if count else None
    if not count or dimension is None:
        return None
    return Matrix(
        filename=f"{campaign.name}-{kind}-{version.label}.npy",
        rows=count,
        dimension=dimension,
        body=_npy_bytes(campaign, version, count, dimension),
    )


def _npy_bytes(
    campaign: Campaign, version: ParameterVersion, count: int, dimension: int
) -> Iterator[bytes]:
    header = io.BytesIO()
    npy_format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (count, dimension)}
    )
    yield header.getvalue()
    reader = RowReader(campaign)
    # The header promised `count` rows: units done since are left for the
    # next download, units gone since are NaN rows at the end.
    outputs = itertools.islice(outputs_of(campaign=campaign, version=version), count)
    sent = 0
    for chunk in chunks(outputs):
        block = np.full((len(chunk), dimension), np.nan, dtype="<f4")
        for i, row in enumerate(reader.read_chunk(chunk)):
            if row.vector is not None and row.vector.shape == (dimension,):
                block[i] = row.vector
        sent += len(chunk)
        yield block.tobytes()
    if sent < count:
        yield np.full((count - sent, dimension), np.nan, dtype="<f4").tobytes()


def row_names(*, campaign: Campaign, version: ParameterVersion) -> Iterator[list[object]]:
    """The matrix's rows named: row, id, source path, category, output path."""
    outputs = itertools.islice(
        outputs_of(campaign=campaign, version=version),
        outputs_count(campaign=campaign, version=version),
    )
    for row, out in enumerate(outputs):
        yield [row, out.uid, out.source_path, out.category, out.output_path]
