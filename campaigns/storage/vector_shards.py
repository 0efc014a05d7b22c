"""A batch's vectors in one file: the shard format, its checks and its reading.

A shard is an uncompressed .npz (numpy's zip of .npy arrays, readable anywhere
numpy is) holding `vectors`, float32 (n, dim), `ids`, the n unit ids in
the same order, and `inputs`, uint8 (n, 32): the sha256 of the input bytes each
row was made from (shards written before it have none). The zip's CRC of each
array makes a flipped byte an unreadable shard, never a different vector.
One file a batch instead of one a unit: a batch's outputs cost one create,
one write and one flush to disk, and are read back for their check in one go
(bench/RESULTS.md, "A shard a batch instead of a file a unit (2026-12-01)").

A unit's output path names its row: '<campaign>/<version>/shards/…/b12-…npz#7'.
Every reader goes through `split_member` and `VectorReader`, so per-unit .npy
files written before shards existed stay readable beside them.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from campaigns.storage.outputs import (
    WRONG_OUTPUT,
    InvalidOutput,
    load_npy_or_npz,
)

MARK = "#"


def member_path(shard_rel: str, row: int) -> str:
    return f"{shard_rel}{MARK}{row}"


def split_member(rel: str) -> tuple[str, int | None]:
    """(file, row) of an output path: row None for a file of its own.

    Per-unit output names never hold '#' (campaigns.storage.paths.safe_name)."""
    head, mark, row = rel.rpartition(MARK)
    if mark and row.isdigit():
        return head, int(row)
    return rel, None


def row_sha256(vector: np.ndarray) -> str:
    """What a unit's output_sha256 holds for a row: the hash of its float32 bytes."""
    return _row_digest(vector).hex()


def _row_digest(vector: np.ndarray) -> bytes:
    return hashlib.sha256(np.ascontiguousarray(vector, dtype="<f4").tobytes()).digest()


ROW_BYTES_PER_VALUE = 4


@dataclass(frozen=True)
class Shard:
    ids: np.ndarray
    vectors: np.ndarray
    inputs: np.ndarray | None = None  # uint8 (n, 32), or None in an older shard

    def input_sha256(self, row: int) -> str:
        """The sha256 of the input a row was made from; "" where the shard does not say."""
        return "" if self.inputs is None else bytes(self.inputs[row]).hex()


def make_shard(
    ids: list[str], vectors: np.ndarray, inputs: list[str] | None = None
) -> tuple[bytes, Shard]:
    """The shard of these rows as the bytes to write, and as the arrays those
    bytes hold; `inputs`, each row's input sha256 (hex)."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    names = np.array(ids, dtype=str)
    made_from = None
    buf = io.BytesIO()
    if inputs is None:
        np.savez(buf, vectors=rows, ids=names)
    else:
        digests = b"".join(bytes.fromhex(sha) for sha in inputs)
        made_from = np.frombuffer(digests, dtype=np.uint8).reshape(len(inputs), 32)
        np.savez(buf, vectors=rows, ids=names, inputs=made_from)
    return buf.getvalue(), Shard(ids=names, vectors=rows, inputs=made_from)


def shard_bytes(ids: list[str], vectors: np.ndarray, inputs: list[str] | None = None) -> bytes:
    """The shard of these rows; `inputs`, each row's input sha256 (hex)."""
    return make_shard(ids, vectors, inputs)[0]


def load_shard(path: Path | str, *, dimension: int | None = None) -> Shard:
    """The shard at `path`, whole and well formed, else InvalidOutput (OSError
    when it cannot be opened, FileNotFoundError when it is gone)."""
    try:
        members = load_npy_or_npz(path)
    except InvalidOutput as exc:
        raise InvalidOutput(f"not a readable vector shard: {exc}") from exc
    if not isinstance(members, dict) or set(members) - {"inputs"} != {"vectors", "ids"}:
        raise InvalidOutput("not a vector shard: expected arrays 'vectors' and 'ids'", WRONG_OUTPUT)
    vectors, ids, inputs = members["vectors"], members["ids"], members.get("inputs")
    if vectors.dtype != np.float32 or vectors.ndim != 2:
        raise InvalidOutput(
            f"shard vectors {vectors.shape} {vectors.dtype}, expected (n, dim) float32",
            WRONG_OUTPUT,
        )
    if ids.ndim != 1 or ids.dtype.kind != "U" or len(ids) != len(vectors):
        raise InvalidOutput(f"shard ids {ids.shape} do not name its {len(vectors)} rows")
    if inputs is not None and (inputs.dtype != np.uint8 or inputs.shape != (len(vectors), 32)):
        raise InvalidOutput(f"shard inputs {inputs.shape} {inputs.dtype}, expected (n, 32) uint8")
    if dimension is not None and vectors.shape[1] != dimension:
        raise InvalidOutput(
            f"shard vectors of dimension {vectors.shape[1]}, expected {dimension}", WRONG_OUTPUT
        )
    return Shard(ids=ids, vectors=vectors, inputs=inputs)


