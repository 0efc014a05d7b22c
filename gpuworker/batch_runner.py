"""Run one batch: claim it, read inputs, run the processor, write, validate, record.

Every unit of the batch ends succeeded or failed with a class and a readable
reason; one bad input never stops the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from campaigns.models import Attempt, Batch, ErrorClass, Unit, UnitState
from campaigns.outputs import InvalidOutput, write_atomic
from campaigns.paths import output_relpath

from .inputs import InputError, read_bytes
from .lease import LeaseKeeper, lease_deadline
from .memory import runtime_facts
from .processors import get_processor

log = logging.getLogger(__name__)


def worker_name() -> str:
    # Per call: prefork children import this module before they fork.
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Outcome:
    unit: Unit
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

    def fail(self, error_class: str, message: str, digest: str = "") -> None:
        self.error_class, self.message = error_class, message[:2000]
        self.traceback_digest = digest
        self.finished = time.time()

    def succeed(self, rel: str, size: int, sha256: str) -> None:
        self.output_path, self.output_size, self.output_sha256 = rel, size, sha256
        self.finished = time.time()


def run_batch(batch_id: int) -> str:
    batch = Batch.objects.select_related("campaign", "version").filter(pk=batch_id).first()
    if batch is None:
        return "gone"
    # Claim by update: a second delivery of the same message finds nothing to do.
    token = uuid.uuid4().hex
    claimed = Batch.objects.filter(pk=batch_id, state=Batch.State.QUEUED).update(
        state=Batch.State.RUNNING,
        started_at=timezone.now(),
        worker=worker_name(),
        lease_token=token,
        lease_expires_at=lease_deadline(),
        deliveries=F("deliveries") + 1,
    )
    if not claimed:
        return "not runnable"
    Unit.objects.filter(batch=batch, state=UnitState.QUEUED).update(state=UnitState.RUNNING)
    units = list(Unit.objects.filter(batch=batch, state=UnitState.RUNNING).order_by("pk"))
    started = time.perf_counter()
    outcomes = [Outcome(unit=u) for u in units]
    batch_metrics: dict = {"items": len(units), "runtime": runtime_facts()}
    batch_error = ""
    with LeaseKeeper(batch_id, token):
        try:
            processor = get_processor(batch.campaign.processor, batch.version.params)
            batch_metrics.update(_process(batch, processor, outcomes))
        except Exception as exc:  # the model itself failed: every unfinished unit says why
            batch_error = "".join(traceback.format_exception_only(exc)).strip()
            digest = hashlib.sha1(traceback.format_exc().encode()).hexdigest()[:12]
            log.exception("batch %s failed", batch_id)
            for outcome in outcomes:
                if outcome.finished is None:
                    outcome.fail(_error_class(exc), batch_error, digest)
        batch_metrics["seconds"] = round(time.perf_counter() - started, 4)
        recorded = _record(batch, token, outcomes, batch_metrics, batch_error)
    return "done" if recorded else "lease lost"


def _error_class(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return ErrorClass.OUT_OF_MEMORY
    if isinstance(exc, SoftTimeLimitExceeded):
        return ErrorClass.TIMEOUT
    return ErrorClass.PROCESSING_ERROR


def _process(batch: Batch, processor, outcomes: list[Outcome]) -> dict:
    root = Path(batch.campaign.input_root)
    ready: list[tuple[Outcome, object]] = []
    adopted = 0
    for outcome in outcomes:
        unit = outcome.unit
        outcome.target = str(
            output_relpath(
                campaign=batch.campaign.name,
                version_label=batch.version.label,
                uid=unit.uid,
                suffix=processor.suffix,
            )
        )
        try:
            data = read_bytes(root, unit.source_path)
            outcome.input_sha256 = hashlib.sha256(data).hexdigest()
            if unit.sha256 and outcome.input_sha256 != unit.sha256:
                raise InputError(
                    ErrorClass.INPUT_CHANGED,
                    "input changed since import (sha256 differs); "
                    "resume --retry-failed processes the new content",
                )
            if _adopt(processor, outcome):
                adopted += 1
                continue
            ready.append((outcome, processor.prepare(data)))
        except InputError as exc:
            outcome.fail(exc.error_class, exc.message)
    if not ready:
        return {"adopted": adopted}
    result = processor.run([item for _, item in ready])
    for index, (outcome, _) in enumerate(ready):
        outcome.metrics = processor.unit_metrics(result, index)
        path = Path(settings.OUTPUT_ROOT) / outcome.target
        try:
            written = write_atomic(path, processor.serialize(result.vectors[index]))
            processor.validate(path)
        except InvalidOutput as exc:
            outcome.fail(ErrorClass.OUTPUT_INVALID, f"output failed its check: {exc}")
            continue
        except OSError as exc:
            outcome.fail(ErrorClass.PROCESSING_ERROR, f"cannot write output: {exc}")
            continue
        outcome.succeed(outcome.target, written.size, written.sha256)
    return {"adopted": adopted, **processor.batch_metrics(result)}


def _adopt(processor, outcome: Outcome) -> bool:
    """A valid output already at the unit's path (a worker died after writing it,
    before recording it) is recorded, not recomputed."""
    path = Path(settings.OUTPUT_ROOT) / outcome.target
    if not path.is_file():
        return False
    try:
        processor.validate(path)
    except InvalidOutput:
        return False  # a partial or bad file: recomputed and atomically replaced
    data = path.read_bytes()
    outcome.metrics = {"adopted": True}
    outcome.succeed(outcome.target, len(data), hashlib.sha256(data).hexdigest())
    return True


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
        unit.updated_at = now
        finished = o.finished or time.time()
        attempts.append(
            Attempt(
                unit=unit,
                batch=batch,
                version_id=batch.version_id,
                outcome=Attempt.Outcome.SUCCEEDED if ok else Attempt.Outcome.FAILED,
                error_class=o.error_class,
                error_message=o.message,
                traceback_digest=o.traceback_digest,
                input_sha256=o.input_sha256,
                output_path=o.output_path,
                output_size=o.output_size,
                output_sha256=o.output_sha256,
                worker=worker,
                started_at=datetime.fromtimestamp(o.started, tz=UTC),
                finished_at=datetime.fromtimestamp(finished, tz=UTC),
                duration_ms=max(0, int((finished - o.started) * 1000)),
                metrics=o.metrics,
            )
        )
    with transaction.atomic():
        owned = Batch.objects.filter(
            pk=batch.pk, state=Batch.State.RUNNING, lease_token=token
        ).update(state=Batch.State.FAILED if error else Batch.State.DONE)
        if not owned:
            log.warning("batch %s: lease lost before recording; results dropped", batch.pk)
            return False
        Unit.objects.bulk_update(
            [o.unit for o in outcomes],
            [
                "state",
                "error_class",
                "error_message",
                "output_path",
                "output_size",
                "output_sha256",
                "updated_at",
            ],
        )
        Attempt.objects.bulk_create(attempts)
        batch.finished_at = now
        batch.metrics = metrics
        batch.error = error
        batch.lease_expires_at = None
        batch.save(update_fields=["finished_at", "metrics", "error", "lease_expires_at"])
    return True
