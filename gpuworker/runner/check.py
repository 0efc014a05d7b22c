"""Outputs checked before they count: a written file loaded back, a refused
one sent to review, and what an earlier claim of the batch wrote adopted
instead of recomputed (a worker died after writing, before recording) — only
what that claim's own record vouches for (`adoption_for`)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Protocol

from django.conf import settings

from campaigns.intake.inputs import InputError
from campaigns.models import Batch, ErrorClass
from campaigns.storage.lease_records import Vouched, read_records
from campaigns.storage.outputs import InvalidOutput, WrittenFile
from campaigns.storage.paths import lease_folder, shard_folder, shard_prefix
from campaigns.storage.row_shards import SUFFIX as ROW_SHARD_SUFFIX
from campaigns.storage.row_shards import line_sha256, load_row_shard
from campaigns.storage.vector_shards import (
    ROW_BYTES_PER_VALUE,
    load_shard,
    member_path,
    row_sha256,
)
from gpuworker.processors import row_sharded, sharded
from gpuworker.processors.base import Processor, RowShardedProcessor, ShardedProcessor
from gpuworker.runner.claim import Outcome

log = logging.getLogger(__name__)


class InputLost(OSError):
    """An input read again to make its output, and no longer the one its batch
    read (changed, gone): its write stops, with no file left, and the unit
    fails with the input's error class."""

    def __init__(self, error: InputError):
        super().__init__(error.message)
        self.error = error


def check_written(processor: Processor, outcome: Outcome, written: WrittenFile | OSError) -> None:
    """A written output counts once it loads back and holds; a write error fails the unit."""
    if isinstance(written, InputLost):
        outcome.fail(written.error.error_class, written.error.message)
        return
    if isinstance(written, OSError):
        # Disk full, permissions, a storage outage: no partial file was left,
        # and resume puts the unit back once the storage is fixed.
        outcome.fail(ErrorClass.OUTPUT_WRITE_ERROR, f"cannot write output: {written}")
        return
    assert outcome.path is not None  # set for every unit of a file-a-unit processor
    try:
        processor.validate(outcome.path)
    except InvalidOutput as exc:
        # It goes to the queue with its reason and counts at the checkpoint.
        refuse(outcome, exc)
        return
    except OSError as exc:
        # Written, then unreadable: the storage failed under it.
        outcome.fail(ErrorClass.OUTPUT_WRITE_ERROR, f"cannot read the output back: {exc}")
        return
    outcome.succeed(outcome.target, written.size, written.sha256)


def refuse(outcome: Outcome, exc: InvalidOutput) -> None:
    """An output that failed its check: a failure (it never counts) that a
    person sees too, with its reason, in the review queue."""
    outcome.fail(ErrorClass.OUTPUT_INVALID, f"output failed its check: {exc}")
    outcome.flags.append((exc.reason, str(exc)))


class Adoption(Protocol):
    """What a claim may take back instead of recomputing (`adoption_for`)."""

    def adopt(self, outcome: Outcome) -> bool:
        """Record the unit's output an earlier claim wrote; False: recompute it."""
        ...


class _Nothing:
    def adopt(self, outcome: Outcome) -> bool:
        return False


NOTHING: Adoption = _Nothing()


def adoption_for(batch: Batch, processor: Processor) -> Adoption:
    """What this claim of the batch may adopt: only what an earlier claim of the
    same batch wrote and vouched for, made from the input the unit reads now.

    An output at a unit's path that no record of this batch vouches for — a
    file verify judged damaged, a byte flipped since it was written, a leftover
    of another batch (a retry, a Pause and Resume) or of an input that changed
    since — is recomputed and atomically replaced, never taken back.
    """
    if not batch.deliveries:
        return NOTHING  # its first claim: no earlier claim wrote anything of it
    if sharded(processor):
        return ShardRows(adoptable_rows(batch, processor))
    folder = Path(settings.OUTPUT_ROOT) / lease_folder(
        campaign=batch.campaign.name, version_label=batch.version.label
    )
    if row_sharded(processor):
        return ShardRows(adoptable_lines(batch, processor, read_records(folder, batch.pk)))
    return VouchedFiles(processor, read_records(folder, batch.pk))


