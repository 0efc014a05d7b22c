"""A batch's JSON outputs in one file: the row shard format, its reading and
its checks (the JSON counterpart of campaigns/storage/vector_shards.py).

A row shard is JSON Lines: one object a unit, `{"id": …, <the processor's
fields>…, "input_sha256": …}`, each line ended by a newline, in the batch's
order. Any JSON Lines reader takes it (`pd.read_json(path, lines=True)`).
A unit's output path names its line, '<campaign>/<version>/shards/…/
b12-….jsonl#7', its output size and sha256 are those of that line's bytes
(without its newline), and `input_sha256` is the sha256 of the input it was
made from. A JSON line carries no checksum of its own: the claim's lease
record (campaigns/storage/lease_records.py), written in the same atomic
group, vouches for each line's sha256, and a later claim of the batch adopts
a line only where its record vouches for the bytes there and the input its
unit reads then. One file a batch: a batch's outputs cost one create, one
write and one flush to disk, and a million prompts make tens of thousands of
files, not a million. A batch whose lines pass PART_BYTES is written as
several parts (`b12-….jsonl`, `b12-…-1.jsonl`, …), so no shard outgrows what
a reader loads.

Readers of single units go through `RowReader`, which reads a line where an
index of the shard's line offsets says it is (and a unit's own .json file
too, so outputs written a file a unit stay readable beside shards).
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from campaigns.storage.outputs import WRONG_OUTPUT, InvalidOutput
from campaigns.storage.vector_shards import split_member

SUFFIX = ".jsonl"
ID, INPUT = "id", "input_sha256"
#: A shard part's most bytes as written: a batch's lines past it go to a
#: further part (one line is never split: it is at most an output's own bound).
PART_BYTES = 64 << 20
#: Adoption and verify read a shard whole; past this it is not one this
#: system wrote (a part, plus one longest line).
MAX_SHARD_BYTES = 256 << 20


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


def make_lines(ids: list[str], records: list[dict], inputs: list[str]) -> list[bytes]:
    """Each row's line (without its newline); ValueError for a record that is
    no JSON object of plain values (NaN, a field named id or input_sha256)."""
    lines = []
    for uid, record, made_from in zip(ids, records, inputs, strict=True):
        if ID in record or INPUT in record:
            raise ValueError(f"an output's fields may not be named {ID!r} or {INPUT!r}")
        row = {ID: uid, **record, INPUT: made_from}
        lines.append(json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    return lines


def parts_of(lines: list[bytes]) -> list[list[int]]:
    """The rows of each part, in order: as many lines as PART_BYTES holds (one at least)."""
    parts: list[list[int]] = [[]]
    held = 0
    for row, line in enumerate(lines):
        if parts[-1] and held + len(line) + 1 > PART_BYTES:
            parts.append([])
            held = 0
        parts[-1].append(row)
        held += len(line) + 1
    return parts


def make_row_shard(
    ids: list[str], records: list[dict], inputs: list[str]
) -> tuple[bytes, RowShard]:
    """The shard of these rows as the bytes to write, and as what those bytes
    hold, parsed back from them (what a reader will find)."""
    data = b"".join(line + b"\n" for line in make_lines(ids, records, inputs))
    return data, parse_row_shard(data)


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
    """Units' JSON outputs by output path: a line of a shard, or a file of its
    own. A shard's line offsets are found once (the file streamed, never held)
    and kept, 8 bytes a line, for up to KEEP shards: a reader taking units in
    any order (an export in import order, whose neighbours lie in different
    batches) reads each shard once and then each line alone."""

    KEEP = 65536
    _CHUNK = 1 << 20

    def __init__(self, root: Path | str, max_file_bytes: int):
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self._offsets: OrderedDict[str, array] = OrderedDict()

    def offsets(self, rel: str) -> array:
        """Where each line of the shard starts, and where the last one ends."""
        found = self._offsets.get(rel)
        if found is not None:
            self._offsets.move_to_end(rel)
            return found
        found = array("q", [0])
        with open(self.root / rel, "rb") as fh:
            at = 0
            while chunk := fh.read(self._CHUNK):
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    found.append(at + end + 1)
                    start = end + 1
                at += len(chunk)
        self._offsets[rel] = found
        if len(self._offsets) > self.KEEP:
            self._offsets.popitem(last=False)
        return found

    def record(self, rel: str, uid: str | None = None) -> object:
        """The unit's output object (not yet checked as the processor's);
        OSError or InvalidOutput when it cannot be had."""
        file_rel, row = split_member(rel)
        if row is None:
            return _read_json_file(os.path.join(self.root, file_rel), self.max_file_bytes)
        offsets = self.offsets(file_rel)
        if row + 1 >= len(offsets):
            raise InvalidOutput(f"row {row} is past the shard's {len(offsets) - 1} whole lines")
        length = offsets[row + 1] - offsets[row]
        if length > self.max_file_bytes + 4096:
            raise InvalidOutput(f"line {row} is {length:,} bytes, longer than any output")
        with open(self.root / file_rel, "rb") as fh:
            fh.seek(offsets[row])
            line = fh.read(length)
        if not line.endswith(b"\n"):
            raise InvalidOutput(f"line {row} is cut short (the shard changed since it was read)")
        shard = parse_row_shard(line)
        if uid is not None and shard.ids[0] != uid:
            raise InvalidOutput(f"shard row {row} names another unit, not this one")
        return shard.records[0]


def _read_json_file(path: str, max_bytes: int) -> object:
    from campaigns.storage.outputs import read_json_output

    return read_json_output(Path(path), max_bytes, "output")
