"""Run one batch: claim it, read inputs, run the processor, write, validate, record.

Every unit of the batch ends succeeded or failed with a class and a readable
reason; one bad input never stops the others.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from campaigns.db.batch_statements import (
    ClaimedUnit,
    batch_to_run,
    claim_batch,
    claimed_units,
    earlier_outputs,
    record_batch,
)
from campaigns.db.row_inserts import insert_rows
from campaigns.db.row_updates import update_rows
from campaigns.intake.inputs import InputError, corpus_real_path, read_bytes
from campaigns.models import (
    Attempt,
    Batch,
    Checkpoint,
    ErrorClass,
    ReviewItem,
    Unit,
    UnitState,
)
from campaigns.review.flags import DRIFT_MIN_BATCH, FlagReason, drifting_categories
from campaigns.review.queue import REVIEWED_OUT, after_batch, units_release_reviewed
from campaigns.storage.outputs import InvalidOutput, WrittenFile, write_atomic, write_atomic_group
from campaigns.storage.paths import output_relpath, shard_folder, shard_prefix, shard_relpath
from campaigns.storage.vector_shards import (
    ROW_BYTES_PER_VALUE,
    load_shard,
    member_path,
    row_sha256,
    shard_bytes,
)
from common.log_context import bound
from gpuworker.input_prefetch import Prepared, prefetch
from gpuworker.lease import LeaseKeeper, lease_deadline
from gpuworker.memory import runtime_facts
from gpuworker.processors import get_processor, sharded

log = logging.getLogger(__name__)


def worker_name() -> str:
    # Per call: prefork children import this module before they fork.
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Outcome:
    unit: ClaimedUnit
    error_class: str = ""
    message: str = ""
    output_path: str = ""
    output_size: int | None = None
    output_sha256: str = ""
    metrics: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    finished: float | None = None

    input_sha256: str = ""
    traceback_digest: str = ""
    target: str = ""  # where this unit's output goes, relative to OUTPUT_ROOT
    path: Path | None = None  # the same, absolute (made once: Path parsing adds up)
    # (reason, detail) of each flag rule the output tripped: it goes to review.
    flags: list = field(default_factory=list)
    prefetched: bool = False  # its input was prepared while the last batch ran

    def fail(self, error_class: str, message: str, digest: str = "") -> None:
        self.error_class, self.message = error_class, message[:2000]
        self.traceback_digest = digest
        self.finished = time.time()

    def succeed(self, rel: str, size: int, sha256: str) -> None:
        self.output_path, self.output_size, self.output_sha256 = rel, size, sha256
        self.finished = time.time()


def run_batch(batch_id: int, *, hand_off: bool = False) -> str:
    """Run one batch; returns "done", "lease lost", "not runnable", "gone", or,
    with `hand_off`, "handed off".

    `hand_off` (the Celery task, settings.BATCH_PIPELINE) returns once the model
    has run: writing the outputs, recording and the checkpoint checks go to the
    process's finisher thread, so they overlap the next batch's reads and model
    instead of leaving the device idle. The batch keeps its lease until it is
    recorded; if the process dies first, the lease runs out, the sweeper
    requeues the batch, and its outputs already written are adopted.
    """
    batch = batch_to_run(batch_id)
    if batch is None:
        return "gone"
    # Every line logged while this batch runs names it and its campaign.
    with bound(campaign=batch.campaign_id, batch=batch_id):
        return _run_claimed(batch, hand_off=hand_off)


def _run_claimed(batch: Batch, *, hand_off: bool = False) -> str:
    batch_id = batch.pk
    # Claim by update: a second delivery of the same message finds nothing to do.
    token = uuid.uuid4().hex
    claimed = claim_batch(
        batch_id,
        started_at=timezone.now(),
        worker=worker_name(),
        lease_token=token,
        lease_expires_at=lease_deadline(),
    )
    if not claimed:
        return "not runnable"
    units = claimed_units(batch_id, batch.version_id, REVIEWED_OUT)
    # A unit a reviewer rejected or requeued under this version is neither run
    # nor adopted under it again: its output here is the one reviewed.
    suspects = [u.pk for u in units if u.reviewed_out]
    released = (
        units_release_reviewed(unit_ids=suspects, version_id=batch.version_id)
        if suspects
        else set()
    )
    if released:
        log.warning(
            "batch %s: %d unit(s) reviewed out under this version, not run", batch_id, len(released)
        )
        units = [u for u in units if u.pk not in released]
    run = _BatchRun(batch, token, [Outcome(unit=u) for u in units])
    run.lease.start()
    try:
        run.compute(prefetch_next=hand_off)
    except BaseException:
        run.lease.stop()
        raise
    if hand_off:
        finisher.submit(run)
        return "handed off"
    return run.finish()


def pipeline_enabled() -> bool:
    """settings.BATCH_PIPELINE: "auto" hands batches off where the model runs on CUDA."""
    choice = settings.BATCH_PIPELINE
    if choice == "auto":
        return torch.cuda.is_available()
    return choice in ("1", "true", "yes", "on")


class _BatchRun:
    """One claimed batch between its model run and its recording."""

    def __init__(self, batch: Batch, token: str, outcomes: list[Outcome]):
        self.batch, self.token, self.outcomes = batch, token, outcomes
        self.lease = LeaseKeeper(batch.pk, token)
        self.metrics: dict = {"items": len(outcomes), "runtime": runtime_facts()}
        self.error = ""
        self.seconds = 0.0
        self.processor = None
        self.parts: list = []

    def compute(self, *, prefetch_next: bool = False) -> None:
        """Read the inputs and run the model (the part that needs the device);
        with `prefetch_next`, prepare the next batch's inputs meanwhile."""
        started = time.perf_counter()
        try:
            version = self.batch.version
            self.processor = get_processor(
                self.batch.campaign.processor, version.params, version.software.get("files")
            )
            self.parts, adopted, splits = _compute(
                self.batch, self.processor, self.outcomes, prefetch_next=prefetch_next
            )
            self.metrics.update(adopted=adopted)
            prefetched = sum(1 for o in self.outcomes if o.prefetched)
            if prefetched:
                self.metrics["prefetched"] = prefetched
            if self.parts or splits:
                self.metrics["oom_splits"] = splits
        except Exception as exc:  # the model itself failed: every unfinished unit says why
            self._failed(exc)
        self.seconds += time.perf_counter() - started

    def finish(self) -> str:
        """Write, check, record, then the checkpoint checks; returns run_batch's answer."""
        started = time.perf_counter()
        try:
            try:
                if self.parts and not self.error:
                    self.metrics.update(
                        _complete(self.batch, self.processor, self.parts, self.token)
                    )
            except Exception as exc:
                self._failed(exc)
            self.metrics["seconds"] = round(self.seconds + time.perf_counter() - started, 4)
            recorded = _record(self.batch, self.token, self.outcomes, self.metrics, self.error)
        finally:
            self.lease.stop()
        if recorded:
            try:
                after_batch(campaign=self.batch.campaign, version=self.batch.version)
            except Exception:  # the batch is recorded; the next batch or resume tries again
                log.exception("batch %s: could not open the checkpoint", self.batch.pk)
        return "done" if recorded else "lease lost"

    def _failed(self, exc: Exception) -> None:
        self.error = "".join(traceback.format_exception_only(exc)).strip()
        digest = hashlib.sha1(traceback.format_exc().encode()).hexdigest()[:12]
        log.exception("batch %s failed", self.batch.pk)
        for outcome in self.outcomes:
            if outcome.finished is None:
                outcome.fail(_error_class(exc), self.error, digest)


