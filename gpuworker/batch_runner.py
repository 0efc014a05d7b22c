"""Run one batch: claim it, read inputs, run the processor, write, validate, record.

Every unit of the batch ends succeeded or failed with a class and a readable
reason; one bad input never stops the others.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from campaigns.models import Attempt, Batch, ErrorClass, Unit, UnitState
from campaigns.outputs import InvalidOutput, write_atomic
from campaigns.paths import output_relpath

from .inputs import InputError, read_bytes
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

    def fail(self, error_class: str, message: str) -> None:
        self.error_class, self.message = error_class, message[:2000]
        self.finished = time.time()


def run_batch(batch_id: int) -> str:
    batch = Batch.objects.select_related("campaign", "version").filter(pk=batch_id).first()
    if batch is None:
        return "gone"
    # Claim by update: a second delivery of the same message finds nothing to do.
    claimed = Batch.objects.filter(pk=batch_id, state=Batch.State.QUEUED).update(
        state=Batch.State.RUNNING, started_at=timezone.now(), worker=worker_name()
    )
    if not claimed:
        return "not runnable"
    Unit.objects.filter(batch=batch, state=UnitState.QUEUED).update(state=UnitState.RUNNING)
    units = list(Unit.objects.filter(batch=batch, state=UnitState.RUNNING).order_by("pk"))
    started = time.perf_counter()
    outcomes = [Outcome(unit=u) for u in units]
    batch_metrics: dict = {"items": len(units), "runtime": runtime_facts()}
    batch_error = ""
    try:
        processor = get_processor(batch.campaign.processor, batch.version.params)
        batch_metrics.update(_process(batch, processor, outcomes))
    except Exception as exc:  # the model itself failed: every unfinished unit says why
        error_class = (
            ErrorClass.OUT_OF_MEMORY
            if isinstance(exc, torch.OutOfMemoryError)
            else ErrorClass.PROCESSING_ERROR
        )
        batch_error = "".join(traceback.format_exception_only(exc)).strip()
        log.exception("batch %s failed", batch_id)
        for outcome in outcomes:
            if outcome.finished is None:
                outcome.fail(error_class, batch_error)
    batch_metrics["seconds"] = round(time.perf_counter() - started, 4)
    _record(batch, outcomes, batch_metrics, batch_error)
    return "done"


def _process(batch: Batch, processor, outcomes: list[Outcome]) -> dict:
    root = Path(batch.campaign.input_root)
    ready: list[tuple[Outcome, object]] = []
    for outcome in outcomes:
        try:
            data = read_bytes(root, outcome.unit.source_path)
            ready.append((outcome, processor.prepare(data)))
        except InputError as exc:
            outcome.fail(exc.error_class, exc.message)
    if not ready:
        return {}
    result = processor.run([item for _, item in ready])
    for index, (outcome, _) in enumerate(ready):
        outcome.metrics = processor.unit_metrics(result, index)
        rel = output_relpath(
            campaign=batch.campaign.name,
            version_label=batch.version.label,
            uid=outcome.unit.uid,
            suffix=processor.suffix,
        )
        path = Path(settings.OUTPUT_ROOT) / rel
        try:
            written = write_atomic(path, processor.serialize(result.vectors[index]))
            processor.validate(path)
        except InvalidOutput as exc:
            outcome.fail(ErrorClass.OUTPUT_INVALID, f"output failed its check: {exc}")
            continue
        except OSError as exc:
            outcome.fail(ErrorClass.PROCESSING_ERROR, f"cannot write output: {exc}")
            continue
        outcome.output_path = str(rel)
        outcome.output_size, outcome.output_sha256 = written.size, written.sha256
        outcome.finished = time.time()
    return processor.batch_metrics(result)


def _record(batch: Batch, outcomes: list[Outcome], metrics: dict, error: str) -> None:
    """Results of the whole batch in one transaction: bulk update, bulk insert."""
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
        batch.state = Batch.State.FAILED if error else Batch.State.DONE
        batch.finished_at = now
        batch.metrics = metrics
        batch.error = error
        batch.save(update_fields=["state", "finished_at", "metrics", "error"])
