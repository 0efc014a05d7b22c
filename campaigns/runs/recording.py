"""What a worker found for a batch's units, written as campaign rows.

A worker fills one `UnitOutcome` per unit it claimed (plain data: no torch,
nothing of the worker's) and hands them here: the flag rules that need the
campaign's history (`outcomes_flag_duplicates`, `outcomes_flag_drift`) and
the recording of the whole batch (`batch_record`): unit states and results,
one attempt a unit, the batch's row and measurements, the review items.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from campaigns.db.batch_statements import (
    ClaimedUnit,
    current_version_of,
    earlier_outputs,
    record_batch,
)
from campaigns.db.row_inserts import insert_rows
from campaigns.db.row_updates import update_rows
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
from campaigns.runs.versions import units_to_pending

log = logging.getLogger(__name__)


@dataclass
class UnitOutcome:
    """One claimed unit's result as its worker found it."""

    unit: ClaimedUnit
    error_class: str = ""
    message: str = ""
    output_path: str = ""
    output_size: int | None = None
    output_sha256: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    finished: float | None = None
    input_sha256: str = ""
    traceback_digest: str = ""
    # (reason, detail) of each flag rule the output tripped: it goes to review.
    flags: list[tuple[str, str]] = field(default_factory=list)

    def fail(self, error_class: str, message: str, digest: str = "") -> None:
        self.error_class, self.message = error_class, message[:2000]
        self.traceback_digest = digest
        self.finished = time.time()

    def succeed(self, rel: str, size: int, sha256: str, at: float | None = None) -> None:
        """`at`: when it was checked (a batch's shard rows are checked at once)."""
        self.output_path, self.output_size, self.output_sha256 = rel, size, sha256
        self.finished = time.time() if at is None else at


# --- flag rules that look past the batch -------------------------------------


def outcomes_flag_duplicates(*, batch: Batch, outcomes: Sequence[UnitOutcome]) -> None:
    """Flag the same vector for different inputs, in this batch or earlier ones
    of the same version (metrics["vector_hash"]).

    A unit's own earlier attempts are no twins: an input changed to bytes
    that embed the same (other case, for an uncased model) is the same unit
    run again, not a duplicate of another input."""
    by_hash: dict[str, list[UnitOutcome]] = {}
    for o in outcomes:
        digest = o.metrics.get("vector_hash")
        if digest:
            by_hash.setdefault(digest, []).append(o)
    if not by_hash:
        return
    earlier: dict[str, list[tuple[str, str]]] = {}
    for digest, uid, sha in earlier_outputs(batch.version_id, list(by_hash)):
        earlier.setdefault(digest, []).append((uid, sha))
    for digest, group in by_hash.items():
        for o in group:
            twins = {t.unit.uid for t in group if t is not o and t.input_sha256 != o.input_sha256}
            twins.update(
                uid
                for uid, sha in earlier.get(digest, ())
                if uid != o.unit.uid and sha != o.input_sha256
            )
            if twins:
                o.flags.append(
                    (FlagReason.DUPLICATE_VECTOR, f"same vector as {', '.join(sorted(twins)[:3])}")
                )


def outcomes_flag_drift(*, batch: Batch, outcomes: Sequence[UnitOutcome]) -> None:
    """After a passed checkpoint, a batch whose categories drift from the
    spot-check sample's goes to review (classification: metrics["category"])."""
    categories: list[str] = [o.metrics["category"] for o in outcomes if o.metrics.get("category")]
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


# --- the batch's recording ----------------------------------------------------

_RESULT_FIELDS = (
    "state",
    "error_class",
    "error_message",
    "output_path",
    "output_size",
    "output_sha256",
)

# In the order _attempt_row builds an attempt's row.
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

# Batch measurements with a column of their own, not kept in `metrics`.
_COLUMNS = ("real_tokens", "padded_tokens", "compute_seconds")


def batch_record(
    *,
    batch: Batch,
    token: str,
    outcomes: Sequence[UnitOutcome],
    metrics: dict[str, Any],
    error: str,
    worker: str,
) -> bool:
    """Results of the whole batch in one transaction: bulk update, bulk insert;
    False when the lease was lost and nothing was written.

    Only while `token` still holds the batch's lease: if its worker stalled
    past the lease and the batch went to another worker, these results are
    dropped (the files it wrote are deterministic and validated, so the other
    worker adopts them).
    """
    now = timezone.now()
    for o in outcomes:
        _set_unit_result(o)
    instant = functools.lru_cache(maxsize=256)(_instant)
    attempts = [_attempt_row(batch, o, worker, instant) for o in outcomes]
    to_review = _mark_for_review(outcomes)
    # The version's failure share is summed from these (campaigns/watch/events.py):
    # the unit rows hold only the current version's state, and keep input errors.
    metrics = {**metrics, "failed": sum(1 for o in outcomes if o.error_class)}
    results = _batch_results(metrics, error, now)
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
        _save_review_items(batch, to_review, attempt_of)
        _outdated_to_pending(batch)
    _log_recorded(batch, outcomes, len(to_review), metrics)
    return True


