"""A batch's JSON outputs in one file: the row shard format, its reading and
its checks (the JSON counterpart of campaigns/storage/vector_shards.py).

A row shard is JSON Lines: one object a unit, `{"id": …, <the processor's
fields>…, "input_sha256": …}`, each line ended by a newline, in the batch's
order. Any JSON Lines reader takes it (`pd.read_json(path, lines=True)`).
A unit's output path names its line, '<campaign>/<version>/shards/…/
b12-….jsonl#7', its output size and sha256 are those of that line's bytes
(without its newline), and `input_sha256` is the sha256 of the input it was
made from: a later claim of the batch adopts a row only for the input its
unit reads then. One file a batch: a batch's outputs cost one create, one
write and one flush to disk, and a million prompts make a thousands of
files, not a million.

Readers go through `RowReader` (or `read_member`), which reads a unit's own
.json file too, so outputs written a file a unit stay readable beside shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from campaigns.storage.outputs import WRONG_OUTPUT, InvalidOutput
from campaigns.storage.vector_shards import split_member

SUFFIX = ".jsonl"
ID, INPUT = "id", "input_sha256"
#: A shard is read whole: one batch's outputs. Past this it is not a shard
#: this system wrote (a batch's completions run to a few MiB).
MAX_SHARD_BYTES = 1 << 30


def is_row_shard(file_rel: str) -> bool:
    return file_rel.endswith(SUFFIX)


def line_sha256(line: bytes) -> str:
    """What a unit's output_sha256 holds for a row: the hash of its line's bytes."""
    return hashlib.sha256(line).hexdigest()


@dataclass(frozen=True)
class RowShard:
    ids: list[str]
    lines: list[bytes]  # each row's line, without its newline
    records: list[dict]  # each row's output: its line's object less id and input_sha256
    inputs: list[str]  # each row's input sha256 (hex)


def make_row_shard(
    ids: list[str], records: list[dict], inputs: list[str]
) -> tuple[bytes, RowShard]:
    """The shard of these rows as the bytes to write, and as what those bytes hold."""
    lines = []
    for uid, record, made_from in zip(ids, records, inputs, strict=True):
        if ID in record or INPUT in record:
            raise ValueError(f"an output's fields may not be named {ID!r} or {INPUT!r}")
        row = {ID: uid, **record, INPUT: made_from}
        lines.append(json.dumps(row, ensure_ascii=False).encode("utf-8"))
    data = b"".join(line + b"\n" for line in lines)
    return data, RowShard(list(ids), lines, [dict(r) for r in records], list(inputs))


def parse_row_shard(data: bytes) -> RowShard:
    """What a shard's bytes hold, every line whole, else InvalidOutput."""
    if data and not data.endswith(b"\n"):
        raise InvalidOutput("not a whole row shard: its last line has no end (cut short)")
    ids, lines, records, inputs = [], [], [], []
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InvalidOutput(f"row shard line {number} is not JSON: {exc}") from None
        if not isinstance(row, dict) or not isinstance(row.get(ID), str):
            raise InvalidOutput(f"row shard line {number} names no unit ({ID!r})", WRONG_OUTPUT)
        made_from = row.pop(INPUT, "")
        if not isinstance(made_from, str):
            raise InvalidOutput(f"row shard line {number}: {INPUT} is not text", WRONG_OUTPUT)
        ids.append(row.pop(ID))
        lines.append(line)
        records.append(row)
        inputs.append(made_from)
    return RowShard(ids, lines, records, inputs)


def load_row_shard(path: Path | str) -> RowShard:
    """The row shard at `path`, whole and well formed, else InvalidOutput
    (OSError when it cannot be opened, FileNotFoundError when it is gone)."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_SHARD_BYTES + 1)
    if len(data) > MAX_SHARD_BYTES:
        raise InvalidOutput(f"over {MAX_SHARD_BYTES:,} bytes: not a batch's row shard")
    return parse_row_shard(data)


class RowReader:
    """Units' JSON outputs by output path: a row of a shard, or a file of its
    own. Keeps the last few shards it loaded, so a reader taking one batch's
    units (or output paths in order) loads each shard once."""

    KEEP = 8

    def __init__(self, root: Path | str, max_file_bytes: int):
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self._shards: OrderedDict[str, RowShard] = OrderedDict()

    def shard(self, rel: str) -> RowShard:
        shard = self._shards.get(rel)
        if shard is None:
            shard = load_row_shard(self.root / rel)
            self._shards[rel] = shard
            if len(self._shards) > self.KEEP:
                self._shards.popitem(last=False)
        else:
            self._shards.move_to_end(rel)
        return shard

    def record(self, rel: str, uid: str | None = None) -> object:
        """The unit's output object (not yet checked as the processor's);
        OSError or InvalidOutput when it cannot be had."""
        file_rel, row = split_member(rel)
        if row is None:
            return _read_json_file(os.path.join(self.root, file_rel), self.max_file_bytes)
        shard = self.shard(file_rel)
        if row >= len(shard.records):
            raise InvalidOutput(f"row {row} is past the shard's {len(shard.records)} rows")
        if uid is not None and shard.ids[row] != uid:
            raise InvalidOutput(f"shard row {row} names another unit, not this one")
        return shard.records[row]


def _read_json_file(path: str, max_bytes: int) -> object:
    from campaigns.storage.outputs import read_json_output

    return read_json_output(Path(path), max_bytes, "output")
