"""A claim's lease record: what one claim of a batch wrote, made from which input.

A worker that dies after writing a batch's outputs and before recording them
leaves files that no database row describes. The next claim of the same batch
may take them back instead of recomputing them (adoption), but only what a
record vouches for: the lease record the dead claim wrote beside its outputs,
in the same atomic write group, names for each unit its output path, the
output's sha256 and the sha256 of the input bytes it was made from. A file at
a unit's path that no such record names with the very bytes on disk and the
input the unit reads now — a byte flipped since, a leftover of another batch or
of another campaign of the same name, an output of an input that changed — is
recomputed, never adopted.

One JSON file a claim at `<campaign>/<version>/.leases/b<batch>-<token>.json`
(campaigns/storage/paths.py), removed once the batch is recorded; verify removes
those of batches no longer running or queued. A vector shard needs none: it is
per claim already and carries its rows' input hashes itself
(campaigns/storage/vector_shards.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from campaigns.storage.paths import shard_prefix

SUFFIX = ".json"


@dataclass(frozen=True)
class Vouched:
    """One output a claim wrote: where, its sha256, and its input's sha256."""

    output: str
    sha256: str
    input_sha256: str


def record_bytes(*, batch_id: int, token: str, outputs: Iterable[tuple[str, Vouched]]) -> bytes:
    """The record of one claim: (unit id, what it wrote) for each output."""
    return json.dumps(
        {
            "batch": batch_id,
            "token": token,
            "outputs": {uid: [v.output, v.sha256, v.input_sha256] for uid, v in outputs},
        },
        separators=(",", ":"),
    ).encode()


def read_records(folder: Path, batch_id: int) -> dict[str, list[Vouched]]:
    """Unit id -> what the earlier claims of this batch vouch for. A record that
    cannot be read or parsed vouches for nothing (its outputs are recomputed)."""
    found: dict[str, list[Vouched]] = {}
    for path in _records(folder, batch_id):
        try:
            data = json.loads(path.read_bytes())
            if data.get("batch") != batch_id:
                continue
            for uid, (output, sha256, input_sha256) in data["outputs"].items():
                found.setdefault(uid, []).append(Vouched(output, sha256, input_sha256))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return found


def remove_records(folder: Path, batch_id: int) -> int:
    """Remove the batch's records (once it is recorded); returns how many."""
    removed = 0
    for path in _records(folder, batch_id):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def batch_of(name: str) -> int | None:
    """The batch id a record's file name names ('b12-….json' -> 12), else None."""
    if not (name.startswith("b") and name.endswith(SUFFIX)):
        return None
    head = name[1:].partition("-")[0]
    return int(head) if head.isdigit() else None


def _records(folder: Path, batch_id: int) -> list[Path]:
    prefix = shard_prefix(batch_id)
    try:
        with os.scandir(folder) as entries:
            return [
                Path(e.path)
                for e in entries
                if e.name.startswith(prefix) and e.name.endswith(SUFFIX)
            ]
    except FileNotFoundError:
        return []