def _outdated_to_pending(batch: Batch) -> None:
    """A batch of a version that is no longer current (the parameters changed
    while it ran): its outputs stay that version's, and its units go back to
    pending under the current one (campaigns/runs/versions.py)."""
    current = current_version_of(batch.campaign_id)
    if current is not None and current != batch.version_id:
        units_to_pending(campaign_id=batch.campaign_id, version_id=current, batch_id=batch.pk)


def _set_unit_result(o: UnitOutcome) -> None:
    """The unit's result columns from its outcome."""
    unit = o.unit
    unit.state = UnitState.FAILED if o.error_class else UnitState.SUCCEEDED
    unit.error_class, unit.error_message = o.error_class, o.message
    unit.output_path, unit.output_size, unit.output_sha256 = (
        o.output_path,
        o.output_size,
        o.output_sha256,
    )


def _instant(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _attempt_row(
    batch: Batch, o: UnitOutcome, worker: str, instant: Callable[[float], datetime] = _instant
) -> tuple[object, ...]:
    """The unit's attempt, in the order of _ATTEMPT_FIELDS (`instant`: a
    time's datetime; a batch's units share a few)."""
    finished = o.finished or time.time()
    return (
        o.unit.pk,
        batch.pk,
        batch.version_id,
        Attempt.Outcome.FAILED if o.error_class else Attempt.Outcome.SUCCEEDED,
        o.error_class,
        o.message,
        o.traceback_digest,
        o.input_sha256,
        o.output_path,
        o.output_size,
        o.output_sha256,
        worker,
        instant(o.started),
        instant(finished),
        max(0, int((finished - o.started) * 1000)),
        o.metrics,
    )


def _mark_for_review(outcomes: Sequence[UnitOutcome]) -> list[UnitOutcome]:
    """The outcomes whose flags go to the review queue: flagged successes (their
    unit waits for a person) first, then refused outputs (their unit stays
    failed, and is reviewed all the same)."""
    flagged = [o for o in outcomes if o.flags and o.unit.state == UnitState.SUCCEEDED]
    for o in flagged:
        # The output is written and valid; a person decides whether it counts.
        o.unit.state = UnitState.NEEDS_REVIEW
    refused = [o for o in outcomes if o.flags and o.error_class == ErrorClass.OUTPUT_INVALID]
    return flagged + refused


def _batch_results(metrics: dict[str, Any], error: str, now: datetime) -> dict[str, Any]:
    """The batch row's columns once it ran."""
    memory = metrics.get("memory", {})
    return {
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


def _save_unit_results(units: list[ClaimedUnit], now: datetime) -> None:
    """The batch's results in one statement (campaigns/db/row_updates.py): on
    PostgreSQL the unit counters' trigger then runs once for the batch, not
    once per unit (bench/RESULTS.md, "Celery rows for token_budget, the
    pipeline again, an index (2026-11-30)")."""
    update_rows(
        Unit,
        _RESULT_FIELDS,
        [(u.pk, *(getattr(u, name) for name in _RESULT_FIELDS)) for u in units],
        also={"updated_at": now},
    )


def _save_review_items(
    batch: Batch, to_review: list[UnitOutcome], attempt_of: dict[int, int]
) -> None:
    """One review item a flag, naming the attempt that raised it."""
    ReviewItem.objects.bulk_create(
        ReviewItem(
            campaign_id=batch.campaign_id,
            unit_id=o.unit.pk,
            attempt_id=attempt_of[id(o)],
            version_id=batch.version_id,
            reason=reason,
            detail=detail[:2000],
        )
        for o in to_review
        for reason, detail in o.flags
    )


def _log_recorded(
    batch: Batch, outcomes: Sequence[UnitOutcome], reviewed: int, metrics: dict[str, Any]
) -> None:
    for o in outcomes:
        if o.error_class:
            log.info("unit failed: %s", o.error_class, extra={"unit": o.unit.pk})
    log.info(
        "batch %s recorded: %d succeeded, %d failed, %d to review, %.2f s",
        batch.pk,
        sum(1 for o in outcomes if not o.error_class),
        sum(1 for o in outcomes if o.error_class),
        reviewed,
        metrics.get("seconds", 0.0),
    )
