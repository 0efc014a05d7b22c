"""A claimed batch between its model run and its recording, and the worker
process's finisher thread that writes and records one batch while the task
runs the next one's model (settings.BATCH_PIPELINE)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections

from campaigns.models import Batch, ErrorClass
from campaigns.review.queue import after_batch
from campaigns.runs.recording import batch_record
from common.log_context import bound
from gpuworker import beat, nvml
from gpuworker.memory import at_failure, runtime_facts
from gpuworker.processors import get_processor, sharded
from gpuworker.processors.base import Processor
from gpuworker.runner.claim import Outcome, worker_name
from gpuworker.runner.lease import LeaseKeeper
from gpuworker.runner.run import Part, compute
from gpuworker.runner.write import complete, drop_lease_records

log = logging.getLogger(__name__)


def pipeline_enabled() -> bool:
    """settings.BATCH_PIPELINE: "auto" hands batches off where the model runs on CUDA."""
    choice = settings.BATCH_PIPELINE
    if choice == "auto":
        return torch.cuda.is_available()
    return choice in ("1", "true", "yes", "on")


class BatchRun:
    """One claimed batch between its model run and its recording."""

    def __init__(self, batch: Batch, token: str, outcomes: list[Outcome]):
        self.batch, self.token, self.outcomes = batch, token, outcomes
        self.lease = LeaseKeeper(batch.pk, token)
        self.metrics: dict[str, Any] = {"items": len(outcomes), "runtime": runtime_facts()}
        self.error = ""
        self.seconds = 0.0
        self.processor: Processor | None = None
        self.parts: list[Part] = []
        self.claimed_at = time.time()

    def compute(self, *, prefetch_next: bool = False) -> None:
        """Read the inputs and run the model (the part that needs the device);
        with `prefetch_next`, prepare the next batch's inputs meanwhile."""
        started = time.perf_counter()
        try:
            version = self.batch.version
            self.processor = get_processor(
                self.batch.campaign.processor, version.params, version.software.get("files")
            )
            self.parts, adopted, splits = compute(
                self.batch, self.processor, self.outcomes, prefetch_next=prefetch_next
            )
            self.metrics.update(adopted=adopted)
            prefetched = sum(1 for o in self.outcomes if o.prefetched)
            if prefetched:
                self.metrics["prefetched"] = prefetched
            alone = sum(1 for o in self.outcomes if o.metrics.get("oom", {}).get("alone"))
            if self.parts or splits or alone:
                self.metrics["oom_splits"] = splits
            if alone:
                self.metrics["oom_alone"] = alone
            util = nvml.utilization(since=self.claimed_at)
            if util is not None:  # the device's busy share since the batch was claimed
                self.metrics["gpu_util"] = util
        except Exception as exc:  # the model itself failed: every unfinished unit says why
            self._failed(exc)
        self.seconds += time.perf_counter() - started

    def finish(self) -> str:
        """Write, check, record, then the checkpoint checks; returns run_batch's answer."""
        started = time.perf_counter()
        try:
            try:
                if self.parts and not self.error:
                    assert self.processor is not None  # parts come from its run
                    self.metrics.update(
                        complete(self.batch, self.processor, self.parts, self.token)
                    )
            except Exception as exc:
                self._failed(exc)
            self.metrics["seconds"] = round(self.seconds + time.perf_counter() - started, 4)
            recorded = batch_record(
                batch=self.batch,
                token=self.token,
                outcomes=self.outcomes,
                metrics=self.metrics,
                error=self.error,
                worker=worker_name(),
            )
        finally:
            self.lease.stop()
        if recorded:
            beat.batch_done()
            # A vector shard's claim writes no lease record (its zip CRCs vouch).
            if self.processor is not None and not sharded(self.processor):
                try:
                    drop_lease_records(self.batch)
                except OSError:  # left for verify, which removes those of finished batches
                    log.warning("batch %s: could not remove its lease records", self.batch.pk)
            try:
                after_batch(campaign=self.batch.campaign, version=self.batch.version)
            except Exception:  # the batch is recorded; the next batch or resume tries again
                log.exception("batch %s: could not open the checkpoint", self.batch.pk)
        return "done" if recorded else "lease lost"

    def _failed(self, exc: Exception) -> None:
        self.error = "".join(traceback.format_exception_only(exc)).strip()
        digest = hashlib.sha1(traceback.format_exc().encode()).hexdigest()[:12]
        log.exception("batch %s failed", self.batch.pk)
        error_class = _error_class(exc)
        # Out of memory outside the split (writing, a processor's metrics): the
        # figures all the same, but no batch sizes tried and not alone at batch 1.
        facts = (
            at_failure(str(exc), tried=[], alone=False)
            if error_class == ErrorClass.OUT_OF_MEMORY
            else None
        )
        for outcome in self.outcomes:
            if outcome.finished is None:
                outcome.fail(error_class, self.error, digest)
                if facts is not None:
                    outcome.metrics["oom"] = facts


def _error_class(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return ErrorClass.OUT_OF_MEMORY
    if isinstance(exc, SoftTimeLimitExceeded):
        return ErrorClass.TIMEOUT
    return ErrorClass.PROCESSING_ERROR


class _Finisher:
    """The worker process's thread that finishes handed-off batches, in order.

    At most one batch waits behind the one being finished: a worker whose
    disk or database is slower than its model waits here instead of piling
    up results in memory. `drain` (at worker shutdown) finishes them all.
    """

    WAITING = 1

    def __init__(self) -> None:
        self._forget()
        # A process forked from this one (a pool child) has none of its
        # threads: its own pool is made on its first batch.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[str]] = []
        self._lock = threading.Lock()

    def submit(self, run: BatchRun) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-finish")
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(self._finish, run))
            backlog = self._pending[: -1 - self.WAITING]
        for future in backlog:
            future.result()

    @staticmethod
    def _finish(run: BatchRun) -> str:
        # This thread's own connection, kept from batch to batch: checked (and
        # replaced if a database restart broke it) as a task's is before each task.
        close_old_connections()
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
