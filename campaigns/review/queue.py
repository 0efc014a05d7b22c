"""The review queue and the checkpoint: speed is useful only when quality control keeps up.

Flagged outputs (campaigns/review/flags.py, applied by the worker) wait in
`needs_review` with a ReviewItem per reason. A reviewer accepts, rejects or
requeues; every decision is kept (ReviewDecision) and a later one undoes an
earlier one. Only items about a unit's latest output move the unit, and an
output rejected or requeued is not made again (nor adopted) under the version
that made it. After the first group of units of a parameter version (the
checkpoint size outside the holdout, plus the holdout) the campaign stops at a
checkpoint: a spot-check sample stratified by category and input size, passed
or failed by a person — or failed at once when one flag reason covers too much
of the sample. A failed checkpoint keeps the campaign from running on until
the method changes (a new parameter version).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from campaigns import selectors
from campaigns.db import batch_statements, page_queries
from campaigns.models import (
    Attempt,
    Campaign,
    Checkpoint,
    ErrorClass,
    ParameterVersion,
    ReviewDecision,
    ReviewItem,
    Unit,
    UnitState,
)
from campaigns.review import holdout, reasons
from campaigns.review.cross_section import spot_check_sample
from campaigns.review.flags import FlagReason, reason_label

log = logging.getLogger(__name__)
Item = ReviewItem.State
DONE_STATES = (UnitState.SUCCEEDED, UnitState.FAILED, UnitState.NEEDS_REVIEW)


# --- decisions ------------------------------------------------------------------

# Decisions that say the output is not to be had from this parameter version:
# the unit neither runs nor is adopted under it again (units_runnable, and the
# worker's check in gpuworker.runner.claim).
REVIEWED_OUT = (Item.REJECTED, Item.REQUEUED)


def review_decide(
    *,
    item: ReviewItem,
    decision: str,
    user,
    note: str = "",
    reject_reason: str = "",
    shown_at: datetime | None = None,
    bulk: bool = False,
) -> ReviewItem:
    """Accept, reject, requeue, or reopen an item; the unit follows; history is kept.

    A rejection says why: a reason from the campaign's list, a note, or both.
    shown_at is when the reviewer was shown the item: the decision keeps the
    time it took (campaigns/review/effort.py sums it).
    """
    if decision not in Item.values:
        raise ValidationError(f"unknown decision {decision!r}: one of {', '.join(Item.values)}")
    if decision == Item.REJECTED:
        reject_reason = reasons.reject_reason_check(campaign=item.campaign, reason=reject_reason)
        if not reject_reason and not note.strip():
            raise ValidationError("a rejection needs a reason: pick one from the list or type it")
    else:
        reject_reason = ""
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().select_related("unit").get(pk=item.pk)
        previous = locked.state
        now = timezone.now()
        locked.state = decision
        locked.reviewer = user
        locked.note = note
        locked.reject_reason = reject_reason or None
        locked.decided_at = now if decision != Item.OPEN else None
        locked.save(update_fields=["state", "reviewer", "note", "reject_reason", "decided_at"])
        ReviewDecision.objects.create(
            item=locked,
            from_state=previous,
            to_state=decision,
            reviewer=user,
            note=note,
            reject_reason=reject_reason,
            seconds=_seconds_since(shown_at, now) if decision != Item.OPEN else None,
            bulk=bulk,
        )
        _unit_follows(locked, previous)
    item.refresh_from_db()
    return item


def _seconds_since(shown_at: datetime | None, now: datetime) -> float | None:
    if shown_at is None:
        return None
    seconds = (now - shown_at).total_seconds()
    # A show time after the decision is a clock or a form gone wrong: not a measurement.
    return seconds if seconds >= 0 else None


def _latest_attempt(unit_id: int) -> Attempt | None:
    return (
        Attempt.objects.filter(unit_id=unit_id)
        .order_by("-pk")
        .only("pk", "version_id", "outcome", "error_class", "error_message", "finished_at")
        .first()
    )


def _current_items(unit_id: int, latest: Attempt | None) -> QuerySet[ReviewItem]:
    """The unit's items about its latest output: an older output's items (a
    requeue before the unit ran again, say) no longer decide anything."""
    items = ReviewItem.objects.filter(unit_id=unit_id)
    if latest is None:
        return items
    return items.filter(
        Q(attempt_id=latest.pk) | Q(attempt__isnull=True, created_at__gte=latest.finished_at)
    )


def _unit_follows(item: ReviewItem, previous: str) -> None:
    """The unit's state from all its items about its latest output, not from the
    last decision alone: accepting one flag must not undo the rejection of another."""
    unit = Unit.objects.select_for_update().get(pk=item.unit_id)
    if unit.state in (UnitState.QUEUED, UnitState.RUNNING):
        return  # being processed again: its next output is judged afresh
    latest = _latest_attempt(unit.pk)
    current = _current_items(unit.pk, latest)
    if not current.filter(pk=item.pk).exists():
        return  # about an output the unit has replaced since: recorded, nothing moves
    requeued = previous == Item.REQUEUED or (
        current.exclude(pk=item.pk).filter(state=Item.REQUEUED).exists()
    )
    if unit.state == UnitState.PENDING and latest is not None and not requeued:
        # Pending for another reason (the holdout under a new version, an
        # output verify found missing): it runs again whatever this says.
        return
    update = _review_state(latest, current)
    Unit.objects.filter(pk=unit.pk).update(**update, updated_at=timezone.now())


def _review_state(latest: Attempt | None, current: QuerySet[ReviewItem]) -> dict:
    """The unit's fields as its current items and latest attempt have them."""
    states = set(current.values_list("state", flat=True))
    if Item.REJECTED in states:
        rejected = current.filter(state=Item.REJECTED).order_by("-decided_at", "-pk")[0]
        return {
            "state": UnitState.FAILED,
            "error_class": ErrorClass.REJECTED_BY_REVIEW,
            "error_message": _rejection_message(rejected)[:2000],
        }
    if Item.REQUEUED in states:
        # Pending again, for a new parameter version: units_runnable keeps it
        # out of every run of this one (its outputs would go, or be adopted
        # from, the same folder).
        return {"state": UnitState.PENDING, "error_class": "", "error_message": "", "batch": None}
    if latest is None:
        # Flagged before it ever ran.
        return {"state": UnitState.PENDING, "error_class": "", "error_message": ""}
    if latest.outcome == Attempt.Outcome.FAILED:
        # An output that failed its check stays failed, whatever the review
        # says of it: a corrupt output never counts.
        return {
            "state": UnitState.FAILED,
            "error_class": latest.error_class,
            "error_message": latest.error_message,
        }
    # An open spot check does not hold a unit back: it samples ordinary outputs.
    if current.filter(state=Item.OPEN).exclude(source=ReviewItem.Source.SPOT_CHECK).exists():
        return {"state": UnitState.NEEDS_REVIEW, "error_class": "", "error_message": ""}
    return {"state": UnitState.SUCCEEDED, "error_class": "", "error_message": ""}


