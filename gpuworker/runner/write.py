"""A batch's outputs after its model ran: each unit's metrics and review
flags, then its output written atomically (one vector or JSON row shard a
batch, or a file a unit beside the claim's lease record) and checked
(gpuworker/runner/check.py)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from django.conf import settings

from campaigns.intake.inputs import InputError
from campaigns.models import Batch, ErrorClass
from campaigns.runs.recording import outcomes_flag_drift, outcomes_flag_duplicates
from campaigns.storage.lease_records import Vouched, record_bytes, remove_records
from campaigns.storage.outputs import (
    HashingWriter,
    InvalidOutput,
    Streamed,
    WrittenFile,
    check_read_back,
    write_atomic,
    write_atomic_group,
)
from campaigns.storage.paths import lease_folder, lease_record_relpath, shard_relpath
from campaigns.storage.row_shards import SUFFIX as ROW_SHARD_SUFFIX
from campaigns.storage.row_shards import line_sha256, make_lines, parse_row_shard, parts_of
from campaigns.storage.vector_shards import (
    ROW_BYTES_PER_VALUE,
    make_shard,
    member_path,
    row_sha256,
)
from gpuworker.processors import review_flags, row_sharded, sharded
from gpuworker.processors.base import Processor, RowShardedProcessor, ShardedProcessor
from gpuworker.runner.check import InputLost, check_written, refuse
from gpuworker.runner.claim import Outcome
from gpuworker.runner.run import Part, merge_batch_metrics
from gpuworker.runner.threads import in_threads


def complete(batch: Batch, processor: Processor, parts: list[Part], token: str) -> dict[str, Any]:
    """Each output's metrics and flags, then its write and check; the batch's measurements."""
    jobs: list[tuple[Outcome, Any, int]] = []  # (outcome, its part's result, index in it)
    flag = review_flags(processor)
    for part, result in parts:
        for index, (outcome, _) in enumerate(part):
            outcome.metrics = processor.unit_metrics(result, index)
            outcome.flags = list(flag(result, index)) if flag else []
            jobs.append((outcome, result, index))
    outcomes = [o for o, _, _ in jobs]
    outcomes_flag_duplicates(batch=batch, outcomes=outcomes)
    outcomes_flag_drift(batch=batch, outcomes=outcomes)
    if sharded(processor):
        vectors = [(o, processor.output(result, index)) for o, result, index in jobs]
        write_shard(batch, processor, vectors, token)
        return merge_batch_metrics([processor.batch_metrics(result) for _, result in parts])
    if row_sharded(processor):
        records = [(o, processor.row_record(processor.output(r, i))) for o, r, i in jobs]
        write_row_shard(batch, processor, records, token)
        return merge_batch_metrics([processor.batch_metrics(result) for _, result in parts])

    # A file a unit: each output made (`output`, `serialize`) as it is written
    # and let go of before the next, so a batch of large images holds one at
    # a time. The claim's lease record goes first, in the same group, made
    # from what was written: one flush to disk for all, and a later claim
    # adopts only what it vouches for.
    # An input read again to make its output (a large image's) may have
    # changed since: that unit's write stops and it fails, the others go on.
    def made(result: Any, index: int) -> bytes | Streamed:
        try:
            content = processor.serialize(processor.output(result, index))
        except InputError as exc:
            raise InputLost(exc) from None
        if isinstance(content, Streamed):
            return Streamed(functools.partial(_reading_again, content.write))
        return content

    written = write_atomic_group(
        ((cast(Path, o.path), functools.partial(made, result, index)) for o, result, index in jobs),
        first=lambda results: (
            lease_record_path(batch, token),
            lease_record(batch, token, outcomes, results),
        ),
    )[1:]
    # Checks in threads: each reads its file back and decodes it.
    in_threads(
        lambda job: check_written(processor, *job),
        list(zip(outcomes, written, strict=True)),
    )
    return merge_batch_metrics([processor.batch_metrics(result) for _, result in parts])


def _reading_again(write: Callable[[HashingWriter], None], fh: HashingWriter) -> None:
    try:
        write(fh)
    except InputError as exc:
        raise InputLost(exc) from None


def lease_record_path(batch: Batch, token: str) -> Path:
    rel = lease_record_relpath(
        campaign=batch.campaign.name,
        version_label=batch.version.label,
        batch_id=batch.pk,
        token=token,
    )
    return Path(settings.OUTPUT_ROOT) / rel


def lease_record(
    batch: Batch, token: str, outcomes: list[Outcome], written: list[WrittenFile | OSError]
) -> bytes:
    """What this claim writes: each unit's output path, its bytes' sha256 and its input's
    (an output whose write failed is vouched for by no one)."""
    return record_bytes(
        batch_id=batch.pk,
        token=token,
        outputs=(
            (o.unit.uid, Vouched(o.target, w.sha256, o.input_sha256))
            for o, w in zip(outcomes, written, strict=True)
            if isinstance(w, WrittenFile)
        ),
    )


def drop_lease_records(batch: Batch) -> None:
    """The batch is recorded: its claims' records vouch for nothing any more."""
    folder = Path(settings.OUTPUT_ROOT) / lease_folder(
        campaign=batch.campaign.name, version_label=batch.version.label
    )
    remove_records(folder, batch.pk)