class _Finisher:
    """The worker process's thread that finishes handed-off batches, in order.

    At most one batch waits behind the one being finished: a worker whose
    disk or database is slower than its model waits here instead of piling
    up results in memory. `drain` (at worker shutdown) finishes them all.
    """

    WAITING = 1

    def __init__(self):
        self._forget()
        # A process forked from this one (a pool child) has none of its
        # threads: its own pool is made on its first batch.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list = []
        self._lock = threading.Lock()

    def submit(self, run: _BatchRun) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-finish")
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(self._finish, run))
            backlog = self._pending[: -1 - self.WAITING]
        for future in backlog:
            future.result()

    @staticmethod
    def _finish(run: _BatchRun) -> str:
        with bound(campaign=run.batch.campaign_id, batch=run.batch.pk):
            try:
                return run.finish()
            except Exception:
                # The lease stops with this batch, so the sweeper requeues it
                # and its written outputs are adopted: logged, nothing lost.
                log.exception("batch %s: could not be recorded", run.batch.pk)
                for conn in connections.all(initialized_only=True):
                    with contextlib.suppress(DatabaseError):
                        conn.close()
                return "not recorded"

    def drain(self) -> None:
        """Finish every handed-off batch, then close the thread's database
        connection: a drained finisher belongs to a process going away."""
        with self._lock:
            pending, self._pending = self._pending, []
            pool = self._pool
        for future in pending:
            future.result()
        if pool is not None:
            pool.submit(connections.close_all).result()