def _rejection_message(item: ReviewItem) -> str:
    why = ": ".join(part for part in (item.reject_reason, item.note) if part)
    return f"rejected in review ({item.reason}): {why}"


def units_reviewed_out(*, campaign_id: int, version_id: int) -> QuerySet:
    """Ids of units a reviewer rejected or requeued under this version."""
    return ReviewItem.objects.filter(
        campaign_id=campaign_id, version_id=version_id, state__in=REVIEWED_OUT
    ).values("unit_id")


def units_runnable(*, campaign: Campaign, version: ParameterVersion) -> QuerySet[Unit]:
    """Pending units a run of this version may take: not those reviewed out under it."""
    return Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exclude(
        pk__in=units_reviewed_out(campaign_id=campaign.pk, version_id=version.pk)
    )


def units_release_reviewed(*, unit_ids: list[int], version_id: int) -> set[int]:
    """The worker's last check before it runs (or adopts the output of) a unit:
    one a reviewer rejected or requeued under this version goes back to the
    state the review gave it, unprocessed. campaign run never queues such a
    unit; this holds whatever path put it in a batch."""
    reviewed = set(
        ReviewItem.objects.filter(
            unit_id__in=unit_ids, version_id=version_id, state__in=REVIEWED_OUT
        ).values_list("unit_id", flat=True)
    )
    for unit_id in sorted(reviewed):
        latest = _latest_attempt(unit_id)
        current = _current_items(unit_id, latest)
        if current.filter(version_id=version_id, state__in=REVIEWED_OUT).exists():
            update = {"batch": None, **_review_state(latest, current)}
        else:
            # Reviewed out under this version, then run under another since:
            # pending, for a version other than this one, as campaign run has it.
            update = {"state": UnitState.PENDING, "batch": None}
        Unit.objects.filter(pk=unit_id, state=UnitState.RUNNING).update(
            **update, updated_at=timezone.now()
        )
    return reviewed


