"""The review queue and the checkpoint: speed is useful only when quality control keeps up.

Flagged outputs (campaigns/flags.py, applied by the worker) wait in
`needs_review` with a ReviewItem per reason. A reviewer accepts, rejects or
requeues; every decision is kept (ReviewDecision) and a later one undoes an
earlier one. After the first group of units of a parameter version the
campaign stops at a checkpoint: a spot-check sample stratified by category and
input size, passed or failed by a person — or failed at once when one flag
reason covers too much of the sample. A failed checkpoint keeps the campaign
from running on until the method changes (a new parameter version).
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from . import selectors
from .flags import FlagReason
from .models import (
    Campaign,
    Checkpoint,
    ErrorClass,
    ParameterVersion,
    ReviewDecision,
    ReviewItem,
    Unit,
    UnitState,
)

log = logging.getLogger(__name__)
Item = ReviewItem.State
DONE_STATES = (UnitState.SUCCEEDED, UnitState.FAILED, UnitState.NEEDS_REVIEW)


# --- decisions ------------------------------------------------------------------


def review_decide(*, item: ReviewItem, decision: str, user, note: str = "") -> ReviewItem:
    """Accept, reject, requeue, or reopen an item; the unit follows; history is kept."""
    if decision not in Item.values:
        raise ValidationError(f"unknown decision {decision!r}: one of {', '.join(Item.values)}")
    if decision == Item.REJECTED and not note.strip():
        raise ValidationError("a rejection needs a reason")
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().select_related("unit").get(pk=item.pk)
        previous = locked.state
        locked.state = decision
        locked.reviewer = user
        locked.note = note
        locked.decided_at = timezone.now() if decision != Item.OPEN else None
        locked.save(update_fields=["state", "reviewer", "note", "decided_at"])
        ReviewDecision.objects.create(
            item=locked, from_state=previous, to_state=decision, reviewer=user, note=note
        )
        _unit_follows(locked, decision, note)
    item.refresh_from_db()
    return item


def _unit_follows(item: ReviewItem, decision: str, note: str) -> None:
    """The unit's state from all its items of this version, not from the last
    decision alone: accepting one flag must not undo the rejection of another."""
    unit = Unit.objects.select_for_update().get(pk=item.unit_id)
    siblings = ReviewItem.objects.filter(unit=unit, version_id=item.version_id)
    states = set(siblings.values_list("state", flat=True))
    if Item.REJECTED in states:
        rejected = siblings.filter(state=Item.REJECTED).order_by("-decided_at", "-pk").first()
        update = {
            "state": UnitState.FAILED,
            "error_class": ErrorClass.REJECTED_BY_REVIEW,
            "error_message": f"rejected in review ({rejected.reason}): {rejected.note}"[:2000],
        }
    elif Item.REQUEUED in states:
        # Pending again: the next run processes it (with a new parameter version,
        # whose outputs go to a new folder).
        update = {"state": UnitState.PENDING, "error_class": "", "error_message": "", "batch": None}
    elif siblings.filter(state=Item.OPEN).exclude(source=ReviewItem.Source.SPOT_CHECK).exists():
        # An open spot check does not hold a unit back: it samples ordinary outputs.
        update = {"state": UnitState.NEEDS_REVIEW, "error_class": "", "error_message": ""}
    elif unit.output_path:
        update = {"state": UnitState.SUCCEEDED, "error_class": "", "error_message": ""}
    else:
        return
    Unit.objects.filter(pk=unit.pk).update(**update, updated_at=timezone.now())


def review_bulk_accept(*, items: QuerySet, user, note: str = "") -> int:
    accepted = 0
    for item in items.filter(state=Item.OPEN).order_by("pk").iterator():
        review_decide(item=item, decision=Item.ACCEPTED, user=user, note=note)
        accepted += 1
    return accepted


def unit_flag(*, unit: Unit, user, note: str) -> ReviewItem:
    """The manual flag: any unit, with a reason, to the queue."""
    if not note.strip():
        raise ValidationError("say why this unit should be reviewed")
    with transaction.atomic():
        item = ReviewItem.objects.create(
            campaign=unit.campaign,
            unit=unit,
            version=unit.campaign.current_version,
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
    return dict(
        items.values_list("reason")
        .annotate(n=Count("pk"))
        .order_by("reason")
        .values_list("reason", "n")
    )


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
    """How many more units a run may enqueue now (None: no limit; 0 while the
    checkpoint waits for its spot check).

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
    done_or_running = _processed_by(version).exclude(state=UnitState.PENDING).count()
    return max(0, size - done_or_running)