class VouchedFiles:
    """A file-a-unit processor's outputs, as the lease records of the batch's
    earlier claims name them (campaigns/storage/lease_records.py)."""

    def __init__(self, processor: Processor, vouched: dict[str, list[Vouched]]):
        self.processor, self.vouched = processor, vouched

    def adopt(self, outcome: Outcome) -> bool:
        path = outcome.path
        made_here = [
            v
            for v in self.vouched.get(outcome.unit.uid, ())
            if v.output == outcome.target and v.input_sha256 == outcome.input_sha256
        ]
        if path is None or not made_here:
            return False
        try:
            data = path.read_bytes()
        except OSError:
            return False  # gone (or unreadable): recomputed
        sha256 = hashlib.sha256(data).hexdigest()
        if not any(v.sha256 == sha256 for v in made_here):
            return False  # not the bytes the claim wrote: recomputed and replaced
        try:
            self.processor.validate(path)
        except (InvalidOutput, OSError):
            return False
        outcome.metrics = {"adopted": True}  # counted by run.compute
        outcome.succeed(outcome.target, len(data), sha256)
        return True


#: A row an earlier claim wrote: (its output path, size, sha256, and the
#: sha256 of the input it was made from).
Found = tuple[str, int, str, str]


class ShardRows:
    """A sharded processor's rows in the shards an earlier claim of the batch wrote."""

    def __init__(self, rows: dict[str, list[Found]]):
        self.rows = rows

    def adopt(self, outcome: Outcome) -> bool:
        for rel, size, sha256, input_sha256 in self.rows.get(outcome.unit.uid, ()):
            # A shard that does not say what its row was made from (one from
            # before shards carried it) proves nothing: the row is recomputed.
            if input_sha256 and input_sha256 == outcome.input_sha256:
                outcome.metrics = {"adopted": True}  # counted by run.compute
                outcome.succeed(rel, size, sha256)
                return True
        return False


def _batch_shards(batch: Batch, suffix: str) -> list[tuple[str, Path]]:
    """(output path, file) of each shard the batch's claims wrote, in name order."""
    folder_rel = shard_folder(
        campaign=batch.campaign.name, version_label=batch.version.label, batch_id=batch.pk
    )
    folder = Path(settings.OUTPUT_ROOT) / folder_rel
    try:
        names = sorted(
            e.name
            for e in os.scandir(folder)
            if e.name.startswith(shard_prefix(batch.pk)) and e.name.endswith(suffix)
        )
    except FileNotFoundError:
        return []
    return [(f"{folder_rel}/{name}", folder / name) for name in names]


def adoptable_rows(batch: Batch, processor: ShardedProcessor) -> dict[str, list[Found]]:
    """uid -> each whole, valid row in the vector shards an earlier claim of
    this batch wrote; a damaged shard is recomputed instead."""
    rows: dict[str, list[Found]] = {}
    for rel, path in _batch_shards(batch, ".npz"):
        try:
            shard = load_shard(path)
        except (InvalidOutput, OSError):
            log.warning("batch %s: shard %s is not whole, not adopted", batch.pk, rel)
            continue
        problems = processor.check_rows(shard.vectors)
        for row, uid in enumerate(shard.ids.tolist()):
            if problems[row] is None:
                vector = shard.vectors[row]
                size = vector.size * ROW_BYTES_PER_VALUE
                found = (member_path(rel, row), size, row_sha256(vector), shard.input_sha256(row))
                rows.setdefault(uid, []).append(found)
    return rows


def adoptable_lines(
    batch: Batch, processor: RowShardedProcessor, vouched: dict[str, list[Vouched]]
) -> dict[str, list[Found]]:
    """uid -> each line of the JSON row shards an earlier claim of this batch
    wrote that the claim's lease record vouches for (its place and the sha256
    of its bytes: a JSON line has no checksum of its own, so a byte flipped
    since is never taken back) and that passes the processor's check; a
    shard that is not whole is recomputed."""
    rows: dict[str, list[Found]] = {}
    for rel, path in _batch_shards(batch, ROW_SHARD_SUFFIX):
        try:
            shard = load_row_shard(path)
        except (InvalidOutput, OSError):
            log.warning("batch %s: shard %s is not whole, not adopted", batch.pk, rel)
            continue
        for row, uid in enumerate(shard.ids):
            line, at = shard.lines[row], member_path(rel, row)
            sha256 = line_sha256(line)
            if not any(v.output == at and v.sha256 == sha256 for v in vouched.get(uid, ())):
                continue
            if processor.check_record(shard.records[row]) is None:
                rows.setdefault(uid, []).append((at, len(line), sha256, shard.inputs[row]))
    return rows