def review_bulk_accept(*, items: QuerySet, user, note: str = "") -> int:
    accepted = 0
    for item in items.filter(state=Item.OPEN).order_by("pk").iterator():
        # Marked bulk, untimed: the time went into the list, not into each item.
        review_decide(item=item, decision=Item.ACCEPTED, user=user, note=note, bulk=True)
        accepted += 1
    return accepted


def unit_flag(*, unit: Unit, user, note: str) -> ReviewItem:
    """The manual flag: any unit, with a reason, to the queue.

    The item judges the unit's latest output, so it carries that output's
    parameter version (a unit not yet run under the current one keeps its own).
    """
    if not note.strip():
        raise ValidationError("say why this unit should be reviewed")
    latest = _latest_attempt(unit.pk)
    with transaction.atomic():
        item = ReviewItem.objects.create(
            campaign=unit.campaign,
            unit=unit,
            attempt=latest,
            version_id=latest.version_id if latest else unit.campaign.current_version_id,
            source=ReviewItem.Source.MANUAL,
            reason=FlagReason.MANUAL,
            detail=note[:2000],
        )
        ReviewDecision.objects.create(
            item=item, from_state=Item.OPEN, to_state=Item.OPEN, reviewer=user, note=note
        )
        Unit.objects.filter(pk=unit.pk, state=UnitState.SUCCEEDED).update(
            state=UnitState.NEEDS_REVIEW
        )
    return item


def reason_counts(*, items: QuerySet) -> dict[str, int]:
    """Items per reason, counted: for the filters the counters do not key
    (a category, a checkpoint); reason_counts_kept for the others."""
    return dict(
        items.values_list("reason")
        .annotate(n=Count("pk"))
        .order_by("reason")
        .values_list("reason", "n")
    )


def reason_counts_kept(*, campaign_ids: list[int], state: str | None) -> dict[str, int]:
    """Items of these campaigns per reason in one state (None: any), from the
    trigger-kept counters: a few rows whatever the length of the queue, where
    reason_counts reads every item of the filter."""
    return page_queries.review_reason_counts(campaign_ids=campaign_ids, state=state)


# --- the checkpoint -------------------------------------------------------------


def checkpoint_size(campaign: Campaign) -> int:
    """Units of the first group: the campaign's setting, else max(1% of units, 200)."""
    if campaign.checkpoint_after is not None:
        return campaign.checkpoint_after
    # From the counters: run and every finished batch ask, a COUNT would scan the campaign.
    total = selectors.campaign_counts(campaign=campaign).total
    return min(total, max(math.ceil(total * 0.01), 200))


def _processed_by(version: ParameterVersion) -> QuerySet:
    return Unit.objects.filter(batch__version=version)


def run_allowance(*, campaign: Campaign, version: ParameterVersion) -> int | None:
    """How many more units outside the holdout a run may enqueue now (None: no
    limit; 0 while the checkpoint waits for its spot check).

    The first group of a version is checkpoint_size units outside the holdout
    plus the whole holdout: the holdout is reported at the checkpoint but never
    sampled, so counting it in the group would leave the sample empty (5% of
    4,000 units fills a 200-unit group). Pending holdout units therefore run
    whenever a run may run at all (campaign_run).

    Raises ValidationError, with the reason, when a failed checkpoint keeps the
    campaign where it is.
    """
    size = checkpoint_size(campaign)
    if size == 0:
        return None
    checkpoint = Checkpoint.objects.filter(campaign=campaign, version=version).first()
    if checkpoint is not None:
        if checkpoint.state == Checkpoint.State.PASSED:
            return None
        if checkpoint.state == Checkpoint.State.FAILED:
            raise ValidationError(
                f"checkpoint failed: {checkpoint.reason}. The campaign stays paused until the "
                "method is fixed: save changed parameters (a new parameter version)."
            )
        # Pending: units of the first group may run again (a resume after lost
        # outputs), nothing beyond it until a reviewer passes the spot check.
    # Units put back to pending (a resume, a retry) are not counted: they may run again.
    done_or_running = (
        _processed_by(version).filter(holdout=False).exclude(state=UnitState.PENDING).count()
    )
    return max(0, size - done_or_running)