def checkpoint_open_if_due(*, campaign: Campaign, version: ParameterVersion) -> Checkpoint | None:
    """Open the checkpoint once the first group is processed (called after each batch)."""
    size = checkpoint_size(campaign)
    if size == 0 or Checkpoint.objects.filter(campaign=campaign, version=version).exists():
        return None
    processed = _processed_by(version)
    in_flight = processed.filter(state__in=(UnitState.QUEUED, UnitState.RUNNING)).exists()
    done = processed.filter(state__in=DONE_STATES).count()
    pending = Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()
    if in_flight or (done < size and pending) or done == 0:
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
    _fail_on_repeating_defect(checkpoint)
    log.info("campaign %s: checkpoint %s opened after %d units", campaign.name, checkpoint.pk, done)
    return checkpoint


def _stratified_sample(*, campaign: Campaign, version: ParameterVersion) -> list[int]:
    """A spot-check set across categories and input sizes, not the first results."""
    want = settings.CHECKPOINT_SAMPLE_SIZE
    rows = list(
        _processed_by(version)
        .filter(state__in=(UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW), holdout=False)
        .values_list("pk", "category", "size")
    )
    if not rows:
        return []
    sizes = sorted(size or 0 for _, _, size in rows)
    quartiles = [sizes[len(sizes) * q // 4] for q in (1, 2, 3)]
    strata: dict[tuple, list[int]] = defaultdict(list)
    for pk, category, size in rows:
        bucket = sum(1 for q in quartiles if (size or 0) > q)
        strata[(category, bucket)].append(pk)
    rng = random.Random(f"{campaign.pk}-{version.pk}")
    for members in strata.values():
        rng.shuffle(members)
    picked: list[int] = []
    # Round robin over the strata, so a small category is seen as well as a large one.
    while len(picked) < want and any(strata.values()):
        for key in sorted(strata, key=str):
            if strata[key] and len(picked) < want:
                picked.append(strata[key].pop())
    return sorted(picked)


def _spot_check_items(checkpoint: Checkpoint) -> None:
    ReviewItem.objects.bulk_create(
        ReviewItem(
            campaign_id=checkpoint.campaign_id,
            unit_id=pk,
            version_id=checkpoint.version_id,
            checkpoint=checkpoint,
            source=ReviewItem.Source.SPOT_CHECK,
            reason=FlagReason.SPOT_CHECK,
            detail=f"spot check of checkpoint {checkpoint.pk}",
        )
        for pk in checkpoint.sample
    )


def _fail_on_repeating_defect(checkpoint: Checkpoint) -> None:
    if not checkpoint.sample:
        return
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
            label = FlagReason(reason).label if reason in FlagReason.values else reason
            checkpoint.state = Checkpoint.State.FAILED
            checkpoint.reason = (
                f"repeating defect: {label} on {count} of {len(checkpoint.sample)} spot-check "
                f"units ({count / len(checkpoint.sample):.0%}, more than {share:.0%})"
            )
            checkpoint.decided_at = timezone.now()
            checkpoint.save(update_fields=["state", "reason", "decided_at"])
            return


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
    checkpoint.refresh_from_db()
    return checkpoint


@dataclass(frozen=True)
class Verification:
    status: str  # not verified / checkpoint pending / passed / failed
    by: str = ""
    at: datetime | None = None
    reason: str = ""
    checkpoint: Checkpoint | None = None


def verification_status(*, campaign: Campaign) -> Verification:
    checkpoint = (
        Checkpoint.objects.filter(campaign=campaign, version=campaign.current_version)
        .select_related("decided_by")
        .first()
    )
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


def verification_by_campaign(*, campaign_ids: list[int]) -> dict[int, str]:
    """The list page's column, in one query."""
    rows = Checkpoint.objects.filter(campaign_id__in=campaign_ids).values_list(
        "campaign_id", "version_id", "state"
    )
    current = dict(
        Campaign.objects.filter(pk__in=campaign_ids).values_list("pk", "current_version_id")
    )
    labels = {"pending": "checkpoint pending", "passed": "passed", "failed": "failed"}
    found = {cid: labels[state] for cid, vid, state in rows if current.get(cid) == vid}
    return {cid: found.get(cid, "not verified") for cid in campaign_ids}