def _write_read_back(
    path: Path, data: bytes, outcomes: list[Outcome], written: WrittenFile | OSError | None = None
) -> bool:
    """A shard written atomically (or as `written` says a group wrote it) and
    read back whole, byte for byte; False (each unit failed
    output_write_error, no file left) when it could not be."""
    try:
        if written is None:
            write_atomic(path, data)
        elif isinstance(written, OSError):
            raise written
        try:
            check_read_back(path, data)
        except OSError:
            # Not what was written: no later claim may find it (adoption
            # would refuse it as not whole, and log so every time).
            path.unlink(missing_ok=True)
            raise
    except OSError as exc:
        # Disk full, permissions, a storage outage or one that lost the write:
        # no partial file is left (write_atomic leaves none, and one that does
        # not read back is removed), and resume puts the units back once the
        # storage is fixed.
        for outcome in outcomes:
            outcome.fail(ErrorClass.OUTPUT_WRITE_ERROR, f"cannot write output: {exc}")
        return False
    return True


def write_row_shard(
    batch: Batch,
    processor: RowShardedProcessor,
    jobs: list[tuple[Outcome, dict[str, Any]]],
    token: str,
) -> None:
    """The batch's JSON outputs in one JSON Lines shard (a part each
    PART_BYTES), with the claim's lease record vouching for each line, in one
    atomic group; each part read back whole, and each line, parsed from the
    bytes written, checked: a unit counts once the file holds its line as it
    was made and the line's fields pass the processor's check."""
    outcomes = [o for o, _ in jobs]
    ids = [o.unit.uid for o in outcomes]
    try:
        # Each line with the input it was made from: a later claim of the
        # batch adopts a line only for the input its unit reads then.
        lines = make_lines(ids, [r for _, r in jobs], [o.input_sha256 for o in outcomes])
    except ValueError as exc:  # an output no JSON line holds (NaN): the processor's fault
        for outcome in outcomes:
            refuse(outcome, InvalidOutput(f"not a JSON line: {exc}"))
        return
    parts = parts_of(lines)
    rels = [
        str(
            shard_relpath(
                campaign=batch.campaign.name,
                version_label=batch.version.label,
                batch_id=batch.pk,
                token=token,
                suffix=ROW_SHARD_SUFFIX,
                part=number,
            )
        )
        for number in range(len(parts))
    ]
    where = {row: (rels[n], at) for n, rows in enumerate(parts) for at, row in enumerate(rows)}
    datas = [b"".join(lines[row] + b"\n" for row in rows) for rows in parts]
    vouched = record_bytes(
        batch_id=batch.pk,
        token=token,
        outputs=(
            (uid, Vouched(member_path(*where[row]), line_sha256(lines[row]), o.input_sha256))
            for row, (uid, o) in enumerate(zip(ids, outcomes, strict=True))
        ),
    )
    root = Path(settings.OUTPUT_ROOT)
    written = write_atomic_group(
        ((root / rel, data) for rel, data in zip(rels, datas, strict=True)),
        first=lambda _: (lease_record_path(batch, token), vouched),
    )
    if isinstance(written[0], OSError):  # the record: nothing of this claim may be adopted
        for outcome in outcomes:
            outcome.fail(ErrorClass.OUTPUT_WRITE_ERROR, f"cannot write output: {written[0]}")
        return
    checked = time.time()
    for rel, data, rows, result in zip(rels, datas, parts, written[1:], strict=True):
        mine = [outcomes[row] for row in rows]
        if not _write_read_back(root / rel, data, mine, result):
            continue
        shard = parse_row_shard(data)
        for at, outcome in enumerate(mine):
            problem = processor.check_record(shard.records[at])
            if problem is not None:
                refuse(outcome, problem)
            else:
                line = shard.lines[at]
                outcome.succeed(member_path(rel, at), len(line), line_sha256(line), checked)


def write_shard(
    batch: Batch, processor: ShardedProcessor, jobs: list[tuple[Outcome, Any]], token: str
) -> None:
    """The batch's vectors in one shard file, read back and checked row by row:
    a unit counts once the file holds its row as it was made (every byte read
    back) and the row passes the processor's check."""
    rel = str(
        shard_relpath(
            campaign=batch.campaign.name,
            version_label=batch.version.label,
            batch_id=batch.pk,
            token=token,
        )
    )
    path = Path(settings.OUTPUT_ROOT) / rel
    outcomes = [o for o, _ in jobs]
    vectors = np.stack([np.asarray(v, dtype=np.float32).ravel() for _, v in jobs])
    # Each row with the input it was made from: a later claim of the batch
    # adopts a row only for the input its unit reads then.
    inputs = [o.input_sha256 for o in outcomes]
    data, shard = make_shard(
        [o.unit.uid for o in outcomes], vectors, inputs if all(inputs) else None
    )
    # Read back whole and compared byte for byte: the file holds the arrays
    # `shard` holds, so the rows checked below are the file's (parsing the
    # file again cost more than the rest of the shard's work:
    # bench/RESULTS.md, "A shard read back as bytes (2026-12-04)").
    if not _write_read_back(path, data, outcomes):
        return
    problems = processor.check_rows(shard.vectors)
    checked = time.time()
    for row, outcome in enumerate(outcomes):
        problem = problems[row] if shard.ids[row] == outcome.unit.uid else None
        if shard.ids[row] != outcome.unit.uid:
            refuse(outcome, InvalidOutput(f"shard row {row} names {shard.ids[row]!r}"))
        elif problem is not None:
            refuse(outcome, problem)
        else:
            vector = shard.vectors[row]
            outcome.succeed(
                member_path(rel, row),
                vector.size * ROW_BYTES_PER_VALUE,
                row_sha256(vector),
                checked,
            )
