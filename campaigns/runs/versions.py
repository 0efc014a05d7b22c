"""A campaign's parameter versions over its whole corpus.

The unit row holds a unit's state under the campaign's current version. A new
current version (setup.version_create: changed parameters, a fine-tuned
checkpoint put to use) sends every unit it did not make back to pending, so
its run processes the whole corpus through its own checkpoint; outputs of
older versions stay in their version's folder and in their attempts.

What a version *has* — one valid output per unit at most — is read here for
every consumer (progress, exports, downloads, comparisons): for the current
version from the unit rows (verify and review keep them right), for an older
one from its attempts: a unit's latest attempt under that version, when it
succeeded, was not rejected, requeued or left waiting in review under it, and
read the bytes the input holds today.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from django.db.models import F, Max, Q, QuerySet
from django.utils import timezone

from campaigns import selectors
from campaigns.db.row_updates import update_rows
from campaigns.models import (
    INPUT_ERRORS,
    Attempt,
    Batch,
    Campaign,
    Checkpoint,
    ParameterVersion,
    ReviewItem,
    Unit,
    UnitState,
)

#: Unit states that hold a result (or a failure) under the version that made it.
_DONE = (UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW, UnitState.FAILED)

#: Units read a statement when a version's outputs are walked: bounded memory.
_CHUNK = 2000


# --- switching ---------------------------------------------------------------


def switch_to(*, campaign: Campaign, version: ParameterVersion) -> int:
    """After `version` became current: batches of others not started are
    taken back, and every unit it has no valid output for is pending under
    it. A version made current again (v1, v2, then v1) takes back its own
    valid outputs from its attempts instead of making them again. Returns the
    units now pending for it."""
    _queued_batches_cancel(campaign=campaign, version=version)
    pending = units_to_pending(campaign_id=campaign.pk, version_id=version.pk)
    return pending - _outputs_restore(campaign, version)


def _outputs_restore(campaign: Campaign, version: ParameterVersion) -> int:
    """Pending units with a valid output under `version` (its attempts say
    so) succeed with it again, a chunk at a time; returns how many. Resume's
    verify checks the files as for any output."""
    restored, last = 0, 0
    valid = _latest_attempts(version).order_by("unit_id")
    while True:
        rows = list(
            valid.filter(unit_id__gt=last).values_list(
                "unit_id", "batch_id", "output_path", "output_size", "output_sha256"
            )[:_CHUNK]
        )
        if not rows:
            return restored
        last = rows[-1][0]
        pending = set(
            Unit.objects.filter(
                pk__in=[row[0] for row in rows], state=UnitState.PENDING
            ).values_list("pk", flat=True)
        )
        back = [(pk, UnitState.SUCCEEDED, *rest) for pk, *rest in rows if pk in pending]
        if back:
            update_rows(
                Unit,
                ("state", "batch", "output_path", "output_size", "output_sha256"),
                back,
                also={"updated_at": timezone.now()},
            )
            restored += len(back)


def units_to_pending(*, campaign_id: int, version_id: int, batch_id: int | None = None) -> int:
    """Every unit not made by the version goes back to pending under it.
    `batch_id`: only that batch's units (a batch of an older version that
    finished after the switch: campaigns/runs/recording.py).

    Outputs of older versions stay where they are (the output path holds the
    version label) and in their attempts; review items about those outputs do
    not move the unit (campaigns/review/queue.py, _unit_follows). Inputs known
    missing or changed wait for a retry of their class; units in flight finish
    under the version of their batch, then come back here.
    """
    units = Unit.objects.filter(campaign_id=campaign_id, state__in=_DONE)
    if batch_id is not None:
        units = units.filter(batch_id=batch_id)
    return (
        units.exclude(error_class__in=INPUT_ERRORS)
        .exclude(batch__version_id=version_id)
        .update(
            state=UnitState.PENDING,
            error_class="",
            error_message="",
            batch=None,
            output_path="",
            output_size=None,
            output_sha256="",
            updated_at=timezone.now(),
        )
    )


def _queued_batches_cancel(*, campaign: Campaign, version: ParameterVersion) -> int:
    """Batches of other versions no worker has started are taken back (as a
    Pause does), their units pending; running ones finish."""
    waiting = list(
        Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED)
        .exclude(version=version)
        .values_list("pk", flat=True)
    )
    if not waiting:
        return 0
    # Guarded by state: a batch a worker claimed meanwhile stays its.
    Batch.objects.filter(pk__in=waiting, state=Batch.State.QUEUED).update(
        state=Batch.State.CANCELLED, error="taken back: the parameters changed"
    )
    return Unit.objects.filter(
        batch_id__in=waiting, batch__state=Batch.State.CANCELLED, state=UnitState.QUEUED
    ).update(state=UnitState.PENDING, batch=None)


# --- what a version has ------------------------------------------------------


@dataclass(frozen=True)
class VersionOutput:
    """One unit's valid output under a version."""

    unit_id: int
    uid: str
    source_path: str
    category: str
    output_path: str


def _not_accepted(version: ParameterVersion) -> Q:
    """Review items that keep a unit's output under `version` from counting:
    rejected or requeued, or waiting for a reviewer (spot checks aside: they
    judge outputs that stand meanwhile)."""
    return Q(version=version) & (
        Q(state__in=(ReviewItem.State.REJECTED, ReviewItem.State.REQUEUED))
        | (Q(state=ReviewItem.State.OPEN) & ~Q(source=ReviewItem.Source.SPOT_CHECK))
    )


