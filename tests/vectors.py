"""Reading units' vectors in tests, as the product reads them (shard rows or files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from campaigns.storage.vector_shards import VectorReader, split_member


def unit_vector(output_root: Path | str, rel: str) -> np.ndarray:
    return np.asarray(VectorReader(output_root).vector(rel))


def output_file(output_root: Path | str, rel: str) -> Path:
    """The file a unit's output lives in: its own, or its batch's shard."""
    return Path(output_root) / split_member(rel)[0]
