"""Pausing and resuming a campaign: Pause takes back the batches no worker has
started; resume verifies the outputs, retries what it may, sends the queued
batches' tasks again and runs the pending units."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from campaigns.intake.inputs import InputError
from campaigns.intake.project_folders import campaign_folder_check
from campaigns.intake.record_reads import record_identity
from campaigns.intake.records import parse_locator
from campaigns.intake.rows import file_identity
from campaigns.models import Batch, Campaign, ErrorClass, Unit, UnitState
from campaigns.review.queue import units_reviewed_out
from campaigns.runs.leases import batches_requeue_expired
from campaigns.runs.start import batches_enqueue, campaign_run
from campaigns.specs.processors import get_spec
from campaigns.storage.paths import resolve_input
from campaigns.storage.vector_shards import split_member
from campaigns.verify.reconcile import VerifyReport, campaign_verify


def campaign_pause(*, campaign: Campaign) -> int:
    """Take back the batches no worker started yet; running ones finish.

    Their units return to pending, so Resume (or run) enqueues them again.
    Returns the number of units taken back.
    """
    with transaction.atomic():
        # A run still planning (campaign_run's slices) stops at this mark,
        # before its next slice: the campaign no longer reads as being planned.
        Campaign.objects.filter(pk=campaign.pk).update(paused_at=timezone.now(), planning_at=None)
        waiting = list(
            Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).values_list(
                "pk", flat=True
            )
        )
        # Guarded by state: a batch a worker claimed meanwhile stays its.
        cancelled = Batch.objects.filter(pk__in=waiting, state=Batch.State.QUEUED).update(
            state=Batch.State.CANCELLED, error="paused before a worker took it"
        )
        if not cancelled:
            return 0
        return Unit.objects.filter(
            batch_id__in=waiting, batch__state=Batch.State.CANCELLED, state=UnitState.QUEUED
        ).update(state=UnitState.PENDING, batch=None)


def campaign_resume(
    *, campaign: Campaign, retry_failed: bool | Collection[str] = False
) -> tuple[VerifyReport, int, int]:
    """verify, then enqueue only what needs it: pending, output missing or incomplete.

    Failed units stay failed unless retry_failed: True for every error class,
    or the error classes to retry (the page's choice); a changed input is then
    recorded anew and its old output removed, so old and new never mix.
    Queued batches get their task sent again (a message lost with a crashed
    web process or broker); a duplicate message is a no-op for the worker.
    Returns verify's report, the units retried and the batches enqueued.
    """
    # Before verify, which would read a swapped folder's files as this campaign's.
    campaign_folder_check(campaign)
    batches_requeue_expired(campaign=campaign)
    report = campaign_verify(campaign=campaign)
    if retry_failed:
        classes = None if retry_failed is True else set(retry_failed)
        retried = _reset_failed(campaign, classes=classes)
    else:
        retried = 0
    # An output that could not be written (disk full) says nothing about the
    # input: like a missing output, it is done again.
    retried += Unit.objects.filter(
        campaign=campaign, state=UnitState.FAILED, error_class=ErrorClass.OUTPUT_WRITE_ERROR
    ).update(state=UnitState.PENDING, error_class="", error_message="")
    resent = list(
        Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).values_list(
            "pk", flat=True
        )
    )
    if resent:
        transaction.on_commit(lambda: batches_enqueue(batch_ids=resent))
    if get_spec(campaign.processor).training:
        # An adaptation campaign resumes its training
        # (campaigns/adaptation/services.py, training_start).
        return report, retried, len(resent)
    enqueued = campaign_run(campaign=campaign)
    return report, retried, enqueued + len(resent)


def _reset_failed(campaign: Campaign, *, classes: set[str] | None = None) -> int:
    """Failed units (of these error classes, else all) back to pending where a
    retry can help; returns how many."""
    failed = Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
    if classes is not None:
        failed = failed.filter(error_class__in=classes)
    root = Path(campaign.input_root)
    id_column = (campaign.records or {}).get("columns", {}).get("id")
    retried = 0
    reset = {"state": UnitState.PENDING, "error_class": "", "error_message": ""}
    for unit in failed.filter(error_class=ErrorClass.INPUT_CHANGED):
        try:
            size, mtime_ns, sha256 = _identity(root, unit.source_path, unit.uid, id_column)
        except (OSError, ValueError, InputError) as exc:
            if (
                isinstance(exc, InputError)
                and exc.error_class == ErrorClass.INPUT_CHANGED
                and parse_locator(unit.source_path)
            ):
                # A row not at its recorded place (another id's there): it stays
                # failed until the import finds each row again.
                Unit.objects.filter(pk=unit.pk).update(
                    error_message=f"{exc.message}; {reimport_hint(campaign)}"
                )
            else:
                # A file gone or unreadable: the worker says which.
                retried += Unit.objects.filter(pk=unit.pk).update(**reset)
            continue
        if unit.output_path and split_member(unit.output_path)[1] is None:
            # Made from the old bytes: it must not be adopted as the new result.
            # (A row of a batch's shard is adopted only by that batch again.)
            (Path(settings.OUTPUT_ROOT) / unit.output_path).unlink(missing_ok=True)
        retried += Unit.objects.filter(pk=unit.pk).update(
            size=size,
            mtime_ns=mtime_ns,
            sha256=sha256,
            output_path="",
            output_size=None,
            output_sha256="",
            **reset,
        )
    # Inputs that are still missing cannot be retried; nor can outputs a
    # reviewer rejected under the current version (they run again under a new
    # one: the same parameters would adopt or remake the rejected output).
    retryable = failed.exclude(error_class__in=[ErrorClass.INPUT_MISSING, ErrorClass.INPUT_CHANGED])
    if campaign.current_version_id:
        retryable = retryable.exclude(
            error_class=ErrorClass.REJECTED_BY_REVIEW,
            pk__in=units_reviewed_out(
                campaign_id=campaign.pk, version_id=campaign.current_version_id
            ),
        )
    retried += retryable.update(**reset)
    missing = failed.filter(error_class=ErrorClass.INPUT_MISSING)
    for unit in missing.only("pk", "uid", "source_path"):
        try:
            _identity(root, unit.source_path, unit.uid, id_column, hashed=False)
        except (OSError, ValueError, InputError):
            continue
        retried += Unit.objects.filter(pk=unit.pk).update(**reset)
    return retried


def reimport_hint(campaign: Campaign) -> str:
    """What a record unit whose row moved needs, said on the unit."""
    return (
        f"run `campaign import {campaign.name}` (it finds each row again by its id), "
        "then `resume --retry-failed`"
    )


def _identity(
    root: Path,
    source_path: str,
    uid: str = "",
    id_column: str | None = None,
    *,
    hashed: bool = True,
) -> tuple[int, int | None, str]:
    """Size, mtime and sha256 of a unit's input as it is now: a file's, or a
    record's text (no mtime), the row at its place holding the unit's id where
    the records have an id column; `hashed=False` only checks a file is there."""
    located = parse_locator(source_path)
    if located is not None:
        size, sha256 = record_identity(root, located, uid, id_column)
        return size, None, sha256
    path = resolve_input(root, source_path)
    if not hashed:
        path.stat()
        return 0, None, ""
    return file_identity(path)