def _latest_attempts(version: ParameterVersion) -> QuerySet[Attempt]:
    """Each unit's latest attempt under `version`, where it succeeded with an
    output made from the input's current bytes, and review did not refuse it."""
    latest = (
        Attempt.objects.filter(version=version)
        .values("unit_id")
        .annotate(last=Max("pk"))
        .values("last")
    )
    refused = ReviewItem.objects.filter(_not_accepted(version)).values("unit_id")
    return (
        Attempt.objects.filter(pk__in=latest, outcome=Attempt.Outcome.SUCCEEDED)
        .exclude(output_path="")
        .exclude(unit_id__in=refused)
        .filter(Q(input_sha256="") | Q(unit__sha256="") | Q(input_sha256=F("unit__sha256")))
    )


def outputs_count(*, campaign: Campaign, version: ParameterVersion) -> int:
    """How many units have a valid output under `version`."""
    if version.pk == campaign.current_version_id:
        return _current(campaign, version).count()
    return _latest_attempts(version).count()


def outputs_of(
    *, campaign: Campaign, version: ParameterVersion, every: int = 1
) -> Iterator[VersionOutput]:
    """Each unit's valid output under `version`, in unit (import) order, read
    a chunk of units at a time: a million units in constant memory.
    `every`: only units whose id is a multiple of it (a sample spread over
    the whole corpus, the same for every version)."""
    if version.pk == campaign.current_version_id:
        yield from _current_outputs(campaign, version, every)
        return
    last = 0
    units = _every(Unit.objects.filter(campaign=campaign), every).order_by("pk")
    while True:
        rows = list(
            units.filter(pk__gt=last).values_list("pk", "uid", "source_path", "category", "sha256")[
                :_CHUNK
            ]
        )
        if not rows:
            return
        last = rows[-1][0]
        ids = [row[0] for row in rows]
        latest: dict[int, tuple[str, str, str]] = {}
        for unit_id, outcome, path, read in (
            Attempt.objects.filter(unit_id__in=ids, version=version)
            .order_by("pk")
            .values_list("unit_id", "outcome", "output_path", "input_sha256")
        ):
            latest[unit_id] = (outcome, path, read)
        refused = set(
            ReviewItem.objects.filter(_not_accepted(version), unit_id__in=ids).values_list(
                "unit_id", flat=True
            )
        )
        for pk, uid, source, category, sha256 in rows:
            outcome, path, read = latest.get(pk, ("", "", ""))
            if outcome != Attempt.Outcome.SUCCEEDED or not path or pk in refused:
                continue
            if read and sha256 and read != sha256:
                continue  # made from bytes the input no longer holds
            yield VersionOutput(pk, uid, source, category, path)


def _current(campaign: Campaign, version: ParameterVersion) -> QuerySet[Unit]:
    return Unit.objects.filter(
        campaign=campaign,
        state=UnitState.SUCCEEDED,
        output_path__startswith=f"{campaign.name}/{version.label}/",
    )


def _every(units: QuerySet[Unit], every: int) -> QuerySet[Unit]:
    if every <= 1:
        return units
    return units.annotate(_sampled=F("pk") % every).filter(_sampled=0)


def _current_outputs(
    campaign: Campaign, version: ParameterVersion, every: int = 1
) -> Iterator[VersionOutput]:
    last = 0
    done = _every(_current(campaign, version), every).order_by("pk")
    while True:
        rows = list(
            done.filter(pk__gt=last).values_list(
                "pk", "uid", "source_path", "category", "output_path"
            )[:_CHUNK]
        )
        if not rows:
            return
        last = rows[-1][0]
        for row in rows:
            yield VersionOutput(*row)


# --- progress ----------------------------------------------------------------


@dataclass(frozen=True)
class VersionProgress:
    version: ParameterVersion
    current: bool
    valid: int  # units with a valid output under this version
    total: int  # units of the campaign
    checkpoint: str  # not reached / pending / passed / failed

    @property
    def percent(self) -> int:
        return int(100 * self.valid / self.total) if self.total else 0

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.valid == self.total


def version_progress(*, campaign: Campaign) -> list[VersionProgress]:
    """Every version of the campaign, newest first, with how much of the
    corpus it has made. One query a version (older ones read their attempts:
    shown where the page is not polled)."""
    total = selectors.campaign_counts(campaign=campaign).total
    checkpoints = dict(
        Checkpoint.objects.filter(campaign=campaign).values_list("version_id", "state")
    )
    return [
        VersionProgress(
            version=version,
            current=version.pk == campaign.current_version_id,
            valid=outputs_count(campaign=campaign, version=version),
            total=total,
            checkpoint=checkpoints.get(version.pk, "not reached"),
        )
        for version in campaign.versions.order_by("-number")
    ]


def version_by_label(*, campaign: Campaign, label: str) -> ParameterVersion | None:
    """A version named as users name it: 'v2', '2', or its full label."""
    text = label.strip().lower().removeprefix("v")
    number = text.split("-", 1)[0]
    if not number.isdigit():
        return None
    version = campaign.versions.filter(number=int(number)).first()
    if version is None or ("-" in text and f"v{text}" != version.label):
        return None
    return version
