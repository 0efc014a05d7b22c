"""Writing outputs atomically and checking them before they count."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class WrittenFile:
    size: int
    sha256: str


def write_atomic(path: Path, data: bytes) -> WrittenFile:
    """Temp file in the target folder, fsync, os.replace, fsync of the folder.

    A reader (or verify after a crash) sees either no file or the whole file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return WrittenFile(size=len(data), sha256=hashlib.sha256(data).hexdigest())


def vector_to_npy(vector: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(vector, dtype=np.float32), allow_pickle=False)
    return buf.getvalue()


class InvalidOutput(Exception):
    """The file exists but is not a usable result."""


def validate_embedding_file(path: Path, *, dimension: int, normalized: bool) -> np.ndarray:
    """Load an embedding .npy and check shape, finiteness and (if asked) unit norm."""
    try:
        vector = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InvalidOutput(f"not a readable .npy file: {exc}") from exc
    if vector.shape != (dimension,):
        raise InvalidOutput(f"shape {vector.shape}, expected ({dimension},)")
    if vector.dtype != np.float32:
        raise InvalidOutput(f"dtype {vector.dtype}, expected float32")
    if not np.isfinite(vector).all():
        raise InvalidOutput("vector holds NaN or Inf")
    if normalized:
        norm = float(np.linalg.norm(vector))
        if abs(norm - 1.0) > 1e-3:
            raise InvalidOutput(f"norm {norm:.6f}, expected 1 after L2 normalisation")
    return vector