finisher = _Finisher()


def _error_class(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return ErrorClass.OUT_OF_MEMORY
    if isinstance(exc, SoftTimeLimitExceeded):
        return ErrorClass.TIMEOUT
    return ErrorClass.PROCESSING_ERROR


def _compute(
    batch: Batch, processor, outcomes: list[Outcome], *, prefetch_next: bool = False
) -> tuple[list, int, list[int]]:
    """Read and prepare the inputs, run the model: (parts, adopted, OOM splits)."""
    ahead = prefetch.take(batch.pk)  # what was prepared while the last batch ran
    root = Path(batch.campaign.input_root)
    output_root = Path(settings.OUTPUT_ROOT)
    adoptable: dict[str, tuple[str, np.ndarray]] | None = None
    if sharded(processor):
        # A batch's first claim finds no shard of its own to adopt: only a
        # batch delivered again (its worker died before recording) looks.
        adoptable = _shard_rows(batch, processor) if batch.deliveries else {}
    else:
        for outcome in outcomes:
            outcome.target = str(
                output_relpath(
                    campaign=batch.campaign.name,
                    version_label=batch.version.label,
                    uid=outcome.unit.uid,
                    suffix=processor.suffix,
                )
            )
            outcome.path = output_root / outcome.target
    # Reading and decoding in threads: file I/O and image decoding release
    # the GIL, so a slow disk or a large image does not serialise the batch.
    real_root = corpus_real_path(root)  # once a batch, not once an input
    prepared = in_threads(
        lambda o: _prepare(processor, root, real_root, o, adoptable, ahead.get(o.unit.pk)),
        outcomes,
    )
    ready = [(o, item) for o, item in zip(outcomes, prepared, strict=True) if item is not _SKIP]
    adopted = sum(1 for o in outcomes if o.metrics.get("adopted"))
    splits: list[int] = []
    if prefetch_next:
        prefetch.start(batch, functools.partial(_prepare_ahead, processor, root, real_root))
    parts = _run_splitting(processor, ready, splits) if ready else []
    return parts, adopted, splits


def _complete(batch: Batch, processor, parts: list, token: str) -> dict:
    """Each output's metrics and flags, then its write and check; the batch's measurements."""
    jobs = []
    flag = getattr(processor, "flags", None)
    shards = sharded(processor)
    for part, result in parts:
        for index, (outcome, _) in enumerate(part):
            outcome.metrics = processor.unit_metrics(result, index)
            outcome.flags = list(flag(result, index)) if flag else []
            output = processor.output(result, index)
            jobs.append((outcome, output if shards else processor.serialize(output)))
    _flag_duplicates(batch, [o for o, _ in jobs])
    _flag_drift(batch, [o for o, _ in jobs])
    if shards:
        _write_shard(batch, processor, jobs, token)
        return merge_batch_metrics([processor.batch_metrics(result) for _, result in parts])
    written = write_atomic_group((o.path, data) for o, data in jobs)
    # Checks in threads: each reads its file back and decodes it.
    in_threads(
        lambda job: _check(processor, *job),
        [(o, w) for (o, _), w in zip(jobs, written, strict=True)],
    )
    return merge_batch_metrics([processor.batch_metrics(result) for _, result in parts])


_SKIP = object()
_NOT_PREPARED = object()
IO_THREADS = 4
_pool: ThreadPoolExecutor | None = None


def _io_pool() -> ThreadPoolExecutor:
    """One pool per worker process, made on first use (after the prefork fork)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=IO_THREADS - 1, thread_name_prefix="unit-io")
    return _pool


def _forget_io_pool() -> None:
    # A forked child has none of the parent's threads: a pool it inherited
    # would take work that no thread ever runs.
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_io_pool)


def in_threads(fn, items: list) -> list:
    """[fn(item) for item in items], by IO_THREADS threads (this one included)
    that each take the next item as they finish one.

    One task per thread, not per item: a future per item costs more than
    reading and checking a short text (bench/orchestration.py), and taking the
    next item keeps a few large images from holding up one thread's share.
    The first exception is raised once every thread has stopped.
    """
    results: list = [None] * len(items)
    # next() on a count is atomic under the GIL: no item is taken twice.
    taken = itertools.count()

    def work() -> None:
        for index in taken:
            if index >= len(items):
                return
            results[index] = fn(items[index])

    helpers = min(IO_THREADS, len(items)) - 1
    futures = [_io_pool().submit(work) for _ in range(helpers)]
    try:
        work()
    finally:
        for future in futures:
            future.exception()  # waits
    for future in futures:
        future.result()
    return results


def _check(processor, outcome: Outcome, written: WrittenFile | OSError) -> None:
    """A written output counts once it loads back and holds; a write error fails the unit."""
    if isinstance(written, OSError):
        # Disk full, permissions, a storage outage: no partial file was left,
        # and resume puts the unit back once the storage is fixed.
        outcome.fail(ErrorClass.OUTPUT_WRITE_ERROR, f"cannot write output: {written}")
        return
    try:
        processor.validate(outcome.path)
    except InvalidOutput as exc:
        # It goes to the queue with its reason and counts at the checkpoint.
        _refused(outcome, exc)
        return
    except OSError as exc:
        # Written, then unreadable: the storage failed under it.
        outcome.fail(ErrorClass.OUTPUT_WRITE_ERROR, f"cannot read the output back: {exc}")
        return
    outcome.succeed(outcome.target, written.size, written.sha256)


def _write_shard(batch: Batch, processor, jobs: list, token: str) -> None:
    """The batch's vectors in one shard file, read back and checked row by row:
    a unit counts once its row loads back whole and passes the processor's check."""
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
    try:
        write_atomic(path, shard_bytes([o.unit.uid for o in outcomes], vectors))
        shard = load_shard(path, dimension=vectors.shape[1])
    except InvalidOutput as exc:
        for outcome in outcomes:
            _refused(outcome, exc)
        return
    except OSError as exc:
        # Disk full, permissions, a storage outage: write_atomic left no partial
        # file, and resume puts the units back once the storage is fixed.
        for outcome in outcomes:
            outcome.fail(ErrorClass.OUTPUT_WRITE_ERROR, f"cannot write output: {exc}")
        return
    problems = processor.check_rows(shard.vectors)
    for row, outcome in enumerate(outcomes):
        if shard.ids[row] != outcome.unit.uid:
            _refused(outcome, InvalidOutput(f"shard row {row} names {shard.ids[row]!r}"))
        elif problems[row] is not None:
            _refused(outcome, problems[row])
        else:
            vector = shard.vectors[row]
            outcome.succeed(
                member_path(rel, row), vector.size * ROW_BYTES_PER_VALUE, row_sha256(vector)
            )


def _refused(outcome: Outcome, exc: InvalidOutput) -> None:
    """An output that failed its check: a failure (it never counts) that a
    person sees too, with its reason, in the review queue."""
    outcome.fail(ErrorClass.OUTPUT_INVALID, f"output failed its check: {exc}")
    outcome.flags.append((exc.reason, str(exc)))


def _shard_rows(batch: Batch, processor) -> dict[str, tuple[str, np.ndarray]]:
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


def _prepare(
    processor,
    root: Path,
    real_root,
    outcome: Outcome,
    adoptable: dict | None = None,
    ahead: Prepared | None = None,
):
    """The unit's model input, or _SKIP when it failed or its output was adopted.

    `ahead`: the unit's input as the prefetch prepared it while the last batch
    ran; it goes through the same hash check and adoption as one read here.
    """
    unit = outcome.unit
    try:
        # Prepared bytes other than the import's are read again: only this
        # batch's own reading says an input changed.
        if ahead is not None and (ahead.source_path, ahead.sha256) == (
            unit.source_path,
            unit.sha256 or ahead.sha256,
        ):
            outcome.input_sha256, made = ahead.sha256, ahead.item
            outcome.prefetched = True
        else:
            data = read_bytes(root, unit.source_path, real_root)
            outcome.input_sha256, made = hashlib.sha256(data).hexdigest(), _NOT_PREPARED
        if unit.sha256 and outcome.input_sha256 != unit.sha256:
            raise InputError(
                ErrorClass.INPUT_CHANGED,
                "input changed since import (sha256 differs); "
                "resume --retry-failed processes the new content",
            )
        if adoptable is not None:
            if outcome.unit.uid in adoptable:
                rel, vector = adoptable[outcome.unit.uid]
                outcome.metrics = {"adopted": True}  # counted by _compute
                outcome.succeed(rel, vector.size * ROW_BYTES_PER_VALUE, row_sha256(vector))
                return _SKIP
        elif _adopt(processor, outcome):
            return _SKIP
        if made is _NOT_PREPARED:
            return processor.prepare(data)
        if isinstance(made, InputError):
            raise made
        return made
    except InputError as exc:
        outcome.fail(exc.error_class, exc.message)
        return _SKIP


def _prepare_ahead(
    processor, root: Path, real_root, units: list[tuple[int, str]], stop: threading.Event
) -> dict[int, Prepared]:
    """input_prefetch's reader: the units' inputs read, hashed and prepared
    as `_prepare` does, without a claim. An input that cannot be read is left
    for the batch's own reading, which classifies it then."""

    def one(unit: tuple[int, str]) -> tuple[int, Prepared] | None:
        pk, source_path = unit
        if stop.is_set():
            return None
        try:
            data = read_bytes(root, source_path, real_root)
        except InputError:
            return None
        try:
            made = processor.prepare(data)
        except InputError as exc:
            made = exc  # refused now as it would be then: the same bytes
        except Exception:
            return None  # the batch's own prepare raises it, where it is handled
        return pk, Prepared(source_path, hashlib.sha256(data).hexdigest(), made)

    return dict(found for found in in_threads(one, units) if found is not None)


def _run_splitting(processor, ready: list, splits: list[int]) -> list[tuple[list, object]]:
    """Run the model; on device out-of-memory, split the batch in halves and retry.

    A unit that does not fit even alone fails `out_of_memory` (a heavy case
    for review); the rest of the batch goes on.
    """
    try:
        return [(ready, processor.run([item for _, item in ready]))]
    except torch.OutOfMemoryError:
        pass
    # Retried outside the except block: inside it the exception's traceback keeps
    # the failed forward pass's frames, and so its tensors, alive on the device.
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # give the halves the memory the failed try reserved
    if len(ready) == 1:
        ready[0][0].fail(
            ErrorClass.OUT_OF_MEMORY,
            "does not fit in device memory even alone (batch split down to one unit)",
        )
        return []
    splits.append(len(ready))
    middle = len(ready) // 2
    return _run_splitting(processor, ready[:middle], splits) + _run_splitting(
        processor, ready[middle:], splits
    )


def merge_batch_metrics(parts: list[dict]) -> dict:
    """One batch's measurements from its parts (more than one after an OOM split)."""
    if not parts:
        return {}
    merged = dict(parts[-1])
    for key in ("real_tokens", "padded_tokens", "compute_seconds"):
        if any(key in p for p in parts):
            merged[key] = sum(p.get(key, 0) for p in parts)
    memory = dict(parts[-1].get("memory", {}))
    for key in ("peak_allocated", "peak_reserved", "peak_rss"):
        values = [p.get("memory", {}).get(key) for p in parts]
        if any(v is not None for v in values):
            memory[key] = max(v for v in values if v is not None)
    merged["memory"] = memory
    return merged


def _flag_duplicates(batch: Batch, outcomes: list[Outcome]) -> None:
    """Flag the same vector for different inputs, in this batch or earlier ones
    of the same version."""
    by_hash: dict[str, list[Outcome]] = {}
    for o in outcomes:
        digest = o.metrics.get("vector_hash")
        if digest:
            by_hash.setdefault(digest, []).append(o)
    if not by_hash:
        return
    earlier = {
        digest: (uid, sha) for digest, uid, sha in earlier_outputs(batch.version_id, list(by_hash))
    }
    for digest, group in by_hash.items():
        for o in group:
            twins = [t.unit.uid for t in group if t is not o and t.input_sha256 != o.input_sha256]
            if digest in earlier and earlier[digest][1] != o.input_sha256:
                twins.append(earlier[digest][0])
            if twins:
                o.flags.append(
                    (FlagReason.DUPLICATE_VECTOR, f"same vector as {', '.join(sorted(twins)[:3])}")
                )


def _flag_drift(batch: Batch, outcomes: list[Outcome]) -> None:
    """After a passed checkpoint, a batch whose categories drift from the
    spot-check sample's goes to review (classification: metrics["category"])."""
    categories = [o.metrics.get("category") for o in outcomes if o.metrics.get("category")]
    threshold = float(batch.version.params.get("flag_max_drift", 1))
    if len(categories) < DRIFT_MIN_BATCH or threshold >= 1:
        return
    checkpoint = Checkpoint.objects.filter(
        campaign_id=batch.campaign_id, version=batch.version, state=Checkpoint.State.PASSED
    ).first()
    if checkpoint is None:
        return
    reference = [
        c
        for c in Attempt.objects.filter(
            unit_id__in=checkpoint.sample, version=batch.version, outcome="succeeded"
        ).values_list("metrics__category", flat=True)
        if c
    ]
    drifting = drifting_categories(categories, reference, threshold)
    for o in outcomes:
        category = o.metrics.get("category")
        if category in drifting:
            share, expected = drifting[category]
            o.flags.append(
                (
                    FlagReason.CATEGORY_DRIFT,
                    f"{category} is {share:.0%} of this batch, {expected:.0%} of the "
                    "checkpoint sample",
                )
            )


def _adopt(processor, outcome: Outcome) -> bool:
    """A valid output already at the unit's path (a worker died after writing it,
    before recording it) is recorded, not recomputed."""
    path = outcome.path
    if not path.is_file():
        return False
    try:
        processor.validate(path)
    except InvalidOutput:
        return False  # a partial or bad file: recomputed and atomically replaced
    data = path.read_bytes()
    outcome.metrics = {"adopted": True}  # counted by _compute
    outcome.succeed(outcome.target, len(data), hashlib.sha256(data).hexdigest())
    return True


_RESULT_FIELDS = (
    "state",
    "error_class",
    "error_message",
    "output_path",
    "output_size",
    "output_sha256",
)


def _save_unit_results(units: list[ClaimedUnit], now) -> None:
    """The batch's results in one statement (campaigns/db/row_updates.py): on
    PostgreSQL the unit counters' trigger then runs once for the batch, not
    once per unit (4.2 → 2.3 ms for 64 units, bench/RESULTS.md)."""
    update_rows(
        Unit,
        _RESULT_FIELDS,
        [(u.pk, *(getattr(u, name) for name in _RESULT_FIELDS)) for u in units],
        also={"updated_at": now},
    )


# In the order _record builds an attempt's row.
_ATTEMPT_FIELDS = (
    "unit_id",
    "batch_id",
    "version_id",
    "outcome",
    "error_class",
    "error_message",
    "traceback_digest",
    "input_sha256",
    "output_path",
    "output_size",
    "output_sha256",
    "worker",
    "started_at",
    "finished_at",
    "duration_ms",
    "metrics",
)

_COLUMNS = ("real_tokens", "padded_tokens", "compute_seconds")


def _record(batch: Batch, token: str, outcomes: list[Outcome], metrics: dict, error: str) -> bool:
    """Results of the whole batch in one transaction: bulk update, bulk insert.

    Only while this worker still holds the lease: if it stalled past the lease
    and the batch went to another worker, these results are dropped (the files
    it wrote are deterministic and validated, so the other worker adopts them).
    """
    now = timezone.now()
    worker = worker_name()
    attempts = []
    for o in outcomes:
        unit = o.unit
        ok = not o.error_class
        unit.state = UnitState.SUCCEEDED if ok else UnitState.FAILED
        unit.error_class, unit.error_message = o.error_class, o.message
        unit.output_path, unit.output_size, unit.output_sha256 = (
            o.output_path,
            o.output_size,
            o.output_sha256,
        )
        finished = o.finished or time.time()
        attempts.append(
            (
                unit.pk,
                batch.pk,
                batch.version_id,
                Attempt.Outcome.SUCCEEDED if ok else Attempt.Outcome.FAILED,
                o.error_class,
                o.message,
                o.traceback_digest,
                o.input_sha256,
                o.output_path,
                o.output_size,
                o.output_sha256,
                worker,
                datetime.fromtimestamp(o.started, tz=UTC),
                datetime.fromtimestamp(finished, tz=UTC),
                max(0, int((finished - o.started) * 1000)),
                o.metrics,
            )
        )
    flagged = [o for o in outcomes if o.flags and o.unit.state == UnitState.SUCCEEDED]
    for o in flagged:
        # The output is written and valid; a person decides whether it counts.
        o.unit.state = UnitState.NEEDS_REVIEW
    # Outputs their check refused stay failed, and are reviewed all the same.
    refused = [o for o in outcomes if o.flags and o.error_class == ErrorClass.OUTPUT_INVALID]
    memory = metrics.get("memory", {})
    results = {
        "state": Batch.State.FAILED if error else Batch.State.DONE,
        "finished_at": now,
        "metrics": {k: v for k, v in metrics.items() if k not in _COLUMNS},
        "error": error,
        "lease_expires_at": None,
        "real_tokens": metrics.get("real_tokens"),
        "padded_tokens": metrics.get("padded_tokens"),
        "compute_seconds": metrics.get("compute_seconds"),
        "mem_allocated": memory.get("allocated"),
        "mem_reserved": memory.get("reserved"),
        "mem_peak_allocated": memory.get("peak_allocated"),
        "mem_peak_reserved": memory.get("peak_reserved"),
        "rss": memory.get("rss"),
    }
    with transaction.atomic():
        # The lease check and the batch's own results in one statement.
        if not record_batch(batch.pk, token, results):
            log.warning("batch %s: lease lost before recording; results dropped", batch.pk)
            return False
        for name, value in results.items():
            setattr(batch, name, value)
        _save_unit_results([o.unit for o in outcomes], now)
        # With their ids (RETURNING, on SQLite and PostgreSQL): each item names its attempt.
        attempt_ids = insert_rows(Attempt, _ATTEMPT_FIELDS, attempts)
        attempt_of = {id(o): pk for o, pk in zip(outcomes, attempt_ids, strict=True)}
        ReviewItem.objects.bulk_create(
            ReviewItem(
                campaign_id=batch.campaign_id,
                unit_id=o.unit.pk,
                attempt_id=attempt_of[id(o)],
                version_id=batch.version_id,
                reason=reason,
                detail=detail[:2000],
            )
            for o in flagged + refused
            for reason, detail in o.flags
        )
    for o in outcomes:
        if o.error_class:
            log.info("unit failed: %s", o.error_class, extra={"unit": o.unit.pk})
    log.info(
        "batch %s recorded: %d succeeded, %d failed, %d to review, %.2f s",
        batch.pk,
        sum(1 for o in outcomes if not o.error_class),
        sum(1 for o in outcomes if o.error_class),
        len(flagged) + len(refused),
        metrics.get("seconds", 0.0),
    )
    return True