class VectorReader:
    """Unit vectors by output path, from shards or per-unit .npy files.

    Keeps the last few shards it loaded: a reader that takes units in
    output-path order (export) or one batch's (review's nearest vector)
    loads each shard once.
    """

    KEEP = 8

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._shards: OrderedDict[str, Shard] = OrderedDict()

    def shard(self, rel: str) -> Shard:
        shard = self._shards.get(rel)
        if shard is None:
            shard = load_shard(self.root / rel)
            self._shards[rel] = shard
            if len(self._shards) > self.KEEP:
                self._shards.popitem(last=False)
        else:
            self._shards.move_to_end(rel)
        return shard

    def vector(self, rel: str) -> np.ndarray:
        """The unit's vector; OSError or InvalidOutput when it cannot be had."""
        file_rel, row = split_member(rel)
        if row is None:
            loaded = load_npy_or_npz(os.path.join(self.root, file_rel))
            if not isinstance(loaded, np.ndarray):
                raise InvalidOutput("an .npz archive, expected one .npy vector")
            return loaded
        vectors = self.shard(file_rel).vectors
        if row >= len(vectors):
            raise InvalidOutput(f"row {row} is past the shard's {len(vectors)} rows")
        return vectors[row]


class ShardChecker:
    """verify's check of shard rows: each shard is read once a run, however
    scattered its units are in id order (a token-budget batch groups units by
    length, not by id). What it keeps of a shard is small — a hash of each
    row's id, and with deep checks each row's sha256 and defect — so a run
    over millions of units holds tens of MiB, not the vectors."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._facts: dict[str, _ShardFacts | BaseException] = {}

    def damaged_whole(self, rel: str) -> bool:
        """Whether the shard, as checked, cannot be read as a shard at all (a
        flipped byte fails its CRC): every row of it is damaged."""
        return isinstance(self._facts.get(rel), InvalidOutput)

    def check(
        self,
        rel: str,
        row: int,
        uid: str,
        *,
        expected_size: int | None,
        deep: DeepRowCheck | None = None,
    ) -> None:
        """FileNotFoundError when the shard is gone; InvalidOutput when the row
        is not this unit's whole vector or (deep) not the very vector recorded,
        or fails the processor's row check."""
        facts = self._facts.get(rel)
        if facts is None or (deep and isinstance(facts, _ShardFacts) and facts.digests is None):
            try:
                facts = _ShardFacts.read(self.root / rel, deep)
            except (OSError, InvalidOutput) as exc:
                facts = exc
            self._facts[rel] = facts
        if isinstance(facts, FileNotFoundError):
            raise FileNotFoundError(facts.errno, facts.strerror, facts.filename)
        if isinstance(facts, InvalidOutput):
            raise InvalidOutput(str(facts), facts.reason)
        if isinstance(facts, BaseException):
            raise InvalidOutput(f"cannot read the shard: {facts}")
        if row >= len(facts.id_hashes):
            raise InvalidOutput(f"row {row} is past the shard's {len(facts.id_hashes)} rows")
        if facts.id_hashes[row] != hash(uid):
            raise InvalidOutput(f"shard row {row} names another unit, not this one")
        row_bytes = (
            facts.dimension * ROW_BYTES_PER_VALUE if facts.sizes is None else int(facts.sizes[row])
        )
        if expected_size is not None and expected_size != row_bytes:
            raise InvalidOutput(f"row of {row_bytes} bytes, recorded {expected_size}")
        if deep is None:
            return
        digest = facts.digests[row * 32 : row * 32 + 32].hex()
        if deep.sha256 and digest != deep.sha256:
            raise InvalidOutput("checksum differs from the one recorded")
        if facts.problems[row] is not None:
            raise facts.problems[row]


@dataclass(frozen=True)
class DeepRowCheck:
    """What a deep check compares a row with: the recorded sha256, and the
    processor's check of a shard's rows (its vectors, or a JSON row shard's
    records -> each row's defect or None)."""

    sha256: str
    row_check: Callable[[Any], list] | None


@dataclass(frozen=True)
class _ShardFacts:
    id_hashes: np.ndarray  # hash() of each row's id: equal within a run, 8 bytes a row
    dimension: int
    digests: bytes | None = None  # each row's sha256, 32 bytes a row (deep)
    problems: list | None = None  # each row's defect or None (deep)
    sizes: np.ndarray | None = None  # a JSON row shard's line sizes (a vector's is its dimension's)

    @classmethod
    def read(cls, path: Path, deep: DeepRowCheck | None) -> _ShardFacts:
        """The facts of the shard at `path`: vectors (.npz) or JSON rows (.jsonl)."""
        from campaigns.storage import row_shards

        if not row_shards.is_row_shard(path.name):
            return cls.of(load_shard(path), deep)
        shard = row_shards.load_row_shard(path)
        id_hashes = np.array([hash(uid) for uid in shard.ids], dtype=np.int64)
        sizes = np.array([len(line) for line in shard.lines], dtype=np.int64)
        if deep is None:
            return cls(id_hashes, 0, sizes=sizes)
        digests = b"".join(hashlib.sha256(line).digest() for line in shard.lines)
        problems = deep.row_check(shard.records) if deep.row_check else [None] * len(sizes)
        return cls(id_hashes, 0, digests, problems, sizes)

    @classmethod
    def of(cls, shard: Shard, deep: DeepRowCheck | None) -> _ShardFacts:
        id_hashes = np.array([hash(uid) for uid in shard.ids.tolist()], dtype=np.int64)
        dimension = shard.vectors.shape[1]
        if deep is None:
            return cls(id_hashes, dimension)
        digests = b"".join(_row_digest(v) for v in shard.vectors)
        problems = deep.row_check(shard.vectors) if deep.row_check else [None] * len(shard.vectors)
        return cls(id_hashes, dimension, digests, problems)
