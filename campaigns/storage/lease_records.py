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
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from campaigns.storage.paths import shard_prefix

SUFFIX = ".json"

log = logging.getLogger(__name__)


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


#: The largest record read: a batch of 4,096 units (the largest batch a
#: built-in processor takes) with ids of 1,000 characters, JSON-escaped, is
#: well under it. A larger file is no record a claim wrote.
RECORD_MAX_BYTES = 64 * 2**20


class DamagedRecord(Exception):
    """Why a lease record vouches for nothing (its outputs are recomputed)."""


def read_records(folder: Path, batch_id: int) -> dict[str, list[Vouched]]:
    """Unit id -> what the earlier claims of this batch vouch for. A record that
    cannot be read, or is not whole and well formed, vouches for nothing (its
    outputs are recomputed), and the log says why."""
    found: dict[str, list[Vouched]] = {}
    for path in _records(folder, batch_id):
        try:
            outputs = read_record(path, batch_id)
        except DamagedRecord as exc:
            log.warning("lease record %s vouches for nothing: %s", path, exc)
            continue
        for uid, vouched in outputs:
            found.setdefault(uid, []).append(vouched)
    return found


def read_record(path: Path, batch_id: int) -> list[tuple[str, Vouched]]:
    """(unit id, what it wrote) for each output the record at `path` names;
    DamagedRecord, and nothing else, for any file that is not a whole record of
    this batch as record_bytes writes one: it is taken whole or not at all."""
    try:
        with open(path, "rb") as fh:
            # read(n) allocates n bytes up front: no more than the file holds.
            size = os.fstat(fh.fileno()).st_size
            if size > RECORD_MAX_BYTES:
                raise DamagedRecord(f"{size:,} bytes, more than any claim writes")
            data = fh.read(size + 1)
    except OSError as exc:
        raise DamagedRecord(f"cannot be read: {exc.strerror or exc}") from exc
    if len(data) > RECORD_MAX_BYTES:
        raise DamagedRecord(f"over {RECORD_MAX_BYTES:,} bytes, more than any claim writes")
    try:
        record = json.loads(data)
    except (ValueError, RecursionError) as exc:
        # Not JSON, not text, or nested past Python's recursion limit.
        raise DamagedRecord(f"not JSON: {str(exc)[:120]}") from exc
    if not isinstance(record, dict) or not isinstance(record.get("outputs"), dict):
        raise DamagedRecord("not a lease record: no 'outputs' object")
    # type(): JSON's true is no batch id, though True == 1.
    if type(record.get("batch")) is not int or record["batch"] != batch_id:
        raise DamagedRecord(f"a record of batch {record.get('batch')!r:.40}, not {batch_id}")
    outputs = []
    for uid, entry in record["outputs"].items():
        if not (
            type(entry) is list and len(entry) == 3 and all(type(field) is str for field in entry)
        ):
            raise DamagedRecord(
                f"unit {uid!r:.80}: {entry!r:.80} is not [output, sha256, input sha256]"
            )
        outputs.append((uid, Vouched(*entry)))
    return outputs


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
    # ASCII digits only, and no more than a batch id has: int() takes other
    # scripts' digits, and refuses thousands of them.
    return int(head) if head.isascii() and head.isdigit() and len(head) <= 19 else None


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
    except OSError as exc:
        # Not a folder, or one that may not be listed: no record can be read
        # from it (so none vouches) nor removed.
        log.warning("lease records in %s cannot be listed: %s", folder, exc.strerror or exc)
        return []