def checkpoint_open_if_due(*, campaign: Campaign, version: ParameterVersion) -> Checkpoint | None:
    """Open the checkpoint once the first group is processed (called after each batch)."""
    size = checkpoint_size(campaign)
    if size == 0 or Checkpoint.objects.filter(campaign=campaign, version=version).exists():
        return None
    processed = _processed_by(version)
    if processed.filter(state__in=(UnitState.QUEUED, UnitState.RUNNING)).exists():
        return None
    done = processed.filter(state__in=DONE_STATES).count()
    outside = processed.filter(state__in=DONE_STATES, holdout=False).count()
    runnable = units_runnable(campaign=campaign, version=version)
    if done == 0 or runnable.filter(holdout=True).exists():
        return None  # the holdout is part of the group: the checkpoint reports on it
    if outside < size and runnable.filter(holdout=False).exists():
        return None
    try:
        with transaction.atomic():
            checkpoint = Checkpoint.objects.create(
                campaign=campaign,
                version=version,
                after_units=done,
                sample=_stratified_sample(campaign=campaign, version=version),
            )
    except IntegrityError:
        return None  # another worker opened it
    _spot_check_items(checkpoint)
    failed = _fail_on_repeating_defect(checkpoint)
    report = _snapshot_holdout(checkpoint, "opened")
    if failed:
        _snapshot_holdout(checkpoint, "decided", report)
    log.info("campaign %s: checkpoint %s opened after %d units", campaign.name, checkpoint.pk, done)
    return checkpoint


# Sampled as outputs to judge: a valid one, or one its check refused (the
# defect then counts at the checkpoint like any flag reason).
_SAMPLED = Q(state__in=(UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW)) | Q(
    state=UnitState.FAILED, error_class=ErrorClass.OUTPUT_INVALID
)


def _stratified_sample(*, campaign: Campaign, version: ParameterVersion) -> list[int]:
    """A spot-check set across categories and input sizes, not the first
    results, and never the same input twice (campaigns/review/cross_section.py)."""
    return spot_check_sample(
        processed=_processed_by(version).filter(_SAMPLED, holdout=False),
        size=settings.CHECKPOINT_SAMPLE_SIZE,
        campaign=campaign,
        version=version,
    )


def _spot_check_items(checkpoint: Checkpoint) -> None:
    latest = dict(
        Attempt.objects.filter(unit_id__in=checkpoint.sample)
        .values("unit_id")
        .annotate(last=Max("pk"))
        .order_by()
        .values_list("unit_id", "last")
    )
    ReviewItem.objects.bulk_create(
        ReviewItem(
            campaign_id=checkpoint.campaign_id,
            unit_id=pk,
            attempt_id=latest.get(pk),
            version_id=checkpoint.version_id,
            checkpoint=checkpoint,
            source=ReviewItem.Source.SPOT_CHECK,
            reason=FlagReason.SPOT_CHECK,
            detail=f"spot check of checkpoint {checkpoint.pk}",
        )
        for pk in checkpoint.sample
    )


def _fail_on_repeating_defect(checkpoint: Checkpoint) -> bool:
    if not checkpoint.sample:
        return False
    flagged = Counter(
        ReviewItem.objects.filter(
            unit_id__in=checkpoint.sample,
            version_id=checkpoint.version_id,
            source=ReviewItem.Source.RULE,
        )
        .values_list("unit_id", "reason")
        .distinct()
        .values_list("reason", flat=True)
    )
    share = settings.CHECKPOINT_DEFECT_SHARE
    for reason, count in flagged.most_common():
        if count / len(checkpoint.sample) > share:
            label = reason_label(reason)
            checkpoint.state = Checkpoint.State.FAILED
            checkpoint.reason = (
                f"repeating defect: {label} on {count} of {len(checkpoint.sample)} spot-check "
                f"units ({count / len(checkpoint.sample):.0%}, more than {share:.0%})"
            )
            checkpoint.decided_at = timezone.now()
            checkpoint.save(update_fields=["state", "reason", "decided_at"])
            return True
    return False


