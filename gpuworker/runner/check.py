"""Outputs checked before they count: a written file loaded back, a refused
one sent to review, and what an earlier claim of the batch wrote adopted
instead of recomputed (a worker died after writing, before recording)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
from django.conf import settings

from campaigns.models import Batch, ErrorClass
from campaigns.storage.outputs import InvalidOutput, WrittenFile
from campaigns.storage.paths import shard_folder, shard_prefix
from campaigns.storage.vector_shards import load_shard, member_path
from gpuworker.processors.base import Processor, ShardedProcessor
from gpuworker.runner.claim import Outcome

log = logging.getLogger(__name__)


def check_written(processor: Processor, outcome: Outcome, written: WrittenFile | OSError) -> None:
    """A written output counts once it loads back and holds; a write error fails the unit."""
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


def adopt_file(processor: Processor, outcome: Outcome) -> bool:
    """A valid output already at the unit's path (a worker died after writing it,
    before recording it) is recorded, not recomputed."""
    path = outcome.path
    if path is None or not path.is_file():
        return False
    try:
        processor.validate(path)
    except InvalidOutput:
        return False  # a partial or bad file: recomputed and atomically replaced
    data = path.read_bytes()
    outcome.metrics = {"adopted": True}  # counted by run.compute
    outcome.succeed(outcome.target, len(data), hashlib.sha256(data).hexdigest())
    return True


def adoptable_rows(batch: Batch, processor: ShardedProcessor) -> dict[str, tuple[str, np.ndarray]]:
    """uid -> (output path, vector) of every whole, valid row in the shards an
    earlier claim of this batch wrote; a damaged shard is recomputed instead."""
    folder_rel = shard_folder(
        campaign=batch.campaign.name, version_label=batch.version.label, batch_id=batch.pk
    )
    folder = Path(settings.OUTPUT_ROOT) / folder_rel
    try:
        names = sorted(
            e.name
            for e in os.scandir(folder)
            if e.name.startswith(shard_prefix(batch.pk)) and e.name.endswith(".npz")
        )
    except FileNotFoundError:
        return {}
    rows: dict[str, tuple[str, np.ndarray]] = {}
    for name in names:
        rel = f"{folder_rel}/{name}"
        try:
            shard = load_shard(folder / name)
        except (InvalidOutput, OSError):
            log.warning("batch %s: shard %s is not whole, not adopted", batch.pk, rel)
            continue
        problems = processor.check_rows(shard.vectors)
        for row, uid in enumerate(shard.ids.tolist()):
            if problems[row] is None:
                rows[uid] = (member_path(rel, row), shard.vectors[row])
    return rows