def checkpoint_decide(
    *, checkpoint: Checkpoint, passed: bool, user, reason: str = ""
) -> Checkpoint:
    """A reviewer's verdict on the spot check. Passing lets the campaign run on."""
    if not passed and not reason.strip():
        raise ValidationError("failing a checkpoint needs a reason")
    with transaction.atomic():
        locked = Checkpoint.objects.select_for_update().get(pk=checkpoint.pk)
        if locked.state != Checkpoint.State.PENDING:
            raise ValidationError(f"this checkpoint is already {locked.state}")
        locked.state = Checkpoint.State.PASSED if passed else Checkpoint.State.FAILED
        locked.reason = reason
        locked.decided_by = user
        locked.decided_at = timezone.now()
        locked.save(update_fields=["state", "reason", "decided_by", "decided_at"])
    _snapshot_holdout(locked, "decided")
    checkpoint.refresh_from_db()
    return checkpoint


# --- holdout snapshots ----------------------------------------------------------

SNAPSHOT_MOMENTS = ("opened", "decided", "finished")


def _snapshot_holdout(
    checkpoint: Checkpoint, moment: str, report: dict | None = None
) -> dict | None:
    """Keep the holdout report of the checkpoint's version as it is now.

    Scored outside any transaction: it reads every holdout output of the
    version (about 5% of the campaign), which must not hold a row lock. A
    report that cannot be made is logged, never raised: the checkpoint, its
    spot check and its verdict stand without it.
    """
    try:
        if report is None:
            report = holdout.holdout_report(
                campaign=checkpoint.campaign, version=checkpoint.version
            )
        snapshot = {**report, "at": timezone.now().isoformat()}
        with transaction.atomic():
            locked = Checkpoint.objects.select_for_update().get(pk=checkpoint.pk)
            locked.holdout_snapshots = {**locked.holdout_snapshots, moment: snapshot}
            locked.save(update_fields=["holdout_snapshots"])
    except Exception:
        log.exception(
            "checkpoint %s: could not keep the holdout report (%s)", checkpoint.pk, moment
        )
        return None
    checkpoint.holdout_snapshots = locked.holdout_snapshots
    return report


def after_batch(*, campaign: Campaign, version: ParameterVersion) -> None:
    """The checkpoint's work after each recorded batch: open it once due, keep
    its finished report once the campaign is done. The checkpoint is read once
    for both (two statements a batch once it exists, where each asking alone
    took four)."""
    checkpoint = batch_statements.checkpoint_of(campaign.pk, version.pk)
    if checkpoint is None:
        checkpoint = checkpoint_open_if_due(campaign=campaign, version=version)
    if checkpoint is not None:
        campaign_finished_snapshot(campaign=campaign, version=version, checkpoint=checkpoint)


def campaign_finished_snapshot(
    *, campaign: Campaign, version: ParameterVersion, checkpoint: Checkpoint
) -> Checkpoint | None:
    """After a batch: when nothing of the campaign is queued, running or left
    to run under this version, keep the holdout report on its checkpoint
    ("finished"; again after each later end, a resume after new imports say).
    Without a checkpoint (checkpoint_after 0, or not reached) there is only
    the live report: after_batch does not call this."""
    # Units left to run mean the campaign waits (at a pending or failed checkpoint) or goes on.
    busy = Unit.objects.filter(
        campaign=campaign, state__in=(UnitState.QUEUED, UnitState.RUNNING)
    ).exists()
    if busy or units_runnable(campaign=campaign, version=version).exists():
        return None
    _snapshot_holdout(checkpoint, "finished")
    return checkpoint


@dataclass(frozen=True)
class Verification:
    status: str  # not verified / checkpoint pending / passed / failed
    by: str = ""
    at: datetime | None = None
    reason: str = ""
    checkpoint: Checkpoint | None = None


def verification_of(checkpoint: Checkpoint | None) -> Verification:
    """The status a checkpoint (of the current version; None: none yet) gives,
    its decided_by loaded."""
    if checkpoint is None:
        return Verification("not verified")
    label = {
        Checkpoint.State.PENDING: "checkpoint pending",
        Checkpoint.State.PASSED: "passed",
        Checkpoint.State.FAILED: "failed",
    }[checkpoint.state]
    by = checkpoint.decided_by.get_username() if checkpoint.decided_by else ""
    if checkpoint.state == Checkpoint.State.FAILED and not by:
        by = "flag rules"
    return Verification(label, by, checkpoint.decided_at, checkpoint.reason, checkpoint)


def verification_status(*, campaign: Campaign) -> Verification:
    checkpoint = (
        Checkpoint.objects.filter(campaign=campaign, version=campaign.current_version)
        .select_related("decided_by")
        .first()
    )
    return verification_of(checkpoint)
